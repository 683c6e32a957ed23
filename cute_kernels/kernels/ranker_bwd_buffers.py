"""Memory layout shared by the ranker backward's three kernels (preprocess, mainloop, postprocess).

Per-row float32 buffers (``LSE2``, ``dPsum``, the dQ accumulator) hold whole ``tile_m`` q blocks per
sequence, so the mainloop's TMA boxes never cross into a neighbour: ``S_pad = ceil(S / tile_m) *
tile_m`` rows per batch row (fixed length), or, packed (varlen), sequence ``b`` starting at
:func:`padded_offset` in a buffer of :func:`padded_rows` rows.  :func:`sequence_offsets` is the
device side of the same arithmetic, and :class:`BwdFakes` the fake arguments the kernels compile
with (one place, so the three kernels agree on shapes, strides and alignment).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32, const_expr

from ..runtime.fake import fake_tensor, wide_stride

TMA_ALIGN = 8  # 16-bit elements per 16 bytes: the strides TMA needs


def padded_offset(offset, batch, tile_m: int):
    """Start of sequence ``batch`` (packed start ``offset``) in the padded per-row buffers of the
    varlen form: a multiple of ``tile_m`` with room for whole q blocks."""
    return ((offset + batch * tile_m) // tile_m) * tile_m


def padded_rows(total: int, num_batch: int, tile_m: int, varlen: bool) -> int:
    """Rows of the padded per-row buffers: ``ceil(S / tile_m) * tile_m`` (fixed length), or
    ``ceil((T + B * tile_m) / tile_m) * tile_m`` (packed; see :func:`padded_offset`)."""
    if varlen:
        return -(-(total + num_batch * tile_m) // tile_m) * tile_m
    return -(-total // tile_m) * tile_m


def dq_flag_coord(batch, head, padded_q_block, varlen: bool) -> tuple:
    """Coordinate of a dQ accumulator tile's int32 flag (``mdQflag``, made when ``dq_flagged``: the deterministic
    mode's count of adds, or ``dq_zero_in_mainloop``'s tile state): ``(B, Hq, S_pad / tile_m)`` by q block, or
    packed ``(1, Hq, T_pad / tile_m)`` by padded q block, i.e. ``pad_offset // tile_m + q block``
    (:func:`sequence_offsets`).  The preprocess zeroes the flags, the mainloop counts or claims them, the
    postprocess reads them: all three index them here."""
    return (0, head, padded_q_block) if varlen else (batch, head, padded_q_block)


@cute.jit
def sequence_offsets(mCuSeqlens, batch, seqlen_static, tile_m: cutlass.Constexpr, varlen: cutlass.Constexpr):
    """``(offset, seqlen, pad_offset)`` of batch row ``batch``: its first packed row, its length and
    its first row in the padded per-row buffers (``(0, seqlen_static, 0)`` for fixed length)."""
    offset = Int32(0)
    seqlen = seqlen_static
    pad = Int32(0)
    if const_expr(varlen):
        offset = Int32(mCuSeqlens[batch])
        seqlen = Int32(mCuSeqlens[batch + 1]) - offset
        pad = padded_offset(offset, batch, tile_m)
    return offset, seqlen, pad


class BwdFakes:
    """Fake (shape-only) arguments of the backward kernels, fixed-length ``(B, S, H, D)`` or packed
    ``(T, H, D)``: ``inputs(h)`` are q/k/v/dO/O-like (any 16-byte aligned strides), ``outputs(h,
    dtype)`` compact gradients or accumulators, ``rows()`` a padded per-row float32 buffer,
    ``dq_accum()`` the padded float32 dQ accumulator, ``dq_flag()`` its int32 flags per q block (the
    deterministic mode's add counters, or ``dq_zero_in_mainloop``'s zeroed-tile flags), ``lse()`` the
    forward's LSE, ``cu`` the packed offsets (None for fixed length)."""

    def __init__(self, head_dim: int, varlen: bool):
        self.head_dim = head_dim
        self.varlen = varlen
        self.hq, self.hkv = cute.sym_int(), cute.sym_int()
        if varlen:
            self._t, self._padded = cute.sym_int(), cute.sym_int()
            self.cu = fake_tensor(torch.int32, (cute.sym_int(),), align=4)
        else:
            self._b, self._s, self._padded = cute.sym_int(), cute.sym_int(), cute.sym_int()
            self.cu = None

    def _lead(self):
        return (self._t,) if self.varlen else (self._b, self._s)

    def _stride(self):
        n = 2 if self.varlen else 3
        return tuple(wide_stride(TMA_ALIGN) for _ in range(n)) + (1,)

    def inputs(self, h, dtype):
        return fake_tensor(dtype, (*self._lead(), h, self.head_dim), stride=self._stride())

    def outputs(self, h, dtype):
        return fake_tensor(dtype, (*self._lead(), h, self.head_dim))

    def _per_row(self, *tail, align: int):
        lead = (self.hq, self._padded) if self.varlen else (self._b, self.hq, self._padded)
        return fake_tensor(torch.float32, (*lead, *tail), align=align)

    def rows(self):
        return self._per_row(align=16)

    def dq_accum(self):
        return self._per_row(self.head_dim, align=16)

    def dq_flag(self):
        """int32 counter per (q block, query head): ``(B, Hq, S_pad / tile_m)``, packed
        ``(1, Hq, T_pad / tile_m)``."""
        return fake_tensor(torch.int32, (cute.sym_int(), self.hq, cute.sym_int()), align=4)

    def lse(self):
        shape = (self.hq, self._t) if self.varlen else (self._b, self.hq, self._s)
        return fake_tensor(torch.float32, shape, align=4)

    def bounds(self):
        return fake_tensor(torch.int32, (cute.sym_int(), 4), align=4)
