"""Hyper-connection mix statistics + Sinkhorn in one K walk (DeepSeek mHC, seed 001): the torch op
:func:`hc_mix_sinkhorn` and its ``method="walk"`` kernel (the default, ``method="tma"``, is
:mod:`.hc_mix_tma`).

For each row of ``x [M, K]`` (bf16) this computes the manifold-constrained hyper-connection
coefficients (mHC, arXiv 2512.24880; seed ``001_ea94da0ccc866503``), hc_mult = 4:

    a   = x . hc_fn^T                      (24 values, float32-accurate)
    r   = 1 / sqrt(sum(x^2) / K + rms_eps)
    pre  = sigmoid(a[0:4] * r * hc_scale[0] + hc_base[0:4]) + hc_eps
    post = 2 * sigmoid(a[4:8] * r * hc_scale[1] + hc_base[4:8])
    comb = sinkhorn(a[8:24] * r * hc_scale[2] + hc_base[8:24])  (4x4, row-major; the exact
           steps, with hc_eps, are in :func:`hc_mix_sinkhorn`'s docstring)

Design (one kernel, no partials in global memory):

* Row blocks of ``tile_m`` rows; each row block is walked by one thread-block cluster of
  ``CLUSTER_K`` = 8 CTAs, and each CTA by ``WARPS_K`` = 4 warps per 16/32-row warp tile.  K is cut
  into chunks of 32 columns; the 32 "K parts" (CTA rank x warp) take chunks round-robin
  (part p walks chunks p, p + 32, p + 64, ... in order).
* Tensor cores: warp-level ``mma.sync.m16n8k16`` bf16 -> f32 (``cute.nvgpu.warp.MmaF16BF16Op``),
  x as the A operand (exact in bf16), hc_fn as three bf16 pieces hi + mid + lo (hi = rn(w),
  mid = rn(w - hi), lo = rn(w - hi - mid); the differences are exact, the representation error is
  <= 2^-27 |w| for 2^-110 <= |w| <= 3.39e38, bf16's largest finite value; smaller weights are within
  2^-134 absolute, half of bf16's subnormal step; larger ones round hi to inf, so NaN); per 16-column
  step the pieces are issued lo, mid, hi; 24 outputs = three n8 tiles.
  The pieces are split in registers from the fp32 hc_fn (:func:`_split3_bf16x2`); the same split,
  made in shared memory by the TMA walk's split warps, feeds :mod:`.hc_mix_tma`.
* The sum of squares is a Gram MMA: x . x^T of the warp's 16 rows with B = the lane's own A
  registers; its diagonal is sum x^2 (exact bf16 products, fp32 accumulation).
* Each chunk is accumulated into fresh registers (2 k16 steps x 3 pieces) and its value is added
  to the part's running sums with an fp32 add: tensor-core accumulation truncates, and a running
  accumulator over all of K measured 2e-6 (norm-wise) against float64; per-chunk sums give ~2e-7.
* Loads: a per-thread cp.async ring ``stages`` deep in shared memory (each lane copies and later
  reads back its own 16-byte vectors, so no barriers are needed): lane (g, t) of a warp loads
  x[row, 32c + 8t : +8] for rows g and g + 8 of each m16 tile (``.cg``: x is streamed once) and the
  hc_fn vectors of columns n = 8j + g (``.ca``: hc_fn is re-read by every cluster, from L2).  The k
  order inside a chunk is permuted identically for A and B (physical k = 8t + 4s + {0..3} feeds mma
  step s, logical k {2t, 2t+1, 2t+8, 2t+9}), so fragments need no shuffles.
* Partials of the 32 parts go to shared memory; after a cluster barrier, CTA rank r reduces rows
  ``r, r + 8, ...`` of the block by reading all 8 CTAs' partials through distributed shared memory
  (``ld.shared::cluster``) and runs the epilogue (sigmoids + Sinkhorn) one thread per row.

Measured on the H200 (two runs of 2026-11-29; K = 20480, us per call in a CUDA graph, the shipped configs:
SMALL up to M = 256, MEDIUM above; this kernel / a split-K Triton baseline / the torch float32 reference):
M = 1: 12.6 / 12.0 / 206;
16: 12.8 / 13.2 / 232; 128: 13.0 / 16.5 / 288; 512: 23.6 / 28.5 / 351; 1024: 39.3 / 57.0 / 439; 2048:
61.4 / 101 / 604; 4096: 104.7 / 176 / 919 (1603 GB/s, 39% of the 4.2 TB/s copy rate); 16384: 377 / 653 /
2855.  Error of ``a`` against float64 1.6e-7 .. 2.0e-7 norm-wise; pre/post/comb <= 5.4e-7 absolute.

Why it is not the default: every thread streams its own cp.async ring, so bytes in flight per SM are limited
by registers and occupancy (the walk is latency-bound, not bandwidth-bound), and each 32-row cluster re-reads
all of hc_fn (2 MB fp32) from L2 (128 clusters at M = 4096: 256 MB of L2 reads for 168 MB of x).  The
redesign (one TMA producer warp, 128/256-row x tiles, ``wgmma m64n72k16`` with the pieces as B, squares from
16-byte smem reads) is :mod:`.hc_mix_tma`, ``method="tma"``: 48.3 us at M = 4096, 9.1-9.4 us at M <= 128,
faster than this kernel at every M measured (its docstring has the figures and what limits it).  Its bits
differ from this kernel's, so the two are separate methods of the op, not a switch on M.

Reduction order (bitwise determinism and batch invariance): a chunk's value is the MMA chain
step 0 (lo, mid, hi) then step 1 (lo, mid, hi) from zero; part p's partial is ``0 + V[p] +
V[p + 32] + ...`` (fp32 adds in chunk order); the 32 partials are summed as
``((0 + P[0,0]) + P[0,1]) + ... + P[7,3]`` (CTA rank major, warp minor).
None of this depends on M, ``tile_m`` or which rows share a tile (rows are independent in the
MMA), so a row's bits are the same for every M, config and run.  The split is the
same for every M (small M is latency-bound and gets its parallelism from the same 32-way split).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32

from ..registry import CheckResult, CompileTarget
from ..runtime.cache import compile_cached
from ..runtime.fake import fake_stream, fake_tensor
from ..runtime.torch_op import custom_op, register_flops, without_autocast
from ..runtime.validate import (ValidatedConfig, INT32_MAX, aligned_data, check_config_fields, check_f32_eps,
                                check_float_tensors, check_int, check_same_device, check_distinct_rows, check_extent,
                                check_tensor, element_span, validated_once)

NAME = "hc_mix"
MAX_ROWS = 65535 * 16  # rows of x: 65535 row blocks of 16 (the grid's y limit)
HC = 4  # hc_mult
N_MIX = 2 * HC + HC * HC  # 24 mix values per row
N_TILES = N_MIX // 8  # three n8 MMA tiles
K_CHUNK = 32  # columns per warp step: 4 lanes x 8 bf16 (16 bytes)
CLUSTER_K = 8  # CTAs per row block (cluster), fixed: part of the reduction order
WARPS_K = 4  # warps per row tile splitting K, fixed: part of the reduction order
K_PARTS = CLUSTER_K * WARPS_K
N_PIECES = 3  # hc_fn = hi + mid + lo (bf16)
SP_COLS = N_MIX + 1  # 24 mix partials + sum of squares
K_ALIGN = 64
MAX_K = (INT32_MAX // N_MIX) // K_ALIGN * K_ALIGN  # hc_fn [24, K] spans < 2**31 elements
SMEM_LIMIT = 227 * 1024  # opt-in shared memory per CTA on sm_90


@dataclass(frozen=True)
class HcMixConfig(ValidatedConfig):
    """Row tile of one cluster: ``warps_m`` warp rows of ``16 * m_tiles`` rows (x WARPS_K warps).

    ``store_mix`` additionally writes the raw ``[a (24), sum x^2]`` per row (tests, debugging; the launch sets it
    from the ``mix`` buffer, replacing a caller's value).
    """

    m_tiles: int = 2
    warps_m: int = 2
    stages: int = 4
    store_mix: bool = False

    @property
    def tile_m(self) -> int:
        return 16 * self.m_tiles * self.warps_m

    @property
    def threads(self) -> int:
        return 32 * WARPS_K * self.warps_m

    def validate(self) -> None:
        check_config_fields(self)  # (exact ints and bools, as every kernel config)
        if self.m_tiles not in (1, 2):
            raise ValueError(f"m_tiles={self.m_tiles}: must be 1 or 2 (m16 tiles per warp)")
        if self.warps_m not in (1, 2, 4):
            raise ValueError(f"warps_m={self.warps_m}: must be 1, 2 or 4")
        if self.stages not in (2, 3, 4, 6, 8):
            raise ValueError(f"stages={self.stages}: must be 2, 3, 4, 6 or 8 (cp.async ring depth)")
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"{self}: needs {self.smem_bytes} B of shared memory (> {SMEM_LIMIT})")

    @property
    def w_slots(self) -> int:
        """16-byte hc_fn vectors per thread and chunk: 3 n8 tiles x 2 fp32 vectors."""
        return N_TILES * 2

    @property
    def smem_bytes(self) -> int:
        """cp.async ring (x + hc_fn vectors per thread and stage) + partials + row totals."""
        ring = self.threads * self.stages * 16 * (2 * self.m_tiles + self.w_slots)
        return ring + 4 * SP_COLS * (WARPS_K * self.tile_m + self.tile_m // CLUSTER_K) + 512


# M -> config; any choice gives the same bits (see the module docstring).  us per call in a CUDA
# graph at K = 20480 on the H200 (bench/hc_mix_sweep.py, 2026-11-29 session 2,
# bench/results/2026-11-29_h200_hc_mix_sweep_s2.jsonl):
SMALL = HcMixConfig(m_tiles=1, warps_m=1, stages=8)  # 16 rows per cluster: 13.0 (M=128)
MEDIUM = HcMixConfig(m_tiles=2, warps_m=1, stages=4)  # 32 rows: 23.6 (512), 39.3 (1024), 61.4 (2048),
#                                                       104.7 (4096), 377 (16384)
LARGE = HcMixConfig(m_tiles=2, warps_m=2, stages=4)  # 64 rows: 47.2 (1024), 69.8 (2048), 116 (4096), 404
SHIPPED = (SMALL, MEDIUM, LARGE)
# Alternatives GPU-timed in the same sweep, none faster than these by more than the run-to-run noise
# (best at M=4096: 111 and 113 us), and removed in session 4: hc_fn pre-split into bf16 pieces on the
# host (~60% fewer instructions per chunk in SASS, but 1.5x the hc_fn bytes) and shallower rings.


def config_for(m: int, store_mix: bool = False) -> HcMixConfig:
    """The config used for ``m`` rows (an int >= 0; ``TypeError`` / ``ValueError`` otherwise): 16-row
    clusters up to 256 rows (more clusters to fill the GPU), 32-row clusters above (every config gives
    the same bits)."""
    check_int("m", m, low=0)
    cfg = SMALL if m <= 256 else MEDIUM  # LARGE measured slower than MEDIUM at every M >= 1024
    if store_mix:
        cfg = dataclasses.replace(cfg, store_mix=True)
    return cfg


@cute.jit
def _ld_dsmem_f32(ptr: cute.Pointer, cta_rank: Int32) -> Float32:
    """Load one float32 from the same shared-memory offset in CTA ``cta_rank`` of the cluster."""
    remote = cute.arch.map_dsmem_ptr(ptr, cta_rank)
    addr = Int32(remote.toint())
    return cute.arch.inline_ptx(
        "ld.shared::cluster.f32 {$w0}, [{$r0}];",
        write_only_types=[Float32],
        read_only_args=[addr],
    )


@cute.jit
def _split3_bf16x2(w0: Float32, w1: Float32):
    """Packed bf16x2 pieces (lo, mid, hi) of the pair (w0, w1): hi = rn(w), mid = rn(w - hi),
    lo = rn(w - hi - mid); both differences are exact, so w = hi + mid + lo + O(2^-27 |w|) (for
    2^-110 <= |w| <= bf16's largest finite value: the module docstring gives the edges)."""
    # inputs are copied first and outputs written last: "=r" outputs may share input registers
    return cute.arch.inline_ptx(
        "{\n\t.reg .b32 q0, q1, p0, p1, h, md;\n\t"
        "mov.b32 p0, {$r0};\n\t"
        "mov.b32 p1, {$r1};\n\t"
        "cvt.rn.bf16x2.f32 h, p1, p0;\n\t"
        "shl.b32 q0, h, 16;\n\t"
        "and.b32 q1, h, -65536;\n\t"
        "sub.f32 p0, p0, q0;\n\t"
        "sub.f32 p1, p1, q1;\n\t"
        "cvt.rn.bf16x2.f32 md, p1, p0;\n\t"
        "shl.b32 q0, md, 16;\n\t"
        "and.b32 q1, md, -65536;\n\t"
        "sub.f32 p0, p0, q0;\n\t"
        "sub.f32 p1, p1, q1;\n\t"
        "cvt.rn.bf16x2.f32 {$w0}, p1, p0;\n\t"
        "mov.b32 {$w1}, md;\n\t"
        "mov.b32 {$w2}, h;\n\t}\n",
        write_only_types=[Int32, Int32, Int32],
        read_only_args=[w0, w1],
    )


class EpilogueArgs(NamedTuple):
    """What the per-row epilogue (:func:`row_epilogue`) writes and reads besides the row's sums; both hc_mix
    kernels pass it (the TMA kernels as launch arguments, spread)."""

    mScale: Any  # [3] float32: hc_scale
    mBase: Any  # [24] float32: hc_base
    mPre: Any  # [M, 4] float32
    mPost: Any  # [M, 4] float32
    mComb: Any  # [M, 16] float32
    mMix: Any  # [M, 25] float32 raw sums (written only with store_mix; else a dummy row)
    sinkhorn_iters: Any
    rms_eps: Any
    hc_eps: Any


@cute.jit
def _sigmoid(z: Float32):
    return cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-z))


@cute.jit
def row_epilogue(sSums: cute.Tensor, rr: Int32, row: Int32, k: Int32, epi, store_mix: cutlass.Constexpr):
    """One thread's row ``row`` from its sums ``sSums[rr, :]`` (24 of x . hc_fn^T, then sum x^2; ``epi``:
    :class:`EpilogueArgs`): r = 1/sqrt(mean x^2 + rms_eps), pre = sigmoid + hc_eps, post = 2 sigmoid, comb =
    row softmax + hc_eps then Sinkhorn (seed 001; float32)."""
    if cutlass.const_expr(store_mix):
        for c in cutlass.range_constexpr(SP_COLS):
            epi.mMix[row, c] = sSums[rr, c]
    # reciprocals by rcp.approx / rsqrt, no IEEE division: each division or 1 / sqrt took a slow-path
    # branch in this latency chain (H200, session 19: 0.5-0.6 us less per call at every M; errors
    # against float64 unchanged, <= 4e-7)
    sq = sSums[rr, N_MIX]
    r = cute.math.rsqrt(sq * cute.arch.rcp_approx(Float32(k)) + epi.rms_eps)
    s0 = epi.mScale[0] * r
    s1 = epi.mScale[1] * r
    s2 = epi.mScale[2] * r
    hc_eps = epi.hc_eps
    for i in cutlass.range_constexpr(HC):
        epi.mPre[row, i] = _sigmoid(sSums[rr, i] * s0 + epi.mBase[i]) + hc_eps
    for i in cutlass.range_constexpr(HC):
        epi.mPost[row, i] = Float32(2.0) * _sigmoid(sSums[rr, HC + i] * s1 + epi.mBase[HC + i])
    rM = cute.make_rmem_tensor(cute.make_layout(HC * HC), Float32)
    for i in cutlass.range_constexpr(HC * HC):
        rM[i] = sSums[rr, 2 * HC + i] * s2 + epi.mBase[2 * HC + i]
    # softmax over each row, + eps
    for i in cutlass.range_constexpr(HC):
        mx = rM[i * HC]
        for j in cutlass.range_constexpr(1, HC):
            mx = cute.arch.fmax(mx, rM[i * HC + j])
        ssum = Float32(0.0)
        for j in cutlass.range_constexpr(HC):
            e = cute.math.exp(rM[i * HC + j] - mx)
            rM[i * HC + j] = e
            ssum = ssum + e
        inv = cute.arch.rcp_approx(ssum)
        for j in cutlass.range_constexpr(HC):
            rM[i * HC + j] = rM[i * HC + j] * inv + hc_eps
    _normalize_cols(rM, hc_eps)
    for _ in cutlass.range(epi.sinkhorn_iters - 1, unroll=1):
        _normalize_rows(rM, hc_eps)
        _normalize_cols(rM, hc_eps)
    for i in cutlass.range_constexpr(HC * HC):
        epi.mComb[row, i] = rM[i]


@cute.jit
def _normalize_rows(rM: cute.Tensor, hc_eps: Float32):
    """Sinkhorn's row step on the 4 x 4 ``rM`` (row-major): each row divided by its sum + hc_eps."""
    for i in cutlass.range_constexpr(HC):
        ssum = rM[i * HC]
        for j in cutlass.range_constexpr(1, HC):
            ssum = ssum + rM[i * HC + j]
        inv = cute.arch.rcp_approx(ssum + hc_eps)
        for j in cutlass.range_constexpr(HC):
            rM[i * HC + j] = rM[i * HC + j] * inv


@cute.jit
def _normalize_cols(rM: cute.Tensor, hc_eps: Float32):
    """Sinkhorn's column step: each column divided by its sum + hc_eps."""
    for j in cutlass.range_constexpr(HC):
        ssum = rM[j]
        for i in cutlass.range_constexpr(1, HC):
            ssum = ssum + rM[i * HC + j]
        inv = cute.arch.rcp_approx(ssum + hc_eps)
        for i in cutlass.range_constexpr(HC):
            rM[i * HC + j] = rM[i * HC + j] * inv


class HcMixKernel:
    """mHC mix statistics (x . hc_fn^T, sum x^2) + sigmoids + Sinkhorn, one cluster per row block."""

    def __init__(self, config: HcMixConfig):
        self.config = config
        self.m_tiles = config.m_tiles
        self.warps_m = config.warps_m
        self.stages = config.stages
        self.tile_m = config.tile_m
        self.threads = config.threads
        self.rows_per_rank = self.tile_m // CLUSTER_K
        self.x_slots = 2 * self.m_tiles  # 16-byte x vectors per thread per chunk
        self.w_slots = config.w_slots  # 16-byte hc_fn vectors per thread per chunk
        self.w_dtype = Float32
        self.w_vec = 4  # float32 per 16-byte vector

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mScale: cute.Tensor, mBase: cute.Tensor,
                 mPre: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor, mMix: cute.Tensor,
                 sinkhorn_iters: Int32, rms_eps: Float32, hc_eps: Float32, stream):
        m = mX.shape[0]
        grid_m = (m + self.tile_m - 1) // self.tile_m
        mma_op = cute.nvgpu.warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16))
        tiled_mma = cute.make_tiled_mma(mma_op)
        self.kernel(mX, mW, mScale, mBase, mPre, mPost, mComb, mMix, sinkhorn_iters, rms_eps,
                    hc_eps, tiled_mma).launch(
            grid=[CLUSTER_K, grid_m, 1], block=[self.threads, 1, 1], cluster=[CLUSTER_K, 1, 1],
            stream=stream)

    # ------------------------------------------------------------------ kernel
    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mScale: cute.Tensor, mBase: cute.Tensor,
               mPre: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor, mMix: cute.Tensor,
               sinkhorn_iters: Int32, rms_eps: Float32, hc_eps: Float32, tiled_mma: cute.TiledMma):
        tidx, _, _ = cute.arch.thread_idx()
        rank, m_block, _ = cute.arch.block_idx()  # cluster = (CLUSTER_K, 1, 1): rank in cluster
        warp = tidx // 32
        lane = tidx % 32
        wk = warp % WARPS_K
        wm = warp // WARPS_K

        smem = cutlass.memory.SmemAllocator()
        # per-thread cp.async ring: (16-byte vector, thread, slot, stage)
        sX = smem.allocate_tensor(
            BFloat16, cute.make_layout((8, self.threads, self.x_slots, self.stages),
                                       stride=(1, 8, 8 * self.threads, 8 * self.threads * self.x_slots)),
            byte_alignment=128)
        v = self.w_vec
        sW = smem.allocate_tensor(
            self.w_dtype, cute.make_layout((v, self.threads, self.w_slots, self.stages),
                                           stride=(1, v, v * self.threads, v * self.threads * self.w_slots)),
            byte_alignment=128)
        # partials of the WARPS_K warps of this CTA: (warp k, row in tile, 24 mix + sq)
        sP = smem.allocate_tensor(
            Float32, cute.make_layout((WARPS_K, self.tile_m, SP_COLS),
                                      stride=(self.tile_m * SP_COLS, SP_COLS, 1)), byte_alignment=16)
        # totals of the rows this CTA finishes
        sA = smem.allocate_tensor(
            Float32, cute.make_layout((self.rows_per_rank, SP_COLS), stride=(SP_COLS, 1)),
            byte_alignment=16)

        row_base = m_block * self.tile_m + wm * (16 * self.m_tiles)
        part = rank * WARPS_K + wk
        rR, rSq = self.mma_walk(mX, mW, sX, sW, tiled_mma, row_base, part, tidx)
        self.store_partials(sP, rR, rSq, wk, wm, lane)

        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        self.cluster_reduce(sP, sA, rank, tidx)
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

        if tidx < self.rows_per_rank:
            row = m_block * self.tile_m + tidx * CLUSTER_K + rank
            if row < mX.shape[0]:
                row_epilogue(sA, tidx, row, mX.shape[1], EpilogueArgs(mScale, mBase, mPre, mPost, mComb, mMix,
                                                                      sinkhorn_iters, rms_eps, hc_eps),
                             self.config.store_mix)

    # ------------------------------------------------------------------ roles
    @cute.jit
    def load_chunk(self, mXv: cute.Tensor, mWv: cute.Tensor, sX: cute.Tensor, sW: cute.Tensor,
                   chunk: Int32, stage: Int32, row_base: Int32, tidx: Int32, m: Int32):
        """cp.async of chunk ``chunk`` (32 columns) into ring stage ``stage`` (this thread's slots).

        x rows past M are not loaded (their stale values only reach their own, discarded, rows).
        """
        lane = tidx % 32
        g = lane // 4
        t = lane % 4
        atom_x = cute.make_copy_atom(
            cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.cpasync.LoadCacheMode.GLOBAL),
            BFloat16, num_bits_per_copy=128)
        atom_w = cute.make_copy_atom(
            cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.cpasync.LoadCacheMode.ALWAYS),
            self.w_dtype, num_bits_per_copy=128)
        for mt in cutlass.range_constexpr(self.m_tiles):
            for h in cutlass.range_constexpr(2):
                row = row_base + mt * 16 + h * 8 + g
                if row < m:
                    cute.copy(atom_x, mXv[(0, None), (row, chunk * 4 + t)],
                              sX[None, tidx, mt * 2 + h, stage])
        for j in cutlass.range_constexpr(N_TILES):
            for h in cutlass.range_constexpr(2):
                cute.copy(atom_w, mWv[(0, None), (j * 8 + g, chunk * 8 + t * 2 + h)],
                          sW[None, tidx, j * 2 + h, stage])

    @cute.jit
    def mma_chunk(self, tiled_mma: cute.TiledMma, rX, rW, rV, rG, rA, rB, rPk):
        """One chunk into fresh accumulators: hc_fn split to bf16 pieces, 2 k16 steps x (lo, mid,
        hi) x 3 n8 tiles, plus the Gram diagonal x.x^T (B = the lane's own A registers)."""
        for j in cutlass.range_constexpr(N_TILES):
            for s in cutlass.range_constexpr(2):
                for q in cutlass.range_constexpr(2):
                    lo, mid, hi = _split3_bf16x2(rW[j * 2 + s][2 * q], rW[j * 2 + s][2 * q + 1])
                    rPk[((j * 2 + s) * 2 + q) * N_PIECES + 0] = lo
                    rPk[((j * 2 + s) * 2 + q) * N_PIECES + 1] = mid
                    rPk[((j * 2 + s) * 2 + q) * N_PIECES + 2] = hi
        # fresh accumulators per chunk (in place: cute.gemm with d != c writes c in DSL 4.8.1)
        for acc in rV:
            acc.fill(0.0)
        for acc in rG:
            acc.fill(0.0)
        rBi = cute.recast_tensor(rB, Int32)
        for s in cutlass.range_constexpr(2):
            # A regs: a0 = row g, k 4s..4s+1; a1 = row g+8; a2 = row g, k 4s+2..4s+3; a3 = row g+8
            for mt in cutlass.range_constexpr(self.m_tiles):
                rAi = cute.recast_tensor(rA[mt], Int32)
                for kk in cutlass.range_constexpr(2):
                    for h in cutlass.range_constexpr(2):
                        rAi[kk * 2 + h] = cute.recast_tensor(rX[mt * 2 + h], Int32)[2 * s + kk]
            for p in cutlass.range_constexpr(N_PIECES):
                for j in cutlass.range_constexpr(N_TILES):
                    for q in cutlass.range_constexpr(2):
                        rBi[q] = rPk[((j * 2 + s) * 2 + q) * N_PIECES + p]
                    for mt in cutlass.range_constexpr(self.m_tiles):
                        acc = rV[mt * N_TILES + j]
                        cute.gemm(tiled_mma, acc, rA[mt], rB, acc)
            # Gram: B of n tile h = the lane's row g (+8h) registers of A
            for mt in cutlass.range_constexpr(self.m_tiles):
                rAi = cute.recast_tensor(rA[mt], Int32)
                for h in cutlass.range_constexpr(2):
                    rBi[0] = rAi[h]
                    rBi[1] = rAi[2 + h]
                    acc = rG[mt * 2 + h]
                    cute.gemm(tiled_mma, acc, rA[mt], rB, acc)

    @cute.jit
    def mma_walk(self, mX: cute.Tensor, mW: cute.Tensor, sX: cute.Tensor, sW: cute.Tensor,
                 tiled_mma: cute.TiledMma, row_base: Int32, part: Int32, tidx: Int32):
        """Walk this warp's K part (chunks part, part + 32, ...): cp.async ring ``stages`` deep,
        each chunk into fresh accumulators, chunk values added to the running sums (fp32 adds)."""
        lane = tidx % 32
        g = lane // 4
        mXv = cute.zipped_divide(mX, (1, 8))  # ((1, 8), (M, K / 8)): 16-byte vectors
        mWv = cute.zipped_divide(mW, (1, self.w_vec))  # ((1, 4), (24, K / 4))
        m = mX.shape[0]
        n_chunks = mX.shape[1] // K_CHUNK
        n_my = (n_chunks + (K_PARTS - 1) - part) // K_PARTS  # chunks of this part

        thr_mma = tiled_mma.get_slice(lane)
        frag_a_shape = thr_mma.partition_shape_A((16, 16))
        frag_b_shape = thr_mma.partition_shape_B((8, 16))
        frag_c_shape = thr_mma.partition_shape_C((16, 8))
        rR = [tiled_mma.make_fragment_C(frag_c_shape) for _ in range(self.m_tiles * N_TILES)]
        rV = [tiled_mma.make_fragment_C(frag_c_shape) for _ in range(self.m_tiles * N_TILES)]
        rG = [tiled_mma.make_fragment_C(frag_c_shape) for _ in range(self.m_tiles * 2)]
        for c in rR:
            c.fill(0.0)
        rA = [tiled_mma.make_fragment_A(frag_a_shape) for _ in range(self.m_tiles)]
        rB = tiled_mma.make_fragment_B(frag_b_shape)
        rSq = cute.make_rmem_tensor(cute.make_layout(self.m_tiles * 2), Float32)
        rSq.fill(0.0)
        rPk = cute.make_rmem_tensor(cute.make_layout(N_TILES * 2 * 2 * N_PIECES), Int32)
        rX = [cute.make_rmem_tensor(cute.make_layout(8), BFloat16) for _ in range(self.x_slots)]
        rW = [cute.make_rmem_tensor(cute.make_layout(self.w_vec), self.w_dtype) for _ in range(self.w_slots)]
        atom_sx = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        atom_sw = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.w_dtype, num_bits_per_copy=128)

        for st in cutlass.range_constexpr(self.stages - 1):
            if st < n_my:
                self.load_chunk(mXv, mWv, sX, sW, part + st * K_PARTS, st, row_base, tidx, m)
            cute.arch.cp_async_commit_group()
        for i in cutlass.range(n_my, unroll=1):
            cute.arch.cp_async_wait_group(self.stages - 2)
            st = i % self.stages
            for q in cutlass.range_constexpr(self.x_slots):
                cute.copy(atom_sx, sX[None, tidx, q, st], rX[q])
            for q in cutlass.range_constexpr(self.w_slots):
                cute.copy(atom_sw, sW[None, tidx, q, st], rW[q])
            self.mma_chunk(tiled_mma, rX, rW, rV, rG, rA, rB, rPk)
            for c in cutlass.range_constexpr(self.m_tiles * N_TILES):
                for v in cutlass.range_constexpr(4):
                    rR[c][v] = rR[c][v] + rV[c][v]
            # Gram diagonal: (row g, g) sits in value g % 2 of tile 0 and (g+8, g+8) in value
            # 2 + g % 2 of tile 1, both on lane t = g // 2 (other lanes add unused values)
            for mt in cutlass.range_constexpr(self.m_tiles):
                for h in cutlass.range_constexpr(2):
                    d = rG[mt * 2 + h][2 * h]
                    if g % 2 == 1:
                        d = rG[mt * 2 + h][2 * h + 1]
                    rSq[mt * 2 + h] = rSq[mt * 2 + h] + d
            nxt = i + (self.stages - 1)
            if nxt < n_my:
                self.load_chunk(mXv, mWv, sX, sW, part + nxt * K_PARTS, nxt % self.stages, row_base,
                                tidx, m)
            cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        return rR, rSq

    @cute.jit
    def store_partials(self, sP: cute.Tensor, rR, rSq: cute.Tensor, wk: Int32, wm: Int32, lane: Int32):
        g = lane // 4
        t = lane % 4
        for mt in cutlass.range_constexpr(self.m_tiles):
            for j in cutlass.range_constexpr(N_TILES):
                c = rR[mt * N_TILES + j]
                for v in cutlass.range_constexpr(4):
                    row = wm * (16 * self.m_tiles) + mt * 16 + (v // 2) * 8 + g
                    sP[wk, row, j * 8 + 2 * t + v % 2] = c[v]
            if t == g // 2:
                for h in cutlass.range_constexpr(2):
                    sP[wk, wm * (16 * self.m_tiles) + mt * 16 + h * 8 + g, N_MIX] = rSq[mt * 2 + h]

    @cute.jit
    def cluster_reduce(self, sP: cute.Tensor, sA: cute.Tensor, rank: Int32, tidx: Int32):
        """Rows rank, rank + 8, ... of the tile: sum the 32 partials in (CTA rank, warp) order."""
        n_items = self.rows_per_rank * SP_COLS
        for i in cutlass.range_constexpr((n_items + self.threads - 1) // self.threads):
            item = tidx + i * self.threads
            if item < n_items:
                rr = item // SP_COLS
                col = item % SP_COLS
                row = rr * CLUSTER_K + rank
                vals = []
                for src in cutlass.range_constexpr(CLUSTER_K):
                    for w in cutlass.range_constexpr(WARPS_K):
                        ptr = sP.iterator + (w * self.tile_m * SP_COLS + row * SP_COLS + col)
                        vals.append(_ld_dsmem_f32(ptr, Int32(src)))
                total = Float32(0.0)
                for v in vals:
                    total = total + v
                sA[rr, col] = total


# ---------------------------------------------------------------------- compile + torch glue
def fake_launch_args() -> tuple:
    """Compile-time stand-ins for the launch arguments, shared by both hc_mix kernels: x, hc_fn, scale, base,
    pre, post, comb, mix, sinkhorn_iters, rms_eps, hc_eps, stream."""
    m = cute.sym_int()
    k = cute.sym_int(divisibility=K_ALIGN)
    mm = cute.sym_int()
    x_ld = cute.sym_int(divisibility=8)  # row strides: 16-byte multiples (checked on the host)
    w_ld = cute.sym_int(divisibility=4)
    # explicit row-major strides (a compact fake tensor without strides is column-major)
    return (
        fake_tensor(torch.bfloat16, (m, k), stride=(x_ld, 1)),
        fake_tensor(torch.float32, (N_MIX, k), stride=(w_ld, 1)),
        fake_tensor(torch.float32, (3,), align=4),
        fake_tensor(torch.float32, (N_MIX,), align=4),
        fake_tensor(torch.float32, (m, HC), stride=(HC, 1)),
        fake_tensor(torch.float32, (m, HC), stride=(HC, 1)),
        fake_tensor(torch.float32, (m, HC * HC), stride=(HC * HC, 1)),
        fake_tensor(torch.float32, (mm, SP_COLS), stride=(SP_COLS, 1), align=4),
        Int32(20), Float32(1e-6), Float32(1e-6), fake_stream())


def _compile(config: HcMixConfig):
    return compile_cached(NAME, config, lambda: (HcMixKernel(config), fake_launch_args()))


def compile_targets() -> list[CompileTarget]:
    """The configs ``method="tma"`` (the default) picks (hc_mix_tma.config_for), first, then the walk's shipped
    configs, so ``cute-kernels compile --kernel hc_mix`` prebuilds both methods."""
    from . import hc_mix_tma

    tma = {hc_mix_tma.config_for(m) for m in hc_mix_tma.LEVEL_EXAMPLE_M}
    return ([CompileTarget(hc_mix_tma.NAME, f"method=tma tile_m={c.tile_m} {c}", c,
                           build=lambda c=c: hc_mix_tma._compile(c)) for c in sorted(tma, key=str)]
            + [CompileTarget(NAME, f"method=walk tile_m={c.tile_m} {c}", c, build=lambda c=c: _compile(c))
               for c in SHIPPED])


def shipped_configs() -> dict:
    """``{label: config}`` (``cute-kernels configs``): the walk's :data:`SHIPPED` configs, then the six that
    ``method="tma"`` (the default) picks, one per CTA level, labelled by an M that gets it and the M range
    that gets the same pick (other M: ``hc_mix_tma.config_for``)."""
    from . import hc_mix_tma

    out = {"method=walk M<=256": SMALL, "method=walk M>256": MEDIUM,
           "method=walk LARGE (never picked: slower)": LARGE}
    for m in hc_mix_tma.LEVEL_EXAMPLE_M:
        lo, hi = hc_mix_tma.level_range(m)
        out[f"method=tma (default) M={m} (the same pick for M {lo}-{hi}; other M: config_for)"] = \
            hc_mix_tma.config_for(m)
    return out


def _check_scalars(sinkhorn_iters, rms_eps, hc_eps) -> None:
    """``sinkhorn_iters`` an int (not bool / float) in [1, 2**31 - 1] (the kernel's Int32 loop count);
    ``rms_eps`` and ``hc_eps`` real numbers (not bool / str), finite in float32, >= 0, and 0 or at least
    float32's smallest normal 2**-126 (the kernels take them as float32).
    ``TypeError`` for a wrong type, ``ValueError`` for a bad value, each naming the argument."""
    check_int("sinkhorn_iters", sinkhorn_iters, low=1)
    check_f32_eps("rms_eps", rms_eps)
    check_f32_eps("hc_eps", hc_eps)


def _check_k(name: str, k: int) -> None:
    """K (``name``: where it was read) a positive multiple of :data:`K_ALIGN` and at most :data:`MAX_K`
    (``ValueError``)."""
    if k % K_ALIGN or k == 0:
        raise ValueError(f"{name}={k} must be a positive multiple of {K_ALIGN}")
    if k > MAX_K:
        raise ValueError(f"{name}={k}: at most {MAX_K} (both kernels take hc_fn's sizes and strides as 32-bit "
                         f"integers and index it with 32-bit offsets: hc_fn [{N_MIX}, K] must span fewer than 2**31 "
                         "elements)")


def _validate(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps=1e-6, hc_eps=1e-6, cuda: bool = True,
              pointers: bool = True):
    """Every argument rule; ``pointers=False`` skips the data-pointer alignment checks (fake tensors at
    trace time have no data pointers; the strides are checked)."""
    _check_scalars(sinkhorn_iters, rms_eps, hc_eps)
    check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2, cuda=cuda, align_bytes=0)
    k = x.shape[1]
    _check_k("x.shape[1]", k)
    check_tensor("x", x, cuda=cuda, data_pointer=pointers)  # then the alignment of pointer and row stride
    check_distinct_rows("x", x, "not supported (the kernels' loads were tested on distinct rows only); pass "
                             "x.contiguous()")
    if isinstance(hc_fn, torch.Tensor) and hc_fn.dtype == torch.bfloat16 and hc_fn.dim() == 2 \
            and hc_fn.shape[0] == N_PIECES * N_MIX:
        raise TypeError("hc_fn is a [72, K] bf16 tensor, the pieces the removed hc_mix_split_weights made; the "
                        "kernels split hc_fn themselves now: pass the float32 hc_fn [24, K]")
    check_tensor("hc_fn", hc_fn, dtypes=(torch.float32,), shape=(N_MIX, k), cuda=cuda, data_pointer=pointers)
    check_extent("hc_fn", hc_fn)  # (32-bit sizes and strides in both kernels; a padded row stride can pass 2**31)
    check_tensor("hc_scale", hc_scale, dtypes=(torch.float32,), shape=(3,), cuda=cuda, align_bytes=4,
                 data_pointer=pointers)
    check_tensor("hc_base", hc_base, dtypes=(torch.float32,), shape=(N_MIX,), cuda=cuda, align_bytes=4,
                 data_pointer=pointers)
    check_same_device(x=x, hc_fn=hc_fn, hc_scale=hc_scale, hc_base=hc_base)
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"x has {x.shape[0]} rows; at most {MAX_ROWS} supported")


_VALIDATED: dict = {}  # argument signature (shapes, strides, dtypes, devices, scalars, method) -> launch plan


def _validate_cached(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, method: str = "tma") -> tuple:
    """:func:`_validate` (and for ``method="walk"`` its 32-bit extent rule) once per argument signature
    (:func:`~cute_kernels.runtime.validate.validated_once`), and the call's launch plan kept with it
    (:func:`_plan`); later calls only re-check that the data pointers are aligned and not 0 (a freed
    storage: then the full check, which refuses it).  Returns the plan."""
    def check():
        _validate(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps)
        if method == "walk":
            _check_walk_extent(x)
        return _plan(x.shape[0], method)

    return validated_once(_VALIDATED, (x, hc_fn, hc_scale, hc_base), (sinkhorn_iters, rms_eps, hc_eps, method),
                          lambda: aligned_data(16, x, hc_fn) and aligned_data(4, hc_scale, hc_base), check)


def _plan(m: int, method: str) -> tuple:
    """``(compile_fn, workspace_rows)`` of an M-row call with ``method``'s default config (a function of M
    only: no tuning), for :func:`run_compiled`: what a signature fixes, so an eager call skips the config
    choice and the compiled-function lookup (about 3 us of host time on the H200's host, session 35).  Holds
    no device memory.  The compile itself waits for the first launch (M = 0 launches nothing)."""
    if method == "tma":
        from . import hc_mix_tma

        cfg, rows = hc_mix_tma.sized_config(m)
        return functools.cache(lambda: hc_mix_tma._compile(cfg)), rows
    cfg = config_for(m, store_mix=False)
    return functools.cache(lambda: _compile(cfg)), None


def split_pieces(hc_fn: torch.Tensor) -> torch.Tensor:
    """``[72, K]`` bf16: row ``24 p + n`` = piece p (lo, mid, hi) of ``hc_fn[n]``.

    hi = rn(w), mid = rn(w - hi), lo = rn(w - hi - mid) (round to nearest even, exact differences):
    the same values as the kernels' split (:func:`_split3_bf16x2`: in registers in the walk, into shared
    memory in :mod:`.hc_mix_tma`).  ``|hi + mid + lo - w| <= 2^-27 |w|`` for ``2^-110 <= |w| <= 3.39e38`` (bf16's
    largest finite value) and ``<= 2^-134`` below; a larger ``|w|`` gives an infinite hi (NaN in the sum).
    """
    hi = hc_fn.bfloat16()
    r1 = hc_fn - hi.float()
    mid = r1.bfloat16()
    lo = (r1 - mid.float()).bfloat16()
    return torch.cat([lo, mid, hi], 0).contiguous()


def run_compiled(compile_fn, x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, mix=None, out=None,
                 workspace_rows=None):
    """The launch glue both hc_mix kernels share: allocate ``pre [M, 4]``, ``post [M, 4]``,
    ``comb [M, 4, 4]`` float32 (or use ``out``: tests pass poisoned buffers) and, for M > 0, launch
    ``compile_fn()`` with ``mix`` (or a dummy row) as the raw-statistics buffer;
    ``workspace_rows``: rows of a ``[rows, 25]`` float32 workspace passed last (hc_mix_tma's).  Without
    ``mix`` the kernels are compiled not to touch the raw-statistics buffer (``store_mix`` off), so its
    dummy is the workspace's first row when there is one (no second allocation), else one row of its
    own (the outputs may not share memory: a custom op's outputs must not alias each other)."""
    m = x.shape[0]
    if out is not None:
        pre, post, comb = out
    else:
        pre = x.new_empty((m, HC), dtype=torch.float32)  # (new_empty: less host time than torch.empty(device=))
        post = x.new_empty((m, HC), dtype=torch.float32)
        comb = x.new_empty((m, HC, HC), dtype=torch.float32)
    if m:
        extra = () if workspace_rows is None else (x.new_empty((workspace_rows, SP_COLS), dtype=torch.float32),)
        if mix is None:
            mix = extra[0][:1] if extra else x.new_empty((1, SP_COLS), dtype=torch.float32)
        compile_fn()(x, hc_fn, hc_scale, hc_base, pre, post, comb.view(m, HC * HC), mix,
                     int(sinkhorn_iters), float(rms_eps), float(hc_eps), *extra)
    return pre, post, comb


WALK_MAX_OFFSET = INT32_MAX  # the walk indexes x with 32-bit element offsets
BENCH_K = 20480  # the bench's K (issue 7's shape)
BENCH_MAX_M = WALK_MAX_OFFSET // BENCH_K  # the most rows the bench's walk can take at that K


def _check_walk_extent(x: torch.Tensor) -> None:
    """The walk computes x's element offsets in 32 bits: refuse an x that spans more elements."""
    m = x.shape[0]
    span = element_span(x)  # (x's last dim is contiguous: (M - 1) * row stride + K)
    if span > WALK_MAX_OFFSET:
        raise ValueError(f"x spans {span} elements (M={m}, row stride {x.stride(0)}); method='walk' indexes x "
                         f"with 32-bit offsets (at most {WALK_MAX_OFFSET}): use method='tma' or fewer rows per call")


def _launch(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, mix=None, config=None,
            out=None):
    """Launch on validated inputs; ``out`` = preallocated (pre, post, comb) (tests poison them)."""
    _check_walk_extent(x)
    store_mix = mix is not None  # (a config's store_mix without a mix buffer would write past the dummy row)
    cfg = config_for(x.shape[0], store_mix=store_mix) if config is None else \
        config if config.store_mix == store_mix else dataclasses.replace(config, store_mix=store_mix)
    return run_compiled(lambda: _compile(cfg), x, hc_fn, hc_scale,
                        hc_base, sinkhorn_iters, rms_eps, hc_eps, mix=mix, out=out)


METHODS = ("walk", "tma")  # not "kernel": inductor's FallbackKernel.create takes that name


def _check_method(method) -> None:
    if not isinstance(method, str):  # (TypeError, as ranker_attention's cap_method)
        raise TypeError(f"method must be a str, one of {METHODS}; got {type(method).__name__} {method!r}")
    if method not in METHODS:
        raise ValueError(f"method={method!r}: must be one of {METHODS}")


def _fake(x, hc_fn, hc_scale, hc_base, sinkhorn_iters=20, rms_eps=1e-6, hc_eps=1e-6, method="tma"):
    _check_method(method)
    _validate(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, cuda=False, pointers=False)
    if method == "walk":
        _check_walk_extent(x)  # shapes and strides only: the same error at trace time
    m = x.shape[0]
    return (x.new_empty(m, HC, dtype=torch.float32), x.new_empty(m, HC, dtype=torch.float32),
            x.new_empty(m, HC, HC, dtype=torch.float32))


def _precheck(x, hc_fn, hc_scale, hc_base, sinkhorn_iters=20, rms_eps=1e-6, hc_eps=1e-6, method="tma"):
    _check_method(method)
    _check_scalars(sinkhorn_iters, rms_eps, hc_eps)


@custom_op("hc_mix_sinkhorn", mutates_args=(), fake=_fake, precheck=_precheck)
def hc_mix_sinkhorn(x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                    sinkhorn_iters: int = 20, rms_eps: float = 1e-6, hc_eps: float = 1e-6, method: str = "tma"
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mHC pre/post/comb coefficients of each row (DeepSeek mHC, arXiv 2512.24880; seed 001).

    Per row, with ``a = x . hc_fn^T`` (24 values) and ``r = 1 / sqrt(sum(x^2) / K + rms_eps)``::

        pre  = sigmoid(a[0:4] * r * hc_scale[0] + hc_base[0:4]) + hc_eps
        post = 2 * sigmoid(a[4:8] * r * hc_scale[1] + hc_base[4:8])
        C    = (a[8:24] * r * hc_scale[2] + hc_base[8:24]).view(4, 4)      # row-major
        C    = softmax(C, over each row) + hc_eps                          # every entry + hc_eps
        C    = C / (column sums of C + hc_eps)                             # column normalize
        repeat sinkhorn_iters - 1 times:
            C = C / (row sums of C + hc_eps)                               # row normalize
            C = C / (column sums of C + hc_eps)                            # column normalize
        comb = C

    (exactly :func:`hc_mix_sinkhorn_reference`; ``sinkhorn_iters = 1`` is the softmax and one
    column normalization).  The kernel computes every reciprocal (sigmoids, Sinkhorn) with ``rcp.approx``
    and ``r`` with ``rsqrt``: within a few float32 ulps of the IEEE forms (errors against float64 <= 4e-7).

    Args:
        x: ``[M, K]`` bfloat16 CUDA tensor, rows 16-byte aligned, K a multiple of 64 and at most
            89478464 (hc_fn ``[24, K]`` spans fewer than 2**31 elements),
            ``0 <= M <= 1048560`` (65535 row blocks of 16: the grid's y limit); ``method="walk"`` also
            needs ``(M - 1) * row stride + K < 2**31`` (32-bit offsets; M < 104858 at K = 20480).
        hc_fn: ``[24, K]`` float32 (mix weights: 4 pre, 4 post, 16 comb), last dim contiguous, row
            stride a multiple of 16 bytes (4 elements), 16-byte aligned, spanning fewer than 2**31 elements
            (both methods).
        hc_scale: ``[3]`` float32 (pre, post, comb scales).  hc_base: ``[24]`` float32 biases.
        sinkhorn_iters: int (not bool / float) in ``[1, 2**31 - 1]``.
        rms_eps, hc_eps: real numbers (not bool), finite (float32 range), ``>= 0``, and 0 or ``>= 2**-126``
            (a smaller value would become 0 in float32).  With
            ``rms_eps = 0`` an all-zero row has ``r = inf`` and gives NaN, as the formula does.
        method: ``"tma"`` (default; :mod:`.hc_mix_tma`: TMA + WGMMA, faster at every M measured on
            the H200: 9.1-9.4 us instead of 12.2-12.9 at M <= 128 (session 35), about 2x from M = 512 up; a
            hidden float32 workspace of 100 bytes x CTAs per row tile for every row of the 128-row tiles:
            819 KB at M = 1, 6.4 KB per row up to M = 256, 3.2 KB up to 512, 400 B per row at 4096)
            or ``"walk"`` (this module's per-thread K walk, the default until session 7).  Each is batch
            invariant on its own but their bits differ: pick one per deployment and keep it.
    Returns:
        ``pre [M, 4]``, ``post [M, 4]``, ``comb [M, 4, 4]``, float32.  ``a = x . hc_fn^T`` is
        float32-accurate (bf16x3 tensor-core products); each row's bits are independent of M.
    Raises:
        TypeError: wrong tensor dtype; sinkhorn_iters not an int; rms_eps / hc_eps not real numbers; method
            not a str.
        ValueError: wrong shape, device, alignment or K; sinkhorn_iters out of range; rms_eps /
            hc_eps negative, not finite or below 2**-126 (but not 0); a method other than ``"walk"`` and
            ``"tma"``; x too large for the walk's 32-bit offsets; hc_fn spanning 2**31 elements or more.
        RuntimeError: in ``backward()`` when an input required grad: forward only (the op has no autograd
            formula: torch raises its "no autograd formula" error rather than dropping the gradient).
    FLOP counting: ``torch.utils.flop_counter.FlopCounterMode`` counts the mix GEMM, ``2 * M * K * 24`` (make the
    counter after this module loaded: a first call, or ``cute_kernels.register_ops()``).
    Weights: both methods multiply x by hc_fn split into three bf16 pieces (hi + mid + lo) inside the kernel, on
    every call, from the float32 hc_fn in memory: a weight changed by any means (an optimizer step, fused or not,
    a collective, a write through ``.data``) is always seen, in CUDA graphs and under torch.compile too.
    """
    _check_method(method)
    compiled, workspace_rows = _validate_cached(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, method)
    return run_compiled(compiled, x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps,
                        workspace_rows=workspace_rows)


def _flops(x_shape, hc_fn_shape, *args, out_shape=None, **kwargs) -> int:
    """``torch.utils.flop_counter.FlopCounterMode``'s count of the op: the mix GEMM ``x [M, K] . hc_fn^T [K, 24]``,
    2 FLOPs per multiply-add (the bf16x3 split's three products and the per-row epilogue not counted)."""
    m, k = x_shape
    return 2 * m * k * N_MIX


register_flops(torch.ops.cute_kernels.hc_mix_sinkhorn, _flops)


def hc_mix_raw(x: torch.Tensor, hc_fn: torch.Tensor, config: HcMixConfig | None = None):
    """Testing aid: the walk kernel's raw ``a [M, 24]`` and ``sum x^2 [M]`` (same reduction as the op's
    ``method="walk"``; :func:`.hc_mix_tma.hc_mix_sinkhorn_tma` takes ``mix=`` for the default).  Same
    argument rules as the op; ``config``: an :class:`HcMixConfig` or None."""
    if not isinstance(x, torch.Tensor) or not isinstance(hc_fn, torch.Tensor):
        raise TypeError(f"x and hc_fn must be torch.Tensors, got {type(x).__name__} and {type(hc_fn).__name__}")
    if config is not None and not isinstance(config, HcMixConfig):
        raise TypeError(f"config must be an HcMixConfig, got {type(config).__name__}")
    _validate(x, hc_fn, torch.ones(3, device=x.device), torch.zeros(N_MIX, device=x.device), 1)
    m = x.shape[0]
    mix = torch.empty(max(m, 1), SP_COLS, dtype=torch.float32, device=x.device)
    _launch(x, hc_fn, torch.ones(3, device=x.device), torch.zeros(N_MIX, device=x.device), 1, 1e-6, 1e-6,
            mix=mix, config=config)
    return mix[:m, :N_MIX], mix[:m, N_MIX]


@without_autocast
def hc_mix_sinkhorn_reference(x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor,
                              hc_base: torch.Tensor, sinkhorn_iters: int = 20, rms_eps: float = 1e-6,
                              hc_eps: float = 1e-6, dtype: torch.dtype = torch.float64):
    """Reference of :func:`hc_mix_sinkhorn` in ``dtype`` (float64 by default, or float32; any device).

    Returns float32 ``pre [M, 4]``, ``post [M, 4]``, ``comb [M, 4, 4]`` (and computes in ``dtype``).
    The scalars follow the op's rules (``TypeError`` / ``ValueError`` naming the argument); the
    tensors may have any float dtype and any one device with data (all on it; not "meta"), but their
    shapes must be the op's (``x [M, K]``, ``hc_fn [24, K]``, ``hc_scale [3]``, ``hc_base [24]``, any
    K >= 1): ``ValueError`` otherwise.  As in the op, ``rms_eps = 0`` gives NaN on an all-zero row of ``x``
    (``0 * rsqrt(0)``), and the run time grows linearly with ``sinkhorn_iters`` (no cap beyond int32).
    """
    _check_scalars(sinkhorn_iters, rms_eps, hc_eps)
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    check_float_tensors(x=x, hc_fn=hc_fn, hc_scale=hc_scale, hc_base=hc_base)
    check_same_device(x=x, hc_fn=hc_fn, hc_scale=hc_scale, hc_base=hc_base)
    if x.device.type == "meta":
        raise ValueError("the reference computes values: it needs tensors with data, not 'meta' ones")
    if x.dim() != 2 or x.shape[1] < 1:
        raise ValueError(f"x must be [M, K] with K >= 1, got {list(x.shape)}")
    if tuple(hc_fn.shape) != (N_MIX, x.shape[1]):
        raise ValueError(f"hc_fn must be [{N_MIX}, {x.shape[1]}], got {list(hc_fn.shape)}")
    if tuple(hc_scale.shape) != (3,) or tuple(hc_base.shape) != (N_MIX,):
        raise ValueError(f"hc_scale must be [3] and hc_base [{N_MIX}], got {list(hc_scale.shape)} and "
                         f"{list(hc_base.shape)}")
    pre, post, comb = _reference(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, float(rms_eps), float(hc_eps), dtype)
    return pre.float(), post.float(), comb.float()


def _reference(x, hc_fn, hc_scale, hc_base, sinkhorn_iters=20, rms_eps=1e-6, hc_eps=1e-6,
               dtype=torch.float64):
    xd = x.to(dtype)
    a = xd @ hc_fn.to(dtype).t()
    k = x.shape[1]
    r = torch.rsqrt((xd * xd).sum(-1, keepdim=True) / k + rms_eps)
    scale = hc_scale.to(dtype)
    base = hc_base.to(dtype)
    pre = torch.sigmoid(a[:, :HC] * r * scale[0] + base[:HC]) + hc_eps
    post = 2 * torch.sigmoid(a[:, HC:2 * HC] * r * scale[1] + base[HC:2 * HC])
    c = (a[:, 2 * HC:] * r * scale[2] + base[2 * HC:]).view(-1, HC, HC)
    c = torch.softmax(c, dim=-1) + hc_eps
    c = c / (c.sum(-2, keepdim=True) + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        c = c / (c.sum(-1, keepdim=True) + hc_eps)
        c = c / (c.sum(-2, keepdim=True) + hc_eps)
    return pre, post, c


def check() -> list[CheckResult]:
    """Norm-wise error of ``a`` and max abs error of the outputs vs float64, K = 20480, both methods."""
    import math

    from . import hc_mix_tma

    rows = []
    for m in (1, 511, 4096):
        k = 20480
        x = torch.randn(m, k, device="cuda").bfloat16()
        hc_fn = torch.randn(N_MIX, k, device="cuda") / math.sqrt(k)
        hc_scale = torch.rand(3, device="cuda") + 0.5
        hc_base = torch.randn(N_MIX, device="cuda")
        a64 = x.double() @ hc_fn.double().t()
        mix = torch.empty(m, SP_COLS, device="cuda")
        hc_mix_tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base, mix=mix)
        for method, a in (("walk", hc_mix_raw(x, hc_fn)[0]), ("tma", mix[:, :N_MIX])):
            err_a = ((a.double() - a64).norm() / a64.norm()).item()
            rows.append(CheckResult(NAME, f"a method={method} M={m} K={k}", err_a <= 2e-6, float("nan"), err_a,
                                    2e-6))
        want = hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base)
        for method in METHODS:
            got = hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
            err = max((g.double() - w.double()).abs().max().item() for g, w in zip(got, want))
            rows.append(CheckResult(NAME, f"pre/post/comb method={method} M={m} K={k}", err <= 1e-5, err,
                                    float("nan"), 1e-5))
    return rows


def _splitk_baseline():
    """The split-K Triton baseline from ``bench/hc_mix_splitk_triton.py`` (None without Triton or
    without that file, e.g. in an installed package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "hc_mix_splitk_triton.py"
    try:
        spec = importlib.util.spec_from_file_location("hc_mix_splitk_triton", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.hc_mix_splitk_triton
    except (ImportError, FileNotFoundError):
        return None


BENCH_MS = (1, 16, 128, 512, 1024, 2048, 4096, 16384)


def bench_shapes(shapes: str | None) -> list[int]:
    """:func:`bench`'s ``shapes`` spec: comma-separated row counts ``1 <= M <= BENCH_MAX_M`` (None or
    empty: :data:`BENCH_MS`); ``ValueError`` for anything else."""
    if not shapes:
        return list(BENCH_MS)
    try:
        ms = [int(s) for s in shapes.split(",")]
    except ValueError:
        ms = []
    if not ms or min(ms) < 1 or max(ms) > BENCH_MAX_M:
        raise ValueError(f"bench --shapes for {NAME}: expected comma-separated row counts 1 <= M <= {BENCH_MAX_M} "
                         f"(K = {BENCH_K}; the bench times method='walk' too, whose offsets are 32-bit), e.g. "
                         f"'4096' or '1,512,4096'; got {shapes!r}")
    return ms


def bench(shapes: str | None = None) -> list[dict]:
    """us per call inside a CUDA graph (10 calls per replay) and GB/s of reading x once (M*K*2 B).

    Ours: ``method="tma"`` (the default, impl ``cute_kernels_tma``; session 34's records also have
    ``cute_kernels_tma_pieces``, the pieces made beforehand, and their ``cute_kernels_tma`` ran a split kernel
    before the walk: since session 35 the walk splits hc_fn itself) and ``method="walk"``
    (``cute_kernels_walk``; records up to session 7's call the walk kernel ``cute_kernels``).
    Peers in the same process: the float32 torch reference and the split-K Triton baseline.
    ``shapes``: comma-separated M values (K = 20480), default 1,16,128,512,1024,2048,4096,16384.
    """
    import math

    from ..runtime.timing import copy_bandwidth_gbps, cuda_time_us

    k = BENCH_K
    ms = bench_shapes(shapes)
    copy_bw = copy_bandwidth_gbps()
    splitk = _splitk_baseline()
    recs = []
    for m in ms:
        x = torch.randn(m, k, device="cuda").bfloat16()
        hc_fn = torch.randn(N_MIX, k, device="cuda") / math.sqrt(k)
        hc_scale = torch.rand(3, device="cuda") + 0.5
        hc_base = torch.randn(N_MIX, device="cuda")
        args = (x, hc_fn, hc_scale, hc_base)
        impls = [("cute_kernels_walk", lambda: hc_mix_sinkhorn(*args, method="walk")),
                 ("cute_kernels_tma", lambda: hc_mix_sinkhorn(*args, method="tma")),
                 ("torch_fp32_reference", lambda: _reference(*args, dtype=torch.float32))]
        if splitk is not None:
            impls.append(("triton_splitk", lambda: splitk(*args)))
        for impl, fn in impls:
            t = cuda_time_us(fn, graph=True)
            gbps = m * k * 2 / t / 1e3
            recs.append(dict(kernel=NAME, impl=impl, shape=dict(m=m, k=k), mode="graph", time_us=t,
                             gbps=gbps, copy_bw_frac=gbps / copy_bw, copy_gbps=copy_bw))
    return recs
