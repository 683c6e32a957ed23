"""The ``method="walk"`` kernel of :func:`.hc_mix.hc_mix_sinkhorn` (DeepSeek mHC, seed 001): the mix statistics
``a = x . hc_fn^T`` and ``sum x^2`` of each row of ``x [M, K]`` in one K walk, then the per-row epilogue
(:func:`.hc_mix_shared.row_epilogue`: sigmoids + Sinkhorn; the math is in :mod:`.hc_mix`).  The op's default,
``method="tma"``, is :mod:`.hc_mix_tma`.

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
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32

from ..runtime.cache import compile_cached
from ..runtime.validate import ValidatedConfig, check_config_fields, check_int
from .hc_mix_shared import (N_MIX, N_PIECES, SMEM_LIMIT, SP_COLS, EpilogueArgs, _split3_bf16x2,
                            fake_launch_args, row_epilogue)

NAME = "hc_mix"  # (the compile cache's name of the walk: the registry's kernel name)
N_TILES = N_MIX // 8  # three n8 MMA tiles
K_CHUNK = 32  # columns per warp step: 4 lanes x 8 bf16 (16 bytes)
CLUSTER_K = 8  # CTAs per row block (cluster), fixed: part of the reduction order
WARPS_K = 4  # warps per row tile splitting K, fixed: part of the reduction order
K_PARTS = CLUSTER_K * WARPS_K


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


def _compile(config: HcMixConfig):
    return compile_cached(NAME, config, lambda: (HcMixKernel(config), fake_launch_args()))
