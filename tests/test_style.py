"""The repo is formatted and linted by ruff with its ruff.toml, from the root as a contributor runs it (CI runs
this with the rest); the run records under results/runs/ are excluded there, kept as they ran."""

import os
import subprocess
import sys

from helpers import ROOT

PATHS = ["."]


def ruff(*argv):
    return subprocess.run(
        [sys.executable, "-m", "ruff", *argv, *PATHS], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_ruff_check_passes():
    out = ruff("check", "--no-cache")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]


def test_ruff_format_leaves_every_file_as_it_is():
    out = ruff("format", "--check", "--no-cache")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]
    assert os.path.isfile(os.path.join(ROOT, "ruff.toml"))
