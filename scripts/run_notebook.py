"""Run a notebook's code cells top to bottom as plain Python, on a machine without Jupyter (the GPU
machine): ``python3 scripts/run_notebook.py notebooks/03_new_tile_shape.ipynb``.

IPython magics (``%...``) and shell escapes (``!...``) are dropped (they do not run here);
``IPython.display.display`` becomes ``print`` when IPython is absent; figures go to matplotlib's Agg backend.
Without matplotlib, cells that draw are skipped (and said so); any other exception stops the run with a
traceback (exit status 1).
"""

import json
import sys
import types


def _stub_ipython() -> None:
    try:
        import IPython.display  # noqa: F401
    except ModuleNotFoundError:
        ip, ipd = types.ModuleType("IPython"), types.ModuleType("IPython.display")
        ipd.display = print
        ip.display, ip.version_info = ipd, (8, 30, 0, "")  # matplotlib reads version_info
        sys.modules["IPython"], sys.modules["IPython.display"] = ip, ipd


def _matplotlib() -> bool:
    try:
        import matplotlib
    except ModuleNotFoundError:
        plt = types.ModuleType("matplotlib.pyplot")
        sys.modules["matplotlib"] = types.ModuleType("matplotlib")
        sys.modules["matplotlib"].pyplot = plt
        sys.modules["matplotlib.pyplot"] = plt
        return False
    matplotlib.use("Agg")
    return True


def load_notebook(path: str) -> dict:
    """The notebook at ``path``; ``ValueError`` naming the problem for a missing file, a file that is not
    JSON, or JSON that is not a notebook (no ``cells`` list)."""
    try:
        with open(path) as f:
            nb = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a notebook (not JSON: {exc})") from None
    if not (isinstance(nb, dict) and isinstance(nb.get("cells"), list)):
        raise ValueError(f"{path} is not a notebook (no 'cells' list)")
    return nb


def main(path: str, nb: dict | None = None) -> None:
    """Run the code cells of the notebook at ``path`` (``nb``: its contents, already read)."""
    nb = nb if nb is not None else load_notebook(path)
    _stub_ipython()
    have_mpl = _matplotlib()
    ns = {"__name__": "__main__"}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = "".join(line for line in cell["source"] if not line.lstrip().startswith(("%", "!")))
        try:
            exec(compile(src, f"{path}:cell{i}", "exec"), ns)
        except (ImportError, AttributeError) as exc:  # (the stub matplotlib has no submodules: ImportError)
            if not have_mpl and ("draw" in src or "viz" in src or "matplotlib" in src):
                print(f"[cell {i}] skipped (no matplotlib): {exc!r}")
                continue
            raise
    print(f"{path}: ran to the end (matplotlib: {have_mpl})")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook", help="path of an .ipynb file")
    notebook = parser.parse_args().notebook
    try:
        contents = load_notebook(notebook)  # (a bad path or file: a message and exit status 2, not a traceback)
    except ValueError as exc:
        parser.error(str(exc))
    main(notebook, contents)
