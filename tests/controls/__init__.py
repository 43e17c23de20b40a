"""Negative controls: plausible wrong implementations that the checkers must catch. Each module sets
EXERCISE (the exercise module it stands in for) and says in its docstring what it gets wrong."""
