"""Analyses of a layout: shared-memory bank conflicts of an access pattern, smem budget, registers.

Bank model (sm_90, as in NVIDIA's profiling guide): shared memory has 32 banks of 4 bytes; one
wavefront serves at most one distinct 4-byte word per bank (threads reading the same word share
it).  A warp's request of ``w``-byte accesses is served in phases of ``128 / w`` threads (all 32
for w <= 4, half-warps for 8 B, quarter-warps for 16 B, which is also how ldmatrix/stmatrix serve
their 8 row addresses per 8x8 matrix).  Wavefronts of a phase = the largest number of distinct
words any one bank must deliver; the ideal is ``ceil(bytes of the phase / 128)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .static import StaticLayout

NUM_BANKS = 32
BANK_BYTES = 4
WAVEFRONT_BYTES = NUM_BANKS * BANK_BYTES  # 128
SMEM_LIMIT_BYTES = 232448  # 227 KB: sm_90 opt-in dynamic shared memory per CTA


# ---------------------------------------------------------------------------- access patterns
@dataclass(frozen=True)
class AccessPattern:
    """Warp-wide shared-memory accesses over a 2-D tile.

    ``coords[a, t] = (row, col)`` is the first element thread ``t`` touches in access (instruction)
    ``a``; each thread touches ``vec`` consecutive elements along ``col`` (a 16-byte vector of bf16
    is ``vec=8``).  ``coords`` rows of -1 mark inactive threads.
    """

    name: str
    coords: np.ndarray  # (accesses, threads, 2) int
    vec: int = 1

    @property
    def accesses(self) -> int:
        return self.coords.shape[0]


def column_read(rows: int = 32, col: int = 0) -> AccessPattern:
    """Thread ``t`` reads element ``(t, col)``: a warp walking down one column, 1 element each."""
    c = np.stack([np.arange(rows), np.full(rows, col)], -1)[None]
    return AccessPattern(f"column read: {rows} threads x 1 element of column {col}", c, 1)


def row_vector_read(rows: int = 32, chunk: int = 0, vec: int = 8, row0: int = 0) -> AccessPattern:
    """Thread ``t`` reads a ``vec``-element vector: row ``row0 + t``, columns ``chunk*vec ..`` (the
    16-byte-per-thread reads of a tile by rows, e.g. an epilogue reading smem by 8-row groups)."""
    c = np.stack([row0 + np.arange(rows), np.full(rows, chunk * vec)], -1)[None]
    return AccessPattern(f"vector read: {rows} rows x {vec} elements at column {chunk * vec}", c, vec)


def row_read(row: int = 0, vec: int = 1, threads: int = 32) -> AccessPattern:
    """Thread ``t`` reads ``vec`` elements at ``(row, t*vec)``: a warp reading along one row."""
    c = np.stack([np.full(threads, row), np.arange(threads) * vec], -1)[None]
    return AccessPattern(f"row read: {threads} threads x {vec} elements of row {row}", c, vec)


def pattern_from_tv(tv: StaticLayout, tile: tuple[int, int], vec: int, name: str, warp: Optional[int] = 0,
                    threads_per_warp: int = 32) -> AccessPattern:
    """Accesses of a thread-value layout ``(thread, value) -> index in a column-major (M, N) tile``
    (as the DSL's ``tv_layout_*_tiled`` / ``layout_dst_tv_tiled`` give it).

    Values ``[a*vec, (a+1)*vec)`` of a thread form its access ``a`` (they must be consecutive
    columns).  ``warp`` selects one warp (None: every warp, each access listed per warp).
    """
    m_ = tile[0]
    idx = tv.outer_offsets()  # (threads, values)
    rows, cols = idx % m_, idx // m_
    nthr, nval = idx.shape
    if nval % vec:
        raise ValueError(f"{nval} values per thread is not a multiple of vec={vec}")
    first = np.arange(0, nval, vec)
    for j in range(1, vec):  # every vector must be consecutive columns of one row
        if not (np.all(rows[:, first + j] == rows[:, first]) and np.all(cols[:, first + j] == cols[:, first] + j)):
            raise ValueError(f"values {j} of each vector are not consecutive columns: pick another vec")
    warps = range(nthr // threads_per_warp) if warp is None else [warp]
    out = []
    for w in warps:
        t = slice(w * threads_per_warp, (w + 1) * threads_per_warp)
        for a in first:
            out.append(np.stack([rows[t, a], cols[t, a]], -1))
    return AccessPattern(name, np.array(out), vec)


# ---------------------------------------------------------------------------- bank conflicts
@dataclass
class ConflictReport:
    """Wavefronts per access vs the ideal for a pattern over a layout."""

    pattern: str
    layout: str
    access_bytes: int
    wavefronts: list[int] = field(default_factory=list)  # per access (instruction)
    ideal: list[int] = field(default_factory=list)

    @property
    def total(self) -> int:
        return int(sum(self.wavefronts))

    @property
    def ideal_total(self) -> int:
        return int(sum(self.ideal))

    @property
    def ratio(self) -> float:
        """Wavefronts / ideal (1.0 = conflict-free)."""
        return self.total / max(self.ideal_total, 1)

    @property
    def conflict_free(self) -> bool:
        return self.total == self.ideal_total

    def __str__(self) -> str:
        per = self.wavefronts[0] if len(set(self.wavefronts)) == 1 else f"{min(self.wavefronts)}..{max(self.wavefronts)}"
        ideal = self.ideal[0] if len(set(self.ideal)) == 1 else f"{min(self.ideal)}..{max(self.ideal)}"
        verdict = "conflict-free" if self.conflict_free else f"{self.ratio:.1f}x the ideal"
        return (f"{self.pattern} over {self.layout}: {per} wavefronts per access "
                f"(ideal {ideal}, {self.access_bytes} B per thread, {len(self.wavefronts)} accesses): {verdict}")


def request_wavefronts(addresses: np.ndarray, access_bytes: int) -> tuple[int, int]:
    """(wavefronts, ideal) of one warp-wide request: ``addresses`` = byte address per active thread."""
    addresses = np.asarray(addresses, dtype=np.int64)
    per_phase = max(1, min(32, WAVEFRONT_BYTES // access_bytes))
    waves = ideal = 0
    for p in range(0, len(addresses), per_phase):
        a = addresses[p:p + per_phase]
        words = np.unique(np.concatenate([(a + b) // BANK_BYTES for b in range(0, max(access_bytes, 1), BANK_BYTES)]))
        banks = words % NUM_BANKS
        waves += int(np.bincount(banks, minlength=NUM_BANKS).max()) if len(words) else 0
        nbytes = len(np.unique(np.concatenate([a + b for b in range(access_bytes)])))
        ideal += -(-nbytes // WAVEFRONT_BYTES)
    return waves, ideal


def bank_conflicts(layout: StaticLayout, pattern: AccessPattern, elem_bytes: int,
                   stage: Optional[int] = None) -> ConflictReport:
    """Wavefronts of each access of ``pattern`` over the (rows, cols[, stages]) ``layout``.

    Byte addresses come from :meth:`StaticLayout.byte_offsets` (the kernel's pointer swizzle);
    each thread's ``vec`` elements must be contiguous in shared memory (checked: a vector split by
    the swizzle is a layout/pattern mismatch, ``ValueError``), and inside the tile (``ValueError``).
    """
    table = layout.byte_offsets(elem_bytes)
    if table.ndim == 3:
        table = table[..., stage or 0]
    elif table.ndim != 2:
        raise ValueError(f"expected a rank-2 (or staged rank-3) layout, got dims {layout.dims}")
    access_bytes = pattern.vec * elem_bytes
    rep = ConflictReport(pattern.name, layout.name or str(layout), access_bytes)
    rows, cols = table.shape
    for acc in pattern.coords:
        active = acc[:, 0] >= 0
        r, c = acc[active, 0], acc[active, 1]
        if len(r) and (r.max() >= rows or c.min() < 0 or c.max() + pattern.vec > cols):
            raise ValueError(f"{pattern.name}: touches elements outside the {rows} x {cols} tile of {rep.layout}")
        addr = table[r, c]
        for j in range(1, pattern.vec):
            if not np.array_equal(table[r, c + j], addr + j * elem_bytes):
                raise ValueError(f"{pattern.name}: a {pattern.vec}-element vector is not contiguous in {rep.layout}")
        w, i = request_wavefronts(addr, access_bytes)
        rep.wavefronts.append(w)
        rep.ideal.append(i)
    return rep


def bank_table(layout: StaticLayout, elem_bytes: int, stage: Optional[int] = None) -> np.ndarray:
    """Bank (0..31) of the first byte of each element of a rank-2 (or staged) layout."""
    table = layout.byte_offsets(elem_bytes)
    if table.ndim == 3:
        table = table[..., stage or 0]
    return (table // BANK_BYTES) % NUM_BANKS


# ---------------------------------------------------------------------------- budgets
@dataclass
class SmemBudget:
    """Shared memory of a config: named buffers (bytes), stages, total vs the 227 KB limit."""

    buffers: dict[str, int]
    stages: int
    per_stage: int
    extra: int = 0  # barriers, alignment slack
    limit: int = SMEM_LIMIT_BYTES

    @property
    def total(self) -> int:
        return sum(self.buffers.values()) + self.extra

    @property
    def fits(self) -> bool:
        return self.total <= self.limit

    def __str__(self) -> str:
        lines = [f"  {k:<28} {v:>8} B" for k, v in self.buffers.items()]
        lines.append(f"  {'barriers + alignment':<28} {self.extra:>8} B")
        lines.append(f"  bytes per stage {self.per_stage} x {self.stages} stages; total {self.total} B "
                     f"({self.total / 1024:.1f} KiB) of {self.limit} B ({100 * self.total / self.limit:.0f}%): "
                     f"{'fits' if self.fits else 'DOES NOT FIT'}")
        return "\n".join(lines)


def registers(kernel: str, key) -> list[dict]:
    """Registers / static smem / stack per kernel function, from the compile record of ``(kernel, key)``
    (``cute_kernels.runtime.cache.compile_record``); the entry must have been compiled or loaded in
    this process (``KeyError`` otherwise)."""
    from ..runtime.cache import compile_record

    rec = compile_record(kernel, key)
    return [dict(name=r.name, registers=r.registers, static_smem_bytes=r.static_smem_bytes,
                 stack_bytes=r.stack_bytes) for r in rec.resources]
