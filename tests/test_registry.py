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
