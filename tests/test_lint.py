"""Lint: ``ruff check`` over the repository with the rules of ``pyproject.toml``'s ``[tool.ruff]``: pyflakes'
findings everywhere (undefined names, unused imports and locals, redefinitions) and lines of at most 120
characters in the package and the scripts.  An undefined name matters most: a local renamed in one branch and
read in another raises only when that branch runs, which for some branches means only on the GPU (session 36's
deterministic backward).  ruff comes with the ``[test]`` extras (not a dependency of the package); the test skips
where it is not installed."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_check():
    pytest.importorskip("ruff")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", str(ROOT)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_check_can_fail(tmp_path):
    """The lint must be able to fail: an undefined name and an over-long line in a file under the package's
    rules (the repository's config, pointed at a copy)."""
    pytest.importorskip("ruff")
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return undefined_name\n\n\nX = '" + "x" * 130 + "'\n")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                        "--config", str(ROOT / "pyproject.toml"), str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "F821" in r.stdout and "E501" in r.stdout, r.stdout + r.stderr
