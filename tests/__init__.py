"""The project's own tests: the model against transformers, the checkers kept honest, notebooks, scripts."""
