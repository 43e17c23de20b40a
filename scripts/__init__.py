"""Scripts of the workshop: training the embedded models, making the slides' figures, and the
measuring/plotting helpers (figures.py) that the notebooks share with the slides."""
