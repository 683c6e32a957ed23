"""Every registered kernel lists configs and each compiles for sm_90a on this (GPU-less) machine."""

import pytest

from cute_kernels import registry
from cute_kernels.runtime.cache import compile_record

TARGETS = [t for name in registry.names() for t in registry.module(name).compile_targets()]


def test_registry_not_empty():
    assert "scale" in registry.names()
    assert TARGETS


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t.kernel}:{t.label}")
def test_every_config_compiles(target):
    target.build()
    rec = compile_record(target.kernel, target.key)
    assert rec.ptx and ".target sm_90a" in rec.ptx


@pytest.mark.parametrize("name", registry.names())
def test_every_module_defines_the_registry_functions(name):
    mod = registry.module(name)
    for fn in ("compile_targets", "check", "bench", "bench_shapes", "shipped_configs"):
        assert callable(getattr(mod, fn, None)), f"{name} lacks {fn}()"
    configs = mod.shipped_configs()
    assert configs and all(isinstance(label, str) for label in configs)


@pytest.mark.parametrize("name", ["qknorm", "qknorm_tp"])
def test_per_shape_shipped_configs_are_the_compile_targets(name):
    """qknorm / qknorm_tp list one shipped config per compile target, under the target's label."""
    mod = registry.module(name)
    assert list(mod.shipped_configs()) == [t.label for t in mod.compile_targets()]


def test_compile_target_labels_are_distinct():
    """One label per compile target (session 61: six pre/postprocess labels stood for two keys each)."""
    labels = [(t.kernel, t.label) for t in TARGETS]
    assert len(set(labels)) == len(labels) == len({(t.kernel, t.key) for t in TARGETS})


def test_compile_target_labels_are_short():
    """Labels say where a config applies, in a line of the ``cute-kernels compile`` table (session 61: hc_mix_tma's
    were the whole config, ~200 characters; the configs themselves are in ``cute-kernels configs``)."""
    long = [(t.kernel, t.label) for t in TARGETS if len(t.label) > 80]
    assert not long, long
