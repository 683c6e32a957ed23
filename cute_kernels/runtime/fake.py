"""Fake (shape-only) arguments for compiling without a GPU or real tensors."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch

TORCH_TO_CUTE = {
    torch.float16: cutlass.Float16,
    torch.bfloat16: cutlass.BFloat16,
    torch.float32: cutlass.Float32,
    torch.int32: cutlass.Int32,
    torch.int64: cutlass.Int64,
    torch.uint8: cutlass.Uint8,
}


def cute_dtype(dtype: torch.dtype):
    """The DSL numeric type of a torch dtype."""
    return TORCH_TO_CUTE[dtype]


def fake_tensor(dtype, shape, stride=None, align: int = 16):
    """A fake tensor for ``cute.compile``.

    ``dtype``: a torch or DSL dtype.  ``shape``: ints (static) or ``cute.sym_int()`` (dynamic).
    ``stride``: None for row-major compact (leading dim last; 64-bit strides), else a tuple of ints/sym_ints
    (``cute.sym_int()`` is 32-bit, :func:`wide_stride` 64-bit).
    ``align``: assumed byte alignment of the data pointer.
    """
    if isinstance(dtype, torch.dtype):
        dtype = cute_dtype(dtype)
    if stride is None:  # row-major: the last mode is the stride-1 mode (the DSL's default is the first)
        order = tuple(range(len(shape) - 1, -1, -1))
        return cute.runtime.make_fake_compact_tensor(dtype, tuple(shape), stride_order=order, assumed_align=align)
    return cute.runtime.make_fake_tensor(dtype, tuple(shape), stride=tuple(stride), assumed_align=align)


def wide_stride(divisibility: int = 1):
    """A dynamic 64-bit stride for ``fake_tensor(stride=...)``: element offsets computed from it (``index *
    stride``) are 64-bit, so a tensor may span 2**31 elements or more (a compact tensor's derived strides are
    64-bit already: ``make_fake_compact_tensor``'s default)."""
    return cute.sym_int(64, divisibility=divisibility)


def fake_stream():
    """Stream placeholder bound at call time to torch's current stream (tvm-ffi env stream)."""
    return cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
