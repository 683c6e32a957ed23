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


def configure() -> str:
    """Set ``CUTE_DSL_ARCH`` (if the user has not) and return the target arch.

    Order: an explicit ``CUTE_DSL_ARCH``; else ``sm_90a`` (every kernel here is Hopper-only; a
    non-Hopper GPU gets a clear error at the first op call, see :func:`check_device`).
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
        os.environ["CUTE_DSL_ARCH"] = DEFAULT_ARCH
    return os.environ["CUTE_DSL_ARCH"]


def check_target_arch() -> str:
    """The target arch, or ``RuntimeError`` when it is one the kernels do not support."""
    arch = target_arch()
    if arch not in SUPPORTED_ARCHS:
        raise RuntimeError(
            f"cute_kernels compiles for {', '.join(SUPPORTED_ARCHS)} (Hopper) only; this process targets "
            f"{arch!r} (CUTE_DSL_ARCH). Unset it or set CUTE_DSL_ARCH=sm_90a before importing cute_kernels.")
    return arch


_DEVICE_OK: set[int] = set()


def check_device(device) -> None:
    """``RuntimeError`` unless ``device`` (a CUDA ``torch.device``) is a Hopper GPU (sm_90)."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    if index in _DEVICE_OK:
        return
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) != (9, 0):
        raise RuntimeError(
            f"cute_kernels needs a Hopper GPU (sm_90: H100/H200/H20/GH200); cuda:{index} is "
            f"{torch.cuda.get_device_name(index)} (sm_{major}{minor}), which cannot run sm_90a code")
    _DEVICE_OK.add(index)


def target_arch() -> str:
    """The arch every kernel of this process compiles for (``CUTE_DSL_ARCH``)."""
    return os.environ.get("CUTE_DSL_ARCH", DEFAULT_ARCH)
