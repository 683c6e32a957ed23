"""Analyses of a layout: shared-memory bank conflicts of an access pattern, smem budget, registers.

Bank model (sm_90, as in NVIDIA's profiling guide): shared memory has 32 banks of 4 bytes; one
wavefront serves at most one distinct 4-byte word per bank (threads reading the same word share
it).  A warp's request of ``w``-byte accesses is served in phases of ``128 / w`` threads (all 32
for w <= 4, half-warps for 8 B, quarter-warps for 16 B, which is also how ldmatrix/stmatrix serve
their 8 row addresses per 8x8 matrix).  Phases are formed by thread index (lane): for 16 B, threads
0-7, 8-15, 16-23 and 24-31, whichever of them take part; an inactive thread contributes nothing to
its phase, and a phase without an active thread costs nothing (0 wavefronts, 0 ideal).  Wavefronts
of a phase = the largest number of distinct words any one bank must deliver; the ideal is
``ceil(bytes of the phase / 128)``, summed over the phases that have an active thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .static import StaticLayout, check_elem_bytes, require_int, require_one_of

NUM_BANKS = 32
BANK_BYTES = 4
WAVEFRONT_BYTES = NUM_BANKS * BANK_BYTES  # 128
ACCESS_BYTES = (1, 2, 4, 8, 16)  # bytes per thread of one ld/st.shared (b8 .. v4.b32), what the model serves
INACTIVE = -1  # AccessPattern.coords (row, col) of a thread that takes no part in an access
SMEM_LIMIT_BYTES = 232448  # 227 KB: sm_90 opt-in dynamic shared memory per CTA


# ---------------------------------------------------------------------------- access patterns
@dataclass(frozen=True)
class AccessPattern:
    """Warp-wide shared-memory accesses over a 2-D tile.

    ``coords[a, t] = (row, col)`` is the first element thread ``t`` touches in access (instruction)
    ``a``; each thread touches ``vec`` consecutive elements along ``col`` (a 16-byte vector of bf16
    is ``vec=8``).  ``(-1, -1)`` (:data:`INACTIVE`) marks a thread that takes no part in an access.

    Raises (at construction, and again in :func:`bank_conflicts`, which checks the array it is given):
    ``ValueError`` for coords not shaped (accesses >= 1, 1 <= threads <= 32, 2), any other negative row or
    column, or ``vec`` < 1; ``TypeError`` for non-integer coords or ``vec``.  Rows and columns beyond
    the tile are found by :func:`bank_conflicts`, which knows the tile.
    """

    name: str
    coords: np.ndarray  # (accesses, threads, 2) int
    vec: int = 1

    def __post_init__(self):
        object.__setattr__(self, "vec", require_int("vec", self.vec, 1))
        object.__setattr__(self, "coords", check_coords(self.coords, self.name))

    @property
    def accesses(self) -> int:
        return self.coords.shape[0]


def check_coords(coords, name: str = "pattern") -> np.ndarray:
    """``coords`` as an int64 array shaped (accesses, threads, 2) whose rows and columns are >= 0, or
    (-1, -1) for an inactive thread; ``ValueError``/``TypeError`` naming the pattern otherwise."""
    arr = np.asarray(coords)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: coords must be integers (row, col), got dtype {arr.dtype}")
    if arr.ndim != 3 or arr.shape[2] != 2 or arr.shape[0] < 1 or not 1 <= arr.shape[1] <= 32:
        raise ValueError(f"{name}: coords must have shape (accesses >= 1, 1 <= threads <= 32, 2): one warp's "
                         f"accesses (the banks serve a warp at a time), got {arr.shape}")
    arr = arr.astype(np.int64)
    inactive = np.all(arr == INACTIVE, axis=-1)
    bad = np.any(arr < 0, axis=-1) & ~inactive
    if bad.any():
        a, t = np.argwhere(bad)[0]
        raise ValueError(f"{name}: access {a}, thread {t} has (row, col) = {tuple(int(x) for x in arr[a, t])}, "
                         f"outside the tile: rows and columns start at 0; only ({INACTIVE}, {INACTIVE}) marks an "
                         "inactive thread")
    return arr


def column_read(rows: int = 32, col: int = 0) -> AccessPattern:
    """Thread ``t`` reads element ``(t, col)``: a warp walking down one column, 1 element each.
    ``1 <= rows <= 32`` (one warp) and ``col`` >= 0 (``ValueError`` otherwise)."""
    rows, col = require_int("rows", rows, 1), require_int("col", col, 0)
    c = np.stack([np.arange(rows), np.full(rows, col)], -1)[None]
    return AccessPattern(f"column read: {rows} threads x 1 element of column {col}", c, 1)


def row_vector_read(rows: int = 32, chunk: int = 0, vec: int = 8, row0: int = 0) -> AccessPattern:
    """Thread ``t`` reads a ``vec``-element vector: row ``row0 + t``, columns ``chunk*vec ..`` (the
    16-byte-per-thread reads of a tile by rows, e.g. an epilogue reading smem by 8-row groups).
    ``1 <= rows <= 32`` (one warp), ``vec`` >= 1 and ``chunk``, ``row0`` >= 0 (``ValueError`` otherwise)."""
    rows, vec = require_int("rows", rows, 1), require_int("vec", vec, 1)
    chunk, row0 = require_int("chunk", chunk, 0), require_int("row0", row0, 0)
    c = np.stack([row0 + np.arange(rows), np.full(rows, chunk * vec)], -1)[None]
    return AccessPattern(f"vector read: {rows} rows x {vec} elements at column {chunk * vec}", c, vec)


def row_read(row: int = 0, vec: int = 1, threads: int = 32) -> AccessPattern:
    """Thread ``t`` reads ``vec`` elements at ``(row, t*vec)``: a warp reading along one row.
    ``row`` >= 0, ``vec`` >= 1 and ``1 <= threads <= 32`` (one warp) (``ValueError`` otherwise)."""
    row, vec, threads = require_int("row", row, 0), require_int("vec", vec, 1), require_int("threads", threads, 1)
    c = np.stack([np.full(threads, row), np.arange(threads) * vec], -1)[None]
    return AccessPattern(f"row read: {threads} threads x {vec} elements of row {row}", c, vec)


def pattern_from_tv(tv: StaticLayout, tile: tuple[int, int], vec: int, name: str, warp: Optional[int] = 0,
                    threads_per_warp: int = 32) -> AccessPattern:
    """Accesses of a thread-value layout ``(thread, value) -> index in a column-major (M, N) tile``
    (as the DSL's ``tv_layout_*_tiled`` / ``layout_dst_tv_tiled`` give it).

    Values ``[a*vec, (a+1)*vec)`` of a thread form its access ``a`` (they must be consecutive
    columns).  ``warp`` selects one warp (None: every warp, each access listed per warp); warp ``w``
    is threads ``[w*threads_per_warp, (w+1)*threads_per_warp)``, and the missing threads of a last,
    partial warp are inactive (``(-1, -1)``).

    Raises ``ValueError`` (``TypeError`` for a non-integer) for ``vec`` or ``threads_per_warp`` < 1, a
    ``tile`` that is not two positive extents or that the layout reaches outside, a ``tv`` that is
    not rank 2, a ``warp`` outside ``0 .. warps - 1``, and vectors that are not consecutive columns.
    """
    vec, threads_per_warp = require_int("vec", vec, 1), require_int("threads_per_warp", threads_per_warp, 1)
    m_, n_ = extents_pair("tile", tile)
    if tv.rank != 2:
        raise ValueError(f"tv: expected a rank-2 (thread, value) layout, got dims {tv.dims}")
    nthr = tv.dims[0]
    nwarps = -(-nthr // threads_per_warp)
    if warp is not None and not 0 <= require_int("warp", warp) < nwarps:
        raise ValueError(f"warp={warp}: the thread layout has {nthr} threads = {nwarps} warp(s) of "
                         f"{threads_per_warp}; expected None or 0..{nwarps - 1}")
    idx = tv.outer_offsets()  # (threads, values)
    if idx.min() < 0 or idx.max() >= m_ * n_:
        raise ValueError(f"tile={tile}: the thread-value layout reaches index {idx.max()}, outside the "
                         f"{m_} x {n_} tile (pass the tile it was made for)")
    rows, cols = idx % m_, idx // m_
    nval = idx.shape[1]
    if nval % vec:
        raise ValueError(f"{nval} values per thread is not a multiple of vec={vec}")
    first = np.arange(0, nval, vec)
    for j in range(1, vec):  # every vector must be consecutive columns of one row
        if not (np.all(rows[:, first + j] == rows[:, first]) and np.all(cols[:, first + j] == cols[:, first] + j)):
            raise ValueError(f"values {j} of each vector are not consecutive columns: pick another vec")
    pad = nwarps * threads_per_warp - nthr  # a partial last warp: its missing threads are inactive
    rows = np.pad(rows, ((0, pad), (0, 0)), constant_values=INACTIVE)
    cols = np.pad(cols, ((0, pad), (0, 0)), constant_values=INACTIVE)
    out = []
    for w in (range(nwarps) if warp is None else [warp]):
        t = slice(w * threads_per_warp, (w + 1) * threads_per_warp)
        for a in first:
            out.append(np.stack([rows[t, a], cols[t, a]], -1))
    return AccessPattern(name, np.array(out), vec)


def extents_pair(name: str, value, form: str = "(M, N)") -> tuple[int, int]:
    """``value`` (e.g. a tile ``(M, N)`` or a picture's region ``(rows, cols)``: ``form``) as two integers >= 1:
    ``ValueError`` for anything but a pair, and for an entry below 1; ``TypeError`` for a non-integer entry."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name}={value!r}: expected {form}, two extents")
    return require_int(f"{name}[0]", value[0], 1), require_int(f"{name}[1]", value[1], 1)


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
        waves = self.wavefronts
        per = waves[0] if len(set(waves)) == 1 else f"{min(waves)}..{max(waves)}"
        ideal = self.ideal[0] if len(set(self.ideal)) == 1 else f"{min(self.ideal)}..{max(self.ideal)}"
        verdict = "conflict-free" if self.conflict_free else f"{self.ratio:.1f}x the ideal"
        return (f"{self.pattern} over {self.layout}: {per} wavefront{'' if per == 1 else 's'} per access "
                f"(ideal {ideal}, {self.access_bytes} B per thread, {len(self.wavefronts)} "
                f"{'access' if len(self.wavefronts) == 1 else 'accesses'}): {verdict}")


def request_wavefronts(addresses: np.ndarray, access_bytes: int, active=None) -> tuple[int, int]:
    """(wavefronts, ideal) of one warp-wide request.

    ``addresses[t]`` is the byte address of thread (lane) ``t``, one entry per thread in thread order;
    ``active`` (bool per thread, default all) marks the threads that take part; the addresses of the
    others are ignored.  Phases are groups of ``128 / access_bytes`` consecutive thread indices (all
    32 for <= 4 bytes): inactive threads do not move the others into another phase, they just add
    nothing to theirs, and a phase with no active thread costs 0 wavefronts and adds 0 to the ideal.
    ``access_bytes`` (bytes per thread) must be one of :data:`ACCESS_BYTES`, the widths of one
    shared-memory load/store (``ValueError``, ``TypeError`` for a non-integer); ``ValueError`` for
    ``addresses`` that are not 1-D, more than a warp's 32 threads, not integers, negative, or not multiples
    of ``access_bytes`` (a shared-memory access is aligned to its width), or an ``active`` mask of another
    length.
    """
    waves = ideal = 0
    for _, a, counts in request_phases(addresses, access_bytes, active):
        if not len(a):  # no thread of this phase takes part: no wavefront
            continue
        waves += int(counts.max())
        nbytes = len(np.unique(np.concatenate([a + b for b in range(access_bytes)])))
        ideal += -(-nbytes // WAVEFRONT_BYTES)
    return waves, ideal


def request_phases(addresses: np.ndarray, access_bytes: int, active=None):
    """The phases of one warp-wide request (arguments and errors as :func:`request_wavefronts`): a list of
    ``(first thread, the active threads' byte addresses, distinct 4-byte words per bank [32])``, one per
    group of ``128 / access_bytes`` consecutive threads."""
    check_access_bytes(access_bytes, "access_bytes")
    raw = np.asarray(addresses)
    if raw.ndim != 1:
        raise ValueError(f"addresses: expected one byte address per thread (1-D), got shape {raw.shape}")
    if len(raw) > 32:
        raise ValueError(f"addresses: one warp-wide request has at most 32 threads, got {len(raw)}")
    if raw.size and not (np.issubdtype(raw.dtype, np.integer)
                         or np.issubdtype(raw.dtype, np.floating) and np.all(raw == np.round(raw))):
        raise ValueError(f"addresses: expected integer byte addresses, got {raw.dtype} values such as {raw[0]!r}")
    addresses = raw.astype(np.int64)
    if (addresses < 0).any() or (addresses % access_bytes).any():
        bad = addresses[(addresses < 0) | (addresses % access_bytes != 0)][0]
        raise ValueError(f"addresses: byte addresses must be >= 0 and multiples of access_bytes={access_bytes} "
                         f"(an aligned shared-memory access), got {bad}")
    active = np.ones(len(addresses), dtype=bool) if active is None else np.asarray(active, dtype=bool)
    if active.shape != addresses.shape:
        raise ValueError(f"active: expected one flag per thread ({addresses.shape}), got shape {active.shape}")
    per_phase = max(1, min(32, WAVEFRONT_BYTES // access_bytes))
    phases = []
    for p in range(0, len(addresses), per_phase):
        a = addresses[p:p + per_phase][active[p:p + per_phase]]
        words = np.unique(np.concatenate([(a + b) // BANK_BYTES for b in range(0, access_bytes, BANK_BYTES)]))
        phases.append((p, a, np.bincount(words % NUM_BANKS, minlength=NUM_BANKS)))
    return phases


def check_access_bytes(access_bytes, what: str) -> int:
    """``access_bytes`` as an int, one of :data:`ACCESS_BYTES` (``what`` names it in the error)."""
    return require_one_of(what, access_bytes, ACCESS_BYTES, "bytes per thread of one shared-memory load/store")


def check_stage(layout: StaticLayout, stage: Optional[int]) -> int:
    """The stage index to read of a (rows, cols[, stages]) ``layout``: ``stage`` or 0 for None.

    ``ValueError`` for a layout of another rank, and for a stage outside ``0 .. stages - 1`` (a layout
    without a stage mode is its own stage 0 and takes only None or 0); ``TypeError`` for a non-integer.
    """
    dims = layout.dims
    if len(dims) not in (2, 3):
        raise ValueError(f"expected a rank-2 (or staged rank-3) layout, got dims {dims}")
    if stage is None:
        return 0
    stages = dims[2] if len(dims) == 3 else 1
    if not 0 <= require_int("stage", stage) < stages:
        has = f"has {stages} stages; expected None or 0..{stages - 1}" if len(dims) == 3 else \
            "has no stage mode; expected None or 0"
        raise ValueError(f"stage={stage}: {layout.name or layout} (dims {dims}) {has}")
    return int(stage)


def stage_slice(table: np.ndarray, stage: int) -> np.ndarray:
    """The (rows, cols) plane ``stage`` of a table shaped like a layout's dims (rank 2 is its own plane)."""
    return table[..., stage] if table.ndim == 3 else table


def access_addresses(table: np.ndarray, coords: np.ndarray, vec: int, elem_bytes: int, what: str) -> np.ndarray:
    """Byte address of each active thread of one access ``coords`` (threads, 2) over the (rows, cols)
    ``table`` of byte offsets, in thread order (inactive threads left out: see :func:`thread_addresses`
    for one entry per thread); ``ValueError`` naming ``what`` for an access outside the tile or a
    ``vec``-element vector that is not contiguous in shared memory."""
    active = coords[:, 0] != INACTIVE
    r, c = coords[active, 0], coords[active, 1]
    rows, cols = table.shape
    if len(r) and (r.min() < 0 or r.max() >= rows or c.min() < 0 or c.max() + vec > cols):
        raise ValueError(f"{what}: touches elements outside the {rows} x {cols} tile")
    addr = table[r, c]
    for j in range(1, vec):
        if not np.array_equal(table[r, c + j], addr + j * elem_bytes):
            raise ValueError(f"{what}: a {vec}-element vector is not contiguous")
    return addr


def thread_addresses(table: np.ndarray, coords: np.ndarray, vec: int, elem_bytes: int,
                     what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(addresses, active)`` of one access ``coords`` (threads, 2), one entry per thread (lane):
    what :func:`request_wavefronts` takes.  Inactive threads get address 0 and ``active`` False; the
    checks are :func:`access_addresses`'s."""
    active = coords[:, 0] != INACTIVE
    addr = np.zeros(len(coords), dtype=np.int64)
    addr[active] = access_addresses(table, coords, vec, elem_bytes, what)
    return addr, active


def bank_conflicts(layout: StaticLayout, pattern: AccessPattern, elem_bytes: int,
                   stage: Optional[int] = None) -> ConflictReport:
    """Wavefronts of each access of ``pattern`` over the (rows, cols[, stages]) ``layout``.

    Byte addresses come from :meth:`StaticLayout.byte_offsets` (the kernel's pointer swizzle);
    each thread's ``vec`` elements must be contiguous in shared memory (checked: a vector split by
    the swizzle is a layout/pattern mismatch, ``ValueError``), and inside the tile (``ValueError``).
    Checked before any work (``ValueError``, ``TypeError`` for a non-integer): ``elem_bytes`` one of
    :data:`.static.ELEM_BYTES`, ``vec * elem_bytes`` one of :data:`ACCESS_BYTES`, ``stage`` None or
    ``0 .. stages - 1`` (None or 0 for a layout without a stage mode), the pattern's coords
    (:class:`AccessPattern`: no negative index but the inactive ``(-1, -1)``), and for a Hopper-swizzled
    layout ``elem_bytes`` its own element size (:func:`.static.check_swizzle_atom`).

    Each access is one warp-wide request whose phases are formed by thread index (see
    :func:`request_wavefronts`): inactive threads add nothing to their phase, an all-inactive phase
    adds nothing to the wavefronts or the ideal, and an access with no active thread is (0, 0).
    """
    elem_bytes = check_elem_bytes(elem_bytes)
    s = check_stage(layout, stage)
    coords = check_coords(pattern.coords, pattern.name)
    access_bytes = check_access_bytes(require_int("vec", pattern.vec, 1) * elem_bytes,
                                      f"{pattern.name}: bytes per thread (vec={pattern.vec} x elem_bytes={elem_bytes})")
    table = stage_slice(layout.byte_offsets(elem_bytes), s)
    rep = ConflictReport(pattern.name, layout.name or str(layout), access_bytes)
    for acc in coords:
        addr, active = thread_addresses(table, acc, pattern.vec, elem_bytes, f"{pattern.name} over {rep.layout}")
        w, i = request_wavefronts(addr, access_bytes, active)
        rep.wavefronts.append(w)
        rep.ideal.append(i)
    return rep


def bank_table(layout: StaticLayout, elem_bytes: int, stage: Optional[int] = None) -> np.ndarray:
    """Bank (0..31) of the first byte of each element of a rank-2 (or staged) layout, for ``stage``
    (None: 0).  ``ValueError`` for ``elem_bytes`` not in :data:`.static.ELEM_BYTES` or, for a Hopper-swizzled
    layout, not its own element size (:func:`.static.check_swizzle_atom`), and for a stage the layout does not
    have (see :func:`check_stage`)."""
    elem_bytes = check_elem_bytes(elem_bytes)
    s = check_stage(layout, stage)
    return (stage_slice(layout.byte_offsets(elem_bytes), s) // BANK_BYTES) % NUM_BANKS


# ---------------------------------------------------------------------------- budgets
@dataclass
class SmemBudget:
    """Shared memory of a config: named buffers (bytes), stages, total vs ``limit`` (default
    :data:`SMEM_LIMIT_BYTES`, 227 KiB; a kernel report passes the limit its config's ``validate()`` uses)."""

    buffers: dict[str, int]
    stages: int
    per_stage: int
    extra: int = 0  # barriers, alignment slack
    limit: int = SMEM_LIMIT_BYTES
    extra_label: str = "barriers + alignment"  # what ``extra`` holds, as the report prints it

    def __post_init__(self):
        for name, n in self.buffers.items():
            require_int(f"buffers[{name!r}]", n, minimum=0)
        require_int("stages", self.stages, minimum=1)
        for name in ("per_stage", "extra"):
            require_int(name, getattr(self, name), minimum=0)
        require_int("limit", self.limit, minimum=1)

    @property
    def total(self) -> int:
        return sum(self.buffers.values()) + self.extra

    @property
    def fits(self) -> bool:
        return self.total <= self.limit

    def __str__(self) -> str:
        lines = [f"  {k:<28} {v:>8} B" for k, v in self.buffers.items()]
        lines.append(f"  {self.extra_label:<28} {self.extra:>8} B")
        lines.append(f"  bytes per stage {self.per_stage} x {self.stages} stages; total {self.total} B "
                     f"({self.total / 1024:.1f} KiB) of {self.limit} B ({100 * self.total / self.limit:.1f}%): "
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
