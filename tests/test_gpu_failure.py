"""One GPU failure takes no other check down (issue 40): on CUDA a device-side assert leaves the process's CUDA
context unusable, and an H200 run reported every later check of that pytest-xdist worker as an error of the code
under test (17 checks with nothing wrong). The grading conftest says so once, in the check where it happened, and
skips the checks after it in that process (not scored), naming the files to rerun. Shown on a CPU with a check
that raises what CUDA raises."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHECKER = '''
import pytest

def test_first():
    pass

def test_kernel_fails():
    raise RuntimeError("CUDA error: device-side assert triggered\\\\nCompile with TORCH_USE_CUDA_DSA to enable device-side assertions.")

def test_after_one():
    pass

def test_after_two():
    pass
'''


def test_a_lost_gpu_fails_its_own_check_once_and_skips_the_rest_of_its_process(tmp_path):
    (tmp_path / "conftest.py").write_text("from exercises.conftest import *  # noqa: F401,F403 (the grading hooks)\n")
    (tmp_path / "test_ex1_generate.py").write_text(CHECKER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-p", "no:cacheprovider", "-rs", "-n", "0"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300).stdout
    assert "1 failed, 1 passed, 2 skipped" in out, out
    assert out.count("The GPU failed in this check") == 1, out
    assert "not run: the GPU failed in test_ex1_generate.py::test_kernel_fails" in out, out
    assert "2 checks were not run because the GPU failed" in out and "pytest test_ex1_generate.py" in out, out
    assert "1. generate" in out and "1/2" in out, out  # scored: the check that passed and the one that failed
    from workshop.gpu_check import files_to_rerun

    assert files_to_rerun(out) == ["test_ex1_generate.py"], "scripts/gpu_check.py would not rerun the file cut short"
