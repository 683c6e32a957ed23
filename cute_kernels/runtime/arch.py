"""Target architecture: which GPU the DSL compiles for.

The CuTe DSL reads ``CUTE_DSL_ARCH`` once, at the first ``import cutlass``; without it the
target silently becomes sm_100a.  :func:`configure` must therefore run before anything imports
``cutlass``: ``cute_kernels/__init__.py`` calls it first thing.
"""

from __future__ import annotations

import os
import sys
import warnings

DEFAULT_ARCH = "sm_90a"
SUPPORTED_ARCHS = ("sm_90a",)


def _gpu_arch() -> str | None:
    """``sm_XYa`` of the current CUDA device, or None without one (no CUDA init if torch lacks CUDA)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}a"


def configure() -> str:
    """Set ``CUTE_DSL_ARCH`` (if the user has not) and return the target arch.

    Order: an explicit ``CUTE_DSL_ARCH``; else the GPU's arch; else ``sm_90a`` (CPU compile).
    Warns when ``cutlass`` was imported earlier with no arch set, since the DSL then already
    decided on its default.
    """
    if "CUTE_DSL_ARCH" not in os.environ:
        if "cutlass" in sys.modules:
            warnings.warn(
                "cutlass was imported before cute_kernels without CUTE_DSL_ARCH set; the DSL may "
                "target sm_100a. Set CUTE_DSL_ARCH=sm_90a in the environment.",
                RuntimeWarning,
                stacklevel=3,
            )
        os.environ["CUTE_DSL_ARCH"] = _gpu_arch() or DEFAULT_ARCH
    return os.environ["CUTE_DSL_ARCH"]


def target_arch() -> str:
    """The arch every kernel of this process compiles for (``CUTE_DSL_ARCH``)."""
    return os.environ.get("CUTE_DSL_ARCH", DEFAULT_ARCH)
