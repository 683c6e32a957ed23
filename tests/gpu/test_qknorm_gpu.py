"""GPU: fused Q/K RMSNorm (G = 1) against a float64 reference; strided views, bounds, graphs, compile."""

import dataclasses

import pytest
import torch
from seeding import FUZZ_CASES, RUN_SEED, case_rng, generator
from side_stream import run_behind_a_sleep

import cute_kernels
from cute_kernels.kernels import qknorm as mod

TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2**-7, 1e-2), torch.float16: (2**-10, 2e-3)}


def _make(n, qd, kd, dtype, pad=0, extra_rows=1, scale=(3.0, 1.0), generator=None):
    """q and k as strided views of one poisoned qkv-like buffer (pad columns and extra rows stay NaN), N(0, 1)
    values times ``scale`` (q's, k's); the weights N(0, 1)."""
    buf = torch.full((n + extra_rows, qd + kd + pad), float("nan"), device="cuda", dtype=dtype)
    q, k = buf[:n, :qd], buf[:n, qd:qd + kd]
    randn = lambda *shape: torch.randn(*shape, device="cuda", generator=generator).to(dtype)  # noqa: E731
    q.copy_(randn(n, qd) * scale[0])
    k.copy_(randn(n, kd) * scale[1])
    return buf, q, k, randn(qd), randn(kd)


def _check(buf, q, k, wq, wk, eps, qd, kd, n):
    rq, rk = mod.qk_rmsnorm_reference(q.double(), k.double(), wq, wk, eps)
    cute_kernels.qk_rmsnorm_(q, k, wq, wk, eps)
    torch.cuda.synchronize()
    rtol, atol = TOL[q.dtype]
    torch.testing.assert_close(q.double(), rq, rtol=rtol, atol=atol, equal_nan=True)
    torch.testing.assert_close(k.double(), rk, rtol=rtol, atol=atol, equal_nan=True)
    # nothing outside q and k was written (NaN poison and the extra row intact)
    assert torch.isnan(buf[n:]).all()
    assert torch.isnan(buf[:n, qd + kd:]).all()


@pytest.mark.parametrize("dtype", mod.DTYPES)
@pytest.mark.parametrize("qk", [(4096, 1024), (6144, 1024), (3072, 512), (1536, 256), (768, 128), (512, 128)])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 333, 4097])
def test_matches_float64_reference(dtype, qk, n):
    qd, kd = qk
    buf, q, k, wq, wk = _make(n, qd, kd, dtype, pad=kd)  # row stride Q + 2K, like a fused qkv buffer
    _check(buf, q, k, wq, wk, 1e-6, qd, kd, n)


@pytest.mark.parametrize("qk", [(8, 8), (8 * 97, 24), (1000, 8), (12288, 64), (24576, 64)])
def test_odd_widths(qk):
    qd, kd = qk
    for dtype in (torch.bfloat16, torch.float32):
        if qd % mod.vec_elems(dtype) or kd % mod.vec_elems(dtype):
            continue
        if qd * dtype.itemsize > 48 * 1024:  # wider rows are refused (test_too_wide_rows_refused on CPU)
            continue
        buf, q, k, wq, wk = _make(37, qd, kd, dtype)
        _check(buf, q, k, wq, wk, 1e-5, qd, kd, 37)


def test_large_n_contiguous():
    n, qd, kd = 8192, 4096, 1024
    q = torch.randn(n, qd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n, kd, device="cuda", dtype=torch.bfloat16)
    wq = torch.randn(qd, device="cuda", dtype=torch.bfloat16)
    wk = torch.randn(kd, device="cuda", dtype=torch.bfloat16)
    rq, rk = mod.qk_rmsnorm_reference(q, k, wq, wk, 1e-6)  # rounded to bf16
    cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
    # at most one bf16 rounding step apart from the float64 result rounded to bf16
    for got, ref in ((q, rq), (k, rk)):
        diff = (got.float() - ref.float()).abs()
        assert (diff <= ref.float().abs() * 2**-7 + 1e-6).all(), diff.max()


def test_zero_rows_and_eps_zero():
    buf, q, k, wq, wk = _make(9, 4096, 1024, torch.bfloat16)
    q[3].zero_()
    k[5].zero_()
    _check(buf, q, k, wq, wk, 1e-6, 4096, 1024, 9)
    assert (q[3] == 0).all() and (k[5] == 0).all()
    buf, q, k, wq, wk = _make(9, 4096, 1024, torch.bfloat16)
    q[3].zero_()
    _check(buf, q, k, wq, wk, 0.0, 4096, 1024, 9)  # 0 * rsqrt(0) = NaN in both
    assert torch.isnan(q[3]).all()


def test_rows_whose_sum_of_squares_overflows_float32():
    """The documented range: a row whose float32 sum of squares overflows (one bf16 element of 1e20, or 1024
    elements of 1e18: 1e39) comes out as zeros, x * rsqrt(inf); the other rows as the reference."""
    buf, q, k, wq, wk = _make(9, 4096, 1024, torch.bfloat16)
    q[2, 7] = 1e20
    k[4].fill_(1e18)
    rq, rk = mod.qk_rmsnorm_reference(q.double(), k.double(), wq, wk, 1e-6)
    cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
    torch.cuda.synchronize()
    assert (q[2] == 0).all() and (k[4] == 0).all()
    rows = [r for r in range(9) if r not in (2, 4)]
    torch.testing.assert_close(q[rows].double(), rq[rows], rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(k[rows].double(), rk[rows], rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(q[4].double(), rq[4], rtol=2**-7, atol=1e-2)  # (k's row 4 alone overflows)


def test_matches_torch_rms_norm():
    q = torch.randn(100, 4096, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(100, 1024, device="cuda", dtype=torch.bfloat16)
    wq = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    wk = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    tq = torch.nn.functional.rms_norm(q.float(), (4096,), wq.float(), 1e-6)
    tk = torch.nn.functional.rms_norm(k.float(), (1024,), wk.float(), 1e-6)
    cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
    torch.testing.assert_close(q.float(), tq, rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(k.float(), tk, rtol=2**-7, atol=1e-2)


def test_empty_and_validation_on_gpu():
    q = torch.empty(0, 4096, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(0, 1024, device="cuda", dtype=torch.bfloat16)
    wq = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    wk = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
    with pytest.raises(ValueError, match="aligned"):
        buf = torch.zeros(2, 4096 + 8, device="cuda", dtype=torch.bfloat16)
        cute_kernels.qk_rmsnorm_(buf.view(-1)[4:4 + 2 * 4096].view(2, 4096), torch.zeros(2, 1024, device="cuda",
                                 dtype=torch.bfloat16), wq, wk, 1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        cute_kernels.qk_rmsnorm_(torch.zeros(2, 4096, device="cuda", dtype=torch.bfloat16),
                                 torch.zeros(2, 1024, device="cuda", dtype=torch.bfloat16),
                                 torch.ones(8192, device="cuda", dtype=torch.bfloat16)[::2], wk, 1e-6)


@pytest.mark.parametrize("case", ["k_fp16", "q_weight_fp32", "q_weight_long", "q_weight_short", "k_weight_strided",
                                  "k_weight_2d", "k_rows", "q_width_odd", "q_too_wide", "q_column_strided",
                                  "k_misaligned", "k_rows_persistent", "k_rows_bulk"])
def test_arguments_refused_at_the_launch_get_the_slow_paths_error(case):
    """qk_rmsnorm_'s fast path leaves k's and the weights' dtype, shapes and strides, k's token count, the row
    strides' divisibility, unit column strides and alignment to the compiled function's own checks, and widths
    that no config takes to the kernel's compile (fast_path_key's launch_checks): such a call must raise the
    slow path's error (not tvm-ffi's or the config's) and write nothing."""
    import re

    bf = torch.bfloat16
    q, k = torch.randn(5, 4096, device="cuda", dtype=bf), torch.randn(5, 1024, device="cuda", dtype=bf)
    wq, wk = torch.randn(4096, device="cuda", dtype=bf), torch.randn(1024, device="cuda", dtype=bf)
    cute_kernels.qk_rmsnorm_(q.clone(), k.clone(), wq, wk, 1e-6)  # the device checked, the kernel compiled
    args = {"k_fp16": (q, k.half(), wq, wk), "q_weight_fp32": (q, k, wq.float(), wk),
            "q_weight_long": (q, k, torch.ones(4104, device="cuda", dtype=bf), wk),
            "q_weight_short": (q, k, wq[:4088], wk),
            "k_weight_strided": (q, k, wq, torch.ones(2048, device="cuda", dtype=bf)[::2]),
            "k_weight_2d": (q, k, wq, wk.view(1, 1024)), "k_rows": (q, k[:4], wq, wk),
            "q_width_odd": (q[:, :4092], k, wq[:4092], wk),
            "q_too_wide": (torch.randn(5, 32768, device="cuda", dtype=bf), k,
                           torch.ones(32768, device="cuda", dtype=bf), wk),
            "q_column_strided": (torch.randn(5, 8192, device="cuda", dtype=bf)[:, ::2], k, wq, wk),
            "k_misaligned": (q, torch.randn(5 * 1024 + 8, device="cuda", dtype=bf)[4:4 + 5 * 1024].view(5, 1024), wq,
                             wk),
            # the persistent and bulk-staged kernels' launches (N >= 1024, launch_key's picks on an H200)
            "k_rows_persistent": (torch.randn(2048, 4096, device="cuda", dtype=bf),
                                  torch.randn(2047, 1024, device="cuda", dtype=bf), wq, wk),
            "k_rows_bulk": (torch.randn(4096, 4096, device="cuda", dtype=bf),
                            torch.randn(4095, 1024, device="cuda", dtype=bf), wq, wk)}[case]
    assert mod.fast_path_key(*args, 1e-6, launch_checks=True) is not None  # (so the launch is what refuses)
    with pytest.raises((TypeError, ValueError)) as expected:
        mod._explain_refused_launch(*args, 1e-6)
    before = [t.clone() for t in args[:2]]
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        cute_kernels.qk_rmsnorm_(*args, 1e-6)
    torch.cuda.synchronize()
    assert all(torch.equal(t, b) for t, b in zip(args[:2], before))


def test_one_token_with_a_row_stride_of_no_whole_vectors():
    """N = 1 with a row stride that is not a multiple of 16 bytes is legal (the stride is never used): the slow
    path launches a view of it; the result matches float64, the neighbouring elements are untouched."""
    buf = torch.randn(4104 + 1024, device="cuda", dtype=torch.bfloat16)
    q = buf.as_strided((1, 4096), (4100, 1))
    k = buf[4104:].view(1, 1024)  # (16-byte aligned)
    wq, wk = torch.randn(4096, device="cuda", dtype=torch.bfloat16), torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    rq, rk = mod.qk_rmsnorm_reference(q.double(), k.double(), wq, wk, 1e-6)
    gap = buf[4096:4104].clone()
    cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
    torch.testing.assert_close(q.double(), rq.double(), rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(k.double(), rk.double(), rtol=2**-7, atol=1e-2)
    assert torch.equal(buf[4096:4104], gap)


def test_runs_on_current_stream():
    buf, q, k, wq, wk = _make(4096, 4096, 1024, torch.bfloat16)
    rq, rk = mod.qk_rmsnorm_reference(q.double(), k.double(), wq, wk, 1e-6)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(1_000_000)
        cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
    s.synchronize()
    torch.testing.assert_close(q.double(), rq, rtol=2**-7, atol=1e-2)


def test_cuda_graph_capture_and_replay():
    n = 64
    q = torch.randn(n, 4096, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16)
    wq = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    wk = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)  # compile outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
    q.copy_(torch.randn_like(q))
    k.copy_(torch.randn_like(k))
    rq, rk = mod.qk_rmsnorm_reference(q.double(), k.double(), wq, wk, 1e-6)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(q.double(), rq, rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(k.double(), rk, rtol=2**-7, atol=1e-2)


def _normalized_copies(q, k, wq, wk):
    """The in-place op between out-of-place ops, as a model would call it: the function torch.compile compiles."""
    q = q * 1
    k = k * 1
    cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
    return q + 0, k + 0


def test_torch_compile():
    q = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    wq = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    wk = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    rq, rk = mod.qk_rmsnorm_reference(q.double(), k.double(), wq, wk, 1e-6)
    oq, ok = torch.compile(_normalized_copies, fullgraph=True)(q, k, wq, wk)
    torch.testing.assert_close(oq.double(), rq, rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(ok.double(), rk, rtol=2**-7, atol=1e-2)


def _inputs_and_result(n, seed):
    """bf16 q [n, 4096], k [n, 1024], their weights, and the op's result on copies of q and k (eps 1e-6)."""
    g = generator(seed)
    q = torch.randn(n, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16, generator=g)
    wq = torch.randn(4096, device="cuda", dtype=torch.bfloat16, generator=g)
    wk = torch.randn(1024, device="cuda", dtype=torch.bfloat16, generator=g)
    want_q, want_k = q.clone(), k.clone()
    cute_kernels.qk_rmsnorm_(want_q, want_k, wq, wk, 1e-6)
    return q, k, wq, wk, want_q, want_k


def test_inference_mode():
    """In place under ``torch.inference_mode()`` (serving) on inference tensors and on normal ones: the bits of
    the call outside it; outside inference mode, inference tensors are refused (as torch refuses in-place
    updates of them) and left as they were."""
    q, k, wq, wk, want_q, want_k = _inputs_and_result(37, seed=64)
    with torch.inference_mode():
        inf = [t.clone() for t in (q, k, wq, wk)]
    normal_q, normal_k = q.clone(), k.clone()
    with torch.inference_mode():
        cute_kernels.qk_rmsnorm_(*inf, 1e-6)
        cute_kernels.qk_rmsnorm_(normal_q, normal_k, wq, wk, 1e-6)
    for name, got, want in (("inference q", inf[0], want_q), ("inference k", inf[1], want_k),
                            ("q", normal_q, want_q), ("k", normal_k, want_k)):
        assert torch.equal(got, want), name
    with torch.inference_mode():
        inf = [t.clone() for t in (q, k)]
    with pytest.raises(RuntimeError, match="inference tensor"):  # (outside inference mode: torch's in-place rule)
        cute_kernels.qk_rmsnorm_(*inf, wq, wk, 1e-6)
    assert torch.equal(inf[0], q) and torch.equal(inf[1], k)  # (refused before the launch)


def test_runs_on_the_current_stream():
    """On a side stream whose q and k are written there behind a long sleep (:func:`side_stream.run_behind_a_sleep`),
    the in-place op launches on that stream (a launch on another would scale the rows before they are written)
    without waiting for the device: the bits of the default stream's call."""
    q, k, wq, wk, want_q, want_k = _inputs_and_result(300, seed=68)

    def step(fill):
        got_q, got_k = fill(q), fill(k)
        cute_kernels.qk_rmsnorm_(got_q, got_k, wq, wk, 1e-6)
        return got_q, got_k

    got_q, got_k = run_behind_a_sleep(step)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


def test_reduce_overhead():
    """torch.compile(mode="reduce-overhead") around the in-place op, new values on every call."""
    torch._dynamo.reset()
    q = torch.empty(33, 1024, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(33, 256, device="cuda", dtype=torch.bfloat16)
    wq = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    wk = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(_normalized_copies, mode="reduce-overhead", fullgraph=True)
    for step in range(4):
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        rq, rk = mod.qk_rmsnorm_reference(q.double(), k.double(), wq, wk, 1e-6)
        oq, ok = compiled(q, k, wq, wk)
        torch.testing.assert_close(oq.double(), rq, rtol=2**-7, atol=1e-2, msg=f"step {step}: q")
        torch.testing.assert_close(ok.double(), rk, rtol=2**-7, atol=1e-2, msg=f"step {step}: k")
    torch._dynamo.reset()


def test_opcheck():
    q = torch.randn(4, 64, device="cuda", dtype=torch.float32)
    k = torch.randn(4, 16, device="cuda", dtype=torch.float32)
    torch.library.opcheck(mod.qk_rmsnorm_.op, (q, k, torch.randn(64, device="cuda"), torch.randn(16, device="cuda"), 1e-6))


@pytest.mark.parametrize("tuning", [mod.QKNormTuning(2, False, 1), mod.QKNormTuning(2, False, 7),
                                    mod.QKNormTuning(4, True, 5), mod.QKNormTuning(2, False, 792)])
@pytest.mark.parametrize("qk", [(4096, 1024), (1000, 24), (512, 128)])
def test_persistent_tiles_bitwise_equal_to_one_cta_per_tile(tuning, qk):
    """``persistent_ctas``: every row tile walked once (N below, at and above the CTA count, ragged
    columns, one CTA), the same bits as one CTA per tile with the same row tiling (the thread split
    sets the summation order), nothing outside q/k written."""
    _assert_bits_of_one_cta_per_tile(tuning, qk, torch.bfloat16)


@pytest.mark.parametrize("ahead", [1, 3, None])
@pytest.mark.parametrize("qk", [(4096, 1024), (1000, 24), (512, 128)])
def test_l2_prefetch_keeps_the_bits(ahead, qk):
    """``l2_prefetch_bytes`` (the default one-CTA-per-tile kernel's prefetch of a later CTA's rows): 1 and 3
    CTAs ahead, so the prefetch runs at these N (for every CTA but the last ones; several token rows per
    CTA at 512/128 and 1000/24), and the shipped distance: the same bits as without it, nothing outside
    q/k written."""
    cfg = mod.QKNormConfig.for_shape(*qk, torch.bfloat16, tuning=mod.DEFAULT_TUNING)
    nbytes = mod.L2_PREFETCH_BYTES if ahead is None else ahead * cfg.rows * (qk[0] + qk[1]) * 2
    tuning = dataclasses.replace(mod.DEFAULT_TUNING, l2_prefetch_bytes=nbytes)
    if ahead is not None:
        assert mod.QKNormConfig.for_shape(*qk, torch.bfloat16, tuning=tuning).l2_prefetch_ctas == ahead
    _assert_bits_of_one_cta_per_tile(tuning, qk, torch.bfloat16,
                                     reference=dataclasses.replace(tuning, l2_prefetch_bytes=0))


def _assert_bits_of_one_cta_per_tile(tuning, qk, dtype, reference=None):
    """``tuning``'s kernel and one CTA per tile with the same row tiling (or the ``reference`` tuning's
    kernel) give the same bits at N below, at and above the CTA count, on strided row views of one
    NaN-poisoned buffer left unwritten outside q/k."""
    qd, kd = qk
    fn = mod._compile(dtype, qd, kd, tuning)
    if reference is None:
        reference = dataclasses.replace(tuning, persistent_ctas=0, bulk_stages=0)
    fn_per_tile = mod._compile(dtype, qd, kd, reference)
    for n in (1, 2, 6, 7, 8, 333, 4097):
        buf, q, k, wq, wk = _make(n, qd, kd, dtype, pad=8)
        q0, k0 = q.clone(), k.clone()
        fn(q, k, wq, wk, 1e-6)
        fn_per_tile(q0, k0, wq, wk, 1e-6)
        torch.cuda.synchronize()
        assert torch.equal(q, q0) and torch.equal(k, k0), (tuning, qk, dtype, n)
        assert torch.isnan(buf[n:]).all() and torch.isnan(buf[:n, qd + kd:]).all()


_BULK_CASES = [(mod.QKNormTuning(2, False, ctas, stages), qk) for ctas, stages in ((1, 2), (7, 3), (264, 8))
               for qk in ((4096, 1024), (6144, 1024), (2048, 512))]
_BULK_CASES += [(mod.QKNormTuning(4, False, 5, 4), qk) for qk in ((4096, 1024), (6144, 1024))]


@pytest.mark.parametrize("tuning,qk", _BULK_CASES)
def test_bulk_staged_rows_bitwise_equal_to_one_cta_per_tile(tuning, qk):
    """``bulk_stages``: rows staged in shared memory by bulk copies (N below, at and above the CTA count;
    slots reused many times over at 4097 rows on one CTA) give the same bits as one CTA per token with the
    same row tiling, and nothing outside q/k is written (the rows are strided views of one buffer)."""
    for dtype in (torch.bfloat16, torch.float16):
        _assert_bits_of_one_cta_per_tile(tuning, qk, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,qd,kind", [(1024, 4096, 4), (3001, 4096, 4), (3686, 4096, 4), (3687, 4096, 5),
                                       (4096, 4096, 5), (5836, 4096, 5), (1317, 6144, 5), (4169, 6144, 5)])
def test_op_takes_the_persistent_or_bulk_kernel_with_the_same_bits(dtype, n, qd, kind):
    """qk_rmsnorm_ launches what launch_key picks by q + k bytes against L2 (the key lands in the op's
    launcher table): on an H200 (60 MiB of L2) the persistent register kernel for 4096/1024 up to N =
    3686, bulk-staged rows up to 5836 and for 6144/1024 from 1317 to 4169 tokens; within tolerance of
    float64 and bitwise equal to one CTA per token."""
    if mod.device_limits(torch.cuda.current_device())[1] != 60 * 2**20:
        pytest.skip("the token bounds are an H200's (60 MiB of L2)")
    kd = 1024
    key = mod.launch_key(n, (dtype, qd, kd), torch.cuda.current_device())
    assert len(key) == kind, key
    buf, q, k, wq, wk = _make(n, qd, kd, dtype, pad=8)
    q0, k0 = q.clone(), k.clone()
    mod._compile(dtype, qd, kd)(q0, k0, wq, wk, 1e-6)
    mod._launchers.pop(key, None)
    _check(buf, q, k, wq, wk, 1e-6, qd, kd, n)
    assert key in mod._launchers  # the op compiled (and so launched) the picked kernel
    assert torch.equal(q, q0) and torch.equal(k, k0)


@pytest.mark.parametrize("dtype,qk,n", [(torch.bfloat16, (6144, 1024), 1024), (torch.float32, (4096, 1024), 2048),
                                        (torch.bfloat16, (4096, 1024), 8192)])
def test_other_cases_keep_one_cta_per_tile(dtype, qk, n):
    """float32, 6144/1024 below the bulk band and q + k past L2 launch one CTA per tile; correct."""
    key = mod.launch_key(n, (dtype, *qk), torch.cuda.current_device())
    assert key == (dtype, *qk)
    buf, q, k, wq, wk = _make(n, *qk, dtype, pad=8)
    _check(buf, q, k, wq, wk, 1e-6, *qk, n)


@pytest.mark.parametrize("i", range(FUZZ_CASES), ids=lambda i: f"case{i}")  # (ids the same in every process)
def test_random_widths_rows_and_strides(i):
    """Random cases drawn from the run's seed (``CUTE_KERNELS_FUZZ_CASES``, default 12, sets how many): dtype,
    widths (the shipped ones, which take the persistent and bulk-staged kernels at some N, or any multiples of the
    16-byte vector up to 8192 / 2048 that fit one CTA), 1 to 20000 tokens, padded rows of a qkv-like buffer, eps
    (0 too), zero rows, inputs scaled by 1e-3 to 1e2: against float64, nothing outside q and k written."""
    rng = case_rng(7000 + i)
    g = generator(7000 + i)
    dtype = rng.choice(mod.DTYPES)
    vec = mod.vec_elems(dtype)
    while True:
        if rng.random() < 0.4:
            qd, kd = rng.choice([(4096, 1024), (6144, 1024)])
        else:
            qd, kd = vec * rng.randint(1, 8192 // vec), vec * rng.randint(1, 2048 // vec)
        try:
            mod.QKNormConfig.for_shape(qd, kd, dtype, tuning=mod.DEFAULT_TUNING)
            break
        except ValueError:  # (a pair too wide for one CTA: draw again)
            continue
    n = rng.choice([rng.randint(1, 64), rng.randint(65, 4096), rng.randint(4097, 20000)])
    pad = vec * rng.choice([0, 0, rng.randint(1, 64)])
    eps = rng.choice([0.0, 1e-6, 1e-6, 1e-3])
    scale = rng.choice([1e-3, 1.0, 1.0, 1e2])
    buf, q, k, wq, wk = _make(n, qd, kd, dtype, pad=pad, scale=(scale, scale), generator=g)
    zero = torch.rand(n, device="cuda", generator=g) < 0.02
    q[zero] = 0
    k[zero] = 0
    print(f"qknorm fuzz case {i}: {dtype} Q={qd} K={kd} N={n} pad={pad} eps={eps} scale={scale} "
          f"(CUTE_KERNELS_SEED={RUN_SEED})")
    _check(buf, q, k, wq, wk, eps, qd, kd, n)
