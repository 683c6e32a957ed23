"""Names that do not exist: pyflakes' undefined-name findings over the package, the tests, the benchmarks and the
scripts (a local renamed in one branch and read in another raises only when that branch runs, which for some
branches means only on the GPU: session 36's deterministic backward).  pyflakes comes with the ``[test]`` extras
(not a dependency of the package); the test skips where it is not installed (session 39's fresh machine had none
before it joined the extras, so CI skipped this test there)."""
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
UNDEFINED = ("UndefinedName", "UndefinedLocal", "UndefinedExport")


def test_no_undefined_names():
    api = pytest.importorskip("pyflakes.api")
    reporter_mod = pytest.importorskip("pyflakes.reporter")

    class Collect(reporter_mod.Reporter):
        def __init__(self):
            self.found = []

        def unexpectedError(self, filename, msg):
            self.found.append(f"{filename}: {msg}")

        def syntaxError(self, filename, msg, lineno, offset, text):
            self.found.append(f"{filename}:{lineno}: {msg}")

        def flake(self, message):
            if type(message).__name__ in UNDEFINED:
                self.found.append(str(message))

    rep = Collect()
    files = sorted(p for d in ("cute_kernels", "tests", "bench", "scripts") for p in (ROOT / d).rglob("*.py"))
    assert len(files) > 50
    for path in files:
        api.checkPath(str(path), rep)
    assert not rep.found, "\n".join(rep.found)
