"""GPU: tensor-parallel Q/K RMSNorm through the one-GPU emulation (G ranks, one stream each, all in flight).

Every multi-launch test runs under a watchdog (a subprocess with a timeout), so a protocol hang fails
the test instead of blocking the session.
"""

import subprocess
import sys
import textwrap

import pytest
import torch

from cute_kernels.kernels import qknorm_tp as mod

TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2**-7, 1e-2), torch.float16: (2**-10, 2e-3)}


def _shards(n, q_dim, k_dim, world, dtype, zero_rows=()):
    qf = (torch.randn(n, q_dim, device="cuda") * 2).to(dtype)
    kf = torch.randn(n, k_dim, device="cuda").to(dtype)
    for r in zero_rows:
        if r < n:
            qf[r].zero_()
            kf[r].zero_()
    wq = torch.randn(q_dim, device="cuda").to(dtype)
    wk = torch.randn(k_dim, device="cuda").to(dtype)
    qw, kw = q_dim // world, k_dim // world
    # q shards as strided views of a wider buffer (like a fused qkv output)
    qs, ks = [], []
    for r in range(world):
        buf = torch.full((n, qw + kw + 8), float("nan"), device="cuda", dtype=dtype)
        buf[:, :qw] = qf[:, r * qw:(r + 1) * qw]
        buf[:, qw:qw + kw] = kf[:, r * kw:(r + 1) * kw]
        qs.append(buf[:, :qw])
        ks.append(buf[:, qw:qw + kw])
    wqs = [wq[r * qw:(r + 1) * qw].contiguous() for r in range(world)]
    wks = [wk[r * kw:(r + 1) * kw].contiguous() for r in range(world)]
    return qf, kf, wq, wk, qs, ks, wqs, wks


def _run_watchdog(code: str, timeout: float):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("dims", [(6144, 1024), (4096, 1024)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_matches_gathered_float64_reference(world, dims, dtype):
    q_dim, k_dim = dims
    ranks = mod.ParallelQKNorm.emulated(world, 4096, q_dim, k_dim, dtype, timeout_s=5.0)
    streams = [torch.cuda.Stream() for _ in range(world)]
    rtol, atol = TOL[dtype]
    for n in (1, 2, 3, 64, 333, 4096):
        qf, kf, wq, wk, qs, ks, wqs, wks = _shards(n, q_dim, k_dim, world, dtype, zero_rows=(1, 200))
        ref = mod.parallel_reference(qf, kf, wq, wk, 1e-6, world)
        mod.emulated_step(ranks, streams, qs, ks, wqs, wks, 1e-6)
        torch.cuda.synchronize()
        for r in range(world):
            torch.testing.assert_close(qs[r].double(), ref[r][0].double(), rtol=rtol, atol=atol)
            torch.testing.assert_close(ks[r].double(), ref[r][1].double(), rtol=rtol, atol=atol)
            assert torch.isnan(qs[r].as_strided((n, 8), (qs[r].stride(0), 1),
                                                qs[r].storage_offset() + q_dim // world + k_dim // world)).all()
    for r in ranks:
        r.check_error()


def test_built_under_inference_mode():
    """Emulated ranks built under torch.inference_mode() (serving code): their buffers are normal tensors, so
    steps in and out of inference mode and reset() outside it work; each step matches the float64 reference."""
    world, q_dim, k_dim, dtype = 2, 4096, 1024, torch.bfloat16
    with torch.inference_mode():
        ranks = mod.ParallelQKNorm.emulated(world, 64, q_dim, k_dim, dtype, timeout_s=5.0)
    assert not any(r.buffer.is_inference() or r.state.is_inference() for r in ranks)
    streams = [torch.cuda.Stream() for _ in range(world)]
    rtol, atol = TOL[dtype]
    for step, inference in enumerate((True, False, True)):
        with torch.inference_mode(inference):
            qf, kf, wq, wk, qs, ks, wqs, wks = _shards(33, q_dim, k_dim, world, dtype)
            ref = mod.parallel_reference(qf, kf, wq, wk, 1e-6, world)
            mod.emulated_step(ranks, streams, qs, ks, wqs, wks, 1e-6)
            torch.cuda.synchronize()
        for r in range(world):
            torch.testing.assert_close(qs[r].double(), ref[r][0].double(), rtol=rtol, atol=atol, msg=f"step {step}")
            torch.testing.assert_close(ks[r].double(), ref[r][1].double(), rtol=rtol, atol=atol, msg=f"step {step}")
        for r in ranks:
            r.check_error()
        for r in ranks:
            r.reset()


def test_zero_rows_with_eps_zero_finish():
    """The seed spun forever on a zero row with eps = 0 (it waited for a non-zero sum)."""
    world, n = 4, 37
    ranks = mod.ParallelQKNorm.emulated(world, 64, 4096, 1024, torch.bfloat16, timeout_s=2.0)
    streams = [torch.cuda.Stream() for _ in range(world)]
    qf, kf, wq, wk, qs, ks, wqs, wks = _shards(n, 4096, 1024, world, torch.bfloat16, zero_rows=(0, 5, 36))
    ref = mod.parallel_reference(qf, kf, wq, wk, 0.0, world)
    mod.emulated_step(ranks, streams, qs, ks, wqs, wks, 0.0)
    for r in ranks:
        r.check_error()  # no timeout
    for r in range(world):
        torch.testing.assert_close(qs[r].double(), ref[r][0].double(), rtol=2**-7, atol=1e-2, equal_nan=True)
        assert torch.isnan(qs[r][5]).all()  # 0 * rsqrt(0), as the reference


def test_capacity_overflow_raises():
    ranks = mod.ParallelQKNorm.emulated(2, 16, 4096, 1024, torch.bfloat16)
    q = torch.zeros(17, 2048, device="cuda", dtype=torch.bfloat16)
    k = torch.zeros(17, 512, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="capacity max_tokens=16"):
        ranks[0](q, k, torch.ones(2048, device="cuda", dtype=torch.bfloat16),
                 torch.ones(512, device="cuda", dtype=torch.bfloat16), 1e-6)
    with pytest.raises(ValueError, match=r"q \[N, 2048\]"):
        ranks[0](q[:, :1024], k, torch.ones(1024, device="cuda", dtype=torch.bfloat16),
                 torch.ones(512, device="cuda", dtype=torch.bfloat16), 1e-6)


def test_missing_peer_times_out_with_error_then_reset_recovers():
    out = _run_watchdog("""
        import torch
        from cute_kernels.kernels import qknorm_tp as mod
        ranks = mod.ParallelQKNorm.emulated(2, 64, 4096, 1024, torch.bfloat16, timeout_s=0.2)
        q = [torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        k = [torch.randn(8, 512, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        w = (torch.ones(2048, device="cuda", dtype=torch.bfloat16), torch.ones(512, device="cuda", dtype=torch.bfloat16))
        ranks[0](q[0], k[0], w[0], w[1], 1e-6)   # rank 1 never comes
        try:
            ranks[0].check_error()
            print("NO ERROR")
        except mod.PeerTimeoutError as e:
            print("TIMEOUT", str(e)[:60])
        try:
            ranks[0](q[0], k[0], w[0], w[1], 1e-6)
            print("CALLED")
        except mod.PeerTimeoutError:
            print("REFUSED")
        for r in ranks:
            r.reset()
        streams = [torch.cuda.Stream() for _ in range(2)]
        for _ in range(5):
            mod.emulated_step(ranks, streams, q, k, [w[0]] * 2, [w[1]] * 2, 1e-6)
        for r in ranks:
            r.check_error()
        print("RECOVERED")
    """, timeout=120)
    assert "TIMEOUT" in out and "REFUSED" in out and "RECOVERED" in out, out


def test_missing_peer_costs_one_timeout_per_launch_not_per_tile():
    """Many token tiles per CTA (N at capacity, few resident CTAs): the wait deadline is per launch."""
    out = _run_watchdog("""
        import time, torch
        from cute_kernels.kernels import qknorm_tp as mod
        ranks = mod.ParallelQKNorm.emulated(2, 8192, 4096, 1024, torch.bfloat16, timeout_s=0.5)
        n = 8192
        q = torch.randn(n, 2048, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(n, 512, device="cuda", dtype=torch.bfloat16)
        w = (torch.ones(2048, device="cuda", dtype=torch.bfloat16), torch.ones(512, device="cuda", dtype=torch.bfloat16))
        tiles = -(-n // ranks[0].config.norm.rows)
        print("tiles per CTA", tiles / ranks[0]._resident)
        torch.cuda.synchronize()
        t = time.perf_counter()
        ranks[0](q, k, w[0], w[1], 1e-6)   # rank 1 never comes
        torch.cuda.synchronize()
        print("ELAPSED", time.perf_counter() - t)
    """, timeout=120)
    elapsed = float(out.split("ELAPSED")[1].split()[0])
    per_cta = float(out.split("tiles per CTA")[1].split()[0])
    assert per_cta > 4, out  # the case needs several tiles per CTA to mean anything
    assert elapsed < 3 * 0.5, out


# The stress runs' peer-wait bound: the kernel's clock counts wall time, also while the GPU time-slices to
# other processes (session 24: a 5-s bound fired once with four other test processes, one under
# compute-sanitizer, sharing the GPU; alone the run passed 3/3).  A hang still fails, 30 s later.
STRESS_TIMEOUT_S = 30.0


@pytest.mark.parametrize("world", [2, 4, 8])
def test_1000_launches_varying_n_under_watchdog(world):
    out = _run_watchdog(f"""
        import torch
        from cute_kernels.kernels import qknorm_tp as mod
        res = mod.emulation_stress({world}, 1000, max_tokens=4096, timeout_s={STRESS_TIMEOUT_S})
        print("RESULT", res["max_err"], res["max_n"])
    """, timeout=200)
    line = [l for l in out.splitlines() if l.startswith("RESULT")][0]
    max_err, max_n = float(line.split()[1]), int(line.split()[2])
    assert max_err <= 0.08, out  # bf16: one rounding step of values up to ~10
    assert max_n == 4096


def test_300_launches_joined_each_launch_under_watchdog():
    """Same as above with ranks joined after every call (separates protocol bugs from out-of-step runs)."""
    out = _run_watchdog(f"""
        import torch
        from cute_kernels.kernels import qknorm_tp as mod
        res = mod.emulation_stress(4, 300, max_tokens=2048, timeout_s={STRESS_TIMEOUT_S}, join_each_launch=True)
        print("RESULT", res["max_err"], res["max_n"])
    """, timeout=120)
    line = [l for l in out.splitlines() if l.startswith("RESULT")][0]
    assert float(line.split()[1]) <= 0.08, out


def test_cuda_graph_of_all_ranks():
    world, n = 4, 64
    ranks = mod.ParallelQKNorm.emulated(world, 256, 4096, 1024, torch.bfloat16, timeout_s=5.0)
    streams = [torch.cuda.Stream() for _ in range(world)]
    qf, kf, wq, wk, qs, ks, wqs, wks = _shards(n, 4096, 1024, world, torch.bfloat16)
    mod.emulated_step(ranks, streams, qs, ks, wqs, wks, 1e-6)  # compile + warm outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.graph(g, stream=side):
        mod.emulated_step(ranks, streams, qs, ks, wqs, wks, 1e-6)
    for rep in range(3):  # each replay flips the device-side epoch
        qf, kf, wq2, wk2, qs2, ks2, _, _ = _shards(n, 4096, 1024, world, torch.bfloat16)
        for r in range(world):
            qs[r].copy_(qs2[r])
            ks[r].copy_(ks2[r])
        ref = mod.parallel_reference(qf, kf, wq, wk, 1e-6, world)
        g.replay()
        torch.cuda.synchronize()
        for r in range(world):
            torch.testing.assert_close(qs[r].double(), ref[r][0].double(), rtol=2**-7, atol=1e-2)
            torch.testing.assert_close(ks[r].double(), ref[r][1].double(), rtol=2**-7, atol=1e-2)
    for r in ranks:
        r.check_error()


def test_unfused_path_matches_reference():
    world, n = 4, 100
    ranks = mod.ParallelQKNorm.emulated(world, 256, 4096, 1024, torch.bfloat16)
    qf, kf, wq, wk, qs, ks, wqs, wks = _shards(n, 4096, 1024, world, torch.bfloat16)
    ref = mod.parallel_reference(qf, kf, wq, wk, 1e-6, world)
    mod.unfused_emulated_step(ranks, qs, ks, wqs, wks, 1e-6)
    for r in range(world):
        torch.testing.assert_close(qs[r].double(), ref[r][0].double(), rtol=2**-7, atol=1e-2)
