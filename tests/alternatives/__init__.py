"""Different correct designs: each must pass its checker."""
