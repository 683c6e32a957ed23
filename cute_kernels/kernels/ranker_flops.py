"""FLOP counts of the ranker attention ops for ``torch.utils.flop_counter.FlopCounterMode``.

Registered on ``torch.ops.cute_kernels.ranker_attention_fwd`` and ``ranker_attention_bwd`` when their modules
load (the first use of ``ranker_attention``, or ``cute_kernels.register_ops()``; the backward's loads with the
forward's), so a model's FLOP count (MFU) includes the attention.  The counts are the
*useful* FLOPs the benchmarks report (FlashAttention's convention): ``2 * D`` per admitted (query, key) pair
and GEMM, with 2 GEMMs forward (``Q K^T``, ``P V``) and 5 backward (``S``, ``dP``, ``dV``, ``dK``, ``dQ``:
2.5x the forward), times the query heads.  The admitted pairs depend on ``bounds`` (and ``cu_seqlens``), which
live on the GPU: counting them reads those tensors (a device sync, once per counted call).  Tensors without data
(meta, fake: FLOP estimates on the meta device, tracing), and calls while the current stream captures a CUDA
graph (whose host cannot read device memory), give an upper bound instead, every query attending every key of
its sequence: ``B * S * S`` pairs, or packed ``T * min(T, max_seqlen)``.

A ``FlopCounterMode`` copies torch's formula registry when it is made: one made before the ops' modules
loaded and entered after counts them as 0 (the counters active while they load, e.g. around the first call, get
the formulas: :func:`~cute_kernels.runtime.torch_op.register_flops`; so does one made after a first call or
``cute_kernels.register_ops()``).
"""

from __future__ import annotations

import torch

from ..runtime.torch_op import capturing, register_flops, without_data
from .ranker_mask import admitted_pairs

FWD_GEMMS = 2  # Q K^T, P V
BWD_GEMMS = 5  # S = Q K^T (recomputed), dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ += dS K


def pairs(q: torch.Tensor, bounds: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
          max_seqlen: int | None = None) -> int:
    """(query, key) pairs the ranker mask admits over every sequence of the call (per query head); for
    tensors without data the dense upper bound (see the module docstring).  ``q``: ``[B, S, Hq, D]`` or packed
    ``[T, Hq, D]`` with ``cu_seqlens [B+1]``; ``bounds [B, 4]`` int32."""
    if cu_seqlens is None:
        nb, s = q.shape[0], q.shape[1]
        if _unreadable(bounds):
            return nb * s * s
        return admitted_pairs(bounds.cpu(), [s] * nb)
    t = q.shape[0]
    if _unreadable(bounds) or _unreadable(cu_seqlens):
        return t * min(t, max_seqlen if isinstance(max_seqlen, int) else t)
    cu = cu_seqlens.cpu().tolist()
    return admitted_pairs(bounds.cpu(), [hi - lo for lo, hi in zip(cu[:-1], cu[1:])])


def _unreadable(t: torch.Tensor) -> bool:
    """The host cannot read ``t``'s values: no data (meta, fake), or a CUDA tensor while its device's current
    stream captures a graph."""
    return without_data(t) or capturing(t)


def useful_flops(q: torch.Tensor, bounds: torch.Tensor, cu_seqlens=None, max_seqlen=None, *, gemms: int) -> int:
    """``2 * D * Hq * gemms`` per admitted pair (:func:`pairs`)."""
    d, hq = q.shape[-1], q.shape[-2]
    return 2 * d * hq * gemms * pairs(q, bounds, cu_seqlens, max_seqlen)


def _fwd_flops(q, k, v, bounds, softmax_scale=None, cap=None, cap_method="tanh", cu_seqlens=None, max_seqlen=None,
               *args, out_val=None, **kwargs) -> int:
    return useful_flops(q, bounds, cu_seqlens, max_seqlen, gemms=FWD_GEMMS)


def _bwd_flops(q, k, v, out, lse, dout, bounds, softmax_scale=None, cap=None, cap_method="tanh", cu_seqlens=None,
               max_seqlen=None, *args, out_val=None, **kwargs) -> int:
    return useful_flops(q, bounds, cu_seqlens, max_seqlen, gemms=BWD_GEMMS)


_FORMULAS = {"ranker_attention_fwd": _fwd_flops, "ranker_attention_bwd": _bwd_flops}


def register(op_name: str) -> None:
    """Register ``torch.ops.cute_kernels.<op_name>``'s formula with torch's FLOP counter (the op's module calls
    this once the op exists; a second call, e.g. after a module reload, keeps the first)."""
    register_flops(getattr(torch.ops.cute_kernels, op_name), _FORMULAS[op_name], get_raw=True)
