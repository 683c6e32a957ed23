"""Config rules pinned one by one (CPU): session 64's mutation-testing pass over the configs' ``validate()`` and
the shared-memory / register arithmetic behind them (a helper: one rule changed at a time, against the CPU tests
that could see it) found these rules unpinned; each test fails with its rule changed that way and passes with the
rule as written.  What each rule guards is in the test's comment."""
import copy
import dataclasses

import pytest
import torch

from cute_kernels.kernels import hc_mix_walk as walk
from cute_kernels.kernels import qknorm, qknorm_tp
from cute_kernels.kernels import ranker_bwd as rb
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.layouts import analysis


# Gap F1: RankerFwdConfig's tile_n range [64, 256] is not pinned at its lower end (a mutant allowing 48 survived).
def test_fwd_tile_n_below_64_is_refused():
    rf.RankerFwdConfig(head_dim=64, tile_n=64, stages=2)  # the smallest legal tile_n
    for tile_n in (48, 32, 16):  # multiples of 16 (WGMMA N / K) but below the kernel's range
        with pytest.raises(ValueError, match=r"tile_n=.*\[64, 256\]"):
            rf.RankerFwdConfig(head_dim=64, tile_n=tile_n, stages=2)


# Gap F2: RankerFwdConfig's stages <= 8 is not pinned (a mutant allowing 9 survived: D=64 tile_n=64 fits 9 stages
# of shared memory, so nothing else refuses it).
def test_fwd_more_than_eight_stages_is_refused():
    rf.RankerFwdConfig(head_dim=64, tile_n=64, stages=8)
    for stages in (9, 10):
        with pytest.raises(ValueError, match=r"stages=\d+: must be in \[1, 8\]"):
            rf.RankerFwdConfig(head_dim=64, tile_n=64, stages=stages)
    with pytest.raises(ValueError, match=r"stages=0: must be in \[1, 8\]"):
        rf.RankerFwdConfig(head_dim=64, tile_n=64, stages=0)


# Gap C6 (session 74's mutation pass): RankerBwdConfig's stages <= 4 was not pinned (a mutant allowing 5 survived:
# the D=64 config's budget fits 5 Q/dO stages, so only the range rule refuses them).
def test_bwd_more_than_four_stages_is_refused():
    base = rb.config_for(64, True)
    dataclasses.replace(base, stages=4)
    for stages in (5, 0):
        with pytest.raises(ValueError, match=rf"stages={stages}: must be in \[1, 4\]"):
            dataclasses.replace(base, stages=stages)


# Gap B5: RankerBwdConfig's accumulator check keeps 8 registers of mma_regs for addresses and loop state; a mutant
# dropping that headroom (acc_regs() > mma_regs) survived.  At D=128, 64 q rows x 128 keys needs 192 accumulator
# registers per MMA thread: 200 fit, 192 (no headroom at all: ptxas would spill) must be refused.
def test_bwd_accumulators_need_eight_registers_of_headroom():
    base = rb.CONFIGS[128]
    assert base.acc_regs() == 192
    assert dataclasses.replace(base, mma_regs=200).mma_regs == 200  # 192 + 8 fit
    with pytest.raises(ValueError, match="192 accumulator registers per MMA thread do not fit in mma_regs=192"):
        dataclasses.replace(base, mma_regs=192)
    # dq_swap_ab's 80-row tile: 208 accumulators, so mma_regs=208 is refused, 216 taken
    eighty = dataclasses.replace(base, tile_m=80, ds_stages=1, stages=1)
    assert eighty.acc_regs() == 208
    dataclasses.replace(eighty, mma_regs=216)
    with pytest.raises(ValueError, match="accumulator"):
        dataclasses.replace(eighty, mma_regs=208)


# Gap L1: SmemBudget.fits is total <= limit; a budget exactly at its limit fits.  The shipped D=256 backward
# config is such a budget: its SharedStorage is 231424 B, exactly SMEM_CAPACITY less ptxas' 1024 B of static smem
# (the limit ranker_bwd_layouts passes), so a '<' would make `cute-kernels layouts` report the shipped kernel as
# 'DOES NOT FIT'.
def test_a_budget_exactly_at_its_limit_fits():
    cfg = rb.config_for(256, False)
    limit = rb.SMEM_CAPACITY - rb.STATIC_SMEM_BYTES
    assert cfg.smem_bytes() == limit == 231424
    budget = analysis.SmemBudget({"sK": limit - 1024}, cfg.stages, 0, 1024, limit)  # total == limit
    assert budget.total == limit and budget.fits
    assert "DOES NOT FIT" not in str(budget)
    assert not analysis.SmemBudget({"sK": limit + 1}, 1, 0, 0, limit).fits


# Gaps Q3 / Q4 in QKNormConfig.validate:
# Q3: bulk_stages needs no predicated (ragged) columns in k as well as q (the bulk kernel copies whole rows and its
#     threads' last vectors are not predicated): a mutant checking q only survived;
# Q4: the register estimate is checked against the CTA's block_threads, which counts the bulk kernel's producer warp
#     (544 threads: 96 registers each, not the 128 of 512): a mutant using the q + k threads only survived; ptxas
#     spilled 544-thread CTAs (qknorm.MAX_CTA_THREADS' comment).
BULK = qknorm.QKNormTuning(persistent_ctas=132, bulk_stages=2)


def test_bulk_stages_refuse_ragged_k_rows():
    qknorm.QKNormConfig.for_shape(1280, 1024, torch.bfloat16, tuning=BULK)
    with pytest.raises(ValueError, match=r"predicated columns.*k ragged=True"):
        qknorm.QKNormConfig.for_shape(1280, 1000, torch.bfloat16, tuning=BULK)


def test_register_estimate_counts_the_bulk_producer_warp():
    plain = qknorm.QKNormConfig.for_shape(16384, 8192, torch.bfloat16, tuning=qknorm.QKNormTuning(persistent_ctas=132))
    assert plain.block_threads == 512 and plain.registers_needed() == 104  # 128 each: taken
    with pytest.raises(ValueError, match=r"104 registers per thread .* CTA of 544 threads, which has 96"):
        qknorm.QKNormConfig.for_shape(16384, 8192, torch.bfloat16, tuning=BULK)


# Gap Q6: QKNormConfig's "full dims must be >= the per-rank widths" rule is not pinned (a mutant dropping the k_dim
# half survived; no test names the rule).  q_dim / k_dim divide the sums of squares, so a k_dim below k's width would
# give rsqrt(sum(k^2) / k_dim): a wrong, too small, scale for every k row.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_full_dims_below_the_row_widths_are_refused(dtype):
    qknorm.QKNormConfig.for_shape(1024, 128, dtype, q_dim=1024, k_dim=128)  # equal: taken
    qknorm.QKNormConfig.for_shape(1024, 128, dtype, q_dim=4096, k_dim=1024)  # a rank's share of wider rows
    with pytest.raises(ValueError, match="full dims"):
        qknorm.QKNormConfig.for_shape(1024, 128, dtype, q_dim=1024, k_dim=64)
    with pytest.raises(ValueError, match="full dims"):
        qknorm.QKNormConfig.for_shape(1024, 128, dtype, q_dim=512, k_dim=128)


# Gaps T1 / T2: ParallelQKNormConfig's own checks.  T1: the constructor's world <= MAX_G (8) bound is pinned only
# through for_shape, which checks it first; a direct construction (or dataclasses.replace) with world=16 and a
# matching tiling was accepted by a mutant.  T2: only a wrong q split was pinned ('not the full sizes'); a tiling whose
# k_dim is not world x k's per-rank width (the sums of squares divided by the wrong size: wrong k norms) was accepted.
def test_world_above_max_g_is_refused_by_the_constructor():
    assert qknorm_tp.MAX_G == 8
    norm = qknorm.QKNormConfig.for_shape(256, 64, torch.bfloat16, q_dim=4096, k_dim=1024,
                                         tuning=qknorm_tp.TP_TUNING)  # per-rank widths of 16 ranks
    with pytest.raises(ValueError, match=r"world=16 must be in \[1, 8\]"):
        qknorm_tp.ParallelQKNormConfig(16, norm)


def test_k_split_that_does_not_match_k_dim_is_refused():
    good = qknorm_tp.ParallelQKNormConfig.for_shape(2, 4096, 1024, torch.bfloat16)
    bad_k = dataclasses.replace(good.norm, k_dim=2048)  # q: 2 x 2048 = 4096, k: 2 x 512 != 2048
    with pytest.raises(ValueError, match="not the full sizes"):
        qknorm_tp.ParallelQKNormConfig(2, bad_k)


# Gap W1 (low stakes: a speed choice, every config gives the same bits): hc_mix_walk.config_for's documented
# boundary, 16-row clusters (SMALL) up to and including M = 256 and 32-row ones (MEDIUM) above, is not pinned; a
# mutant switching at M = 256 itself (m < 256) survived.
def test_walk_config_for_switches_to_medium_above_256_rows():
    assert walk.config_for(0) is walk.SMALL
    assert walk.config_for(256) is walk.SMALL
    assert walk.config_for(257) is walk.MEDIUM


# Gap B6 (left by session 64's pass, then caught only by the slow test_layouts.py::test_session_17_tile_shape_review):
# RankerBwdConfig's budget adds the 1 KB of static shared memory ptxas reports for the mainloop.  D=128 with 64-row
# q blocks, three Q/dO stages and two sdS^T buffers lays out exactly the sm_90 limit in dynamic shared memory, so it
# fits only if the static kilobyte is forgotten.
def test_bwd_smem_budget_counts_the_static_kilobyte():
    base = rb.CONFIGS[128]
    assert base.tile_m == 64 and base.ds_stages == 2
    probe = copy.copy(base)  # (unvalidated: three stages)
    object.__setattr__(probe, "stages", 3)
    assert probe.smem_bytes() == rb.SMEM_CAPACITY
    with pytest.raises(ValueError, match=r"needs 233472 B of shared memory .*1024 B static.*limit is 232448 B"):
        dataclasses.replace(base, stages=3)
