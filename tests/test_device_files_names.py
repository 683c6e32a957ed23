"""The GPU test files, sanitizer scripts and benchmarks run only on the device, seldom: a module attribute
they use that the library no longer has (``rb.LOG2_E`` after it moved to ``ranker_fwd``, which broke 11 GPU
tests for a session) is caught here on the CPU instead.  Every ``alias.NAME`` in tests/gpu/, bench/ and
scripts/ Python files, where ``alias`` is a ``from cute_kernels... import module as alias`` (or
``import cute_kernels``), must exist."""
import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
FILES = sorted(p for d in ("tests/gpu", "bench", "scripts") for p in (ROOT / d).glob("*.py"))


def _module_aliases(tree: ast.Module) -> dict:
    aliases = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cute_kernels"):
            for name in node.names:
                full = f"{node.module}.{name.name}"
                try:
                    importlib.import_module(full)
                except ModuleNotFoundError:
                    continue  # a function or class, not a module
                aliases[name.asname or name.name] = full
        elif isinstance(node, ast.Import):
            for name in node.names:
                if name.name.startswith("cute_kernels") and name.asname is None and "." not in name.name:
                    aliases[name.name] = name.name
    return aliases


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_device_file_module_attributes_exist(path):
    tree = ast.parse(path.read_text())
    aliases = _module_aliases(tree)
    missing = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and isinstance(node.ctx, ast.Load)):
            module = importlib.import_module(aliases[node.value.id])
            if not hasattr(module, node.attr):
                missing.add(f"{node.value.id}.{node.attr} (line {node.lineno})")
    assert not missing, f"{path.name} uses names its modules lack: {sorted(missing)}"
