"""Fused Q/K RMSNorm over the whole hidden size, one GPU: q and k normalized in place, one launch.

Math (seed 000, sglang ``tp_qknorm.cuh``, with the standard eps): for every token ``n``

    q[n, :] = q[n, :] * rsqrt(sum(q[n, :]^2) / Q + eps) * q_weight
    k[n, :] = k[n, :] * rsqrt(sum(k[n, :]^2) / K + eps) * k_weight

accumulated in float32.  (The seed adds eps to the sum, i.e. eps/Q inside the mean; not copied.)

Design: memory bound, so every byte is moved once with 16-byte vectors.  A CTA owns ``rows``
tokens; its first ``rows * q.threads`` threads normalize the q rows, the remaining
``rows * k.threads`` threads the k rows (each warp is all-q or all-k).  A row of ``W`` elements is
``W / vec`` 16-byte vectors (``vec = 128 / dtype bits``); ``threads`` threads of the row hold
``vecs`` vectors each (thread ``i`` holds vectors ``i, i + threads, ...``: coalesced), with a
column predicate when ``threads * vecs * vec`` overshoots ``W``.  The sum of squares is reduced by
butterfly shuffles over the row's lanes (``threads <= 32``, a power of two), or per warp and then
across the row's warps through shared memory and a named barrier (``threads`` a multiple of 32;
q and k use different barriers); x stays in its packed 16-bit registers across that reduction
(:func:`keep_packed`).  The row stride is a dynamic argument, so sliced views of a fused qkv buffer
work without copies.

For the shapes where it was measured faster (:data:`PERSISTENT_SHAPES`: 16-bit q and k of 4096 and
1024 columns), from :data:`PERSISTENT_MIN_TOKENS` tokens while q and k take at most
:data:`PERSISTENT_L2_FRACTION` of L2, the op launches the
same tiling as a persistent kernel (``QKNormTuning.persistent_ctas``, :func:`launch_key`): 3 CTAs per
SM (what one SM holds of it there: 64 registers x 320 threads), each walking row tiles ``b, b + grid,
...`` with the weights loaded once and the next tile's loads issued before this tile's stores (the same
sums in the same order, so the same bits as one CTA per tile).  Elsewhere it needs more registers (e.g.
128 at 6144/1024 bf16, 74 at 4096/1024 float32: 1-2 CTAs per SM) and measured slower, so those shapes
keep one CTA per tile (16-bit 6144/1024 takes the bulk-staged kernel below inside its band).

At the edge of L2 (:data:`BULK_STAGES`: 16-bit 4096/1024 and 6144/1024, q + k within
:data:`BULK_L2_BAND` of L2 and not taken by the persistent kernel) the op launches bulk-staged rows
(``QKNormTuning.bulk_stages``): 3 persistent CTAs per SM, each staging about 60 KB of token rows in
shared memory.  A producer warp (one lane; warp specialization) moves whole q and k rows by
``cp.async.bulk``: global -> shared completing a slot's ``full`` mbarrier, then, once the CTA's q and k
threads have normalized the row in place and arrived on the slot's ``ready`` mbarrier, shared -> global
as a bulk group, and after the store has read the slot, the refill with the row ``stages`` ahead.  The
q and k threads read the same vectors as the register kernels (the same bits) and run without a CTA
barrier.  Past L2 one CTA per token is fastest again (:func:`launch_key`), with an L2 prefetch: at its start,
CTA ``b`` asks L2 for the rows of the CTA about 4 MiB of rows later (``QKNormTuning.l2_prefetch_bytes``: 409
CTAs ahead at bf16 4096/1024; one ``cp.async.bulk.prefetch.L2`` per row and part), so each CTA finds its rows
in L2 and more bytes are in flight than 4 CTAs of one token per SM hold in registers: N=16384 80.7-80.9 us
instead of 83.8-84.4, ahead of torch's copy of the same bytes (82.7; :data:`L2_PREFETCH_BYTES`).

The same row tiling, at 4 vectors per thread (``qknorm_tp.TP_TUNING``), serves the tensor-parallel kernel
(:mod:`cute_kernels.kernels.qknorm_tp`), where the row is one rank's shard and ``Q``/``K`` are the full sizes.

Figures (H200, Q=4096, K=1024, bf16, kernel time in a CUDA graph).  One CTA per token / persistent
(bench/qknorm_sweep.py, one run; a graph replays the in-place op on the same q and k, so up to N=4096 they
stay in L2): N=1024 5.35 / 5.19 us, 2048 8.74 / 7.79, 4096 18.75 / 16.72; beyond L2 the persistent kernel
loses (8192: 43.5 / 45.1).  One CTA per token at every N (bench/results/2026-11-29_h200_qknorm.jsonl):
N=1 1.7 us, N=64 2.0 us, N=4096 18.7 us, N=16384 83.5 us (94.5% of the 4249 GB/s copy rate measured in
the same process; the issue's floor at 4185 GB/s is 80 us).  torch ``rms_norm`` on q and k: 6.3 / 7.1 /
32.1 / 103.9 us; quack ``rmsnorm`` on q and k: 3.6 / 4.3 / 26.0 / 85.8 us.  Eager, per call from torch:
9.6-10.2 us up to N=512 (torch 20-22 us, quack 55 us).
"""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import dsl_user_op

from ..registry import CheckResult, CompileTarget
from ..runtime.cache import compile_cached
from ..runtime.fake import cute_dtype, fake_stream, fake_tensor
from ..runtime.arch import _DEVICE_OK
from ..runtime.torch_op import autograd_records, custom_op, refuse_inference_tensors
from ..runtime.validate import (ValidatedConfig, check_config_fields, check_distinct_rows, check_extent, check_f32_eps,
                                check_float_tensors, check_int, check_same_device, check_tensor, F32_MAX,
                                F32_MIN_NORMAL, INT32_MAX)
from . import sm90_helpers as sm90

NAME = "qknorm"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Shipped (Q, K) full sizes and tensor-parallel degrees: MiniMax-M2-style 48/8 heads of 128 and 32/8.
SHIPPED_DIMS = ((4096, 1024), (6144, 1024))
SHIPPED_G = (1, 2, 4, 8)

_THREAD_CHOICES = (256, 224, 192, 160, 128, 96, 64, 32, 16, 8, 4, 2, 1)
_MAX_VECS = 8  # RowTiling.choose's search bound and target_vecs' most (rows too wide for it: up to _MAX_ROW_VECS)
# widest rows: 256 threads x 12 vectors (24576 bf16 / 12288 fp32 elements) compile without spills
# (sm_90a, 162 registers); 16 vectors spilled 344 B of stack
_MAX_ROW_VECS = 12
# CTAs of at most 512 threads (so at least 128 registers per thread): 544-thread CTAs (two rows of a wide
# part next to a 16-thread one) spilled 72-1080 B of stack
MAX_CTA_THREADS = 512
BULK_SMEM_LIMIT = 200 * 1024  # staged rows per CTA (sm_90a: 227 KB per CTA; the rest for barriers, sums)


def vec_elems(dtype: torch.dtype) -> int:
    """Elements per 16-byte vector: 8 for 16-bit types, 4 for float32."""
    return 16 // torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class RowTiling:
    """How the threads of one row cover ``width`` elements: ``threads`` x ``vecs`` 16-byte vectors."""

    width: int
    vec: int
    threads: int
    vecs: int

    @property
    def nvec(self) -> int:
        return self.width // self.vec

    @property
    def ragged(self) -> bool:
        """Whether the last column vectors are predicated off."""
        return self.threads * self.vecs != self.nvec

    @staticmethod
    def choose(width: int, vec: int, target_vecs: int = 4) -> "RowTiling":
        """Prefer an exact split with about ``target_vecs`` vectors per thread, then fewer predicated slots."""
        nvec = width // vec
        best = None
        for t in _THREAD_CHOICES:
            v = -(-nvec // t)
            if v > _MAX_VECS or (t > nvec and t > 1):
                continue
            score = (t * v != nvec, abs(v - target_vecs), t * v - nvec, -t)
            if best is None or score < best[0]:
                best = (score, t, v)
        if best is None:  # very wide rows: as many threads as allowed (validate refuses > _MAX_ROW_VECS vectors)
            t = 256
            return RowTiling(width, vec, t, -(-nvec // t))
        return RowTiling(width, vec, best[1], best[2])

    def validate(self) -> None:
        for name in ("width", "vec", "threads", "vecs"):
            check_int(name, getattr(self, name))
        if self.vec not in (4, 8):
            raise ValueError(f"vec={self.vec}: elements per 16-byte vector are 8 (16-bit types) or 4 (float32)")
        if self.width <= 0 or self.width % self.vec:
            raise ValueError(f"row width {self.width} must be a positive multiple of {self.vec} (16-byte vectors)")
        if not (self.threads in (1, 2, 4, 8, 16, 32) or self.threads % 32 == 0):
            raise ValueError(f"threads per row {self.threads}: must be a power of two <= 32 or a multiple of 32")
        if self.threads * self.vecs < self.nvec:
            raise ValueError(f"{self.threads} threads x {self.vecs} vectors do not cover {self.nvec} vectors")
        if self.vecs > _MAX_ROW_VECS:
            raise ValueError(f"a row of {self.width} elements needs {self.vecs} 16-byte vectors per thread; at most "
                             f"{_MAX_ROW_VECS} fit in registers without spilling (rows up to "
                             f"{_THREAD_CHOICES[0] * _MAX_ROW_VECS * self.vec} elements)")


@dataclass(frozen=True)
class QKNormTuning(ValidatedConfig):
    """Performance knobs (never change results).

    ``target_vecs``: 16-byte vectors per thread per row (bytes in flight per thread).
    ``streaming``: rows are read once and written once: evict-first loads, streaming (``.cs``) stores
    (the register kernels; not with ``bulk_stages``).
    ``persistent_ctas``: 0 = one CTA per row tile; ``> 0`` = at most that many CTAs, CTA ``b`` walking
    row tiles ``b, b + grid, ...`` with the weights loaded once and the next tile's loads issued before
    this tile's stores (any value is correct on any GPU; the SM count only sets the speed).
    ``bulk_stages``: 0 = rows move through registers; ``>= 2`` (with ``persistent_ctas``) = each CTA
    stages that many token rows in shared memory, loaded and stored whole by bulk copies
    (``cp.async.bulk``) that a producer warp issues while the other warps normalize.
    ``l2_prefetch_bytes``: 0 = off; ``> 0`` (one CTA per row tile only) = at its start CTA ``b`` asks L2
    for the rows of the CTA that many bytes of rows later, ``b + QKNormConfig.l2_prefetch_ctas``
    (``cp.async.bulk.prefetch.L2``, one instruction per row and part: no registers, no wait), so that CTA
    finds them in L2 (more bytes in flight past L2).
    """

    target_vecs: int = 4
    streaming: bool = False
    persistent_ctas: int = 0
    bulk_stages: int = 0
    l2_prefetch_bytes: int = 0

    def validate(self) -> None:
        check_config_fields(self)  # (exact ints and bools, as every kernel config: not numpy ints or floats)
        check_int("target_vecs", self.target_vecs, low=1, high=_MAX_VECS)
        check_int("persistent_ctas", self.persistent_ctas, low=0)
        check_int("bulk_stages", self.bulk_stages, low=0)
        if self.bulk_stages == 1 or (self.bulk_stages and not self.persistent_ctas):
            raise ValueError(f"bulk_stages={self.bulk_stages}: 0, or >= 2 with persistent_ctas > 0")
        if self.bulk_stages and self.streaming:
            raise ValueError("streaming hints apply to rows moved through registers; bulk_stages moves rows by "
                             "bulk copies (use one or the other)")
        if self.bulk_stages * self.persistent_ctas > 2**30:  # row + (stages - 1) * grid stays in int32
            raise ValueError(f"bulk_stages x persistent_ctas = {self.bulk_stages * self.persistent_ctas} > 2**30")
        check_int("l2_prefetch_bytes", self.l2_prefetch_bytes, low=0, high=2**30)
        if self.l2_prefetch_bytes and self.persistent_ctas:
            raise ValueError(f"l2_prefetch_bytes={self.l2_prefetch_bytes}: for one CTA per row tile only "
                             f"(persistent_ctas={self.persistent_ctas} walks its own tiles)")


# H200, Q=4096 K=1024 bf16, CUDA graph (bench/qknorm_sweep.py): 2 vectors per thread 83.7 us at N=16384
# (4: 84.9, 8: 84.1), 2.07 us at N=64 (4: 1.98); cache hints within noise.  The L2 prefetch of the rows
# about L2_PREFETCH_BYTES ahead (session 32, bench/qknorm_l2_prefetch_probe.py, H200, bf16, CUDA graph,
# 7 shuffled rounds in one run, us; bench/results/logs/2026-12-01_s32_qknorm_l2_prefetch_probe.log):
#   4096/1024 (10 KB a token)  none / 264 / 396 / 528 / 660 / 792 / 1056 CTAs ahead: N=8192 43.42 / 41.70 /
#     41.88 / 42.11 / 42.32 / 42.55 / 43.36; 16384 83.80 / 80.69 / 80.68 / 80.92 / 80.96 / 81.28 / 82.75
#     (torch's copy of the same bytes 82.65); 32768 164.17 / 158.16 / 158.13 / ... / 162.91; 2112 and 4224
#     ahead (an earlier run) 10-35% slower: prefetched rows evicted before their CTA reads them;
#   6144/1024 (14 KB a token)  N=16384 115.07 / 111.85 / 112.08 / 112.57 / 114.65 / 119.37 / 132.75 (copy
#     113.17); 8192 and 32768 alike;
# best at 3-5.5 MB of rows ahead at both widths, worse from about 9 MB: so a distance in bytes, 4 MiB (409
# CTAs ahead at 4096/1024, 292 at 6144/1024)
L2_PREFETCH_BYTES = 4 << 20
# The one-GPU op's tuning, and the default of QKNormConfig and for_shape (qknorm_tp runs its own, TP_TUNING)
DEFAULT_TUNING = QKNormTuning(target_vecs=2, l2_prefetch_bytes=L2_PREFETCH_BYTES)


@dataclass(frozen=True)
class QKNormConfig(ValidatedConfig):
    """Static shape of the fused kernel: per-rank row tilings of q and k, tokens per CTA.

    ``q_dim``/``k_dim`` are the full (all-rank) sizes that divide the sum of squares.
    """

    q: RowTiling
    k: RowTiling
    rows: int
    q_dim: int
    k_dim: int
    tuning: QKNormTuning = DEFAULT_TUNING

    @staticmethod
    def for_shape(q_width: int, k_width: int, dtype: torch.dtype, q_dim: int | None = None,
                  k_dim: int | None = None, tuning: QKNormTuning = DEFAULT_TUNING) -> "QKNormConfig":
        """The tiling of per-rank rows ``q_width`` / ``k_width`` (ints) of ``dtype`` (one of :data:`DTYPES`);
        ``q_dim`` / ``k_dim``: the full sizes dividing the sum of squares (None: the widths).  ``tuning``: the
        one-GPU op's :data:`DEFAULT_TUNING` unless given (the tensor-parallel kernel passes its own,
        ``qknorm_tp.TP_TUNING``).  ``TypeError`` / ``ValueError`` for bad arguments or a pair that does not
        fit one CTA."""
        if dtype not in DTYPES:
            raise TypeError(f"dtype {dtype}: must be one of {[str(d).replace('torch.', '') for d in DTYPES]}")
        if not isinstance(tuning, QKNormTuning):
            raise TypeError(f"tuning={tuning!r}: must be a QKNormTuning")
        q_width, k_width = check_int("q_width", q_width), check_int("k_width", k_width)  # (plain ints from here:
        q_dim, k_dim = (None if dim is None else check_int(name, dim)  # the config's fields are exact ints)
                        for name, dim in (("q_dim", q_dim), ("k_dim", k_dim)))
        vec = vec_elems(dtype)
        for name, w in (("q", q_width), ("k", k_width)):
            if w <= 0 or w % vec:
                raise ValueError(f"{name} row width {w} must be a positive multiple of {vec} for "
                                 f"{str(dtype).replace('torch.', '')} (16-byte vectors)")
        q, k = RowTiling.choose(q_width, vec, tuning.target_vecs), RowTiling.choose(k_width, vec, tuning.target_vecs)
        while True:
            rows = 32 // min(q.threads, k.threads, 32)  # every warp all-q or all-k
            if rows * (q.threads + k.threads) <= MAX_CTA_THREADS:
                break
            # a narrow part next to a wide one: give the narrow part more (idle) lanes (fewer rows per CTA)
            narrow = q if q.threads < k.threads else k
            wider = RowTiling(narrow.width, vec, narrow.threads * 2, -(-narrow.nvec // (narrow.threads * 2)))
            q, k = (wider, k) if narrow is q else (q, wider)
        return QKNormConfig(q, k, rows, q_dim or q_width, k_dim or k_width, tuning)  # (validated when constructed)

    @property
    def q_threads(self) -> int:
        return self.rows * self.q.threads

    @property
    def k_threads(self) -> int:
        return self.rows * self.k.threads

    @property
    def threads(self) -> int:
        return self.q_threads + self.k_threads

    @property
    def l2_prefetch_ctas(self) -> int:
        """How many CTAs ahead ``tuning.l2_prefetch_bytes`` reaches: at least 1 (0 when off), a CTA's rows
        being ``rows * (Q + K)`` elements of this config's vector size."""
        if not self.tuning.l2_prefetch_bytes:
            return 0
        tile_bytes = self.rows * (self.q.width + self.k.width) * (16 // self.q.vec)
        return max(1, self.tuning.l2_prefetch_bytes // tile_bytes)

    @property
    def block_threads(self) -> int:
        """Threads per CTA: the q and k threads, plus the bulk kernel's producer warp."""
        return self.threads + (32 if self.tuning.bulk_stages else 0)

    def registers_needed(self) -> int:
        """A register estimate per thread: 8 per 16-byte vector held (data and weight) + 40, checked against
        ``sm90.max_registers_per_thread`` (ptxas, sm_90a, 12 vectors: 162 registers where 320 threads allow
        more; at the 128 of 416 threads no stack, at 448 16 B, at 512 256 B: the estimate, 136, refuses all
        three)."""
        return 8 * max(self.q.vecs, self.k.vecs) + 40

    def validate(self) -> None:
        for name, kind in (("q", RowTiling), ("k", RowTiling), ("tuning", QKNormTuning)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"QKNormConfig.{name}={getattr(self, name)!r}: must be a {kind.__name__}")
        for name in ("rows", "q_dim", "k_dim"):
            if type(getattr(self, name)) is not int:  # (for_shape passes plain ints)
                raise TypeError(f"QKNormConfig.{name}={getattr(self, name)!r}: must be an int")
            check_int(name, getattr(self, name))
        self.q.validate()
        self.k.validate()
        if self.q.vec != self.k.vec:
            raise ValueError("q and k must use the same vector size (same dtype)")
        if self.q_threads % 32 or self.k_threads % 32:
            raise ValueError(f"rows={self.rows}: q threads {self.q_threads} and k threads {self.k_threads} "
                             "must be multiples of 32 (warps are all-q or all-k)")
        if self.block_threads > 1024:
            raise ValueError(f"{self.block_threads} threads per CTA > 1024")
        need, avail = self.registers_needed(), sm90.max_registers_per_thread(self.block_threads)
        if need > avail:
            raise ValueError(f"q rows of {self.q.width} and k rows of {self.k.width} elements together need about "
                             f"{need} registers per thread ({max(self.q.vecs, self.k.vecs)} 16-byte vectors of data "
                             f"and weight) in a CTA of {self.block_threads} threads, which has {avail}: they would "
                             "spill; make one of them narrower")
        if self.q_dim < self.q.width or self.k_dim < self.k.width:
            raise ValueError(f"full dims (q_dim={self.q_dim}, k_dim={self.k_dim}) must be >= the per-rank widths "
                             f"({self.q.width}, {self.k.width})")
        if self.tuning.bulk_stages:
            if self.rows != 1 or self.q.ragged or self.k.ragged:
                raise ValueError("bulk_stages needs one token row per CTA and no predicated columns "
                                 f"(rows={self.rows}, q ragged={self.q.ragged}, k ragged={self.k.ragged})")
            if self.bulk_smem_bytes() > BULK_SMEM_LIMIT:
                raise ValueError(f"bulk_stages={self.tuning.bulk_stages}: {self.bulk_smem_bytes()} B of shared "
                                 f"memory > {BULK_SMEM_LIMIT}")

    def bulk_smem_bytes(self) -> int:
        """Shared memory of the staged rows of the bulk-copy kernel (q and k, ``bulk_stages`` of each; the
        partial sums and mbarriers add under 2 KB, inside the margin :data:`BULK_SMEM_LIMIT` leaves)."""
        return self.tuning.bulk_stages * (self.q.width + self.k.width) * (16 // self.q.vec)


@dsl_user_op
def _opaque_move(word, *, loc=None, ip=None) -> Int32:
    """``mov.b32`` through inline PTX the compiler cannot see through or move (a side effect)."""
    return Int32(llvm.inline_asm(Int32.mlir_type, [Int32(word).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
                                 has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def prefetch_l2(addr, nbytes: int, *, loc=None, ip=None) -> None:
    """``cp.async.bulk.prefetch.L2.global [addr], nbytes``: ask L2 for ``nbytes`` (a multiple of 16) of global
    memory from byte address ``addr`` (an Int64), asynchronously and without a destination."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Int32(nbytes).ir_value(loc=loc, ip=ip)],
                    "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def prefetch_row_exists(tile, r, n, rows):
    """Whether row ``r`` (``0 <= r < rows``) of row tile ``tile >= 0`` is a token, ``tile * rows + r < n``
    for ``n >= 1``, without forming the row index (which could pass int32 for a tile far past the last):
    :meth:`QKNormKernel.prefetch_later_rows`'s guard, on DSL integers there and on Python ints in the tests
    (the numerator is positive, so floor and truncating division agree)."""
    return tile < (n - r + rows - 1) // rows


@cute.jit
def keep_packed(tXrX: cute.Tensor):
    """Pass every 32-bit word of the register fragment ``tXrX`` through :func:`_opaque_move`, so that the
    float32 copies of x made before this point (the sum of squares) cannot be reused after it: the
    compiler keeps x in its packed 16-bit form across the row reduction and converts it again for the
    scale, instead of holding float32 copies alive (bf16 6144/1024: 58 -> 48 registers, 3 -> 4 CTAs per
    SM; same values, so the same bits)."""
    words = cute.recast_tensor(tXrX, Int32)
    for i in cutlass.range_constexpr(cute.size(words)):
        words[i] = _opaque_move(words[i])


class NamedBarrier(enum.IntEnum):
    """The kernels' named barriers (0 is the whole CTA's ``cute.arch.barrier()``): the q threads and the k
    threads of a CTA each sync among themselves, on their own barrier."""

    Q_ROWS = 1
    K_ROWS = 2


class RowRole(NamedTuple):
    """The q threads or the k threads of a CTA, as compile-time facts (a ``cutlass.Constexpr`` argument of the
    role methods).  The q threads come first: ``0 .. config.q_threads``, then the k threads."""

    which: int  # 0: q, 1: k (qknorm_tp: the column of sPart / sSum and the half of a push slot)
    part: RowTiling  # the row tiling of this tensor
    dim: int  # the RMS divisor: the full row width (across ranks for qknorm_tp)
    first_thread: int  # the role's first thread in the CTA; methods take tidx counted from it
    barrier_id: int  # its NamedBarrier

    @property
    def warp_base(self) -> int:
        """The role's first warp in the CTA: its warps' slots of ``sRed`` start there."""
        return self.first_thread // 32


class QKRowNormalizer:
    """Device-side pieces shared by the one-GPU and tensor-parallel kernels (all ``@cute.jit``).

    ``load_rows`` -> ``row_sum_of_squares`` -> (all-reduce across ranks, TP only) ->
    ``scale_and_store``.
    """

    def __init__(self, dtype: type[cutlass.Numeric], config: QKNormConfig):
        self.dtype = dtype
        self.config = config
        self.vec = config.q.vec
        self.num_warps = config.threads // 32
        self.q_role = RowRole(0, config.q, config.q_dim, 0, int(NamedBarrier.Q_ROWS))
        self.k_role = RowRole(1, config.k, config.k_dim, config.q_threads, int(NamedBarrier.K_ROWS))

    def _load_atom(self):
        if cutlass.const_expr(self.config.tuning.streaming):
            return cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), self.dtype, num_bits_per_copy=128,
                                       l1c_evict_priority=cute.nvgpu.CacheEvictionPriority.EVICT_FIRST)
        return cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)

    def _store_atom(self):
        if cutlass.const_expr(self.config.tuning.streaming):
            return cute.make_copy_atom(cute.nvgpu.CopyR2GOp(), self.dtype, num_bits_per_copy=128,
                                       store_cache_mode=cute.nvgpu.StoreCacheMode.STREAMING)
        return cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)

    def _tiled_copy(self, part: RowTiling):
        atom = self._load_atom()
        thr_layout = cute.make_ordered_layout((self.config.rows, part.threads), order=(1, 0))
        val_layout = cute.make_layout((1, self.vec))
        return atom, cute.make_tiled_copy_tv(atom, thr_layout, val_layout)

    @cute.jit
    def weight_partition(self, mW: cute.Tensor, thr_copy, tile: cutlass.Constexpr) -> cute.Tensor:
        """This thread's vectors of the weight ``mW [W]``, seen as a ``(tile rows, W)`` tensor with row
        stride 0 (every row of a tile scales by the same weight), partitioned like the rows."""
        mWb = cute.make_tensor(mW.iterator, cute.make_layout((tile[0], mW.shape[0]), stride=(0, 1)))
        return thr_copy.partition_S(cute.local_tile(mWb, tile, (0, 0)))

    @cute.jit
    def load_rows(self, mX: cute.Tensor, mW: cute.Tensor, part: cutlass.Constexpr, tidx: Int32,
                  tile_idx: Int32, n: Int32):
        """Load this thread's vectors of the CTA's rows of ``mX`` and of the weight (zeros outside).

        Returns (tXgX, tXrX, tXrW, row_ok, col_ok) for :meth:`scale_and_store`.
        """
        rows = self.config.rows
        tile = (rows, part.threads * part.vecs * self.vec)
        atom, tiled_copy = self._tiled_copy(part)
        thr_copy = tiled_copy.get_slice(tidx)
        gX = cute.local_tile(mX, tile, (tile_idx, 0))
        cX = cute.local_tile(cute.make_identity_tensor(mX.shape), tile, (tile_idx, 0))
        tXgX = thr_copy.partition_S(gX)  # (atom, 1, vecs)
        tXcX = thr_copy.partition_S(cX)
        tXgW = self.weight_partition(mW, thr_copy, tile)
        tXrX = cute.make_fragment_like(tXgX)
        tXrW = cute.make_fragment_like(tXgW)
        tXrX.fill(0)
        tXrW.fill(0)
        row_ok = tXcX[0][0] < n
        col_ok = cute.make_rmem_tensor(cute.make_layout(part.vecs), cutlass.Boolean)
        for j in cutlass.range_constexpr(part.vecs):
            col_ok[j] = tXcX[(0, 0, j)][1] < part.width
        if row_ok:
            self._copy_vectors(atom, tXgX, tXrX, col_ok, part)
        self._copy_vectors(atom, tXgW, tXrW, col_ok, part)
        return tXgX, tXrX, tXrW, row_ok, col_ok

    @cute.jit
    def row_sum_of_squares(self, tXrX: cute.Tensor, role: cutlass.Constexpr, tidx: Int32, sRed: cute.Tensor) -> Float32:
        """float32 sum of squares of this thread's row, identical in every thread of the row (``tidx``
        counted within ``role``; a row of several warps adds their partials through ``sRed`` behind the
        role's named barrier)."""
        part, warp_base = role.part, role.warp_base
        x = tXrX.load().to(Float32)
        ss = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)
        ss = cute.arch.warp_reduction(ss, operator.add, threads_in_group=min(part.threads, 32))
        if cutlass.const_expr(part.threads > 32):
            warps_per_row = part.threads // 32
            warp = tidx // 32
            if tidx % 32 == 0:
                sRed[warp_base + warp] = ss
            cute.arch.barrier(barrier_id=role.barrier_id, number_of_threads=self.config.rows * part.threads)
            first = warp_base + (tidx // part.threads) * warps_per_row
            ss = sRed[first]
            for w in cutlass.range_constexpr(1, warps_per_row):  # fixed order
                ss = ss + sRed[first + w]
        return ss

    @cute.jit
    def scale_and_store(self, tXgX: cute.Tensor, tXrX: cute.Tensor, tXrW: cute.Tensor, scale: Float32,
                        row_ok, col_ok: cute.Tensor, part: cutlass.Constexpr):
        tXrY = self.scaled(tXrX, tXrW, scale)
        if row_ok:
            self._copy_vectors(self._store_atom(), tXrY, tXgX, col_ok, part)

    @cute.jit
    def scaled(self, tXrX: cute.Tensor, tXrW: cute.Tensor, scale: Float32) -> cute.Tensor:
        """``x * scale * w`` in float32, rounded to the input dtype (a new register fragment)."""
        tXrY = cute.make_fragment_like(tXrX)
        tXrY.store((tXrX.load().to(Float32) * scale * tXrW.load().to(Float32)).to(self.dtype))
        return tXrY

    @cute.jit
    def _copy_vectors(self, atom, src: cute.Tensor, dst: cute.Tensor, col_ok: cute.Tensor, part: cutlass.Constexpr):
        """Copy this thread's ``part.vecs`` 16-byte vectors, the predicated-off columns skipped."""
        for j in cutlass.range_constexpr(part.vecs):
            if cutlass.const_expr(part.ragged):
                if col_ok[j]:
                    cute.copy(atom, src[None, None, j], dst[None, None, j])
            else:
                cute.copy(atom, src[None, None, j], dst[None, None, j])


class QKNormKernel(QKRowNormalizer):
    """One launch normalizes q [N, Q] and k [N, K] in place; CTA ``b`` owns tokens ``b*rows ..``."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mWq: cute.Tensor, mWk: cute.Tensor,
                 eps: Float32, stream):
        n = mQ.shape[0]
        rows = self.config.rows
        grid = (n + rows - 1) // rows
        if cutlass.const_expr(self.config.tuning.persistent_ctas > 0):
            grid = cutlass.min(grid, self.config.tuning.persistent_ctas)
        self.kernel(mQ, mK, mWq, mWk, eps).launch(grid=[grid, 1, 1], block=[self.config.block_threads, 1, 1],
                                                  stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mWq: cute.Tensor, mWk: cute.Tensor, eps: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        cfg = self.config
        smem = cutlass.memory.SmemAllocator()
        n = mQ.shape[0]
        if cutlass.const_expr(cfg.tuning.persistent_ctas == 0):
            sRed = smem.allocate_tensor(Float32, cute.make_layout(self.num_warps), byte_alignment=16)
            if tidx < cfg.q_threads:
                if cutlass.const_expr(cfg.l2_prefetch_ctas > 0):
                    self.prefetch_later_rows(mQ, cfg.q, tidx, bidx, n)
                self.normalize(mQ, mWq, self.q_role, tidx, bidx, n, eps, sRed)
            else:
                if cutlass.const_expr(cfg.l2_prefetch_ctas > 0):
                    self.prefetch_later_rows(mK, cfg.k, tidx - cfg.q_threads, bidx, n)
                self.normalize(mK, mWk, self.k_role, tidx - cfg.q_threads, bidx, n, eps, sRed)
        elif cutlass.const_expr(cfg.tuning.bulk_stages > 0):
            stages = cfg.tuning.bulk_stages
            sRed = smem.allocate_tensor(Float32, cute.make_layout(2 * self.num_warps), byte_alignment=16)
            full = smem.allocate_array(cutlass.Int64, num_elems=stages, byte_alignment=8)
            ready = smem.allocate_array(cutlass.Int64, num_elems=stages, byte_alignment=8)
            sQ = smem.allocate_tensor(self.dtype, cute.make_ordered_layout((stages, cfg.q.width), order=(1, 0)),
                                      byte_alignment=128)
            sK = smem.allocate_tensor(self.dtype, cute.make_ordered_layout((stages, cfg.k.width), order=(1, 0)),
                                      byte_alignment=128)
            if tidx == 0:
                for s in cutlass.range_constexpr(stages):
                    cute.arch.mbarrier_init(full + s, 1)
                    cute.arch.mbarrier_init(ready + s, cfg.threads)
            cute.arch.mbarrier_init_fence()
            cute.arch.barrier()
            if tidx >= cfg.threads:
                if tidx == cfg.threads:
                    self.bulk_producer(mQ, mK, sQ, sK, full, ready, bidx, n)
            elif tidx < cfg.q_threads:
                self.normalize_staged(mWq, sQ, full, ready, self.q_role, tidx, bidx, n, eps, sRed)
            else:
                self.normalize_staged(mWk, sK, full, ready, self.k_role, tidx - cfg.q_threads, bidx, n, eps, sRed)
        else:  # two slots per warp: a tile's partial sums are written while the last tile's may still be read
            sRed = smem.allocate_tensor(Float32, cute.make_layout(2 * self.num_warps), byte_alignment=16)
            if tidx < cfg.q_threads:
                self.normalize_tiles(mQ, mWq, self.q_role, tidx, bidx, n, eps, sRed)
            else:
                self.normalize_tiles(mK, mWk, self.k_role, tidx - cfg.q_threads, bidx, n, eps, sRed)

    @cute.jit
    def prefetch_later_rows(self, mX: cute.Tensor, part: cutlass.Constexpr, tidx: Int32, bidx: Int32, n: Int32):
        """``l2_prefetch_bytes``: thread ``r < rows`` of a part asks L2 for its part of row ``r`` of the CTA
        ``config.l2_prefetch_ctas`` later (rows past ``n`` skipped; ``bidx + l2_prefetch_ctas`` stays in
        int32: at most 2**30 CTAs ahead, and the row index is formed only below ``n``)."""
        rows = self.config.rows
        if tidx < rows:
            tile = bidx + self.config.l2_prefetch_ctas
            if prefetch_row_exists(tile, tidx, n, rows):
                prefetch_l2(mX[tile * rows + tidx, None].iterator.toint(), part.width * self.dtype.width // 8)

    @cute.jit
    def normalize(self, mX: cute.Tensor, mW: cute.Tensor, role: cutlass.Constexpr, tidx: Int32, bidx: Int32,
                  n: Int32, eps: Float32, sRed: cute.Tensor):
        """One CTA per row tile: load ``role``'s rows of tile ``bidx``, sum, scale, store."""
        tXgX, tXrX, tXrW, row_ok, col_ok = self.load_rows(mX, mW, role.part, tidx, bidx, n)
        ss = self.row_sum_of_squares(tXrX, role, tidx, sRed)
        keep_packed(tXrX)
        scale = cute.math.rsqrt(ss * Float32(1.0 / role.dim) + eps, fastmath=True)
        self.scale_and_store(tXgX, tXrX, tXrW, scale, row_ok, col_ok, role.part)

    @cute.jit
    def normalize_tiles(self, mX: cute.Tensor, mW: cute.Tensor, role: cutlass.Constexpr, tidx: Int32, bidx: Int32,
                        n: Int32, eps: Float32, sRed: cute.Tensor):
        """``persistent_ctas``: this CTA's row tiles ``bidx, bidx + grid, ...``.  The weight vectors are
        loaded once; each step sums and scales the tile in registers, issues the next tile's loads into
        the same registers, then stores the scaled tile.  The partial sums of warps alternate between
        the two halves of ``sRed`` (a warp can be at most one tile ahead of another of its part: the part's
        named barrier).  The tile index is checked against the tile count before the row index is formed
        (no int32 overflow for any N the row index itself can hold)."""
        part = role.part
        rows = self.config.rows
        tile = (rows, part.threads * part.vecs * self.vec)
        atom, tiled_copy = self._tiled_copy(part)
        store_atom = self._store_atom()
        thr_copy = tiled_copy.get_slice(tidx)
        tXgW = self.weight_partition(mW, thr_copy, tile)
        tXcX = thr_copy.partition_S(cute.local_tile(cute.make_identity_tensor(mX.shape), tile, (0, 0)))
        tXrX = cute.make_fragment_like(thr_copy.partition_S(cute.local_tile(mX, tile, (0, 0))))
        tXrW = cute.make_fragment_like(tXgW)
        tXrX.fill(0)  # predicated-off columns stay 0 for every tile
        tXrW.fill(0)
        col_ok = cute.make_rmem_tensor(cute.make_layout(part.vecs), cutlass.Boolean)
        for j in cutlass.range_constexpr(part.vecs):
            col_ok[j] = tXcX[(0, 0, j)][1] < part.width
        self._copy_vectors(atom, tXgW, tXrW, col_ok, part)
        row = tXcX[0][0]  # this thread's row within a tile
        n_tiles = (n + rows - 1) // rows
        grid, _, _ = cute.arch.grid_dim()
        t = bidx
        if t * rows + row < n:
            self._copy_vectors(atom, thr_copy.partition_S(cute.local_tile(mX, tile, (t, 0))), tXrX, col_ok, part)
        slot = Int32(0)
        while t < n_tiles:
            sRed_t = cute.make_tensor(sRed.iterator + slot * self.num_warps, cute.make_layout(self.num_warps))
            ss = self.row_sum_of_squares(tXrX, role, tidx, sRed_t)
            scale = cute.math.rsqrt(ss * Float32(1.0 / role.dim) + eps, fastmath=True)
            tXrY = self.scaled(tXrX, tXrW, scale)
            t_next = t + grid
            if t_next < n_tiles:
                if t_next * rows + row < n:
                    self._copy_vectors(atom, thr_copy.partition_S(cute.local_tile(mX, tile, (t_next, 0))), tXrX,
                                       col_ok, part)
            if t * rows + row < n:
                self._copy_vectors(store_atom, tXrY, thr_copy.partition_S(cute.local_tile(mX, tile, (t, 0))),
                                   col_ok, part)
            t = t_next
            slot = 1 - slot

    @cute.jit
    def bulk_load_row(self, mQ: cute.Tensor, mK: cute.Tensor, sQ: cute.Tensor, sK: cute.Tensor, full,
                      slot, row: Int32, n: Int32):
        """One thread: bulk-copy token ``row``'s q and k rows into ``slot`` (nothing past ``n``); the slot's
        barrier completes when their bytes have landed."""
        if row < n:
            cfg = self.config
            bits = self.dtype.width
            cute.arch.mbarrier_arrive_and_expect_tx(full + slot, (cfg.q.width + cfg.k.width) * bits // 8)
            for mX, sX, width in ((mQ, sQ, cfg.q.width), (mK, sK, cfg.k.width)):
                atom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), self.dtype, num_bits_per_copy=width * bits)
                src, dst = cute.group_modes(mX[row, None], 0, 1), cute.group_modes(sX[slot, None], 0, 1)
                cute.copy(atom, src, dst, mbar_ptr=full + slot)

    @cute.jit
    def bulk_store_row(self, mQ: cute.Tensor, mK: cute.Tensor, sQ: cute.Tensor, sK: cute.Tensor, slot,
                       row: Int32):
        """One thread: bulk-copy ``slot``'s scaled q and k rows back to token ``row`` (one bulk group)."""
        cfg = self.config
        for mX, sX, width in ((mQ, sQ, cfg.q.width), (mK, sK, cfg.k.width)):
            atom = cute.make_copy_atom(cpasync.CopyBulkS2GOp(), self.dtype,
                                       num_bits_per_copy=width * self.dtype.width)
            src, dst = cute.group_modes(sX[slot, None], 0, 1), cute.group_modes(mX[row, None], 0, 1)
            cute.copy(atom, src, dst)
        cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def bulk_producer(self, mQ: cute.Tensor, mK: cute.Tensor, sQ: cute.Tensor, sK: cute.Tensor, full, ready,
                      bidx: Int32, n: Int32):
        """``bulk_stages``, the producer warp's one lane: fill every slot, then per row ``i`` (slot
        ``i % stages``) wait until the CTA's threads have written it back (``ready``), bulk-store it, wait
        until the store has read the slot and refill it with row ``i + stages``."""
        stages = self.config.tuning.bulk_stages
        grid, _, _ = cute.arch.grid_dim()
        for s in cutlass.range_constexpr(stages):
            self.bulk_load_row(mQ, mK, sQ, sK, full, s, bidx + s * grid, n)
        row = bidx
        i = Int32(0)
        while row < n:
            s = i % stages
            cute.arch.mbarrier_wait(ready + s, (i // stages) % 2)
            self.bulk_store_row(mQ, mK, sQ, sK, s, row)
            cute.arch.cp_async_bulk_wait_group(0, read=True)
            self.bulk_load_row(mQ, mK, sQ, sK, full, s, row + stages * grid, n)
            row = row + grid
            i = i + 1

    @cute.jit
    def normalize_staged(self, mW: cute.Tensor, sX: cute.Tensor, full, ready, role: cutlass.Constexpr, tidx: Int32,
                         bidx: Int32, n: Int32, eps: Float32, sRed: cute.Tensor):
        """``bulk_stages``, a part's threads: this CTA's token rows ``bidx, bidx + grid, ...``; per row wait
        for its slot (``full``), read this thread's vectors (the same ones, so the same sums and bits, as
        the register kernels), sum (the part's named barrier), write the scaled values back in place,
        fence them for the bulk store and arrive on ``ready``; no CTA barrier (q and k run
        independently, at most ``stages`` rows apart)."""
        part = role.part
        stages = self.config.tuning.bulk_stages
        tile = (1, part.width)
        atom, tiled_copy = self._tiled_copy(part)
        smem_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        thr_copy = tiled_copy.get_slice(tidx)
        tXgW = self.weight_partition(mW, thr_copy, tile)
        tXrW = cute.make_fragment_like(tXgW)
        cute.copy(atom, tXgW, tXrW)
        grid, _, _ = cute.arch.grid_dim()
        row = bidx
        i = Int32(0)
        slot = Int32(0)
        while row < n:
            s = i % stages
            cute.arch.mbarrier_wait(full + s, (i // stages) % 2)
            tXsX = thr_copy.partition_S(cute.local_tile(sX, tile, (s, 0)))
            tXrX = cute.make_fragment_like(tXsX)
            cute.copy(smem_atom, tXsX, tXrX)
            sRed_t = cute.make_tensor(sRed.iterator + slot * self.num_warps, cute.make_layout(self.num_warps))
            ss = self.row_sum_of_squares(tXrX, role, tidx, sRed_t)
            scale = cute.math.rsqrt(ss * Float32(1.0 / role.dim) + eps, fastmath=True)
            cute.copy(smem_atom, self.scaled(tXrX, tXrW, scale), tXsX)
            cute.arch.fence_proxy("async.shared", space="cta")  # generic writes -> the bulk store's reads
            cute.arch.mbarrier_arrive(ready + s)
            row = row + grid
            i = i + 1
            slot = 1 - slot


# ----------------------------------------------------------------------------- host side

# Persistent CTAs (the same tiling, so the same bits) for PERSISTENT_SHAPES: 3 per SM (what one SM holds
# there: 64 registers x 320 threads), each loading the weights once, from N = 1024 tokens while q and k
# fit in 60% of L2 (85% until session 18; from there to 95% bulk-staged rows are faster).  H200, bf16
# 4096/1024, same run, us (one CTA per token / persistent): N=1024 5.35 / 5.19, 2048 8.74 / 7.79, 4096
# 18.75 / 16.72; past L2 it loses (5120: 28.1 / 28.9, 8192: 43.5 / 45.1, 16384: 84.4 / 88.3: fewer bytes in
# flight than 4 CTAs of one token per SM), and below 1024 it is level
# (512: 3.60 / 3.66) (bench/results/logs/2026-11-30_s15_qknorm_persistent_sweep.log).  At the other
# shipped shapes it needs more registers (bf16 6144/1024: 128; float32 4096/1024: 74) and was slower
# (bf16 6144/1024 N=2048 14.8 vs 11.9 us; float32 4096/1024 19.5 vs 18.1; a review's H200 run), so they
# keep one CTA per tile.
PERSISTENT_SHAPES = frozenset((dt, 4096, 1024) for dt in (torch.float16, torch.bfloat16))
PERSISTENT_MIN_TOKENS = 1024
PERSISTENT_CTAS_PER_SM = 3
PERSISTENT_L2_FRACTION = 0.6
# Bulk-staged rows (QKNormTuning.bulk_stages; the same tiling, so the same bits) for BULK_STAGES's shapes:
# 3 CTAs per SM, each staging about 60 KB of token rows (the stage count per shape), while q + k are
# between BULK_L2_BAND of L2 (at the edge of L2) and the register kernels do not take them.  H200 (60 MiB
# of L2), bf16, same run, us (session 18, bench/results/logs/2026-11-30_s18_qknorm_bulk_*.log; a graph
# replays the op on the same q and k; in L2 fractions 4096/1024 N=3584 is 0.58, 5120 0.83, 6144/1024 N=2048
# 0.47, 4096 0.93): 4096/1024 (persistent / bulk 3x6 / one CTA per token) N=3072 10.56 / 11.50 / 12.24,
# 3584 12.68 / 12.91 / 14.65, 4096 16.61 / 15.26 / 18.70 (first run 16.71 / 14.63), 4352 19.69 / 18.56 /
# 21.55, 5120 28.75 / 26.76 / 28.14, 8192 45.5 / 46.0 / 43.6, 16384 88.3 / 89.7 / 84.5; 6144/1024 (bulk 3x4 /
# one CTA per token) N=1024 6.66 / 6.83, 2048 10.36 / 11.41, 3072 17.72 / 21.41, 4096 31.52 / 31.82.  Those
# runs had one thread of the normalizing warps issue the copies (it stalled its warp on each store's smem
# read); a producer warp took 3-5% off in the band (same run: 4096/1024 N=4096 14.82 vs 15.32, 5120 25.97
# vs 27.03; 6144/1024 N=3072 16.79 vs 17.76; past L2 still behind one CTA per token: 16384 86.9 vs 84.0;
# logs/2026-11-30_s18_qknorm_bulk_producer_warp.log).  With it the band became 30-95% of L2 (it was
# 45-90%): 4096/1024 N=5632 (0.92) 30.2 vs 31.5 (one CTA per token); 6144/1024 N=1536 (0.35) 8.45 vs 9.22,
# 3949 (0.90) 28.9 vs 30.9 (logs/2026-11-30_s18_qknorm_bulk_gpu_a93adc3.log).
BULK_STAGES = {(dt, q, 1024): stages for dt in (torch.float16, torch.bfloat16) for q, stages in ((4096, 6), (6144, 4))}
BULK_L2_BAND = (0.3, 0.95)
_device_limits: dict[int, tuple[int, int]] = {}  # device index -> (persistent CTAs, L2 bytes)


def device_limits(device_index: int) -> tuple[int, int]:
    """``(persistent CTAs, L2 bytes)`` of a CUDA device: :data:`PERSISTENT_CTAS_PER_SM` x its SMs, and its
    L2 size (cached by device index); :func:`launch_key` reads them.  ``device_index``: an int (None or a
    ``torch.device`` taken too: None or no index is the current device, looked up on every call)."""
    lim = _device_limits.get(device_index)  # (the hot path: an int index; None is never stored)
    if lim is None:
        if not torch.cuda.is_available():
            raise RuntimeError("device_limits needs a CUDA device (none is available)")
        idx = device_index.index if isinstance(device_index, torch.device) else device_index
        idx = torch.cuda.current_device() if idx is None else idx
        lim = _device_limits.get(idx)
        if lim is None:
            props = torch.cuda.get_device_properties(idx)
            lim = (PERSISTENT_CTAS_PER_SM * props.multi_processor_count, int(props.L2_cache_size))
            _device_limits[idx] = lim
    return lim


def launch_key(n: int, key: tuple, device_index: int) -> tuple:
    """The compiled kernel for ``n`` tokens of ``key = (dtype, Q, K)`` on a device, by the bytes of q + k
    against its L2 (:func:`device_limits`), from :data:`PERSISTENT_MIN_TOKENS` tokens:
    ``key + (CTAs,)`` (persistent, registers) for :data:`PERSISTENT_SHAPES` up to
    :data:`PERSISTENT_L2_FRACTION` of L2; else ``key + (CTAs, stages)`` (bulk-staged rows) for
    :data:`BULK_STAGES` inside :data:`BULK_L2_BAND`; else ``key`` (one CTA per row tile).  All give the
    same bits."""
    if (not isinstance(key, tuple) or len(key) != 3 or key[0] not in DTYPES
            or any(type(w) is not int or w <= 0 for w in key[1:])):
        raise TypeError(f"key {key!r}: expected a tuple (torch dtype in {DTYPES}, Q, K) with positive int widths")
    return _pick_key(check_int("n", n, low=0), key, device_index)


def _pick_key(n: int, key: tuple, device_index: int) -> tuple:
    """:func:`launch_key` without its argument checks (the op's hot path, whose arguments are checked)."""
    if n < PERSISTENT_MIN_TOKENS or (key not in PERSISTENT_SHAPES and key not in BULK_STAGES):
        return key
    ctas, l2 = device_limits(device_index)
    nbytes = n * (key[1] + key[2]) * key[0].itemsize
    if key in PERSISTENT_SHAPES and nbytes <= PERSISTENT_L2_FRACTION * l2:
        return key + (ctas,)
    if key in BULK_STAGES and BULK_L2_BAND[0] * l2 < nbytes <= BULK_L2_BAND[1] * l2:
        return key + (ctas, BULK_STAGES[key])
    return key


def _persistent_tuning(ctas: int, bulk_stages: int = 0) -> QKNormTuning:
    """The default tiling as a persistent kernel of ``ctas`` CTAs, rows staged in ``bulk_stages`` shared
    memory slots or (0) held in registers (the same bits either way)."""
    return QKNormTuning(DEFAULT_TUNING.target_vecs, DEFAULT_TUNING.streaming, ctas, bulk_stages)


def _compile_key(key: tuple):
    """:func:`_compile` for a :func:`launch_key`."""
    return _compile(*key) if len(key) == 3 else _compile(*key[:3], _persistent_tuning(*key[3:]))


def fake_launch_args(dtype: torch.dtype, q_width: int, k_width: int) -> tuple:
    """The compile-time arguments of a one-GPU kernel: q [N, Q] and k [N, K] with symbolic N and 16-byte
    row strides, the weights, eps and a stream (kernels compiled with them take any N and row stride)."""
    vec = vec_elems(dtype)
    n = cute.sym_int()
    sq, sk = cute.sym_int(divisibility=vec), cute.sym_int(divisibility=vec)
    return (fake_tensor(dtype, (n, q_width), stride=(sq, 1)), fake_tensor(dtype, (n, k_width), stride=(sk, 1)),
            fake_tensor(dtype, (q_width,)), fake_tensor(dtype, (k_width,)), Float32(1e-6), fake_stream())


def _compile(dtype: torch.dtype, q_width: int, k_width: int, tuning: QKNormTuning = DEFAULT_TUNING):
    cfg = QKNormConfig.for_shape(q_width, k_width, dtype, tuning=tuning)

    def build():
        return QKNormKernel(cute_dtype(dtype), cfg), fake_launch_args(dtype, q_width, k_width)

    return compile_cached(NAME, _cache_key(dtype, q_width, k_width, tuning), build)


def _cache_key(dtype: torch.dtype, q_width: int, k_width: int, tuning: QKNormTuning) -> tuple:
    """The compile cache's key of a kernel: ``(dtype name, Q, K)``, plus the tuning where it is not the default."""
    return (str(dtype), q_width, k_width) if tuning == DEFAULT_TUNING else (str(dtype), q_width, k_width, tuning)


def shipped_shapes() -> list[tuple[int, int]]:
    """Per-rank (q width, k width) of every shipped (Q, K, G)."""
    out = []
    for q, k in SHIPPED_DIMS:
        for g in SHIPPED_G:
            if (q // g, k // g) not in out:
                out.append((q // g, k // g))
    return out


H200_PERSISTENT_CTAS = PERSISTENT_CTAS_PER_SM * 132


def _shipped_kernels() -> list[tuple[str, torch.dtype, int, int, QKNormTuning]]:
    """``(label, dtype, q width, k width, tuning)`` of every shipped kernel: each shipped per-rank shape and dtype
    at :data:`DEFAULT_TUNING`, then the persistent and bulk-staged kernels of :data:`PERSISTENT_SHAPES` /
    :data:`BULK_STAGES` at the H200's CTA count (what :func:`launch_key` picks there)."""
    out = [(f"{str(d).replace('torch.', '')} q={qw} k={kw}", d, qw, kw, DEFAULT_TUNING)
           for d in DTYPES for qw, kw in shipped_shapes()]
    for kind, shapes, stages_of in (("persistent", PERSISTENT_SHAPES, lambda key: 0),
                                    ("bulk", BULK_STAGES, BULK_STAGES.get)):
        for d, qw, kw in sorted(shapes, key=str):
            tuning = _persistent_tuning(H200_PERSISTENT_CTAS, stages_of((d, qw, kw)))
            extra = f" stages={tuning.bulk_stages}" if tuning.bulk_stages else ""
            out.append((f"{str(d).replace('torch.', '')} q={qw} k={kw} {kind}={H200_PERSISTENT_CTAS}{extra}",
                        d, qw, kw, tuning))
    return out


def compile_targets() -> list[CompileTarget]:
    """The kernels of :func:`_shipped_kernels`, keyed as :func:`_compile` caches them."""
    return [CompileTarget(NAME, label, _cache_key(d, qw, kw, tuning),
                          build=lambda d=d, qw=qw, kw=kw, t=tuning: _compile(d, qw, kw, t))
            for label, d, qw, kw, tuning in _shipped_kernels()]


def shipped_configs() -> dict[str, QKNormConfig]:
    """``{label: config}`` of the kernels of :func:`_shipped_kernels` (``cute-kernels configs``)."""
    return {label: QKNormConfig.for_shape(qw, kw, d, tuning=tuning) for label, d, qw, kw, tuning in _shipped_kernels()}


def _check_same_dtype(q, **others) -> None:
    """``TypeError`` naming the first of ``others`` whose dtype is not q's (tensors only: the tensor checks
    that follow name non-tensors)."""
    for name, t in others.items():
        if isinstance(t, torch.Tensor) and t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; it must match q's dtype "
                            f"{str(q.dtype).replace('torch.', '')}")


def validate_qk_shapes(q, k, q_weight, k_weight, eps, *, cuda: bool = True, one_gpu_tiling: bool = True) -> None:
    """The argument rules that need no data pointer (dtypes, shapes, devices, strides, row width):
    the first half of :func:`validate_qk_args`, and the op's trace-time check under torch.compile.
    ``one_gpu_tiling``: also the one-GPU kernel's register budget for the two row widths
    (:data:`DEFAULT_TUNING`); the tensor-parallel op checks its own kernel's tiling at construction instead."""
    check_eps(eps)
    check_tensor("q", q, dtypes=DTYPES, ndim=2, cuda=cuda, align_bytes=0)
    _check_same_dtype(q, k=k, q_weight=q_weight, k_weight=k_weight)
    check_tensor("k", k, ndim=2, cuda=cuda, align_bytes=0)  # (dtype: _check_same_dtype)
    vec = vec_elems(q.dtype)
    for name, t in (("q", q), ("k", k)):
        if t.shape[1] == 0:
            raise ValueError(f"{name} has 0 columns: q and k must be [N, Q] and [N, K] with Q, K >= 1")
        if t.shape[1] % vec:
            raise ValueError(f"{name} has {t.shape[1]} columns; must be a multiple of {vec} (16-byte vectors)")
        check_tensor(name, t, cuda=cuda, data_pointer=False)  # row strides: 16-byte multiples
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"q and k must have the same number of tokens, got {q.shape[0]} and {k.shape[0]}")
    check_tensor("q_weight", q_weight, shape=(q.shape[1],), cuda=cuda, align_bytes=0)
    check_tensor("k_weight", k_weight, shape=(k.shape[1],), cuda=cuda, align_bytes=0)
    if q.device != k.device or q_weight.device != q.device or k_weight.device != q.device:
        raise ValueError(f"q, k, q_weight, k_weight must be on one device, got {q.device}, {k.device}, "
                         f"{q_weight.device}, {k_weight.device}")
    for name, t in (("q", q), ("k", k)):
        check_distinct_rows(name, t, "an in-place op needs distinct rows")
    if q is k:
        raise ValueError("q and k overlap in memory: an in-place op needs them disjoint")
    check_extent("q", q)  # 32-bit element offsets
    check_extent("k", k)
    if not one_gpu_tiling:
        return
    for name, t in (("q", q), ("k", k)):  # rows too wide for the register budget (int: a symbolic width is
        try:  # specialized here, as the kernel is)
            RowTiling.choose(int(t.shape[1]), vec, DEFAULT_TUNING.target_vecs).validate()
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    QKNormConfig.for_shape(int(q.shape[1]), int(k.shape[1]), q.dtype, tuning=DEFAULT_TUNING)  # both together


def validate_qk_args(q, k, q_weight, k_weight, eps, *, cuda: bool = True, one_gpu_tiling: bool = True) -> None:
    """Shared argument checks of the one-GPU and tensor-parallel ops (raise before any launch):
    :func:`validate_qk_shapes`, then the pointer rules (16-byte alignment, q/k/weights disjoint).

    ``cuda=False`` skips the device check (CPU tests of the other rules); ``one_gpu_tiling``: see
    :func:`validate_qk_shapes`.
    """
    validate_qk_shapes(q, k, q_weight, k_weight, eps, cuda=cuda, one_gpu_tiling=one_gpu_tiling)
    check_tensor("q", q, cuda=cuda)  # alignment of pointer and row stride
    check_tensor("k", k, cuda=cuda)
    check_tensor("q_weight", q_weight, cuda=cuda)
    check_tensor("k_weight", k_weight, cuda=cuda)
    if _overlap(q, k):
        raise ValueError("q and k overlap in memory: an in-place op needs them disjoint")
    if q.shape[0]:
        for wname, w in (("q_weight", q_weight), ("k_weight", k_weight)):
            for name, t in (("q", q), ("k", k)):
                if not _rows_clear(t.data_ptr(), t.shape[0], t.stride(0), t.shape[1], w.data_ptr(), 1, 1, w.numel(),
                                   t.element_size()):
                    raise ValueError(f"{wname} overlaps {name} in memory: {name} is written in place while "
                                     f"{wname} is read; pass a weight that shares no element with q or k")


def _overlap(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether two [N, W] row-strided tensors share an element (see :func:`_rows_clear`)."""
    if q.numel() == 0 or k.numel() == 0:
        return False
    n = q.shape[0]
    return not _rows_clear(q.data_ptr(), n, q.stride(0), q.shape[1], k.data_ptr(), n, k.stride(0), k.shape[1],
                           q.element_size())


def _rows_clear(ap: int, n: int, sa: int, aw: int, bp: int, bn: int, sb: int, bw: int, es: int) -> bool:
    """Whether ``bn`` rows of ``bw`` elements at byte address ``bp`` (row stride ``sb`` elements) share no element
    with ``n`` rows of ``aw`` elements at ``ap`` (row stride ``sa``; elements of ``es`` bytes): their byte spans
    do not meet, or b's rows sit in the gaps between a's rows, at a column offset in ``[aw, sa - bw]`` of a's row
    period (b with a's row stride: q and k as column blocks of one fused qkv buffer; or b one row: a weight
    between two rows).  Other interleavings count as overlapping."""
    a_end, b_end = ap + ((n - 1) * sa + aw) * es, bp + ((bn - 1) * sb + bw) * es
    if a_end <= bp or b_end <= ap:
        return True
    if n <= 1 or (bn > 1 and sb != sa) or (bp - ap) % es:
        return False
    col = ((bp - ap) // es) % sa  # b's first column, relative to a's, within a row of sa elements
    return col >= aw and col + bw <= sa


def check_no_grad(q, k, q_weight, k_weight) -> None:
    """In-place ops without a backward: refuse tensors that require grad where autograd records (grad mode on,
    inference mode off: inside ``torch.inference_mode()`` nothing is recorded, so they are taken there), and
    inference tensors as q / k outside inference mode (torch refuses such in-place updates)."""
    if autograd_records() and (q.requires_grad or k.requires_grad or q_weight.requires_grad
                               or k_weight.requires_grad):
        raise RuntimeError("qk_rmsnorm_ / ParallelQKNorm are in-place and have no backward: call them on tensors "
                           "that do not require grad, or under torch.no_grad()")
    refuse_inference_tensors("qk_rmsnorm_ / ParallelQKNorm", q, k)


def launch_view(t: torch.Tensor) -> torch.Tensor:
    """The kernels are compiled for row strides that are whole 16-byte vectors; a single row may have
    any stride (it is never used), so give it one: the same storage, offset and elements."""
    vec = _VEC[t.dtype]
    if t.shape[0] == 1 and t.stride(0) % vec:
        return t.as_strided(t.shape, (-(-t.shape[1] // vec) * vec, 1))
    return t


_increment_version = torch._C._increment_version  # (torch.autograd.graph.increment_version's core, 0.3 us cheaper)


def bump_versions(q: torch.Tensor, k: torch.Tensor) -> None:
    """The kernel writes through raw pointers: tell autograd that q and k changed (version counters), so
    a graph that saved them for backward raises instead of using the new values."""
    _increment_version((q, k))




def check_eps(eps) -> None:
    """``eps`` must be a real number (not bool, not a string: ``TypeError``), finite in float32 and
    ``>= 0``, and 0 or at least float32's smallest normal 2**-126 (``ValueError``): the kernels take it
    as a float32, where a smaller eps would be flushed to 0."""
    check_f32_eps("eps", eps)


def fast_path_key(q, k, q_weight, k_weight, eps, launch_checks: bool = False) -> tuple | None:
    """Cheap eager-path test of the rules of :func:`validate_qk_args` (which explains failures, rows wider than the
    kernel takes included; all of them here unless ``launch_checks``, see below), that no tensor requires grad while
    grad mode is on and that q and k are no inference tensors outside inference mode (the slow path applies
    :func:`check_no_grad`, which explains both): ``(N, (dtype, Q, K))`` (the token count and the compiled kernel's
    key) if all hold and N > 0, else None. Each tensor attribute is read once (a read costs ~0.05-0.15 us of host
    time; the eager target is 10 us per call).

    ``launch_checks=True`` (:func:`qk_rmsnorm_`, which launches the one-GPU kernel right after): leave out
    the rules that the compiled function's own argument checks apply before it launches (tvm-ffi, in
    compiled code: k's and the weights' dtype, k's token count, the weights' shapes and unit strides,
    q's and k's unit column strides, 16-byte aligned data, and every tensor on
    q's device) or that the kernel's key does (widths that no config takes: :func:`QKNormConfig.for_shape`
    raises in :func:`_compile_key`), so a call that breaks one of them reaches the launch (or the compile)
    and is refused there; the caller then explains it with the slow path's checks
    (:func:`_explain_refused_launch`)."""
    try:
        dt = q.dtype
        vec = _VEC.get(dt)
        if vec is None:
            return None
        (n, qw), (nk, kw) = q.shape, k.shape
        (sq, uq), (sk, uk) = q.stride(), k.stride()
        if not launch_checks:
            if k.dtype is not dt or q_weight.dtype is not dt or k_weight.dtype is not dt:
                return None
            (wq,), (wk,), (uwq,), (uwk,) = q_weight.shape, k_weight.shape, q_weight.stride(), k_weight.stride()
            if wq != qw or wk != kw or uwq != 1 or uwk != 1:
                return None
        if (n == 0 or (sq | sk) % vec or (n > 1 and (sq < qw or sk < kw))
                or (n - 1) * sq + qw > INT32_MAX or (n - 1) * sk + kw > INT32_MAX):
            return None  # (N = 0, a rare legal layout such as N = 1 with an odd stride (the slow path passes a
            # launch view), and every error (overlapping rows, 32-bit extents) take the slow path, which explains)
        if not launch_checks and (nk != n or not 0 < qw <= _MAX_WIDTH_VECS * vec or not 0 < kw <= _MAX_WIDTH_VECS * vec
                                  or (qw | kw) % vec or uq != 1 or uk != 1):
            return None  # (with launch_checks: k's token count, the widths (a key that compiles), the unit column
            # strides and 16-byte alignment are the compiled function's checks, or _compile_key's)
        if _grad_enabled() and (q.requires_grad or k.requires_grad or q_weight.requires_grad
                                or k_weight.requires_grad):
            return None
        if (q.is_inference() or k.is_inference()) and not _inference_mode():
            return None  # (torch refuses in-place updates of inference tensors outside inference mode: the slow path)
        dev = q.get_device()  # -1 on the CPU; _DEVICE_OK holds the CUDA devices checked to be Hopper
        if dev not in _DEVICE_OK:
            return None  # (first call on a device: the slow path checks it is a Hopper GPU)
        if not launch_checks and (k.get_device() != dev or q_weight.get_device() != dev
                                  or k_weight.get_device() != dev):
            return None
        qp, kp, wqp, wkp = q.data_ptr(), k.data_ptr(), q_weight.data_ptr(), k_weight.data_ptr()
        if not (qp and kp and wqp and wkp) or (not launch_checks and (qp | kp | wqp | wkp) % 16):
            return None  # (a pointer of 0, e.g. a storage freed by resize_(0): the slow path refuses it)
        es = 16 // vec
        q_end, k_end = qp + ((n - 1) * sq + qw) * es, kp + ((n - 1) * sk + kw) * es
        if not (q_end <= kp or k_end <= qp or _rows_clear(qp, n, sq, qw, kp, n, sk, kw, es)):
            return None  # q and k overlap
        # a weight inside q's or k's span: the slow path decides (and explains); with launch_checks the
        # weights' lengths are taken to be Q and K here, which the launch then checks
        wq_end, wk_end = wqp + qw * es, wkp + kw * es
        if ((wqp < q_end and qp < wq_end) or (wqp < k_end and kp < wq_end)
                or (wkp < q_end and qp < wk_end) or (wkp < k_end and kp < wk_end)):
            return None
        if (type(eps) is float or type(eps) is int) and (eps == 0 or F32_MIN_NORMAL <= eps <= F32_MAX):  # not bool
            return n, (dt, qw, kw)
        return None
    except (AttributeError, ValueError, TypeError, RuntimeError):  # (RuntimeError: sparse / nested: no strides)
        return None


def _explain_refused_launch(q, k, q_weight, k_weight, eps) -> None:
    """After the compiled function refused arguments that :func:`fast_path_key` let through with
    ``launch_checks``: raise the slow path's error, which says what is wrong (returns if those checks pass:
    the caller re-raises the compiled function's own error)."""
    validate_qk_args(q, k, q_weight, k_weight, eps)
    if q_weight.stride() != (1,) or k_weight.stride() != (1,):
        raise ValueError("q_weight and k_weight must be contiguous")


_grad_enabled = torch.is_grad_enabled
_inference_mode = torch.is_inference_mode_enabled


_VEC = {torch.float16: 8, torch.bfloat16: 8, torch.float32: 4}
_MAX_WIDTH_VECS = _THREAD_CHOICES[0] * _MAX_ROW_VECS  # widest row RowTiling admits, in 16-byte vectors
_launchers: dict[tuple, object] = {}


def _fake_qk_rmsnorm_(q, k, q_weight, k_weight, eps) -> None:
    """Trace-time (torch.compile / make_fx) check: the rules that need no data pointer or device
    query (the op checks the device when it runs), as the other ops' fakes do."""
    validate_qk_shapes(q, k, q_weight, k_weight, eps, cuda=False)


@custom_op("qk_rmsnorm_", mutates_args=("q", "k"), fake=_fake_qk_rmsnorm_,
           precheck=lambda q, k, q_weight, k_weight, eps: check_eps(eps))
def qk_rmsnorm_(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                eps: float) -> None:
    """In-place fused RMSNorm of q and k over their whole rows, one launch (seed 000, G = 1).

    ``q = q * rsqrt(mean(q^2) + eps) * q_weight`` and the same for k, float32 accumulation.

    Args:
        q: CUDA tensor [N, Q], float16/bfloat16/float32, last dim contiguous, any row stride that is
            a multiple of 16 bytes (e.g. a column slice of a fused qkv buffer), 16-byte aligned;
            ``Q`` a multiple of 8 (16-bit types) or 4 (float32), at most 24576 (16-bit) / 12288
            (float32) elements; rows must not overlap (row stride >= Q when N > 1).  One CTA holds a
            token's q and k rows in registers, so a wide pair can be refused even where each width
            alone fits: whether it fits depends on the tiling each part gets (threads and 16-byte
            vectors per thread), not monotonically on the widths (e.g. bf16 Q=24576 fits next to
            K = 8-1272, 1288-1784, 1800-2048 and 2304, not next to K=1280, 1792 or 3072):
            ``QKNormConfig.for_shape(Q, K, dtype, tuning=DEFAULT_TUNING)`` raises the same ValueError.
        k: [N, K], same dtype/device/rules as q, sharing no element with q (column blocks of one
            fused qkv buffer are fine).
        q_weight: [Q], k_weight: [K], same dtype as q, contiguous, 16-byte aligned, sharing no element
            with q or k (``ValueError`` otherwise).
        eps: real number (not bool), finite in float32, >= 0 (standard RMSNorm eps, added to the mean).
            With ``eps = 0`` an all-zero row is 0 * rsqrt(0) = NaN, as in the float64 reference and
            ``torch.nn.functional.rms_norm``.
    Range: the sums of squares are float32, as in ``torch.nn.functional.rms_norm`` on CUDA: a row whose sum
    overflows float32 (an element above ~1.8e19 in magnitude, or a sum above 3.4e38) comes out as zeros,
    ``x * rsqrt(inf) = 0``, where the float64 reference still normalizes it.
    Kernels (:func:`launch_key`, by q + k bytes against the device's L2; all give the same bits): one CTA
    per row tile; for 16-bit q/k of 4096/1024 columns from 1024 tokens up to 60% of L2, a persistent
    kernel; for 16-bit 4096/1024 and 6144/1024 from there (or 30%) to 95% of L2, persistent CTAs staging
    rows in shared memory through bulk copies.  They compile on first use (``cute-kernels compile
    --kernel qknorm`` warms them for the shipped shapes; the persistent ones at the H200's 132 SMs,
    other SM counts compile on their first such call).

    Returns:
        None; q and k are overwritten (their autograd version counters are bumped).
    Raises:
        TypeError: wrong dtypes; eps not a real number.
        ValueError: shapes, devices, strides, alignment, overlapping rows or q/k, a weight overlapping q or k,
            rows too wide;
            eps negative, not finite, or below 2**-126 but not 0 (float32 would flush it to 0).
        RuntimeError: q, k or a weight requires grad while grad mode is on, outside inference mode (no
            backward); q or k an inference tensor while inference mode is off (as torch's in-place ops);
            a tensor on a GPU that is not a Hopper (sm_90) GPU, or a process whose CuTe DSL targets another arch.
    """
    fast = fast_path_key(q, k, q_weight, k_weight, eps, launch_checks=True)
    if fast is None:
        _explain_refused_launch(q, k, q_weight, k_weight, eps)  # raises with the reason
        check_no_grad(q, k, q_weight, k_weight)  # (the fast path admits no tensor that requires grad in grad mode)
        n, key = q.shape[0], (q.dtype, q.shape[1], k.shape[1])
        lq, lk = launch_view(q), launch_view(k)
    else:
        n, key = fast
        lq, lk = q, k  # (the fast path admits only 16-byte row strides, even at N = 1: no launch view needed)
    if n == 0:
        return
    if n >= PERSISTENT_MIN_TOKENS:
        key = _pick_key(n, key, q.get_device())
    try:
        fn = _launchers.get(key)
        if fn is None:
            fn = _launchers[key] = _compile_key(key)
        fn(lq, lk, q_weight, k_weight, float(eps))
    except (ValueError, TypeError, RuntimeError, BufferError):  # refused before the launch (fast_path_key's
        # launch_checks; RuntimeError / BufferError: a tensor tvm-ffi cannot pack, e.g. a meta k beside a CUDA q)
        if fast is not None:
            _explain_refused_launch(q, k, q_weight, k_weight, eps)
        raise
    _increment_version((q, k))  # (bump_versions inlined: this is the eager hot path)


def qk_rmsnorm_reference(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                         eps: float, q_dim: int | None = None, k_dim: int | None = None,
                         q_sumsq: torch.Tensor | None = None, k_sumsq: torch.Tensor | None = None):
    """Out-of-place float64 reference of :func:`qk_rmsnorm_` (seed 000 with the standard eps), returns
    (q_out, k_out) in the input dtype (any device, all tensors on one: ``ValueError`` otherwise)::

        q_out[n] = q[n] * rsqrt(q_sumsq[n] / q_dim + eps) * q_weight,  q_sumsq[n] = sum(q[n]^2)  (k alike)

    ``q_dim``/``k_dim``: the divisor of the sum, an int >= 1 (default: the row width).  ``q_sumsq``/``k_sumsq``:
    per-token sums of squares ``[N]`` (float) to use instead of the local ones (a tensor-parallel reference
    passes the sums over all shards).  ``eps`` follows :func:`check_eps` (``eps = 0``: an all-zero row is NaN,
    ``0 * rsqrt(0)``, as in the kernel and ``F.rms_norm``).  Shapes: ``q [N, Q]``, ``k [N, K]``
    with ``Q, K >= 1``, ``q_weight [Q]``, ``k_weight [K]`` (``ValueError`` otherwise: no silent broadcasting);
    floating point tensors (``TypeError`` otherwise).
    """
    check_float_tensors(q=q, k=k, q_weight=q_weight, k_weight=k_weight)
    check_same_device(q=q, k=k, q_weight=q_weight, k_weight=k_weight, q_sumsq=q_sumsq, k_sumsq=k_sumsq)
    check_eps(eps)
    eps = float(eps)  # (any real number check_eps takes: a Fraction, a numpy float)
    if q.dim() != 2 or k.dim() != 2 or q.shape[0] != k.shape[0] or not (q.shape[1] and k.shape[1]):
        raise ValueError(f"q and k must be [N, Q] and [N, K] with Q, K >= 1, got {list(q.shape)} and {list(k.shape)}")
    if tuple(q_weight.shape) != (q.shape[1],) or tuple(k_weight.shape) != (k.shape[1],):
        raise ValueError(f"q_weight must be [{q.shape[1]}] and k_weight [{k.shape[1]}], got "
                         f"{list(q_weight.shape)} and {list(k_weight.shape)}")
    for name, dim in (("q_dim", q_dim), ("k_dim", k_dim)):
        if dim is not None:
            check_int(name, dim, low=1)
    for name, ss in (("q_sumsq", q_sumsq), ("k_sumsq", k_sumsq)):
        if ss is not None and not isinstance(ss, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(ss).__name__}")
        if ss is not None:
            check_float_tensors(**{name: ss})
            if tuple(ss.shape) != (q.shape[0],):
                raise ValueError(f"{name} must be [N] = [{q.shape[0]}] (one sum per token), got {list(ss.shape)}")

    def one(x, w, dim, ss):
        xd = x.double()
        ss = (xd * xd).sum(-1, keepdim=True) if ss is None else ss.double().reshape(-1, 1)
        return (xd * torch.rsqrt(ss / (dim or x.shape[-1]) + eps) * w.double()).to(x.dtype)

    return one(q, q_weight, q_dim, q_sumsq), one(k, k_weight, k_dim, k_sumsq)


def check() -> list[CheckResult]:
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for (qd, kd), n in (((4096, 1024), 1), ((6144, 1024), 333), ((512, 128), 4097)):
            q = torch.randn(n, qd, device="cuda", dtype=dtype)
            k = torch.randn(n, kd, device="cuda", dtype=dtype)
            wq = torch.randn(qd, device="cuda", dtype=dtype)
            wk = torch.randn(kd, device="cuda", dtype=dtype)
            rq, rk = qk_rmsnorm_reference(q, k, wq, wk, 1e-6)
            qk_rmsnorm_(q, k, wq, wk, 1e-6)
            bar = 8 * (2e-2 if dtype != torch.float32 else 1e-4)
            err = max((q.float() - rq.float()).abs().max().item(), (k.float() - rk.float()).abs().max().item())
            rel = err / max(rq.float().abs().max().item(), rk.float().abs().max().item(), F32_MIN_NORMAL)
            rows.append(CheckResult(NAME, f"{str(dtype)[6:]} Q={qd} K={kd} N={n}", err <= bar, err, rel, bar))
    return rows


def bench_shapes(shapes: str | None) -> None:
    """:func:`bench` takes no ``shapes`` spec: ``ValueError`` unless it is None."""
    from ..registry import no_spec

    no_spec(NAME, shapes, 'N = 1 ... 16384 at Q=4096, K=1024')


def bench(shapes: str | None = None) -> list[dict]:
    """Ours vs torch ``F.rms_norm`` (q, k) and quack ``rmsnorm`` (q, k) at Q=4096, K=1024 bf16, each timing after
    :data:`~cute_kernels.runtime.timing.SETTLE_S` seconds of calls (the board's sustained clock, session 82)."""
    bench_shapes(shapes)
    import torch.nn.functional as F

    from ..runtime.timing import SETTLE_S, copy_bandwidth_gbps, cuda_time_us

    try:
        from quack.rmsnorm import rmsnorm as quack_rmsnorm
    except Exception:  # quack not installed
        quack_rmsnorm = None
    copy_bw = copy_bandwidth_gbps()
    recs = []
    qd, kd, dtype = 4096, 1024, torch.bfloat16
    for n in (1, 8, 64, 512, 4096, 16384):
        q = torch.randn(n, qd, device="cuda", dtype=dtype)
        k = torch.randn(n, kd, device="cuda", dtype=dtype)
        wq = torch.randn(qd, device="cuda", dtype=dtype)
        wk = torch.randn(kd, device="cuda", dtype=dtype)
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        impls = [("cute_kernels", lambda: qk_rmsnorm_(q, k, wq, wk, 1e-6)),
                 ("torch", lambda: (F.rms_norm(q, (qd,), wq, 1e-6), F.rms_norm(k, (kd,), wk, 1e-6)))]
        if quack_rmsnorm is not None:
            impls.append(("quack", lambda: (quack_rmsnorm(q, wq, eps=1e-6), quack_rmsnorm(k, wk, eps=1e-6))))
        for impl, fn in impls:
            for graph in (True, False):
                try:
                    t = cuda_time_us(fn, graph=graph, settle_s=SETTLE_S)  # (each after SETTLE_S s of calls)
                except Exception as exc:  # a peer that cannot be captured
                    recs.append(dict(kernel=NAME, impl=impl, shape=dict(n=n, q=qd, k=kd, dtype="bfloat16"),
                                     mode="graph" if graph else "eager", error=str(exc)[:200]))
                    continue
                gbps = nbytes / t / 1e3
                recs.append(dict(kernel=NAME, impl=impl, shape=dict(n=n, q=qd, k=kd, dtype="bfloat16"),
                                 mode="graph" if graph else "eager", time_us=t, gbps=gbps,
                                 copy_frac=gbps / copy_bw, settle_s=SETTLE_S))
    return recs
