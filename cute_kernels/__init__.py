"""cute_kernels: NVIDIA Hopper (sm_90a) kernels in CUTLASS's Python CuTe DSL, called from PyTorch.

Importing this package sets ``CUTE_DSL_ARCH`` (sm_90a unless the user set it) before ``cutlass`` is
imported: the DSL reads it once, at its first import (see :mod:`.runtime.arch` for cutlass imported first).
Public ops are loaded lazily (``cute_kernels.scale`` imports its kernel module on first use), and so are
the ``torch.ops.cute_kernels`` ops: a lookup of one there (``torch.ops.cute_kernels.scale``, ``torch.export.load``
of a program that calls them) first imports the kernel module that registers it.
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


# torch.ops.cute_kernels.<op> -> the module that registers it
_OPS = {
    "scale": "cute_kernels.kernels.scale",
    "ranker_attention_fwd": "cute_kernels.kernels.ranker_fwd",
    "ranker_attention_bwd": "cute_kernels.kernels.ranker_bwd",
    "qk_rmsnorm_": "cute_kernels.kernels.qknorm",
    "parallel_qk_rmsnorm_": "cute_kernels.kernels.qknorm_tp",
    "hc_mix_sinkhorn": "cute_kernels.kernels.hc_mix",
}

__all__ = sorted([*_PUBLIC, "register_ops"])  # `from cute_kernels import *` loads the public ops


def register_ops() -> None:
    """Import every kernel module, so that every ``torch.ops.cute_kernels.*`` op is registered.

    The ops register when their module is first used (``cute_kernels.scale`` and so on) or when a name is
    first looked up in ``torch.ops.cute_kernels`` (``torch.export.load`` of a program that calls them does
    that); call this where neither happens first, e.g. before making a
    ``torch.utils.flop_counter.FlopCounterMode``, which copies torch's FLOP formulas when made."""
    import importlib

    for mod in sorted({m for m, _ in _PUBLIC.values()} | set(_OPS.values())):
        importlib.import_module(mod)


from .runtime.torch_op import register_on_lookup as _register_on_lookup  # noqa: E402 (after _configure)

_register_on_lookup("cute_kernels", _OPS)


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
