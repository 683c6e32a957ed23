"""Tensor-parallel Q/K RMSNorm: CPU compile per shipped (dtype, G, Q, K), protocol in the PTX, config, reference."""

import re

import pytest
import torch

import cute_kernels
from cute_kernels.kernels import qknorm_tp as mod
from cute_kernels.runtime.cache import compile_record


@pytest.mark.parametrize("target", mod.compile_targets(), ids=lambda t: t.label)
def test_compiles_with_push_poll_protocol(target):
    target.build()
    rec = compile_record(target.kernel, target.key)
    ptx = rec.ptx
    assert ".target sm_90a" in ptx
    assert "ld.global.v4 (16B loads)" in rec.ptx_features
    assert "st.global.v4 (16B stores)" in rec.ptx_features
    assert "volatile/system-scope store" in rec.ptx_features
    assert "local memory (spill)" not in rec.ptx_features
    # push: one 64-bit system-scope store per peer; poll: system-scope loads; sentinel written back
    assert re.search(r"st\.relaxed\.sys\.global\.b64", ptx)
    assert re.search(r"ld\.relaxed\.sys\.global\.b64", ptx)
    assert "%globaltimer" in ptx  # bounded wait
    assert re.search(r"st\.relaxed\.sys\.global\.b32", ptx)  # error flag
    assert re.search(r"atom\.global(\.acq_rel)?(\.gpu)?\.add", ptx)  # last-CTA epoch flip
    # q and k warps meet around the exchange from different branches: the unaligned barrier form
    assert re.search(r"barrier(\.cta)?\.sync\s+3,", ptx)
    assert not re.search(r"\bbar\.sync\s+3,|barrier(\.cta)?\.sync\.aligned\s+3,", ptx)


def test_sentinel_is_negative_zero_pair():
    import struct

    lo, hi = struct.unpack("<ff", struct.pack("<Q", mod.SENTINEL))
    assert lo == 0.0 and hi == 0.0 and str(lo) == "-0.0" and str(hi) == "-0.0"
    assert mod._sentinel_i64() & ((1 << 64) - 1) == mod.SENTINEL
    # a real (sum_q, sum_k) word of two +0.0 sums (zero row, eps = 0) is not the sentinel
    assert struct.unpack("<Q", struct.pack("<ff", 0.0, 0.0))[0] != mod.SENTINEL


def test_config():
    cfg = mod.ParallelQKNormConfig.for_shape(8, 6144, 1024, torch.bfloat16)
    assert cfg.norm.q.width == 768 and cfg.norm.k.width == 128 and cfg.norm.q_dim == 6144
    assert cfg.norm.rows * 8 <= cfg.norm.q_threads
    with pytest.raises(ValueError, match="divisible"):
        mod.ParallelQKNormConfig.for_shape(3, 4096, 1024, torch.bfloat16)
    with pytest.raises(ValueError, match="world size"):
        mod.ParallelQKNormConfig.for_shape(16, 4096, 1024, torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 8"):
        mod.ParallelQKNormConfig.for_shape(8, 4096 + 8, 1024, torch.bfloat16)


def test_occupancy_model():
    assert mod.ctas_per_sm(160, 64) == 6  # 64 regs x 160 threads: registers limit
    assert mod.ctas_per_sm(128, 32) == 16  # threads limit
    assert mod.ctas_per_sm(32, 16) == 32  # CTA-slot limit
    assert mod.ctas_per_sm(1024, 255) == 0


def test_parallel_reference_equals_unsharded():
    q = torch.randn(5, 64, dtype=torch.float64)
    k = torch.randn(5, 16, dtype=torch.float64)
    wq, wk = torch.randn(64, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    full_q, full_k = cute_kernels.qk_rmsnorm_reference(q, k, wq, wk, 1e-6)
    for world in (2, 4, 8):
        outs = mod.parallel_reference(q, k, wq, wk, 1e-6, world)
        torch.testing.assert_close(torch.cat([o[0] for o in outs], 1), full_q)
        torch.testing.assert_close(torch.cat([o[1] for o in outs], 1), full_k)


def test_unfused_scale_matches_reference():
    q = torch.randn(6, 32)
    k = torch.randn(6, 8)
    wq, wk = torch.randn(32), torch.randn(8)
    rq, rk = cute_kernels.qk_rmsnorm_reference(q, k, wq, wk, 1e-6)
    sums = torch.stack([q.square().sum(-1), k.square().sum(-1)])
    mod._scale_in_place(q, k, wq, wk, 1e-6, sums, 32, 8)
    torch.testing.assert_close(q, rq)
    torch.testing.assert_close(k, rk)


def test_constructor_validation():
    with pytest.raises(TypeError, match="dtype"):
        cute_kernels.ParallelQKNorm(None, 16, 4096, 1024, torch.float64)
    with pytest.raises(ValueError, match="max_tokens"):
        cute_kernels.ParallelQKNorm(None, 0, 4096, 1024, torch.bfloat16)
    with pytest.raises(ValueError, match="timeout_s"):
        cute_kernels.ParallelQKNorm(None, 16, 4096, 1024, torch.bfloat16, timeout_s=0)


def test_single_rank_group_constructs_without_push_buffers():
    """G = 1 needs no peers: the object only routes to the one-GPU kernel (checked here up to the launch)."""
    import os

    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        p = cute_kernels.ParallelQKNorm(None, 8, 64, 16, torch.bfloat16)
        assert (p.rank, p.world, p.fused) == (0, 1, False)
        p.check_error(synchronize=False)
        q, k = torch.zeros(9, 64, dtype=torch.bfloat16), torch.zeros(9, 16, dtype=torch.bfloat16)
        w = (torch.ones(64, dtype=torch.bfloat16), torch.ones(16, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="CUDA device"):
            p(q, k, *w, 1e-6)
        with pytest.raises(ValueError, match="CUDA device"):  # validation precedes the capacity check
            p(q[:4], k[:4], *w, 1e-6)
    finally:
        dist.destroy_process_group()
