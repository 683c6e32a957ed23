"""mHC mix statistics + Sinkhorn on TMA + WGMMA (issue 7, seed 001): ``hc_mix_sinkhorn(...,
method="tma")`` (the torch op) and :func:`hc_mix_sinkhorn_tma` (with config and raw-statistics
access) run it.  GPU-validated on the H200 (against float64, its float32 emulation, batch invariance,
compute-sanitizer).  Its bits differ from the ``"walk"`` kernel's (:mod:`.hc_mix`), so the caller
picks one method for every call.

Same math and outputs as :func:`.hc_mix.hc_mix_sinkhorn` (same epilogue code: sigmoids + Sinkhorn).

* The reduction order is one tree over K (:data:`TREE` = (4, 2, 2, 2, 2): 64 splits of
  ``KT / 64`` k tiles of 64 columns; a split sums its tiles from zero, every node its children from
  zero).  It does not depend on M or on who computes which node, so every row's bits are the same
  for every M (batch invariant).
* The walk kernel: one CTA per (row tile of ``tile_m`` rows, tree node at ``cta_level``).  Warp 0
  (producer warpgroup, ``setmaxnreg`` low) issues TMA loads of the x tile ``[tile_m, 64]`` into a
  ``stages``-deep ``PipelineTmaAsync`` ring (128B-swizzled K-major smem) and of the float32 hc_fn tile
  ``[24, 64]`` into a second ring of the same depth.  Warps 1-3 of the producer warpgroup (the split
  warps) split each hc_fn tile into its three bf16 pieces (:func:`.hc_mix_shared._split3_bf16x2`; rows lo 0-23,
  mid 24-47, hi 48-71 of the stage's ``[72, 64]`` piece buffer, in the WGMMA's swizzle), fence the
  async proxy and arrive on the ring's full barrier, which thus completes when the x tile has landed
  and the pieces are written.  Every call reads hc_fn itself, so any change to it is seen.  Two consumer
  warpgroups issue ``wgmma m64n72k16`` (A = x, B = the pieces; bf16 in, float32 out) per k tile into
  a fresh accumulator added to float32 running sums (the per-chunk accuracy argument of
  :mod:`.hc_mix`); meanwhile each thread sums the squares of half a row of the tile from smem
  (16-byte loads).  At a split's end the pieces are combined ``(lo + mid) + hi`` in registers (the
  three pieces of a column sit in the same thread) and folded into the node totals, one register set
  per tree level below the CTA's node.  The CTA's node sums go to a ``[rows, 25]`` workspace.
* The reduction kernel, launched with programmatic dependent launch (the walk triggers it at its
  start; it waits in ``griddepcontrol.wait`` for the walk's completion and memory flush):
  ``reduce_rows`` rows per CTA, one (row, column) per thread, folds the levels above ``cta_level``,
  then one thread per row runs the epilogue.  It triggers the next launch after its wait, and the walk
  is a programmatic dependent launch as well (``pdl``): its prologue overlaps the previous kernel.
  Where one CTA walks all of K for its row tile (``cta_level = 0``: config_for's pick for M in
  12673-16896, 29569-33792, 46465-50688, ... (:func:`level_range`), e.g. 16384 and 32768) it holds the
  root sums and runs the epilogue itself (``fused_epilogue``: one kernel; M = 16384: 166.4 vs 169.6 /
  170.0 us as two kernels in the same run).
* :func:`config_for` picks ``cta_level`` from a wave model of the walk: 64 CTAs per row tile up to
  M = 256 (5 k tiles each at K = 20480), 32 at 512 ... one per row tile at M = 16384.  Where a CTA walks
  8 or more splits (M >= 2048 in the shipped picks) it pairs k tiles (``overlap``) and its producer issues
  two stages' loads back to back (``load_group``).

Measured (H200, K = 20480, us per call in a CUDA graph, the shipped code with hc_fn split in the walk;
bench/results/2026-12-02_h200_hc_mix_s35.json, two runs): M = 1 9.1-9.2, 128 9.4, 512 12.4-12.6, 4096
48.3-48.4 (82-83% of the run's copy rate), 16384 170.4-171.3; the split-K Triton baseline takes 12.1, 16.9,
28.7, 175 and 643 us at M = 1, 128, 512, 4096, 16384 (bench/results/2026-11-29_h200_hc_mix_s7.md).  With the
pieces made before the call (a design since removed: any change to hc_fn must be seen) the walk took 8.5-8.9
us at M <= 128 and 46.3 at 4096.  The walk with its math removed took 49.1 us at M = 4096: the access
pattern, not the math, sets it.  Tried and not kept (STATUS.md, sessions 6-19): 32 splits (12.5 us at M <=
128: too few CTAs), two waves of 8 CTAs per tile at M = 4096 (56 us vs one wave of 4, 51 us), 256-row
tiles (half the hc_fn L2 reads), other stage counts in 4-8 (no gain), x from registers (ldmatrix), 16-CTA
clusters, a last-CTA fused reduction with arrival counters at several CTAs per row tile (level with the two
kernels at M <= 4096).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass import BFloat16, Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup

from ..runtime.cache import compile_cached
from ..runtime.fake import fake_tensor
from ..runtime.validate import (ValidatedConfig, INT32_MAX, check_config_fields, check_int, check_outputs_disjoint,
                                check_tensor)
from . import sm90_helpers as sm90
from .hc_mix import _validate, run_compiled, split_pieces
from .hc_mix_shared import (N_MIX, N_PIECES, SMEM_LIMIT, SP_COLS, EpilogueArgs, _split3_bf16x2, fake_launch_args,
                            row_epilogue)

NAME = "hc_mix_tma"
ROWS_PER_ATOM = 128  # rows of one m step of the tiled WGMMA: an m64 atom per consumer warpgroup
N_W = N_PIECES * N_MIX  # 72 B rows: lo, mid, hi pieces of the 24 hc_fn rows
ACC_PER_ATOM = N_W // 2  # accumulator values per thread per m64 atom: (2 cols, 2 rows, 9 n8 blocks)
A_PER_ATOM = N_MIX // 2  # of those, one piece of the 24 columns (n8 blocks 0-2)
L2_EVICT_FIRST = 0x12F0000000000000  # TMA L2 cache-policy words (CUTLASS cute/arch/copy_sm90_desc.hpp)
L2_EVICT_LAST = 0x14F0000000000000
TREE = (4, 2, 2, 2, 2)  # the shipped reduction tree of K: 64 splits (5 k tiles each at K = 20480)
SPLIT_WARPS = 3  # producer warpgroup warps 1-3: split each float32 hc_fn tile into the bf16 pieces
SPLIT_THREADS = 32 * SPLIT_WARPS
VEC = 8  # columns per split item: two 16-byte float32 loads, one 16-byte bf16 store per piece
MIN_PRODUCER_REGS = 32  # the split warps' code: R0-R35 at 40 registers, no spills at 32, 24 B of stack at 24
# the walk's threads: one producer warpgroup (warp 0: TMA; warps 1-3: the split warps) and two consumer warpgroups
CONSUMER_WGS = 2
NUM_CONSUMER_THREADS = 128 * CONSUMER_WGS
NUM_THREADS = 128 + NUM_CONSUMER_THREADS
CONSUMERS_BARRIER = 1  # the consumers' named barrier (0 is __syncthreads)
# the most a consumer thread can get beside a producer warpgroup at MIN_PRODUCER_REGS: (64512 - 128 * 32) / 256 =
# 236, rounded down to setmaxnreg's multiple of 8 (sm90.register_pool of the 384-thread CTA)
MAX_CONSUMER_REGS = (sm90.register_pool(NUM_THREADS) - 128 * MIN_PRODUCER_REGS) // NUM_CONSUMER_THREADS // 8 * 8


@dataclass(frozen=True)
class HcMixTmaConfig(ValidatedConfig):
    """``tile_m`` rows per row tile (128 or 256: one or two m64 atoms per consumer warpgroup),
    ``tile_k`` columns per TMA stage (64 bf16 = one 128-byte swizzle row), ``stages`` ring depth.

    ``tree`` (part of the reduction order, so of the bits): K's ``KT`` k tiles are cut into ``n =
    prod(tree)`` splits (split ``s``: tiles ``[s * KT // n, (s + 1) * KT // n)``), the leaves of a tree
    with fan-outs ``tree`` (root first).  A split's tiles are summed in order from zero (float32
    running sums, pieces combined ``(lo + mid) + hi`` at its end), every inner node sums its
    children in order from zero.  ``cta_level`` (not part of the bits) says which nodes the walk's
    CTAs take: the nodes ``cta_level`` levels below the root (``prod(tree[:cta_level])`` CTAs per row
    tile, each folding its subtree in registers and writing the node's sums to a workspace); the
    reduction kernel folds the levels above.  0 = one CTA walks all of K; ``len(tree)`` = one CTA per
    split.  :func:`config_for` picks it per M from a wave model.

    ``overlap`` (k tiles in pairs, the second's WGMMAs in flight while the first is added; a split's
    odd last tile runs alone; same bits; :func:`config_for` sets it where a CTA walks 8 or more splits,
    ``cta_level <= 2``: e.g. M = 2048, 4096, 16384),
    ``load_group`` (the producer waits for this many free stages, then issues their x tiles back to back, so a
    row's ``64 * load_group`` columns (``128 * load_group`` bytes) reach DRAM together; 1: a stage at a time;
    below ``stages`` with ``overlap``, whose consumers hold one stage while they wait for the next; same bits;
    :func:`config_for` sets 2 with ``overlap``: measured on an H100 in session 68, whole op, 64.6 vs 65.3 us at
    M = 4096, 236 vs 242 at 16384, 36.0 vs 36.2 at 2048; at M = 512 it was slower, 14.9 vs 14.7, and 3 was
    slower everywhere),
    ``l2_hints`` (TMA L2 eviction hints: x, read once, evict-first; the float32 hc_fn tiles, re-read by
    every row tile, evict-last; measured with the pieces loaded instead (session 7): 1.5 us faster at M =
    2048 and 4096, no change at M <= 1024),
    ``pdl`` (the walk is a programmatic dependent launch too: its launch and prologue overlap the
    previous kernel's tail, e.g. the previous call's reduction kernel, which triggers it once its own wait
    is over, or a ``fused_epilogue`` walk as it starts; it waits in
    ``griddepcontrol.wait`` before its first global-memory access, so the order is that of the stream),
    ``reduce_rows`` (rows per CTA of the reduction kernel, 8, 16 or 32: one thread per (row, column)
    sum, so a sum's loads issue together; then one thread per row runs the epilogue, so more rows
    fill that warp; :func:`config_for` picks 8 or 16),
    ``producer_regs`` / ``consumer_regs`` (the setmaxnreg split of the 384 threads, one CTA per SM;
    ``consumer_regs = 0``, the default, takes :meth:`min_consumer_regs`),
    ``fused_epilogue`` (one kernel: with one CTA per row tile, ``cta_level = 0``, the CTA's node sums are
    the root's, so its consumer threads run the epilogue themselves, one thread per row, and there
    is no reduction kernel; refused at other levels, whose node sums need another CTA's; same bits;
    :func:`config_for` sets it where it picks level 0),
    ``store_mix`` (also write the raw ``[a, sum x^2]`` rows)."""

    tile_m: int = 128
    tile_k: int = 64
    stages: int = 6
    tree: tuple = TREE
    cta_level: int = len(TREE)
    overlap: bool = False
    l2_hints: bool = True
    load_group: int = 1
    pdl: bool = True
    reduce_rows: int = 8
    producer_regs: int = 40
    consumer_regs: int = 0
    fused_epilogue: bool = False
    store_mix: bool = False

    @property
    def m_atoms(self) -> int:
        """64-row WGMMA atoms per consumer warpgroup."""
        return self.tile_m // ROWS_PER_ATOM

    @property
    def n_splits(self) -> int:
        """Splits of K (the leaves of the reduction tree)."""
        return math.prod(self.tree)

    @property
    def ctas_per_tile(self) -> int:
        """Walk CTAs per row tile (and partials per row in the workspace)."""
        return math.prod(self.tree[:self.cta_level])

    @property
    def subtree(self) -> tuple:
        """Fan-outs of the tree below a CTA's node (empty: the CTA walks one split)."""
        return self.tree[self.cta_level:]

    @property
    def splits_per_cta(self) -> int:
        """Splits under one CTA's node."""
        return math.prod(self.subtree)

    @property
    def reduce_threads(self) -> int:
        """Threads of a reduction CTA: one per (row, column) sum, rounded up to whole warps."""
        return -(-self.reduce_rows * SP_COLS // 32) * 32

    @property
    def consumer_registers(self) -> int:
        """The consumers' setmaxnreg count: ``consumer_regs``, or :meth:`min_consumer_regs` for 0."""
        return self.consumer_regs or self.min_consumer_regs()

    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes() + 2048

    def stage_bytes(self) -> int:
        """Shared memory per ring stage: the x tile and the pieces (bf16), the float32 hc_fn tile, four
        mbarriers (the node sums at the end alias the x ring)."""
        return (self.tile_m + N_W) * self.tile_k * 2 + N_MIX * self.tile_k * 4 + 32

    def validate(self) -> None:
        check_config_fields(self)  # (exact ints and bools, as every kernel config)
        if type(self.tree) is not tuple:
            raise TypeError(f"tree={self.tree!r}: must be a tuple of fan-outs")
        if any(type(f) is not int for f in self.tree):
            raise TypeError(f"tree={self.tree}: fan-outs must be ints")
        if not self.tree or any(f not in (1, 2, 4, 8, 16) for f in self.tree):
            raise ValueError(f"tree={self.tree}: fan-outs must be 1, 2, 4, 8 or 16")
        if self.n_splits > 128:
            raise ValueError(f"tree={self.tree}: at most 128 splits (got {self.n_splits})")
        if not 0 <= self.cta_level <= len(self.tree):
            hint = (f" (the default, {len(TREE)}, is the shipped tree's leaves: set it with another tree)"
                    if self.cta_level == len(TREE) and self.tree != TREE else "")
            raise ValueError(f"cta_level={self.cta_level}: must be in [0, len(tree) = {len(self.tree)}]{hint}")
        if self.tile_m not in (128, 256):
            raise ValueError(f"tile_m={self.tile_m}: must be 128 or 256 (one or two m64 atoms per consumer warpgroup)")
        if self.overlap and self.m_atoms != 1:
            raise ValueError("overlap (two accumulators) needs tile_m=128: at tile_m=256 a consumer thread holds "
                             "two m64 atoms of running sums and two accumulators (3 x 36 float32 each), past the "
                             f"{MAX_CONSUMER_REGS} registers it can have")
        if self.tile_k != 64:
            raise ValueError(f"tile_k={self.tile_k}: must be 64 (one 128-byte swizzle row of bf16)")
        if self.fused_epilogue and self.cta_level != 0:
            raise ValueError(f"fused_epilogue needs cta_level=0 (one CTA per row tile), got {self.cta_level}: at "
                             "other levels a row's sums are folded from several CTAs by the reduction kernel")
        if not 2 <= self.stages <= 8:
            raise ValueError(f"stages={self.stages}: must be in [2, 8]")
        if not 1 <= self.load_group <= self.stages:
            raise ValueError(f"load_group={self.load_group}: must be in [1, stages = {self.stages}]")
        if self.overlap and self.load_group == self.stages:
            raise ValueError(f"load_group={self.load_group} with overlap: must be below stages = {self.stages} (a "
                             "consumer holds a pair's first stage until the second lands, so a group of every stage "
                             "would wait for it while it waits for the group: a hang)")
        if self.reduce_rows not in (8, 16, 32):
            raise ValueError(f"reduce_rows={self.reduce_rows}: must be 8, 16 or 32")
        need = self.min_consumer_regs()
        if need > MAX_CONSUMER_REGS:
            remedies = [r for r, applies in (("tile_m=128", self.m_atoms > 1), ("overlap=False", self.overlap),
                                             ("a higher cta_level (a smaller subtree per CTA)",
                                              self.cta_level < len(self.tree))) if applies]
            raise ValueError(f"tile_m={self.tile_m}, overlap={self.overlap}, cta_level={self.cta_level} of tree="
                             f"{'x'.join(map(str, self.tree))}: needs about {need} registers per consumer thread, "
                             f"more than the {MAX_CONSUMER_REGS} a 384-thread CTA can give: use "
                             f"{' or '.join(remedies) if remedies else 'tile_m=128 and overlap=False'}")
        regs = self.consumer_registers
        if self.producer_regs < MIN_PRODUCER_REGS:
            raise ValueError(f"producer_regs={self.producer_regs}: the split warps (producer warpgroup warps 1-3) "
                             f"need >= {MIN_PRODUCER_REGS} (spills below)")
        # setmaxnreg's range, the CTA's pool, producer <= consumer
        sm90.check_register_split(self.producer_regs, regs, CONSUMER_WGS)
        if regs < need:
            raise ValueError(f"consumer_regs={regs}: this config needs >= {need} (spills below)")
        if self.smem_bytes() > SMEM_LIMIT:
            most = (SMEM_LIMIT - 2048) // self.stage_bytes()
            raise ValueError(f"{self}: needs {self.smem_bytes()} B of shared memory (> {SMEM_LIMIT}): at most "
                             f"{most} stages fit at tile_m={self.tile_m}")

    def min_consumer_regs(self) -> int:
        """A conservative register count per consumer thread (the CPU tests compile every config that
        :func:`config_for` returns, and others, at it without spills; ptxas needed 16-24 fewer): 36
        running sums and 36 per accumulator per m atom, 13 totals per level of the CTA's subtree, its
        own node included, per m atom, 40 for addresses."""
        per_atom = 36 * (3 if self.overlap else 2) + 13 * (len(self.subtree) + 1)
        return -(-(per_atom * self.m_atoms + 40) // 8) * 8


def smem_layouts(config: HcMixTmaConfig):
    """The walk's smem rings (DSL objects; call inside a trace): ``sX (tile_m, tile_k, stages)`` (x tiles)
    and ``sW (72, tile_k, stages)`` (hc_fn pieces), 128B-swizzled K-major bf16, the WGMMA operands; ``sWf
    (24, tile_k, stages)``, the float32 hc_fn tiles as TMA lands them (row-major, unswizzled: read once by
    the split warps).  The kernel and :func:`cute_kernels.layouts.kernel_layouts.hc_mix_tma_layouts` both
    build them here."""
    return (sm90.smem_layout(BFloat16, config.tile_m, config.tile_k, config.stages),
            sm90.smem_layout(BFloat16, N_W, config.tile_k, config.stages),
            cute.make_layout((N_MIX, config.tile_k, config.stages),
                             stride=(config.tile_k, 1, N_MIX * config.tile_k)))


def swizzled_vector(row, vec):
    """Where the 128B swizzle of :func:`smem_layouts`' bf16 rings puts 16-byte vector ``vec`` (0-7) of a
    128-byte row ``row`` (rows of 1024-byte aligned stages): position ``vec ^ (row % 8)`` of that row.  The split
    warps write the pieces there, the squares read x from there (works on ints and on the DSL's Int32)."""
    return vec ^ (row % 8)


class WalkOperands(NamedTuple):
    """What every k tile of a consumer's walk reads (:meth:`HcMixTmaKernel.walk_split`; made once in
    :meth:`HcMixTmaKernel.mma`)."""

    tiled_mma: Any
    tCrX: Any  # x's WGMMA fragments, per stage
    tCrW: Any  # hc_fn pieces', per stage
    sXv: Any  # the x ring as 16-byte vectors (the squares)
    ring: Any  # the x tile + bf16 pieces ring (the float32 hc_fn tiles go through w_ring)
    ctidx: Any  # thread index among the consumers
    k_tiles: Any
    kt_begin: Any  # this CTA's first k tile


def make_tiled_mma():
    """The consumers' WGMMA: two m64 warpgroup atoms, n = 72 (the three pieces of 24 columns), bf16 in,
    float32 out, both operands K-major (DSL object; call inside a trace)."""
    return sm90_utils.make_trivial_tiled_mma(
        BFloat16, BFloat16, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
        atom_layout_mnk=(2, 1, 1), tiler_mn=(64, N_W))


class HcMixTmaKernel:
    """The walk (warp-specialized TMA producer + two WGMMA consumer warpgroups; one CTA per row tile and
    node of the K tree at ``config.cta_level``) and the reduction kernel (the levels above, then the
    epilogue).  The per-row epilogue (sigmoids, Sinkhorn) is the walk kernel's, :func:`.hc_mix_shared.row_epilogue`."""

    def __init__(self, config: HcMixTmaConfig):
        self.config = config
        self.stages = config.stages
        self.tile_k = config.tile_k
        self.tile_m = config.tile_m
        self.threads = NUM_THREADS
        self.num_consumers = NUM_CONSUMER_THREADS

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mScale: cute.Tensor, mBase: cute.Tensor,
                 mPre: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor, mMix: cute.Tensor,
                 sinkhorn_iters: Int32, rms_eps: Float32, hc_eps: Float32, mPart: cute.Tensor, stream):
        """Launch the walk and the reduction kernel after it on the same stream (a programmatic
        dependent launch), or with ``fused_epilogue`` the walk alone.  ``mPart``: ``[workspace_rows, 25]``
        float32 workspace (the walk's node sums; untouched with ``fused_epilogue``)."""
        epi = EpilogueArgs(mScale, mBase, mPre, mPost, mComb, mMix, sinkhorn_iters, rms_eps, hc_eps)
        self.launch_walk(mX, mW, mPart, epi, stream)
        if cutlass.const_expr(not self.config.fused_epilogue):
            self.launch_reduce(mX, mScale, mBase, mPre, mPost, mComb, mMix, sinkhorn_iters, rms_eps, hc_eps, mPart,
                               stream)

    @cute.jit
    def launch_walk(self, mX: cute.Tensor, mW: cute.Tensor, mPart: cute.Tensor, epi, stream):
        """The walk: TMA atoms, shared storage, one CTA per (tree node at ``cta_level``, row tile);
        ``epi``: the epilogue's tensors and scalars, an :class:`.hc_mix_shared.EpilogueArgs` (``fused_epilogue``;
        launch arguments, spread)."""
        tiled_mma = make_tiled_mma()
        sX_layout, sW_layout, sWf_layout = smem_layouts(self.config)
        tma_atom_X, tma_X = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mX, cute.select(sX_layout, mode=[0, 1]), (self.tile_m, self.tile_k))
        tma_atom_W, tma_W = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mW, cute.select(sWf_layout, mode=[0, 1]), (N_MIX, self.tile_k))
        self.x_bytes = cute.size_in_bytes(BFloat16, cute.select(sX_layout, mode=[0, 1]))
        self.w_bytes = cute.size_in_bytes(Float32, cute.select(sWf_layout, mode=[0, 1]))

        @cute.struct
        class SharedStorage:
            mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 4]  # (full, empty) of the ring, of the w ring
            sX: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sX_layout)], 1024]
            sW: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sW_layout)], 1024]
            sWf: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sWf_layout)], 128]

        self.shared_storage = SharedStorage
        grid_m = (mX.shape[0] + self.tile_m - 1) // self.tile_m
        self.kernel(tma_X, tma_W, tma_atom_X, tma_atom_W, tiled_mma, sX_layout, sW_layout, sWf_layout, mX, mPart,
                    *epi).launch(grid=[self.config.ctas_per_tile, grid_m, 1], block=[self.threads, 1, 1],
                                 stream=stream, min_blocks_per_mp=1, use_pdl=self.config.pdl)

    @cute.jit
    def launch_reduce(self, mX: cute.Tensor, mScale: cute.Tensor, mBase: cute.Tensor, mPre: cute.Tensor,
                      mPost: cute.Tensor, mComb: cute.Tensor, mMix: cute.Tensor, sinkhorn_iters: Int32,
                      rms_eps: Float32, hc_eps: Float32, mPart: cute.Tensor, stream):
        """The reduction kernel (a programmatic dependent launch after the walk): ``reduce_rows`` rows per CTA."""
        self.reduce_kernel(mPart, mX.shape[0], mX.shape[1], mScale, mBase, mPre, mPost, mComb, mMix,
                           sinkhorn_iters, rms_eps, hc_eps).launch(
            grid=[(mX.shape[0] + self.config.reduce_rows - 1) // self.config.reduce_rows, 1, 1],
            block=[self.config.reduce_threads, 1, 1],
            stream=stream, use_pdl=True)

    # ------------------------------------------------------------------ kernel
    @cute.kernel
    def kernel(self, tma_X: cute.Tensor, tma_W: cute.Tensor, tma_atom_X: cute.CopyAtom, tma_atom_W: cute.CopyAtom,
               tiled_mma: cute.TiledMma, sX_layout: cute.ComposedLayout, sW_layout: cute.ComposedLayout,
               sWf_layout: cute.Layout, mX: cute.Tensor, mPart: cute.Tensor, mScale: cute.Tensor, mBase: cute.Tensor,
               mPre: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor, mMix: cute.Tensor, sinkhorn_iters: Int32,
               rms_eps: Float32, hc_eps: Float32):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        node, m_block, _ = cute.arch.block_idx()  # node: this CTA's node of the K tree (at cta_level)
        # the reduction kernel (fused_epilogue: the next call's walk) may launch; it waits for our completion
        cute.arch.griddepcontrol_launch_dependents()
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_atom_X)
            cpasync.prefetch_descriptor(tma_atom_W)
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        # ring: a stage is full once its x tile has landed and the split warps have written its pieces
        ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1 + SPLIT_WARPS),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_consumers // 32),
            tx_count=self.x_bytes, defer_sync=True)
        # w ring: the float32 hc_fn tiles, TMA to the split warps
        w_ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar.data_ptr() + 2 * self.stages, num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, SPLIT_WARPS),
            tx_count=self.w_bytes, defer_sync=True)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if cutlass.const_expr(self.config.pdl):
            cute.arch.griddepcontrol_wait()  # the stream's earlier kernels done: x, hc_fn, the workspace free
        sX = storage.sX.get_tensor(sX_layout.outer, swizzle=sX_layout.inner)
        sW = storage.sW.get_tensor(sW_layout.outer, swizzle=sW_layout.inner)
        sWf = storage.sWf.get_tensor(sWf_layout)
        # the CTA's node sums (rows x (24 + 1)) alias the x ring once every tile has been consumed
        sP = cute.make_tensor(cute.recast_ptr(storage.sX.data_ptr(), dtype=Float32),
                              cute.make_layout((self.tile_m, SP_COLS), stride=(SP_COLS, 1)))

        x_vectors = cute.cosize(sX_layout) // 8
        k_tiles = (mX.shape[1] + self.tile_k - 1) // self.tile_k
        split_begin = node * self.config.splits_per_cta
        kt_begin = self.split_tile(split_begin, k_tiles)
        kt_end = self.split_tile(split_begin + self.config.splits_per_cta, k_tiles)
        if warp_idx < 4:  # the producer warpgroup
            cute.arch.setmaxregister_decrease(self.config.producer_regs)
            if warp_idx == 0:
                self.load(tma_X, tma_W, tma_atom_X, tma_atom_W, sX, sWf, ring, w_ring, m_block, kt_begin, kt_end)
            else:
                # sW as 16-byte vectors (8 bf16), unswizzled: (element, vector) for the pieces' stores
                sWv = cute.make_tensor(storage.sW.data_ptr(), cute.make_layout((VEC, cute.cosize(sW_layout) // VEC),
                                                                                stride=(1, VEC)))
                self.split(sWf, sWv, ring, w_ring, kt_begin, kt_end, tidx - 32)
        else:
            cute.arch.setmaxregister_increase(self.config.consumer_registers)
            # the x ring as 16-byte vectors (8 bf16), unswizzled: (element, vector) for the squares
            sXv = cute.make_tensor(storage.sX.data_ptr(), cute.make_layout((8, x_vectors), stride=(1, 8)))
            self.mma(tiled_mma, sX, sW, sXv, sP, ring, tidx - 128, split_begin, k_tiles)
            if cutlass.const_expr(self.config.fused_epilogue):  # one CTA per row tile: sP holds the root sums
                epi = EpilogueArgs(mScale, mBase, mPre, mPost, mComb, mMix, sinkhorn_iters, rms_eps, hc_eps)
                self.tile_epilogue(sP, m_block, tidx - 128, mX.shape[0], mX.shape[1], epi)
            else:
                self.store_partials(sP, mPart, m_block, node, tidx - 128)

    def split_tile(self, split, k_tiles):
        """The first k tile of ``split`` (``k_tiles`` for ``split == n_splits``)."""
        return split * k_tiles // self.config.n_splits

    # ------------------------------------------------------------------ roles
    @cute.jit
    def load(self, tma_X, tma_W, tma_atom_X, tma_atom_W, sX, sWf, ring, w_ring, m_block, kt_begin, kt_end):
        """Producer warp: per k tile of this CTA, in order, the x tile into the ring and the float32 hc_fn
        tile into the w ring (both rings step together: one state).

        The w ring's load of a stage waits for the ring's empty barrier first (``ring.producer_acquire``):
        that is what keeps the split warps (who write the stage's pieces once this load lands) from
        overwriting pieces the consumers' WGMMAs still read.  Keep that order and the two rings' depths
        equal: a w load issued earlier, or a deeper w ring, would let the split warps run ahead of the
        consumers' release."""
        gX = cute.local_tile(tma_X, (self.tile_m, self.tile_k), (m_block, None))  # (tile_m, 64, k tiles)
        gW = cute.local_tile(tma_W, (N_MIX, self.tile_k), (0, None))  # (24, 64, k tiles)
        tXsX, tXgX = cpasync.tma_partition(tma_atom_X, 0, cute.make_layout(1),
                                           cute.group_modes(sX, 0, 2), cute.group_modes(gX, 0, 2))
        tWsW, tWgW = cpasync.tma_partition(tma_atom_W, 0, cute.make_layout(1),
                                           cute.group_modes(sWf, 0, 2), cute.group_modes(gW, 0, 2))
        hints_x, hints_w = {}, {}
        if cutlass.const_expr(self.config.l2_hints):  # CUTLASS's CacheHintSm90 policy words
            hints_x = dict(cache_policy=cutlass.Int64(L2_EVICT_FIRST))
            hints_w = dict(cache_policy=cutlass.Int64(L2_EVICT_LAST))
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        group = self.config.load_group
        grouped_end = kt_begin + (kt_end - kt_begin) // group * group
        for kt in cutlass.range(kt_begin, grouped_end, group, unroll=1):
            free = state.clone()  # the group's stages, each acquired (both rings) before any of its loads issue
            for _ in cutlass.range_constexpr(group):
                ring.producer_acquire(free)
                w_ring.producer_acquire(free)
                free.advance()
            for g in cutlass.range_constexpr(group):
                self.load_tile(tma_atom_X, tma_atom_W, tXgX, tXsX, tWgW, tWsW, ring, w_ring, state, kt + g,
                               hints_x, hints_w)
                state.advance()
        for kt in cutlass.range(grouped_end, kt_end, unroll=1):  # the last tiles, fewer than a group
            ring.producer_acquire(state)
            w_ring.producer_acquire(state)
            self.load_tile(tma_atom_X, tma_atom_W, tXgX, tXsX, tWgW, tWsW, ring, w_ring, state, kt, hints_x, hints_w)
            state.advance()

    def load_tile(self, tma_atom_X, tma_atom_W, tXgX, tXsX, tWgW, tWsW, ring, w_ring, state, kt, hints_x, hints_w):
        """Producer warp: k tile ``kt``'s x tile and float32 hc_fn tile into ``state``'s (acquired) stage."""
        cute.copy(tma_atom_X, tXgX[None, kt], tXsX[None, state.index], tma_bar_ptr=ring.producer_get_barrier(state),
                  **hints_x)
        cute.copy(tma_atom_W, tWgW[None, kt], tWsW[None, state.index],
                  tma_bar_ptr=w_ring.producer_get_barrier(state), **hints_w)

    @cute.jit
    def split(self, sWf, sWv, ring, w_ring, kt_begin, kt_end, stidx):
        """Split warps (producer warpgroup warps 1-3, ``stidx`` in [0, 96)): per k tile, each float32 hc_fn
        value into its three bf16 pieces (:func:`.hc_mix_shared._split3_bf16x2`, the walk's split: same values as
        :func:`.hc_mix.split_pieces`), written into the stage's ``sW`` in the WGMMA's 128B swizzle.  Thread
        ``t`` takes items ``t`` and ``t + 96`` of the tile's 24 x 8 (row, 8 columns); a piece's 8 columns are
        one 16-byte vector, stored at :func:`swizzled_vector` ``(row, chunk)`` of its 128-byte row (72-row,
        1024-byte aligned stages), so 8 lanes of a row fill one row: no bank conflicts (the float32 reads, 32
        bytes apart per lane, are 2-way: a few cycles per tile, off the consumers' path).  Then the proxy fence (WGMMA
        reads what ordinary stores wrote), the warp's sync and lane 0's arrive on the stage's full barrier.  The
        stage's pieces are free to overwrite because its float32 tile was loaded only after the ring's
        empty barrier (:meth:`load`)."""
        lane = cute.arch.lane_idx()
        chunks = self.tile_k // VEC
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for kt in cutlass.range(kt_begin, kt_end, unroll=1):
            w_ring.consumer_wait(state)
            for i in cutlass.range_constexpr(N_MIX * chunks // SPLIT_THREADS):
                item = stidx + i * SPLIT_THREADS
                row = item // chunks
                chunk = item - row * chunks
                rW = cute.make_rmem_tensor(VEC, Float32)
                rW4 = cute.zipped_divide(rW, (4,))
                sRow = cute.zipped_divide(cute.local_tile(sWf[row, None, state.index], (VEC,), (chunk,)), (4,))
                for h in cutlass.range_constexpr(2):
                    cute.autovec_copy(sRow[None, h], rW4[None, h])
                rPieces = [cute.make_rmem_tensor(VEC // 2, Int32) for _ in range(N_PIECES)]
                for j in cutlass.range_constexpr(VEC // 2):
                    rPieces[0][j], rPieces[1][j], rPieces[2][j] = _split3_bf16x2(rW[2 * j], rW[2 * j + 1])
                for p in cutlass.range_constexpr(N_PIECES):
                    vec = (state.index * N_W + p * N_MIX + row) * chunks + swizzled_vector(row, chunk)
                    cute.autovec_copy(cute.recast_tensor(rPieces[p], BFloat16), sWv[None, vec])
            cute.arch.sync_warp()
            w_ring.consumer_release(state)  # the float32 tile is read
            cute.arch.fence_view_async_shared()
            cute.arch.sync_warp()
            if lane == 0:
                cute.arch.mbarrier_arrive(ring.producer_get_barrier(state))
            state.advance()

    @cute.jit
    def mma(self, tiled_mma, sX, sW, sXv, sP, ring, ctidx, split_begin, k_tiles):
        """Consumers: the CTA's subtree of splits (:meth:`walk_node`), then its node sums into ``sP``
        (rows x (24 + 1))."""
        wg_idx = cute.arch.make_warp_uniform(ctidx // 128)
        wg_mma = tiled_mma.get_slice(cute.make_layout(CONSUMER_WGS, stride=128)(wg_idx))
        thr_mma = tiled_mma.get_slice(ctidx)
        tCrX = wg_mma.make_fragment_A(wg_mma.partition_A(sX))
        tCrW = wg_mma.make_fragment_B(wg_mma.partition_B(sW))
        self.acc_shape = tiled_mma.partition_shape_C((self.tile_m, N_W))  # static: kept on self (trace time)
        w = WalkOperands(tiled_mma, tCrX, tCrW, sXv, ring, ctidx, k_tiles, self.split_tile(split_begin, k_tiles))
        run = cute.make_rmem_tensor(self.acc_shape, Float32)
        run.fill(0.0)
        sq = cute.make_rmem_tensor((self.config.m_atoms,), Float32)
        sq.fill(0.0)
        # tot[d]: the sums (12 a values + the row's sum of squares per m atom) of the node being walked
        # at depth d below the CTA's node (depth 0: the CTA's node)
        depth = len(self.config.subtree)
        tot = cute.make_rmem_tensor((depth + 1, self.config.m_atoms * (A_PER_ATOM + 1)), Float32)
        tot.fill(0.0)
        rX = cute.make_rmem_tensor((8,), BFloat16)
        self.walk_node(w, run, sq, tot, rX, 0, split_begin)
        # every consumer is done with the ring (and every TMA load has landed): sP may alias sX
        cute.arch.barrier(barrier_id=CONSUMERS_BARRIER, number_of_threads=self.num_consumers)
        self.store_totals(sP, tot, thr_mma, ctidx)

    @cute.jit
    def walk_node(self, w, run, sq, tot, rX, d: cutlass.Constexpr, split):
        """Sum the node at depth ``d`` below the CTA's node, whose first split is ``split``, into
        ``tot[d]`` (zero on entry): a split walks its k tiles (:meth:`walk_split`), an inner node sums
        its children in order from zero (each child into ``tot[d + 1]``, added, cleared)."""
        if cutlass.const_expr(d == len(self.config.subtree)):
            self.walk_split(w, run, sq, rX, split)
            self.close_split(run, sq, tot, d)
        else:
            span = math.prod(self.config.subtree[d + 1:])  # splits per child
            for c in cutlass.range(self.config.subtree[d], unroll=1):
                self.walk_node(w, run, sq, tot, rX, d + 1, split + c * span)
                for i in cutlass.range_constexpr(cute.size(tot, mode=[1])):
                    tot[d, i] = tot[d, i] + tot[d + 1, i]
                    tot[d + 1, i] = Float32(0.0)

    @cute.jit
    def walk_split(self, w, run, sq, rX, split):
        """One split's k tiles into ``run`` (float32 running sums) and ``sq`` (squares); ``w``: the walk's
        fixed arguments (:class:`WalkOperands`).  Per tile, WGMMA into a fresh accumulator, squares meanwhile,
        then the running sums (``overlap``: tiles in pairs, the second's WGMMAs in flight while the first
        is added; the same order, so the same bits)."""
        t_begin = self.split_tile(split, w.k_tiles)
        t_end = self.split_tile(split + 1, w.k_tiles)
        # pipeline states come from t's position in this CTA's walk: a PipelineState advanced inside
        # these nested loops does not carry out of them (measured: the consumers then wait on a wrong
        # phase and the walk hangs from the second split on)
        t0 = t_begin - w.kt_begin
        n = t_end - t_begin
        if cutlass.const_expr(not self.config.overlap):
            for t in cutlass.range(t0, t0 + n, unroll=1):
                self.single_tile(w, run, sq, rX, t)
        else:
            # k tiles in pairs: tile t + 1's WGMMAs run while tile t's result is added; accumulators are
            # made per pair (see issue()); an odd count ends with one tile alone
            for t in cutlass.range(t0, t0 + n - n % 2, 2, unroll=1):
                acc = cute.make_rmem_tensor(self.acc_shape, Float32)
                acc_next = cute.make_rmem_tensor(self.acc_shape, Float32)
                first, second = self.consumer_state(t), self.consumer_state(t + 1)
                self.begin_tile(w, acc, sq, rX, first)
                self.begin_tile(w, acc_next, sq, rX, second)
                warpgroup.wait_group(1)
                w.ring.consumer_release(first)
                self.accumulate(run, acc)
                warpgroup.wait_group(0)
                w.ring.consumer_release(second)
                self.accumulate(run, acc_next)
            if n % 2 == 1:
                self.single_tile(w, run, sq, rX, t0 + n - 1)

    @cute.jit
    def single_tile(self, w, run, sq, rX, t):
        """Tile ``t`` of this CTA's walk on its own: wait, WGMMA into a fresh accumulator with the squares
        meanwhile, wait for the WGMMAs, free the stage, add to the running sums."""
        acc = cute.make_rmem_tensor(self.acc_shape, Float32)
        state = self.consumer_state(t)
        self.begin_tile(w, acc, sq, rX, state)
        warpgroup.wait_group(0)
        w.ring.consumer_release(state)
        self.accumulate(run, acc)

    @cute.jit
    def close_split(self, run, sq, tot, d: cutlass.Constexpr):
        """End of a split: ``tot[d] = (lo + mid) + hi`` of its running sums (the three pieces of a
        column sit in the same thread: WGMMA n8 blocks ``b``, ``b + 3``, ``b + 6``; ``tot[d]`` is zero,
        so adding is the fold from zero), and half 0 + half 1 of its squares (the row's other half from
        the neighbour lane; a + b = b + a, so both lanes hold the same bits); ``run`` and ``sq`` restart
        from zero."""
        for m in cutlass.range_constexpr(self.config.m_atoms):
            t0 = m * (A_PER_ATOM + 1)
            for i in cutlass.range_constexpr(A_PER_ATOM):
                lo = m * ACC_PER_ATOM + i  # fragment ((2 cols, 2 rows, 9 n8 blocks), m atom): blocks 0-2 = lo
                tot[d, t0 + i] = tot[d, t0 + i] + ((run[lo] + run[lo + A_PER_ATOM]) + run[lo + 2 * A_PER_ATOM])
            other = cute.arch.shuffle_sync_bfly(sq[m], offset=1)
            tot[d, t0 + A_PER_ATOM] = tot[d, t0 + A_PER_ATOM] + (sq[m] + other)
        run.fill(0.0)
        sq.fill(0.0)

    @cute.jit
    def store_totals(self, sP, tot, thr_mma, ctidx):
        """The CTA's node sums ``tot[0]`` (the thread's 12 ``a`` values per m atom; the even lane of a
        pair its row's sum of squares) into ``sP``; returns after every consumer has written."""
        tCcP = thr_mma.partition_C(cute.make_identity_tensor((self.tile_m, N_W)))
        for m in cutlass.range_constexpr(self.config.m_atoms):
            t0 = m * (A_PER_ATOM + 1)
            for i in cutlass.range_constexpr(A_PER_ATOM):
                r, c = tCcP[m * ACC_PER_ATOM + i]
                sP[r, c] = tot[0, t0 + i]
            if ctidx % 2 == 0:
                sP[m * ROWS_PER_ATOM + ctidx // 2, N_MIX] = tot[0, t0 + A_PER_ATOM]
        cute.arch.barrier(barrier_id=CONSUMERS_BARRIER, number_of_threads=self.num_consumers)

    @cute.jit
    def begin_tile(self, w, acc, sq, rX, state):
        """Wait for the k tile at ``state``, issue its WGMMAs into ``acc`` and add its squares while
        they run (the caller waits for the WGMMAs and frees the stage)."""
        w.ring.consumer_wait(state)
        self.issue(w.tiled_mma, acc, w.tCrX, w.tCrW, state.index)
        self.squares(w.sXv, sq, rX, state.index, w.ctidx)

    @cute.jit
    def issue(self, tiled_mma, acc, tCrX, tCrW, stage):
        """The k tile's four k16 WGMMAs (per m64 atom) into a fresh accumulator, committed, not waited on.
        Pass a tensor made in the same loop iteration: a reused one has its old values copied into
        the WGMMA's (ignored) accumulator input, a read that makes ptxas serialize WGMMAs (C7514)."""
        sm90.wgmma_gemm(tiled_mma, acc, tCrX[None, None, None, stage], tCrW[None, None, None, stage],
                        zero_init=True)

    @cute.jit
    def squares(self, sXv, sq, rX, stage, ctidx):
        """Add this k tile's squares to ``sq``: thread ``2 r + h`` sums row ``r`` (and ``r + 128``),
        columns ``32 h .. 32 h + 31``, float32, in column order, into a per-tile partial first.

        It reads 16-byte vectors: TMA's 128-byte swizzle stores vector ``v`` of row ``r`` at position
        ``v ^ (r % 8)`` of the row (:func:`swizzled_vector`), so a quarter warp (4 rows x 2 halves)
        touches 8 distinct bank groups, no conflicts."""
        vec_per_row = self.tile_k // 8
        vec0 = (ctidx % 2) * (vec_per_row // 2)
        for m in cutlass.range_constexpr(self.config.m_atoms):
            row = m * ROWS_PER_ATOM + ctidx // 2
            row_vec = (stage * self.tile_m + row) * vec_per_row
            part = Float32(0.0)
            for v in cutlass.range_constexpr(vec_per_row // 2):
                cute.autovec_copy(sXv[None, row_vec + swizzled_vector(row, vec0 + v)], rX)
                for e in cutlass.range_constexpr(8):
                    x = rX[e].to(Float32)
                    part = part + x * x
            sq[m] = sq[m] + part

    @cute.jit
    def accumulate(self, run, acc):
        for i in cutlass.range_constexpr(cute.size(acc)):
            run[i] = run[i] + acc[i]

    def consumer_state(self, t):
        """The ring position of this CTA's k tile ``t`` (consumer side)."""
        return pipeline.PipelineState(self.stages, t, t % self.stages, (t // self.stages) % 2)

    @cute.jit
    def store_partials(self, sP, mPart, m_block, node, ctidx):
        """This CTA's 25 node sums per row to its slice ``(m_block, node)`` of the workspace."""
        base = (m_block * self.config.ctas_per_tile + node) * self.tile_m
        for i in cutlass.range_constexpr((self.tile_m * SP_COLS + self.num_consumers - 1) // self.num_consumers):
            item = ctidx + i * self.num_consumers
            if item < self.tile_m * SP_COLS:
                r = item // SP_COLS
                col = item - r * SP_COLS
                mPart[base + r, col] = sP[r, col]

    @cute.jit
    def tile_epilogue(self, sA, m_block, ctidx, m: Int32, k: Int32, epi):
        """``fused_epilogue``: the epilogue (sigmoids, Sinkhorn) of the row tile's rows below M, one
        consumer thread per row (consumer thread ``i`` takes rows ``i, i + 256, ...``), from the root sums
        in ``sA`` (``tile_m x 25``)."""
        for r0 in cutlass.range_constexpr(0, self.tile_m, self.num_consumers):
            rr = r0 + ctidx
            row = m_block * self.tile_m + rr
            if rr < self.tile_m and row < m:
                row_epilogue(sA, rr, row, k, epi, self.config.store_mix)

    @cute.kernel
    def reduce_kernel(self, mPart: cute.Tensor, m: Int32, k: Int32, mScale: cute.Tensor, mBase: cute.Tensor,
                      mPre: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor, mMix: cute.Tensor,
                      sinkhorn_iters: Int32, rms_eps: Float32, hc_eps: Float32):
        """The second kernel (a programmatic dependent launch: it waits for the walk's completion and
        memory flush before reading): each CTA takes ``config.reduce_rows`` rows, one thread per (row,
        column) folds the workspace's node sums up the tree (:meth:`reduce_item`; a sum's loads issue
        together), then one thread per row runs the epilogue.  Rows past M are skipped."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        rows = self.config.reduce_rows
        sA = smem.allocate_tensor(Float32, cute.make_layout((rows, SP_COLS), stride=(SP_COLS, 1)),
                                  byte_alignment=16)
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()  # the next call's walk may launch
        row0 = bidx * rows
        self.reduce_item(mPart, sA, row0, tidx, cutlass.min(m - row0, rows) * SP_COLS)  # rows past M skipped
        cute.arch.sync_threads()
        if tidx < rows and row0 + tidx < m:
            row_epilogue(sA, tidx, row0 + tidx, k, EpilogueArgs(mScale, mBase, mPre, mPost, mComb, mMix,
                                                                sinkhorn_iters, rms_eps, hc_eps),
                         self.config.store_mix)

    @cute.jit
    def reduce_item(self, mPart, sA, row0, item, n_items):
        """``sA[r, col]`` = the root sum of row ``row0 + r``, column ``col`` (``item = r * 25 + col``):
        the workspace holds the sums of the nodes at ``cta_level``; the levels above are folded here,
        each node's children in order from zero.  Items from ``n_items`` on (rows past M) are skipped:
        at small M most of the CTA's rows are."""
        if item < n_items:
            r = item // SP_COLS
            col = item - r * SP_COLS
            row = row0 + r
            m_block = row // self.tile_m
            first = m_block * self.config.ctas_per_tile * self.tile_m + (row - m_block * self.tile_m)
            sA[r, col] = self.fold(mPart, first, col, 0, 0)

    @cute.jit
    def fold(self, mPart, first, col, d: cutlass.Constexpr, node: cutlass.Constexpr):
        """The sum of ``node`` at depth ``d`` of the tree (unrolled at trace time)."""
        if cutlass.const_expr(d == self.config.cta_level):
            return mPart[first + node * self.tile_m, col]
        total = Float32(0.0)
        for c in cutlass.range_constexpr(self.config.tree[d]):
            total = total + self.fold(mPart, first, col, d + 1, node * self.config.tree[d] + c)
        return total


NUM_SMS = 132  # H200; config_for's wave model (the bits do not depend on it)
# config_for's model: fixed cost of a wave (launch, first loads, drain) / a full-K walk; calibrated on the
# one measured pair (M = 4096: two waves of 8 CTAs per tile 56 us, one of 4 51 us: 2 (1/8 + w) = 1.098
# (1/4 + w), w = 0.027); every measured M keeps its pick (0.01 before session 7, the same picks there)
WAVE_OVERHEAD = 0.027


def config_for(m: int) -> HcMixTmaConfig:
    """The configuration for ``m`` rows: 128-row tiles, the shipped :data:`TREE`, and the CTA level that
    minimizes a wave model of the walk: with ``c`` CTAs per row tile, ``w = ceil(ceil(m / 128) * c /
    NUM_SMS)`` waves, each taking ``1 / c`` of a full-K walk plus :data:`WAVE_OVERHEAD` (fewer CTAs on
    a tie).  On 132 SMs this gives 64 CTAs per row tile up to M = 256 (5 k tiles each at K = 20480),
    32 at 512, 16 at 1024, 8 at 2048, 4 at 4096, 1 at 16384: the choices the H200 measurements
    favoured (e.g. one wave of 4 per tile beat two of 8 at M = 4096: 51 vs 56 us); M in between is
    modelled, not measured.  The reduction kernel takes 8 rows per CTA at 32 or 64 CTAs per row tile
    (each sum folds that many node sums: more CTAs share the loads) and 16 below (fuller epilogue
    warps; session 7: 47.9 vs 49.5 us at M = 4096, 9.6 vs 10.4 at M = 128 against 32 rows).  Paired k
    tiles (``overlap``) where a CTA walks 8 or more splits (``cta_level <= 2``; measured at M = 2048 and
    4096: 28.3 vs 28.6 and 48.2 vs 48.8 us; at M = 512, level 4, it was slower, 14.7 vs 13.4).  At level 0
    the walk runs the epilogue (``fused_epilogue``).  Every choice gives the same bits.
    ``m``: int >= 0 (``TypeError`` / ``ValueError`` otherwise)."""
    check_int("m", m, low=0)
    return _config_for(int(m))


CONFIG_TILE_M = 128  # config_for's row tile


def _wave_cost(row_tiles: int, level: int) -> tuple:
    """The wave model's cost of ``level`` for ``row_tiles`` row tiles, then its CTAs per row tile (the tie-break:
    fewer CTAs)."""
    c = math.prod(TREE[:level])
    waves = -(-row_tiles * c // NUM_SMS)
    return (waves * (1 / c + WAVE_OVERHEAD), c)


def _pick_level(row_tiles: int) -> int:
    """config_for's CTA level for ``row_tiles`` row tiles (at least 1): the cheapest in the wave model."""
    return min(range(len(TREE) + 1), key=lambda lv: _wave_cost(max(1, row_tiles), lv))


@functools.lru_cache(maxsize=256)
def _config_for(m: int) -> HcMixTmaConfig:
    level = _pick_level(-(-m // CONFIG_TILE_M))
    paired = level <= 2  # a CTA walks 8 or more splits: k tiles in pairs, loads issued two stages at a time
    return HcMixTmaConfig(tile_m=CONFIG_TILE_M, cta_level=level, overlap=paired, load_group=2 if paired else 1,
                          fused_epilogue=level == 0, reduce_rows=8 if math.prod(TREE[:level]) >= 32 else 16)


def level_range(m: int) -> tuple[int, int]:
    """The widest ``(lo, hi)`` around ``m`` (``lo <= m <= hi``; the search stops at 2**20 rows, or at m
    above that) over which :func:`config_for`
    picks the same CTA level as for ``m`` (the pick depends on the row-tile count only and is not
    monotone in M: e.g. level 1 at M = 4096, level 3 at 5000, level 0 at 16384, level 1 at 20000).
    ``m``: int >= 0."""
    check_int("m", m, low=0)

    tiles = max(1, -(-int(m) // CONFIG_TILE_M))
    lo = hi = tiles
    while lo > 1 and _pick_level(lo - 1) == _pick_level(tiles):
        lo -= 1
    while hi < 2**20 // CONFIG_TILE_M and _pick_level(hi + 1) == _pick_level(tiles):
        hi += 1
    return (0 if lo == 1 else (lo - 1) * CONFIG_TILE_M + 1), hi * CONFIG_TILE_M


LEVEL_EXAMPLE_M = (1, 512, 1024, 2048, 4096, 16384)  # an M for each CTA level config_for picks (compile targets)


def _compile(config: HcMixTmaConfig):
    def build():
        args = fake_launch_args()
        part = fake_tensor(torch.float32, (cute.sym_int(), SP_COLS), stride=(SP_COLS, 1))
        return HcMixTmaKernel(config), args[:-1] + (part, args[-1])  # the workspace goes before the stream

    return compile_cached(NAME, config, build)


def workspace_rows(m: int, config: HcMixTmaConfig) -> int:
    """Rows of the ``[rows, 25]`` float32 workspace of node sums: ``ceil(M / tile_m) * ctas_per_tile *
    tile_m`` (every element written by the walk before the reduction reads it); 1 with
    ``fused_epilogue`` (no node sums leave the CTA; the row is the raw-statistics dummy)."""
    if config.fused_epilogue:
        return 1
    return max(1, -(-m // config.tile_m) * config.ctas_per_tile * config.tile_m)


def hc_mix_sinkhorn_tma(x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                        sinkhorn_iters: int = 20, rms_eps: float = 1e-6, hc_eps: float = 1e-6,
                        config: HcMixTmaConfig | None = None, mix: torch.Tensor | None = None):
    """:func:`.hc_mix.hc_mix_sinkhorn` (``method="tma"``, its default) with config and raw-statistics access:
    the same kernel, so the same bits (batch invariant; they differ from ``method="walk"``'s), the same
    argument rules, errors and outputs, but a plain Python function, not the registered op: eager calls on
    CUDA tensors only (no meta / fake tensors, no torch.compile tracing).  ``config`` (an
    :class:`HcMixTmaConfig`, validated; default :func:`config_for` (M); ``ValueError`` where its workspace would
    pass 2**31 elements); ``mix`` (``[M, 25]`` float32, contiguous, on x's device, not overlapping any input),
    when given, receives the raw ``a`` and sum x^2 of each row (``config.store_mix`` follows it)."""
    _validate(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps)
    return launch(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, config=config, mix=mix)


@functools.lru_cache(maxsize=256)
def _launch_config(config: HcMixTmaConfig, store_mix: bool) -> HcMixTmaConfig:
    """The config actually compiled for a call (memoized: dataclasses.replace costs microseconds):
    ``store_mix`` follows the mix buffer (set without one, the epilogue would write past the dummy
    row)."""
    return dataclasses.replace(config, store_mix=store_mix)


def sized_config(m: int, config: HcMixTmaConfig | None = None, store_mix: bool = False) -> tuple:
    """``(config compiled for the call, workspace rows)`` of an M-row call with ``config`` (validated; default
    :func:`config_for` (M)); ``ValueError`` where the workspace would pass the kernels' 32-bit offsets (a
    caller's config with many CTAs per row tile and a large M: the shipped picks stay far below)."""
    cfg = _launch_config(config or config_for(m), store_mix)
    rows = workspace_rows(m, cfg)
    if rows * SP_COLS > INT32_MAX:
        raise ValueError(f"M={m} with {cfg.ctas_per_tile} CTAs per row tile needs a workspace of {rows} x {SP_COLS} "
                         "elements, past the kernels' 32-bit offsets: use a lower cta_level or fewer rows per call")
    return cfg, rows


def launch(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, config=None, mix=None, out=None):
    """Launch on validated inputs (``hc_mix_sinkhorn(..., method="tma")`` and
    :func:`hc_mix_sinkhorn_tma` come here); ``out`` = preallocated (pre, post, comb) (tests poison them)."""
    m = x.shape[0]
    buffers = [] if mix is None else [("mix", mix, (m, SP_COLS))]
    if out is not None:
        buffers += zip(("pre", "post", "comb"), out, ((m, 4), (m, 4), (m, 4, 4)))
    for name, t, shape in buffers:  # the kernels write every row below M of each: checked whole
        check_tensor(name, t, dtypes=(torch.float32,), shape=shape, align_bytes=4)
        if not t.is_contiguous() or t.device != x.device:
            raise ValueError(f"{name} must be contiguous and on x's device")
    if buffers:  # (the kernels write them while other CTAs still read x and hc_fn)
        check_outputs_disjoint({name: t for name, t, _ in buffers}, dict(x=x, hc_fn=hc_fn, hc_scale=hc_scale,
                                                                          hc_base=hc_base))
    if config is not None and not isinstance(config, HcMixTmaConfig):  # (a config is checked when constructed)
        raise TypeError(f"config must be an HcMixTmaConfig, got {type(config).__name__}")
    cfg, rows = sized_config(m, config, mix is not None)
    return run_compiled(lambda: _compile(cfg), x, hc_fn, hc_scale, hc_base, sinkhorn_iters,
                        rms_eps, hc_eps, mix=mix, out=out, workspace_rows=rows)


def emulate_mix(x: torch.Tensor, hc_fn: torch.Tensor, config: HcMixTmaConfig | None = None) -> torch.Tensor:
    """The kernel's summation order in float32 on any device (CPU tests): ``[M, 25]`` = (a, sum x^2).

    Exact bf16 x bf16 products; each k tile's 64 products summed in float32 (the WGMMA chunk, modelled
    as exact-then-rounded) and added to a split's float32 running sums; at the split's end its pieces
    are combined (lo + mid) + hi and its squares' half-row sums added (per thread, in column order);
    then every node of the config's ``tree`` sums its children in order from zero (``cta_level``
    does not matter).  ``x [M, K]`` bf16, ``hc_fn [24, K]`` (``ValueError`` for other shapes or a K
    that is not a multiple of ``tile_k``).
    """
    if config is not None and not isinstance(config, HcMixTmaConfig):
        raise TypeError(f"config must be an HcMixTmaConfig, got {type(config).__name__}")
    cfg = config or HcMixTmaConfig()
    if not isinstance(x, torch.Tensor) or not isinstance(hc_fn, torch.Tensor):
        raise TypeError("x and hc_fn must be torch tensors")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x must be bfloat16 (the kernel's input), got {x.dtype}")
    if x.dim() != 2 or hc_fn.dim() != 2 or tuple(hc_fn.shape) != (N_MIX, x.shape[1]):
        raise ValueError(f"x must be [M, K] and hc_fn [{N_MIX}, K], got {list(x.shape)} and {list(hc_fn.shape)}")
    m, k = x.shape
    if k % cfg.tile_k:
        raise ValueError(f"x.shape[1]={k} must be a multiple of {cfg.tile_k} (as the kernel requires)")
    dev = x.device
    w3 = split_pieces(hc_fn.float()).double().to(dev)  # [72, K], exact bf16 values
    xd = x.double()
    kt = -(-k // cfg.tile_k)
    leaves = []
    for split in range(cfg.n_splits):
        run = torch.zeros(m, N_W, dtype=torch.float32, device=dev)
        sq = torch.zeros(m, 2, dtype=torch.float32, device=dev)  # squares: two half-row sums per row
        for t in range(split * kt // cfg.n_splits, (split + 1) * kt // cfg.n_splits):
            cols = slice(t * cfg.tile_k, min(k, (t + 1) * cfg.tile_k))
            run = run + (xd[:, cols] @ w3[:, cols].t()).float()
            for h in range(sq.shape[1]):
                part = torch.zeros(m, dtype=torch.float32, device=dev)
                for c in range(t * cfg.tile_k + h * cfg.tile_k // 2, t * cfg.tile_k + (h + 1) * cfg.tile_k // 2):
                    part = part + (xd[:, c] * xd[:, c]).float()
                sq[:, h] = sq[:, h] + part
        leaf = torch.zeros(m, SP_COLS, dtype=torch.float32, device=dev)
        leaf[:, :N_MIX] = leaf[:, :N_MIX] + ((run[:, :N_MIX] + run[:, N_MIX:2 * N_MIX]) + run[:, 2 * N_MIX:])
        leaf[:, N_MIX] = leaf[:, N_MIX] + (sq[:, 0] + sq[:, 1])
        leaves.append(leaf)
    for fan in reversed(cfg.tree):  # fold the tree bottom up: each node = its children from zero
        nodes = []
        for first in range(0, len(leaves), fan):
            total = torch.zeros(m, SP_COLS, dtype=torch.float32, device=dev)
            for child in leaves[first:first + fan]:
                total = total + child
            nodes.append(total)
        leaves = nodes
    return leaves[0]
