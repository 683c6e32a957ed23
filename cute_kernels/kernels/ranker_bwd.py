"""Ranker attention backward on Hopper (sm_90a): the mainloop kernel (issue 4, seed 004).

Math (FlashAttention-2/3's backward with the ranker mask and cap of :mod:`.ranker_fwd`).  With
``s_raw = softmax_scale * q.k``, ``s = cap(s_raw)`` masked, ``P = exp(s - LSE)``,
``dPsum = rowsum(dO * O)``:

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - dPsum) * cap'(s_raw),
    dQ = softmax_scale * dS K,     dK = softmax_scale * dS^T Q,

``cap'`` = ``1 - tanh^2(s_raw/cap)`` (tanh) or ``1/(1 + |s_raw|/cap)^2`` (soft_sign), 1 without a cap.
With a gradient of the LSE too (``dLSE``, a loss on the forward's ``lse``): ``dLSE_i P_ij cap'`` joins
``dS_ij`` (``d LSE_i / d s_ij = P_ij``), i.e. ``dPsum = rowsum(dO * O) - dLSE`` in the same formula; the
preprocess folds it in, the other two kernels do not see it.
GQA sums dK, dV over the query heads of a group (in float32: in registers when one CTA walks the
whole group, else in float32 accumulators in global memory).

The backward is three launches (:func:`ranker_attention_backward`):

1. :mod:`.ranker_bwd_preprocess`: ``dPsum`` (float32), ``LSE * log2(e)`` (``+inf`` on rows with no
   valid key and on padding rows, so that ``P = exp2(.. - LSE)`` is 0 there), all padded to whole
   ``tile_m`` q blocks per sequence, and either the zeroed float32 dQ accumulator or (the default,
   ``dq_zero_in_mainloop``, and the deterministic mode) an int32 flag per (q block, query head) set to 0.
2. this kernel, one CTA per (KV block of ``tile_n`` keys, query head, batch row), or with GQA per
   (KV block, KV head, batch row) walking the q blocks of each query head of the group in turn
   (``RankerBwdConfig.gqa_group_per_cta``; :func:`resolve_gqa_group` picks it while those CTAs
   fill two waves of SMs, else one query head per CTA):
   * warpgroup 0, the producer (``setmaxnreg`` down): warp 0 TMA-loads K and V of the CTA's block
     once, then Q + LSE and dO + dPsum of every q block that reaches it, through ``stages``-deep
     ``PipelineTmaAsync`` pipelines; warp 1 adds each q block's float32 dQ tile to the global
     accumulator with a TMA bulk reduce-add (``cp.reduce.async.bulk.tensor...add``, float32), handing
     the smem tile back and forth with the MMA warpgroups through named barriers (with
     ``dq_zero_in_mainloop`` it first zeroes its KV block's share of the accumulator's tiles and flags
     them, and each add waits for its tile's flag, or past ``dq_zero_wait_cycles`` stores instead);
   * warpgroups 1 and 2 (``setmaxnreg`` up), 64 keys each (D=64, 128; D=256 below): ``S^T = K Q^T`` and
     ``dP^T = V dO^T`` (WGMMA, both operands in smem), ``P^T = exp2(S^T * scale_log2 - LSE)`` with the forward's cap
     and the key mask (an add of 0 / -inf per key, left out in a copy of the q-block loop for KV blocks
     wholly inside the history: ``skip_key_bias``), ``dS^T = P^T (dP^T - dPsum) cap'``, ``dV += P^T dO``
     and ``dK += dS^T Q`` with P^T and dS^T straight from registers (RS WGMMA), dS^T through smem (``stmatrix``) for
     ``dQ = dS K`` (both warpgroups: at D=128 half the head dim each, computed as
     ``dQ^T = K^T dS^T``, ``dq_swap_ab``, and issued before the dK GEMM, whose run then covers dQ's
     hand-off; at D=64 without a cap half of the 128 q rows each, ``dq_split_rows``), dQ through smem
     to warp 1 (each warpgroup's half on its own pair of named barriers, one TMA reduce-add copy per half; two dS^T
     buffers, so a warpgroup writes the next dS^T without waiting for the other's dQ GEMM).
   D=256 (``RankerBwdConfig.split_head_dim``, FlashAttention-3's hdim-256 split): 64 keys per CTA, every key in
   both warpgroups, which split S^T's and dP^T's q rows and dK's, dV's and dQ's head dim (128 columns each:
   64 + 64 float32 registers of dK, dV); P^T and dS^T go through smem (``stmatrix``) for ``dK += dS^T Q``,
   ``dV += P^T dO`` and ``dQ = dS K``, each a WGMMA with both operands in smem; one Q/dO stage (227 KB).
   Only the q blocks holding history or candidate rows are visited (each once,
   :meth:`.ranker_mask.RankerSegments.m_block_ranges`); KV blocks outside the history do no work.
   Epilogue (seed 004, FlashAttention-3's ``CollectiveEpilogueBwd``): dK, dV through smem reusing
   the K/V buffers after a named barrier (every consumer done) and ``fence_view_async_shared``, then
   one warp's TMA store (fixed length) or predicated 16-byte stores (varlen); KV blocks no query
   reaches store zeros.  GQA with a group per CTA: the same (dK, dV summed over the group in the
   registers); with one query head per CTA: float32 dK, dV tiles TMA-reduce-added into float32
   accumulators.
3. :mod:`.ranker_bwd_postprocess`: dQ = scale * accumulator in the input dtype, GQA dK/dV converted
   from the accumulators (one query head per CTA),
   and the candidate self terms (a candidate ``j`` outside the history is its own only extra key:
   ``dV_j += P_jj dO_j``, ``dK_j += dS_jj q_j scale``, ``dQ_j += dS_jj k_j scale``) as per-row vector
   operations, never diagonal tiles.

Deterministic mode (``RankerBwdConfig.deterministic``, FlashAttention-3's scheme): the float32
reduce-adds of dQ (one per KV block) and of GQA dK/dV with one query head per CTA (one per query
head) happen in a fixed order, each waiting on an int32 semaphore (acquire spin by one thread) and
bumping it after its add has completed (release); the default adds in arrival order (not bitwise
reproducible; dK, dV with a GQA group per CTA are: no adds in memory).  The KV blocks of a sequence
walk the q blocks staggered (``walk_stagger``: the last KV block starts at the first q block, each
lower one two steps further on; sequences whose KV blocks might not all fit on the GPU at once keep KV
order, :data:`STAGGER_MAX_KV_BLOCKS`), so that they reach each q block one after another and the dQ adds,
in that order, rarely wait (FlashAttention-3's KV order has every KV block at one q block at once).

Autograd: this backward's op is registered as the gradient of the forward op
``cute_kernels::ranker_attention_fwd`` (:mod:`.ranker_autograd`), so :func:`cute_kernels.ranker_attention`
is differentiable.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import functools
import math
import numbers
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass import Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from ..registry import CheckResult, CompileTarget
from ..runtime.arch import sm_count
from ..runtime.cache import compile_cached, warn_if_spills
from ..runtime.fake import cute_dtype, fake_stream, fake_tensor
from ..runtime.torch_op import (custom_op, refuse_func_transforms, refuse_inference_tensors, tracing,
                                 without_autocast, without_data)
from ..runtime.validate import (ValidatedConfig, aligned_data, check_bool, check_config_fields,
                                check_outputs_disjoint, check_same_device, check_tensor,
                                exceeds, or_false, validated_once)
from . import ranker_flops, sm90_helpers as sm90
from .ranker_bench import BENCH_CASES, D256_CASES, SHORT_CASES  # noqa: F401 (the bench's shapes, in ranker_bench)
from .ranker_fwd import (CAP_METHODS, SMEM_CAPACITY, _check_reference_args, exp2_scale, overridden_config,
                         override_config, ranker_attention_reference)
from .ranker_bwd_buffers import BwdFakes, dq_flag_coord, padded_rows, sequence_offsets
from .ranker_bwd_postprocess import compile_postprocess
from .ranker_bwd_preprocess import compile_preprocess
from .ranker_mask import RankerSegments, dense_mask

NAME = "ranker_bwd"
DTYPES = (torch.bfloat16, torch.float16)


MMA_WGS = 2  # MMA warpgroups of the mainloop (the barrier ids below and the split schedules assume two)


class NamedBarrierBwd(enum.IntEnum):
    """Named barriers of the backward mainloop (0 is ``__syncthreads``)."""

    Epilogue = 1  # MMA warpgroups: done reading sK/sV before dK/dV (aliasing them) are written; smem ready
    PdS = 2  # MMA warpgroups: both halves of dS^T are in sdS (and, with one dS buffer, before the write: the
    # last dQ GEMM is done reading it); split_head_dim: both halves of P^T and dS^T are in sP^T and sdS^T (with one
    # buffer each, before the writes: the last dK, dV, dQ GEMMs are done reading them)
    # MMA warpgroup(s) -> dQ warp: sdQ holds this q block's dQ; dQ warp -> MMA warpgroup(s): the last TMA
    # reduce-add has read sdQ.  With dq_per_wg, warpgroup w uses dQFull + w and dQEmpty + w.
    dQFull = 3
    dQEmpty = 5


MAX_GRID_YZ = 65535  # CUDA's limit on gridDim.y and gridDim.z
# walk_stagger applies to sequences of at most this many history KV blocks (the kernel's cap), and only where
# the host sees that a sequence's KV blocks fit at once in a third of the device's SMs (resolve_walk_stagger).  In
# the deterministic mode the staggered add order has one backward wait per q block, the lowest KV block waiting
# for the highest, which the GPU launches after it: that CTA must become resident while the others spin (one
# CTA per SM).  In-order dispatch leaves at most one sequence per launch with KV blocks still to launch, so its
# spinning CTAs, fewer than a third of the SMs, cannot hold them all, nor can those of three such launches
# running at once on other streams (four or more could: pass walk_stagger=0 there).  KV order (no stagger) waits
# only on KV blocks launched earlier and needs nothing.  The default mode's dq_zero_in_mainloop has the same
# kind of wait (a KV block's add waits for the start of the one that zeroes the tile, maybe launched after it)
# but bounded (dq_zero_wait_cycles: then the add stores its dQ there itself), so it cannot hang; it keeps the same
# rule (resolve_dq_zeroing) because past it most tiles would wait out the bound.
STAGGER_MAX_KV_BLOCKS = 64
# dq_zero_in_mainloop's int32 flag per dQ tile: untouched (the preprocess's 0); claimed by the KV block that writes
# its first contents, an add that timed out (CLAIMED: its dQ) or the tile's zeroing KV block (ZEROING: zeros); then
# written, adds may go on: READY (zeros) or STORED (a dQ).  The postprocess reads any flag but 0 as written.
DQ_TILE_UNTOUCHED, DQ_TILE_READY, DQ_TILE_CLAIMED, DQ_TILE_ZEROING, DQ_TILE_STORED = 0, 1, 2, 3, 4
DETERMINISTIC_WALK_STAGGER = 2  # the deterministic mode's walk_stagger (RankerBwdConfig.walk_stagger=None)
# ptxas reports 1024 B of static shared memory for the mainloop (the 1024-byte aligned dynamic smem
# base, ``.extern .shared .align 1024``); counted against the limit with the SharedStorage struct
STATIC_SMEM_BYTES = 1024


def stats_stage_stride(tile_m: int) -> int:
    """float32 elements between the smem stages of LSE and dPsum: ``tile_m`` rounded up to 32 (each stage
    is a TMA destination, 128-byte aligned; 80 rows are 320 bytes)."""
    return -(-tile_m // 32) * 32


@dataclass(frozen=True)
class RankerBwdConfig(ValidatedConfig):
    """Tile shape of the backward mainloop: ``tile_n`` keys per CTA (64 per MMA warpgroup; with
    ``split_head_dim`` 64 shared by both, which split the head dim instead),
    ``tile_m`` q rows per step, ``stages`` Q/dO buffers, register split (producer / MMA); the
    synchronisation schedule (``ds_stages``, ``dq_per_wg``, ``dq_first``, ``dk_from_smem``), the dQ
    GEMM's operand order (``dq_swap_ab``), the deterministic mode and its staggered q-block walks
    (``walk_stagger``, None for :meth:`walk_stagger_steps`'s pick), and how GQA is spread over CTAs
    (``gqa_group_per_cta``: a group per CTA, one query head per CTA, or None for
    :func:`resolve_gqa_group`'s pick), and the default mode's zeroing of the dQ accumulator in the mainloop
    (``dq_zero_in_mainloop``, ``dq_zero_wait_cycles``).  Start from :func:`config_for` and change fields with
    ``dataclasses.replace``: the class defaults are D=128 without the shipped schedule.  Checked when
    constructed (also by ``dataclasses.replace``):
    :meth:`validate` raises ``ValueError`` with the reason and ``TypeError`` for a field of the wrong type."""

    head_dim: int = 128
    tile_m: int = 64
    tile_n: int = 128
    stages: int = 2
    producer_regs: int = 24
    mma_regs: int = 240
    # ordered float32 reduce-adds (dQ by KV block; per-head GQA dK/dV by query head).  There the first KV block in
    # order TMA-stores its dQ tile and the later ones add theirs, so the preprocess does not zero the float32
    # accumulator (the q blocks' int32 counters, zeroed by the preprocess, say which tiles were written).  Session 28,
    # same run, deterministic useful TFLOP/s with / without the first store: headline 508 / 500, GQA 16/4 512 /
    # 496, D=64 421 / 410, 16K 553 / 550, B=16 1K+256 431 / 389, B=8 2K+2K 477 / 452; same bits
    # (bench/results/logs/2026-12-01_s28_ranker_bwd_det_store_first_probe.log).
    # The default mode with a ticket per (q block, head) instead, the others waiting for the first store and the
    # q blocks visited in an order rotated by KV block, was slower at D=128 (headline -1.5 to -4%, 16K -4%, B=8
    # -2.5 to -6%; D=64 +2 to +4%: ..._s28_ranker_bwd_dq_store_first_probe.log): not kept.
    deterministic: bool = False
    # Staggered q-block walks: the CTA of the r-th of n_kv history KV blocks starts its walk over the q blocks at
    # step ``(n_kv - 1 - r) * walk_stagger`` (wrapping around), so the KV blocks of one (batch row, head) reach
    # each q block one after another, ``walk_stagger`` steps apart, instead of all at once; 0: every CTA from the
    # first q block.  In the deterministic mode each q block's dQ adds then follow that visiting order (the first
    # visitor stores, the others add, each after its predecessor's add is done), so a KV block rarely waits for
    # another.  (Capped at
    # ``count // n_kv`` per sequence, so that the start steps stay distinct, and 0 where the KV blocks of a
    # sequence may not fit on the GPU at once: STAGGER_MAX_KV_BLOCKS, resolve_walk_stagger.)  None: the shipped
    # choice, DETERMINISTIC_WALK_STAGGER in the deterministic mode and 0 in the default one (walk_stagger_steps).
    # Session 43, same run (3 rounds, CUDA graph, us; logs/2026-12-03_s43_ranker_bwd_walk_stagger_probe2.log),
    # deterministic with stagger 0 / 1 / 2 vs the default mode (shipped, twice): headline 3164 / 2947 / 2907 vs
    # 2711-2744, tanh 3181 / 3000 / 3037 vs 3011-3031, GQA 16/4 3056 / 3017 / 3019 vs 2696-2715, D=64 1848 / 1586 /
    # 1557 vs 1566, B=16 1K+256 1051 / 954 / 955 vs 895-902, B=8 2K+2K 1486 / 1412 / 1418 vs 1304-1318 (16K: 128 KV
    # blocks, no stagger); the default mode with 1 / 2 was level to 4% slower (headline 2823 / 2777): not taken.
    walk_stagger: Optional[int] = dataclasses.field(default=None, metadata={"type": int})
    # The default mode's float32 dQ accumulator zeroed by the mainloop's own KV blocks instead of the preprocess:
    # at its start the dQ warp of the r-th of a sequence's n_kv history KV blocks TMA-stores zeros (from sdQ) into
    # the dQ tiles of walk indices r, r + n_kv, ... and sets their int32 flags (release); every dQ add first waits
    # for its tile's flag (acquire).  The zeros stay in L2, where the reduce-adds then hit them, instead of a
    # write to HBM by the preprocess and a read back by the adds; the preprocess only zeroes the flags.  A KV
    # block waits for the start of the others of its sequence, so they should be resident at once:
    # :func:`resolve_dq_zeroing` turns it off where :data:`STAGGER_MAX_KV_BLOCKS`'s rule fails (and
    # ``dq_zero_wait_cycles`` keeps a wait finite where they are not).  Ignored in the
    # deterministic mode (there the first add in order stores its tile).  Session 48, same run, CUDA graph, us,
    # on / off (logs/2026-12-04_s48_ranker_bwd_dq_zero_in_mainloop_ab.log, two runs): headline 2749-2751 /
    # 2790, D=64 1563-1577 / 1606-1625, B=16 1K+256 913-919 / 937-944, GQA 16/4, tanh, B=8 2K+2K level to -1.5%,
    # 16K unchanged (over the rule: off).  Zero stores of the dQ warp's own (no sdQ, a fence and flag per tile)
    # were slower: not kept.
    dq_zero_in_mainloop: bool = True
    # How long (SM clock cycles; ~2 us at 1.98 GHz) a dQ add waits for its tile's zeroing to begin before it claims
    # the tile and stores its own dQ there instead (the zeroing KV block, finding it claimed, leaves it).  Keeps every
    # wait finite, also where a sequence's KV blocks cannot all be resident (several backward passes at once, an MPS
    # or green-context SM limit, long-lived kernels beside it), and short where a sequence's KV blocks straddle two
    # waves of CTAs.  0: claim at once whenever the zeroing has not begun.  Session 49, same run, CUDA graph, us,
    # an earlier form of the claims: 1 << 15 / never / 0: headline 2767 / 2746 / 2740, B=16 1K+256 921 / 920 / 917,
    # B=8 2K+2K 1323 / 1314 / 1334, the others level too (logs/2026-12-04_s49_ranker_bwd_dq_zero_wait_probe.log);
    # the session-48 form (no claims, no bound) measured the same that session.  The shipped 1 << 12 lies between
    # and was measured only against the preprocess's zeroing (logs/2026-12-04_s49_ranker_bwd_gpu_tests_ac11982.log).
    dq_zero_wait_cycles: int = 1 << 12
    # Synchronisation (as FlashAttention-4's sm90 backward; session 10 probe, H200, same run, useful TFLOP/s
    # with both vs neither: headline 525 vs 508, B=16 1K+256 439 vs 422, never slower on the 7 bench
    # shapes; bench/results/logs/2026-11-30_s10_ranker_bwd_sync.log):
    ds_stages: int = 2  # dS^T smem buffers; 2 drops the barrier before each dS^T write
    dq_per_wg: bool = True  # each MMA warpgroup hands its half of dQ to the dQ warp on its own barriers
    dq_first: bool = False  # issue dQ = dS K before dK += dS^T Q, so dQ's hand-off overlaps the dK GEMM
    dk_from_smem: bool = False  # dK += dS^T Q reads dS^T from smem (SS WGMMA) instead of registers
    # GQA: one CTA walks the q blocks of every query head of its KV head, so dK/dV add up in registers and
    # are stored once in the input dtype (no float32 accumulators, no reduce-adds, no conversion pass).
    # False: one query head per CTA, dK/dV reduce-added into float32 accumulators.  None: the host picks
    # (:func:`resolve_gqa_group`: True while that leaves at least two waves of CTAs).
    gqa_group_per_cta: Optional[bool] = None
    # dQ^T = K^T dS^T instead of dQ = dS K (FlashAttention-3's dQ_swapAB): M = head dim (64 per
    # warpgroup), N = q rows, so tile_m need not be a multiple of 64 (FA3's 80-row tiles at D=128).
    # Needs head_dim = 64 x MMA_WGS; shipped at D=128 (CONFIGS)
    dq_swap_ab: bool = False
    # dQ = dS K with the q rows split between the MMA warpgroups (M = 64 rows each, N = head dim: n64 at
    # D=64) instead of the head-dim columns (N = head_dim / MMA_WGS: n32 at D=64); each warpgroup hands
    # its rows of sdQ to the dQ warp.  Needs tile_m = 64 x MMA_WGS and not dq_swap_ab
    dq_split_rows: bool = False
    # a KV block wholly inside the history (every block but the history's partial ends) runs a copy of the q-block
    # loop without the add of the key mask's bias to P's exponent: one FP32 instruction fewer per score in the
    # softmax section, where issue slots bound the backward (session 29); same bits.  The branch sits once per
    # KV block: per q block around the two P loops it was 1.6-2.7% slower without a cap (+1.5% with tanh).
    # Ignored for GQA with a cap (RankerAttentionBwd.skip_key_bias: two loops spilled 16-56 B there, unmeasured)
    skip_key_bias: bool = False
    # The head-dim split schedule (:meth:`RankerAttentionBwd.mma_one_m_block_split`; D=256, where 64 keys' dK and dV
    # over all 256 columns would need 256 float32 registers per thread): a KV block of 64 keys
    # (``tile_n = 64``), the MMA warpgroups splitting the q rows of S^T and dP^T (N = tile_m / MMA_WGS each) and
    # the head-dim columns of dK, dV and dQ (N = head_dim / MMA_WGS each, FlashAttention-3's hdim-256 split).  Each
    # warpgroup's P^T and dS^T go through smem (``stmatrix``; ``ds_stages`` buffers each) for the others' GEMMs,
    # which read both operands from smem.  Needs ``tile_m = 64`` and none of ``dq_swap_ab``, ``dq_split_rows``,
    # ``dq_first``, ``dk_from_smem`` (the keys-split schedule's options)
    split_head_dim: bool = False

    def walk_stagger_steps(self) -> int:
        """``walk_stagger``, None resolved: :data:`DETERMINISTIC_WALK_STAGGER` in the deterministic mode, else 0."""
        if self.walk_stagger is not None:
            return self.walk_stagger
        return DETERMINISTIC_WALK_STAGGER if self.deterministic else 0

    def acc_regs(self) -> int:
        """Peak fp32 accumulator registers per MMA thread: dK, dV live throughout; S^T and dP^T until
        dS^T is formed (in bf16), then dQ beside dS^T (``split_head_dim``: dQ alone, P^T and dS^T being in smem)."""
        dq = self.tile_m * self.head_dim // (128 * MMA_WGS)
        if self.split_head_dim:  # every key, a share of the q rows (S^T) and of the head dim (dK, dV, dQ)
            sdp = self.tile_n * self.tile_m // (128 * MMA_WGS)
            dkv = self.tile_n * self.head_dim // (128 * MMA_WGS)
            return 2 * dkv + max(2 * sdp, dq)  # (P^T, dS^T leave the registers for smem before dQ)
        per_wg_keys = self.tile_n // MMA_WGS
        sdp = per_wg_keys * self.tile_m // 128
        dkv = per_wg_keys * self.head_dim // 128
        return 2 * dkv + max(2 * sdp, dq + sdp // 2)

    SMEM_EXACT = True  # (a class constant, not a field) smem_bytes() is the struct's size, not a bound

    def smem_bytes(self, elem_bytes: int = 2) -> int:
        """Bytes of the kernel's ``SharedStorage`` struct, laid out as the DSL does (each member at its
        alignment, in declaration order): the mbarriers, then sK, sV, sQ, sdO, sdS^T, sP^T (``split_head_dim``),
        sdQ (1024-byte aligned: the 128-byte swizzle repeats every 1024 bytes), then the LSE and dPsum stages; the
        total rounded up to 1024 bytes (:func:`shared_storage`'s size, checked by a CPU test)."""
        end = 0
        for _, size, align in self.smem_members(elem_bytes):
            end = -(-end // align) * align + size
        return -(-end // 1024) * 1024  # the struct's size is a multiple of its strictest member alignment

    def smem_members(self, elem_bytes: int = 2) -> list[tuple[str, int, int]]:
        """``(name, bytes, alignment)`` of the ``SharedStorage`` members in declaration order."""
        stats = ((self.stages - 1) * stats_stage_stride(self.tile_m) + self.tile_m) * 4
        q_do = self.stages * self.tile_m * self.head_dim * elem_bytes
        ds = self.ds_stages * self.tile_n * self.tile_m * elem_bytes
        p_t = [(f"sP^T {self.ds_stages} x {self.tile_n}x{self.tile_m}", ds, 1024)] if self.split_head_dim else []
        return [("mbarriers", 8 * (2 + 4 * self.stages), 8),
                (f"sK {self.tile_n}x{self.head_dim}", self.tile_n * self.head_dim * elem_bytes, 1024),
                (f"sV {self.tile_n}x{self.head_dim}", self.tile_n * self.head_dim * elem_bytes, 1024),
                (f"sQ {self.stages} x {self.tile_m}x{self.head_dim}", q_do, 1024),
                (f"sdO {self.stages} x {self.tile_m}x{self.head_dim}", q_do, 1024),
                (f"sdS^T {self.ds_stages} x {self.tile_n}x{self.tile_m}", ds, 1024), *p_t,
                (f"sdQ {self.tile_m}x{self.head_dim} fp32", self.tile_m * self.head_dim * 4, 1024),
                ("sLSE", stats, 128), ("sdPsum", stats, 128)]

    def validate(self) -> None:
        check_config_fields(self)
        if self.head_dim not in (64, 128, 256):
            raise ValueError(f"head_dim={self.head_dim!r}: the backward supports head dims 64, 128 and 256")
        if self.head_dim == 256 and not self.split_head_dim:
            raise ValueError("head_dim=256 needs split_head_dim=True (64 keys' dK and dV over 256 columns do not "
                             "fit one warpgroup's registers)")
        if self.split_head_dim:
            if self.tile_n != 64 or self.tile_m != 64:
                raise ValueError(f"split_head_dim: tile_n={self.tile_n}, tile_m={self.tile_m}: the split schedule "
                                 "is built for 64 keys (one WGMMA M) and 64 q rows (one dQ WGMMA M)")
            if self.dq_swap_ab or self.dq_split_rows or self.dq_first or self.dk_from_smem:
                raise ValueError("split_head_dim: dq_swap_ab, dq_split_rows, dq_first and dk_from_smem belong to "
                                 "the keys-split schedule; leave them False")
        elif self.tile_n != 64 * MMA_WGS:
            raise ValueError(f"tile_n={self.tile_n}: must be {64 * MMA_WGS}, 64 keys (one WGMMA M) per MMA "
                             "warpgroup (tile_n=64 only with split_head_dim, the D=256 schedule)")
        if self.tile_m not in (64, 80, 128):
            raise ValueError(f"tile_m={self.tile_m}: the backward is built and tested for 64, 80 (with dq_swap_ab) "
                             "or 128 q rows per step (the LSE/dPsum staging and the dQ reduce-add assume them)")
        if self.dq_swap_ab and self.head_dim != 64 * MMA_WGS:
            raise ValueError(f"dq_swap_ab: head_dim={self.head_dim} must be {64 * MMA_WGS} "
                             "(dQ^T's M: 64 per MMA warpgroup)")
        if self.dq_split_rows and (self.dq_swap_ab or self.tile_m != 64 * MMA_WGS):
            raise ValueError(f"dq_split_rows: needs dq_swap_ab=False and tile_m = {64 * MMA_WGS} "
                             "(64 per MMA warpgroup)")
        if self.tile_m % 64 and not self.dq_swap_ab:
            raise ValueError(f"tile_m={self.tile_m}: dQ = dS K needs a multiple of 64 q rows; use dq_swap_ab "
                             "(head_dim 128 only)")
        if self.walk_stagger is not None and not 0 <= self.walk_stagger <= 64:
            raise ValueError(f"walk_stagger={self.walk_stagger}: must be in [0, 64] q-block steps")
        if not 0 <= self.dq_zero_wait_cycles < 1 << 40:
            raise ValueError(f"dq_zero_wait_cycles={self.dq_zero_wait_cycles}: must be in [0, 2**40) SM cycles")
        if not 1 <= self.stages <= 4:
            raise ValueError(f"stages={self.stages}: must be in [1, 4]")
        if self.ds_stages not in (1, 2):
            raise ValueError(f"ds_stages={self.ds_stages}: must be 1 or 2")
        if self.dk_from_smem and not self.dq_first:
            raise ValueError("dk_from_smem needs dq_first (the dK GEMM must come after the dS^T fence and barrier)")
        sm90.check_register_split(self.producer_regs, self.mma_regs, MMA_WGS)
        if self.acc_regs() > self.mma_regs - 8:
            raise ValueError(f"tile_m={self.tile_m}, head_dim={self.head_dim}: {self.acc_regs()} accumulator "
                             f"registers per MMA thread do not fit in mma_regs={self.mma_regs} less 8 for "
                             "addresses and loop state")
        smem = self.smem_bytes() + STATIC_SMEM_BYTES
        if smem > SMEM_CAPACITY:
            parts = ", ".join(f"{name}: {size} B" for name, size, _ in self.smem_members())
            raise ValueError(f"config needs {smem} B of shared memory ({parts}; {STATIC_SMEM_BYTES} B static); the "
                             f"sm_90 limit is {SMEM_CAPACITY} B: {self._smem_hint()}")

    def _smem_hint(self) -> str:
        """What would make a config that does not fit the shared memory fit: fewer Q/dO ``stages`` (keeping
        ``ds_stages``), else one sdS^T buffer with as many stages as fit, else that no stage count does."""
        def total(**kw):  # (a copy with fields overridden, not validated: this runs inside validate)
            c = copy.copy(self)
            for name, value in kw.items():
                object.__setattr__(c, name, value)
            return c.smem_bytes() + STATIC_SMEM_BYTES

        fixes, best = [], 0
        for ds in sorted({self.ds_stages, 1}, reverse=True):
            for st in range(self.stages if ds != self.ds_stages else self.stages - 1, best, -1):
                if total(stages=st, ds_stages=ds) <= SMEM_CAPACITY:  # (ds_stages=1 only where it keeps more stages)
                    fixes.append(", ".join([f"ds_stages={ds}"] * (ds != self.ds_stages)
                                           + [f"stages={st}"] * (st != self.stages)))
                    best = st
                    break
        if not fixes:
            return "no stage count fits this tile (lower tile_m or the head dim)"
        return "fits with " + "".join(fixes[:1]) + "".join(f" (or {f})" for f in fixes[1:])


# D=128: FlashAttention-3's sm90 backward tile (64 q rows x 128 keys, 2 MMA warpgroups, 240 registers),
# with the dQ GEMM issued before dK's (dq_first; session 10 probe, same run, useful TFLOP/s vs dK first:
# headline 538 vs 529, tanh cap 493 vs 481, 16K 565 vs 544, B=16 1K+256 454 vs 425, B=8 2K+2K 507 vs
# 485, GQA 508 vs 502; bench/results/logs/2026-11-30_s10_ranker_bwd_dq_first_rs.log).  With dQ = dS K
# it cost a few bytes of spill (8-64 B), which the measured gain includes.
# Reading dS^T from smem for dK instead (dk_from_smem) is spill-free but gave back most of the gain
# (..._dq_first_smem.log).  At D=64 (128 q rows) dq_first is slower: 452 vs 467.
# dQ as dQ^T = K^T dS^T (dq_swap_ab, FlashAttention-3's dQ_swapAB; session 12): faster at every D=128
# bench shape in two same-run probes with an A/A pair (useful TFLOP/s, swap vs shipped / shipped again:
# headline 552 vs 537 / 532, tanh 499 vs 491 / 483, GQA 16/4 547 vs 524 / 533, 16K 586 vs 561 / 566,
# B=16 1K+256 467 vs 449 / 450, B=8 2K+2K 519 vs 503 / 508; bench/results/logs/
# 2026-11-30_s12_ranker_bwd_dq_swap_ab_probe.log and ..._probe_first.log) and spills less (ptxas, bytes
# of stack: none 8 -> 0 (GQA group 16 -> 0, varlen 32 -> 0), tanh 48 -> 24, tanh with a GQA group 48 -> 8;
# tests/test_ranker_bwd.py KNOWN_SPILL_BYTES).  80-row q tiles (tile_m=80, which dq_swap_ab allows;
# FA3's non-causal D=128 tile, ds_stages=1 to fit smem) were slower there: headline 496-507.
# The dQ reduce-adds cost 6-8% at D=128 (a build that skips them: bench/results/logs/
# 2026-11-30_s13_ranker_bwd_dq_reduce_cost.log), but neither a second sdQ buffer (the MMA warpgroups
# writing the next q block's dQ while the TMA reduce-add reads this one's: headline 540 vs 538 / 545,
# B=8 2K+2K 504 vs 521 / 511; ..._s14_ranker_bwd_dq_stages_probe.log) nor red.global.add.v4.f32 from
# the MMA threads' registers without smem staging (2-11% slower: ..._s14_ranker_bwd_dq_red_global_probe.log)
# recovers it: the cost is bandwidth (L2 reductions, shared memory), not the hand-off's latency.
# D=64: the same, except without a cap (config_for): 128 q rows per step measured faster there (H200,
# 2026-11-29, B=4 4096+512 H16: 1695 us vs 1847, deterministic 1961 vs 2515;
# bench/results/2026-11-29_h200_ranker_bwd_d64_tiles_s5.json),
# while with a cap its mainloop spills (80-176 B of stack at the 168-register launch bound).
# There, dQ = dS K splits the 128 q rows between the warpgroups (dq_split_rows: n64 WGMMAs, each reading
# half of dS, instead of n32 ones over the head dim, each reading all of it; session 14, same run, A/A
# pair: 486 vs 467 / 473 useful TFLOP/s at B=4 4096+512 H16; bench/results/logs/
# 2026-11-30_s14_ranker_bwd_dq_split_rows_probe.log).
CONFIGS = {
    64: RankerBwdConfig(head_dim=64, tile_m=64, tile_n=128, stages=2),
    # skip_key_bias: session 29, same run, 4 rounds
    # (bench/results/logs/2026-12-01_s29_ranker_bwd_key_bias_hoisted_probe.log), us with / without: tanh headline 3053
    # / 3151, GQA 16/4 2761-2772 / 2817, headline 2797-2802 / 2800, 16K, B=16 and B=8 level; same bits
    128: RankerBwdConfig(head_dim=128, tile_m=64, tile_n=128, stages=2, dq_first=True, dq_swap_ab=True,
                         skip_key_bias=True),
    # D=256: the head-dim split schedule (split_head_dim; FlashAttention-3's hdim-256 backward tile, 64 x 64);
    # one Q/dO stage: the float32 sdQ tile (64 KB) and two stages of sP^T and sdS^T leave no room for a second.
    # Without sdQ (dQ added from the registers by red.global.add.v2.f32) two fit, but that was 40% slower, with one
    # stage or two (session 56; its mainloop is bound by shared memory, 83% busy in Nsight Compute:
    # bench/results/logs/2026-12-04_s56_ranker_bwd_d256_dq_red_global_probe.log).  Session 57, same runs, us at B=4
    # 4096+512 / B=16 1K+256: S^T and dP^T split by role (one warpgroup each, P^T cap' passed in float32 through
    # smem, so each of sK, sQ, sV, sdO is read once: 64 KB less smem traffic per q block; needs ds_stages=1) 7502 /
    # 2436, level with ds_stages=1 alone (7447 / 2436), shipped 7328-7362 / 2371-2406: not kept (branch
    # s57/sdp-roles, ..._s57_ranker_bwd_d256_sdp_roles_probe.log).  Without the dQ GEMM, hand-off and reduce-adds
    # (a wrong dQ, measurement only) 5455 / 1918, and with that sdQ's 64 KB given to a second Q/dO stage 4868 / 1690,
    # shipped 7448-7601 / 2370-2397 (..._s57_ranker_bwd_d256_dq_path_ablation.log): dQ's path is 27-28% / 19-20% of
    # the time, and without it a second stage saves 11-12% more; what fits 227 KB with two stages is ds_stages=1 and
    # a 16 KB sdQ (dQ handed off in four 32-column chunks), or tile_m=32 (dQ^T = K^T dS^T) with 2-3 stages: not tried
    256: RankerBwdConfig(head_dim=256, tile_m=64, tile_n=64, stages=1, split_head_dim=True),
}
D64_UNCAPPED = RankerBwdConfig(head_dim=64, tile_m=128, tile_n=128, stages=2, dq_split_rows=True)


def config_for(head_dim: int, capped: bool) -> RankerBwdConfig:
    """The shipped mainloop config for ``head_dim`` (an int: 64, 128 or 256) with or without a logit cap
    (``capped``, a bool): :data:`CONFIGS` [head_dim], except :data:`D64_UNCAPPED` (128 q rows per
    step) at D=64 without a cap.  Raises ``TypeError`` (types; numpy integers are taken as head dims, as by
    the forward's ``shipped_config``) or ``ValueError`` (head dim)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) or not isinstance(capped, bool):
        raise TypeError(f"config_for(head_dim={head_dim!r}, capped={capped!r}): head_dim must be an int, "
                        "capped a bool")
    head_dim = int(head_dim)
    if head_dim not in CONFIGS:
        raise ValueError(f"head dim {head_dim} is not supported by the backward; supported: {sorted(CONFIGS)}")
    return D64_UNCAPPED if head_dim == 64 and not capped else CONFIGS[head_dim]


def shipped_configs() -> dict[str, RankerBwdConfig]:
    """``{label: config}`` of what :func:`config_for` ships per head dim (``cute-kernels configs``), split by cap
    where the choice depends on it, each also in its deterministic form."""
    out = {}
    for d in sorted(CONFIGS):
        plain, capped = config_for(d, False), config_for(d, True)
        for label, cfg in ([(f"head_dim={d}", plain)] if plain == capped else
                           [(f"head_dim={d} no cap", plain), (f"head_dim={d} cap", capped)]):
            out[label] = cfg
            out[f"{label} deterministic"] = dataclasses.replace(cfg, deterministic=True)
    return out


_OVERRIDES: dict[int, RankerBwdConfig] = {}  # head dim -> the config of an active use_config block


@contextlib.contextmanager
def use_config(config: RankerBwdConfig):
    """Within the ``with`` block, the backward runs inputs of ``config.head_dim`` (with or without a cap)
    with ``config`` instead of the shipped :func:`config_for`: autograd through
    :func:`.ranker_fwd.ranker_attention` and :func:`ranker_attention_backward` without ``config=`` (to
    try a new tile shape in training code without editing the module; the forward's twin is
    :func:`.ranker_fwd.use_config`).  ``deterministic=True`` still forces the ordered reduce-adds.  The
    config is read when the backward runs: call ``loss.backward()`` (or capture the graph that runs it)
    inside the block; a forward inside and a backward outside runs the shipped config.  It applies to
    capped and uncapped calls alike: the shipped D=64 configs differ by cap (:func:`config_for`), and
    the uncapped one (128 q rows per step) spills registers with a cap, so override capped D=64 calls
    with a capped-style config.  Raises ``TypeError`` for anything but a :class:`RankerBwdConfig` (a config
    that does not fit is refused when constructed, also through ``dataclasses.replace``: ``ValueError``
    with the reason, ``TypeError`` for a wrongly typed field).  Process-wide: while open, every thread's calls
    run it (blocks may open and close in several threads); blocks nest (the newest open block wins, also when
    blocks close out of order); each call opens one block (call it again for another)."""
    if not isinstance(config, RankerBwdConfig):
        raise TypeError(f"use_config takes a RankerBwdConfig, got {type(config).__name__}")
    with override_config(_OVERRIDES, config):
        yield config


def resolve_config(config: Optional[RankerBwdConfig], head_dim: int, capped: bool) -> RankerBwdConfig:
    """The config a backward call runs: ``config`` if given, else an active :func:`use_config`'s for
    ``head_dim``, else :func:`config_for` (``head_dim``, ``capped``)."""
    return config or overridden_config(_OVERRIDES, head_dim, NAME) or config_for(head_dim, capped)


def tile_m_fields(config: RankerBwdConfig, tile_m: int) -> dict:
    """The fields that give ``config`` ``tile_m`` q rows per step with the dQ form the shipped configs use
    for such a tile: ``dq_split_rows`` on for ``64 x MMA_WGS`` rows without ``dq_swap_ab`` (D=64's 128-row
    tile), off otherwise (what a tile-shape sweep or ``--config tile_m=..`` wants).  A dict, to be replaced
    together with any other changes (``dataclasses.replace(config, **tile_m_fields(config, 128), stages=1)``):
    a config checks itself when constructed, so a partial change may not fit on its own."""
    return dict(tile_m=tile_m, dq_split_rows=tile_m == 64 * MMA_WGS and not config.dq_swap_ab)


GQA_MIN_WAVES = 2  # gqa_group_per_cta=None: a group per CTA while that leaves this many waves of CTAs


@functools.lru_cache(maxsize=256)
def _with_field(config: RankerBwdConfig, name: str, value) -> RankerBwdConfig:
    """``dataclasses.replace(config, name=value)``, kept: the eager backward resolves its config on every call,
    and a replace re-validates the config (~12 us on the 2-core CPU)."""
    return dataclasses.replace(config, **{name: value})


def resolve_gqa_group(config: RankerBwdConfig, qhead_per_kvhead: int, num_batch: int, num_kv_heads: int,
                      max_seqlen: int, num_sms: int) -> RankerBwdConfig:
    """``config`` with ``gqa_group_per_cta`` decided: for MHA (one query head per KV head) None (one
    compile key for the one kernel); as given when True/False; else True when
    ``num_batch * num_kv_heads * ceil(max_seqlen / tile_n)`` CTAs (a group per CTA) fill at least
    :data:`GQA_MIN_WAVES` waves of ``num_sms`` SMs, False otherwise (one query head per CTA:
    ``qhead_per_kvhead`` times the CTAs, dK/dV through float32 accumulators).  A heuristic: fewer
    CTAs than that leave SMs idle at the end of the grid.
    Measured (H200, B=4 4096+512 H16/4 D=128, session 11): one head per CTA, the mainloop took 185 us
    more than MHA's plus 60 us of accumulator zeroing and conversion
    (bench/results/logs/2026-11-30_s11_ranker_bwd_launch_breakdown.log); a group per CTA 521-526 vs
    498 useful TFLOP/s (..._gqa_group_probe.log)."""

    if qhead_per_kvhead == 1:
        return config if config.gqa_group_per_cta is None else _with_field(config, "gqa_group_per_cta", None)
    if config.gqa_group_per_cta is not None:
        return config
    ctas = num_batch * num_kv_heads * -(-max_seqlen // config.tile_n)
    return _with_field(config, "gqa_group_per_cta", ctas >= GQA_MIN_WAVES * num_sms)


@cute.jit
def _tile_pending(flag):
    """1 while a dQ tile's flag says its first contents are not written yet (untouched, claimed or zeroing)."""
    return Int32(flag == DQ_TILE_UNTOUCHED) | Int32(flag == DQ_TILE_CLAIMED) | Int32(flag == DQ_TILE_ZEROING)


@cute.jit
def _wait_zeroed_or_claim(flag_ptr, timeout_cycles):
    """``dq_zero_in_mainloop``'s wait before a dQ add (one thread): spin until the tile's int32 flag says its
    first contents are written (:data:`DQ_TILE_READY` or :data:`DQ_TILE_STORED`; acquire, GPU scope); returns 0
    then.  If it still reads :data:`DQ_TILE_UNTOUCHED` after ``timeout_cycles`` (its zeroing KV block has not
    started), claim the tile (compare-and-swap to :data:`DQ_TILE_CLAIMED`) and return 1: the caller stores its
    dQ there instead of adding, then sets :data:`DQ_TILE_STORED`.  A flag seen claimed (or
    :data:`DQ_TILE_ZEROING`) is awaited without a timeout: its claimer is running and writes it without waiting
    on any other CTA, so no wait here can hang."""
    start = cute.arch.clock64()
    seen = cute.arch.atomic_add(flag_ptr, Int32(0), sem="acquire", scope="gpu")
    first = Int32(0)
    pending = _tile_pending(seen)
    while pending != 0:
        if seen == DQ_TILE_UNTOUCHED:
            if cute.arch.clock64() - start >= timeout_cycles:
                if cute.arch.atomic_cas(flag_ptr, cmp=Int32(DQ_TILE_UNTOUCHED), val=Int32(DQ_TILE_CLAIMED),
                                        scope="gpu") == DQ_TILE_UNTOUCHED:
                    first = Int32(1)
        if first == 0:
            seen = cute.arch.atomic_add(flag_ptr, Int32(0), sem="acquire", scope="gpu")
            pending = _tile_pending(seen)
        else:
            pending = Int32(0)
    return first


@cute.jit
def _wait_until(sem_ptr, value):
    """Spin (one thread) until the int32 semaphore at ``sem_ptr`` equals ``value`` (acquire, GPU scope)."""
    seen = cute.arch.atomic_add(sem_ptr, Int32(0), sem="acquire", scope="gpu")
    while seen != value:
        seen = cute.arch.atomic_add(sem_ptr, Int32(0), sem="acquire", scope="gpu")


def tiled_mmas(dtype, config: RankerBwdConfig):
    """The mainloop's WGMMAs (DSL objects; call inside a trace), ``(sdp, dkv, dq)``: S^T = K Q^T and
    dP^T = V dO^T (M = keys, 64 per MMA warpgroup; N = q rows; K = head dim); dV += P^T dO and dK +=
    dS^T Q (M = keys, N = head dim, K = q rows, A from registers); with ``split_head_dim`` the 64 keys are
    one M and the warpgroups split N instead (S^T's q rows; dK's and dV's head dim, A from smem); dQ = dS K
    (M = q rows, N = head dim split between the warpgroups; with ``dq_split_rows`` the q rows split instead, 64
    per warpgroup) or, with ``dq_swap_ab``, dQ^T = K^T dS^T (M = head dim, 64 per warpgroup; N = q rows).  The
    kernel and :func:`cute_kernels.layouts.kernel_layouts.ranker_bwd_layouts` both build them here."""
    K_MAJOR, MN_MAJOR = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
    if config.split_head_dim:  # the warpgroups side by side along N: q rows of S^T, head-dim columns of dK/dV
        sdp = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, K_MAJOR, K_MAJOR, Float32, atom_layout_mnk=(1, MMA_WGS, 1),
            tiler_mn=(64, config.tile_m // MMA_WGS))
        dkv = sm90_utils.make_trivial_tiled_mma(  # A = P^T or dS^T from smem
            dtype, dtype, K_MAJOR, MN_MAJOR, Float32, atom_layout_mnk=(1, MMA_WGS, 1),
            tiler_mn=(64, config.head_dim // MMA_WGS))
    else:
        sdp = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, K_MAJOR, K_MAJOR, Float32, atom_layout_mnk=(MMA_WGS, 1, 1),
            tiler_mn=(64, config.tile_m))
        dkv = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, K_MAJOR, MN_MAJOR, Float32, atom_layout_mnk=(MMA_WGS, 1, 1),
            tiler_mn=(64, config.head_dim), a_source=warpgroup.OperandSource.RMEM)
    if config.dq_swap_ab:
        dq = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, MN_MAJOR, MN_MAJOR, Float32, atom_layout_mnk=(MMA_WGS, 1, 1),
            tiler_mn=(64, config.tile_m))
    elif config.dq_split_rows:
        dq = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, MN_MAJOR, MN_MAJOR, Float32, atom_layout_mnk=(MMA_WGS, 1, 1),
            tiler_mn=(64, config.head_dim))
    else:
        dq = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, MN_MAJOR, MN_MAJOR, Float32, atom_layout_mnk=(1, MMA_WGS, 1),
            tiler_mn=(64, config.head_dim // MMA_WGS))
    return sdp, dkv, dq


def smem_layouts(dtype, config: RankerBwdConfig) -> dict:
    """The mainloop's shared-memory layouts (DSL objects; call inside a trace): ``sQ``, ``sdO`` (q rows,
    head dim, stages), ``sK``, ``sV`` (keys, head dim), ``sdSt`` (keys, q rows, ds_stages: dS^T, q rows
    contiguous), ``sdQ`` (q rows, head dim: float32 dQ; each warpgroup's half of the columns a
    contiguous block), ``sdQpart`` (one TMA reduce-add box of it), ``sdKVacc`` (float32 dK/dV of the
    per-head GQA epilogue, aliasing sK + sV) and ``sLSE`` (q rows, stages: LSE and dPsum stages, each a
    128-byte aligned TMA destination).  Swizzled K-major (:func:`.sm90_helpers.smem_layout`)."""
    dq_parts = MMA_WGS if config.dq_per_wg else 1
    sdQ = sm90.smem_layout(Float32, config.tile_m, config.head_dim)
    if config.dq_split_rows:  # one part: rows [0, tile_m / parts) of sdQ, the others at offsets
        sdQpart = cute.composition(sdQ, cute.make_layout((config.tile_m // dq_parts, config.head_dim),
                                                         stride=(1, config.tile_m)))
    else:  # one part: columns [0, head_dim / parts)
        sdQpart = sm90.smem_layout(Float32, config.tile_m, config.head_dim // dq_parts)
    return dict(
        sQ=sm90.smem_layout(dtype, config.tile_m, config.head_dim, config.stages),
        sdO=sm90.smem_layout(dtype, config.tile_m, config.head_dim, config.stages),
        sK=sm90.smem_layout(dtype, config.tile_n, config.head_dim),
        sV=sm90.smem_layout(dtype, config.tile_n, config.head_dim),
        sdSt=sm90.smem_layout(dtype, config.tile_n, config.tile_m, config.ds_stages),  # (sP^T too: split_head_dim)
        sdQ=sdQ,
        sdQpart=sdQpart,
        sdKVacc=sm90.smem_layout(Float32, config.tile_n, config.head_dim),
        sLSE=cute.make_layout((config.tile_m, config.stages), stride=(1, stats_stage_stride(config.tile_m))))


def shared_storage(dtype, config: RankerBwdConfig, lay: dict):
    """The mainloop's ``SharedStorage`` struct (DSL; call inside a trace) for the layouts ``lay`` of
    :func:`smem_layouts`: its size is :meth:`RankerBwdConfig.smem_bytes`."""

    def aligned(elem, layout, align):
        return cute.struct.Align[cute.struct.MemRange[elem, cute.cosize(layout)], align]

    # members in order (a plain dict: this module's annotations are strings, which cute.struct cannot read).
    # sK and sV are adjacent (equal sizes, multiples of 1024 B): the per-head GQA epilogue uses both as one
    # float32 (tile_n, head_dim) tile
    members = dict(
        mbar_kv=cute.struct.MemRange[cutlass.Int64, 2],
        mbar_q=cute.struct.MemRange[cutlass.Int64, config.stages * 2],
        mbar_do=cute.struct.MemRange[cutlass.Int64, config.stages * 2],
        sK=aligned(dtype, lay["sK"], 1024), sV=aligned(dtype, lay["sV"], 1024),
        sQ=aligned(dtype, lay["sQ"], 1024), sdO=aligned(dtype, lay["sdO"], 1024),
        sdSt=aligned(dtype, lay["sdSt"], 1024))
    if config.split_head_dim:
        members["sPt"] = aligned(dtype, lay["sdSt"], 1024)
    members.update(sdQ=aligned(Float32, lay["sdQ"], 1024), sLSE=aligned(Float32, lay["sLSE"], 128),
                   sdPsum=aligned(Float32, lay["sLSE"], 128))
    return cute.struct(type("SharedStorage", (), {"__annotations__": members}))


class BwdWork(NamedTuple):
    """What one backward mainloop CTA works on (:meth:`RankerAttentionBwd.block_work`; DSL values, made once at
    the kernel's start).  It visits q blocks in two disjoint ranges, the history rows' and the candidate rows',
    for each of its ``heads_per_cta`` query heads in turn (:meth:`RankerAttentionBwd.head_m_block_of`)."""

    n_block: Int32  # this CTA's KV block
    head: Int32  # its first query head
    batch: Int32
    offset: Int32  # the sequence's first token (packed) or 0
    pad_offset: Int32  # its first row in the row buffers padded to whole q tiles (ranker_bwd_buffers.padded_rows)
    seg: RankerSegments  # the sequence's history and candidate rows
    lo1: Int32  # first q block of the first range, and its number of q blocks
    n1: Int32
    lo2: Int32  # first q block of the second range (its count is per_head - n1)
    count: Int32  # (query head, q block) steps of the CTA: per_head x heads_per_cta, 0 if no query reaches it
    per_head: Int32  # q blocks per query head
    rank: Int32  # this KV block's rank among the sequence's history KV blocks
    n_kv: Int32  # their number (at least 1)
    stagger: Int32  # the walk's stagger in steps (config.walk_stagger capped at count // n_kv; 0 past
    # STAGGER_MAX_KV_BLOCKS KV blocks): walk_index


class ProducerOperands(NamedTuple):
    """What the producer warp's loads read (:meth:`RankerAttentionBwd.load`): the TMA views, smem buffers and TMA
    atoms of K, V (once per CTA) and of Q, dO, LSE, dPsum (per q block), and the three pipelines."""

    tma_Q: Any
    tma_K: Any
    tma_V: Any
    tma_dO: Any
    tma_LSE: Any  # (padded rows; ranker_bwd_buffers.padded_rows)
    tma_dPsum: Any
    sQ: Any  # (tile_m, D, stages)
    sK: Any
    sV: Any
    sdO: Any
    sLSE: Any  # (tile_m, stages)
    sdPsum: Any
    tma_atom_Q: Any
    tma_atom_K: Any
    tma_atom_V: Any
    tma_atom_dO: Any
    tma_atom_LSE: Any
    tma_atom_dPsum: Any
    pipeline_kv: Any  # K and V, once
    pipeline_q: Any  # Q + LSE of a q block
    pipeline_do: Any  # dO + dPsum of a q block


class MmaOperands(NamedTuple):
    """What the MMA warpgroups read (:meth:`RankerAttentionBwd.mma` and its epilogue; made in ``kernel``): the
    three WGMMAs, the smem buffers, the dK / dV outputs (TMA views and atoms, plain tensors for varlen, the
    deterministic mode's semaphores), the pipelines, the thread's index among them and the score scalars.
    ``sPt`` is None without ``split_head_dim``, ``mdKVsem`` unless ``deterministic`` with per-head accumulation."""

    tiled_mma_sdp: Any  # S^T = K Q^T and dP^T = V dO^T
    tiled_mma_dkv: Any  # dV += P^T dO, dK += dS^T Q
    tiled_mma_dq: Any  # dQ = dS K, or dQ^T = K^T dS^T (dq_swap_ab)
    sQ: Any
    sdO: Any
    sK: Any  # (also dK's staging in the epilogue)
    sV: Any  # (also dV's)
    sdSt: Any  # dS^T, (tile_n, tile_m, ds_stages)
    sPt: Any  # P^T (split_head_dim)
    sdQ: Any  # the dQ tile handed to the dQ warp
    sLSE: Any
    sdPsum: Any
    sdKVacc: Any  # float32 staging over sK + sV (adjacent; GQA with one query head per CTA)
    tma_dK: Any
    tma_dV: Any
    tma_atom_dK: Any
    tma_atom_dV: Any
    mdK: Any
    mdV: Any
    mdKVsem: Any  # deterministic mode: per-(KV block, KV head) semaphores
    pipeline_kv: Any
    pipeline_q: Any
    pipeline_do: Any
    tidx: Any  # thread index among the MMA warpgroups
    scale_log2: Any
    softmax_scale: Any
    cap: Any


class QBlockOperands(NamedTuple):
    """What every q block of an MMA warpgroup's loop reads (:meth:`RankerAttentionBwd.q_blocks`; DSL objects of the
    KV block, made in ``mma``): the WGMMAs, their operand fragments and the dK / dV accumulators, the partitions and
    copy atoms of the smem hand-offs (dQ, P^T, dS^T), the LSE / dPsum stages, the Q and dO pipelines and the score
    scalars.  Fields one schedule does not use are None (``tdVrPt``, ``tdPsPt``: ``split_head_dim`` only)."""

    tiled_mma_sdp: Any  # S^T = K Q^T and dP^T = V dO^T
    tiled_mma_dkv: Any  # dV += P^T dO, dK += dS^T Q
    tiled_mma_dk: Any  # dK's: tiled_mma_dkv, or with dk_from_smem one taking dS^T from smem
    tiled_mma_dq: Any  # dQ = dS K, or dQ^T = K^T dS^T (dq_swap_ab)
    tSrK: Any
    tSrQ: Any
    tdPrV: Any
    tdPrdO: Any
    tdVrdOt: Any
    tdVrPt: Any
    tdKrdSt: Any
    tdKrQt: Any
    tdQrdS: Any
    tdQrKt: Any
    acc_dK: Any
    acc_dV: Any
    tScS_mn: Any  # (key, q row) of this thread's S^T elements
    tdQsdQ: Any  # this thread's slice of the dQ tile in smem
    ds_thr_copy: Any  # stmatrix of P^T / dS^T into smem
    tdSsdS: Any
    tdPsPt: Any
    smem_atom: Any
    sLSE: Any
    sdPsum: Any
    pipeline_q: Any
    pipeline_do: Any
    scale_log2: Any
    softmax_scale: Any
    cap: Any


class RankerAttentionBwd:
    """The backward mainloop for one (dtype, config, GQA ratio, cap method, varlen)."""

    def __init__(self, dtype, config: RankerBwdConfig, qhead_per_kvhead: int, cap_method: str, varlen: bool):
        if cap_method not in CAP_METHODS:
            raise ValueError(f"cap_method={cap_method!r}: expected one of {CAP_METHODS}")
        self.dtype = dtype
        self.config = config
        self.tile_m = config.tile_m
        self.tile_n = config.tile_n
        self.head_dim = config.head_dim
        self.stages = config.stages
        self.qhead_per_kvhead = qhead_per_kvhead
        self.walk_stagger = config.walk_stagger_steps()  # (None resolved by the mode)
        # query heads per CTA (all of a KV head's, or one) and whether dK/dV go through float32
        # accumulators (GQA with one query head per CTA: reduce-added, converted by the postprocess)
        group = qhead_per_kvhead > 1 and config.gqa_group_per_cta is not False
        self.heads_per_cta = qhead_per_kvhead if group else 1
        self.dkv_accumulated = qhead_per_kvhead > 1 and not group
        self.cap_method = cap_method
        # skip_key_bias doubles the q-block loop; with a cap and GQA that raised ptxas's stack from 8 to 16-56 B
        # (unmeasured on the GPU), so those calls keep the one loop
        self.skip_key_bias = config.skip_key_bias and (cap_method == "none" or qhead_per_kvhead == 1)
        self.varlen = varlen
        self.num_mma_threads = 128 * MMA_WGS
        self.num_threads = 128 + self.num_mma_threads
        self.dq_parts = MMA_WGS if config.dq_per_wg else 1  # TMA reduce-adds per q block
        # dQ tiles zeroed by this kernel's KV blocks; int32 flags per (q block, query head) then (dq_flagged), as
        # the deterministic mode's counters
        self.dq_zero_duty = config.dq_zero_in_mainloop and not config.deterministic
        self.dq_flagged = dq_flagged(config)

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor,
                 mdPsum: cute.Tensor, mdQaccum: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                 mBounds: cute.Tensor, mCuSeqlens: Optional[cute.Tensor], mdQflag: Optional[cute.Tensor],
                 mdKVsem: Optional[cute.Tensor], scale_log2: Float32, softmax_scale: Float32, cap: Float32,
                 num_batch: Int32, max_seqlen: Int32, stream):
        # (B, S, H, D) -> (S, D, H, B); packed (T, H, D) -> (T, D, H).  Per-row buffers (B, H, S_pad) ->
        # (S_pad, H, B) / (H, T_pad) -> (T_pad, H); dQ accumulator (B, H, S_pad, D) -> (S_pad, D, H, B) /
        # (H, T_pad, D) -> (T_pad, D, H)
        if const_expr(self.varlen):
            mQ, mK, mV, mdO, mdK, mdV = [sm90.select_modes(t, [0, 2, 1]) for t in (mQ, mK, mV, mdO, mdK, mdV)]
            mLSE2, mdPsum = [sm90.select_modes(t, [1, 0]) for t in (mLSE2, mdPsum)]
            mdQaccum = sm90.select_modes(mdQaccum, [1, 2, 0])
        else:
            mQ, mK, mV, mdO, mdK, mdV = [sm90.select_modes(t, [1, 3, 2, 0]) for t in (mQ, mK, mV, mdO, mdK, mdV)]
            mLSE2, mdPsum = [sm90.select_modes(t, [2, 1, 0]) for t in (mLSE2, mdPsum)]
            mdQaccum = sm90.select_modes(mdQaccum, [2, 3, 1, 0])

        tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq = tiled_mmas(self.dtype, self.config)
        lay = smem_layouts(self.dtype, self.config)
        sQ_layout, sdO_layout, sK_layout, sV_layout = lay["sQ"], lay["sdO"], lay["sK"], lay["sV"]
        sdSt_layout, sdQ_layout, sdQpart_layout = lay["sdSt"], lay["sdQ"], lay["sdQpart"]
        sdKVacc_layout, sLSE_layout = lay["sdKVacc"], lay["sLSE"]
        dq_box = self.dq_box()

        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mQ, cute.select(sQ_layout, mode=[0, 1]), (self.tile_m, self.head_dim))
        tma_atom_dO, tma_dO = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mdO, cute.select(sdO_layout, mode=[0, 1]),
            (self.tile_m, self.head_dim))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mK, sK_layout, (self.tile_n, self.head_dim))
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mV, sV_layout, (self.tile_n, self.head_dim))
        tma_atom_LSE, tma_LSE = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mLSE2, cute.make_layout(self.tile_m), (self.tile_m,))
        tma_atom_dPsum, tma_dPsum = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mdPsum, cute.make_layout(self.tile_m), (self.tile_m,))
        tma_atom_dQ, tma_dQ = cpasync.make_tiled_tma_atom(
            cpasync.CopyReduceBulkTensorTileS2GOp(), mdQaccum, sdQpart_layout, dq_box)
        tma_atom_dQst, tma_dQst = None, None  # deterministic: the first KV block's plain store; zeroing the tiles
        if const_expr(self.dq_flagged):
            tma_atom_dQst, tma_dQst = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), mdQaccum, sdQpart_layout, dq_box)
        if const_expr(self.dkv_accumulated):
            tma_atom_dK, tma_dK = cpasync.make_tiled_tma_atom(
                cpasync.CopyReduceBulkTensorTileS2GOp(), mdK, sdKVacc_layout, (self.tile_n, self.head_dim))
            tma_atom_dV, tma_dV = cpasync.make_tiled_tma_atom(
                cpasync.CopyReduceBulkTensorTileS2GOp(), mdV, sdKVacc_layout, (self.tile_n, self.head_dim))
        else:
            tma_atom_dK, tma_dK = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), mdK, sK_layout, (self.tile_n, self.head_dim))
            tma_atom_dV, tma_dV = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), mdV, sV_layout, (self.tile_n, self.head_dim))
        self.tma_bytes_q = cute.size_in_bytes(self.dtype, cute.select(sQ_layout, mode=[0, 1])) + self.tile_m * 4
        self.tma_bytes_kv = 2 * cute.size_in_bytes(self.dtype, sK_layout)

        self.shared_storage = shared_storage(self.dtype, self.config, lay)

        num_n_blocks = cute.ceil_div(max_seqlen, self.tile_n)
        grid = (num_n_blocks, cute.size(mQ.shape[2]) // self.heads_per_cta, num_batch)
        self.kernel(
            tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum, tma_dQ, tma_dQst, tma_dK, tma_dV, mdK, mdV, mBounds,
            mCuSeqlens, mdQflag, mdKVsem, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO, tma_atom_LSE, tma_atom_dPsum,
            tma_atom_dQ, tma_atom_dQst, tma_atom_dK, tma_atom_dV, tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq,
            sQ_layout, sdO_layout, sK_layout, sV_layout, sdSt_layout, sdQ_layout, sdKVacc_layout, sLSE_layout,
            scale_log2, softmax_scale, cap, Int32(mQ.shape[0]),
        ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(self, tma_Q: cute.Tensor, tma_K: cute.Tensor, tma_V: cute.Tensor, tma_dO: cute.Tensor,
               tma_LSE: cute.Tensor, tma_dPsum: cute.Tensor, tma_dQ: cute.Tensor, tma_dQst: Optional[cute.Tensor],
               tma_dK: cute.Tensor, tma_dV: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, mBounds: cute.Tensor,
               mCuSeqlens: Optional[cute.Tensor], mdQflag: Optional[cute.Tensor], mdKVsem: Optional[cute.Tensor],
               tma_atom_Q: cute.CopyAtom, tma_atom_K: cute.CopyAtom, tma_atom_V: cute.CopyAtom,
               tma_atom_dO: cute.CopyAtom, tma_atom_LSE: cute.CopyAtom, tma_atom_dPsum: cute.CopyAtom,
               tma_atom_dQ: cute.CopyAtom, tma_atom_dQst: Optional[cute.CopyAtom], tma_atom_dK: cute.CopyAtom,
               tma_atom_dV: cute.CopyAtom,
               tiled_mma_sdp: cute.TiledMma, tiled_mma_dkv: cute.TiledMma, tiled_mma_dq: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sdO_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, sdSt_layout: cute.ComposedLayout, sdQ_layout: cute.ComposedLayout,
               sdKVacc_layout: cute.ComposedLayout, sLSE_layout: cute.Layout,
               scale_log2: Float32, softmax_scale: Float32, cap: Float32, seqlen_static: Int32):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO, tma_atom_LSE, tma_atom_dPsum):
                cpasync.prefetch_descriptor(atom)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads // 32)
        pipeline_kv = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_kv.data_ptr(), num_stages=1, producer_group=producer,
            consumer_group=consumers, tx_count=self.tma_bytes_kv, defer_sync=True)
        pipeline_q = pipeline.PipelineTmaAsync.create(  # Q + LSE of a q block
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=consumers, tx_count=self.tma_bytes_q, defer_sync=True)
        pipeline_do = pipeline.PipelineTmaAsync.create(  # dO + dPsum of a q block
            barrier_storage=storage.mbar_do.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=consumers, tx_count=self.tma_bytes_q, defer_sync=True)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = storage.sdO.get_tensor(sdO_layout.outer, swizzle=sdO_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sdSt = storage.sdSt.get_tensor(sdSt_layout.outer, swizzle=sdSt_layout.inner)
        sPt = None
        if const_expr(self.config.split_head_dim):
            sPt = storage.sPt.get_tensor(sdSt_layout.outer, swizzle=sdSt_layout.inner)
        sdQ = storage.sdQ.get_tensor(sdQ_layout.outer, swizzle=sdQ_layout.inner)
        sdQ_flat = storage.sdQ.get_tensor(cute.make_layout(cute.cosize(sdQ_layout)))  # (zeroed whole)
        sLSE = storage.sLSE.get_tensor(sLSE_layout)
        sdPsum = storage.sdPsum.get_tensor(sLSE_layout)
        sdKVacc = cute.make_tensor(
            cute.recast_ptr(storage.sK.data_ptr(), sdKVacc_layout.inner, dtype=Float32), sdKVacc_layout.outer)

        work = self.block_work(mBounds, mCuSeqlens, seqlen_static)
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.config.producer_regs)
            if warp_idx == 0:
                self.load(ProducerOperands(tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum, sQ, sK, sV, sdO, sLSE,
                                           sdPsum, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO, tma_atom_LSE,
                                           tma_atom_dPsum, pipeline_kv, pipeline_q, pipeline_do), work)
            if warp_idx == 1:
                self.dq_reduce(tma_dQ, tma_dQst, sdQ, sdQ_flat, tma_atom_dQ, tma_atom_dQst, mdQflag, work)
        else:
            cute.arch.setmaxregister_increase(self.config.mma_regs)
            self.mma(MmaOperands(tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, sQ, sdO, sK, sV, sdSt, sPt, sdQ, sLSE,
                                 sdPsum, sdKVacc, tma_dK, tma_dV, tma_atom_dK, tma_atom_dV, mdK, mdV, mdKVsem,
                                 pipeline_kv, pipeline_q, pipeline_do, tidx - 128, scale_log2, softmax_scale, cap),
                     work)

    # ------------------------------------------------------------------ work of this CTA
    @cute.jit
    def block_work(self, mBounds, mCuSeqlens, seqlen_static):
        """This CTA's :class:`BwdWork`: its KV block, first query head and batch row, the sequence's offsets
        and segments, and the q blocks to visit (none for a KV block outside the history: its keys are
        reached by no query but themselves, the postprocess's)."""
        n_block, head_group, batch = cute.arch.block_idx()
        head = head_group * self.heads_per_cta
        offset, seqlen, pad_offset = sequence_offsets(mCuSeqlens, batch, seqlen_static, self.tile_m, self.varlen)
        seg = RankerSegments.load(mBounds, batch, seqlen)
        lo1, n1, lo2, n2 = seg.m_block_ranges(self.tile_m)
        key_lo = n_block * self.tile_n
        reached = (Int32(key_lo < seg.hist_hi) * Int32(key_lo + self.tile_n > seg.hist_lo)
                   * Int32(seg.hist_hi > seg.hist_lo))
        per_head = (n1 + n2) * reached
        count = per_head * self.heads_per_cta
        rank = Int32(n_block) - seg.n_block_min(self.tile_n)
        # the history KV blocks this launch has (all of them, unless a caller's max_seqlen understates a sequence,
        # which only graph capture does not check: then the dQ tiles' owners and the deterministic order are
        # those of the launched ones, so that no CTA waits for one that does not exist)
        launched = Int32(cute.arch.grid_dim()[0]) - seg.n_block_min(self.tile_n)
        n_kv = cutlass.max(cutlass.min(seg.n_block_count(self.tile_n), launched), Int32(1))
        stagger = Int32(0)
        if const_expr(self.walk_stagger > 0):
            stagger = (cutlass.min(Int32(self.walk_stagger), count // n_kv)
                       * Int32(n_kv <= STAGGER_MAX_KV_BLOCKS))
        return BwdWork(Int32(n_block), Int32(head), Int32(batch), offset, pad_offset, seg, lo1, n1, lo2,
                       count, per_head, rank, n_kv, stagger)

    @staticmethod
    def m_block_of(i, work):
        """The i-th q block to visit of one head (first range, then second)."""
        lo1, n1, lo2 = work.lo1, work.n1, work.lo2
        in_first = Int32(i < n1)
        return (lo1 + i) * in_first + (lo2 + i - n1) * (1 - in_first)

    def _block(self, tXgX, head, *coord):
        """``tXgX[None, *coord]`` of a TMA partition by q block (one head per CTA), or
        ``tXgX[None, *coord, head]`` of one by (q block, ..., head) (a group per CTA)."""
        if const_expr(self.heads_per_cta == 1):
            return tXgX[(None, *coord)]
        return tXgX[(None, *coord, head)]

    def walk_index(self, i, work):
        """Index ``t`` in ``[0, count)`` of the (query head, q block) the CTA visits at its step ``i``: ``i``
        itself, or with ``walk_stagger`` ``(i + rho * stagger) mod count``, ``rho = n_kv - 1 - rank`` (the
        last KV block starts first: in the deterministic mode a KV block then waits, q block after q block,
        for the one below it, which the GPU launched before it, except the lowest, which waits for the highest:
        :data:`STAGGER_MAX_KV_BLOCKS`)."""
        if const_expr(self.walk_stagger == 0):
            return i
        t = i + (work.n_kv - 1 - work.rank) * work.stagger
        return t - work.count * Int32(t >= work.count)

    def head_m_block_of(self, t, work):
        """(query head, q block) of walk index ``t`` (:meth:`walk_index`): the heads in turn, each over its
        q blocks."""
        if const_expr(self.heads_per_cta == 1):
            return work.head, self.m_block_of(t, work)
        h = t // work.per_head
        return work.head + h, self.m_block_of(t - h * work.per_head, work)

    def dq_add_position(self, t, work):
        """Deterministic mode: this KV block's place among the KV blocks adding into walk index ``t``'s dQ
        tile (0 stores it, each later one adds after the one before).  Without a stagger, KV order (the
        rank).  With one (``s``; :meth:`walk_index`'s walks start at ``rho * s``, distinct and below
        ``count``), the KV block of ``rho`` reaches ``t`` at step ``(t - rho * s) mod count``: first the
        highest ``rho`` with ``rho * s <= t`` (``rho* = min(n_kv - 1, t // s)``), then those below it, then
        down from the top: the place is ``(rho* - rho) mod n_kv``."""
        rank = work.rank
        if const_expr(self.walk_stagger == 0):
            return rank
        n_kv, stagger = work.n_kv, work.stagger
        rho = n_kv - 1 - rank
        first = cutlass.min(n_kv - 1, t // cutlass.max(stagger, Int32(1)))
        pos = first - rho + n_kv * Int32(first < rho)
        return pos * Int32(stagger > 0) + rank * Int32(stagger == 0)

    def _dq_flag_ptr(self, mdQflag, work, head, m_block):
        """Pointer to the flag of the dQ tile (q block, head) of this CTA's sequence (:func:`dq_flag_coord`), for
        the atomics."""
        pad_block = work.pad_offset // self.tile_m + m_block if const_expr(self.varlen) else m_block
        b, h, i = dq_flag_coord(work.batch, head, pad_block, self.varlen)
        return mdQflag[b, h, None].iterator + i

    def _view(self, mX, work, head):
        """(S, D) view of one sequence and head of a (S, D, H, B) or packed (T, D, H) tensor; ``head=None``:
        (S, D, H), every head."""
        if const_expr(head is None):
            if const_expr(self.varlen):
                return cute.domain_offset((work.offset, 0, 0), mX)
            return mX[None, None, None, work.batch]
        if const_expr(self.varlen):
            return cute.domain_offset((work.offset, 0), mX[None, None, head])
        return mX[None, None, head, work.batch]

    def _padded_view(self, mX, work, head):
        """View of one sequence and head of a padded per-row buffer ((S_pad[, D], H, B) or (T_pad[, D], H));
        ``head=None``: every head (the H mode kept last)."""
        if const_expr(cute.rank(mX) == 4 or (self.varlen and cute.rank(mX) == 3)):
            if const_expr(head is None):
                if const_expr(self.varlen):
                    return cute.domain_offset((work.pad_offset, 0, 0), mX)
                return mX[None, None, None, work.batch]
            if const_expr(self.varlen):
                return cute.domain_offset((work.pad_offset, 0), mX[None, None, head])
            return mX[None, None, head, work.batch]
        if const_expr(head is None):
            if const_expr(self.varlen):
                return cute.domain_offset((work.pad_offset, 0), mX)
            return mX[None, None, work.batch]
        if const_expr(self.varlen):
            return cute.domain_offset((work.pad_offset,), mX[None, head])
        return mX[None, head, work.batch]

    # ------------------------------------------------------------------ producer
    @cute.jit
    def load(self, ops, work):
        """Warp 0 (``ops``: :class:`ProducerOperands`): K and V of this CTA's block once, then Q + LSE and dO +
        dPsum of each q block to visit (of each of the CTA's query heads), ``stages`` blocks ahead of the MMA
        warpgroups."""
        n_block, count = work.n_block, work.count
        head_kv = work.head // self.qhead_per_kvhead
        if count > 0:
            gK = cute.local_tile(self._view(ops.tma_K, work, head_kv), (self.tile_n, self.head_dim), (n_block, 0))
            gV = cute.local_tile(self._view(ops.tma_V, work, head_kv), (self.tile_n, self.head_dim), (n_block, 0))
            one = cute.make_layout(1)
            tKsK, tKgK = cpasync.tma_partition(ops.tma_atom_K, 0, one, cute.group_modes(ops.sK, 0, 2),
                                               cute.group_modes(gK, 0, 2))
            tVsV, tVgV = cpasync.tma_partition(ops.tma_atom_V, 0, one, cute.group_modes(ops.sV, 0, 2),
                                               cute.group_modes(gV, 0, 2))
            # one query head: partitions by q block; a group: by (q block, head)
            srcs = self.q_block_sources(ops, work, work.head if const_expr(self.heads_per_cta == 1) else None)
            pipeline_kv, pipeline_q, pipeline_do = ops.pipeline_kv, ops.pipeline_q, ops.pipeline_do
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            pipeline_kv.producer_acquire(kv_state)
            cute.copy(ops.tma_atom_K, tKgK, tKsK, tma_bar_ptr=pipeline_kv.producer_get_barrier(kv_state))
            cute.copy(ops.tma_atom_V, tVgV, tVsV, tma_bar_ptr=pipeline_kv.producer_get_barrier(kv_state))
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            for i in cutlass.range(count, unroll=1):
                head, m_block = self.head_m_block_of(self.walk_index(i, work), work)
                (tQsQ, tQgQ), (tdOsdO, tdOgdO), (tLsL, tLgL), (tPsP, tPgP) = srcs
                pipeline_q.producer_acquire(q_state)
                bar_q = pipeline_q.producer_get_barrier(q_state)
                cute.copy(ops.tma_atom_Q, self._block(tQgQ, head, m_block), tQsQ[None, q_state.index],
                          tma_bar_ptr=bar_q)
                cute.copy(ops.tma_atom_LSE, self._block(tLgL, head, m_block), tLsL[None, q_state.index],
                          tma_bar_ptr=bar_q)
                pipeline_do.producer_acquire(q_state)
                bar_do = pipeline_do.producer_get_barrier(q_state)
                cute.copy(ops.tma_atom_dO, self._block(tdOgdO, head, m_block), tdOsdO[None, q_state.index],
                          tma_bar_ptr=bar_do)
                cute.copy(ops.tma_atom_dPsum, self._block(tPgP, head, m_block), tPsP[None, q_state.index],
                          tma_bar_ptr=bar_do)
                q_state.advance()

    @cute.jit
    def q_block_sources(self, ops, work, head):
        """TMA partitions (smem, gmem by q block) of Q, dO, LSE and dPsum of query head ``head``; ``head=None``:
        gmem by (q block, head).  ``ops``: :class:`ProducerOperands`."""
        every = head is None
        tile_coord, row_coord = ((None, 0, None), (None, None)) if const_expr(every) else ((None, 0), (None,))
        gQ = cute.local_tile(self._view(ops.tma_Q, work, head), (self.tile_m, self.head_dim), tile_coord)
        gdO = cute.local_tile(self._view(ops.tma_dO, work, head), (self.tile_m, self.head_dim), tile_coord)
        gLSE = cute.local_tile(self._padded_view(ops.tma_LSE, work, head), (self.tile_m,), row_coord)
        gdPsum = cute.local_tile(self._padded_view(ops.tma_dPsum, work, head), (self.tile_m,), row_coord)
        one = cute.make_layout(1)
        return (cpasync.tma_partition(ops.tma_atom_Q, 0, one, cute.group_modes(ops.sQ, 0, 2),
                                      cute.group_modes(gQ, 0, 2)),
                cpasync.tma_partition(ops.tma_atom_dO, 0, one, cute.group_modes(ops.sdO, 0, 2),
                                      cute.group_modes(gdO, 0, 2)),
                cpasync.tma_partition(ops.tma_atom_LSE, 0, one, cute.group_modes(ops.sLSE, 0, 1),
                                      cute.group_modes(gLSE, 0, 1)),
                cpasync.tma_partition(ops.tma_atom_dPsum, 0, one, cute.group_modes(ops.sdPsum, 0, 1),
                                      cute.group_modes(gdPsum, 0, 1)))

    @cute.jit
    def dq_reduce(self, tma_dQ, tma_dQst, sdQ, sdQ_flat, tma_atom_dQ, tma_atom_dQst, mdQflag, work):
        """Warp 1: for each (q block, query head) step, wait for the MMA warpgroups' dQ tile in smem
        (``dq_parts`` blocks, one per warpgroup with ``dq_per_wg``: head-dim columns, or q rows with
        ``dq_split_rows``), add each to the float32
        accumulator in global memory with one TMA bulk reduce-add copy (at D=128 two instructions per
        half: a 128-byte swizzle box holds 32 float32 columns), hand the buffers back once the reduces
        have read them.
        Deterministic mode: the KV blocks of a q block add in a fixed order (a per-q-block semaphore
        counts the adds done; FlashAttention-3's scheme), the first in order with a TMA store instead (the
        accumulator is not zeroed there; the postprocess reads zeros where the count stayed 0): KV order,
        or with ``walk_stagger`` the order in which the staggered walks reach the q block
        (:meth:`dq_add_position`).  ``dq_zero_in_mainloop``: first this CTA's share of the zeroing
        (:meth:`zero_dq_tiles`), then each add after its tile's flag is set."""
        count = work.count
        lane = cute.arch.lane_idx()
        if count > 0:
            head_arg = work.head if const_expr(self.heads_per_cta == 1) else None
            parts = self.dq_parts_of(tma_dQ, sdQ, tma_atom_dQ, work, head_arg)
            store_parts = parts
            if const_expr(self.dq_flagged):
                store_parts = self.dq_parts_of(tma_dQst, sdQ, tma_atom_dQst, work, head_arg)
            if const_expr(self.dq_zero_duty):
                self.zero_dq_tiles(sdQ_flat, store_parts, tma_atom_dQst, mdQflag, work)
            nthreads = self.num_mma_threads // self.dq_parts + 32
            for w in cutlass.range_constexpr(self.dq_parts):  # sdQ is free for the first q block
                cute.arch.barrier_arrive(barrier_id=int(NamedBarrierBwd.dQEmpty) + w, number_of_threads=nthreads)
            if const_expr(self.dq_zero_duty):  # (while the MMA warpgroups compute the first q block)
                self.publish_zeroed_tiles(mdQflag, work)
            for i in cutlass.range(count, unroll=1):
                t = self.walk_index(i, work)
                head, m_block = self.head_m_block_of(t, work)
                pos = self.dq_add_position(t, work) if const_expr(self.config.deterministic) else None
                # whether this KV block's dQ goes in with a TMA store: the first add in order (deterministic), or
                # an add that timed out waiting for the tile's zeroing and claimed it (dq_zero_duty)
                first = Int32(pos == 0) if const_expr(self.config.deterministic) else Int32(0)
                if const_expr(self.dq_zero_duty):  # the tile zeroed (acquire), checked before its dQ is ready
                    if lane == 0:
                        first = _wait_zeroed_or_claim(self._dq_flag_ptr(mdQflag, work, head, m_block),
                                                      Int64(self.config.dq_zero_wait_cycles))
                    first = cute.arch.shuffle_sync(first, 0)
                    cute.arch.fence_proxy("async.global")  # the acquire above before the TMA reduce-adds
                for w in cutlass.range_constexpr(self.dq_parts):
                    cute.arch.barrier(barrier_id=int(NamedBarrierBwd.dQFull) + w, number_of_threads=nthreads)
                    if const_expr(self.config.deterministic and w == 0):
                        sem = self._dq_flag_ptr(mdQflag, work, head, m_block)
                        if lane == 0:
                            _wait_until(sem, pos)
                        cute.arch.sync_warp()
                        cute.arch.fence_proxy("async.global")  # the acquire above before the TMA reduce-add
                    tdQsdQ, tdQgdQ = parts[w]
                    coord = self.dq_tile_coord(m_block, w)
                    if const_expr(self.config.deterministic or self.dq_zero_duty):
                        if first != 0:
                            cute.copy(tma_atom_dQst, store_parts[w][0], self._block(store_parts[w][1], head, *coord))
                        else:
                            cute.copy(tma_atom_dQ, tdQsdQ, self._block(tdQgdQ, head, *coord))
                    else:
                        cute.copy(tma_atom_dQ, tdQsdQ, self._block(tdQgdQ, head, *coord))
                    cute.arch.cp_async_bulk_commit_group()
                # hand sdQ back as soon as the copies have read it (in the deterministic mode, before the wait
                # for their completion below: the MMA warpgroups write the next tile meanwhile)
                cute.arch.cp_async_bulk_wait_group(0, read=True)
                if i + 1 < count:
                    for w in cutlass.range_constexpr(self.dq_parts):
                        cute.arch.barrier_arrive(barrier_id=int(NamedBarrierBwd.dQEmpty) + w,
                                                 number_of_threads=nthreads)
                if const_expr(self.config.deterministic):
                    cute.arch.cp_async_bulk_wait_group(0, read=False)  # the adds are done, not only read
                    cute.arch.sync_warp()  # (every lane's wait before lane 0's release)
                    if lane == 0:
                        sem = self._dq_flag_ptr(mdQflag, work, head, m_block)
                        cute.arch.atomic_add(sem, Int32(1), sem="release", scope="gpu")
                if const_expr(self.dq_zero_duty):
                    if first != 0:  # the claimed tile written (not only read): open it to the adds
                        cute.arch.cp_async_bulk_wait_group(0, read=False)
                        cute.arch.sync_warp()
                        if lane == 0:
                            cute.arch.atomic_exch(self._dq_flag_ptr(mdQflag, work, head, m_block),
                                                  Int32(DQ_TILE_STORED), sem="release", scope="gpu")

    @cute.jit
    def zero_dq_tiles(self, sdQ_flat, store_parts, tma_atom_dQst, mdQflag, work):
        """``dq_zero_in_mainloop``, warp 1 before the first q block: zero sdQ, claim the dQ tiles of walk indices
        ``rank + j * n_kv`` (this KV block's share: every index below ``count`` has one owner among the
        sequence's ``n_kv`` history KV blocks, which all walk the same ``count`` indices; lane ``j % 32`` claims
        tile j by compare-and-swap of its flag, :data:`DQ_TILE_UNTOUCHED` -> :data:`DQ_TILE_ZEROING`), and
        TMA-store sdQ over the claimed ones (a tile already claimed by a timed-out add holds its dQ: left).
        Returns once the stores have read sdQ: :meth:`publish_zeroed_tiles` opens the tiles once written."""
        lane = cute.arch.lane_idx()
        count, rank, n_kv = work.count, work.rank, work.n_kv
        st_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
        rZero = cute.make_rmem_tensor((4,), Float32)
        rZero.fill(0.0)
        for j in cutlass.range(self.tile_m * self.head_dim // 128, unroll=4):  # 16 bytes per lane each
            cute.copy(st_atom, rZero, cute.local_tile(sdQ_flat, (4,), (j * 32 + lane,)))
        cute.arch.fence_view_async_shared()  # the zeros -> the TMA stores' reads
        cute.arch.sync_warp()
        mine = (count - rank + n_kv - 1) // n_kv
        for c in cutlass.range((mine + 31) // 32, unroll=1):  # 32 tiles at a time, a lane each
            j = c * 32 + lane
            won = Int32(0)
            if j < mine:
                head, m_block = self.head_m_block_of(rank + j * n_kv, work)
                if cute.arch.atomic_cas(self._dq_flag_ptr(mdQflag, work, head, m_block), cmp=Int32(DQ_TILE_UNTOUCHED),
                                        val=Int32(DQ_TILE_ZEROING), scope="gpu") == DQ_TILE_UNTOUCHED:
                    won = Int32(1)
            for jj in cutlass.range(cutlass.min(mine - c * 32, Int32(32)), unroll=1):
                if cute.arch.shuffle_sync(won, jj) != 0:
                    head, m_block = self.head_m_block_of(rank + (c * 32 + jj) * n_kv, work)
                    for w in cutlass.range_constexpr(self.dq_parts):
                        tXsX, tXgX = store_parts[w]
                        cute.copy(tma_atom_dQst, tXsX, self._block(tXgX, head, *self.dq_tile_coord(m_block, w)))
                    cute.arch.cp_async_bulk_commit_group()
        cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def publish_zeroed_tiles(self, mdQflag, work):
        """After :meth:`zero_dq_tiles`: wait until its stores are written, then open each tile it zeroed
        (compare-and-swap :data:`DQ_TILE_ZEROING` -> :data:`DQ_TILE_READY`, release; lane ``j % 32`` that of its
        ``j``-th tile; a tile claimed by an add is left to it; every add acquires the flag first:
        :meth:`dq_reduce`)."""
        lane = cute.arch.lane_idx()
        count, rank, n_kv = work.count, work.rank, work.n_kv
        mine = (count - rank + n_kv - 1) // n_kv
        cute.arch.cp_async_bulk_wait_group(0, read=False)  # written, not only read
        cute.arch.sync_warp()
        for c in cutlass.range((mine + 31) // 32, unroll=1):
            j = c * 32 + lane
            if j < mine:
                head, m_block = self.head_m_block_of(rank + j * n_kv, work)
                cute.arch.atomic_cas(self._dq_flag_ptr(mdQflag, work, head, m_block), cmp=Int32(DQ_TILE_ZEROING),
                                     val=Int32(DQ_TILE_READY), sem="release", scope="gpu")

    def dq_tile_coord(self, m_block, w):
        """Coordinate of q block ``m_block``'s part ``w`` in the dQ accumulator's tiling by :meth:`dq_box`."""
        if const_expr(self.config.dq_split_rows):
            return (m_block * self.dq_parts + w, 0)
        return (m_block, w)

    def dq_parts_of(self, tma_dQ, sdQ, tma_atom_dQ, work, head):
        """TMA partitions (smem part w, gmem by (q block, part)) of query head ``head``'s dQ accumulator;
        ``head=None``: gmem by (q block, part, head)."""
        box = self.dq_box()
        coord = (None, None, None) if const_expr(head is None) else (None, None)
        gdQ = cute.local_tile(self._padded_view(tma_dQ, work, head), box, coord)
        return [cpasync.tma_partition(tma_atom_dQ, 0, cute.make_layout(1),
                                      cute.group_modes(cute.local_tile(sdQ, box, self.dq_part_coord(w)), 0, 2),
                                      cute.group_modes(gdQ, 0, 2))
                for w in range(self.dq_parts)]

    def dq_box(self):
        """One dQ reduce-add part (a warpgroup's with ``dq_per_wg``): (q rows, head dim)."""
        if const_expr(self.config.dq_split_rows):
            return (self.tile_m // self.dq_parts, self.head_dim)
        return (self.tile_m, self.head_dim // self.dq_parts)

    def dq_part_coord(self, w):
        """Tile coordinate of part ``w`` in (q block rows, head dim) units of :meth:`dq_box`."""
        return (w, 0) if const_expr(self.config.dq_split_rows) else (0, w)

    # ------------------------------------------------------------------ MMA warpgroups
    @cute.jit
    def mma(self, ops, work):
        """Warpgroups 1 and 2 (``ops``: :class:`MmaOperands`): for each q block, the five GEMMs and the pointwise
        steps; then the epilogue."""
        tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq = ops.tiled_mma_sdp, ops.tiled_mma_dkv, ops.tiled_mma_dq
        sQ, sdO, sK, sV, sdSt, sPt, sdQ = ops.sQ, ops.sdO, ops.sK, ops.sV, ops.sdSt, ops.sPt, ops.sdQ
        tidx = ops.tidx
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        wg_layout = cute.make_layout(MMA_WGS, stride=128)
        thr_mma_sdp = tiled_mma_sdp.get_slice(tidx)
        thr_mma_dq = tiled_mma_dq.get_slice(tidx)
        wg_mma_sdp = tiled_mma_sdp.get_slice(wg_layout(wg_idx))
        wg_mma_dkv = tiled_mma_dkv.get_slice(wg_layout(wg_idx))
        wg_mma_dq = tiled_mma_dq.get_slice(wg_layout(wg_idx))
        tSrK = wg_mma_sdp.make_fragment_A(wg_mma_sdp.partition_A(sK))
        tSrQ = wg_mma_sdp.make_fragment_B(wg_mma_sdp.partition_B(sQ))
        tdPrV = wg_mma_sdp.make_fragment_A(wg_mma_sdp.partition_A(sV))
        tdPrdO = wg_mma_sdp.make_fragment_B(wg_mma_sdp.partition_B(sdO))
        tdVrdOt = wg_mma_dkv.make_fragment_B(wg_mma_dkv.partition_B(sm90.transpose_view(sdO)))
        tdKrQt = wg_mma_dkv.make_fragment_B(wg_mma_dkv.partition_B(sm90.transpose_view(sQ)))
        tiled_mma_dk, tdKrdSt = tiled_mma_dkv, None
        if const_expr(self.config.dk_from_smem):
            tiled_mma_dk = sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN, Float32,
                atom_layout_mnk=(MMA_WGS, 1, 1), tiler_mn=(64, self.head_dim))
            wg_mma_dk = tiled_mma_dk.get_slice(wg_layout(wg_idx))
            tdKrdSt = wg_mma_dk.make_fragment_A(wg_mma_dk.partition_A(sdSt))  # (.., ds stage)
        if const_expr(self.config.dq_swap_ab):  # dQ^T = K^T dS^T
            tdQrKt = wg_mma_dq.make_fragment_A(wg_mma_dq.partition_A(sm90.transpose_view(sK)))
            tdQrdS = wg_mma_dq.make_fragment_B(wg_mma_dq.partition_B(sm90.transpose_view(sdSt)))  # (.., ds stage)
        else:
            tdQrdS = wg_mma_dq.make_fragment_A(wg_mma_dq.partition_A(sm90.transpose_view(sdSt)))  # (.., ds stage)
            tdQrKt = wg_mma_dq.make_fragment_B(wg_mma_dq.partition_B(sm90.transpose_view(sK)))
        acc_dK = cute.make_rmem_tensor(tiled_mma_dkv.partition_shape_C((self.tile_n, self.head_dim)), Float32)
        acc_dV = cute.make_rmem_tensor(tiled_mma_dkv.partition_shape_C((self.tile_n, self.head_dim)), Float32)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)
        # (key, q row) of this thread's S^T elements; its slice of the dQ tile in smem
        tScS_mn = sm90.acc_mn(thr_mma_sdp.partition_C(cute.make_identity_tensor((self.tile_n, self.tile_m))))
        tdQsdQ = thr_mma_dq.partition_C(sm90.transpose_view(sdQ) if const_expr(self.config.dq_swap_ab) else sdQ)
        smem_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4),
                                        self.dtype)
        ds_thr_copy = cute.make_tiled_copy_C(smem_atom, tiled_mma_sdp).get_slice(tidx)
        tdSsdS = ds_thr_copy.partition_D(sdSt)  # (.., ds stage)
        tdVrPt = tdPsPt = None
        if const_expr(self.config.split_head_dim):  # P^T and dS^T as the dV and dK GEMMs' A from smem
            tdVrPt = wg_mma_dkv.make_fragment_A(wg_mma_dkv.partition_A(sPt))  # (.., ds stage)
            tdKrdSt = wg_mma_dkv.make_fragment_A(wg_mma_dkv.partition_A(sdSt))  # (.., ds stage)
            tdPsPt = ds_thr_copy.partition_D(sPt)  # (.., ds stage)

        n_block, count, seg = work.n_block, work.count, work.seg
        if count > 0:
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            ops.pipeline_kv.consumer_wait(kv_state)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            # the keys (rows of S^T) of this thread: 0 inside the history, -inf outside (added to the
            # exponent, so P = 0 exactly there even where exp2 of the unmasked score would overflow)
            key_bias = cute.make_rmem_tensor(cute.size(tScS_mn, mode=[0]), Float32)
            for r in cutlass.range_constexpr(cute.size(tScS_mn, mode=[0])):
                key_bias[r] = 0.0 if seg.col_valid(n_block * self.tile_n + tScS_mn[r, 0][0]) else -Float32.inf
            qblock = QBlockOperands(tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dk, tiled_mma_dq, tSrK, tSrQ, tdPrV,
                                   tdPrdO, tdVrdOt, tdVrPt, tdKrdSt, tdKrQt, tdQrdS, tdQrKt, acc_dK, acc_dV, tScS_mn,
                                   tdQsdQ, ds_thr_copy, tdSsdS, tdPsPt, smem_atom, ops.sLSE, ops.sdPsum, ops.pipeline_q,
                                   ops.pipeline_do, ops.scale_log2, ops.softmax_scale, ops.cap)
            if const_expr(self.skip_key_bias):
                # every key of the block in the history: no bias to add (CTA-uniform)
                if seg.cols_in_history(n_block * self.tile_n, (n_block + 1) * self.tile_n):
                    q_state = self.q_blocks(q_state, count, wg_idx, qblock, None)
                else:
                    q_state = self.q_blocks(q_state, count, wg_idx, qblock, key_bias)
            else:
                q_state = self.q_blocks(q_state, count, wg_idx, qblock, key_bias)
        self.epilogue(ops, acc_dK, acc_dV, work)

    @cute.jit
    def q_blocks(self, q_state, count, wg_idx, qblock, key_bias):
        """The ``count`` q blocks of this KV block (:meth:`mma_one_m_block` each); ``key_bias`` None: every
        key of the block is in the history (``skip_key_bias``)."""
        for i in cutlass.range(count, unroll=1):
            ds_idx = i % self.config.ds_stages if const_expr(self.config.ds_stages > 1) else 0
            if const_expr(self.config.split_head_dim):
                q_state = self.mma_one_m_block_split(q_state, ds_idx, wg_idx, qblock, key_bias)
            else:
                q_state = self.mma_one_m_block(q_state, ds_idx, wg_idx, qblock, key_bias)
        return q_state

    @cute.jit
    def probs(self, acc_S_mn, rP_mn, tScS_mn, key_bias, sLSE, stage, scale_log2, softmax_scale, cap):
        """P^T (``rP``, input dtype) and P^T * cap' (in place of S^T) from the raw scores S^T, with the key
        mask's bias added to the exponent (``key_bias`` None: a block of history keys only, nothing to add)."""
        for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
            lse = sLSE[tScS_mn[0, c][1], stage]
            for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
                t, dcap = sm90.cap_and_slope(acc_S_mn[r, c], softmax_scale, cap, self.cap_method)
                x = t * scale_log2 - lse
                if const_expr(key_bias is not None):
                    x = x + key_bias[r]
                p = cute.math.exp2(x, fastmath=True)
                rP_mn[r, c] = p.to(self.dtype)
                acc_S_mn[r, c] = p * dcap

    @cute.jit
    def p_and_ds(self, q_state, qblock, key_bias):
        """This warpgroup's S^T = K Q^T and dP^T = V dO^T of one q block (once its Q and dO stages have landed),
        then ``(rP, rdS)`` in the input dtype: P^T = exp2(cap(S^T) * scale_log2 - LSE) on history keys (0
        elsewhere) and dS^T = P^T cap' (dP^T - dPsum)."""
        stage = q_state.index
        qblock.pipeline_q.consumer_wait(q_state)
        acc_S = cute.make_rmem_tensor(qblock.tiled_mma_sdp.partition_shape_C((self.tile_n, self.tile_m)), Float32)
        sm90.wgmma_gemm(qblock.tiled_mma_sdp, acc_S, qblock.tSrK, qblock.tSrQ[None, None, None, stage], zero_init=True)
        qblock.pipeline_do.consumer_wait(q_state)
        acc_dP = cute.make_rmem_tensor(qblock.tiled_mma_sdp.partition_shape_C((self.tile_n, self.tile_m)), Float32)
        sm90.wgmma_gemm(qblock.tiled_mma_sdp, acc_dP, qblock.tdPrV, qblock.tdPrdO[None, None, None, stage],
                        zero_init=True)
        warpgroup.wait_group(1)

        rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
        acc_S_mn = sm90.acc_mn(acc_S)  # <- P^T * qblock.cap'
        self.probs(acc_S_mn, sm90.acc_mn(rP), qblock.tScS_mn, key_bias, qblock.sLSE, stage, qblock.scale_log2,
                   qblock.softmax_scale, qblock.cap)
        warpgroup.wait_group(0)

        acc_dP_mn = sm90.acc_mn(acc_dP)
        for c in cutlass.range_constexpr(cute.size(acc_dP_mn, mode=[1])):
            dpsum = qblock.sdPsum[qblock.tScS_mn[0, c][1], stage]
            for r in cutlass.range_constexpr(cute.size(acc_dP_mn, mode=[0])):
                acc_dP_mn[r, c] = acc_S_mn[r, c] * (acc_dP_mn[r, c] - dpsum)
        rdS = cute.make_rmem_tensor_like(acc_dP, self.dtype)
        rdS.store(acc_dP.load().to(self.dtype))
        return rP, rdS

    @cute.jit
    def hand_off_dq(self, acc_dQ, tdQsdQ, wg_idx):
        """This warpgroup's dQ tile -> sdQ -> warp 1's TMA reduce-add, on its own pair of named barriers
        (``dq_per_wg``; else one pair for both): wait until the last reduce-add has read sdQ, write, fence, arrive."""
        nthreads = self.num_mma_threads // self.dq_parts + 32
        part = wg_idx if const_expr(self.config.dq_per_wg) else 0
        cute.arch.barrier(barrier_id=int(NamedBarrierBwd.dQEmpty) + part, number_of_threads=nthreads)
        cute.autovec_copy(acc_dQ, tdQsdQ)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(barrier_id=int(NamedBarrierBwd.dQFull) + part, number_of_threads=nthreads)

    @cute.jit
    def mma_one_m_block(self, q_state, ds_idx, wg_idx, qblock, key_bias):
        """One q block: S^T, dP^T, P^T, dS^T (registers and sdS^T buffer ``ds_idx``), dV, then dK and dQ
        (dK first, or with ``dq_first`` dQ first so its hand-off to the dQ warp overlaps the dK GEMM);
        ``key_bias`` None: no key mask to add (:meth:`q_blocks`)."""
        stage = q_state.index
        rP, rdS = self.p_and_ds(q_state, qblock, key_bias)

        # dV += P^T dO (P^T from registers)
        sm90.wgmma_gemm(qblock.tiled_mma_dkv, qblock.acc_dV, sm90.acc_as_operand_a(rP),
                        qblock.tdVrdOt[None, None, None, stage], zero_init=False)
        if const_expr(self.config.ds_stages == 1):
            # both warpgroups' dQ GEMMs of the last q block are done reading sdS: overwrite it.  (With
            # two buffers, this buffer's last reader was the dQ GEMM two q blocks back, which both
            # warpgroups finished before the last PdS barrier.)
            cute.arch.barrier(barrier_id=int(NamedBarrierBwd.PdS), number_of_threads=self.num_mma_threads)
        cute.copy(qblock.smem_atom, qblock.ds_thr_copy.retile(rdS), qblock.tdSsdS[None, None, None, ds_idx])
        if const_expr(not self.config.dq_first):
            # dK += dS^T Q (dS^T from registers)
            sm90.wgmma_gemm(qblock.tiled_mma_dkv, qblock.acc_dK, sm90.acc_as_operand_a(rdS),
                            qblock.tdKrQt[None, None, None, stage], zero_init=False)
        cute.arch.fence_view_async_shared()  # stmatrix writes -> WGMMA reads
        cute.arch.barrier(barrier_id=int(NamedBarrierBwd.PdS), number_of_threads=self.num_mma_threads)
        dq_shape = (self.head_dim, self.tile_m) if const_expr(self.config.dq_swap_ab) else (self.tile_m, self.head_dim)
        acc_dQ = cute.make_rmem_tensor(qblock.tiled_mma_dq.partition_shape_C(dq_shape), Float32)
        if const_expr(self.config.dq_first):
            warpgroup.wait_group(0)  # dV done: sdO and P^T's registers are free before dQ's accumulator lives
            qblock.pipeline_do.consumer_release(q_state)
            # dQ = dS K (this warpgroup's half of the head dim, or of the q rows), then dK += dS^T Q behind it
            self.dq_gemm(qblock.tiled_mma_dq, acc_dQ, qblock.tdQrdS, qblock.tdQrKt, ds_idx)
            tdKrA = qblock.tdKrdSt[None, None, None, ds_idx] if const_expr(self.config.dk_from_smem) \
                else sm90.acc_as_operand_a(rdS)
            sm90.wgmma_gemm(qblock.tiled_mma_dk, qblock.acc_dK, tdKrA, qblock.tdKrQt[None, None, None, stage],
                            zero_init=False)
            warpgroup.wait_group(1)
        else:
            # dQ = dS K (this warpgroup's half of the head dim, or of the q rows)
            self.dq_gemm(qblock.tiled_mma_dq, acc_dQ, qblock.tdQrdS, qblock.tdQrKt, ds_idx)
            warpgroup.wait_group(0)
            qblock.pipeline_do.consumer_release(q_state)
            qblock.pipeline_q.consumer_release(q_state)

        self.hand_off_dq(acc_dQ, qblock.tdQsdQ, wg_idx)
        if const_expr(self.config.dq_first):
            warpgroup.wait_group(0)  # dK done: sQ is free
            qblock.pipeline_q.consumer_release(q_state)
        q_state.advance()
        return q_state

    @cute.jit
    def mma_one_m_block_split(self, q_state, ds_idx, wg_idx, qblock, key_bias):
        """One q block of the head-dim split schedule (``split_head_dim``): S^T and dP^T over this warpgroup's
        q rows (every key), P^T and dS^T into smem buffer ``ds_idx`` (stmatrix), one barrier, then dK += dS^T Q,
        dV += P^T dO and dQ = dS K over this warpgroup's head-dim columns, all three with both operands in smem
        (each needs every q row of P^T / dS^T, i.e. the other warpgroup's too).  The buffers' previous readers
        (two q blocks back with ``ds_stages=2``) finished before either warpgroup passed the last barrier."""
        stage = q_state.index
        rP, rdS = self.p_and_ds(q_state, qblock, key_bias)

        if const_expr(self.config.ds_stages == 1):  # both warpgroups' GEMMs of the last q block are done
            cute.arch.barrier(barrier_id=int(NamedBarrierBwd.PdS), number_of_threads=self.num_mma_threads)
        cute.copy(qblock.smem_atom, qblock.ds_thr_copy.retile(rP), qblock.tdPsPt[None, None, None, ds_idx])
        cute.copy(qblock.smem_atom, qblock.ds_thr_copy.retile(rdS), qblock.tdSsdS[None, None, None, ds_idx])
        cute.arch.fence_view_async_shared()  # stmatrix writes -> WGMMA reads
        cute.arch.barrier(barrier_id=int(NamedBarrierBwd.PdS), number_of_threads=self.num_mma_threads)

        # dK, dV, then dQ: sQ and sdO are released (for the next q block's loads: one stage each) as soon as their
        # last GEMM is done, dQ's hand-off comes last.  Session 55, same run, default mode, us (B=4 4096+512 /
        # B=16 1024+256, H16 D=256; bench/results/logs/2026-12-04_s55_ranker_bwd_d256_gemm_order.log): dK dV dQ
        # 7231 / 2289, dV dK dQ 7232 / 2302, dK dQ dV 9874 / 2517, dV dQ dK 10887 / 3221, dQ first 10916-10922 /
        # 3251-3265
        sm90.wgmma_gemm(qblock.tiled_mma_dkv, qblock.acc_dK, qblock.tdKrdSt[None, None, None, ds_idx],
                        qblock.tdKrQt[None, None, None, stage], zero_init=False)
        sm90.wgmma_gemm(qblock.tiled_mma_dkv, qblock.acc_dV, qblock.tdVrPt[None, None, None, ds_idx],
                        qblock.tdVrdOt[None, None, None, stage], zero_init=False)
        acc_dQ = cute.make_rmem_tensor(qblock.tiled_mma_dq.partition_shape_C((self.tile_m, self.head_dim)), Float32)
        self.dq_gemm(qblock.tiled_mma_dq, acc_dQ, qblock.tdQrdS, qblock.tdQrKt, ds_idx)
        warpgroup.wait_group(2)  # dK done: sQ is free
        qblock.pipeline_q.consumer_release(q_state)
        warpgroup.wait_group(1)  # dV done: sdO is free
        qblock.pipeline_do.consumer_release(q_state)
        warpgroup.wait_group(0)
        self.hand_off_dq(acc_dQ, qblock.tdQsdQ, wg_idx)
        q_state.advance()
        return q_state

    def dq_gemm(self, tiled_mma_dq, acc_dQ, tdQrdS, tdQrKt, ds_idx):
        """dQ = dS K (this warpgroup's half of the head dim, or of the q rows with ``dq_split_rows``), or
        with ``dq_swap_ab`` dQ^T = K^T dS^T."""
        if const_expr(self.config.dq_swap_ab):
            sm90.wgmma_gemm(tiled_mma_dq, acc_dQ, tdQrKt, tdQrdS[None, None, None, ds_idx], zero_init=True)
        else:
            sm90.wgmma_gemm(tiled_mma_dq, acc_dQ, tdQrdS[None, None, None, ds_idx], tdQrKt, zero_init=True)

    # ------------------------------------------------------------------ epilogue (seed 004)
    @cute.jit
    def epilogue(self, ops, acc_dK, acc_dV, work):
        """dK, dV leave the registers through smem that reuses sK/sV once every MMA warpgroup is done
        with them (named barrier), then one warp's TMA store (fixed length) or predicated 16-byte stores
        (varlen).  A KV block no query reaches stores zeros.  GQA with a group per CTA: the same (the
        registers hold the sum over the group's query heads).  GQA with one query head per CTA: float32
        tiles TMA-reduce-added into the float32 accumulators (dV first, then dK, through the same smem);
        deterministic mode: the query heads of a group add in increasing order (a per-(KV block, KV
        head) semaphore).  ``ops``: :class:`MmaOperands`."""
        sK, sV, sdKVacc, tidx = ops.sK, ops.sV, ops.sdKVacc, ops.tidx
        n_block, head = work.n_block, work.head
        head_kv = head // self.qhead_per_kvhead
        acc_dK.store(acc_dK.load() * ops.softmax_scale)
        bar = int(NamedBarrierBwd.Epilogue)
        if const_expr(self.dkv_accumulated):
            if work.count > 0:  # blocks no query reaches add nothing
                thr_mma = ops.tiled_mma_dkv.get_slice(tidx)
                tAccsAcc = thr_mma.partition_C(sdKVacc)
                gdV = cute.local_tile(self._view(ops.tma_dV, work, head_kv), (self.tile_n, self.head_dim),
                                      (n_block, 0))
                gdK = cute.local_tile(self._view(ops.tma_dK, work, head_kv), (self.tile_n, self.head_dim),
                                      (n_block, 0))
                sem = ops.mdKVsem[work.batch, head_kv, None].iterator + n_block \
                    if const_expr(self.config.deterministic) else None
                for phase, (acc, atom, g) in enumerate(((acc_dV, ops.tma_atom_dV, gdV),
                                                        (acc_dK, ops.tma_atom_dK, gdK))):
                    cute.arch.barrier(barrier_id=bar, number_of_threads=self.num_mma_threads)
                    cute.autovec_copy(acc, tAccsAcc)
                    cute.arch.fence_view_async_shared()
                    cute.arch.barrier(barrier_id=bar, number_of_threads=self.num_mma_threads)
                    if tidx < 32:
                        if const_expr(self.config.deterministic and phase == 0):
                            if tidx == 0:
                                _wait_until(sem, head % self.qhead_per_kvhead)
                            cute.arch.sync_warp()
                        tXsX, tXgX = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                                           cute.group_modes(sdKVacc, 0, 2), cute.group_modes(g, 0, 2))
                        cute.copy(atom, tXsX, tXgX)
                        cute.arch.cp_async_bulk_commit_group()
                        if const_expr(self.config.deterministic and phase == 1):
                            cute.arch.cp_async_bulk_wait_group(0, read=False)
                            if tidx == 0:
                                cute.arch.atomic_add(sem, Int32(1), sem="release", scope="gpu")
                        else:
                            cute.arch.cp_async_bulk_wait_group(0, read=True)
        else:
            rdV = cute.make_rmem_tensor_like(acc_dV, self.dtype)
            rdV.store(acc_dV.load().to(self.dtype))
            rdK = cute.make_rmem_tensor_like(acc_dK, self.dtype)
            rdK.store(acc_dK.load().to(self.dtype))
            # every MMA warpgroup is done reading sK and sV (its GEMMs waited) before they are overwritten
            cute.arch.barrier(barrier_id=bar, number_of_threads=self.num_mma_threads)
            smem_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4),
                                            self.dtype)
            smem_thr_copy = cute.make_tiled_copy_C(smem_atom, ops.tiled_mma_dkv).get_slice(tidx)
            cute.copy(smem_atom, smem_thr_copy.retile(rdV), smem_thr_copy.partition_D(sV))
            cute.copy(smem_atom, smem_thr_copy.retile(rdK), smem_thr_copy.partition_D(sK))
            if const_expr(not self.varlen):
                cute.arch.fence_view_async_shared()  # stmatrix writes -> TMA reads
                cute.arch.barrier(barrier_id=bar, number_of_threads=self.num_mma_threads)
                if tidx < 32:
                    for atom, s, mX in ((ops.tma_atom_dV, sV, ops.tma_dV), (ops.tma_atom_dK, sK, ops.tma_dK)):
                        g = cute.local_tile(self._view(mX, work, head_kv), (self.tile_n, self.head_dim), (n_block, 0))
                        tXsX, tXgX = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                                           cute.group_modes(s, 0, 2), cute.group_modes(g, 0, 2))
                        cute.copy(atom, tXsX, tXgX)
                    cute.arch.cp_async_bulk_commit_group()
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
            else:
                cute.arch.barrier(barrier_id=bar, number_of_threads=self.num_mma_threads)
                tiles = tuple((s, cute.local_tile(self._view(mX, work, head_kv), (self.tile_n, self.head_dim),
                                                  (n_block, 0))) for s, mX in ((sV, ops.mdV), (sK, ops.mdK)))
                sm90.store_rows_predicated(tiles, self.num_mma_threads, tidx, n_block * self.tile_n, work.seg.seqlen)


# ====================================================================== torch side
def _compile(dtype: torch.dtype, config: RankerBwdConfig, qhead_per_kvhead: int, cap_method: str, varlen: bool):
    def build():
        kern = RankerAttentionBwd(cute_dtype(dtype), config, qhead_per_kvhead, cap_method, varlen)
        f = BwdFakes(config.head_dim, varlen)
        hq, hkv = f.hq, f.hkv
        accumulated = kern.dkv_accumulated
        acc_dtype = torch.float32 if accumulated else dtype
        q, k, v, do = f.inputs(hq, dtype), f.inputs(hkv, dtype), f.inputs(hkv, dtype), f.inputs(hq, dtype)
        rows, dq_acc, cu = f.rows, f.dq_accum(), f.cu
        dk, dv, bounds = f.outputs(hkv, acc_dtype), f.outputs(hkv, acc_dtype), f.bounds()
        dq_flag = dkv_sem = None
        if dq_flagged(config):  # int32 counters / flags (see _backward_impl)
            dq_flag = f.dq_flag()
        if config.deterministic:
            if accumulated:
                dkv_sem = fake_tensor(torch.int32, (cute.sym_int(), hkv, cute.sym_int()), align=4)
        return kern, (q, k, v, do, rows(), rows(), dq_acc, dk, dv, bounds, cu, dq_flag, dkv_sem, Float32(1.0),
                      Float32(1.0), Float32(1.0), Int32(1), Int32(1), fake_stream())

    return compile_cached(NAME, compile_key(dtype, config, qhead_per_kvhead, cap_method, varlen), build)


def compile_key(dtype: torch.dtype, config: RankerBwdConfig, qhead_per_kvhead: int, cap_method: str,
                varlen: bool) -> tuple:
    """The compile cache's key of a mainloop (:func:`_compile`'s arguments)."""
    return (str(dtype), config, qhead_per_kvhead, cap_method, varlen)


def compile_targets() -> list[CompileTarget]:
    """Shipped mainloop configs (:func:`config_for`): bf16 D=128 (MHA no cap / tanh / soft_sign, GQA 4 with a group
    per CTA (no cap, tanh) and with one query head per CTA; MHA no cap also over resolve_dq_zeroing's
    sequence limit), D=64 soft_sign and no cap (MHA; GQA 2 both ways, also deterministic), varlen, the
    deterministic mode (GQA varlen tanh, both GQA forms), D=256 (MHA both zeroings, GQA 2 both forms with a cap,
    varlen deterministic): every bench call's kernels; plus
    the pre/postprocess kernels each of them launches with (so that ``cute-kernels compile`` leaves
    nothing of those calls to compile)."""
    cases = [  # dtype, head dim, GQA ratio, cap, varlen, deterministic, gqa_group_per_cta[, long]
        (torch.bfloat16, 128, 1, "none", False, False, None),
        # long: sequences over resolve_dq_zeroing's limit (5.6K tokens on the H200; the 16K bench shape), where the
        # preprocess zeroes the dQ accumulator
        (torch.bfloat16, 128, 1, "none", False, False, None, True),
        (torch.bfloat16, 128, 1, "tanh", False, False, None),
        (torch.bfloat16, 128, 1, "soft_sign", False, False, None),  # (spills: pinned in the tests)
        (torch.bfloat16, 128, 4, "none", False, False, True),
        (torch.bfloat16, 128, 4, "none", False, False, False),
        (torch.bfloat16, 128, 4, "tanh", False, False, True),
        (torch.bfloat16, 64, 1, "soft_sign", False, False, None),
        (torch.bfloat16, 64, 1, "none", False, False, None),  # (the D=64 bench shape: 128-row q tiles)
        (torch.bfloat16, 64, 2, "none", False, False, True),
        (torch.bfloat16, 64, 2, "none", False, False, False),
        (torch.bfloat16, 64, 2, "none", False, True, True),
        (torch.bfloat16, 128, 1, "none", True, False, None),
        (torch.bfloat16, 128, 4, "tanh", True, True, True),
        (torch.bfloat16, 128, 4, "tanh", True, True, False),
        # D=256 (the head-dim split schedule): the d256 bench shapes (B=4 4096+512 over the zeroing's limit), GQA
        # both forms with a cap, varlen deterministic
        (torch.bfloat16, 256, 1, "none", False, False, None),
        (torch.bfloat16, 256, 1, "none", False, False, None, True),
        (torch.bfloat16, 256, 2, "tanh", False, False, True),
        (torch.bfloat16, 256, 2, "soft_sign", False, False, False),
        (torch.bfloat16, 256, 2, "tanh", True, True, False),
    ]
    # each mainloop, then the pre/postprocess kernels (their own compile-cache names) that a call with it
    # launches, each once
    from . import ranker_bwd_postprocess as post, ranker_bwd_preprocess as pre

    out, helpers = [], {}
    for dtype, d, g, capm, varlen, det, group, *long in cases:
        long = bool(long and long[0])
        cfg = dataclasses.replace(config_for(d, capm != "none"), deterministic=det, gqa_group_per_cta=group,
                                  dq_zero_in_mainloop=not (det or long))  # (as resolve_dq_zeroing leaves them)
        args = launch_args(dtype, cfg, g, capm, varlen)
        dt, tm, acc, flagged = str(dtype)[6:], cfg.tile_m, args["post"][6], args["post"][7]
        # (dq=flags: the preprocess zeroes per-tile flags and the mainloop zeroes dQ tiles; dq=zeroed: it zeroes
        # the whole dQ accumulator)
        dq = " dq=flags" if flagged else " dq=zeroed"
        label = (f"{dt} D={d} gqa={g}{'' if group is None else (' group' if group else ' per-head')}"
                 f" cap={capm}{' varlen' if varlen else ''}{' det' if det else ''}{' long' if long else ''}")
        out.append(CompileTarget(NAME, label, (str(dtype), *args["main"][1:]),
                                 build=lambda a=args["main"]: _compile(*a)))
        helpers.setdefault((pre.NAME, (str(dtype), *args["pre"][1:])), (
            f"preprocess {dt} D={d} tile_m={tm}{' varlen' if varlen else ''}{dq}",
            lambda a=args["pre"]: compile_preprocess(*a)))
        helpers.setdefault((post.NAME, (str(dtype), *args["post"][1:])), (
            f"postprocess {dt} D={d} tile_m={tm} gqa={g} cap={capm}{' varlen' if varlen else ''}"
            f"{' accumulated' if acc else ''}{dq}",
            lambda a=args["post"]: compile_postprocess(*a)))
        # the gradient of the LSE (a loss on the forward's lse; torch.compile hands the backward one even
        # when the loss ignores lse) changes only the preprocess
        pre_dlse = args["pre"][:-1] + (True,)
        helpers.setdefault((pre.NAME, (str(dtype), *pre_dlse[1:])), (
            f"preprocess {dt} D={d} tile_m={tm}{' varlen' if varlen else ''}{dq} with dLSE",
            lambda a=pre_dlse: compile_preprocess(*a)))
    for (name, key), (label, build) in helpers.items():
        out.append(CompileTarget(name, label, key, build=build))
    return out


_FNS: dict = {}  # compiled functions by key (skips the cache's key work on the hot path)


def launch_args(dtype: torch.dtype, cfg: RankerBwdConfig, qhead_per_kvhead: int, cap_method: str,
                varlen: bool) -> dict:
    """The compile arguments of the three kernels one backward call launches with a resolved mainloop
    ``cfg`` (:func:`resolve_gqa_group` applied): ``{"pre": .., "main": .., "post": ..}`` (what
    :func:`_backward_impl` and :func:`compile_targets` both use; the preprocess's without a dLSE, its last
    argument; ``post[6]``: dK/dV through float32 accumulators)."""
    accumulated = qhead_per_kvhead > 1 and cfg.gqa_group_per_cta is False  # dK/dV in float32 accumulators
    d, tm, flagged = cfg.head_dim, cfg.tile_m, dq_flagged(cfg)  # (flagged: the preprocess zeroes no dQ tile)
    return {"pre": (dtype, d, tm, varlen, flagged, False), "main": (dtype, cfg, qhead_per_kvhead, cap_method, varlen),
            "post": (dtype, d, tm, qhead_per_kvhead, cap_method, varlen, accumulated, flagged)}


def dq_flagged(cfg: RankerBwdConfig) -> bool:
    """Whether the mainloop keeps an int32 flag per (q block, query head) of the dQ accumulator (the
    deterministic mode's add counters, or ``dq_zero_in_mainloop``'s zeroed-tile flags): the preprocess then
    zeroes the flags, not the accumulator, and the postprocess reads zeros where a flag stayed 0."""
    return cfg.deterministic or cfg.dq_zero_in_mainloop


def resolve_dq_zeroing(config: RankerBwdConfig, max_seqlen: int, num_sms: int) -> RankerBwdConfig:
    """``config`` with ``dq_zero_in_mainloop=False`` in the deterministic mode (it does not use it) and where a
    sequence of ``max_seqlen`` tokens may have more history KV blocks than :data:`STAGGER_MAX_KV_BLOCKS` or a
    third of ``num_sms``: a KV block's dQ add waits (up to ``dq_zero_wait_cycles``) for the KV block of its
    sequence that zeroes the tile to start, so they should fit on the GPU at once (the rule of
    :func:`resolve_walk_stagger`; past it many adds would wait out the bound)."""
    if config.dq_zero_in_mainloop and (config.deterministic or not kv_blocks_resident(config, max_seqlen, num_sms)):
        return _with_field(config, "dq_zero_in_mainloop", False)
    return config


def resolve_walk_stagger(config: RankerBwdConfig, max_seqlen: int, num_sms: int) -> RankerBwdConfig:
    """``config`` with ``walk_stagger=0`` where a sequence of ``max_seqlen`` tokens may have more history KV
    blocks than :data:`STAGGER_MAX_KV_BLOCKS` or than a third of ``num_sms`` (44 on the H200; a MIG slice has
    16-60 SMs): the deterministic mode's staggered add order needs a sequence's KV blocks resident at once (see
    :data:`STAGGER_MAX_KV_BLOCKS`)."""
    if config.walk_stagger_steps() and not kv_blocks_resident(config, max_seqlen, num_sms):
        return _with_field(config, "walk_stagger", 0)
    return config


def kv_blocks_resident(config: RankerBwdConfig, max_seqlen: int, num_sms: int) -> bool:
    """Whether a sequence of ``max_seqlen`` tokens has at most :data:`STAGGER_MAX_KV_BLOCKS` KV blocks and at most
    a third of ``num_sms``, so that its KV blocks' CTAs can be expected on the GPU at once: the condition of the
    schedules in which one KV block waits for another of its sequence (:func:`resolve_walk_stagger`,
    :func:`resolve_dq_zeroing`)."""
    return -(-max_seqlen // config.tile_n) <= min(STAGGER_MAX_KV_BLOCKS, num_sms // 3)


def call_launch_args(dtype: torch.dtype, cfg: RankerBwdConfig, qhead_per_kvhead: int, num_batch: int,
                     num_kv_heads: int, max_seqlen: int, cap: Optional[float], cap_method: str, varlen: bool,
                     num_sms: int) -> dict:
    """:func:`launch_args` of one eager backward call (what :func:`_backward_impl` launches, and what
    the config probe precompiles): the GQA form resolved by :func:`resolve_gqa_group`, the walk's stagger by
    :func:`resolve_walk_stagger`, and the cap method ``"none"`` when ``cap`` is None."""
    cfg = resolve_gqa_group(cfg, qhead_per_kvhead, num_batch, num_kv_heads, max_seqlen, num_sms)
    cfg = resolve_walk_stagger(cfg, max_seqlen, num_sms)
    cfg = resolve_dq_zeroing(cfg, max_seqlen, num_sms)
    return launch_args(dtype, cfg, qhead_per_kvhead, "none" if cap is None else cap_method, varlen)


def _first_main(key: tuple, config: Optional[RankerBwdConfig]):
    """The mainloop of ``key`` (:func:`launch_args`' ``"main"``) built for this process's first call of it; a
    ``RuntimeWarning`` if it spills registers and the config is a caller's (``config=``, :func:`use_config`)
    other than :func:`config_for`'s (whose spills are measured and kept, tests' ``KNOWN_SPILL_BYTES``)."""
    fn = _fn("main", *key)
    dtype, cfg, g, cap_method, varlen = key
    chosen = config or _OVERRIDES.get(cfg.head_dim)
    shipped = config_for(cfg.head_dim, cap_method != "none")
    if chosen is not None and _with_field(chosen, "deterministic", shipped.deterministic) != shipped:
        warn_if_spills(NAME, compile_key(dtype, cfg, g, cap_method, varlen),
                       f"ranker_bwd config {cfg} ({dtype}, GQA {g}, cap {cap_method}{', varlen' if varlen else ''})")
    return fn


def _fn(kind: str, *key):
    fn = _FNS.get((kind, key))
    if fn is None:
        build = {"pre": compile_preprocess, "main": _compile, "post": compile_postprocess}[kind]
        fn = _FNS[(kind, key)] = build(*key)
    return fn


def accum_row_shape(seq: int, nb: int, hq: int, tile_m: int, varlen: bool) -> tuple:
    """The row shape of the float32 dQ accumulator (and of the per-row LSE / dPsum buffers): ``(B, Hq,
    rows)``, or ``(Hq, rows)`` packed, ``rows`` padded to whole q tiles per sequence (:func:`padded_rows`)."""
    rows = padded_rows(seq, nb, tile_m, varlen)
    return (hq, rows) if varlen else (nb, hq, rows)


def _check_config_type(config) -> None:
    """``TypeError`` unless ``config`` is None or a :class:`RankerBwdConfig`."""
    if config is not None and not isinstance(config, RankerBwdConfig):
        raise TypeError(f"config must be None or a RankerBwdConfig, got {type(config).__name__}")


def _validate_backward(q, k, v, out, lse, dout, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen,
                       cuda: bool = True, *, dq=None, dk=None, dv=None, config=None, deterministic: bool = False,
                       pointers: bool = True, dlse=None):
    """The forward's argument rules for q, k, v, bounds, scalars (:func:`.ranker_fwd._validate`), plus
    ``out``/``dout`` like ``q``, ``lse`` float32 ``[B, Hq, S]`` / ``[Hq, T]`` contiguous, ``dlse`` None or
    float32 shaped like ``lse`` on its device (any strides: the call makes it contiguous), the optional
    output buffers ``dq``/``dk``/``dv`` (like ``q``/``k``/``v``: same dtype and shape, contiguous, as
    the kernels are compiled for), ``config`` (None or a :class:`RankerBwdConfig`) and
    ``deterministic`` (a bool).  Returns the forward's ``(varlen, B, S_or_T, Hq, Hkv, D)``.
    ``pointers=False`` (fake tensors at trace time) skips the data-pointer alignment and the aliasing
    checks (the strides are checked)."""
    from .ranker_fwd import _validate

    # before the forward's list (int(): a symbolic head dim under torch.compile(dynamic=True) is not hashable)
    if isinstance(q, torch.Tensor) and q.dim() > 0 and int(q.shape[-1]) not in CONFIGS:
        raise ValueError(f"head dim {q.shape[-1]} is not supported by the backward; supported: {sorted(CONFIGS)}")
    res = _validate(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen, cuda=cuda,
                    pointers=pointers)
    varlen, nb, seq, hq, hkv, d = res
    if d not in CONFIGS:
        raise ValueError(f"head dim {d} is not supported by the backward; supported: {sorted(CONFIGS)}")
    # the launches' grids are (blocks, head, batch); symbolic sizes: only where the trace proves it
    if not or_false(q.numel() == 0) and (exceeds(nb, MAX_GRID_YZ) or exceeds(hq, MAX_GRID_YZ)):
        raise ValueError(f"the backward supports at most {MAX_GRID_YZ} sequences and {MAX_GRID_YZ} query heads "
                         f"(CUDA's grid y/z limit), got B={nb}, Hq={hq}; split the batch")
    check_bool("deterministic", deterministic)
    _check_config_type(config)
    for name, t, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if t is None:
            continue
        check_tensor(name, t, dtypes=(like.dtype,), shape=tuple(like.shape), cuda=cuda, data_pointer=pointers)
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the kernels write it row-major compact), "
                             f"got strides {t.stride()}")
        if cuda:
            check_same_device(q=q, **{name: t})
    for name, t in (("out", out), ("dout", dout)):
        check_tensor(name, t, dtypes=(q.dtype,), shape=tuple(q.shape), cuda=cuda, data_pointer=pointers)
    lse_shape = (hq, seq) if varlen else (nb, hq, seq)
    check_tensor("lse", lse, dtypes=(torch.float32,), shape=lse_shape, cuda=cuda, align_bytes=4,
                 data_pointer=pointers)
    if not lse.is_contiguous():
        raise ValueError("lse must be contiguous (as ranker_attention(..., return_lse=True) returns it)")
    if dlse is not None:  # any strides (a broadcast gradient of lse.sum() included): copied contiguous
        if not isinstance(dlse, torch.Tensor):
            raise TypeError(f"dlse must be None or a torch.Tensor, got {type(dlse).__name__}")
        if dlse.is_nested or dlse.layout != torch.strided:
            raise TypeError(f"dlse must be a dense (strided) tensor, got "
                            f"{'a nested tensor' if dlse.is_nested else dlse.layout}")
        if dlse.dtype != torch.float32:
            raise TypeError(f"dlse must be float32 (the gradient of the float32 lse), got {dlse.dtype}")
        if tuple(dlse.shape) != tuple(lse_shape):
            raise ValueError(f"dlse must be shaped like lse {list(lse_shape)}, got {list(dlse.shape)}")
        if pointers and dlse.numel() and not aligned_data(4, dlse):  # (read as float32; any strides)
            raise ValueError("dlse's data pointer is 0 or not 4-byte aligned; pass a float32 tensor of its own")
    check_same_device(q=q, out=out, lse=lse, dout=dout, dlse=dlse)  # also at trace time (fakes), as the forward does
    if pointers:
        check_outputs_disjoint(dict(dq=dq, dk=dk, dv=dv), dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout,
                                                                 dlse=dlse, bounds=bounds, cu_seqlens=cu_seqlens))
    return res


_VALIDATED: dict = {}  # argument signature (shapes, strides, dtypes, devices, scalars) -> _validate_backward's result


def _validate_backward_cached(q, k, v, out, lse, dout, bounds, softmax_scale, cap, cap_method, cu_seqlens,
                              max_seqlen, *, dq, dk, dv, config, deterministic, dlse):
    """:func:`_validate_backward` once per argument signature
    (:func:`~cute_kernels.runtime.validate.validated_once`): later calls only re-check the data pointers'
    alignment (16 bytes: q, k, v, out, dout; 4: lse, bounds, cu_seqlens, dlse); a call with ``dq``/``dk``/``dv``
    buffers is checked in full every time (whether they share memory with an input depends on the pointers).
    The values of ``cu_seqlens`` are checked on every call, never through this cache (:func:`_backward_impl`).
    The validation is most of the host work before the first launch, so all of it counts in an isolated call's
    time (one call on an idle GPU): on the 2-core CPU 71 us in full, 7 us from the cache (session 38)."""
    def aligned():
        return (dq is None and dk is None and dv is None and aligned_data(16, q, k, v, out, dout)
                and aligned_data(4, lse, bounds, cu_seqlens, dlse))

    return validated_once(
        _VALIDATED, (q, k, v, out, lse, dout, bounds, cu_seqlens, dlse),
        (softmax_scale, cap, cap_method, max_seqlen, config, deterministic),
        aligned,
        lambda: _validate_backward(q, k, v, out, lse, dout, bounds, softmax_scale, cap, cap_method, cu_seqlens,
                                   max_seqlen, dq=dq, dk=dk, dv=dv, config=config, deterministic=deterministic,
                                   dlse=dlse))


def ranker_attention_backward(q, k, v, out, lse, dout, bounds, softmax_scale=None, cap=None, cap_method="tanh",
                              cu_seqlens=None, max_seqlen=None, *, dlse=None, dq=None, dk=None, dv=None,
                              config: Optional[RankerBwdConfig] = None, deterministic: Optional[bool] = None):
    """Gradients of :func:`.ranker_fwd.ranker_attention` with respect to q, k, v (issue 4): FlashAttention's
    backward (Dao 2023, arXiv 2307.08691; the Hopper form of FlashAttention-3, Shah et al. 2024, arXiv
    2407.08608, whose dK/dV epilogue is the project's seed 004) with the ranker mask and the cap's
    derivative: ``dS = P * (dP - rowsum(dO * O)) * cap'(s)``, ``dQ = scale * dS K``, ``dK = scale * dS^T Q``,
    ``dV = P^T dO``; with the gradient of the LSE too (``dlse``: a loss that uses the forward's ``lse``,
    e.g. merging attention over key chunks, or a z-loss), ``dS = P * (dP - rowsum(dO * O) + dLSE) * cap'(s)``
    (``d LSE_i / d s_ij = P_ij``, so ``dLSE_i P_ij cap'`` is the LSE's share of ``dS_ij``; the preprocess
    folds it into dPsum, so the mainloop is the same kernel).

    GPU-tested on the H200 (``tests/gpu/test_ranker_bwd_gpu.py``: float64 reference gradients over
    head dims, GQA, caps, varlen, odd and empty segments; the deterministic mode bitwise).

    Args:
        q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen: exactly as given to
            the forward (same rules; head dims 64, 128 and 256).
        out: the forward's output (like ``q``).  lse: the forward's ``lse`` (``return_lse=True``),
            float32 ``[B, Hq, S]`` / ``[Hq, T]``, contiguous, 4-byte aligned, natural-log units, ``-inf`` on
            rows with no valid key.
        dout: gradient of ``out`` (like ``q``: same shape and dtype, last dim contiguous).  Like q, k, v (see
            the forward) finite in every row, padding included: a NaN or inf in a row of neither segment (of
            q, k, v or dout) reaches the admitted rows' dq, dk or dv through the GEMMs.
        dlse: None (no loss on ``lse``) or the gradient of ``lse``: float32 shaped like ``lse``, any strides
            (copied contiguous when not). Ignored on rows with no valid key (``lse = -inf``: nothing there
            depends on q, k, v), NaN or inf included.
        dq, dk, dv: optional output buffers (like q, k, v: same dtype, shape and device, contiguous,
            sharing no memory with each other or any input; tests pass NaN-poisoned ones).  Varlen
            calls zero them whole before the mainloop's launch.
        config: None or a :class:`RankerBwdConfig` (default: an active :func:`use_config`'s for D, else
            :func:`config_for` (D, cap is not None)).
        deterministic: a bool, or None (the default): torch's global flag,
            ``torch.are_deterministic_algorithms_enabled()`` (``torch.use_deterministic_algorithms(True)``).
    Returns:
        ``(dq, dk, dv)`` shaped and typed like ``q, k, v``.  Float32 accumulation throughout (dQ in a
        float32 accumulator, GQA dK/dV summed over the group's query heads in float32).  The default
        config is not bitwise deterministic (float32 reduce-adds in arrival order); pass
        ``deterministic=True``, or call with torch's deterministic flag on (or a config with
        ``deterministic=True``; ``deterministic=False`` does not turn off such a config) for ordered adds (same bits
        on every run; with the staggered q-block walks of session 43 (``RankerBwdConfig.walk_stagger``)
        0-9% slower than the default at the bench shapes where they apply, 11% at GQA 16/4 and 9% at
        B=1 16K, where they do not; bench/results/logs/2026-12-03_s43_ranker_bwd_walk_stagger_probe2.log).
    Raises:
        TypeError / ValueError: as the forward, plus wrong ``out``/``dout``/``lse``/``dlse``/``dq``/``dk``/``dv``
        shapes, dtypes or layouts, ``dq``/``dk``/``dv`` sharing memory with each other or an input,
        a wrong ``config``/``deterministic`` type, a ``config`` whose ``head_dim`` is not the inputs', a
        ``dq``/``dk``/``dv`` buffer or ``config`` on fake/meta tensors (eager-only, below), bad ``cu_seqlens``
        values, unsupported head dims, B or Hq above 65535 (the grids' y/z limit): all before any buffer is
        written or kernel launched.  No size limit otherwise: the kernels compute 64-bit offsets (GPU-tested
        past 2^31 elements of q and of the float32 dQ accumulator).
        RuntimeError: a ``dq``/``dk``/``dv`` buffer that is an inference tensor while inference mode is off
            (torch's in-place rule); a tensor on a GPU that is not a Hopper (sm_90) GPU, or a process whose
            CuTe DSL targets another arch.
    Launches: preprocess (dPsum, LSE2, the zeroed dQ accumulator or its tiles' zeroed flags), the mainloop
    (which zeroes the tiles itself then, ``RankerBwdConfig.dq_zero_in_mainloop``), postprocess (dQ,
    GQA dK/dV from float32 accumulators when the mainloop ran one query head per CTA, candidate self
    terms); see the module docstring (GQA: :func:`resolve_gqa_group` picks a group per CTA or one
    query head per CTA).  While torch.compile / make_fx trace, and on meta tensors (output shapes only),
    the call goes through the registered op ``torch.ops.cute_kernels.ranker_attention_bwd`` (its fake
    checks the pointer-free rules); ``dq``/``dk``/``dv`` and ``config`` are eager-only: on fake/meta
    tensors (make_fx, FakeTensorMode) they are a ValueError; under torch.compile with
    ``fullgraph=True`` the same ValueError stops the compile (Dynamo reports it as ``Unsupported:
    Observed exception``, the message in its debug context), without fullgraph Dynamo breaks the graph
    there and the call runs eagerly; under another dispatch mode with real tensors, e.g.
    FlopCounterMode, such a call runs the eager implementation.
    """
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    deterministic = check_bool("deterministic", deterministic)  # (a numpy bool as a bool, for the op's schema)
    cap_method = "none" if cap_method is None else cap_method  # (no cap, as ranker_attention takes it)
    refuse_func_transforms("ranker_attention_backward", q, k, v, out, lse, dout, dlse)
    _check_config_type(config)  # (before the eager-only rule below, which would name the wrong problem)
    eager_only = dq is not None or dk is not None or dv is not None or config is not None
    if (tracing() or without_data(q)) and not eager_only:  # traced or meta tensors: the registered op (its fake)
        return ranker_attention_backward_op(q, k, v, out, lse, dout, bounds, softmax_scale, cap, cap_method,
                                            cu_seqlens, max_seqlen, deterministic, dlse)
    if eager_only and (torch.compiler.is_compiling() or without_data(q)):
        raise ValueError("ranker_attention_backward: dq/dk/dv buffers and config are eager-only and need real "
                         "CUDA tensors; while torch.compile / make_fx / FakeTensorMode trace, call it without them")
    refuse_inference_tensors("ranker_attention_backward (its dq/dk/dv buffers)",
                             *(t for t in (dq, dk, dv) if isinstance(t, torch.Tensor)))
    return _backward_impl(q, k, v, out, lse, dout, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen,
                          dq=dq, dk=dk, dv=dv, config=config, deterministic=deterministic, dlse=dlse)


def _grad_buffer(buf: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """The caller's gradient buffer (validated), else a new contiguous one shaped and typed like ``like``."""
    return buf if buf is not None else torch.empty_like(like, memory_format=torch.contiguous_format)


def _backward_impl(q, k, v, out, lse, dout, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen, *,
                   dq=None, dk=None, dv=None, config=None, deterministic=False, dlse=None):
    """The eager backward: every check, then the three launches."""
    from .ranker_fwd import _varlen_extent

    # every check (arguments, output buffers, cu_seqlens values) before any buffer is written or launch
    varlen, nb, seq, hq, hkv, d = _validate_backward_cached(q, k, v, out, lse, dout, bounds, softmax_scale, cap,
                                                            cap_method, cu_seqlens, max_seqlen, dq=dq, dk=dk, dv=dv,
                                                            config=config, deterministic=deterministic, dlse=dlse)
    cfg = resolve_config(config, d, cap is not None)
    if deterministic and not cfg.deterministic:
        cfg = _with_field(cfg, "deterministic", True)
    if cfg.head_dim != d:
        raise ValueError(f"config.head_dim={cfg.head_dim} does not match the inputs' head dim {d}")
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(d)
    scale_log2 = exp2_scale(scale, cap)
    capf = float(cap) if cap is not None else 1.0
    if varlen:
        max_seqlen, _ = _varlen_extent(q, cu_seqlens, seq, max_seqlen)
    else:
        max_seqlen = seq
    row_shape = accum_row_shape(seq, nb, hq, cfg.tile_m, varlen)
    if q.numel() == 0 or max_seqlen == 0:
        return tuple(_grad_buffer(g, t).zero_() for g, t in ((dq, q), (dk, k), (dv, v)))
    # Only the preprocess's buffers come before its launch: on an idle GPU (one isolated call) every microsecond
    # of host work before the first launch is added to the call's time, while the host work after it overlaps
    # the preprocess.  (empty_like / new_empty: 2.6 and 1.5 us less host time per buffer than
    # torch.empty(..., device=) on the H200's host, session 33, bench/host_breakdown.py)
    lse2 = q.new_empty(row_shape, dtype=torch.float32)
    dpsum = q.new_empty(row_shape, dtype=torch.float32)
    dq_accum = q.new_empty(row_shape + (d,), dtype=torch.float32)
    keys = call_launch_args(q.dtype, cfg, hq // hkv, nb, hkv, max_seqlen, cap, cap_method, varlen,
                            sm_count(q.device))
    accumulated = keys["post"][6]  # dK/dV through float32 accumulators
    cfg = keys["main"][1]  # (resolved)
    # dQ adds counted in order (deterministic) or dQ tiles zeroed by the mainloop, per (q block, head): 0 means
    # the tile is not written; the preprocess zeroes them
    dq_flag = q.new_empty((1 if varlen else nb, hq, row_shape[-1] // cfg.tile_m), dtype=torch.int32) \
        if dq_flagged(cfg) else None
    if dlse is None:
        _fn("pre", *keys["pre"])(out, dout, lse, None, lse2, dpsum, dq_accum, dq_flag, cu_seqlens, nb, max_seqlen)
    else:
        _fn("pre", *keys["pre"][:-1], True)(out, dout, lse, dlse.contiguous(), lse2, dpsum, dq_accum, dq_flag,
                                            cu_seqlens, nb, max_seqlen)
    dq, dk, dv = _grad_buffer(dq, q), _grad_buffer(dk, k), _grad_buffer(dv, v)
    if varlen:  # packed tokens past cu_seqlens[-1] belong to no sequence: zero gradients
        for t in (dq, dk, dv):
            t.zero_()
    dk_accum = dv_accum = dkv_sem = None
    if accumulated:
        dk_accum = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv_accum = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    if cfg.deterministic:
        if accumulated:  # adds done per (KV block, KV head), counted in order
            dkv_sem = torch.zeros((nb, hkv, -(-max_seqlen // cfg.tile_n)), dtype=torch.int32, device=q.device)
    main = _FNS.get(("main", keys["main"])) or _first_main(keys["main"], config)
    main(
        q, k, v, dout, lse2, dpsum, dq_accum, dk_accum if accumulated else dk, dv_accum if accumulated else dv,
        bounds, cu_seqlens, dq_flag, dkv_sem, scale_log2, scale, capf, nb, max_seqlen)
    _fn("post", *keys["post"])(
        q, k, v, dout, lse2, dpsum, dq_accum, dq_flag, dq, dk, dv, dk_accum, dv_accum, bounds, cu_seqlens,
        scale_log2, scale, capf, nb, max_seqlen)
    return dq, dk, dv


def grad_tolerance(ref: torch.Tensor, low: torch.Tensor, ref_given_out: torch.Tensor | None = None) -> float:
    """The error bar of a gradient against its float64 reference ``ref`` (FlashAttention's convention):
    twice the error of the same math in the inputs' dtype (``low``, from
    :func:`ranker_attention_backward_reference` with ``compute_dtype=q.dtype``), at least 1% of the
    largest reference value, plus 1e-3.  Used by :func:`check` and the GPU tests.

    ``ref_given_out`` (optional): the same float64 gradient with ``dPsum`` taken from the forward
    kernel's ``out`` (:func:`ranker_attention_backward_explicit` with ``out=``); the largest difference
    from ``ref`` is added, the part of the error the backward inherits from the forward's rounding of
    ``O``.  It matters where the bf16 reference is exact, e.g. a row with one valid key: there
    ``dQ = dK = 0`` and ``low`` has no error, while the forward's fixed row max (see
    :func:`.ranker_fwd.ranker_attention`) may leave ``O`` one bf16 ulp off ``v``."""
    if ref.numel() == 0:
        return 1e-3
    tol = max(2 * (low.double() - ref.double()).abs().max().item(), 1e-2 * ref.abs().max().item()) + 1e-3
    if ref_given_out is not None:
        tol += (ref_given_out.double() - ref.double()).abs().max().item()
    return tol


def check() -> list[CheckResult]:
    """GPU: the backward vs the float64 reference gradients.  Tolerance, FlashAttention's convention:
    twice the error of the same math in torch bf16 (``compute_dtype=bfloat16``), at least 1% of the
    largest reference gradient, plus 1e-3 (the GPU tests use the same bar)."""
    rows = []
    torch.manual_seed(0)
    from .ranker_fwd import ranker_attention

    for d, hq, hkv, cap in ((128, 4, 4, None), (128, 4, 2, 30.0), (64, 2, 2, None), (256, 4, 2, None)):
        b, s = 2, 400
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv, hq))
        bounds = torch.tensor([[0, 300, 300, 400], [37, 200, 250, 371]], device="cuda", dtype=torch.int32)
        o, lse = ranker_attention(q, k, v, bounds, cap=cap, return_lse=True)
        got = ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap)
        ref = ranker_attention_backward_reference(q, k, v, bounds, do, cap=cap)
        low = ranker_attention_backward_reference(q, k, v, bounds, do, cap=cap, compute_dtype=q.dtype)
        for name, a, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
            err = (a.double() - r).abs().max().item()
            tol = grad_tolerance(r, lo)
            rows.append(CheckResult(NAME, f"{name} D={d} H={hq}/{hkv} cap={cap}", err <= tol, err, 0.0, tol))
    return rows


def bench_shapes(shapes: str | None) -> set[str]:
    """:func:`bench`'s ``shapes`` spec as a set of words (``all`` or ``headline``, ``mid``, ``short``, ``d256``,
    ``peers``, ``deterministic``, ``variants``; default ``all+peers``); ``ValueError`` for anything else."""
    from ..registry import word_spec

    return word_spec(NAME, shapes, ("all", "headline", "mid", "short", "d256", "peers", "deterministic", "variants"),
                     "all+peers")


def bench(shapes: str | None = None, peer_budget_s: float = 400.0, rounds: int = 2, echo: bool = False) -> list[dict]:
    """Backward time (the three launches; CUDA-graph timing, eager when a peer cannot be captured) and
    useful TFLOP/s = 2.5 x the forward's useful FLOPs (FlashAttention's convention)
    = ``10 * D * admitted (query, key) pairs / time``, ours and the peers of ``bench/ranker_bwd_peers.py``
    interleaved over ``rounds`` on :data:`.ranker_bench.BENCH_CASES` (:func:`.ranker_bench.run`).  ``shapes``:
    None = all cases with peers; containing ``headline`` = the first two cases, ``mid`` the three between,
    ``short`` the last two (any union of the three), ``d256`` :data:`.ranker_bench.D256_CASES` (alone: only
    them); ``peers`` adds the peers; ``deterministic`` adds our deterministic mode; ``variants`` adds the other
    tile shapes and stage counts that validate.  Peers are skipped once ``peer_budget_s`` seconds have gone by
    (their compiles are slow; a record per skipped peer says so).  Ours and FlashAttention-4 with the mask_mod are
    also timed "eager" and "isolated" (:func:`.ranker_bench.host_mode_records`)."""
    from . import ranker_bench
    from .ranker_fwd import ranker_attention

    spec = bench_shapes(shapes)
    cases = (ranker_bench.bench_cases(spec, ranker_bench.BENCH_CASES)
             if spec & {"all", "headline", "mid", "short"} or "d256" not in spec else [])
    cases += ranker_bench.D256_CASES if "d256" in spec else []

    def setup(case, gen):
        nb, hist, cand, hq, hkv, d, cap = case
        s = hist + cand
        q, do = (torch.randn(nb, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
        k, v = (torch.randn(nb, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
        bounds = torch.tensor([[0, hist, hist, s]] * nb, device="cuda", dtype=torch.int32)
        o, lse = ranker_attention(q, k, v, bounds, cap=cap, return_lse=True)
        flops = ranker_flops.useful_flops(q, bounds, gemms=ranker_flops.BWD_GEMMS)  # (as FlopCounterMode counts)
        shape = dict(B=nb, hist=hist, cand=cand, Hq=hq, Hkv=hkv, D=d, cap=cap, dtype="bfloat16")
        impls = [("cute_kernels", lambda: ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap))]
        if "deterministic" in spec:
            impls.append(("cute_kernels_deterministic", lambda: ranker_attention_backward(
                q, k, v, o, lse, do, bounds, cap=cap, deterministic=True)))
        if "variants" in spec:  # other tile shapes / stage counts that validate
            shipped = config_for(d, cap is not None)
            for tag, kw in (("stages3", dict(stages=3)), ("tile_m64", dict(tile_m=64)), ("tile_m128", dict(tile_m=128)),
                            ("tile_m128_stages1", dict(tile_m=128, stages=1))):
                try:
                    tile = tile_m_fields(shipped, kw.get("tile_m", shipped.tile_m))
                    cfg = dataclasses.replace(shipped, **{**tile, **kw})
                except ValueError:
                    continue
                if cfg != shipped:
                    impls.append((f"cute_kernels_{tag}", lambda cfg=cfg: ranker_attention_backward(
                        q, k, v, o, lse, do, bounds, cap=cap, config=cfg)))
        return ranker_bench.Case(shape, flops, impls, (q, k, v, bounds, do, cap))

    peers = ranker_bench.load_peers("ranker_bwd_peers") if "peers" in spec else None
    return ranker_bench.run(NAME, cases, setup, peers, peer_budget_s, rounds, echo)


# ====================================================================== references (float64)
def _check_grad_args(q, k, v, bounds, dout, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen,
                     compute_dtype=torch.float64, dlse=None):
    if not isinstance(compute_dtype, torch.dtype) or not compute_dtype.is_floating_point:
        raise TypeError(f"compute_dtype must be a float torch.dtype, got {compute_dtype!r}")
    _check_reference_args(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen)
    if isinstance(dout, torch.Tensor) and dout.dtype != q.dtype:
        raise TypeError(f"dout must have q's dtype {q.dtype}, got {dout.dtype}")
    if isinstance(dout, torch.Tensor) and dout.device != q.device:
        raise ValueError(f"dout must be on q's device {q.device}, got {dout.device}")
    if not isinstance(dout, torch.Tensor):
        raise TypeError(f"dout must be a torch.Tensor shaped like q, got {type(dout).__name__}")
    if dout.shape != q.shape:
        raise ValueError(f"dout must be a tensor shaped like q {list(q.shape)}, got {list(dout.shape)}")
    if dlse is not None:
        lse_shape = (q.shape[1], q.shape[0]) if cu_seqlens is not None else (q.shape[0], q.shape[2], q.shape[1])
        if not isinstance(dlse, torch.Tensor) or not dlse.is_floating_point():
            raise TypeError("dlse must be None or a float tensor shaped like lse, got "
                            + (str(dlse.dtype) if isinstance(dlse, torch.Tensor) else type(dlse).__name__))
        if tuple(dlse.shape) != lse_shape or dlse.device != q.device:
            raise ValueError(f"dlse must be shaped like lse {list(lse_shape)} on q's device, got "
                             f"{list(dlse.shape)} on {dlse.device}")


def _sequences(q, cu_seqlens):
    """``(slice, batch row)`` of each sequence: packed (varlen) or ``[B, S, ...]``."""
    if cu_seqlens is None:
        return [(b, b) for b in range(q.shape[0])]
    cu = [int(x) for x in cu_seqlens.tolist()]
    return [(slice(cu[b], cu[b + 1]), b) for b in range(len(cu) - 1)]


@without_autocast
def ranker_attention_backward_reference(q, k, v, bounds, dout, softmax_scale=None, cap=None, cap_method="tanh",
                                        cu_seqlens=None, max_seqlen=None, compute_dtype=torch.float64, dlse=None):
    """Gradients ``(dq, dk, dv)`` of :func:`ranker_attention` by torch autograd through the dense
    reference :func:`.ranker_fwd.ranker_attention_reference` (``compute_dtype`` math, float64 default).

    ``q, k, v, bounds, cu_seqlens`` as in :func:`ranker_attention`; ``dout`` the gradient of the output, shaped
    like ``q``, with its dtype (``TypeError`` otherwise) and device (``ValueError`` otherwise); ``dlse`` None
    or the gradient of the forward's ``lse`` (a float tensor on q's device, shaped like it:
    ``[B, Hq, S]`` / ``[Hq, T]``; autograd through the reference's LSE too).  Rows with no valid key have
    zero output and get zero gradients (the reference's masked softmax and LSE keep them finite: no NaN;
    their dlse is ignored).  Returns tensors in ``compute_dtype``
    shaped like q, k, v (GQA: dk, dv summed over the query heads of a group).  Packed tokens past
    ``cu_seqlens[-1]`` belong to no sequence: zero gradients.  Runs autograd also under ``torch.no_grad`` and
    ``torch.inference_mode``.  Meant for tests at modest sizes.
    Raises ``TypeError``/``ValueError`` like the forward reference.
    """
    cap_method = "none" if cap_method is None else cap_method  # (no cap, as ranker_attention takes it)
    _check_grad_args(q, k, v, bounds, dout, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen, compute_dtype,
                     dlse)
    # the forward reference returns cu_seqlens[-1] packed rows: differentiate through those only
    end = q.shape[0] if cu_seqlens is None else int(cu_seqlens[-1])
    # autograd also inside torch.inference_mode: its tensors (inference tensors) are copied into normal ones
    with torch.inference_mode(False), torch.enable_grad():
        q, k, v, bounds, dout, cu_seqlens, dlse = (
            t.clone() if isinstance(t, torch.Tensor) and t.is_inference() else t
            for t in (q, k, v, bounds, dout, cu_seqlens, dlse))
        qd, kd, vd = (t[:end].detach().to(compute_dtype).requires_grad_(True) for t in (q, k, v))
        out, lse = ranker_attention_reference(qd, kd, vd, bounds, softmax_scale, cap, cap_method, return_lse=True,
                                              cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                                              compute_dtype=compute_dtype, lse_dtype=compute_dtype)
        outputs, grads = [out], [dout[:end].to(compute_dtype)]
        if dlse is not None:  # (the finite rows differentiate; -inf rows have no graph)
            outputs.append(lse)
            dl = dlse[:, :end] if cu_seqlens is not None else dlse
            grads.append(torch.where(torch.isfinite(lse), dl.to(lse.dtype), 0))
        dq, dk, dv = torch.autograd.grad(outputs, (qd, kd, vd), grads, allow_unused=True)

    def full(g, t):  # None: empty problems; trailing packed rows: zeros
        res = torch.zeros(t.shape, dtype=compute_dtype, device=t.device)
        if g is not None:
            res[:end] = g.detach()
        return res

    return full(dq, q), full(dk, k), full(dv, v)


@without_autocast
def ranker_attention_backward_explicit(q, k, v, bounds, dout, softmax_scale=None, cap=None, cap_method="tanh",
                                       cu_seqlens=None, max_seqlen=None, compute_dtype=torch.float64, dlse=None,
                                       out=None):
    """The same gradients by the explicit formulas the kernels implement (FlashAttention-2/3's backward):

    ``P = exp(s - LSE)`` on admitted pairs, ``dV = P^T dO``, ``dP = dO V^T``, ``dPsum = rowsum(dO * O)``
    (less ``dlse``, the gradient of the LSE when given, on rows with a valid key),
    ``dS = P * (dP - dPsum) * cap'(s_raw)`` with ``s_raw = scale * q.k``, ``cap'`` = ``1 - tanh^2(s_raw/cap)``
    (tanh) or ``1 / (1 + |s_raw|/cap)^2`` (soft_sign), ``dQ = scale * dS K``, ``dK = scale * dS^T Q``;
    GQA sums dK, dV over the query heads of a group.  Returns ``(dq, dk, dv, lse, dpsum)`` in
    ``compute_dtype``; ``lse``/``dpsum`` are ``[B, Hq, S]`` (``[Hq, T]`` packed), ``lse = -inf`` and
    ``dpsum = 0`` on rows with no valid key.  ``cap_method=None`` is ``"none"`` (no cap), as in
    :func:`ranker_attention_backward`.

    ``out`` None (``O`` is computed here, exactly) or a forward output shaped like ``q`` (e.g. the
    kernel's bf16 ``out``): ``dPsum`` is then taken from it, as the backward kernel takes it from the
    ``out`` it is given.  The difference between the two answers is what the forward's rounding of
    ``O`` alone does to the gradients; the GPU tests add it to their error bar (a row with one valid
    key has ``dQ = dK = 0`` exactly, yet an ``O`` one bf16 ulp off gives them ``|dO| * ulp``-sized
    values).  Raises ``ValueError`` if ``out`` is not shaped like ``q`` or is on another device."""
    cap_method = "none" if cap_method is None else cap_method
    _check_grad_args(q, k, v, bounds, dout, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen, compute_dtype,
                     dlse)
    if out is not None and (tuple(out.shape) != tuple(q.shape) or out.device != q.device):
        raise ValueError(f"out must be shaped like q {tuple(q.shape)} on {q.device}; got {tuple(out.shape)} on "
                         f"{out.device}")
    d = q.shape[-1]
    hq, hkv = q.shape[-2], k.shape[-2]
    g = hq // hkv
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(d)  # (any real: Fraction, ...)
    cap = float(cap) if cap is not None else None
    dq = torch.zeros(q.shape, dtype=compute_dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=compute_dtype, device=q.device)
    dv = torch.zeros(v.shape, dtype=compute_dtype, device=q.device)
    lse_shape = (hq, q.shape[0]) if cu_seqlens is not None else (q.shape[0], hq, q.shape[1])
    lse_all = torch.full(lse_shape, -math.inf, dtype=compute_dtype, device=q.device)
    dpsum_all = torch.zeros(lse_shape, dtype=compute_dtype, device=q.device)
    for sl, b in _sequences(q, cu_seqlens):
        qf = q[sl].to(compute_dtype).transpose(0, 1)  # H, S, D
        kf = k[sl].to(compute_dtype).transpose(0, 1).repeat_interleave(g, dim=0)
        vf = v[sl].to(compute_dtype).transpose(0, 1).repeat_interleave(g, dim=0)
        dof = dout[sl].to(compute_dtype).transpose(0, 1)
        s = qf.shape[1]
        if s == 0:
            continue
        mask = dense_mask(bounds[b].cpu(), s).to(q.device)[None]
        s_raw = scale * (qf @ kf.transpose(-1, -2))
        if cap is None:
            s_cap, dcap = s_raw, torch.ones_like(s_raw)
        elif cap_method == "tanh":
            t = torch.tanh(s_raw / cap)
            s_cap, dcap = cap * t, 1 - t * t
        else:
            s_cap, dcap = s_raw / (1 + s_raw.abs() / cap), 1 / (1 + s_raw.abs() / cap) ** 2
        s_m = s_cap.masked_fill(~mask, -math.inf)
        lse = torch.logsumexp(s_m, dim=-1)
        p = torch.where(mask, torch.exp(s_m - torch.where(torch.isfinite(lse), lse, 0)[..., None]), 0)
        o = p @ vf if out is None else out[sl].to(compute_dtype).transpose(0, 1)
        dpsum = (dof * o).sum(-1)
        if dlse is not None:
            dl = (dlse[:, sl] if cu_seqlens is not None else dlse[b]).to(compute_dtype)
            dpsum = dpsum - torch.where(torch.isfinite(lse), dl, 0)
        dp = dof @ vf.transpose(-1, -2)
        ds = p * (dp - dpsum[..., None]) * dcap
        dqh = scale * ds @ kf
        dkh = scale * ds.transpose(-1, -2) @ qf
        dvh = p.transpose(-1, -2) @ dof
        dq[sl] = dqh.transpose(0, 1)
        dk[sl] = dkh.view(hkv, g, s, d).sum(1).transpose(0, 1)
        dv[sl] = dvh.view(hkv, g, s, d).sum(1).transpose(0, 1)
        if cu_seqlens is not None:
            lse_all[:, sl], dpsum_all[:, sl] = lse, dpsum
        else:
            lse_all[b], dpsum_all[b] = lse, dpsum
    return dq, dk, dv, lse_all, dpsum_all


# ====================================================================== torch op (for torch.compile)
def _fake_bwd(q, k, v, out, lse, dout, bounds, softmax_scale=None, cap=None, cap_method="tanh", cu_seqlens=None,
              max_seqlen=None, deterministic=False, dlse=None):
    # at trace time: every rule a fake tensor allows (shapes, dtypes, strides, devices; no data pointers)
    _validate_backward(q, k, v, out, lse, dout, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen,
                       cuda=False, deterministic=deterministic, pointers=False, dlse=dlse)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)  # compact, like the real ones


def _precheck_bwd(q, k, v, out, lse, dout, bounds, softmax_scale=None, cap=None, cap_method="tanh",
                  cu_seqlens=None, max_seqlen=None, deterministic=False, dlse=None):
    from .ranker_fwd import _check_max_seqlen, _check_scalars

    _check_scalars(softmax_scale, cap, cap_method)
    if max_seqlen is not None:  # the schema would turn True into 1
        _check_max_seqlen(max_seqlen)
    check_bool("deterministic", deterministic)


@custom_op("ranker_attention_bwd", mutates_args=(), fake=_fake_bwd, precheck=_precheck_bwd)
def ranker_attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                                 lse: torch.Tensor, dout: torch.Tensor, bounds: torch.Tensor,
                                 softmax_scale: Optional[float] = None, cap: Optional[float] = None,
                                 cap_method: str = "tanh", cu_seqlens: Optional[torch.Tensor] = None,
                                 max_seqlen: Optional[int] = None, deterministic: bool = False,
                                 dlse: Optional[torch.Tensor] = None
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`ranker_attention_backward` (without output buffers and config) as
    ``torch.ops.cute_kernels.ranker_attention_bwd`` (eager fast path)."""
    return _backward_impl(q, k, v, out, lse, dout, bounds, softmax_scale, cap, cap_method, cu_seqlens,
                          max_seqlen, deterministic=deterministic, dlse=dlse)


ranker_flops.register("ranker_attention_bwd")  # FlopCounterMode counts its useful FLOPs
