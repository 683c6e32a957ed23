"""The ranker attention mask: segments of one sequence, block ranges and row predicates.

Shared by the forward (``ranker_fwd``) and the backward (``ranker_bwd*``).  Semantics (issue 3, seed 002):
a sequence of length ``seqlen`` holds a history segment ``[hist_lo, hist_hi)`` and a candidate
segment ``[cand_lo, cand_hi)``.  Query ``i`` attends key ``j`` iff

    (j in history and (i in history or i in candidates)) or (i in candidates and j == i).

Bounds are *clamped*, never rejected: ``lo = clamp(lo, 0, seqlen)``, ``hi = clamp(hi, lo, seqlen)``,
so a segment with ``hi <= lo`` is empty and a segment reaching past the sequence is cut at its end.
The same rule is used by the torch reference (:func:`clamp_bounds`, :func:`dense_mask`).

In the kernel, every active query row attends the whole history, so a CTA visits the history KV
blocks ``[hist_lo // tile_n, ceil(hist_hi / tile_n))`` once each, masking columns only in the two
edge blocks.  The candidate self term (``j == i`` for a candidate row outside the history) is a
per-row dot product, never a diagonal tile.
"""

from __future__ import annotations

import cutlass
import torch
from cutlass import Boolean, Int32


def clamp_bounds(bounds: torch.Tensor, seqlen) -> torch.Tensor:
    """``bounds [..., 4]`` clamped as the kernel does (``seqlen``: int or tensor broadcastable)."""
    b = bounds.to(torch.int64)
    seqlen = torch.as_tensor(seqlen, dtype=torch.int64, device=b.device)
    zero = torch.zeros_like(seqlen)
    hl = torch.minimum(torch.maximum(b[..., 0], zero), seqlen)
    hh = torch.minimum(torch.maximum(b[..., 1], hl), seqlen)
    cl = torch.minimum(torch.maximum(b[..., 2], zero), seqlen)
    ch = torch.minimum(torch.maximum(b[..., 3], cl), seqlen)
    return torch.stack([hl, hh, cl, ch], dim=-1)


def dense_mask(bounds_row, seqlen: int, device=None) -> torch.Tensor:
    """``[seqlen, seqlen]`` bool mask (query, key) of one sequence, from its 4 (unclamped) bounds."""
    hl, hh, cl, ch = (int(x) for x in clamp_bounds(torch.as_tensor(bounds_row).view(4), seqlen))
    idx = torch.arange(seqlen, device=device)
    in_hist = (idx >= hl) & (idx < hh)
    in_cand = (idx >= cl) & (idx < ch)
    q_hist, q_cand = in_hist[:, None], in_cand[:, None]
    k_hist = in_hist[None, :]
    diag = idx[:, None] == idx[None, :]
    return (k_hist & (q_hist | q_cand)) | (q_cand & diag)


def admitted_pairs(bounds: torch.Tensor, seqlens) -> int:
    """Number of (query, key) pairs the mask admits, summed over sequences (for useful FLOPs)."""
    total = 0
    for row, s in zip(bounds.tolist(), seqlens):
        hl, hh, cl, ch = (int(x) for x in clamp_bounds(torch.tensor(row), int(s)))
        nh = hh - hl
        nc = ch - cl
        overlap = max(0, min(hh, ch) - max(hl, cl))
        rows = nh + nc - overlap  # queries in either segment
        total += rows * nh + (nc - overlap)  # history keys + self term of candidates outside history
    return total


def q_block_ranges(hist_lo: int, hist_hi: int, cand_lo: int, cand_hi: int, tile_m: int):
    """Host mirror of :meth:`RankerSegments.m_block_ranges` on clamped bounds (plain ints, for tests).

    The q blocks (``tile_m`` rows) holding a row of the history or of the candidates, as at most two
    disjoint ranges ``(lo1, n1, lo2, n2)``: every such block exactly once, in increasing order."""
    return _block_ranges(hist_lo, hist_hi, cand_lo, cand_hi, tile_m, int, max)


def _block_ranges(hl, hh, cl, ch, tile_m, as_int, vmax):
    """Branch-free union of the history and candidate q-block ranges (shared by host and device)."""
    h_ne = as_int(hh > hl)
    c_ne = as_int(ch > cl)
    h_lo = hl // tile_m
    h_hi = ((hh + (tile_m - 1)) // tile_m) * h_ne + h_lo * (1 - h_ne)
    c_lo = cl // tile_m
    c_hi = ((ch + (tile_m - 1)) // tile_m) * c_ne + c_lo * (1 - c_ne)
    # an empty range takes the other one's place (union with the empty set)
    h_lo, h_hi = h_lo * h_ne + c_lo * (1 - h_ne), h_hi * h_ne + c_hi * (1 - h_ne)
    c_lo, c_hi = c_lo * c_ne + h_lo * (1 - c_ne), c_hi * c_ne + h_hi * (1 - c_ne)
    h_first = as_int(h_lo <= c_lo)
    f_lo = h_lo * h_first + c_lo * (1 - h_first)
    f_hi = h_hi * h_first + c_hi * (1 - h_first)
    s_lo = c_lo * h_first + h_lo * (1 - h_first)
    s_hi = c_hi * h_first + h_hi * (1 - h_first)
    merged = as_int(s_lo <= f_hi)  # overlapping or touching: one range
    any_ne = as_int((h_ne + c_ne) > 0)
    n1 = (f_hi - f_lo + merged * vmax(s_hi - f_hi, s_hi * 0)) * any_ne
    n2 = (s_hi - s_lo) * (1 - merged) * any_ne
    return f_lo, n1, s_lo, n2


class RankerSegments:
    """Clamped segment bounds of one sequence inside a kernel (trace-time helper, Int32 values)."""

    def __init__(self, hist_lo: Int32, hist_hi: Int32, cand_lo: Int32, cand_hi: Int32, seqlen: Int32):
        self.hist_lo = hist_lo
        self.hist_hi = hist_hi
        self.cand_lo = cand_lo
        self.cand_hi = cand_hi
        self.seqlen = seqlen

    _FIELDS = ("hist_lo", "hist_hi", "cand_lo", "cand_hi", "seqlen")

    # DSL value protocol: lets a RankerSegments live across dynamic `if`/`while` (five Int32 values)
    def __extract_mlir_values__(self):
        values = []
        for f in self._FIELDS:
            values += cutlass.extract_mlir_values(getattr(self, f))
        return values

    def __new_from_mlir_values__(self, values):
        return RankerSegments(*[cutlass.new_from_mlir_values(getattr(self, f), [v])
                                for f, v in zip(self._FIELDS, values)])

    @staticmethod
    def load(mBounds, batch: Int32, seqlen: Int32) -> "RankerSegments":
        """Read ``bounds[batch]`` (int32 x4) and clamp it to ``[0, seqlen]``."""
        zero = Int32(0)
        hl = cutlass.min(cutlass.max(Int32(mBounds[batch, 0]), zero), seqlen)
        hh = cutlass.min(cutlass.max(Int32(mBounds[batch, 1]), hl), seqlen)
        cl = cutlass.min(cutlass.max(Int32(mBounds[batch, 2]), zero), seqlen)
        ch = cutlass.min(cutlass.max(Int32(mBounds[batch, 3]), cl), seqlen)
        return RankerSegments(hl, hh, cl, ch, seqlen)

    def n_block_min(self, tile_n: int) -> Int32:
        return self.hist_lo // tile_n

    def n_block_count(self, tile_n: int) -> Int32:
        """History KV blocks to visit (0 for an empty history); each block once."""
        n_max = (self.hist_hi + (tile_n - 1)) // tile_n
        return cutlass.max(n_max - self.n_block_min(tile_n), Int32(0)) * Int32(self.hist_hi > self.hist_lo)

    def m_block_ranges(self, tile_m: int):
        """Backward: the q blocks whose rows reach a history KV block (rows in the history or the
        candidates), as two disjoint ranges ``(lo1, n1, lo2, n2)``, each block once (see
        :func:`q_block_ranges`).  Candidate-only KV blocks are reached by no q block."""
        return _block_ranges(self.hist_lo, self.hist_hi, self.cand_lo, self.cand_hi, tile_m, Int32, cutlass.max)

    def tile_active(self, row_lo: Int32, row_hi: Int32) -> Boolean:
        """Does ``[row_lo, row_hi)`` meet the history or the candidates?"""
        h = Int32(row_lo < self.hist_hi) * Int32(row_hi > self.hist_lo)
        c = Int32(row_lo < self.cand_hi) * Int32(row_hi > self.cand_lo)
        return (h + c) > 0

    def in_hist(self, row: Int32) -> Int32:
        return Int32(row >= self.hist_lo) * Int32(row < self.hist_hi)

    def in_cand(self, row: Int32) -> Int32:
        return Int32(row >= self.cand_lo) * Int32(row < self.cand_hi)

    def row_active(self, row: Int32) -> Boolean:
        """Row attends at least one key (history row or candidate row)."""
        return (self.in_hist(row) + self.in_cand(row)) > 0

    def tile_has_self_rows(self, row_lo: Int32, row_hi: Int32) -> Boolean:
        """Does ``[row_lo, row_hi)`` hold a row that :meth:`takes_self_term` (a candidate outside the history)?"""
        lo = cutlass.max(row_lo, self.cand_lo)
        hi = cutlass.min(row_hi, self.cand_hi)
        return (Int32(lo < hi) * (Int32(lo < self.hist_lo) + Int32(hi > self.hist_hi))) > 0

    def takes_self_term(self, row: Int32) -> Boolean:
        """Candidate row outside the history: its own key is an extra, off-history key."""
        return (self.in_cand(row) * (1 - self.in_hist(row))) > 0

    def col_valid(self, col: Int32) -> Boolean:
        return (Int32(col >= self.hist_lo) * Int32(col < self.hist_hi)) > 0

    def cols_in_history(self, col_lo: Int32, col_hi: Int32) -> Boolean:
        """Is every key of ``[col_lo, col_hi)`` (non-empty) a history key, so that no key mask applies?"""
        return (Int32(col_lo >= self.hist_lo) * Int32(col_hi <= self.hist_hi)) > 0
