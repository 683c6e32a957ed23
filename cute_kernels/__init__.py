"""cute_kernels: NVIDIA Hopper (sm_90a) kernels in CUTLASS's Python CuTe DSL, called from PyTorch.

Importing this package sets ``CUTE_DSL_ARCH`` (sm_90a unless the user set it) before ``cutlass`` is
imported: the DSL reads it once, at its first import (see :mod:`.runtime.arch` for cutlass imported first).
Public ops are loaded lazily (``cute_kernels.scale`` imports its kernel module on first use).
"""

from .runtime.arch import configure as _configure

_configure()

__version__ = "0.1.0"

# public name -> (module, attribute)
_PUBLIC = {
    "scale": ("cute_kernels.kernels.scale", "scale"),
    "scale_reference": ("cute_kernels.kernels.scale", "scale_reference"),
    "ranker_attention": ("cute_kernels.kernels.ranker_fwd", "ranker_attention"),
    "ranker_attention_reference": ("cute_kernels.kernels.ranker_fwd", "ranker_attention_reference"),
    "ranker_attention_backward": ("cute_kernels.kernels.ranker_bwd", "ranker_attention_backward"),
    "ranker_attention_backward_reference": ("cute_kernels.kernels.ranker_bwd", "ranker_attention_backward_reference"),
    "qk_rmsnorm_": ("cute_kernels.kernels.qknorm", "qk_rmsnorm_"),
    "qk_rmsnorm_reference": ("cute_kernels.kernels.qknorm", "qk_rmsnorm_reference"),
    "ParallelQKNorm": ("cute_kernels.kernels.qknorm_tp", "ParallelQKNorm"),
    "PeerTimeoutError": ("cute_kernels.kernels.qknorm_tp", "PeerTimeoutError"),
    "hc_mix_sinkhorn": ("cute_kernels.kernels.hc_mix", "hc_mix_sinkhorn"),
    "hc_mix_sinkhorn_reference": ("cute_kernels.kernels.hc_mix", "hc_mix_sinkhorn_reference"),
    "shipped_configs": ("cute_kernels.tuning", "shipped_configs"),
}


__all__ = sorted([*_PUBLIC, "register_ops"])  # `from cute_kernels import *` loads the public ops


def register_ops() -> None:
    """Import every kernel module, so that every ``torch.ops.cute_kernels.*`` op is registered.

    The ops register when their module is first used (``cute_kernels.scale`` and so on); call this
    first when something needs them by name only, e.g. ``torch.export.load`` of a program that
    calls them, or ``torch.ops.cute_kernels.<name>`` before any other use."""
    import importlib

    for mod in sorted({m for m, _ in _PUBLIC.values()}):
        importlib.import_module(mod)


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        mod, attr = _PUBLIC[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cute_kernels' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_PUBLIC))
