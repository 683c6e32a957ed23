"""Ranker attention forward on Hopper (sm_90a): a warp-specialized CuTe-DSL kernel (issue 3, seed 002).

Math (seed 002, issue 3).  ``q [B, S, Hq, D]``, ``k, v [B, S, Hkv, D]``, ``bounds [B, 4]`` int32 =
(hist_lo, hist_hi, cand_lo, cand_hi), half-open.  Query ``i`` attends key ``j`` iff
``(j in hist and (i in hist or i in cand)) or (i in cand and j == i)``.
``s = softmax_scale * q.k``, then the optional cap (``tanh``: ``cap*tanh(s/cap)``;
``soft_sign``: ``s/(1+|s|/cap)``), then the mask; ``out = softmax(s) @ v``; rows with no valid key
give ``out = 0`` and ``lse = -inf``.  ``lse [B, Hq, S]`` float32 is in natural-log units.
Bounds are clamped to ``[0, S]`` (see :mod:`.ranker_mask`), never rejected.

Kernel design.  Work is a list of tiles (q tile of ``tile_m`` rows, query head, batch row), m-block
fastest; a CTA takes tiles ``c, c + gridDim.x, ...``: one tile per CTA, or (``persistent``, every
shipped D=64 / D=128 config) one CTA per SM looping over tiles with the pipelines, named barriers and a
separate sO carried across tiles, so the producer loads the next tile while the consumers finish the last.  3 or 4
warpgroups:

* warpgroup 0, the producer (``setmaxnreg`` down to 24, 32 with three consumers): its warp 0 issues
  TMA loads of the Q tile and of the history K/V blocks through multi-stage ``PipelineTmaAsync``
  pipelines (swizzled smem), with ``self_kv_tma`` then the tile's own K/V rows (the self term's);
* ``consumer_wgs`` consumers (2: ``setmaxnreg`` up to 240, the D=128 / D=256 configs; 3: 160, the D=64
  configs and D=128 with a cap, ``tile_m`` = 192 as in FlashAttention-3's D=64 tile), 64 q rows
  each: WGMMA ``S = Q K^T`` (both operands in smem), cap, edge-block column mask, online softmax in
  exp2, ``O += P V`` with P in registers; the warpgroups take turns issuing WGMMAs, round-robin,
  through one named barrier each (:class:`NamedBarrierFwd`), so one's softmax overlaps the others'
  GEMMs, and (``intra_wg_overlap``, FA3's schedule; off at D=64, where the three warpgroups' turns
  suffice and P taking S's registers lets tile_n be 128) each warpgroup issues ``S_{n+1} = Q K_{n+1}^T``
  and ``O += P_n V_n`` together, running the softmax of ``S_{n+1}`` while the PV GEMM is in flight.
  ``skip_unit_rescale`` (the three-warpgroup configs) skips ``O *= 1`` when no row max of a warp changed.
  ``fixed_row_max`` (the capped configs but soft_sign's at D=64, bfloat16, caps <= ``FIXED_MAX_CAP`` = 50):
  a capped score is bounded, ``|s| <= cap``, so P = ``exp2(s * scale_log2)`` against a row max fixed at 0
  stays within [e^-cap, e^cap], normal in float32 and bfloat16: no row-max reduction, no O rescale, the LSE
  is ``ln(row_sum)``.  ``checked_max`` (the uncapped bfloat16 configs): every tile first runs that fixed max
  and checks the result (each active row's sum of P within [``CHECKED_SUM_MIN``, ``CHECKED_SUM_MAX``], the
  O accumulator finite); a consumer warpgroup whose rows fail runs the online max (the other of two compiled
  history loops) for the rest of its tiles and the failed tile again once the CTA's own tiles are done
  (:meth:`RankerAttentionFwd.advance_tile`).  The PV GEMM takes P rounded to bfloat16 and the row sum the
  float32 P, as with the online max, except that no P need be exactly 1: a row whose weight sits on keys of
  one score (one key, or scores saturated at +cap) is off by up to 2^-8 relative before the output's
  rounding, i.e. up to one bf16 ulp (with the online max those keys' P is exactly 1); the headroom limits
  (capped calls) are at ``FIXED_MAX_CAP``.

Only the history KV blocks are visited, each once, for every active q tile; a q tile with no row in
either segment loads nothing and writes zeros and ``-inf``.  The candidate self term is folded into
the online softmax after the history loop as a per-row dot product ``q_i . k_i`` and ``v_i``; there
are no diagonal tiles.  ``self_kv_tma`` (the D=128 config without a cap, tile_m == tile_n): the
producer TMA-loads the tile's own K/V rows into one more K/V stage after its history blocks (having
TMA-prefetched them into L2 at the tile's start, ``prefetch_self_kv``; with an empty history, Q and these rows
are all it loads), and the consumers read q_i (from
sQ), k_i and v_i with ldmatrix in the accumulator layout; the other configs read them from global memory
after the loop.
Epilogue: O through ``stmatrix`` into smem (sQ itself unless persistent) and a TMA store (fixed length;
TMA clips the ragged edge), or a predicated 16-byte store per row (varlen); at D=128 without a cap, fixed
length, per consumer warpgroup (``wg_epilogue``: its 64 rows behind its own named barrier, so the
warpgroups keep their round-robin offset across tiles), the store's read of sO waited for at the
warpgroup's next epilogue (``defer_store_wait``, persistent).

Measured on the H200 (useful TFLOP/s, bf16, ours / FA4 + mask_mod, CUDA graphs, peers in the same run;
bench/results/2026-12-02_h200_ranker_fwd_s40.md): headline B=4, history 4096 + 512 candidates, 16 heads,
D=128: 710 / 599; tanh cap 50 583 / 291; B=16 1K + 256 659 / 499 (1.32x); B=8 2K + 2K 664 / 524 (1.27x).
checked_max against session 39's ``norm_bound`` (a k pre-pass kernel, then the fixed max for the q tiles whose
scores Cauchy-Schwarz bounded by 50, only on sequences of more than 16 KV blocks) and the online max, same
run (bench/results/logs/2026-12-02_s40_ranker_fwd_checked_max_probe.log; us): headline 866 / 885 / 983, GQA
16/4 867 / 875 / 964, D=64 551 / 561 / 665, 16K 3306 / 3327 / 3652, B=16 1K + 256 286 / 312 / 306, B=8 2K +
2K 395 / 431 / 446.  Where a tile's cycles go: phase stamps per tile
(bench/results/logs/2026-12-01_s25_ranker_fwd_phase_stamps.log, ..._s26_ranker_fwd_epilogue_phase_stamps.log).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import math
import numbers
import operator
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from ..registry import CheckResult, CompileTarget
from ..runtime.alloc import is_compact
from ..runtime.arch import sm_count
from ..runtime.cache import compile_cached, warn_if_spills as cache_warn_if_spills
from ..runtime.fake import cute_dtype, fake_stream, fake_tensor, wide_stride
from ..runtime.torch_op import (capturing as _capturing, custom_op, plain_eager, refuse_func_transforms, tracing,
                                without_autocast, without_data)
from ..runtime.validate import (ValidatedConfig, aligned_data, check_config_fields, check_float_tensors,
                                check_same_device, check_tensor, F32_MAX, MEMO_LIMIT, check_bool, check_int,
                                check_real, exceeds, known, short_repr, validated_once)
from ..runtime.warn import warn_user
from ..tuning import generation as tuning_generation, memo_store, register_memo, tuned_config
from . import sm90_helpers as sm90
from . import ranker_autograd, ranker_flops
from .ranker_bench import BENCH_CASES, SHORT_CASES  # noqa: F401 (the bench's shapes, defined in ranker_bench)
from .ranker_mask import RankerSegments, dense_mask

NAME = "ranker_fwd"
DTYPES = (torch.bfloat16, torch.float16)
CAP_METHODS = ("none", "tanh", "soft_sign")
LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
SMEM_CAPACITY = 227 * 1024  # sm_90 opt-in dynamic shared memory per CTA
# ``fixed_row_max`` (P against a row max fixed at 0) applies to bfloat16 scores within +-this (caps <= this):
# P lies in [e^-50, e^50] ~ [2e-22, 5e21] (normal in float32 and bfloat16; float16 P would overflow at
# e^11.1: float16 takes the online max).  The price against the online max, whose P <= 1: the O
# accumulator's headroom is e^50 smaller (sum over keys of P |v| must stay below 3.4e38: one key at +50
# with |v| > 6.6e16 overflows), and in a row whose scores all sit near -50, P * v of |v| < ~1e-16 is
# subnormal (flushed); within those limits the result is as accurate as with the online max, except that
# no P is exactly 1 (below)
FIXED_MAX_CAP = 50.0
# ``checked_max``: a row's result against the fixed max of 0 is kept when its sum of P = e^s lies within these (and
# O's accumulator is finite).  Above: every P <= 2^100 (normal in float32 and bfloat16; 1 / sum stays normal).
# Below: the row's largest P >= 2^-20 / n for n keys, so the keys that move the result at float32 precision have
# P >= 2^-20 / n * 2^-24 (>= 2^-75 for n <= 2^31): normal, as the online max's; P * v is flushed only where
# |v| < 2^-51 (the online max: |v| < 2^-126).  Rows outside the window (every score below about -14 - ln n, or one
# past 69) take the online max
CHECKED_SUM_MIN = 2.0**-20
CHECKED_SUM_MAX = 2.0**100


class NamedBarrierFwd(enum.IntEnum):
    """Named barriers of the forward (0 is ``__syncthreads``)."""

    Epilogue = 1  # consumers (wg_epilogue off): done reading sQ before sO (aliasing it) is written; sO ready for TMA
    WarpSchedulerWG1 = 2  # consumer warpgroup 1 may issue its WGMMAs
    WarpSchedulerWG2 = 3  # consumer warpgroup 2 may issue its WGMMAs
    WarpSchedulerWG3 = 4  # consumer warpgroup 3 (tile_m = 192) may issue its WGMMAs
    CheckVoteWG1 = 5  # checked_max: the four warps of consumer warpgroup 1 have voted on their rows' check
    CheckVoteWG2 = 6
    CheckVoteWG3 = 7
    EpilogueWG1 = 8  # wg_epilogue: Epilogue's role for consumer warpgroup 1 alone (its own 64 rows of sQ / sO)
    EpilogueWG2 = 9
    EpilogueWG3 = 10
    RetryList = 11  # checked_max: the consumers (arrive) have published their retry tiles to the producer warp (sync)
    RetryListConsumers = 12  # checked_max: the same among the consumers (each reads every warpgroup's entry)


@dataclass(frozen=True)
class RankerFwdConfig(ValidatedConfig):
    """Tile shape of the forward: ``tile_m`` q rows (64 per consumer warpgroup; ``consumer_wgs`` 2 or 3,
    the warpgroups taking turns to issue their WGMMAs round-robin), ``tile_n`` keys per KV block,
    ``stages`` K/V smem buffers, register split (producer / consumer: 24/240 for two warpgroups, 32/160
    for three fill the 64K-register file).  Checked when constructed (also by ``dataclasses.replace``):
    :meth:`validate` raises ``ValueError`` with the reason (shared memory budget, WGMMA M a multiple of 64,
    head dim, register split and accumulator budget) and ``TypeError`` for a field of the wrong type."""

    head_dim: int = 128
    tile_m: int = 128
    tile_n: int = 128
    stages: int = 2
    consumer_wgs: int = 2
    producer_regs: int = 24
    consumer_regs: int = 240
    intra_wg_overlap: bool = True  # softmax of block n overlaps the PV GEMM of block n+1 (FA3)
    persistent: bool = False  # one CTA per SM looping over tiles (needs its own sO: no aliasing of sQ)
    skip_unit_rescale: bool = False  # skip O *= 1 when no row max of the warp changed (a warp vote)
    # with a cap, P = exp2(s * scale_log2) against a fixed row max of 0 instead of the running one: a capped
    # score is bounded, |s| <= cap, so for cap <= FIXED_MAX_CAP every P and row sum stays a normal float32
    # (and bfloat16); no row-max reduction, no O rescale.  The host takes it only where that holds (bf16,
    # a cap <= FIXED_MAX_CAP) and runs the online max otherwise (:func:`chosen_config`)
    fixed_row_max: bool = False
    # without a cap (bf16): every tile first runs the fixed max of 0 and checks its result afterwards: each active row's
    # sum of P within [CHECKED_SUM_MIN, CHECKED_SUM_MAX] and the O accumulator finite (so every P was a normal float32
    # and no product overflowed).  A consumer warpgroup whose rows fail runs the online max for the rest of its tiles
    # and the failed tile again at the CTA's end (:meth:`RankerAttentionFwd.advance_tile`); no pre-pass, any length.
    # Shipped and GPU-tested at D=64 / D=128 (persistent and one tile per CTA) and D=256 (one tile per CTA; since
    # session 53)
    checked_max: bool = False
    # the candidate rows' own K/V rows (the self term) come by TMA into one more K/V stage after the history
    # blocks, and q_i from the Q tile in smem (held until then), read in the accumulator layout with ldmatrix;
    # otherwise each thread reads them from global memory after the loop; also where tile_m != tile_n (the
    # tile's rows are then not one KV block) and at head_dim > 128 (q_i, k_i, v_i in registers beside the O
    # accumulator: D=256 with tile_n=128 spilled 544-744 bytes, session 25 review)
    self_kv_tma: bool = False
    # with self_kv_tma (where taken: self_kv_tma_taken): at a candidate tile's start the producer TMA-prefetches
    # into L2 the K/V block it loads after the history blocks (the tile's own rows, read by no other tile, so
    # from HBM), which the pipeline otherwise requests only when a stage frees, about a loop step before the self
    # term needs it (H200 phase stamps, session 26: a candidate tile's cycles -3.5% at B=16 1K+256, -0.9% at B=8
    # 2K+2K, -0.5% at the headline; history tiles -0.3 to -0.7%; shipped with self_kv_tma)
    prefetch_self_kv: bool = False
    # the epilogue per consumer warpgroup (its 64 rows of sO, its own named barrier, its own TMA store)
    # instead of one for the tile behind a barrier of every consumer, so the warpgroups keep their round-robin
    # offset across tiles instead of meeting at every tile's end (H200 phase stamps, session 26: a history
    # tile's cycles -4.8% at B=16 1K+256, -2.5% at B=8 2K+2K, -1.4% at the headline shape; shipped at D=128
    # without a cap; fixed length only (the varlen kernels keep one epilogue: with it D=128's spilled 8 bytes);
    # the three-warpgroup configs at 160 registers keep one epilogue: with it bf16 D=128 soft_sign spills 8)
    wg_epilogue: bool = False
    # persistent, fixed length: the warp that issued a TMA store of O waits for it to have read sO at the
    # start of its next epilogue (and once after the tile loop) instead of right after issuing it, so the
    # store's smem read leaves the path between tiles (with wg_epilogue, session 26's stamps: a further
    # -1.4% / -0.9% / -0.6% of a history tile's cycles at those shapes; alone, level: the wait moves into
    # the next tile's first block)
    defer_store_wait: bool = False
    # with intra_wg_overlap: O's rescale by the last softmax's factors between the next S and PV GEMM issues
    # (FlashAttention-3's order) instead of right after that softmax, off the serial stretch between a PV
    # GEMM's end and the next issue (:meth:`RankerAttentionFwd.mma_one_n_block_overlap`; the online max only,
    # the fixed one has no rescale).  The factors then live across the loop step: the three-warpgroup configs
    # at 160 registers keep the late rescale (fp16 D=128 soft_sign varlen spilled 8 bytes with it)
    early_rescale: bool = True
    # with intra_wg_overlap: the history loop's last step (KV block n_block_min, which may need the key mask) is
    # the loop's last iteration, masked at run time, instead of a copy of the step of its own after the loop:
    # one traced copy fewer (session 47, shipped D=128 config: compile 5.3-6.1 -> 4.2-4.6 s on a 2-core machine,
    # PTX -17%; same bits, same speed in interleaved A/Bs, bench/results/logs/2026-12-04_s47_ranker_fwd_*).  The
    # three-warpgroup capped config keeps the copy: with it the tanh cap ran 2-4% slower in both A/B runs (its
    # 64-key steps are short: the run-time branch is a larger share of each)
    masked_step_in_loop: bool = True

    def smem_bytes(self, elem_bytes: int = 2) -> int:
        sq = self.tile_m * self.head_dim * elem_bytes * (2 if self.persistent else 1)  # sO aliases sQ unless persistent
        skv = 2 * self.stages * self.tile_n * self.head_dim * elem_bytes
        # an upper bound of the SharedStorage struct plus ptxas' 1024 B of static smem (the 1024-byte aligned
        # dynamic base): the struct is the mbarriers and checked_max's vote words (row_votes, retry_tiles: at most
        # 80 B) padded to 1024 B, then sQ (, sO) and the K/V stages, all multiples of 1024 B
        return sq + skv + 8 * (2 + 4 * self.stages) + 2048

    def validate(self) -> None:
        check_config_fields(self)
        if self.head_dim not in (64, 128, 256):
            raise ValueError(f"head_dim={self.head_dim}: supported head dims are 64, 128, 256")
        if self.consumer_wgs not in (2, 3):
            raise ValueError(f"consumer_wgs={self.consumer_wgs}: the kernel has 2 or 3 consumer warpgroups")
        if self.tile_m != 64 * self.consumer_wgs:
            raise ValueError(f"tile_m={self.tile_m}: must be 64 (WGMMA M) x consumer_wgs = {64 * self.consumer_wgs} "
                             f"(set tile_m={64 * self.consumer_wgs} with consumer_wgs={self.consumer_wgs})")
        if self.tile_n % 16 or not 64 <= self.tile_n <= 256:
            raise ValueError(f"tile_n={self.tile_n}: must be a multiple of 16 in [64, 256] (WGMMA N / K)")
        if self.stages < 1 or self.stages > 8:
            raise ValueError(f"stages={self.stages}: must be in [1, 8]")
        if self.prefetch_self_kv and not self.self_kv_tma:
            raise ValueError("prefetch_self_kv (an L2 prefetch of the self stage's K/V block) needs self_kv_tma: "
                             "without it there is no self stage and the flag would do nothing")
        if self.fixed_row_max and self.checked_max:
            raise ValueError("fixed_row_max (capped calls) and checked_max (uncapped calls) exclude each other: "
                             "set the one for the cap you run")
        sm90.check_register_split(self.producer_regs, self.consumer_regs, self.consumer_wgs)
        # fp32 accumulators per consumer thread: S (tile_n/2) + O (head_dim/2) + P (tile_n/4 regs).  A rule of
        # thumb from ptxas, with headroom for addresses and softmax state: two warpgroups at 240 registers
        # keep 48 (D=128: tile_n=176, 196 of them, fits without spills but ran 12% slower than 128 on the
        # H200, bench/results/logs/2026-11-29_s4_ranker_fwd_tune_*, and 192 spills); three at 160 keep 44
        # (D=64: tile_n=112, 116 of them, fits; 128, 128 of them, spills 56 bytes).  Without the intra-warpgroup
        # overlap P takes the place of S (no S of the next tile is live beside it): D=64 tile_n=128 on three
        # warpgroups, 96 of them, compiles without spills in bf16 and fp16 (ptxas, session 9)
        acc_regs = self.tile_n // 2 + self.head_dim // 2 + (self.tile_n // 4 if self.intra_wg_overlap else 0)
        headroom = 48 if self.consumer_wgs == 2 else 44
        if acc_regs > self.consumer_regs - headroom:
            fix = ("use a smaller tile_n" if self.tile_n > 64 else
                   "no tile_n fits (64 is the smallest): use fewer consumer warpgroups, each with more registers"
                   if self.consumer_wgs == 3 else "no tile_n fits (64 is the smallest)")
            raise ValueError(
                f"tile_n={self.tile_n}, head_dim={self.head_dim}: {acc_regs} accumulator registers per "
                f"consumer thread leave fewer than {headroom} of {self.consumer_regs} (a measured rule: the next "
                f"size up either spills or, e.g. D=128 tile_n=176, ran 12% slower); {fix}")
        smem = self.smem_bytes()
        if smem > SMEM_CAPACITY:
            so = (f" + O {self.tile_m}x{self.head_dim} (the persistent schedule keeps sO apart from sQ; "
                  f"persistent=False reuses sQ)") if self.persistent else ""
            raise ValueError(
                f"config needs {smem} B of shared memory (Q {self.tile_m}x{self.head_dim} + "
                f"{self.stages} stages of K,V {self.tile_n}x{self.head_dim}{so}); the sm_90 limit is "
                f"{SMEM_CAPACITY} B")


# Shipped configs, one per head dim, with the K/V stages measured fastest (not always as many as fit: D=64 and the
# capped D=128 config ship one fewer than fit).  H200 measurements (useful TFLOP/s):
# D=128: tile_m=128 (2 consumer warpgroups), FA3's sm90 tile_n; persistent ties or beats one CTA per
# tile (bench/results/2026-11-29_h200_ranker_fwd.md: 605 vs 605 headline, 502 vs 462 B=16 short, 543 vs
# 514 candidate-heavy, 502 vs 488 tanh cap).  D=64: three consumer warpgroups (tile_m=192, FA3's D=64
# tile) at 160 registers each, persistent, WITHOUT the intra-warpgroup overlap: the three warpgroups'
# round-robin turns already keep the tensor cores fed, and without the overlap P reuses S's registers, so
# tile_n=128 fits (spills with the overlap).  Session 9, same run (bench/results/logs/
# 2026-11-30_s9_ranker_fwd_noov.log), against session 8's overlapped tile_n=112 config: headline 477 vs
# 443, tanh cap 343 vs 318, B=16 1K+256 378 vs 336, B=8 2K+2K 405 vs 367; float16 (one config for both
# dtypes now) 460-467 vs 424 for the two-warpgroup config it had before.
# The three-warpgroup configs skip the O rescale when no row max of a warp changed (skip_unit_rescale:
# same bits; session 9: +3-4% on them, -8% on the two-warpgroup D=128 config, which keeps it off).
# D=256 persistent fits only with one K/V stage (sQ + sO + 2 stages exceed 227 KB): 431-459 useful TFLOP/s against
# 693-771 for the shipped one tile per CTA (session 53,
# bench/results/logs/2026-12-04_s53_ranker_fwd_d256_config_probe.log).
# checked_max (session 40; it replaced session 21-39's norm_bound and its k pre-pass): the fixed max at every
# sequence length, checked after each tile; same run, us, checked / norm_bound / online max: headline 866 / 885 /
# 983, B=16 1K+256 286 / 312 / 306, B=8 2K+2K 395 / 431 / 446, D=64 551 / 561 / 665 (the module docstring has
# the rest; same bits as norm_bound wherever that took the fixed max).  Compile of the D=128 config 4.2-4.5 s vs
# 5.3 s with norm_bound on session 40's 2-core machine (no pre-pass kernel, no row-norm vote).
CONFIGS = {
    64: RankerFwdConfig(head_dim=64, tile_m=192, tile_n=128, stages=4, consumer_wgs=3, producer_regs=32,
                        consumer_regs=160, persistent=True, intra_wg_overlap=False, skip_unit_rescale=True,
                        checked_max=True),
    # D=128: self_kv_tma (session 25; it replaced session 10's L2 prefetch of the candidate rows' K/V rows, which
    # the self term then read from global memory, 'kept, unproven' in session 11; today's prefetch_self_kv, session
    # 26, is another thing: an L2 prefetch of the self stage's block, see the field): the candidate tiles' own K/V
    # rows come by TMA through the K/V pipeline, read with ldmatrix.  Phase stamps: the
    # global reads cost ~2.9 loop steps per candidate tile; same run with FA4 (useful TFLOP/s, with / without):
    # B=16 1K+256 537 / 489, B=8 2K+2K 645 / 595, 16K 725 / 703, headline 679 / 690 (A/A 682), same bits
    # (bench/results/logs/2026-12-01_s25_ranker_fwd_self_kv_tma_probe.log)
    128: RankerFwdConfig(head_dim=128, tile_n=128, stages=2, persistent=True, self_kv_tma=True, checked_max=True,
                         prefetch_self_kv=True, wg_epilogue=True, defer_store_wait=True),
    # D=256: checked_max since session 53 (bench/results/logs/2026-12-04_s53_ranker_fwd_d256_config_probe.log; B=4,
    # 4096 + 512, 8 heads, CUDA graph, useful TFLOP/s: 771 vs 647 / 651 for the online max, 693-701 vs 623 in a
    # second run; persistent fits only one K/V stage and ran at 431-459), with the edge block's masked step out of
    # the loop (masked_step_in_loop=False: same speed, 692 vs 693-701; in the loop the bf16 varlen kernels spill 16 B)
    256: RankerFwdConfig(head_dim=256, tile_n=64, stages=2, checked_max=True, masked_step_in_loop=False),
}
# With a cap (keys: (cap_method, head_dim)).  D=128 tanh: three consumer warpgroups (tile_n=64) hide more of
# the cap's MUFU work (session 8 probe: 522 vs 487 useful TFLOP/s at the headline shape; session 9: 525 vs
# 489 and, in the recorded bench, 517 vs 503; without a cap they are slower, 583 vs 647); spill-free for
# bf16 and fp16, tanh and soft_sign, GQA and varlen (ptxas, session 21).
# fixed_row_max (session 21, bench/ranker_fwd_cap_probe.py, cap 50, headline shape, two runs, useful TFLOP/s
# with / without; bench/results/logs/2026-12-01_s21_ranker_fwd_fixed_row_max_probe.log): tanh D=128 612 /
# 513 and 595 / 506 (an A/A pair 596 and 599; the two-warpgroup config with it 532), tanh D=64 356 / 341
# and 357 / 338 (tile_n=128 with it, spill-free then: 361 and 361, within the A/A spread), soft_sign D=128 on
# the three-warpgroup config 553 and 554 vs 481 and 480 for the two-warpgroup one without it (with it 552,
# 516).  soft_sign D=64 keeps the online max: with the fixed one its kernels spill 8-32 bytes.  D=64 with a cap:
# tile_n=112, 6 stages, because the varlen kernels spill at tile_n=128 with a cap (8 bytes tanh, 32
# soft_sign; ptxas, session 9); tanh cap at the headline shape 347 vs 343 for tile_n=128 (same run).
# The tanh cap's loss is not the MUFU unit's throughput (tanh and exp2 share it): computing part of P's
# exp2 on the FP32 pipe instead (a cubic, session 14, branch s14/exp2-poly) was slower at every share
# (tanh headline 491 / 484 / 411 for 2 / 4 / 8 of every 8 scores vs 516 / 508; bench/results/logs/
# 2026-11-30_s14_exp2_poly_probe.log).
_D64_CAPPED = dataclasses.replace(CONFIGS[64], tile_n=112, stages=6, fixed_row_max=True, checked_max=False)
_D128_CAPPED = RankerFwdConfig(head_dim=128, tile_m=192, tile_n=64, stages=3, consumer_wgs=3, producer_regs=32,
                               consumer_regs=160, persistent=True, skip_unit_rescale=True, fixed_row_max=True,
                               early_rescale=False, masked_step_in_loop=False)
# D=256 with a cap: its uncapped tile with fixed_row_max (session 53, same probe: tanh cap 50 755 vs 582 / 626, and
# 696-703 vs 554 in the second run)
_D256_CAPPED = dataclasses.replace(CONFIGS[256], checked_max=False, fixed_row_max=True)
CAP_CONFIGS = {
    ("tanh", 128): _D128_CAPPED,
    ("soft_sign", 128): _D128_CAPPED,
    ("tanh", 64): _D64_CAPPED,
    ("soft_sign", 64): dataclasses.replace(_D64_CAPPED, fixed_row_max=False),  # (fixed: spills 8-32 B)
    ("tanh", 256): _D256_CAPPED,
    ("soft_sign", 256): _D256_CAPPED,
}


def self_kv_tma_taken(config: RankerFwdConfig) -> bool:
    """Whether a kernel of ``config`` reads the self term's q_i, k_i, v_i through the K/V pipeline
    (``config.self_kv_tma`` where the tile allows it: tile_m == tile_n, head_dim <= 128) rather than from
    global memory (see :attr:`RankerFwdConfig.self_kv_tma`)."""
    return config.self_kv_tma and config.tile_m == config.tile_n and config.head_dim <= 128


def shipped_config(dtype: torch.dtype, head_dim: int, cap_method: Optional[str] = "none") -> RankerFwdConfig:
    """The shipped config for ``dtype`` (torch.bfloat16 / torch.float16), ``head_dim`` and ``cap_method``
    (``"none"`` or None without a cap, else ``"tanh"`` / ``"soft_sign"``): ``CAP_CONFIGS[(cap_method, head_dim)]``
    where there is one, else ``CONFIGS[head_dim]``; float16 takes the same tile shape with the fixed max
    (``fixed_row_max``, ``checked_max``) off (float16 P would overflow).  Raises ``TypeError`` for another
    dtype (a string included), a head dim that is not an integer (a bool included; numpy integers are taken) or a
    ``cap_method`` that is neither a str nor None, and ``ValueError`` for a head dim other than 64, 128, 256 or an
    unknown ``cap_method``."""
    if not isinstance(dtype, torch.dtype) or dtype not in DTYPES:
        raise TypeError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral):  # (numpy ints as the ops take them)
        raise TypeError(f"head_dim must be an int, got {head_dim!r}")
    head_dim = int(head_dim)
    if head_dim not in CONFIGS:
        raise ValueError(f"head_dim={head_dim!r}: shipped configs exist for head dims {sorted(CONFIGS)}")
    if cap_method is None:  # (as ranker_attention's cap=None)
        cap_method = "none"
    if not isinstance(cap_method, str):  # (as ranker_attention)
        raise TypeError(f"cap_method must be a str or None, got {type(cap_method).__name__}")
    if cap_method not in CAP_METHODS:
        raise ValueError(f"cap_method={cap_method!r}: expected one of {CAP_METHODS} ('none' or None: no cap)")
    cfg = CAP_CONFIGS.get((cap_method, head_dim), CONFIGS[head_dim])
    return cfg if dtype == torch.bfloat16 or not (cfg.fixed_row_max or cfg.checked_max) else _online_max(cfg)


def shipped_configs() -> dict[str, RankerFwdConfig]:
    """``{label: config}`` of what :func:`shipped_config` ships per head dim and cap (``cute-kernels
    configs``), split by dtype where float16's differs (the same tile without the fixed row max)."""
    tables = [(f"head_dim={d}", d, "none") for d in sorted(CONFIGS)]
    tables += [(f"head_dim={d} {m} cap", d, m) for m, d in sorted(CAP_CONFIGS, key=lambda md: (md[1], md[0]))]
    out = {}
    for label, d, cap_method in tables:
        bf16, fp16 = (shipped_config(dt, d, cap_method) for dt in (torch.bfloat16, torch.float16))
        if bf16 == fp16:
            out[label] = bf16
        else:
            out[f"{label} bfloat16"], out[f"{label} float16"] = bf16, fp16
    return out


def tiled_mmas(dtype, config: RankerFwdConfig):
    """The forward's WGMMAs (DSL objects; call inside a trace), ``(qk, pv)``: S = Q K^T (M = q rows, 64 per
    consumer warpgroup; N = tile_n keys; both operands K-major in smem) and O += P V (N = head dim; P from
    registers, V MN-major in smem).  The kernel and :func:`cute_kernels.layouts.kernel_layouts.ranker_fwd_layouts`
    both build them here."""
    qk = sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
        atom_layout_mnk=(config.tile_m // 64, 1, 1), tiler_mn=(64, config.tile_n))
    pv = sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN, Float32,
        atom_layout_mnk=(config.tile_m // 64, 1, 1), tiler_mn=(64, config.head_dim),
        a_source=warpgroup.OperandSource.RMEM)
    return qk, pv


def smem_layouts(dtype, config: RankerFwdConfig) -> dict:
    """The forward's shared-memory layouts (DSL objects; call inside a trace): ``sQ``, ``sO`` (q rows, head dim;
    the same layout: sO aliases sQ unless ``persistent``, which gives it its own buffer), ``sK``, ``sV`` (keys,
    head dim, stages).  Swizzled K-major (:func:`.sm90_helpers.smem_layout`)."""
    sQ = sm90.smem_layout(dtype, config.tile_m, config.head_dim)
    sK = sm90.smem_layout(dtype, config.tile_n, config.head_dim, config.stages)
    sV = sm90.smem_layout(dtype, config.tile_n, config.head_dim, config.stages)
    return dict(sQ=sQ, sK=sK, sV=sV, sO=sQ)


class Schedule(NamedTuple):
    """The grid's tiles (:meth:`RankerAttentionFwd.tile_work`): m-block fastest, then head, then batch."""

    mBounds: Any  # (B, 4) int32 segment bounds
    mCuSeqlens: Any  # (B + 1,) int32 sequence starts (varlen), else None
    num_m_blocks: Any
    num_heads: Any  # query heads
    seqlen_static: Any  # S (fixed length; varlen reads each sequence's length from mCuSeqlens)
    num_tiles: Any


class TileWork(NamedTuple):
    """One tile of the schedule (:meth:`RankerAttentionFwd.tile_work`)."""

    m_block: Any
    head: Any  # query head
    batch: Any
    offset: Any  # the sequence's first row in the packed tensors (varlen; else 0)
    seg: RankerSegments
    in_range: Any  # the tile's first row is inside the sequence
    active: Any  # some row of the tile is in the history or the candidates


class ProducerOperands(NamedTuple):
    """What the producer warp's loads read (:meth:`RankerAttentionFwd.load_tile`): the TMA views of Q, K, V, the
    smem buffers, the TMA atoms and the pipelines."""

    tma_Q: Any
    tma_K: Any
    tma_V: Any
    sQ: Any
    sK: Any  # (tile_n, D, stages)
    sV: Any
    tma_atom_Q: Any
    tma_atom_K: Any
    tma_atom_V: Any
    pipeline_q: Any
    pipeline_k: Any
    pipeline_v: Any


class KVCopies(NamedTuple):
    """One tile's K and V block copies (:meth:`RankerAttentionFwd.load_k_block`): atoms, TMA partitions of
    the sequence's K/V blocks (``tKgK[None, n_block]``) and the stages (``tKsK[None, stage]``), pipelines."""

    tma_atom_K: Any
    tma_atom_V: Any
    tKgK: Any
    tKsK: Any
    tVgV: Any
    tVsV: Any
    pipeline_k: Any
    pipeline_v: Any


class ConsumerOperands(NamedTuple):
    """What a consumer warpgroup reads in every tile (:meth:`RankerAttentionFwd.mma_tile`; made once in
    ``mma``): the WGMMAs and their fragments, the O accumulator and the softmax's row state (refilled per tile),
    the thread's coordinates in the S and O tiles, the global tensors, the smem buffers, the pipelines, the
    thread's indices and the score scalars."""

    tiled_mma_qk: Any  # S = Q K^T
    tiled_mma_pv: Any  # O += P V
    tSrQ: Any
    tSrK: Any
    tOrVt: Any
    tOrP: Any
    acc_O: Any
    row_max: Any
    row_sum: Any
    tScS_mn: Any  # (row, column) of this thread's S elements
    tOcO_mn: Any  # (row, column) of this thread's O elements
    mQ: Any
    mK: Any
    mV: Any
    mO: Any
    mLSE: Any  # None: no LSE output
    tma_O: Any
    tma_atom_O: Any
    sQ: Any
    sK: Any
    sV: Any
    sO: Any
    sVote: Any  # checked_max's per-warp votes
    pipeline_q: Any
    pipeline_k: Any
    pipeline_v: Any
    tidx: Any  # thread index among the consumers
    wg_idx: Any  # this consumer warpgroup
    scale_log2: Any
    softmax_scale: Any
    cap: Any


class HistoryOperands(NamedTuple):
    """What every step of a consumer warpgroup's history loop reads (:meth:`RankerAttentionFwd.history_loop`; DSL
    objects of one tile, made in ``mma_tile``): the WGMMAs and their register / smem partitions, the O accumulator
    and the softmax's row state, the K and V pipelines, the tile's sequence segments and the score scalars."""

    tiled_mma_qk: Any  # S = Q K^T
    tiled_mma_pv: Any  # O += P V
    tSrQ: Any  # Q's WGMMA fragments (sQ)
    tSrK: Any  # K's, per stage (sK)
    tOrVt: Any  # V^T's, per stage (sV)
    tOrP: Any  # P in registers, the PV GEMM's A operand
    acc_O: Any
    row_max: Any  # the online softmax's per-row state
    row_sum: Any
    row_scale: Any  # the O rescale factors of the last softmax
    tScS_mn: Any  # S's (row, column) coordinates, for the key mask
    pipeline_k: Any
    pipeline_v: Any
    seg: RankerSegments
    scale_log2: Any
    softmax_scale: Any
    cap: Any
    wg_idx: Any  # this consumer warpgroup


class RankerAttentionFwd:
    """The forward kernel for one (dtype, head dim, GQA ratio, cap method, varlen, config)."""

    def __init__(self, dtype, config: RankerFwdConfig, qhead_per_kvhead: int, cap_method: str, varlen: bool):
        if cap_method not in CAP_METHODS:
            raise ValueError(f"cap_method={cap_method!r}: expected one of {CAP_METHODS}")
        if config.fixed_row_max and (cap_method == "none" or dtype is not cutlass.BFloat16):
            raise ValueError(f"fixed_row_max needs bfloat16 and a cap (bounded scores), got {dtype} and "
                             f"cap_method={cap_method!r}")
        if config.checked_max and (cap_method != "none" or dtype is not cutlass.BFloat16):
            raise ValueError(f"checked_max needs bfloat16 and no cap (with a cap, fixed_row_max), got {dtype} and "
                             f"cap_method={cap_method!r}")
        self.dtype = dtype
        self.config = config
        self.tile_m = config.tile_m
        self.tile_n = config.tile_n
        self.head_dim = config.head_dim
        self.stages = config.stages
        self.qhead_per_kvhead = qhead_per_kvhead
        self.cap_method = cap_method
        self.varlen = varlen
        self.self_kv_tma = self_kv_tma_taken(config)
        self.num_consumer_threads = 128 * config.consumer_wgs
        # the epilogue's unit: one consumer warpgroup's rows (wg_epilogue) or the whole tile; fixed length only
        # (with it the varlen kernels' predicated stores spilled 8 bytes at D=128, session 26)
        self.wg_epilogue = config.wg_epilogue and not varlen
        self.epi_rows = 64 if self.wg_epilogue else config.tile_m
        self.epi_threads = 128 if self.wg_epilogue else self.num_consumer_threads
        self.defer_store_wait = config.defer_store_wait and config.persistent and not varlen
        self.num_threads = 128 + self.num_consumer_threads

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mBounds: cute.Tensor,
                 mO: cute.Tensor, mLSE: Optional[cute.Tensor], mCuSeqlens: Optional[cute.Tensor],
                 scale_log2: Float32, softmax_scale: Float32, cap: Float32, num_batch: Int32, max_seqlen: Int32,
                 max_ctas: Int32, stream):
        # (B, S, H, D) -> (S, D, H, B); varlen (T, H, D) -> (T, D, H).  LSE (B, H, S) -> (S, H, B); (H, T) -> (T, H)
        # (mLSE None: the caller wants no LSE, none is written)
        if const_expr(self.varlen):
            mQ, mK, mV, mO = [sm90.select_modes(t, [0, 2, 1]) for t in (mQ, mK, mV, mO)]
            if const_expr(mLSE is not None):
                mLSE = sm90.select_modes(mLSE, [1, 0])
        else:
            mQ, mK, mV, mO = [sm90.select_modes(t, [1, 3, 2, 0]) for t in (mQ, mK, mV, mO)]
            if const_expr(mLSE is not None):
                mLSE = sm90.select_modes(mLSE, [2, 1, 0])

        tiled_mma_qk, tiled_mma_pv = tiled_mmas(self.dtype, self.config)
        lay = smem_layouts(self.dtype, self.config)
        sQ_layout, sK_layout, sV_layout, sO_layout = lay["sQ"], lay["sK"], lay["sV"], lay["sO"]

        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mQ, sQ_layout, (self.tile_m, self.head_dim))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mK, cute.select(sK_layout, mode=[0, 1]),
            (self.tile_n, self.head_dim), 1)
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mV, cute.select(sV_layout, mode=[0, 1]),
            (self.tile_n, self.head_dim), 1)
        # the O store's box: the tile, or with wg_epilogue one warpgroup's 64 rows (the tile's layout restricted)
        sO_box_layout = cute.composition(sO_layout, (cute.make_layout(self.epi_rows), cute.make_layout(self.head_dim)))
        tma_atom_O, tma_O = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mO, sO_box_layout, (self.epi_rows, self.head_dim))
        self.tma_bytes_q = cute.size_in_bytes(self.dtype, sQ_layout)
        self.tma_bytes_kv = cute.size_in_bytes(self.dtype, cute.select(sK_layout, mode=[0, 1]))

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_k: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            mbar_v: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            row_votes: cute.struct.MemRange[Int32, 4 * self.config.consumer_wgs]  # checked_max: one per consumer warp
            retry_tiles: cute.struct.MemRange[Int32, self.config.consumer_wgs]  # checked_max: per consumer warpgroup
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[
                self.dtype, cute.cosize(sO_layout) if const_expr(self.config.persistent) else 0], 1024]

        self.shared_storage = SharedStorage

        num_m_blocks = cute.ceil_div(max_seqlen, self.tile_m)
        num_tiles = num_m_blocks * cute.size(mQ.shape[2]) * num_batch
        grid = (cutlass.min(num_tiles, max_ctas), 1, 1)
        self.kernel(
            tma_Q, tma_K, tma_V, tma_O, mQ, mK, mV, mO, mLSE, mBounds, mCuSeqlens,
            tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O,
            tiled_mma_qk, tiled_mma_pv, sQ_layout, sK_layout, sV_layout, sO_layout,
            scale_log2, softmax_scale, cap, num_batch, num_m_blocks,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(self, tma_Q: cute.Tensor, tma_K: cute.Tensor, tma_V: cute.Tensor, tma_O: cute.Tensor,
               mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: Optional[cute.Tensor],
               mBounds: cute.Tensor, mCuSeqlens: Optional[cute.Tensor],
               tma_atom_Q: cute.CopyAtom, tma_atom_K: cute.CopyAtom, tma_atom_V: cute.CopyAtom,
               tma_atom_O: cute.CopyAtom, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, sO_layout: cute.ComposedLayout,
               scale_log2: Float32, softmax_scale: Float32, cap: Float32, num_batch: Int32,
               num_m_blocks: Int32):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O):
                cpasync.prefetch_descriptor(atom)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_consumer_threads // 32)
        pipeline_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=1, producer_group=producer,
            consumer_group=consumers, tx_count=self.tma_bytes_q, defer_sync=True)
        pipeline_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=consumers, tx_count=self.tma_bytes_kv, defer_sync=True)
        pipeline_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=consumers, tx_count=self.tma_bytes_kv, defer_sync=True)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sVote = storage.row_votes.get_tensor(cute.make_layout(4 * self.config.consumer_wgs))
        sRetry = storage.retry_tiles.get_tensor(cute.make_layout(self.config.consumer_wgs))
        if const_expr(self.config.persistent):
            sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        else:
            sO = storage.sQ.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)  # one tile per CTA: alias sQ

        sched = Schedule(mBounds, mCuSeqlens, num_m_blocks, Int32(cute.size(mQ.shape[2])), Int32(mQ.shape[0]),
                         num_m_blocks * Int32(cute.size(mQ.shape[2])) * num_batch)
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.config.producer_regs)
            if warp_idx == 0:
                self.load(ProducerOperands(tma_Q, tma_K, tma_V, sQ, sK, sV, tma_atom_Q, tma_atom_K, tma_atom_V,
                                           pipeline_q, pipeline_k, pipeline_v), sRetry, sched)
        else:
            cute.arch.setmaxregister_increase(self.config.consumer_regs)
            self.mma(tiled_mma_qk, tiled_mma_pv, tma_O, mQ, mK, mV, mO, mLSE, sQ, sVote, sRetry, sK, sV, sO,
                     tma_atom_O, pipeline_q, pipeline_k, pipeline_v, tidx - 128, sched,
                     scale_log2, softmax_scale, cap)

    def _batch_view(self, mX: cute.Tensor, batch, offset, head) -> cute.Tensor:
        """(S, D) view of one sequence and head of a (S, D, H, B) or packed (T, D, H) tensor."""
        if const_expr(self.varlen):
            return cute.domain_offset((offset, 0), mX[None, None, head])
        return mX[None, None, head, batch]

    def _lse_view(self, mLSE: cute.Tensor, batch, offset, head) -> cute.Tensor:
        if const_expr(self.varlen):
            return cute.domain_offset((offset,), mLSE[None, head])
        return mLSE[None, head, batch]

    @cute.jit
    def tile_work(self, tile, sched):
        """Tile index -> its :class:`TileWork`: (m_block, head, batch), the sequence's offset and segments,
        and what to do.

        Tiles are ordered m-block fastest, then head, then batch (consecutive CTAs share K/V in L2);
        CTA ``c`` takes tiles ``c, c + gridDim.x, ...`` (one tile each unless persistent)."""
        m_block = tile % sched.num_m_blocks
        head_batch = tile // sched.num_m_blocks
        head = head_batch % sched.num_heads
        batch = head_batch // sched.num_heads
        offset = Int32(0)
        seqlen = sched.seqlen_static
        if const_expr(self.varlen):
            offset = Int32(sched.mCuSeqlens[batch])
            seqlen = Int32(sched.mCuSeqlens[batch + 1]) - offset
        seg = RankerSegments.load(sched.mBounds, batch, seqlen)
        row_lo = m_block * self.tile_m
        in_range = row_lo < seqlen
        active = seg.tile_active(row_lo, row_lo + self.tile_m)
        return TileWork(m_block, head, batch, offset, seg, in_range, active)

    # ------------------------------------------------------------------ producer
    @cute.jit
    def load(self, ops, sRetry, sched):
        """Warp 0 of the producer warpgroup (``ops``: :class:`ProducerOperands`), for each tile of this CTA:
        TMA of the Q tile, then K and V of each history block (last block first), ``stages`` blocks ahead of the
        consumers, and with ``self_kv_tma`` the tile's own K/V rows (one more stage) if it holds candidate rows
        outside the history.  Tiles with no active row load nothing, nor do tiles with an empty history unless
        ``self_kv_tma`` takes their own rows.  With ``checked_max``, then the tiles the consumers run again
        (:meth:`advance_tile`)."""
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        tile = Int32(cute.arch.block_idx()[0])
        num_tiles = sched.num_tiles
        retry_pos = Int32(0)
        while tile < num_tiles:
            work = self.tile_work(tile, sched)
            n_blocks = work.seg.n_block_count(self.tile_n)
            if work.in_range and work.active and (n_blocks > 0 or self.self_block_taken(work.seg, work.m_block)):
                q_state, kv_state = self.load_tile(ops, work, q_state, kv_state)
            tile, retry_pos = self.advance_tile(tile, retry_pos, sRetry, num_tiles)

    @cute.jit
    def load_tile(self, ops, work, q_state, kv_state):
        """One tile's loads (see :meth:`load`; ``ops``: :class:`ProducerOperands`, ``work``: :class:`TileWork`);
        returns the pipeline states."""
        m_block, head, batch, offset, seg = work.m_block, work.head, work.batch, work.offset, work.seg
        head_kv = head // self.qhead_per_kvhead
        n_block_min, n_blocks = seg.n_block_min(self.tile_n), seg.n_block_count(self.tile_n)
        gQ = cute.local_tile(self._batch_view(ops.tma_Q, batch, offset, head), (self.tile_m, self.head_dim),
                             (m_block, 0))
        gK = cute.local_tile(self._batch_view(ops.tma_K, batch, offset, head_kv), (self.tile_n, self.head_dim),
                             (None, 0))
        gV = cute.local_tile(self._batch_view(ops.tma_V, batch, offset, head_kv), (self.tile_n, self.head_dim),
                             (None, 0))
        tQsQ, tQgQ = cpasync.tma_partition(ops.tma_atom_Q, 0, cute.make_layout(1),
                                           cute.group_modes(ops.sQ, 0, 2), cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(ops.tma_atom_K, 0, cute.make_layout(1),
                                           cute.group_modes(ops.sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(ops.tma_atom_V, 0, cute.make_layout(1),
                                           cute.group_modes(ops.sV, 0, 2), cute.group_modes(gV, 0, 2))
        n_block = n_block_min + n_blocks - 1
        kv = KVCopies(ops.tma_atom_K, ops.tma_atom_V, tKgK, tKsK, tVgV, tVsV, ops.pipeline_k, ops.pipeline_v)
        # (no history block: only a self_kv_tma candidate tile with an empty history, which loads Q and its own rows)
        if n_blocks > 0:  # (K of the first block ahead of Q: the first GEMM needs both)
            self.load_k_block(n_block, kv_state, kv)
        ops.pipeline_q.producer_acquire(q_state)
        cute.copy(ops.tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=ops.pipeline_q.producer_get_barrier(q_state))
        q_state.advance()
        # self_kv_tma: the tile's own K/V rows (tile_m == tile_n: KV block m_block) follow its history blocks
        self_rows = self.self_block_taken(seg, m_block)
        if const_expr(self.config.prefetch_self_kv):
            if self_rows and n_blocks > 0:
                cute.prefetch(ops.tma_atom_K, tKgK[None, m_block])  # (L2 only: the self stage's load below hits it)
                cute.prefetch(ops.tma_atom_V, tVgV[None, m_block])
        if n_blocks > 0:
            kv_state = self.load_v_block(n_block, kv_state, kv)
        for i in cutlass.range(n_blocks - 1, unroll=1):
            kv_state = self.load_kv_block(n_block_min + n_blocks - 2 - i, kv_state, kv)
        if const_expr(self.self_kv_tma):
            if self_rows:  # (for the self term)
                kv_state = self.load_kv_block(m_block, kv_state, kv)
        return q_state, kv_state

    @cute.jit
    def self_block_taken(self, seg, m_block):
        """``self_kv_tma``: whether this tile's own K/V rows come through the K/V pipeline after its history
        blocks (it holds candidate rows outside the history); always False without ``self_kv_tma``.  The producer
        and the consumers decide it alike."""
        taken = cutlass.Boolean(False)
        if const_expr(self.self_kv_tma):
            taken = seg.tile_has_self_rows(m_block * self.tile_m, (m_block + 1) * self.tile_m)
        return taken

    @cute.jit
    def load_k_block(self, n_block, kv_state, kv):
        """TMA of K block ``n_block`` into K/V stage ``kv_state`` (on K's barrier; the state is not advanced)."""
        kv.pipeline_k.producer_acquire(kv_state)
        cute.copy(kv.tma_atom_K, kv.tKgK[None, n_block], kv.tKsK[None, kv_state.index],
                  tma_bar_ptr=kv.pipeline_k.producer_get_barrier(kv_state))

    @cute.jit
    def load_v_block(self, n_block, kv_state, kv):
        """TMA of V block ``n_block`` into K/V stage ``kv_state`` (on V's barrier), whose K was issued; advances."""
        kv.pipeline_v.producer_acquire(kv_state)
        cute.copy(kv.tma_atom_V, kv.tVgV[None, n_block], kv.tVsV[None, kv_state.index],
                  tma_bar_ptr=kv.pipeline_v.producer_get_barrier(kv_state))
        kv_state.advance()
        return kv_state

    @cute.jit
    def load_kv_block(self, n_block, kv_state, kv):
        """TMA of K and V block ``n_block`` into the next K/V stage (each on its own barrier)."""
        self.load_k_block(n_block, kv_state, kv)
        return self.load_v_block(n_block, kv_state, kv)

    # ------------------------------------------------------------------ consumers
    @cute.jit
    def mma(self, tiled_mma_qk, tiled_mma_pv, tma_O, mQ, mK, mV, mO, mLSE, sQ, sVote, sRetry, sK, sV, sO,
            tma_atom_O, pipeline_q, pipeline_k, pipeline_v, tidx, sched, scale_log2, softmax_scale, cap):
        """The consumer warpgroups (2 or 3), for each tile of this CTA: the history loop, the self term,
        normalization and LSE, the epilogue.  With ``checked_max`` a warpgroup runs the fixed max until a tile
        fails its check, the online max after it, and that tile again at the end (:meth:`advance_tile`)."""
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        wg_layout = cute.make_layout(self.config.consumer_wgs, stride=128)
        thr_mma_qk = tiled_mma_qk.get_slice(tidx)
        thr_mma_pv = tiled_mma_pv.get_slice(tidx)
        wg_mma_qk = tiled_mma_qk.get_slice(wg_layout(wg_idx))
        wg_mma_pv = tiled_mma_pv.get_slice(wg_layout(wg_idx))
        tSrQ = wg_mma_qk.make_fragment_A(wg_mma_qk.partition_A(sQ))
        tSrK = wg_mma_qk.make_fragment_B(wg_mma_qk.partition_B(sK))
        tOrVt = wg_mma_pv.make_fragment_B(wg_mma_pv.partition_B(sm90.transpose_view(sV)))
        tOrP = wg_mma_pv.make_fragment_A(wg_mma_pv.partition_shape_A((self.tile_m, self.tile_n)))
        acc_O = cute.make_rmem_tensor(tiled_mma_pv.partition_shape_C((self.tile_m, self.head_dim)), Float32)
        num_rows = cute.size(sm90.acc_mn(acc_O), mode=[0])
        row_max = cute.make_rmem_tensor(num_rows, Float32)
        row_sum = cute.make_rmem_tensor(num_rows, Float32)
        # key columns of this thread in an S tile; rows/cols of this thread in the O tile
        tScS_mn = sm90.acc_mn(thr_mma_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n))))
        tOcO_mn = sm90.acc_mn(thr_mma_pv.partition_C(cute.make_identity_tensor((self.tile_m, self.head_dim))))
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        ops = ConsumerOperands(tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, tOrP, acc_O, row_max, row_sum, tScS_mn,
                               tOcO_mn, mQ, mK, mV, mO, mLSE, tma_O, tma_atom_O, sQ, sK, sV, sO, sVote, pipeline_q,
                               pipeline_k, pipeline_v, tidx, wg_idx, scale_log2, softmax_scale, cap)
        if wg_idx == 0:  # the first warpgroup issues its WGMMAs first
            cute.arch.barrier_arrive(barrier_id=int(NamedBarrierFwd.WarpSchedulerWG1), number_of_threads=256)
        tile = Int32(cute.arch.block_idx()[0])
        num_tiles = sched.num_tiles
        # checked_max: the tile whose fixed max failed its check in this warpgroup (run again after the CTA's own
        # tiles; -1: none yet; once set, the warpgroup runs the online max), the position in that retry pass (0:
        # not in it yet; see advance_tile)
        retry_tile, retry_pos = Int32(-1), Int32(0)
        while tile < num_tiles:
            work = self.tile_work(tile, sched)
            if work.in_range:
                q_state, kv_state, failed = self.mma_tile(ops, work, q_state, kv_state,
                                                          retry_tile < 0 and retry_pos == 0)
                if const_expr(self.config.checked_max):
                    if failed:  # (warpgroup-uniform; only a tile run with the fixed max can fail)
                        retry_tile = tile
            tile, retry_pos = self.advance_tile(tile, retry_pos, sRetry, num_tiles, tidx=tidx, retry_tile=retry_tile)
        if const_expr(self.defer_store_wait):
            if tidx % self.epi_threads < 32:
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # the last tile's store has read sO

    @cute.jit
    def mma_tile(self, ops, work, q_state, kv_state, try_fixed):
        """One tile (``work``: :class:`TileWork`) for this consumer warpgroup (``ops``: :class:`ConsumerOperands`);
        returns the pipeline states and (``checked_max``) whether the fixed max, taken where ``try_fixed``, failed
        its check (the tile's output is then to be recomputed)."""
        m_block, seg, active = work.m_block, work.seg, work.active
        acc_O, row_max, row_sum = ops.acc_O, ops.row_max, ops.row_sum
        pipeline_q = ops.pipeline_q
        n_blocks = seg.n_block_count(self.tile_n)
        n_block_min = seg.n_block_min(self.tile_n)
        acc_O.fill(0.0)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        acc_O_mn = sm90.acc_mn(acc_O)
        num_rows = cute.size(row_max)
        # checked_max: this warpgroup runs the fixed max in this tile
        fixed_rows = try_fixed if const_expr(self.config.checked_max) else cutlass.Boolean(False)
        # self_kv_tma: this tile's own K/V rows follow its history blocks in the K/V pipeline (as loaded)
        self_block = self.self_block_taken(seg, m_block) and active
        # the producer loaded Q (and K/V) for this tile: it has history blocks or (self_kv_tma) its own rows
        q_loaded = active and (n_blocks > 0 or self_block)
        if q_loaded:
            pipeline_q.consumer_wait(q_state)
        if active and n_blocks > 0:
            # row_scale: the O rescale factors of the last softmax, applied just before the next PV GEMM
            row_scale = cute.make_rmem_tensor_like(row_max, Float32)
            hist = HistoryOperands(ops.tiled_mma_qk, ops.tiled_mma_pv, ops.tSrQ, ops.tSrK, ops.tOrVt, ops.tOrP,
                                   acc_O, row_max, row_sum, row_scale, ops.tScS_mn, ops.pipeline_k, ops.pipeline_v,
                                   seg, ops.scale_log2, ops.softmax_scale, ops.cap, ops.wg_idx)
            release_q = not self_block  # (the self block reads q_i from sQ after the loop)
            if const_expr(self.config.checked_max):
                if fixed_rows:
                    kv_state = self.history_loop(kv_state, pipeline_q, q_state, n_blocks, n_block_min, hist,
                                                 release_q, fixed=True)
                else:
                    kv_state = self.history_loop(kv_state, pipeline_q, q_state, n_blocks, n_block_min, hist,
                                                 release_q, fixed=False)
            else:
                kv_state = self.history_loop(kv_state, pipeline_q, q_state, n_blocks, n_block_min, hist,
                                             release_q, fixed=self.config.fixed_row_max)
            if const_expr(not self.self_kv_tma):
                q_state = sm90.advanced(q_state)

        # per-row finish: quad-reduce the sums, the candidate self term, normalize, LSE
        for r in cutlass.range_constexpr(num_rows):
            row_sum[r] = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
        if const_expr(self.self_kv_tma):
            if self_block:  # (tile-uniform)
                rQ, rK, rV = [cute.make_rmem_tensor_like(acc_O, self.dtype) for _ in range(3)]  # (accumulator layout)
                kv_state = self.self_operands_from_smem(ops, rQ, rK, rV, kv_state)
                pipeline_q.consumer_release(q_state)
                rQ_mn, rK_mn, rV_mn = sm90.acc_mn(rQ), sm90.acc_mn(rK), sm90.acc_mn(rV)
                self.fold_self_term(ops, work, fixed_rows, lambda r, c, row: rQ_mn[r, c],
                                    lambda r, c, row: rK_mn[r, c], lambda r, c, row: rV_mn[r, c])
        else:
            self.fold_self_term_from_gmem(ops, work, fixed_rows)
        if const_expr(self.self_kv_tma):
            if q_loaded:
                q_state = sm90.advanced(q_state)  # (after the self block's release of sQ)
        failed = cutlass.Boolean(False)
        if const_expr(self.config.checked_max):
            if fixed_rows:
                failed = self.fixed_max_failed(ops, work)
        lse = cute.make_rmem_tensor(num_rows, Float32)
        for r in cutlass.range_constexpr(num_rows):
            row = m_block * self.tile_m + ops.tOcO_mn[r, 0][0]
            valid = seg.row_active(row) and active and row_sum[r] > 0.0
            inv_sum = Float32(0.0)
            lse[r] = -Float32.inf
            if valid:
                inv_sum = cute.arch.rcp_approx(row_sum[r])
                m_row = row_max[r]
                if self.fixed_max(fixed_rows):
                    m_row = Float32(0.0)
                lse[r] = (m_row * ops.scale_log2 + cute.math.log2(row_sum[r], fastmath=True)) * LN_2
            for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                acc_O_mn[r, c] = acc_O_mn[r, c] * inv_sum

        self.epilogue(ops, work, lse)
        return q_state, kv_state, failed

    @cute.jit
    def fixed_max_failed(self, ops, work):
        """``checked_max``: whether this consumer warpgroup's rows, run against the fixed max of 0, must run
        again with the online max: an active row's sum of P (quad-reduced, with the self term) outside
        [CHECKED_SUM_MIN, CHECKED_SUM_MAX] (NaN included), or a non-finite O accumulator (a product or sum that
        overflowed; a NaN input too, which the online max turns into the same NaN).  Each warp votes over its
        lanes; the four votes meet in ``sVote`` behind the warpgroup's named barrier (the result is
        warpgroup-uniform).  ``sVote`` is written again only after the epilogue's barrier of the next tile."""
        row_sum, tOcO_mn, sVote, tidx = ops.row_sum, ops.tOcO_mn, ops.sVote, ops.tidx
        m_block, seg, active = work.m_block, work.seg, work.active
        ok = cutlass.Boolean(True)
        for r in cutlass.range_constexpr(cute.size(row_sum)):
            row = m_block * self.tile_m + tOcO_mn[r, 0][0]
            in_window = row_sum[r] >= Float32(CHECKED_SUM_MIN) and row_sum[r] <= Float32(CHECKED_SUM_MAX)
            if seg.row_active(row) and active:
                ok = ok and in_window
        # the thread's O values summed: an inf or NaN among them carries through (+inf and -inf give NaN), where a
        # max would drop NaN; a finite sum that overflows fails too (a needless retry, never a wrong result)
        o_sum = ops.acc_O.load().reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        ok = ok and cute.math.abs(o_sum) <= Float32(F32_MAX)
        warp_ok = cute.arch.vote_all_sync(ok)
        warp = tidx // 32
        if tidx % 32 == 0:
            sVote[warp] = Int32(warp_ok)
        wg = tidx // 128
        cute.arch.barrier(barrier_id=int(NamedBarrierFwd.CheckVoteWG1) + wg, number_of_threads=128)
        votes = sVote[4 * wg] + sVote[4 * wg + 1] + sVote[4 * wg + 2] + sVote[4 * wg + 3]
        return votes != 4

    @cute.jit
    def advance_tile(self, tile, retry_pos, sRetry, num_tiles, tidx=None, retry_tile=None):
        """The CTA's next tile: ``tile + gridDim.x``; with ``checked_max``, once those run out, the tiles that its
        consumer warpgroups' fixed max failed (at most one per warpgroup, each once), run with the online max.
        At that turn (once per CTA) the consumers (``tidx`` given) publish their ``retry_tile`` (-1: none) in
        ``sRetry``, the warps that issue the O stores wait for them to complete (a retried tile rewrites its
        rows), and arrive at ``RetryList``, where the producer warp waits, then wait for each other at
        ``RetryListConsumers`` (compute-sanitizer's synccheck refuses one barrier that the producer and the
        consumers both wait at, from two places in the code).  ``retry_pos``: 0 before the retry
        pass, then the index in ``sRetry`` after the tile being retried (>= 1).  Returns (tile, retry_pos); a
        tile >= ``num_tiles`` ends the loop."""
        if const_expr(not self.config.checked_max):
            tile += Int32(cute.arch.grid_dim()[0])
        else:
            if retry_pos > 0:
                tile, retry_pos = self.retry_at(sRetry, retry_pos, num_tiles)
            else:
                tile += Int32(cute.arch.grid_dim()[0])
                if tile >= num_tiles:
                    if const_expr(tidx is not None):
                        if tidx % 128 == 0:  # (sRetry's accesses are atomics: compute-sanitizer's racecheck flagged
                            # plain stores and loads ordered by this named barrier of the producer warp and the
                            # consumers, across warpgroups, as hazards; once per CTA)
                            cute.arch.atomic_exch(sRetry.iterator + tidx // 128, retry_tile, scope="cta")
                        if const_expr(not self.varlen):
                            if tidx % self.epi_threads < 32:
                                cute.arch.cp_async_bulk_wait_group(0, read=False)
                        cute.arch.barrier_arrive(barrier_id=int(NamedBarrierFwd.RetryList),
                                                 number_of_threads=32 + self.num_consumer_threads)
                        cute.arch.barrier(barrier_id=int(NamedBarrierFwd.RetryListConsumers),
                                          number_of_threads=self.num_consumer_threads)
                    else:
                        cute.arch.barrier(barrier_id=int(NamedBarrierFwd.RetryList),
                                          number_of_threads=32 + self.num_consumer_threads)
                    tile, retry_pos = self.retry_at(sRetry, Int32(0), num_tiles)
        return tile, retry_pos

    @cute.jit
    def retry_at(self, sRetry, pos, num_tiles):
        """The first entry of ``sRetry`` at index >= ``pos`` that names a tile (>= 0) not named by an earlier
        entry, and the index after it; ``num_tiles`` if none."""
        found, found_pos = num_tiles, Int32(self.config.consumer_wgs)
        entries = [cute.arch.atomic_add(sRetry.iterator + i, Int32(0), scope="cta")
                   for i in range(self.config.consumer_wgs)]  # (atomic reads: see advance_tile)
        for i in cutlass.range_constexpr(self.config.consumer_wgs - 1, -1, -1):
            t = entries[i]
            fresh = t >= 0 and i >= pos
            for j in cutlass.range_constexpr(i):
                fresh = fresh and entries[j] != t
            if fresh:
                found = t
                found_pos = Int32(i)
        return found, found_pos + 1

    @cute.jit
    def self_operands_from_smem(self, ops, rQ, rK, rV, kv_state):
        """``self_kv_tma``: q_i from the Q tile, k_i and v_i from the K/V stage the producer filled with this
        tile's own rows, into registers in the accumulator layout (ldmatrix, the inverse of the epilogue's
        stmatrix); releases the stage."""
        atom = cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_copy = cute.make_tiled_copy_C(atom, ops.tiled_mma_pv).get_slice(ops.tidx)
        cute.copy(atom, thr_copy.partition_S(ops.sQ), thr_copy.retile(rQ))
        ops.pipeline_k.consumer_wait(kv_state)
        cute.copy(atom, thr_copy.partition_S(ops.sK[None, None, kv_state.index]), thr_copy.retile(rK))
        ops.pipeline_v.consumer_wait(kv_state)
        cute.copy(atom, thr_copy.partition_S(ops.sV[None, None, kv_state.index]), thr_copy.retile(rV))
        cute.arch.sync_warp()  # (every lane's ldmatrix has read the stage before its warp releases it)
        ops.pipeline_k.consumer_release(kv_state)
        ops.pipeline_v.consumer_release(kv_state)
        kv_state.advance()
        return kv_state

    @cute.jit
    def fold_self_term_from_gmem(self, ops, work, fixed_rows):
        """:meth:`fold_self_term` with q_i, k_i, v_i read from global memory (each element where it is used)."""
        tOcO_mn = ops.tOcO_mn
        head_kv = work.head // self.qhead_per_kvhead
        mQ_cur = self._batch_view(ops.mQ, work.batch, work.offset, work.head)
        mK_cur = self._batch_view(ops.mK, work.batch, work.offset, head_kv)
        mV_cur = self._batch_view(ops.mV, work.batch, work.offset, head_kv)

        def at(mX_cur):
            # row r's 64-bit address once (the strides are 64-bit), then each column as a constant offset from the
            # thread's first column: (col0 + k) - col0 folds to k, an immediate of the load
            return lambda r, c, row: cute.domain_offset((tOcO_mn[r, 0][1],), mX_cur[row, None])[
                tOcO_mn[r, c][1] - tOcO_mn[r, 0][1]]

        self.fold_self_term(ops, work, fixed_rows, at(mQ_cur), at(mK_cur), at(mV_cur))

    @cute.jit
    def fold_self_term(self, ops, work, fixed_rows, q_at, k_at, v_at):
        """The candidate rows' own key (``j == i`` outside the history) folded into their softmax (after the
        quad reduction of ``row_sum``): ``s_i = cap(softmax_scale * q_i . k_i)`` from this thread's columns,
        then the quad; ``p_i`` against the row's max; ``O_i += p_i v_i``.  ``q_at(r, c, row)`` (and k, v): the
        element of row ``r``, column ``c`` of this thread's accumulator view, sequence row ``row``, from
        registers (:meth:`self_operands_from_smem`) or global memory."""
        row_max, row_sum, tOcO_mn = ops.row_max, ops.row_sum, ops.tOcO_mn
        scale_log2, softmax_scale, cap = ops.scale_log2, ops.softmax_scale, ops.cap
        m_block, seg, active = work.m_block, work.seg, work.active
        acc_O_mn = sm90.acc_mn(ops.acc_O)
        num_cols = cute.size(acc_O_mn, mode=[1])
        for r in cutlass.range_constexpr(cute.size(row_sum)):
            row = m_block * self.tile_m + tOcO_mn[r, 0][0]
            take_self = seg.takes_self_term(row) and active
            dot = Float32(0.0)
            if take_self:
                for c in cutlass.range_constexpr(num_cols):
                    dot += Float32(q_at(r, c, row)) * Float32(k_at(r, c, row))
            dot = cute.arch.warp_reduction_sum(dot, threads_in_group=4)
            if take_self:
                s_self, _ = sm90.cap_and_slope(dot, softmax_scale, cap, self.cap_method)  # (the slope: unused, removed)
                if self.fixed_max(fixed_rows):
                    p_self = cute.math.exp2(s_self * scale_log2, fastmath=True)
                    row_sum[r] = row_sum[r] + p_self
                    for c in cutlass.range_constexpr(num_cols):
                        acc_O_mn[r, c] = acc_O_mn[r, c] + p_self * Float32(v_at(r, c, row))
                else:
                    m_new = cute.arch.fmax(row_max[r], s_self)
                    scale_old = cute.math.exp2((row_max[r] - m_new) * scale_log2, fastmath=True)
                    p_self = cute.math.exp2((s_self - m_new) * scale_log2, fastmath=True)
                    row_sum[r] = row_sum[r] * scale_old + p_self
                    row_max[r] = m_new
                    for c in cutlass.range_constexpr(num_cols):
                        acc_O_mn[r, c] = acc_O_mn[r, c] * scale_old + p_self * Float32(v_at(r, c, row))

    @cute.jit
    def history_loop(self, kv_state, pipeline_q, q_state, n_blocks, n_block_min, hist, release_q,
                     fixed: cutlass.Constexpr):
        """The tile's history KV blocks, from the last down to the first (only the two edge blocks are
        masked); releases Q once every QK GEMM of the tile completed if ``release_q`` (else the caller does,
        after the self term read q_i from sQ).  ``fixed``: P against the fixed max."""
        wg_idx = hist.wg_idx
        args = (hist, fixed)
        if const_expr(self.config.intra_wg_overlap):
            # FA3-style: the softmax of block n overlaps the PV GEMM of block n+1 (issued just before)
            kv_state = self.first_half_block(kv_state, n_block_min + n_blocks - 1, *args)
            if const_expr(self.config.masked_step_in_loop):  # (the last step masks at run time)
                for i in cutlass.range(n_blocks - 1, unroll=1):
                    kv_state = self.mma_one_n_block_overlap(kv_state, n_block_min + n_blocks - 2 - i, *args,
                                                            need_mask=i == n_blocks - 2)
            else:
                for i in cutlass.range(cutlass.max(n_blocks - 2, 0), unroll=1):
                    kv_state = self.mma_one_n_block_overlap(kv_state, n_block_min + n_blocks - 2 - i, *args,
                                                            need_mask=False)
                if n_blocks > 1:
                    kv_state = self.mma_one_n_block_overlap(kv_state, n_block_min, *args, need_mask=True)
            if release_q:
                pipeline_q.consumer_release(q_state)  # every QK GEMM of this tile has completed
            kv_state = self.last_half_block(kv_state, *args)
        else:
            self.scheduler_sync(wg_idx)
            kv_state = self.mma_one_n_block(kv_state, n_block_min + n_blocks - 1, *args,
                                            is_first=True, need_mask=True)
            # (the last step is a copy of its own whatever masked_step_in_loop: one loop with the mask at run time
            # spilled 8 bytes in the D=64 three-warpgroup configs, session 47)
            for i in cutlass.range(cutlass.max(n_blocks - 2, 0), unroll=1):
                kv_state = self.mma_one_n_block(kv_state, n_block_min + n_blocks - 2 - i, *args,
                                                is_first=False, need_mask=False)
            if n_blocks > 1:
                kv_state = self.mma_one_n_block(kv_state, n_block_min, *args, is_first=False, need_mask=True)
            self.scheduler_arrive(wg_idx)
            if release_q:
                pipeline_q.consumer_release(q_state)
        return kv_state

    @cute.jit
    def mma_one_n_block(self, kv_state, n_block, hist, fixed, is_first: cutlass.Constexpr, need_mask):
        """One history KV block: S = Q K^T, cap, mask (``need_mask``: see :meth:`scores_to_probs`), online
        softmax, O += P V."""
        hist.pipeline_k.consumer_wait(kv_state)
        acc_S = cute.make_rmem_tensor(hist.tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        sm90.wgmma_gemm(hist.tiled_mma_qk, acc_S, hist.tSrQ, hist.tSrK[None, None, None, kv_state.index],
                        zero_init=True)
        self.scheduler_arrive(hist.wg_idx)
        warpgroup.wait_group(0)
        hist.pipeline_k.consumer_release(kv_state)

        self.scores_to_probs(acc_S, n_block, hist, fixed, is_first=is_first, need_mask=need_mask)
        hist.tOrP.store(sm90.acc_as_operand_a(acc_S).load().to(self.dtype))
        if const_expr(not is_first):
            self.rescale_O(hist.acc_O, hist.row_scale, fixed)
        hist.pipeline_v.consumer_wait(kv_state)
        self.scheduler_sync(hist.wg_idx)
        sm90.wgmma_gemm(hist.tiled_mma_pv, hist.acc_O, hist.tOrP,
                        hist.tOrVt[None, None, None, kv_state.index], zero_init=is_first)
        warpgroup.wait_group(0)
        hist.pipeline_v.consumer_release(kv_state)
        kv_state.advance()
        return kv_state

    @cute.jit
    def scores_to_probs(self, acc_S, n_block, hist, fixed, is_first: cutlass.Constexpr, need_mask):
        """Cap, edge mask, online softmax of one S tile in place; the O rescale factors into ``row_scale``.
        ``need_mask``: a Python bool (masked or not, decided at trace time) or a run-time Boolean."""
        self.apply_cap(acc_S, hist.softmax_scale, hist.cap)
        acc_S_mn = sm90.acc_mn(acc_S)
        if const_expr(isinstance(need_mask, bool)):
            if const_expr(need_mask):
                self.mask_keys(acc_S_mn, n_block, hist.tScS_mn, hist.seg)
        elif need_mask:
            self.mask_keys(acc_S_mn, n_block, hist.tScS_mn, hist.seg)
        self.online_softmax(acc_S_mn, hist.row_max, hist.row_sum, hist.row_scale, hist.scale_log2, fixed, is_first)

    @cute.jit
    def mask_keys(self, acc_S_mn, n_block, tScS_mn, seg):
        """-inf at the columns of S (KV block ``n_block``) that are not history keys."""
        for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
            if not seg.col_valid(n_block * self.tile_n + tScS_mn[0, c][1]):
                for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
                    acc_S_mn[r, c] = -Float32.inf

    @cute.jit
    def rescale_O(self, acc_O, row_scale, fixed: cutlass.Constexpr):
        """O *= the rows' rescale factors.  ``skip_unit_rescale``: skipped when every factor of the warp is
        exactly 1 (no row max of the warp changed; exp2(0) is exactly 1, so the output bits are the same),
        a warp-uniform branch on a vote.  Session 9, same run (bench/results/logs/
        2026-11-30_s9_ranker_fwd_skip_rescale.log): faster on the three-warpgroup configs (D=128 tanh
        cap 511 vs 493, D=64 457 vs 441), slower on the two-warpgroup D=128 one (559 vs 607)."""
        if const_expr(fixed):
            pass  # with the fixed max every factor is 1
        elif const_expr(self.config.skip_unit_rescale):
            changed = row_scale[0] != 1.0
            for r in cutlass.range_constexpr(1, cute.size(row_scale)):
                changed = changed | (row_scale[r] != 1.0)
            if cute.arch.vote_any_sync(changed):
                self.scale_rows(acc_O, row_scale)
        else:
            self.scale_rows(acc_O, row_scale)

    @cute.jit
    def scale_rows(self, acc_O, row_scale):
        acc_O_mn = sm90.acc_mn(acc_O)
        for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
            for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                acc_O_mn[r, c] = acc_O_mn[r, c] * row_scale[r]

    @cute.jit
    def first_half_block(self, kv_state, n_block, hist, fixed):
        """Overlapped schedule, first block: S = Q K^T and its softmax; its PV waits for the next step."""
        hist.pipeline_k.consumer_wait(kv_state)
        acc_S = cute.make_rmem_tensor(hist.tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        sm90.wgmma_gemm(hist.tiled_mma_qk, acc_S, hist.tSrQ, hist.tSrK[None, None, None, kv_state.index],
                        zero_init=True)
        warpgroup.wait_group(0)
        hist.pipeline_k.consumer_release(kv_state)
        self.scores_to_probs(acc_S, n_block, hist, fixed, is_first=True, need_mask=True)
        hist.tOrP.store(sm90.acc_as_operand_a(acc_S).load().to(self.dtype))
        return kv_state

    @cute.jit
    def mma_one_n_block_overlap(self, kv_state, n_block, hist, fixed, need_mask):
        """Overlapped step: issue S_n = Q K_n^T, rescale O by the previous softmax's factors while it runs,
        issue O += P_prev V_prev; then the softmax of S_n, while the PV GEMM is in flight.

        With ``early_rescale`` the rescale sits between the two GEMM issues (FlashAttention-3's order), not
        after this step's softmax (session 26 and before; still so without it): ptxas places the wait for the PV GEMM
        before the softmax's exp2s anyway (it converts each P to bf16 right after its exp2, into the registers that
        GEMM reads), so a rescale there lengthened the serial stretch between the PV GEMM's end and the next issue by
        its 64 multiplies per thread.  Same arithmetic, same bits (the first step's factors are 1 and O is still 0).
        H200, same run, online max (session 27's ``norm_bound`` off), CUDA graph: headline 992 vs 1032 us, B=16 1K+256
        318 vs 339, B=8 2K+2K 455 vs 476, 16K 3687 vs 3759
        (bench/results/logs/2026-12-01_s27_ranker_fwd_rescale_before_pv_probe.log); the fixed max has no rescale
        (level)."""
        kv_state_v = kv_state.clone()
        kv_state.advance()
        hist.pipeline_k.consumer_wait(kv_state)
        self.scheduler_sync(hist.wg_idx)
        acc_S = cute.make_rmem_tensor(hist.tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        sm90.wgmma_gemm(hist.tiled_mma_qk, acc_S, hist.tSrQ, hist.tSrK[None, None, None, kv_state.index],
                        zero_init=True)
        if const_expr(self.config.early_rescale):
            self.rescale_O(hist.acc_O, hist.row_scale, fixed)
        hist.pipeline_v.consumer_wait(kv_state_v)
        sm90.wgmma_gemm(hist.tiled_mma_pv, hist.acc_O, hist.tOrP,
                        hist.tOrVt[None, None, None, kv_state_v.index], zero_init=False)
        self.scheduler_arrive(hist.wg_idx)
        warpgroup.wait_group(1)
        hist.pipeline_k.consumer_release(kv_state)
        self.scores_to_probs(acc_S, n_block, hist, fixed, is_first=False, need_mask=need_mask)
        warpgroup.wait_group(0)
        hist.pipeline_v.consumer_release(kv_state_v)
        hist.tOrP.store(sm90.acc_as_operand_a(acc_S).load().to(self.dtype))
        if const_expr(not self.config.early_rescale):
            self.rescale_O(hist.acc_O, hist.row_scale, fixed)
        return kv_state

    @cute.jit
    def last_half_block(self, kv_state, hist, fixed):
        """Overlapped schedule, last step: the last softmax's rescale, then the PV GEMM of the last block."""
        if const_expr(self.config.early_rescale):
            self.rescale_O(hist.acc_O, hist.row_scale, fixed)
        hist.pipeline_v.consumer_wait(kv_state)
        sm90.wgmma_gemm(hist.tiled_mma_pv, hist.acc_O, hist.tOrP,
                        hist.tOrVt[None, None, None, kv_state.index], zero_init=False)
        warpgroup.wait_group(0)
        hist.pipeline_v.consumer_release(kv_state)
        kv_state.advance()
        return kv_state

    @cute.jit
    def online_softmax(self, acc_S_mn, row_max, row_sum, row_scale, scale_log2, fixed: cutlass.Constexpr,
                       is_first: cutlass.Constexpr):
        """Rows of S (already capped and masked) -> P = exp2((s - max) * scale_log2) in place;
        writes into ``row_scale`` the factors by which O must be rescaled.  ``row_sum`` stays a per-thread
        partial.  With the fixed max (:meth:`fixed_max`) the max is 0 for every row, nothing to rescale."""
        if const_expr(fixed):
            self.fixed_max_softmax(acc_S_mn, row_sum, row_scale, scale_log2, is_first)
        else:
            self.running_max_softmax(acc_S_mn, row_max, row_sum, row_scale, scale_log2, is_first)

    @cute.jit
    def fixed_max_softmax(self, acc_S_mn, row_sum, row_scale, scale_log2, is_first: cutlass.Constexpr):
        """P = exp2(s * scale_log2) against a row max of 0 (scores within +-FIXED_MAX_CAP); factors 1."""
        for r in cutlass.range_constexpr(cute.size(row_sum)):
            p_row = cute.math.exp2(acc_S_mn[r, None].load() * scale_log2, fastmath=True)
            p_sum = p_row.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            row_scale[r] = 1.0
            if const_expr(is_first):
                row_sum[r] = p_sum
            else:
                row_sum[r] = row_sum[r] + p_sum
            acc_S_mn[r, None].store(p_row)

    @cute.jit
    def running_max_softmax(self, acc_S_mn, row_max, row_sum, row_scale, scale_log2, is_first: cutlass.Constexpr):
        """The online softmax: P against the running row max (quad-reduced), O's rescale factors."""
        for r in cutlass.range_constexpr(cute.size(row_max)):
            s_row = acc_S_mn[r, None].load()
            m_cur = s_row.reduce(cute.ReductionOp.MAX, -Float32.inf if const_expr(is_first) else row_max[r], 0)
            m_cur = cute.arch.warp_reduction_max(m_cur, threads_in_group=4)
            m_prev = row_max[r]
            row_max[r] = m_cur
            m_safe = 0.0 if m_cur == -Float32.inf else m_cur
            p_row = cute.math.exp2(s_row * scale_log2 - m_safe * scale_log2, fastmath=True)
            p_sum = p_row.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            if const_expr(is_first):
                row_scale[r] = 1.0
                row_sum[r] = p_sum
            else:
                row_scale[r] = cute.math.exp2((m_prev - m_safe) * scale_log2, fastmath=True)
                row_sum[r] = row_sum[r] * row_scale[r] + p_sum
            acc_S_mn[r, None].store(p_row)

    def fixed_max(self, fixed_rows):
        """Whether this warpgroup's rows took the fixed max of 0 (a Python bool for the static cases, else
        ``checked_max``'s warpgroup-uniform runtime choice)."""
        if self.config.fixed_row_max:
            return True
        return fixed_rows if self.config.checked_max else False

    @cute.jit
    def apply_cap(self, acc_S, softmax_scale, cap):
        """Raw scores q.k -> capped scores divided by ``cap``, in place (the factor ``cap`` is folded
        into ``scale_log2 = cap * log2(e)`` on the host); no-op without a cap (``softmax_scale`` is
        folded into ``scale_log2`` then).  tanh: ``tanh(x)``; soft_sign: ``x / (1 + |x|)``, with
        ``x = softmax_scale * s / cap``."""
        if const_expr(self.cap_method == "tanh"):
            acc_S.store(cute.math.tanh(acc_S.load() * (softmax_scale / cap), fastmath=True))
        elif const_expr(self.cap_method == "soft_sign"):
            x_scale = softmax_scale / cap
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i], _ = sm90.soft_sign_unit(acc_S[i] * x_scale)

    @cute.jit
    def scheduler_sync(self, wg_idx):
        """Wait for this warpgroup's turn to issue WGMMAs (the warpgroups take turns round-robin, as in
        FlashAttention-3: each barrier counts its warpgroup and the one before it)."""
        cute.arch.barrier(barrier_id=int(NamedBarrierFwd.WarpSchedulerWG1) + wg_idx, number_of_threads=256)

    @cute.jit
    def scheduler_arrive(self, wg_idx):
        """Hand the turn to the next warpgroup."""
        next_wg = (wg_idx + 1) % self.config.consumer_wgs
        cute.arch.barrier_arrive(barrier_id=int(NamedBarrierFwd.WarpSchedulerWG1) + next_wg, number_of_threads=256)

    # ------------------------------------------------------------------ epilogue
    @cute.jit
    def epilogue(self, ops, work, lse):
        """O (normalized) to the input dtype, through sO (stmatrix) to global memory: a TMA store of the
        epilogue's unit (the tile, or with ``wg_epilogue`` each consumer warpgroup's 64 rows; TMA clips the
        ragged edge) or predicated 16-byte row stores (varlen); the LSE of each row by the thread holding
        its column 0.  The unit's threads sync on its named barrier."""
        acc_O, mLSE, sO, tOcO_mn, tidx = ops.acc_O, ops.mLSE, ops.sO, ops.tOcO_mn, ops.tidx
        m_block, head, batch, offset, seg = work.m_block, work.head, work.batch, work.offset, work.seg
        unit = ops.wg_idx if const_expr(self.wg_epilogue) else 0  # (the warpgroup, or the whole tile)
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        if const_expr(self.defer_store_wait):
            if tidx % self.epi_threads < 32:
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # the previous tile's store has read sO
        # the unit is done reading its rows of sQ (its WGMMAs waited) before sO, which may alias them, is
        # written, and (persistent) its previous TMA store has read its rows of sO
        self.epilogue_barrier(unit)
        smem_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4),
                                        self.dtype)
        smem_thr_copy = cute.make_tiled_copy_C(smem_atom, ops.tiled_mma_pv).get_slice(tidx)
        cute.copy(smem_atom, smem_thr_copy.retile(rO), smem_thr_copy.partition_D(sO))

        # LSE (unless the caller wants none): the thread holding column 0 of a row writes it
        if const_expr(mLSE is not None):
            mLSE_cur = self._lse_view(mLSE, batch, offset, head)
            if tOcO_mn[0, 0][1] == 0:
                for r in cutlass.range_constexpr(cute.size(lse)):
                    row = m_block * self.tile_m + tOcO_mn[r, 0][0]
                    if row < seg.seqlen:
                        mLSE_cur[row] = lse[r]

        if const_expr(not self.varlen):
            cute.arch.fence_view_async_shared()
            self.epilogue_barrier(unit)
            if tidx % self.epi_threads < 32:
                units = self.tile_m // self.epi_rows
                sO_unit = cute.local_tile(sO, (self.epi_rows, self.head_dim), (unit, 0))
                gO = cute.local_tile(self._batch_view(ops.tma_O, batch, offset, head),
                                     (self.epi_rows, self.head_dim), (m_block * units + unit, 0))
                tOsO, tOgO = cpasync.tma_partition(ops.tma_atom_O, 0, cute.make_layout(1),
                                                   cute.group_modes(sO_unit, 0, 2), cute.group_modes(gO, 0, 2))
                cute.copy(ops.tma_atom_O, tOsO, tOgO)
                cute.arch.cp_async_bulk_commit_group()
                if const_expr(not self.defer_store_wait):
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
        else:  # (one epilogue for the tile: wg_epilogue is fixed-length only)
            self.epilogue_barrier(unit)
            gO = cute.local_tile(self._batch_view(ops.mO, batch, offset, head), (self.tile_m, self.head_dim),
                                 (m_block, 0))
            sm90.store_rows_predicated(((sO, gO),), self.num_consumer_threads, tidx, m_block * self.tile_m,
                                       seg.seqlen)

    @cute.jit
    def epilogue_barrier(self, unit):
        """The epilogue unit's named barrier: every consumer (Epilogue), or with ``wg_epilogue`` warpgroup
        ``unit``'s own (EpilogueWG1..3)."""
        if const_expr(self.wg_epilogue):
            cute.arch.barrier(barrier_id=int(NamedBarrierFwd.EpilogueWG1) + unit, number_of_threads=128)
        else:
            cute.arch.barrier(barrier_id=int(NamedBarrierFwd.Epilogue), number_of_threads=self.num_consumer_threads)


# ====================================================================== torch side
def compile_key(dtype: torch.dtype, config: RankerFwdConfig, qhead_per_kvhead: int, cap_method: str, varlen: bool,
                with_lse: bool = True) -> tuple:
    """The compile cache's key of :func:`_compile` (the no-LSE variant's ends with ``"no_lse"``)."""
    return (str(dtype), config, qhead_per_kvhead, cap_method, varlen) + (() if with_lse else ("no_lse",))


def _compile(dtype: torch.dtype, config: RankerFwdConfig, qhead_per_kvhead: int, cap_method: str, varlen: bool,
             with_lse: bool = True):
    """The compiled forward for these keys; ``with_lse=False``: the variant that takes ``lse=None`` and writes
    no LSE (eager calls without ``return_lse``: one output allocation and one launch argument fewer)."""
    def build():
        d = config.head_dim
        al = 8  # 16-bit elements per 16 bytes (TMA stride alignment)
        kern = RankerAttentionFwd(cute_dtype(dtype), config, qhead_per_kvhead, cap_method, varlen)
        hq, hkv = cute.sym_int(), cute.sym_int()
        nb = cute.sym_int()
        if varlen:
            t = cute.sym_int()
            qkv_shape = lambda h: (t, h, d)
            strides = lambda: (wide_stride(al), wide_stride(al), 1)
            lse = fake_tensor(torch.float32, (hq, t), align=4) if with_lse else None
            cu = fake_tensor(torch.int32, (cute.sym_int(),), align=4)
        else:
            s = cute.sym_int()
            qkv_shape = lambda h: (nb, s, h, d)
            strides = lambda: (wide_stride(al), wide_stride(al), wide_stride(al), 1)
            lse = fake_tensor(torch.float32, (nb, hq, s), align=4) if with_lse else None
            cu = None
        q = fake_tensor(dtype, qkv_shape(hq), stride=strides())
        k = fake_tensor(dtype, qkv_shape(hkv), stride=strides())
        v = fake_tensor(dtype, qkv_shape(hkv), stride=strides())
        o = fake_tensor(dtype, qkv_shape(hq))
        bounds = fake_tensor(torch.int32, (cute.sym_int(), 4), align=4)
        return kern, (q, k, v, bounds, o, lse, cu, Float32(1.0), Float32(1.0), Float32(1.0),
                      Int32(1), Int32(1), Int32(1), fake_stream())

    return compile_cached(NAME, compile_key(dtype, config, qhead_per_kvhead, cap_method, varlen, with_lse), build)


def warn_if_spills(dtype: torch.dtype, config: RankerFwdConfig, qhead_per_kvhead: int, cap_method: str,
                   varlen: bool, with_lse: bool = True) -> int:
    """``RuntimeWarning`` when the forward that :func:`_compile` built in this process for these arguments keeps
    registers in local memory (stack bytes in its cubin); returns the largest stack in bytes.
    :func:`ranker_attention` calls it for a caller's config (``config=``, :func:`use_config`) at its first launch;
    the shipped configs are spill-free (CPU tests)."""
    what = (f"ranker_fwd config {config} ({dtype}, GQA {qhead_per_kvhead}, cap {cap_method}"
            f"{', varlen' if varlen else ''})")
    return cache_warn_if_spills(NAME, compile_key(dtype, config, qhead_per_kvhead, cap_method, varlen, with_lse),
                                what)


def compile_targets() -> list[CompileTarget]:
    """What ``cute-kernels compile`` warms: bf16 D=128 MHA (no cap, tanh cap, varlen) and D=64 without a cap, and
    bf16 D=128 without a cap in the variant that writes no LSE (calls without ``return_lse``; label ``no-lse``).
    Other keys (GQA ratios, fp16, D=256, soft_sign, caps above 50, the other no-LSE variants) compile on first
    use (a few seconds each)."""
    cases = [
        (torch.bfloat16, 128, 1, "none", False, True),
        (torch.bfloat16, 128, 1, "tanh", False, True),
        (torch.bfloat16, 64, 1, "none", False, True),
        (torch.bfloat16, 128, 1, "none", True, True),
        (torch.bfloat16, 128, 1, "none", False, False),
    ]
    out = []
    for dtype, d, g, capm, varlen, with_lse in cases:
        cfg = chosen_config(shipped_config(dtype, d, capm), dtype, None if capm == "none" else FIXED_MAX_CAP)
        label = f"{str(dtype)[6:]} D={d} gqa={g} cap={capm}{' varlen' if varlen else ''}{'' if with_lse else ' no-lse'}"
        out.append(CompileTarget(NAME, label, compile_key(dtype, cfg, g, capm, varlen, with_lse),
                                 build=lambda dtype=dtype, cfg=cfg, g=g, capm=capm, varlen=varlen, with_lse=with_lse:
                                 _compile(dtype, cfg, g, capm, varlen, with_lse)))
    return out


_F32_TINY = float(torch.finfo(torch.float32).tiny)
_SCALAR_MAX = F32_MAX / 4


def _check_scalars(softmax_scale, cap, cap_method) -> None:
    """Scalar arguments shared by the op and the reference (``TypeError``/``ValueError`` naming them).

    The kernels form ``softmax_scale * log2(e)``, ``cap * log2(e)`` and ``softmax_scale / cap`` in
    float32, so each is bounded to keep those finite (``_SCALAR_MAX`` = float32 max / 4)."""
    if not isinstance(cap_method, str):
        raise TypeError(f"cap_method must be a str ('tanh', 'soft_sign' or 'none'; the public functions also take "
                        f"None for 'none'), got {type(cap_method).__name__}")
    if cap_method not in CAP_METHODS:
        raise ValueError(f"cap_method={cap_method!r}: expected 'tanh' or 'soft_sign' (or 'none' without a cap)")
    if cap_method == "none" and cap is not None:
        raise ValueError(f"cap={short_repr(cap)} with cap_method='none': give cap_method 'tanh' or 'soft_sign', or "
                         "cap=None")
    # >= 0: the online softmax takes its running max over raw scores (a negative scale would flip it)
    sc = None if softmax_scale is None else check_real("softmax_scale", softmax_scale, low=0.0, high=_SCALAR_MAX)
    if isinstance(sc, float) and 0.0 < sc < _F32_TINY:  # float32 would flush it to 0 (as eps and cap refuse)
        raise ValueError(f"softmax_scale={short_repr(sc)} is below float32's smallest normal 2**-126: give 0 (uniform "
                         "attention over the admitted keys) or a larger scale")
    if cap is not None:
        c = check_real("cap", cap, low=_F32_TINY, high=_SCALAR_MAX)  # a normal float32
        if sc is not None and sc / c > _SCALAR_MAX:
            raise ValueError(f"softmax_scale / cap = {sc / c:.3g} is above float32 max / 4 ({_SCALAR_MAX:.3g}), the "
                             "bound that keeps the kernels' float32 forms finite; use a larger cap")


def _check_max_seqlen(max_seqlen) -> None:
    check_int("max_seqlen", max_seqlen, low=0)


def _check_cu_seqlens_values(cu_seqlens: torch.Tensor, total: int,
                             max_seqlen: Optional[int] = None) -> tuple[int, int]:
    """Check the values of packed-varlen offsets on the host (reads them: a device sync).

    ``cu_seqlens[0] == 0``, non-decreasing, ``cu_seqlens[-1] <= total`` (tokens of q/k/v), and
    ``max_seqlen`` (if given) at least the longest sequence.  Returns ``(longest sequence length,
    cu_seqlens[-1])``.
    Raises ``ValueError`` naming the offending entry: the kernel trusts these values for its loads
    and stores, so bad ones would read or write out of bounds.
    """
    cu = cu_seqlens.detach().to(device="cpu", dtype=torch.int64)  # int64: differences cannot wrap
    if cu.numel() < 2:
        raise ValueError("cu_seqlens must have at least 2 entries (B + 1)")
    if int(cu[0]) != 0:
        raise ValueError(f"cu_seqlens[0] must be 0, got {int(cu[0])}")
    lens = cu[1:] - cu[:-1]
    neg = torch.nonzero(lens < 0)
    if neg.numel():
        i = int(neg[0, 0])
        raise ValueError(f"cu_seqlens must be non-decreasing: cu_seqlens[{i + 1}]={int(cu[i + 1])} < "
                         f"cu_seqlens[{i}]={int(cu[i])}")
    if int(cu[-1]) > total:
        raise ValueError(f"cu_seqlens[-1]={int(cu[-1])} exceeds the {total} packed tokens of q, k, v")
    longest = int(lens.max())
    if max_seqlen is not None and max_seqlen < longest:
        b = int(torch.argmax(lens))
        raise ValueError(f"max_seqlen={max_seqlen} is smaller than sequence {b}'s length {longest} "
                         f"(cu_seqlens[{b + 1}] - cu_seqlens[{b}])")
    return longest, int(cu[-1])


MAX_WORK_TILES = 2**30  # tile + gridDim.x (<= the tile count) must stay below 2^31 in the kernel's Int32 loop


def _check_tile_count(max_seqlen: int, tile_m: int, hq: int, nb: int, varlen: bool = True) -> None:
    """The work list (q tile, head, batch row) is walked with an Int32 index that steps by the grid size
    (one CTA per tile: the tile count): ValueError above :data:`MAX_WORK_TILES` tiles (varlen:
    ``ceil(max_seqlen / tile_m)`` tiles for every one of the B sequences)."""
    m_blocks = -(-max_seqlen // tile_m)
    if exceeds(m_blocks * hq * nb, MAX_WORK_TILES):  # (symbolic sizes: only where the trace proves it)
        fix = ("split the batch, or pass a smaller, exact max_seqlen" if varlen else
               "split the batch or the heads into several calls")
        raise ValueError(f"{m_blocks} q tiles x Hq={hq} x B={nb} exceed 2^30 work tiles (q tiles per sequence x "
                         f"heads x sequences); {fix}")


def _varlen_extent(q: torch.Tensor, cu_seqlens: torch.Tensor, total: int, max_seqlen: Optional[int]):
    """``(max_seqlen, end)`` of a packed call, shared by the forward and the backward.  Offsets drive the
    kernels' loads and stores, so their values are checked whenever the host may read them; ``end`` is
    ``cu_seqlens[-1]`` then, and None while the stream captures a CUDA graph (no host reads: the caller
    guarantees the values, and ``max_seqlen`` is required).  ``max_seqlen`` comes back clamped to
    ``total`` (no valid sequence is longer than the packed total)."""
    end = None
    if _capturing(q):
        if max_seqlen is None:
            raise ValueError("max_seqlen is required with cu_seqlens while a CUDA graph is captured (torch.cuda.graph, "
                             "or torch.compile(mode='reduce-overhead') recording its graph): computing it reads "
                             "cu_seqlens on the host")
    else:
        longest, end = _check_cu_seqlens_values(cu_seqlens, total, max_seqlen)
        max_seqlen = longest if max_seqlen is None else max_seqlen
    return min(max_seqlen, total), end


def _check_gqa(hq: int, hkv: int) -> None:
    """GQA head counts (the kernels' and the reference's): ``ValueError`` unless Hkv >= 1 divides Hq."""
    if hkv == 0 or hq % hkv:
        raise ValueError(f"Hq={hq} must be a multiple of Hkv={hkv}, with Hkv >= 1 (GQA: query head h reads kv head "
                         "h // (Hq // Hkv))")


def _validate(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen, cuda: bool = True,
              pointers: bool = True):
    """Argument checks that depend only on the argument signature (shapes, strides, dtypes, devices,
    scalars), before any launch.  Returns (varlen, B, S_or_T, Hq, Hkv, D).  The values of
    ``cu_seqlens`` are checked separately (:func:`_check_cu_seqlens_values`), on every call.
    ``pointers=False`` skips the data-pointer alignment checks (fake tensors at trace time have no data
    pointers; the strides are checked)."""
    _check_scalars(softmax_scale, cap, cap_method)  # first, as the other ops do
    varlen = cu_seqlens is not None
    nd = 3 if varlen else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, dtypes=DTYPES, ndim=nd, cuda=cuda, align_bytes=0)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {list(k.shape)} and {list(v.shape)}")
    d = int(q.shape[-1])  # (int: a symbolic head dim under torch.compile(dynamic=True) is specialized here)
    if k.shape[-1] != d:
        raise ValueError(f"q and k head dims differ: {d} vs {k.shape[-1]}")
    if d not in CONFIGS:
        raise ValueError(f"head dim {d} is not supported; supported: {sorted(CONFIGS)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, cuda=cuda, data_pointer=pointers)  # then the alignment of pointers and strides
        # (no extent limit: the kernels take 64-bit strides, runtime.fake.wide_stride)
    hq, hkv = q.shape[-2], k.shape[-2]
    _check_gqa(hq, hkv)
    if varlen:
        check_tensor("cu_seqlens", cu_seqlens, dtypes=(torch.int32,), ndim=1, cuda=cuda, align_bytes=4,
                     data_pointer=pointers)
        nb = cu_seqlens.shape[0] - 1
        if nb < 1:
            raise ValueError("cu_seqlens must have at least 2 entries (B + 1)")
        if k.shape[0] != q.shape[0]:
            raise ValueError(f"packed q and k must have the same total length, got {q.shape[0]} and {k.shape[0]}")
        if max_seqlen is not None:
            _check_max_seqlen(max_seqlen)
        seq = q.shape[0]
    else:
        if max_seqlen is not None:
            raise ValueError("max_seqlen is only meaningful with cu_seqlens")
        nb, seq = q.shape[0], q.shape[1]
        if k.shape[0] != nb or k.shape[1] != seq:
            raise ValueError(f"q {list(q.shape)} and k {list(k.shape)} must share batch and sequence sizes")
    if varlen and isinstance(bounds, torch.Tensor) and bounds.dim() == 2 and bounds.shape[0] != nb:
        rows, nb = known(bounds.shape[0]), known(nb)  # (values, not symbols, while tracing)
        raise ValueError(f"bounds has {rows} row{'s' * (rows != 1)}; cu_seqlens has {nb + 1} entries, i.e. B = {nb} "
                         f"sequence{'s' * (nb != 1)}, so bounds must have {nb} row{'s' * (nb != 1)} (one per sequence)")
    check_tensor("bounds", bounds, dtypes=(torch.int32,), shape=(nb, 4), cuda=cuda, align_bytes=4,
                 data_pointer=pointers)
    if not bounds.is_contiguous():
        raise ValueError("bounds must be contiguous")
    check_same_device(q=q, k=k, v=v, bounds=bounds, cu_seqlens=cu_seqlens)  # also at trace time (fakes)
    return varlen, nb, seq, hq, hkv, d


_VALIDATED: dict = {}  # argument signature (shapes, strides, dtypes, devices, scalars) -> _validate's result
# (dtype, config, GQA ratio, cap method, varlen, with LSE) -> compiled function (skips the cache's key work)
_FNS: dict = {}
# (dtype, device, B, S, Hq, Hkv, D, cap method) -> config (tuned or shipped), chosen once per signature
# (B, S are None for varlen); cleared by cute_kernels.tuning.reload() (a new tuned.json entry)
_CHOSEN: dict = register_memo({})
# fixed-length eager calls: _plan_key -> (compiled function, whether q is compact (out = empty_like(q)), lse shape
# or None, the scalar arguments), kept by _ranker_impl (so by the same config
# choice; cleared with _CHOSEN).  A plan holds no device memory (it may be made inside a CUDA-graph capture or a
# cudagraph-trees warm-up, whose memory pool must not keep a block of ours)
_PLANS: dict = register_memo({})


def tuned_shape_key(nb: int, seq: int, hq: int, hkv: int, d: int, cap_method: str,
                    cap: Optional[float] = None) -> str:
    """Key of a tuned config in ``tuned.json`` (:mod:`cute_kernels.tuning`): the sizes the host sees
    without a device sync (the bounds' values are not part of it).  ``cap_method`` is ``"none"``
    without a cap; a ``cap`` above ``FIXED_MAX_CAP`` adds ``>50`` to it (such a cap runs the online max,
    a different kernel to tune: ``"tanh>50"``); None is ``"none"``, as :func:`ranker_attention` takes it."""
    cap_method = "none" if cap_method is None else cap_method
    return f"B={nb},S={seq},Hq={hq},Hkv={hkv},D={d},cap={cap_method}{_cap_suffix(cap_method, cap)}"


def _cap_suffix(cap_method: str, cap: Optional[float]) -> str:
    return f">{FIXED_MAX_CAP:g}" if cap_method != "none" and cap is not None and cap > FIXED_MAX_CAP else ""


def config_for_shape(dtype: torch.dtype, nb: int, seq: int, hq: int, hkv: int, d: int, cap_method: str,
                     varlen: bool = False, gpu: Optional[str] = None, device=None,
                     cap: Optional[float] = None) -> RankerFwdConfig:
    """The config :func:`ranker_attention` launches for these sizes: the winner stored by
    ``cute-kernels tune`` for (this GPU, these sources, dtype, :func:`tuned_shape_key`) when there is
    one (and ``CUTE_KERNELS_TUNED`` is not 0), else the shipped :func:`shipped_config` (dtype, d, cap).  Packed
    (varlen) calls use the shipped one.  ``gpu`` defaults to the name of CUDA ``device`` (None: current);
    ``cap`` (the value) tells caps above ``FIXED_MAX_CAP`` apart (:func:`tuned_shape_key`).  Inside a
    :func:`use_config` block for ``d`` the call runs that block's config instead (not looked at here)."""
    if varlen:
        return shipped_config(dtype, d, cap_method)
    return tuned_config(NAME, RankerFwdConfig, dtype, tuned_shape_key(nb, seq, hq, hkv, d, cap_method, cap),
                        shipped_config(dtype, d, cap_method), gpu=gpu, device=device,
                        accept=lambda c: None if c.head_dim == d else f"head_dim={c.head_dim}, the call's is {d}")


def _pointers_aligned(q, k, v, bounds, cu_seqlens=None) -> bool:
    """What an argument signature does not fix: the data pointers' alignment (16 bytes: q, k, v; 4: bounds,
    cu_seqlens) and that there is data (a pointer of 0: a freed storage), which :func:`_validate` checks.
    (An empty tensor may have a pointer of 0: its calls are then checked in full every time, and pass.)"""
    return aligned_data(16, q, k, v) and aligned_data(4, bounds, cu_seqlens)


def _validate_cached(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen):
    """:func:`_validate` once per argument signature (:func:`~cute_kernels.runtime.validate.validated_once`);
    later calls only re-check :func:`_pointers_aligned`.  The values of ``cu_seqlens`` change between calls
    of one signature: :func:`_ranker_impl` checks them on every call, never through this cache."""
    return validated_once(_VALIDATED, (q, k, v, bounds, cu_seqlens), (softmax_scale, cap, cap_method, max_seqlen),
                          lambda: _pointers_aligned(q, k, v, bounds, cu_seqlens),
                          lambda: _validate(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen))


_OVERRIDES: dict[int, "RankerFwdConfig"] = {}


@contextlib.contextmanager
def use_config(config: "RankerFwdConfig"):
    """Within the ``with`` block, :func:`ranker_attention` runs inputs of ``config.head_dim`` with
    ``config`` instead of the tuned or shipped one (to try a new tile shape without editing the
    module; see ``notebooks/03_new_tile_shape.ipynb``).  Raises ``TypeError`` for anything but a
    :class:`RankerFwdConfig` (a config that does not fit never exists: its constructor, also through
    ``dataclasses.replace``, raises ``ValueError`` with the reason, ``TypeError`` for a wrongly typed field);
    a config whose kernel spills registers runs, with a ``RuntimeWarning`` at its first launch
    (:func:`warn_if_spills`), and so does one whose ``fixed_row_max`` / ``checked_max`` does not apply to
    the call, which then runs with the online max (:func:`warn_fixed_max_dropped`).  Process-wide: while
    open, every thread's calls run it (blocks may open and close in several threads); blocks nest.  Each call
    opens one block (as any ``contextlib.contextmanager``: to open another, call it again; re-entering the
    returned object raises).  The backward's twin: :func:`.ranker_bwd.use_config`.

    ``RankerFwdConfig()``'s field defaults are the plain kernel (one CTA per tile, the online max, no self-term
    TMA stage), not the shipped one; to change one field of what ships, start from it:
    ``dataclasses.replace(shipped_config(torch.bfloat16, 128, "none"), tile_n=96)`` (fields that break the
    smem or register budget, e.g. ``stages=3`` there, are refused with the reason)."""
    if not isinstance(config, RankerFwdConfig):
        raise TypeError(f"use_config takes a RankerFwdConfig, got {type(config).__name__}")
    with override_config(_OVERRIDES, config):
        yield config


_OVERRIDE_STACKS: dict[int, list] = {}  # id(table) -> the open blocks' (head dim, config, token), oldest first
_OVERRIDE_LOCK = threading.Lock()  # (a block opened in one thread while another closes must not be lost)


@contextlib.contextmanager
def override_config(table: dict, config):
    """``table[config.head_dim] = config`` for the ``with`` block (a config is valid once constructed); the body
    of both directions' ``use_config``.  The open blocks are kept as a stack, and on exit a block removes
    its own entry, so the table always holds the newest still-open block's config per head dim (or none),
    also when blocks close out of order (interleaved generators) or in several threads (the updates take a lock;
    a block still applies to every thread's calls)."""
    token = object()
    with _OVERRIDE_LOCK:
        stack = _OVERRIDE_STACKS.setdefault(id(table), [])
        stack.append((config.head_dim, config, token))
        table[config.head_dim] = config
    try:
        yield
    finally:
        with _OVERRIDE_LOCK:
            stack[:] = [entry for entry in stack if entry[2] is not token]
            still_open = [c for d, c, _ in stack if d == config.head_dim]
            if still_open:
                table[config.head_dim] = still_open[-1]
            else:
                table.pop(config.head_dim, None)


def overridden_config(table: dict, head_dim: int, kernel: str):
    """The config of the newest open ``use_config`` block for ``head_dim`` in ``table`` (either direction's), or
    None.  A ``RuntimeWarning`` where blocks are open but none is for ``head_dim``: a config for another head dim
    does not apply, and the call runs the tuned or shipped config (a silent no-op before; a newcomer's finding).
    The warning names the caller's line (:func:`~cute_kernels.runtime.warn.warn_user`)."""
    cfg = table.get(head_dim)
    if cfg is None and table:
        with _OVERRIDE_LOCK:  # (a block closing in another thread resizes the table; free-threaded builds)
            open_dims = sorted(table)
        if open_dims:
            warn_user(f"{kernel}.use_config: the open block(s) hold configs for head_dim {open_dims}, not this "
                      f"call's head_dim={head_dim}: it runs the tuned or shipped config")
    return cfg


def exp2_scale(softmax_scale: float, cap: Optional[float]) -> float:
    """The kernels' ``exp2`` multiplier of a score (forward and backward): ``cap * log2(e)`` with a cap
    (the capped score is ``cap * t``, ``t`` in (-1, 1); see :meth:`RankerAttentionFwd.apply_cap`), else
    ``softmax_scale * log2(e)``, at least the smallest normal float32.  The floor: ``softmax_scale = 0``
    (accepted: uniform attention over the admitted keys; scales in (0, 2**-126) are refused by the argument
    checks) would make the masked keys' ``-inf * 0`` a NaN; at the floor every finite score maps to
    ``exp2(~0) = 1`` and ``-inf`` stays ``-inf``, which is the uniform softmax exactly, and the LSE is
    ``ln(count)``."""
    return max(float(cap) * LOG2_E if cap is not None else softmax_scale * LOG2_E, _F32_TINY)


def fixed_row_max_applies(dtype: torch.dtype, cap: Optional[float]) -> bool:
    """Whether a config's ``fixed_row_max`` holds for these inputs: bfloat16 and ``cap <= FIXED_MAX_CAP``
    (see :class:`RankerFwdConfig`); where not, :func:`ranker_attention` runs the config with the online max."""
    return cap is not None and dtype == torch.bfloat16 and float(cap) <= FIXED_MAX_CAP


@functools.lru_cache(maxsize=None)
def _online_max(cfg: RankerFwdConfig) -> RankerFwdConfig:
    return dataclasses.replace(cfg, fixed_row_max=False, checked_max=False)


def chosen_config(cfg: RankerFwdConfig, dtype: torch.dtype, cap: Optional[float]) -> RankerFwdConfig:
    """What ``cfg`` runs as for these inputs: ``cfg`` with the fixed-max option it can take
    (``fixed_row_max`` where :func:`fixed_row_max_applies`, ``checked_max`` for bfloat16 without a cap), else the
    online max.  ``cute-kernels tune`` times its candidates through this, so a stored winner was timed as it
    runs; a caller's config (``config=``, :func:`use_config`) that loses its fixed max here gets a
    ``RuntimeWarning`` (:func:`warn_fixed_max_dropped`)."""
    if cfg.fixed_row_max and not fixed_row_max_applies(dtype, cap):
        return _online_max(cfg)
    if cfg.checked_max and (cap is not None or dtype != torch.bfloat16):
        return _online_max(cfg)
    return cfg


_DROPPED_WARNED: set = set()


def warn_fixed_max_dropped(config: RankerFwdConfig, dtype: torch.dtype, cap: Optional[float]) -> None:
    """``RuntimeWarning`` (once per config, dtype and cap) when a caller's config (``config=``, :func:`use_config`)
    asks for ``fixed_row_max`` or ``checked_max`` where it does not apply (float16; ``fixed_row_max`` without a
    cap or with one above ``FIXED_MAX_CAP``; ``checked_max`` with a cap): :func:`chosen_config` runs it with the
    online max instead, the same results at the online max's speed.  The warning names the caller's line
    (:func:`~cute_kernels.runtime.warn.warn_user`)."""
    key = (config, dtype, cap)
    if key in _DROPPED_WARNED or len(_DROPPED_WARNED) >= MEMO_LIMIT:
        return
    what = "fixed_row_max" if config.fixed_row_max else "checked_max"
    if dtype != torch.bfloat16:
        why = "it needs bfloat16"
    elif config.fixed_row_max:
        why = f"it needs a cap, <= FIXED_MAX_CAP = {FIXED_MAX_CAP}"
    else:
        why = "it is for calls without a cap"
    warn_user(f"ranker_fwd config {config}: {what} does not apply to this call ({dtype}, cap={cap}: {why}); "
              "it runs with the online max (same results, not the fixed max's speed)")
    _DROPPED_WARNED.add(key)  # (after the warning: where warnings are errors, every such call raises)


def config_for_call(q, k, v, bounds, softmax_scale=None, cap=None, cap_method="tanh", cu_seqlens=None,
                    max_seqlen=None) -> RankerFwdConfig:
    """The config :func:`ranker_attention` runs for these arguments (same signature, no ``return_lse``): an open
    :func:`use_config` block's for their head dim, else :func:`config_for_shape`'s (tuned for q's CUDA device,
    the current one for CPU and meta tensors, or shipped), with the fixed max dropped where it does not apply
    (:func:`chosen_config`; its ``self_kv_tma`` and ``prefetch_self_kv`` stay as set: the kernel takes them only
    where the tile allows, :func:`self_kv_tma_taken`, which the ``cute-kernels layouts`` report says).  No launch,
    no compile, no device: tensors on any device, meta and CPU included (to see on a CPU which tile shape a call
    would take).  Raises the ``TypeError`` / ``ValueError`` of :func:`ranker_attention`'s argument checks but the
    CUDA-device rule and the data pointers' alignment (``cu_seqlens``' values are not read), and its limit of
    2^30 work tiles for the chosen tile_m (a packed call's only with ``max_seqlen``, which it needs)."""
    if cap_method is None:
        cap_method = "none"
    varlen, nb, seq, hq, hkv, d = _validate(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen,
                                            cuda=False, pointers=False)
    capm = "none" if cap is None else cap_method
    device = q.device if q.device.type == "cuda" else None  # (CPU / meta: the current CUDA device's)
    cfg = overridden_config(_OVERRIDES, d, NAME) or config_for_shape(q.dtype, nb, seq, hq, hkv, d, capm, varlen,
                                                                     device=device, cap=cap)
    cfg = chosen_config(cfg, q.dtype, cap)
    if not varlen or max_seqlen is not None:  # (the launch's limit; packed without max_seqlen: cu_seqlens' values)
        _check_tile_count(max_seqlen if varlen else seq, cfg.tile_m, hq, nb, varlen)
    return cfg


def _ranker_impl(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen, out=None, lse=None,
                 config: Optional[RankerFwdConfig] = None, max_ctas: Optional[int] = None, plan_key=None,
                 with_lse: bool = True):
    """Validate, allocate (unless ``out``/``lse`` are given: tests pass NaN-poisoned buffers), launch.
    ``plan_key`` (:func:`_ranker_eager`'s :func:`_plan_key` of a fixed-length call with the chosen config):
    keep the launch in ``_PLANS`` under it.  ``with_lse=False``: no LSE (the kernel variant that writes
    none; ``lse`` is ignored and None is returned for it)."""
    varlen, nb, seq, hq, hkv, d = _validate_cached(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens,
                                                   max_seqlen)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(d)
    capm = "none" if cap is None else cap_method
    scale_log2 = exp2_scale(scale, cap)
    if out is None:
        out = q.new_empty(q.shape)  # compact (new_empty: ~2 us less host time than torch.empty(..., device=))
    end = None  # packed: where the last sequence ends, when the host knows it (not while capturing)
    if not with_lse:
        lse = None
    elif lse is None:
        lse = q.new_empty((hq, seq) if varlen else (nb, hq, seq), dtype=torch.float32)
    if varlen:
        max_seqlen, end = _varlen_extent(q, cu_seqlens, seq, max_seqlen)
        # packed tokens past cu_seqlens[-1] belong to no sequence and the kernel never writes them:
        # out = 0, lse = -inf there (eager: the known tail; in capture: a device-side mask)
        if end is None:
            tail = torch.arange(seq, device=q.device) >= cu_seqlens[-1]
            out.masked_fill_(tail[:, None, None], 0)
            if lse is not None:
                lse.masked_fill_(tail[None, :], -math.inf)
        elif end < seq:
            out[end:].zero_()
            if lse is not None:
                lse[:, end:].fill_(-math.inf)
    else:
        max_seqlen = seq
    if out.numel() == 0 or max_seqlen == 0:
        if lse is not None:
            lse.fill_(-math.inf)
        out.zero_()
        return out, lse
    if config is not None and config.head_dim != d:
        raise ValueError(f"config.head_dim={config.head_dim} does not match the inputs' head dim {d}")
    cfg = config if config is not None else overridden_config(_OVERRIDES, d, NAME)
    chosen_here = cfg is None
    memoized = False  # the choice is kept in _CHOSEN (one that is not may change between calls)
    if cfg is None:  # tuned (cute-kernels tune) or shipped, chosen once per signature
        since = tuning_generation()
        skey = (q.dtype, q.device, None if varlen else nb, None if varlen else seq, hq, hkv, d,
                capm + _cap_suffix(capm, cap))
        cfg = _CHOSEN.get(skey)
        if cfg is None:
            cfg = config_for_shape(q.dtype, nb, seq, hq, hkv, d, capm, varlen, device=q.device, cap=cap)
            if len(_CHOSEN) < 4096:
                memo_store(_CHOSEN, skey, cfg, since)
        memoized = _CHOSEN.get(skey) is cfg
    run_cfg = chosen_config(cfg, q.dtype, cap)
    if not chosen_here and run_cfg is not cfg:
        warn_fixed_max_dropped(cfg, q.dtype, cap)
    cfg = run_cfg
    _check_tile_count(max_seqlen, cfg.tile_m, hq, nb, varlen)
    fkey = (q.dtype, cfg, hq // hkv, capm, varlen, with_lse)
    fn = _FNS.get(fkey)
    if fn is None:
        fn = _FNS[fkey] = _compile(q.dtype, cfg, hq // hkv, capm, varlen, with_lse)
        if not chosen_here:  # a caller's config (config=, use_config): say so when it spills
            warn_if_spills(q.dtype, cfg, hq // hkv, capm, varlen, with_lse)
    if cfg.persistent:
        max_ctas = max_ctas or sm_count(q.device)  # tests pass a small count to force many tiles per CTA
    else:
        max_ctas = 2**31 - 1  # one tile per CTA (sO aliases sQ)
    tail = (scale_log2, scale, float(cap) if cap is not None else 1.0, nb, max_seqlen, max_ctas)
    fn(q, k, v, bounds, out, lse, cu_seqlens, *tail)
    if plan_key is not None and memoized and not varlen and len(_PLANS) < MEMO_LIMIT:
        memo_store(_PLANS, plan_key, (fn, is_compact(q), None if lse is None else lse.shape, tail), since)
    return out, lse


_LARGEST_TILE_M = max(c.tile_m for c in (*CONFIGS.values(), *CAP_CONFIGS.values()))


def _fake(q, k, v, bounds, softmax_scale=None, cap=None, cap_method="tanh", cu_seqlens=None, max_seqlen=None):
    # at trace time: every rule a fake tensor allows (shapes, dtypes, strides; no data pointers)
    _validate(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen, cuda=False, pointers=False)
    # the work-tile limit at the largest shipped tile_m (the config is chosen when the op runs, so the real call
    # may still refuse what passes here); packed: with max_seqlen clamped to the packed total, as the eager call
    # clamps it (_varlen_extent), and only when it is given (else the eager call reads it from cu_seqlens)
    if cu_seqlens is None:
        _check_tile_count(q.shape[1], _LARGEST_TILE_M, q.shape[2], q.shape[0], varlen=False)
    elif max_seqlen is not None:
        ms = max_seqlen if isinstance(max_seqlen, (int, torch.SymInt)) else operator.index(max_seqlen)
        _check_tile_count(torch.sym_min(ms, q.shape[0]), _LARGEST_TILE_M, q.shape[1], cu_seqlens.shape[0] - 1)
    if cu_seqlens is not None:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return q.new_empty(q.shape), lse  # compact, like the real output (not q's strides)


def _precheck(q, k, v, bounds, softmax_scale=None, cap=None, cap_method="tanh", cu_seqlens=None, max_seqlen=None):
    _check_scalars(softmax_scale, cap, cap_method)
    if max_seqlen is not None:  # the schema would turn True into 1
        _check_max_seqlen(max_seqlen)


@custom_op("ranker_attention_fwd", mutates_args=(), fake=_fake, precheck=_precheck)
def _ranker_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor,
               softmax_scale: Optional[float] = None, cap: Optional[float] = None, cap_method: str = "tanh",
               cu_seqlens: Optional[torch.Tensor] = None,
               max_seqlen: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _ranker_eager(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen)


ranker_autograd.register(_ranker_op.op)
ranker_flops.register("ranker_attention_fwd")  # FlopCounterMode counts its useful FLOPs


_grad_enabled = torch.is_grad_enabled
_empty_like = torch.empty_like


def _autocast_inputs(q, k, v):
    """Under ``torch.autocast`` for q's device type (CUDA, and meta tensors as stand-ins for CUDA ones, so that
    shape inference on meta sees the CUDA call's dtypes; CPU too, where the op then refuses the device):
    ``(q, k, v)`` with every float32 one cast to the autocast dtype, as torch's
    ``scaled_dot_product_attention`` casts its float32 inputs (autocast's lower-precision list); bfloat16 and
    float16 inputs pass as they are, where SDPA would cast them to the autocast dtype too (no silent precision
    change of a 16-bit input): a 16-bit input of the other type beside cast ones raises ``TypeError`` saying so.
    With autocast off the inputs unchanged.  The cast is differentiable: float32 leaves get float32 gradients."""
    device = q.device.type if isinstance(q, torch.Tensor) else None
    device = "cuda" if device == "meta" else device
    if (device not in ("cuda", "cpu") or not torch.is_autocast_enabled(device)
            or not any(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in (q, k, v))):
        return q, k, v
    dtype = torch.get_autocast_dtype(device)
    other = [(name, t.dtype) for name, t in zip("qkv", (q, k, v))
             if isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16) and t.dtype != dtype]
    if other:
        raise TypeError(f"under torch.autocast(dtype={dtype}) the float32 ones of q, k, v are cast to {dtype}, but "
                        + ", ".join(f"{name} is {dt}" for name, dt in other) + f" (q {q.dtype}, k {k.dtype}, v "
                        f"{v.dtype} as passed): q, k and v must share a dtype")
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t for t in (q, k, v))


def ranker_attention(q, k, v, bounds, softmax_scale=None, cap=None, cap_method="tanh", return_lse=False,
                     cu_seqlens=None, max_seqlen=None):
    """Ranker attention forward (history + candidates mask) on Hopper.

    Query ``i`` attends key ``j`` iff ``(j in history and (i in history or i in candidates))``
    ``or (i in candidates and j == i)`` (the ranker attention of the project's seed 002, a JAX
    Pallas/Mosaic-GPU kernel for recommender rankers; issue 3).  Scores ``s = softmax_scale * q.k``,
    then the optional cap, then the mask; softmax over admitted keys; ``out = P @ v``.  The kernel is
    a FlashAttention-3-style warp-specialized online softmax (Shah et al. 2024, arXiv 2407.08608).

    Args:
        q: ``[B, S, Hq, D]`` (or packed ``[T, Hq, D]`` with ``cu_seqlens``), bfloat16/float16, CUDA,
            last dim contiguous, other strides multiples of 16 bytes, data pointer 16-byte aligned (k and v
            too).  D in {64, 128, 256}.
        k, v: ``[B, S, Hkv, D]`` (or ``[T, Hkv, D]``), same dtype; ``Hq % Hkv == 0`` (GQA: query head
            ``h`` uses kv head ``h // (Hq // Hkv)``).  q, k and v must be finite in every row, those of neither
            segment (padding) included: the kernels load whole tiles around the segments, and a NaN or inf in
            such a row reaches the admitted rows' results through the GEMMs (``0 * NaN``; a NaN in v's padding
            turns the ``out`` of the sequences whose loaded tiles hold it NaN, one in q's the padding rows' own
            ``out``), as with FlashAttention and FlexAttention.  Zero-fill padding.
        bounds: ``[B, 4]`` int32, contiguous, 4-byte aligned: (hist_lo, hist_hi, cand_lo, cand_hi), half-open, per
            sequence (relative to the sequence start in the varlen form).  Values are clamped to
            ``[0, seqlen]`` and ``hi < lo`` means empty; out-of-range bounds are never an error.
        softmax_scale: None or a real number in ``[0, float32 max / 4]``, default ``1/sqrt(D)`` (0: uniform
            attention over the admitted keys; otherwise at least float32's smallest normal, 2**-126).
        cap: None (no cap) or a real number in ``[2**-126, float32 max / 4]`` (a normal float32, with
            ``softmax_scale / cap`` at most float32 max / 4 as well); ``cap_method``
            ``"tanh"`` (``cap*tanh(s/cap)``) or ``"soft_sign"`` (``s/(1+|s|/cap)``); applied before
            the mask.  ``cap_method="none"`` (or None) is accepted with ``cap=None`` only.
        return_lse: also return the log-sum-exp.  Without it an eager call (grad off) launches the kernel
            variant that writes no LSE (one output allocation and one launch argument fewer: host time per
            call); that variant compiles on its first use (a few seconds; ``cute-kernels compile`` warms
            bf16 D=128).
        cu_seqlens: ``[B+1]`` int32 (same device, contiguous) offsets of the packed form:
            ``cu_seqlens[0] == 0``, non-decreasing, ``cu_seqlens[-1] <= T``; sequence ``b`` is
            tokens ``cu_seqlens[b]:cu_seqlens[b+1]``.  ``max_seqlen``: None or an int >= the longest
            sequence (``cu_seqlens[b+1] - cu_seqlens[b]``), at most ``2**31 - 1``.  Packed tokens past
            ``cu_seqlens[-1]`` belong to no sequence: their ``out`` is 0 and ``lse`` -inf.
            The values are checked on the host (a device sync) on every eager call, and
            ``max_seqlen`` is computed from them when omitted.  While the current stream captures
            a CUDA graph the host cannot read them: ``max_seqlen`` is then required and the values
            are NOT checked; the caller must guarantee them (invalid offsets make the kernel read
            and write out of bounds), also for every replay.
    Config: inside a :func:`use_config` block for D, that block's; else, for fixed-length calls, the one
    ``cute-kernels tune`` stored for this GPU and these sizes (:func:`config_for_shape`; packed calls never
    take a tuned config), else the shipped one (:func:`shipped_config`: ``CAP_CONFIGS[(cap_method, D)]`` with a
    cap where there is one, else ``CONFIGS[D]``); ``CUTE_KERNELS_TUNED=0`` ignores tuned configs.  bfloat16 skips the
    running row max (P against a fixed max of 0, see the module docstring) with a cap <= ``FIXED_MAX_CAP``
    (50; not soft_sign at D=64, whose shipped config keeps the online max), and without a cap (D=64/128/256)
    wherever the result passes a check after each q tile (per 64-row warpgroup: every row's sum of P within
    [2^-20, 2^100] and the O accumulator finite; a warpgroup that fails runs its tile again, and its later
    tiles, with the online max: rows whose scores all sit below about -14 - ln(keys), or reach past ~69);
    float16 and larger caps take the online max.  Accuracy then: up to one
    bf16 ulp off where a row's weight sits on keys of equal score (saturated at +cap, or a single key); with a
    cap, ``v`` within the headroom: sum over a row's keys of ``e^50 |v|`` below float32's max (|v| < 6.6e16
    for one key), and |v| above ~1e-16 where every score of a row is near -50.
    Autograd: differentiable in q, k and v (every head dim: 64, 128, 256) when grad mode is on and one of
    them requires grad: the backward is :func:`.ranker_bwd.ranker_attention_backward` (deterministic where torch's
    ``torch.use_deterministic_algorithms`` flag is on, else its default mode), registered on the forward op
    (:mod:`.ranker_autograd`); ``lse`` is differentiable too (a loss term on it, e.g. merging attention computed
    over key chunks, or a z-loss, adds its gradient to q and k; rows with ``lse = -inf`` get none; so under grad
    ``lse.requires_grad`` is True: ``.detach()`` it before ``.numpy()``).
    ``torch.func`` transforms (grad, vjp, vmap, ...) and forward-mode AD (``torch.autograd.forward_ad`` dual
    tensors) are not supported: ``NotImplementedError`` eagerly (torch's custom ops support neither their
    autograd nor batching for these kernels; there is no forward-mode formula); inside ``torch.compile``,
    torch's own handling (``grad``: its ``setup_context`` error; ``vmap``: the op once per slice).
    Meta tensors: the op's fake gives the outputs' shapes (the argument checks run; no launch).
    FLOP counting: ``torch.utils.flop_counter.FlopCounterMode`` counts the forward and backward ops at their
    useful FLOPs (``4 * D * Hq`` and ``10 * D * Hq`` per admitted pair; :mod:`.ranker_flops`), reading the
    bounds' values (a device sync per counted call); on meta tensors and during a graph capture the dense upper
    bound.  A counter copies torch's formula registry when made: one made before this module loaded and entered
    after misses the ops (one active while it loads, e.g. around the first call, gets them; so does one made
    after ``cute_kernels.register_ops()``).
    ``torch.autocast`` (CUDA): float32 q, k, v are cast to the autocast dtype first, as
    ``torch.nn.functional.scaled_dot_product_attention`` casts them (``out`` then has that dtype; the gradients
    of float32 inputs are float32); bfloat16 / float16 inputs run as they are (SDPA would also cast a 16-bit
    input of the other type), and a mix of the two is refused.  Without autocast float32 is refused.  (The
    registered op ``torch.ops.cute_kernels.ranker_attention_fwd`` itself does not cast.)
    Returns:
        ``out`` like ``q`` (under autocast, in the dtype q was cast to); with ``return_lse`` also ``lse``
        float32 ``[B, Hq, S]`` (``[Hq, T]`` varlen), natural-log units.  Rows in neither segment: ``out = 0``,
        ``lse = -inf``.
    Raises:
        TypeError: wrong dtypes (q/k/v not bf16/fp16 (after autocast's cast) or mixed, bounds/cu_seqlens not
            int32); return_lse not a bool;
            cap / softmax_scale not a real number (bool and strings included), max_seqlen not an int,
            cap_method neither a str nor None.
        ValueError: wrong shapes/strides/devices, unsupported head dim, Hq not a multiple of Hkv,
            bounds rows != B, misaligned data pointers, a cap outside [2**-126, float32 max / 4], a
            softmax_scale negative, non-finite, above float32 max / 4 or in (0, 2**-126), softmax_scale / cap
            above float32 max / 4, a cap with cap_method "none", max_seqlen without cu_seqlens, unknown
            cap_method, invalid cu_seqlens values or a max_seqlen below the longest sequence,
            max_seqlen omitted during CUDA-graph capture, ceil(max_seqlen / tile_m) x Hq x B > 2^30
            work tiles; for the backward (``.backward()``), B or Hq above 65535.  (No size limit
            otherwise: the kernels compute 64-bit offsets; GPU-tested past 2^31 elements.)
        RuntimeError: a backward with ``create_graph=True`` (no double backward); a tensor on a GPU that is
            not a Hopper (sm_90) GPU, or a process whose CuTe DSL targets another arch.
        Under ``torch.compile(fullgraph=True)`` these surface wrapped by Dynamo (``TorchRuntimeError`` /
        ``Unsupported``); without ``fullgraph`` or eagerly, as listed.
    """
    if return_lse is not True and return_lse is not False:  # (the eager hot path: no call for a plain bool)
        return_lse = check_bool("return_lse", return_lse)
    if cap_method is None:  # (no cap, as shipped_config's None)
        cap_method = "none"
    plain = plain_eager()  # (one check on the eager hot path for both below)
    if not plain:
        refuse_func_transforms("ranker_attention", q, k, v, bounds, cu_seqlens, differentiable=True)
    if (not plain and tracing() or getattr(q, "is_meta", False)
            or _grad_enabled() and (isinstance(q, torch.Tensor) and q.requires_grad
                                    or isinstance(k, torch.Tensor) and k.requires_grad
                                    or isinstance(v, torch.Tensor) and v.requires_grad)):
        # the registered op: seen by torch.compile / make_fx, differentiable (ranker_autograd), meta tensors
        # through its fake (shapes only)
        q, k, v = _autocast_inputs(q, k, v)
        out, lse = _ranker_op(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen)
    else:  # eager without grad: what the op's fast path would run (its grad re-check skipped: ~2 us); without
        # return_lse, the kernel variant that writes no LSE (one allocation and one launch argument fewer)
        out, lse = _ranker_eager(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen,
                                 with_lse=return_lse, autocast=True)
    return (out, lse) if return_lse else out


def _plan_key(q, k, v, bounds, softmax_scale, cap, cap_method, with_lse) -> tuple:
    """What a fixed-length call's launch plan depends on and the compiled function does not check itself:
    q's shape, strides, dtype and device (the output's allocation, the grid, the config choice), k's shape
    (the GQA ratio, compiled in), k's and v's strides (tvm-ffi takes stride 0, which :func:`_validate`
    refuses), the bounds' shape (one row per batch row) and dtype
    (tvm-ffi takes uint32 for int32, and a bounds of another array library has a tuple shape equal to
    torch's), and the scalars with their types (``True == 1`` hash alike; a bool may be refused where an
    int is not).  The rest, the compiled function's own argument checks (tvm-ffi, in compiled code, before it
    launches) refuse: k's and v's dtypes, v's shape (k's), unit column strides and 16-byte divisible strides,
    the bounds' compact layout, 16-byte (bounds: 4-byte) aligned data, every tensor on q's device;
    :func:`_ranker_eager` then explains the refusal with the full path's checks.  (Not a tensor whose storage
    was freed, ``untyped_storage().resize_(0)``, keeping its shape: a data pointer of 0, which the full path
    refuses, reaches the kernel from a kept plan, as it would reach torch's own kernels.)  Raises
    AttributeError / TypeError / RuntimeError for arguments that cannot be keyed."""
    return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), v.stride(), bounds.shape, bounds.dtype,
            type(softmax_scale), softmax_scale, type(cap), cap, type(cap_method), cap_method, with_lse)


def _ranker_eager(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen, with_lse: bool = True,
                  autocast: bool = False):
    """The eager call: a fixed-length call whose :func:`_plan_key` the full path (:func:`_ranker_impl`: every
    check, config choice, compiled function) has run before launches its kept plan; anything else, and
    calls inside a :func:`use_config` block, take the full path, which keeps the plan of a new key.  What
    the key leaves out (other dtypes, layouts, alignment or devices of k, v and the bounds) the compiled
    function refuses before it launches (``ValueError`` / ``TypeError`` from its checks; ``RuntimeError`` /
    ``BufferError`` where tvm-ffi cannot pack a tensor at all: meta, sparse, bit or quantized dtypes): the
    call then runs the full path, whose checks raise the error that explains it (issue 3's host-overhead target: on the
    H200's host the full path costs 23.5-27 us per call, session 33's ``bench/host_breakdown.py``; the plan
    9.9-15.5 without the LSE, 1.4-2.2 us less than with session 24-37's key of every tensor's shape, strides,
    dtype and device plus an alignment check, session 38's ``bench/ranker_plan_key_ab.py``).  The plan
    allocates ``out`` with ``torch.empty_like(q)`` where q is compact (:mod:`~cute_kernels.runtime.alloc`), the
    rest with ``new_empty``.  ``with_lse=False``: no LSE (None in its place; a plan of its own).  ``autocast``
    (:func:`ranker_attention`'s eager call, not the op, whose fake keeps the input dtype): float32 inputs under
    ``torch.autocast`` cast first (:func:`_autocast_inputs`; no plan kept for such calls)."""
    key = None
    if cu_seqlens is None and max_seqlen is None and not _OVERRIDES:
        try:
            key = _plan_key(q, k, v, bounds, softmax_scale, cap, cap_method, with_lse)
            plan = _PLANS.get(key)
        except (AttributeError, TypeError, RuntimeError):  # (unhashable scalars; sparse / nested tensors)
            key = plan = None
        if plan is not None:
            fn, q_compact, lse_shape, tail = plan
            # (empty_like: 1.8-2.2 us of host time on the H200's host, new_empty 3.1-3.8; runtime.alloc)
            out = _empty_like(q) if q_compact else q.new_empty(q.shape)
            lse = None if lse_shape is None else q.new_empty(lse_shape, dtype=torch.float32)
            try:
                fn(q, k, v, bounds, out, lse, None, *tail)
                return out, lse
            except (ValueError, TypeError, RuntimeError, BufferError):  # refused before the launch (or a
                pass  # launch error, which the full path meets again): the full path below explains
    if autocast:
        cast = _autocast_inputs(q, k, v)
        if cast[0] is not q or cast[1] is not k or cast[2] is not v:
            (q, k, v), key = cast, None
    return _ranker_impl(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen, plan_key=key,
                        with_lse=with_lse)


def _check_reference_args(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen) -> None:
    check_float_tensors(q=q, k=k, v=v)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if without_data(q):
        raise ValueError("the reference builds its mask from the bounds' values: it needs tensors with data, "
                         "not 'meta' or fake ones (FakeTensorMode, torch.compile tracing)")
    if not isinstance(bounds, torch.Tensor):
        raise TypeError(f"bounds must be a torch.Tensor, got {type(bounds).__name__}")
    if bounds.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"bounds has dtype {bounds.dtype}; expected int32 (or int64)")
    for name, t in (("bounds", bounds), ("cu_seqlens", cu_seqlens)):
        if without_data(t):
            raise ValueError(f"the reference reads the values of {name}: it must have data, not be a 'meta' or fake "
                             "tensor")
    nd = 3 if cu_seqlens is not None else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != nd:
            raise ValueError(f"{name} must have {nd} dims{' (packed, with cu_seqlens)' if nd == 3 else ''}, "
                             f"got shape {list(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {list(k.shape)} and {list(v.shape)}")
    if k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q {list(q.shape)} and k {list(k.shape)} must share all sizes but the head count")
    hq, hkv = q.shape[-2], k.shape[-2]
    _check_gqa(hq, hkv)
    if q.shape[-1] == 0:
        raise ValueError("the head dim must be at least 1")
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor):
            raise TypeError(f"cu_seqlens must be a torch.Tensor or None, got {type(cu_seqlens).__name__}")
        if cu_seqlens.dim() != 1:
            raise ValueError("cu_seqlens must be a 1-D tensor of B + 1 offsets")
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"cu_seqlens has dtype {cu_seqlens.dtype}; expected int32 (or int64)")
        if cu_seqlens.shape[0] < 2:
            raise ValueError("cu_seqlens must have at least 2 entries (B + 1)")
        if max_seqlen is not None:
            _check_max_seqlen(max_seqlen)
        nb = cu_seqlens.shape[0] - 1
        if bounds.dim() != 2 or bounds.shape[1] != 4 or bounds.shape[0] != nb:
            raise ValueError(f"bounds must be [B, 4] with B = len(cu_seqlens) - 1 = {nb}, got {list(bounds.shape)}")
        _check_cu_seqlens_values(cu_seqlens, q.shape[0], max_seqlen)
    else:
        if max_seqlen is not None:
            raise ValueError("max_seqlen is only meaningful with cu_seqlens")
        if bounds.dim() != 2 or bounds.shape[1] != 4 or bounds.shape[0] != q.shape[0]:
            raise ValueError(f"bounds must be [B, 4] with B = q.shape[0] = {q.shape[0]}, got {list(bounds.shape)}")
    _check_scalars(softmax_scale, cap, cap_method)


@without_autocast
def ranker_attention_reference(q, k, v, bounds, softmax_scale=None, cap=None, cap_method="tanh", return_lse=False,
                               cu_seqlens=None, max_seqlen=None, compute_dtype=torch.float32, lse_dtype=torch.float32):
    """Dense-mask torch reference of :func:`ranker_attention` (any device; the math in ``compute_dtype``:
    float32 by default, float64 for the tests' reference, or the input dtype for the error a plain
    torch implementation in that dtype makes, which the tests use as their bar).

    Builds the full ``[S, S]`` mask per sequence (:func:`.ranker_mask.dense_mask`, same clamping),
    so it is meant for tests at modest sizes.  Returns ``out`` in ``q.dtype`` (and ``lse`` ``[B, Hq, S]`` /
    ``[Hq, T]`` with ``return_lse``, in ``lse_dtype``: float32 as the kernel returns it by default).  Any
    float dtype and any device with data (CPU or CUDA; not "meta": the mask is built from the bounds'
    values); ``bounds`` and ``cu_seqlens`` int32
    or int64 (the op takes int32); ``compute_dtype`` a float dtype.  The same argument rules as
    :func:`ranker_attention` otherwise (``Hq % Hkv == 0``, ``bounds [B, 4]`` with
    ``B = len(cu_seqlens) - 1`` in the packed form, valid ``cu_seqlens`` values, scalars):
    ``TypeError`` / ``ValueError`` saying which.  ``max_seqlen`` is only checked (as the op checks it: an
    int >= the longest sequence); the reference needs no bound.  The softmax is computed in
    ``compute_dtype``: scores beyond its range (e.g. ``softmax_scale`` near float32's max in float32)
    overflow there; use float64 for such inputs.
    """
    for name, dt in (("compute_dtype", compute_dtype), ("lse_dtype", lse_dtype)):
        if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
            raise TypeError(f"{name} must be a float torch.dtype, got {dt!r}")
    return_lse = check_bool("return_lse", return_lse)
    cap_method = "none" if cap_method is None else cap_method  # (no cap, as ranker_attention takes it)
    _check_reference_args(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen)
    if cu_seqlens is not None:
        cu = [int(x) for x in cu_seqlens.tolist()]
        outs, lses = [], []
        for b in range(len(cu) - 1):
            sl = slice(cu[b], cu[b + 1])
            o, l = ranker_attention_reference(q[None, sl], k[None, sl], v[None, sl], bounds[b:b + 1], softmax_scale,
                                              cap, cap_method, True, compute_dtype=compute_dtype, lse_dtype=lse_dtype)
            outs.append(o[0])
            lses.append(l[0])
        # tokens past cu_seqlens[-1] belong to no sequence: 0 output, -inf LSE (as the kernel writes)
        tail = q.shape[0] - cu[-1]
        outs.append(q.new_zeros((tail, *q.shape[1:])))
        lses.append(torch.full((q.shape[1], tail), -math.inf, dtype=lse_dtype, device=q.device))
        out, lse = torch.cat(outs, 0), torch.cat(lses, 1)
        return (out, lse) if return_lse else out
    nb, s, hq, d = q.shape
    hkv = k.shape[2]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(d)  # (any real: Fraction, ...)
    cap = float(cap) if cap is not None else None
    qf = q.to(compute_dtype).transpose(1, 2)  # B, H, S, D
    kf = k.to(compute_dtype).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    vf = v.to(compute_dtype).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    scores = scale * (qf @ kf.transpose(-1, -2))
    if cap is not None:
        scores = cap * torch.tanh(scores / cap) if cap_method == "tanh" else scores / (1 + scores.abs() / cap)
    masks = [dense_mask(bounds[b].cpu(), s) for b in range(nb)]
    mask = (torch.stack(masks) if masks else torch.zeros(0, s, s, dtype=torch.bool)).to(q.device)[:, None]  # B,1,S,S
    scores = scores.masked_fill(~mask, -math.inf)
    # -inf for empty rows, and a zero gradient there (logsumexp of all -inf differentiates to NaN: take it
    # over zeros on those rows and put -inf back)
    empty = ~mask.any(-1)  # B, 1, S
    lse = torch.logsumexp(scores.masked_fill(empty[..., None], 0.0), dim=-1).masked_fill(empty, -math.inf)
    # exp(s - lse) over its own sum: exp(s - lse) alone does not sum to 1 once lse rounds (at scores ~1e4
    # in float32 the weights summed to 0.998, at ~3e7 to 2); s <= lse, so no exponential overflows
    e = torch.exp(scores - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    e = torch.where(mask, e, torch.zeros_like(e))
    row_sum = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))  # empty rows: 0
    out = (p @ vf).transpose(1, 2).to(q.dtype)
    return (out, lse.to(lse_dtype)) if return_lse else out


CHECK_LSE_TOL = 2e-2  # |lse - float64 reference| that cute-kernels check accepts (the GPU tests' bar)


def check() -> list[CheckResult]:
    """``cute-kernels check``: three cases (MHA D=128, GQA 8/2 with a tanh cap, D=64; two sequences of 700
    tokens with per-row bounds) against the float64 reference: the output (bar: 2x torch's bf16 error + 1e-3)
    and the LSE (bar :data:`CHECK_LSE_TOL`, and -inf on the same rows)."""
    rows = []
    torch.manual_seed(0)
    for d, hq, hkv, cap in ((128, 8, 8, None), (128, 8, 2, 30.0), (64, 4, 4, None)):
        b, s = 2, 700
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
        bounds = torch.tensor([[0, 517, 517, 700], [37, 400, 450, 611]], device="cuda", dtype=torch.int32)
        o, lse = ranker_attention(q, k, v, bounds, cap=cap, return_lse=True)
        ro, rl = ranker_attention_reference(q, k, v, bounds, cap=cap, return_lse=True, compute_dtype=torch.float64)
        bo = ranker_attention_reference(q, k, v, bounds, cap=cap, compute_dtype=torch.bfloat16)
        err = (o.float() - ro.float()).abs().max().item()
        tol = 2 * (bo.float() - ro.float()).abs().max().item() + 1e-3
        rows.append(CheckResult(NAME, f"D={d} H={hq}/{hkv} cap={cap}", err <= tol, err, 0.0, tol))
        # the LSE (natural log; -inf on the rows of neither segment: the second sequence's rows 0-36, 400-449 and
        # 611-699), finite elsewhere
        fin = torch.isfinite(rl)
        lse_err = (lse[fin].double() - rl[fin].double()).abs().max().item()
        same_inf = torch.equal(lse == -math.inf, rl == -math.inf) and bool(torch.isfinite(lse[fin]).all())
        why = "" if same_inf else "rows of -inf LSE differ, or a NaN / +inf LSE"
        rows.append(CheckResult(NAME, f"D={d} H={hq}/{hkv} cap={cap} lse", same_inf and lse_err <= CHECK_LSE_TOL,
                                lse_err, 0.0, CHECK_LSE_TOL, why))
    return rows


def bench_shapes(shapes: str | None) -> set[str]:
    """:func:`bench`'s ``shapes`` spec as a set of words (``all``, ``headline``, ``mid``, ``short``,
    ``peers``, ``variants``; default ``all+peers``); ``ValueError`` for anything else."""
    from ..registry import word_spec

    return word_spec(NAME, shapes, ("all", "headline", "mid", "short", "peers", "variants"), "all+peers")


def bench(shapes: str | None = None, peer_budget_s: float = 300.0, rounds: int = 2, echo: bool = False) -> list[dict]:
    """Ours vs the peers of ``bench/ranker_fwd_peers.py`` on :data:`.ranker_bench.BENCH_CASES`, interleaved over
    ``rounds`` (the machine is noisy), CUDA-graph timing (eager when a peer cannot be captured); ours and
    FlashAttention-4 with the mask_mod are also timed once as records of ``mode`` "eager" (back-to-back calls)
    and "isolated" (one call at a time on an idle GPU, host time included): :func:`.ranker_bench.run`.

    ``shapes``: None = all cases with peers; a string containing ``headline`` = the first two cases (no cap / tanh
    cap), ``mid`` the three between (GQA 16/4, D=64, B=1 16K), ``short`` the last two (any union of the three);
    ``peers`` adds the peers; ``variants`` adds our other schedules
    (no intra-warpgroup overlap; persistent or one CTA per tile, whichever is not the shipped one) and the configs
    the other shipped tables (CONFIGS, CAP_CONFIGS) hold for that head dim.  Useful TFLOP/s = ``4 * D * admitted
    (query, key) pairs / time``.  Peers are skipped once ``peer_budget_s`` seconds have gone by (their compiles
    are slow; a record per skipped peer says so)."""
    from . import ranker_bench

    spec = bench_shapes(shapes)

    def setup(case, gen):
        nb, hist, cand, hq, hkv, d, cap = case
        s = hist + cand
        q = torch.randn(nb, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(nb, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(nb, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        bounds = torch.tensor([[0, hist, hist, s]] * nb, device="cuda", dtype=torch.int32)
        flops = ranker_flops.useful_flops(q, bounds, gemms=ranker_flops.FWD_GEMMS)  # (as FlopCounterMode counts)
        shape = dict(B=nb, hist=hist, cand=cand, Hq=hq, Hkv=hkv, D=d, cap=cap, dtype="bfloat16")
        impls = [("cute_kernels", lambda: ranker_attention(q, k, v, bounds, cap=cap))]
        if "variants" in spec:  # the other schedules of the same kernel, and the other shipped tables' configs
            base = shipped_config(torch.bfloat16, d, "tanh" if cap else "none")
            alts = [("no_overlap", dict(intra_wg_overlap=False)), ("persistent", dict(persistent=True)),
                    ("one_tile_per_cta", dict(persistent=False)), ("CONFIGS", dataclasses.asdict(CONFIGS[d]))] + [
                (f"CAP_CONFIGS_{m}", dataclasses.asdict(c)) for (m, hd), c in CAP_CONFIGS.items() if hd == d]
            seen = [base]
            for tag, kw in alts:
                try:  # (as it runs for these inputs: a fixed max that does not apply becomes the online max)
                    cfg = chosen_config(dataclasses.replace(base, **kw), torch.bfloat16, cap)
                except ValueError:
                    continue
                if cfg in seen:
                    continue
                seen.append(cfg)
                impls.append((f"cute_kernels_{tag}", lambda cfg=cfg: _ranker_impl(
                    q, k, v, bounds, None, cap, "tanh", None, None, config=cfg)))
        return ranker_bench.Case(shape, flops, impls, (q, k, v, bounds, cap))

    peers = ranker_bench.load_peers("ranker_fwd_peers") if "peers" in spec else None
    return ranker_bench.run(NAME, ranker_bench.bench_cases(spec, ranker_bench.BENCH_CASES), setup, peers,
                            peer_budget_s, rounds, echo)


# the backward's module with the forward's: its op, and so its FLOP formula, exist before a FlopCounterMode that
# is entered before the first backward (the counter copies torch's formula registry when it is made)
from . import ranker_bwd as _ranker_bwd  # noqa: E402,F401
