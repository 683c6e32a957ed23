"""Output allocation on the eager hot path: ``torch.empty_like`` where it gives the wanted strides.

A host-bound eager call (a small kernel's launch) spends a noticeable share of its host time allocating its
outputs, and the way of asking matters: ``torch.empty_like(t)`` skips the parsing of a shape and of tensor
options that ``t.new_empty(shape, dtype=...)`` and ``torch.empty(shape, dtype=..., device=...)`` pay for.  The
H200's host, CUDA tensors, session 33 (``bench/host_breakdown.py``; log
``bench/results/logs/2026-12-02_s33_eager_alloc_host_time.log``): ``empty_like`` 1.8-2.2 us per allocation,
``new_empty`` 3.1-3.8, ``torch.empty`` 4.6-5.2.  ``empty_like(t)`` keeps ``t``'s strides, so it gives a compact
output only for a compact ``t`` (:func:`is_compact`); ``empty_like(t, memory_format=torch.contiguous_format)``
always does (2.0-2.2 us there).  (Session 33 also tried ``empty_like`` of one-element templates kept per launch
plan for outputs of other shapes, and dropped it: a template made during a CUDA-graph capture or a
cudagraph-trees warm-up would live in, and pin, that graph's memory pool.)
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
    """Whether ``t``'s strides are exactly the compact row-major ones, so that ``torch.empty_like(t)`` allocates
    a compact tensor (``is_contiguous()`` alone also admits any stride in a size-1 dim, which ``empty_like``
    would copy)."""
    return t.stride() == compact_strides(t.shape)
