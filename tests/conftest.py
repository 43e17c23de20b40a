"""The project's own suite runs single-threaded, as the grading harness does: on two shared cores a
second torch thread mostly waits for the first (see exercises/conftest.py). Subprocesses (checker
runs, notebook kernels, scripts) inherit the setting through OMP_NUM_THREADS."""

import os

import torch

os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)
