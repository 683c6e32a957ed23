"""Hyper-connection mix statistics + Sinkhorn in one K walk (DeepSeek mHC, seed 001).

For each row of ``x [M, K]`` (bf16) this computes the manifold-constrained hyper-connection
coefficients (mHC, arXiv 2512.24880; seed ``001_ea94da0ccc866503``), hc_mult = 4:

    a   = x . hc_fn^T                      (24 values, float32-accurate)
    r   = 1 / sqrt(sum(x^2) / K + rms_eps)
    pre  = sigmoid(a[0:4] * r * hc_scale[0] + hc_base[0:4]) + hc_eps
    post = 2 * sigmoid(a[4:8] * r * hc_scale[1] + hc_base[4:8])
    comb = sinkhorn(a[8:24] * r * hc_scale[2] + hc_base[8:24])  (4x4, row-major)

Design (one kernel, no partials in global memory):

* Row blocks of ``tile_m`` rows; each row block is walked by one thread-block cluster of
  ``CLUSTER_K`` = 8 CTAs, and each CTA by ``WARPS_K`` = 4 warps per 16/32-row warp tile.  K is cut
  into chunks of 32 columns; the 32 "K parts" (CTA rank x warp) take chunks round-robin
  (part p walks chunks p, p + 32, p + 64, ... in order) with a running float32 accumulator each.
* Tensor cores: warp-level ``mma.sync.m16n8k16`` bf16 -> f32 (``cute.nvgpu.warp.MmaF16BF16Op``),
  x as the A operand (exact in bf16), hc_fn split in registers into three bf16 pieces
  hi + mid + lo (hi = rn(w), mid = rn(w - hi), lo = rn(w - hi - mid); the differences are exact, the
  representation error is <= 2^-27 |w|); per 16-column step the pieces are issued lo, mid, hi into the
  same accumulator; 24 outputs = three n8 tiles (no padding).
* Loads go straight from global memory into registers as 16-byte vectors, prefetched one chunk
  ahead (register double buffer): lane (g, t) of a warp loads x[row, 32c + 8t : 32c + 8t + 8] for
  rows g and g + 8 of each m16 tile, and hc_fn[n, 32c + 8t : +8] (fp32, through L2) for n = g + 8j.
  The k order inside a chunk is permuted identically for A and B (physical k = 8t + 4s + {0..3}
  feeds mma step s, logical k {2t, 2t+1, 2t+8, 2t+9}), so no shuffles or shared memory are needed.
* The row sum of squares is accumulated in the same pass (fma, element order 0..7 of each vector),
  reduced over the 4 lanes of a row by an xor butterfly (1 then 2).
* Partials of the 32 parts go to shared memory; after a cluster barrier, CTA rank r reduces rows
  ``r, r + 8, ...`` of the block by reading all 8 CTAs' partials through distributed shared memory
  (``ld.shared::cluster``) and runs the epilogue (sigmoids + Sinkhorn) one thread per row.

Reduction order (bitwise determinism and batch invariance): for a row, part p's partial is the
sequence of its chunks in increasing order, each chunk = mma step 0 then 1, each step = pieces
lo, mid, hi; the 32 partials are summed as ``((0 + P[0,0]) + P[0,1]) + ... + P[7,3]`` (CTA rank
major, warp minor).  None of this depends on M, ``tile_m`` or which rows share a tile (rows are
independent in the MMA), so a row's bits are the same for every M, config and run.  The split is the
same for every M (small M is latency-bound and gets its parallelism from the same 32-way split).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32

from ..registry import CheckResult, CompileTarget
from ..runtime.cache import compile_cached
from ..runtime.fake import fake_stream, fake_tensor
from ..runtime.torch_op import custom_op
from ..runtime.validate import check_same_device, check_tensor

NAME = "hc_mix"
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


@dataclass(frozen=True)
class HcMixConfig:
    """Row tile of one cluster: ``warps_m`` warp rows of ``16 * m_tiles`` rows (x WARPS_K warps).

    ``store_mix`` additionally writes the raw ``[a (24), sum x^2]`` per row (tests, debugging).
    """

    m_tiles: int = 2
    warps_m: int = 2
    store_mix: bool = False

    @property
    def tile_m(self) -> int:
        return 16 * self.m_tiles * self.warps_m

    @property
    def threads(self) -> int:
        return 32 * WARPS_K * self.warps_m

    def validate(self) -> None:
        if self.m_tiles not in (1, 2):
            raise ValueError(f"m_tiles={self.m_tiles}: must be 1 or 2 (m16 tiles per warp)")
        if self.warps_m not in (1, 2, 4):
            raise ValueError(f"warps_m={self.warps_m}: must be 1, 2 or 4")
        if self.tile_m % CLUSTER_K:
            raise ValueError(f"tile_m={self.tile_m} must be a multiple of {CLUSTER_K}")


# M -> config; any choice gives the same bits (see the module docstring)
SMALL = HcMixConfig(m_tiles=1, warps_m=1)  # 16 rows per cluster
MEDIUM = HcMixConfig(m_tiles=2, warps_m=1)  # 32 rows
LARGE = HcMixConfig(m_tiles=2, warps_m=2)  # 64 rows
# (m_tiles=2, warps_m=4: 512 threads are capped at 128 registers and spill; not shipped)
SHIPPED = (SMALL, MEDIUM, LARGE)


def config_for(m: int, store_mix: bool = False) -> HcMixConfig:
    """The config used for ``m`` rows: enough clusters to fill the GPU, then the largest tile."""
    if m <= 256:
        cfg = SMALL
    elif m <= 1024:
        cfg = MEDIUM
    else:
        cfg = LARGE
    if store_mix:
        cfg = HcMixConfig(cfg.m_tiles, cfg.warps_m, store_mix=True)
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
        config.validate()
        self.config = config
        self.m_tiles = config.m_tiles
        self.warps_m = config.warps_m
        self.tile_m = config.tile_m
        self.threads = config.threads
        self.rows_per_rank = self.tile_m // CLUSTER_K

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
        rC, rSq = self.mma_walk(mX, mW, tiled_mma, row_base, part, lane)
        self.store_partials(sP, rC, rSq, wk, wm, lane)

        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        self.cluster_reduce(sP, sA, rank, tidx)
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

        if tidx < self.rows_per_rank:
            row = m_block * self.tile_m + tidx * CLUSTER_K + rank
            if row < mX.shape[0]:
                self.epilogue(sA, tidx, row, mX.shape[1], mScale, mBase, mPre, mPost, mComb, mMix,
                              sinkhorn_iters, rms_eps, hc_eps)

    # ------------------------------------------------------------------ roles
    @cute.jit
    def load_chunk(self, mXv: cute.Tensor, mWv: cute.Tensor, rX, rW, chunk: Int32, row_base: Int32,
                   lane: Int32, m: Int32, n_chunks: Int32):
        """16-byte loads of chunk ``chunk`` (32 columns) into the register buffers (zeros if out)."""
        g = lane // 4
        t = lane % 4
        atom_x = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        atom_w = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
        k_ok = chunk < n_chunks
        for mt in cutlass.range_constexpr(self.m_tiles):
            for h in cutlass.range_constexpr(2):
                row = row_base + mt * 16 + h * 8 + g
                dst = rX[mt * 2 + h]
                if k_ok and row < m:
                    cute.copy(atom_x, mXv[(0, None), (row, chunk * 4 + t)], dst)
                else:
                    dst.fill(0)
        for j in cutlass.range_constexpr(N_TILES):
            for h in cutlass.range_constexpr(2):
                dst = rW[j * 2 + h]
                if k_ok:
                    cute.copy(atom_w, mWv[(0, None), (j * 8 + g, chunk * 8 + t * 2 + h)], dst)
                else:
                    dst.fill(0)

    @cute.jit
    def mma_chunk(self, tiled_mma: cute.TiledMma, rX, rW, rC, rSq, rA, rB, rPiece, rXf):
        """Accumulate one chunk: split hc_fn into bf16 pieces, 2 k16 steps x 3 pieces x tiles."""
        for j in cutlass.range_constexpr(N_TILES):
            for h in cutlass.range_constexpr(2):
                w = rW[j * 2 + h].load()
                hi = w.to(BFloat16)
                r1 = w - hi.to(Float32)
                mid = r1.to(BFloat16)
                lo = (r1 - mid.to(Float32)).to(BFloat16)
                # pieces in accumulation order: lo, mid, hi
                rPiece[(j * N_PIECES + 0) * 2 + h].store(lo)
                rPiece[(j * N_PIECES + 1) * 2 + h].store(mid)
                rPiece[(j * N_PIECES + 2) * 2 + h].store(hi)
        for i in cutlass.range_constexpr(self.m_tiles * 2):
            rXf.store(rX[i].load().to(Float32))
            acc = rSq[i]
            for e in cutlass.range_constexpr(8):
                acc = cute.math.fma(rXf[e], rXf[e], acc)
            rSq[i] = acc
        for s in cutlass.range_constexpr(2):
            # A: v0,v1 = row g, k 4s..4s+1; v2,v3 = row g+8; v4,v5 = row g, k 4s+2..; v6,v7 = row g+8
            for mt in cutlass.range_constexpr(self.m_tiles):
                for kk in cutlass.range_constexpr(2):
                    for h in cutlass.range_constexpr(2):
                        for e in cutlass.range_constexpr(2):
                            rA[mt][kk * 4 + h * 2 + e] = rX[mt * 2 + h][4 * s + 2 * kk + e]
            for p in cutlass.range_constexpr(N_PIECES):
                for j in cutlass.range_constexpr(N_TILES):
                    # B: v0..v3 = k 4s..4s+3 of column n = 8j + g (the lane's 4 consecutive k)
                    src = rPiece[(j * N_PIECES + p) * 2 + s]
                    for v in cutlass.range_constexpr(4):
                        rB[v] = src[v]
                    for mt in cutlass.range_constexpr(self.m_tiles):
                        cute.gemm(tiled_mma, rC[mt * N_TILES + j], rA[mt], rB, rC[mt * N_TILES + j])

    @cute.jit
    def mma_walk(self, mX: cute.Tensor, mW: cute.Tensor, tiled_mma: cute.TiledMma, row_base: Int32,
                 part: Int32, lane: Int32):
        """Walk this warp's K part (chunks part, part + 32, ...) with a running accumulator."""
        mXv = cute.zipped_divide(mX, (1, 8))  # ((1, 8), (M, K / 8)): 16-byte vectors
        mWv = cute.zipped_divide(mW, (1, 4))  # ((1, 4), (24, K / 4))
        m = mX.shape[0]
        n_chunks = mX.shape[1] // K_CHUNK
        n_steps = (n_chunks + K_PARTS - 1) // K_PARTS
        n_pairs = (n_steps + 1) // 2

        thr_mma = tiled_mma.get_slice(lane)
        frag_a_shape = thr_mma.partition_shape_A((16, 16))
        frag_b_shape = thr_mma.partition_shape_B((8, 16))
        frag_c_shape = thr_mma.partition_shape_C((16, 8))
        rC = [tiled_mma.make_fragment_C(frag_c_shape) for _ in range(self.m_tiles * N_TILES)]
        for c in rC:
            c.fill(0.0)
        rA = [tiled_mma.make_fragment_A(frag_a_shape) for _ in range(self.m_tiles)]
        rB = tiled_mma.make_fragment_B(frag_b_shape)
        rSq = cute.make_rmem_tensor(cute.make_layout(self.m_tiles * 2), Float32)
        rSq.fill(0.0)
        rXf = cute.make_rmem_tensor(cute.make_layout(8), Float32)
        rPiece = [cute.make_rmem_tensor(cute.make_layout(4), BFloat16)
                  for _ in range(N_TILES * N_PIECES * 2)]
        # register double buffer: [buffer][m tile * 2 + half] x (8 bf16), [buffer][tile * 2 + half] x 4 f32
        rX = [[cute.make_rmem_tensor(cute.make_layout(8), BFloat16) for _ in range(self.m_tiles * 2)]
              for _ in range(2)]
        rW = [[cute.make_rmem_tensor(cute.make_layout(4), Float32) for _ in range(N_TILES * 2)]
              for _ in range(2)]

        self.load_chunk(mXv, mWv, rX[0], rW[0], part, row_base, lane, m, n_chunks)
        for it in cutlass.range(n_pairs, unroll=1):
            c0 = part + it * (2 * K_PARTS)
            self.load_chunk(mXv, mWv, rX[1], rW[1], c0 + K_PARTS, row_base, lane, m, n_chunks)
            self.mma_chunk(tiled_mma, rX[0], rW[0], rC, rSq, rA, rB, rPiece, rXf)
            self.load_chunk(mXv, mWv, rX[0], rW[0], c0 + 2 * K_PARTS, row_base, lane, m, n_chunks)
            self.mma_chunk(tiled_mma, rX[1], rW[1], rC, rSq, rA, rB, rPiece, rXf)
        # the row's sum of squares: lanes t = 0..3 of a row, xor 1 then xor 2
        for i in cutlass.range_constexpr(self.m_tiles * 2):
            v = rSq[i]
            v = v + cute.arch.shuffle_sync_bfly(v, 1)
            v = v + cute.arch.shuffle_sync_bfly(v, 2)
            rSq[i] = v
        return rC, rSq

    @cute.jit
    def store_partials(self, sP: cute.Tensor, rC, rSq: cute.Tensor, wk: Int32, wm: Int32, lane: Int32):
        g = lane // 4
        t = lane % 4
        for mt in cutlass.range_constexpr(self.m_tiles):
            for j in cutlass.range_constexpr(N_TILES):
                c = rC[mt * N_TILES + j]
                for v in cutlass.range_constexpr(4):
                    row = wm * (16 * self.m_tiles) + mt * 16 + (v // 2) * 8 + g
                    sP[wk, row, j * 8 + 2 * t + v % 2] = c[v]
            if t == 0:
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
                total = Float32(0.0)
                for src in cutlass.range_constexpr(CLUSTER_K):
                    for w in cutlass.range_constexpr(WARPS_K):
                        ptr = sP.iterator + (w * self.tile_m * SP_COLS + row * SP_COLS + col)
                        total = total + _ld_dsmem_f32(ptr, Int32(src))
                sA[rr, col] = total

    @cute.jit
    def epilogue(self, sA: cute.Tensor, rr: Int32, row: Int32, k: Int32, mScale: cute.Tensor,
                 mBase: cute.Tensor, mPre: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor,
                 mMix: cute.Tensor, sinkhorn_iters: Int32, rms_eps: Float32, hc_eps: Float32):
        """Per row: r = 1/sqrt(mean x^2 + eps), sigmoids, Sinkhorn (float32, one thread)."""
        if cutlass.const_expr(self.config.store_mix):
            for c in cutlass.range_constexpr(SP_COLS):
                mMix[row, c] = sA[rr, c]
        sq = sA[rr, N_MIX]
        r = Float32(1.0) / cute.math.sqrt(sq / Float32(k) + rms_eps)
        s0 = mScale[0] * r
        s1 = mScale[1] * r
        s2 = mScale[2] * r
        for i in cutlass.range_constexpr(HC):
            z = sA[rr, i] * s0 + mBase[i]
            mPre[row, i] = Float32(1.0) / (Float32(1.0) + cute.math.exp(-z)) + hc_eps
        for i in cutlass.range_constexpr(HC):
            z = sA[rr, HC + i] * s1 + mBase[HC + i]
            mPost[row, i] = Float32(2.0) / (Float32(1.0) + cute.math.exp(-z))
        rM = cute.make_rmem_tensor(cute.make_layout(HC * HC), Float32)
        for i in cutlass.range_constexpr(HC * HC):
            rM[i] = sA[rr, 2 * HC + i] * s2 + mBase[2 * HC + i]
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
            inv = Float32(1.0) / ssum
            for j in cutlass.range_constexpr(HC):
                rM[i * HC + j] = rM[i * HC + j] * inv + hc_eps
        self.normalize_cols(rM, hc_eps)
        for _ in cutlass.range(sinkhorn_iters - 1, unroll=1):
            self.normalize_rows(rM, hc_eps)
            self.normalize_cols(rM, hc_eps)
        for i in cutlass.range_constexpr(HC * HC):
            mComb[row, i] = rM[i]

    @cute.jit
    def normalize_rows(self, rM: cute.Tensor, hc_eps: Float32):
        for i in cutlass.range_constexpr(HC):
            ssum = rM[i * HC]
            for j in cutlass.range_constexpr(1, HC):
                ssum = ssum + rM[i * HC + j]
            inv = Float32(1.0) / (ssum + hc_eps)
            for j in cutlass.range_constexpr(HC):
                rM[i * HC + j] = rM[i * HC + j] * inv

    @cute.jit
    def normalize_cols(self, rM: cute.Tensor, hc_eps: Float32):
        for j in cutlass.range_constexpr(HC):
            ssum = rM[j]
            for i in cutlass.range_constexpr(1, HC):
                ssum = ssum + rM[i * HC + j]
            inv = Float32(1.0) / (ssum + hc_eps)
            for i in cutlass.range_constexpr(HC):
                rM[i * HC + j] = rM[i * HC + j] * inv


# ---------------------------------------------------------------------- compile + torch glue
def _compile(config: HcMixConfig):
    def build():
        m = cute.sym_int()
        k = cute.sym_int(divisibility=K_ALIGN)
        mm = cute.sym_int()
        # explicit row-major strides (a compact fake tensor without strides is column-major)
        return HcMixKernel(config), (
            fake_tensor(torch.bfloat16, (m, k), stride=(k, 1)),
            fake_tensor(torch.float32, (N_MIX, k), stride=(k, 1)),
            fake_tensor(torch.float32, (3,), align=4),
            fake_tensor(torch.float32, (N_MIX,), align=4),
            fake_tensor(torch.float32, (m, HC), stride=(HC, 1)),
            fake_tensor(torch.float32, (m, HC), stride=(HC, 1)),
            fake_tensor(torch.float32, (m, HC * HC), stride=(HC * HC, 1)),
            fake_tensor(torch.float32, (mm, SP_COLS), stride=(SP_COLS, 1), align=4),
            Int32(20), Float32(1e-6), Float32(1e-6), fake_stream())

    return compile_cached(NAME, config, build)


def compile_targets() -> list[CompileTarget]:
    return [CompileTarget(NAME, f"tile_m={c.tile_m} {c}", c, build=lambda c=c: _compile(c))
            for c in SHIPPED]


def _validate(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, cuda: bool = True):
    check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2, cuda=cuda)
    k = x.shape[1]
    if k % K_ALIGN or k == 0:
        raise ValueError(f"x.shape[1]={k} must be a positive multiple of {K_ALIGN}")
    check_tensor("hc_fn", hc_fn, dtypes=(torch.float32,), shape=(N_MIX, k), cuda=cuda)
    check_tensor("hc_scale", hc_scale, dtypes=(torch.float32,), shape=(3,), cuda=cuda, align_bytes=4)
    check_tensor("hc_base", hc_base, dtypes=(torch.float32,), shape=(N_MIX,), cuda=cuda, align_bytes=4)
    if hc_scale.dim() and hc_scale.stride(0) != 1 or hc_base.stride(0) != 1:
        raise ValueError("hc_scale and hc_base must be contiguous")
    check_same_device(x=x, hc_fn=hc_fn, hc_scale=hc_scale, hc_base=hc_base)
    if int(sinkhorn_iters) < 1:
        raise ValueError(f"sinkhorn_iters={sinkhorn_iters} must be >= 1")
    if x.shape[0] > 65535 * 16:
        raise ValueError(f"x has {x.shape[0]} rows; at most {65535 * 16} supported")


def _launch(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, mix=None, config=None,
            out=None):
    """Launch on validated inputs; ``out`` = preallocated (pre, post, comb) (tests poison them)."""
    m = x.shape[0]
    dev = x.device
    if out is not None:
        pre, post, comb = out
    else:
        pre = torch.empty(m, HC, dtype=torch.float32, device=dev)
        post = torch.empty(m, HC, dtype=torch.float32, device=dev)
        comb = torch.empty(m, HC, HC, dtype=torch.float32, device=dev)
    if m:
        cfg = config or config_for(m, store_mix=mix is not None)
        mix_arg = mix if mix is not None else pre.new_empty(1, SP_COLS)
        _compile(cfg)(x, hc_fn, hc_scale, hc_base, pre, post, comb.view(m, HC * HC), mix_arg,
                      int(sinkhorn_iters), float(rms_eps), float(hc_eps))
    return pre, post, comb


def _fake(x, hc_fn, hc_scale, hc_base, sinkhorn_iters=20, rms_eps=1e-6, hc_eps=1e-6):
    m = x.shape[0]
    return (x.new_empty(m, HC, dtype=torch.float32), x.new_empty(m, HC, dtype=torch.float32),
            x.new_empty(m, HC, HC, dtype=torch.float32))


@custom_op("hc_mix_sinkhorn", mutates_args=(), fake=_fake)
def hc_mix_sinkhorn(x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                    sinkhorn_iters: int = 20, rms_eps: float = 1e-6, hc_eps: float = 1e-6
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mHC pre/post/comb coefficients of each row (DeepSeek mHC, arXiv 2512.24880; seed 001).

    Args:
        x: ``[M, K]`` bfloat16 CUDA tensor, rows 16-byte aligned, K a multiple of 64, M >= 0.
        hc_fn: ``[24, K]`` float32 (mix weights: 4 pre, 4 post, 16 comb), last dim contiguous.
        hc_scale: ``[3]`` float32 (pre, post, comb scales).  hc_base: ``[24]`` float32 biases.
        sinkhorn_iters: Sinkhorn iterations (>= 1).  rms_eps, hc_eps: see the module docstring.
    Returns:
        ``pre [M, 4]``, ``post [M, 4]``, ``comb [M, 4, 4]``, float32.  ``a = x . hc_fn^T`` is
        float32-accurate (bf16x3 tensor-core products); each row's bits are independent of M.
    Raises:
        TypeError: wrong dtype.  ValueError: wrong shape, device, alignment, K or iteration count.
    """
    _validate(x, hc_fn, hc_scale, hc_base, sinkhorn_iters)
    return _launch(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps)


def hc_mix_raw(x: torch.Tensor, hc_fn: torch.Tensor, config: HcMixConfig | None = None):
    """Testing aid: the kernel's raw ``a [M, 24]`` and ``sum x^2 [M]`` (same reduction as the op)."""
    _validate(x, hc_fn, torch.ones(3, device=x.device), torch.zeros(N_MIX, device=x.device), 1)
    m = x.shape[0]
    mix = torch.empty(max(m, 1), SP_COLS, dtype=torch.float32, device=x.device)
    if config is not None and not config.store_mix:
        config = HcMixConfig(config.m_tiles, config.warps_m, store_mix=True)
    _launch(x, hc_fn, torch.ones(3, device=x.device), torch.zeros(N_MIX, device=x.device), 1, 1e-6, 1e-6,
            mix=mix, config=config)
    return mix[:m, :N_MIX], mix[:m, N_MIX]


def hc_mix_sinkhorn_reference(x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor,
                              hc_base: torch.Tensor, sinkhorn_iters: int = 20, rms_eps: float = 1e-6,
                              hc_eps: float = 1e-6, dtype: torch.dtype = torch.float64):
    """Reference of :func:`hc_mix_sinkhorn` in ``dtype`` (float64 by default; any device).

    Returns float32 ``pre [M, 4]``, ``post [M, 4]``, ``comb [M, 4, 4]`` (and computes in ``dtype``).
    """
    pre, post, comb = _reference(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, dtype)
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
