"""The workshop exercises: stubs with TODOs, their checkers (test_ex*.py) and the grading harness."""
