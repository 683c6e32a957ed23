"""Execute notebooks/*.ipynb top to bottom on the CPU (nbclient); a cell that raises fails the test.

GPU cells detect the absence of a GPU themselves.  Committed notebooks must carry no outputs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")


def test_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {"01_layouts.ipynb", "02_call_from_torch.ipynb", "03_new_tile_shape.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, \
                f"{path.name}: clear outputs before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


def test_run_notebook_script_executes_cells_as_python(tmp_path):
    """scripts/run_notebook.py (how the GPU machine runs the notebooks): magics dropped, cells share a
    namespace, a failing cell fails the run."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "run_notebook.py"

    def nb(*cells):
        path = tmp_path / f"nb{len(list(tmp_path.iterdir()))}.ipynb"
        path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": c} for c in cells],
                                    "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        return str(path)

    ok = subprocess.run([sys.executable, str(script), nb(["%matplotlib inline\n", "x = 41\n"], ["print(x + 1)\n"])],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "42" in ok.stdout and "ran to the end" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, str(script), nb(["raise ValueError('boom')\n"])],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "boom" in bad.stderr
    # a missing file, or one that is not a notebook: exit 2 with a message, no traceback
    (tmp_path / "not_nb.json").write_text('{"a": 1}')
    for path, msg in ((str(tmp_path / "missing.ipynb"), "cannot read"), (str(tmp_path / "not_nb.json"), "not a notebook")):
        r = subprocess.run([sys.executable, str(script), path], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr
    # without matplotlib (blocked in sys.modules): drawing cells, and cells importing from it, are skipped
    no_mpl = ("import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = ['run_notebook.py', sys.argv[1]]; "
              f"runpy.run_path({str(script)!r}, run_name='__main__')")
    path = nb(["from matplotlib import colormaps\n"], ["import matplotlib.pyplot as plt\n", "plt.figure()  # draw\n"],
              ["print('after')\n"])
    skip = subprocess.run([sys.executable, "-c", no_mpl, path], capture_output=True, text=True, timeout=120)
    assert skip.returncode == 0 and skip.stdout.count("skipped (no matplotlib)") == 2, skip.stdout + skip.stderr
    assert "after" in skip.stdout and "matplotlib: False" in skip.stdout
