"""The GPU test files, sanitizer scripts, benchmarks and scripts run only on the device, seldom: a name
they take from the library that it no longer has (``rb.LOG2_E`` after it moved to ``ranker_fwd``, which
broke 11 GPU tests for a session) is caught here on the CPU instead.  In every Python file under
tests/gpu, bench and scripts (module level or inside functions):

* ``from cute_kernels... import NAME`` must name a submodule or an attribute of that module;
* ``alias.NAME`` (and ``alias.sub.NAME`` chains through modules) must exist, where ``alias`` is a
  module bound by one of those imports, ``import cute_kernels[.x] [as alias]`` included.  A name that
  the file also binds otherwise (assignment, parameter) is skipped: it may not be the module there."""
import ast
import importlib
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
FILES = sorted(p for d in ("tests/gpu", "bench", "scripts") for p in (ROOT / d).rglob("*.py"))


def _submodule(name: str):
    """The module ``name``, or None when there is no such module (a missing dependency still raises)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return None


def _imports(tree: ast.Module, missing: set) -> dict:
    """alias -> module name for every cute_kernels module the file imports; unknown imported names
    go into ``missing``."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "cute_kernels":
            module = importlib.import_module(node.module)
            for name in node.names:
                sub = _submodule(f"{node.module}.{name.name}")
                if sub is not None:
                    aliases[name.asname or name.name] = sub.__name__
                elif not hasattr(module, name.name):
                    missing.add(f"from {node.module} import {name.name} (line {node.lineno})")
        elif isinstance(node, ast.Import):
            for name in node.names:
                if name.name.split(".")[0] == "cute_kernels":
                    importlib.import_module(name.name)
                    aliases[name.asname or "cute_kernels"] = name.name if name.asname else "cute_kernels"
    return aliases


def _rebound(tree: ast.Module) -> set:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for n in ast.walk(tree):
        if isinstance(n, ast.arguments):
            names |= {a.arg for a in n.posonlyargs + n.args + n.kwonlyargs + [n.vararg, n.kwarg] if a is not None}
    return names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_device_file_names_exist(path):
    tree = ast.parse(path.read_text())
    missing = set()
    aliases = _imports(tree, missing)
    rebound = _rebound(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
            continue
        chain, base = [node.attr], node.value
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        if not isinstance(base, ast.Name) or base.id not in aliases or base.id in rebound:
            continue
        obj = importlib.import_module(aliases[base.id])
        for i, name in enumerate(chain):
            if not hasattr(obj, name):
                missing.add(f"{base.id}.{'.'.join(chain[:i + 1])} (line {node.lineno})")
                break
            obj = getattr(obj, name)
            if not isinstance(obj, types.ModuleType):
                break
    assert not missing, f"{path.relative_to(ROOT)} uses names the library lacks: {sorted(missing)}"
