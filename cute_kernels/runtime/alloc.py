"""Output allocation on the eager hot path: ``torch.empty_like`` of a kept template.

A host-bound eager call (a small kernel's launch) spends a noticeable share of its host time allocating its
outputs, and the way of asking matters: ``torch.empty_like(t)`` skips the parsing of a shape and of tensor
options that ``t.new_empty(shape, dtype=...)`` and ``torch.empty(shape, dtype=..., device=...)`` pay for.  The
H200's host, CUDA tensors, session 33 (``bench/host_breakdown.py``; log
``bench/results/logs/2026-12-02_s33_eager_alloc_host_time.log``): ``empty_like`` 1.8-2.2 us per allocation,
``new_empty`` 3.1-3.8, ``torch.empty`` 4.6-5.2.  A launch plan that allocates the same shape on every call
keeps a template for it (:func:`empty_template`): a view of one element whose ``empty_like`` is a fresh
compact tensor of the wanted shape.
"""

from __future__ import annotations

import torch


def compact_strides(shape) -> tuple[int, ...]:
    """Row-major strides of ``shape`` as torch gives them to a new tensor (a size-1 or size-0 dim counts as 1)."""
    strides, step = [], 1
    for n in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


def is_compact(t: torch.Tensor) -> bool:
    """Whether ``t``'s strides are exactly the compact row-major ones (``torch.empty_like(t)`` then allocates a
    compact tensor; ``is_contiguous()`` alone also admits any stride in a size-1 dim, which ``empty_like``
    would copy)."""
    return t.stride() == compact_strides(t.shape)


def empty_template(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of ``shape`` holding ONE element of ``dtype`` on ``device`` (stride 0 in every dim of size
    above 1), for which ``torch.empty_like(template)`` returns a new, uninitialized, compact tensor of
    ``shape`` (such a view is not dense, so ``empty_like`` takes the contiguous format; where every dim has
    size 1, or some dim size 0, its strides are the compact ones, which it keeps).  Never read or write the
    template."""
    shape = tuple(int(n) for n in shape)
    strides = compact_strides(shape)
    if 0 not in shape:  # (an empty shape has no element to alias: its compact strides, which empty_like keeps)
        strides = tuple(0 if n > 1 else s for n, s in zip(shape, strides))
    return torch.empty(1, dtype=dtype, device=device).as_strided(shape, strides)
