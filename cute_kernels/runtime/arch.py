"""Target architecture: which GPU the DSL compiles for.

The CuTe DSL reads ``CUTE_DSL_ARCH`` once, at the first ``import cutlass``; without it the
target silently becomes sm_100a.  :func:`configure` must therefore run before anything imports
``cutlass``: ``cute_kernels/__init__.py`` calls it first thing.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings

DEFAULT_ARCH = "sm_90a"
SUPPORTED_ARCHS = ("sm_90a",)


def configure() -> str:
    """Set ``CUTE_DSL_ARCH`` (if the user has not) and return the target arch.

    Order: an explicit ``CUTE_DSL_ARCH``; else ``sm_90a`` (every kernel here is Hopper-only; a
    non-Hopper GPU gets a clear error at the first op call, see :func:`check_device`).  When
    ``cutlass`` was imported earlier, the DSL has read the variable already: if it has not settled
    on a target yet (it decides lazily, at its first compile), it is given this one; if it has, and
    it differs, :func:`check_target_arch` refuses to compile (a warning says so here).
    """
    arch = os.environ.setdefault("CUTE_DSL_ARCH", DEFAULT_ARCH)
    if "cutlass" in sys.modules:
        try:
            envar = _dsl_env()
            if envar._arch is None:  # not decided yet: without this it would fall back to sm_100a
                envar.arch = arch
        except Exception:  # noqa: BLE001 (another DSL version: check_target_arch still compares)
            pass
        if dsl_arch() != arch:
            warnings.warn(
                f"cutlass was imported before cute_kernels and targets {dsl_arch()!r}, not {arch!r}: "
                "cute_kernels will refuse to compile. Set CUTE_DSL_ARCH=sm_90a before importing cutlass.",
                RuntimeWarning, stacklevel=3)
    return arch


def _dsl_env():
    """The CuTe DSL's environment manager (where it keeps its target arch)."""
    from cutlass.cutlass_dsl import CuTeDSL

    return CuTeDSL._get_dsl().envar


@functools.lru_cache(maxsize=1)
def dsl_compile_settings() -> str:
    """The CuTe DSL's settings that change generated code, as the DSL lists them for its own cache key
    (``CUTE_DSL_LINEINFO``, ``_DEBUG``, ``_ENABLE_ASSERTIONS``, ``_COMPILER_OPT``, ``_COMPILER_BACKEND``, the
    runtime library variant, ...; read at the first ``import cutlass``, so fixed for the process): part of
    every compile-cache key.  The runtime library's path is cut to its last three parts (``cu13/lib/...``) so
    that moving an environment keeps its cache.  Empty for a DSL without that list."""
    try:
        env = _dsl_env()
        parts = []
        for entry in sorted(env._ENV_VAR_SPEC, key=lambda e: e.key_name):
            if not entry.affects_compile or entry.key_name == "arch":  # (the arch is a key item of its own)
                continue
            value = getattr(env, entry.key_name)
            if entry.key_name == "shared_libs" and isinstance(value, str):
                value = os.pathsep.join("/".join(os.path.normpath(p).split(os.sep)[-3:])
                                        for p in value.split(os.pathsep) if p)  # (the DSL's own separator)
            parts.append(f"{entry.key_name}={value!r}")
        return ";".join(parts)
    except Exception:  # noqa: BLE001 (another DSL version)
        return ""


def dsl_arch() -> str:
    """The arch the imported CuTe DSL actually compiles for (``target_arch()`` when that cannot be
    read, e.g. another DSL version)."""
    try:
        return str(_dsl_env().arch)
    except Exception:  # noqa: BLE001
        return target_arch()


def check_target_arch() -> str:
    """The target arch, or ``RuntimeError`` when it is one the kernels do not support, or when the
    imported DSL compiles for another one than ``CUTE_DSL_ARCH`` says (cutlass imported first)."""
    arch = target_arch()
    if arch not in SUPPORTED_ARCHS:
        raise RuntimeError(
            f"cute_kernels compiles for {', '.join(SUPPORTED_ARCHS)} (Hopper) only; this process targets "
            f"{arch!r} (CUTE_DSL_ARCH). Unset it or set CUTE_DSL_ARCH=sm_90a before importing cutlass or cute_kernels.")
    dsl = dsl_arch()
    if dsl != arch:
        raise RuntimeError(
            f"the CuTe DSL in this process compiles for {dsl!r}, not {arch!r}: cutlass was imported and used "
            "before CUTE_DSL_ARCH was set. Set CUTE_DSL_ARCH=sm_90a in the environment before anything "
            "imports cutlass.")
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


_SM_COUNTS: dict = {}  # CUDA device index -> its SM count


def sm_count(device) -> int:
    """SMs of the CUDA ``device`` (a ``torch.device``; index None: the current device), read once per device
    (persistent grids and the ranker backward's residency rules size themselves by it)."""
    n = _SM_COUNTS.get(device.index)  # (the hot path: a tensor's device has its index; None is never stored)
    if n is None:
        import torch

        idx = device.index if device.index is not None else torch.cuda.current_device()
        n = _SM_COUNTS.get(idx)
        if n is None:
            n = _SM_COUNTS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n
