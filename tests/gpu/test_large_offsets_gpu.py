"""GPU tests of inputs whose elements lie far apart in memory: the kernels' address arithmetic at and past
32-bit element offsets.

Each input is a view with few rows but a huge row (or batch) stride over one shared storage, so that its last
element sits 2**31 - 1 to ~2**32 elements (4-9 GB) after its first while the math stays small; and for the ranker
attention, compact problems past 2**31 elements (q of 2.15e9 elements, fixed length and packed) against the same
problem split into calls below it.  The contract tested: an input the argument checks accept gives the same bits
as the same call on compact copies (the kernels' schedules do not depend on strides) or split into smaller calls;
an input past what a kernel can address is refused with ``ValueError`` before any launch.  The ranker kernels
take 64-bit strides (session 54; until then they refused spans of 2**31 elements or more, and past that their
address arithmetic faulted); ``qk_rmsnorm_``, ``hc_mix_sinkhorn``'s hc_fn and its walk method, and ``scale`` keep
32-bit offsets and refuse.

Device memory: each test holds its large buffers (4-60 GB) only inside :func:`run_locked`, which lets one test of
this file at a time do so across processes (``gpu_run.sh --jobs``, pytest-xdist) and returns them to the driver
before the next; the compact references (which compile the kernels) run before it, in parallel.
"""

import fcntl
import gc
import os
import tempfile
import traceback

import pytest
import torch
from seeding import generator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

import cute_kernels  # noqa: E402
from cute_kernels.kernels import ranker_bwd as rb  # noqa: E402
from cute_kernels.runtime.validate import element_span as span_of  # noqa: E402  (first to last element)

INT32_MAX = 2**31 - 1


def run_locked(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` while this process holds the file's device-memory lock (one test of this file at a
    time across processes); ``fn``'s buffers die with its frame (a failure's frames cleared too) and go back to the
    driver (``empty_cache``) before the lock is released.  ``fn`` returns nothing large."""
    with open(os.path.join(tempfile.gettempdir(), "cute_kernels_large_offsets.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            traceback.clear_frames(exc.__traceback__)  # (the message is formed; the frames' tensors go)
            raise
        finally:
            gc.collect()
            torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _release_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def far_copies(tensors, span: int):
    """Copies of the same-shaped ``tensors`` as views over one storage, their dim-0 stride the largest multiple of
    16 bytes for which each view's elements span at most ``span`` (first to last, inclusive), interleaved (view i's
    row r at ``r * stride + i * row``).  The storage between the rows is left uninitialized."""
    t0 = tensors[0]
    rows, inner = t0.shape[0], tuple(t0.shape[1:])
    row = t0[0].numel()
    vec = 16 // t0.element_size()
    stride = (span - row) // (rows - 1) // vec * vec
    assert stride >= len(tensors) * row, "span too small for the rows"
    buf = torch.empty((rows - 1) * stride + len(tensors) * row, dtype=t0.dtype, device="cuda")
    inner_strides = torch.empty(inner).stride()
    views = []
    for i, t in enumerate(tensors):
        view = buf.as_strided((rows, *inner), (stride, *inner_strides), storage_offset=i * row)
        view.copy_(t)
        views.append(view)
    return views


def randn(*shape, seed: int, dtype=torch.bfloat16):
    return torch.randn(shape, generator=generator(seed, "cuda"), device="cuda", dtype=torch.float32).to(dtype)


# ---------------------------------------------------------------- ranker attention


def _ranker_problem(varlen: bool, seed: int, hq: int = 2, hkv: int = 2, d: int = 128):
    """Compact q, k, v, dout: fixed length [B=2, 300, H, D] or packed [227, H, D] (two sequences), bounds with odd
    history / candidate lengths, and the call's keyword arguments."""
    if varlen:
        lens = [150, 77]
        kw = dict(cu_seqlens=torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32, device="cuda"),
                  max_seqlen=max(lens))
        bounds = torch.tensor([[0, 120, 120, 150], [0, 70, 70, 77]], dtype=torch.int32, device="cuda")
        lead = (sum(lens),)
    else:
        kw = {}
        bounds = torch.tensor([[0, 257, 257, 300], [3, 200, 210, 290]], dtype=torch.int32, device="cuda")
        lead = (2, 300)
    q, dout = randn(*lead, hq, d, seed=seed), randn(*lead, hq, d, seed=seed + 1)
    k, v = randn(*lead, hkv, d, seed=seed + 2), randn(*lead, hkv, d, seed=seed + 3)
    return (q, k, v, dout), bounds, kw


def _check_far_ranker(varlen: bool, span: int, seed: int, cap=None, hq: int = 2, hkv: int = 2, d: int = 128,
                      modes=(True, False)):
    """The forward and the backward (deterministic mode True / False in ``modes``) on far copies of a small problem
    against the same calls on its compact tensors: bit for bit, except the default mode's float32 reduce-adds
    (another order: an ulp or so of the input dtype)."""
    (q, k, v, dout), bounds, kw = _ranker_problem(varlen, seed, hq, hkv, d)
    o, lse = cute_kernels.ranker_attention(q, k, v, bounds, cap=cap, return_lse=True, **kw)
    refs = {det: rb.ranker_attention_backward(q, k, v, o, lse, dout, bounds, cap=cap, deterministic=det, **kw)
            for det in modes}

    def far():
        fq, fo, fdout = far_copies([q, o, dout], span)
        fk, fv = far_copies([k, v], span)
        assert min(span_of(t) for t in (fq, fk)) > span - 2 * fq[0].numel() - 8 * fq.shape[0]
        got_o, got_lse = cute_kernels.ranker_attention(fq, fk, fv, bounds, cap=cap, return_lse=True, **kw)
        torch.cuda.synchronize()
        assert torch.equal(got_o, o)
        assert torch.equal(got_lse, lse)
        for det in modes:
            grads = rb.ranker_attention_backward(fq, fk, fv, fo, lse, fdout, bounds, cap=cap, deterministic=det, **kw)
            torch.cuda.synchronize()
            _assert_grads_agree(grads, refs[det], bitwise=det)

    run_locked(far)


def _assert_grads_agree(grads, ref, bitwise: bool):
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert not g.isnan().any(), name
        if bitwise:
            assert torch.equal(g, r), name
        else:  # (the default mode's float32 reduce-adds in another order: an ulp or so of the input dtype; in
            # slices of dim 0, not float32 copies of 2e9-element tensors)
            n = max(1, g.shape[0] // 16)
            err = max((a.float() - b.float()).abs().max().item() for a, b in zip(g.split(n), r.split(n)))
            assert err <= 2e-2 * r.abs().max().float().item(), (name, err)


@pytest.mark.parametrize("varlen", [False, True])
def test_ranker_at_the_32bit_limit(varlen):
    """q, k, v, out, dout spanning 2**31 - 1 elements (less a few rows; the argument checks' limit until session
    54, byte offsets near 2**32): the same output, LSE and gradients as compact copies."""
    _check_far_ranker(varlen, INT32_MAX, seed=1, cap=30.0)


@pytest.mark.parametrize("varlen,cap,hq,hkv,d", [(False, None, 4, 4, 128), (True, 50.0, 4, 4, 128),
                                                  (False, 50.0, 4, 1, 64), (True, None, 4, 1, 64),
                                                  (False, 50.0, 4, 2, 256), (True, None, 2, 2, 256)],
                         ids=["fixed-d128", "packed-d128-tanh", "fixed-gqa4-d64-tanh", "packed-gqa4-d64",
                              "fixed-gqa2-d256-tanh", "packed-d256"])
def test_ranker_past_the_32bit_limit(varlen, cap, hq, hkv, d):
    """q, k, v, out, dout spanning ~2**32 elements (element offsets past 2**31, byte offsets past 2**33): the same
    output, LSE and gradients as compact copies, both backward modes; the GQA cases run one query head per CTA
    with float32 dK/dV accumulators (the host's pick for so few CTAs).  Until session 54 the forward faulted
    here.  (The D=256 rows, the backward's head-dim split schedule, were added in session 55 without a GPU run.)"""
    _check_far_ranker(varlen, 2**32 + 2**20, seed=3, cap=cap, hq=hq, hkv=hkv, d=d)


def _assert_split_calls_agree(q, k, v, dout, bounds, pieces, **kw):
    """The forward and the deterministic backward of the whole problem against ``pieces`` calls (each a tuple of
    the token-major tensors' slice, bounds' slice, extra kwargs, and the LSE's part), bit for bit; returns the
    whole problem's out, lse and gradients."""
    o, lse = cute_kernels.ranker_attention(q, k, v, bounds, return_lse=True, **kw)
    grads = rb.ranker_attention_backward(q, k, v, o, lse, dout, bounds, deterministic=True, **kw)
    for rows, brows, extra, lse_of in pieces:
        po, plse = cute_kernels.ranker_attention(q[rows], k[rows], v[rows], bounds[brows], return_lse=True, **extra)
        assert torch.equal(o[rows], po), rows
        assert torch.equal(lse_of(lse), plse), rows
        pg = rb.ranker_attention_backward(q[rows], k[rows], v[rows], po, plse, dout[rows], bounds[brows],
                                          deterministic=True, **extra)
        for name, g, r in zip(("dq", "dk", "dv"), grads, pg):
            assert torch.equal(g[rows], r), (name, rows)
        del po, plse, pg
    torch.cuda.synchronize()
    return o, lse, grads


def test_ranker_compact_problem_past_2_31_elements():
    """B=228, 4096 + 512 tokens, 16 heads, D=128: q, k, v, out, dq, dk, dv of 2.15e9 elements each and a float32
    dQ accumulator past 2**31 too; per-row bounds of two kinds.  Bit for bit the same as four calls of 57 rows."""
    b, s, h, d = 228, 4608, 16, 128
    bounds = torch.tensor([[0, 4096, 4096, 4608]] * b, dtype=torch.int32, device="cuda")
    bounds[1::3] = torch.tensor([0, 3000, 3001, 4600], dtype=torch.int32)
    pieces = [(slice(i, i + 57), slice(i, i + 57), {}, lambda lse, i=i: lse[i:i + 57]) for i in range(0, b, 57)]

    def big():
        q, k, v, dout = (randn(b, s, h, d, seed=13 + i) for i in range(4))
        assert q.numel() > 2**31
        o, lse, grads = _assert_split_calls_agree(q, k, v, dout, bounds, pieces)
        # the default mode (the dQ accumulator zeroed by the mainloop's KV blocks, reduce-adds in any order)
        _assert_grads_agree(rb.ranker_attention_backward(q, k, v, o, lse, dout, bounds, deterministic=False), grads,
                            bitwise=False)

    run_locked(big)


def test_ranker_packed_problem_past_2_31_elements():
    """256 packed sequences of 3000-5999 tokens (1.16e6 tokens x 16 heads x 128: 2.4e9 elements), per-sequence
    bounds: bit for bit the same as four calls of 64 sequences each (cu_seqlens rebased)."""
    h, d, nseq = 16, 128, 256
    g = generator(14, "cuda")
    lens = torch.randint(3000, 6000, (nseq,), generator=g, device="cuda")
    cu = torch.zeros(nseq + 1, dtype=torch.int32, device="cuda")
    cu[1:] = lens.cumsum(0)
    total = int(cu[-1])
    assert total * h * d > 2**31
    hist = (lens * 7 // 8).int()
    bounds = torch.stack([torch.zeros_like(hist), hist, hist, lens.int()], 1).to(torch.int32).contiguous()
    max_seqlen = int(lens.max())
    pieces = []
    for i in range(0, nseq, 64):
        lo, hi = int(cu[i]), int(cu[i + 64])
        extra = dict(cu_seqlens=(cu[i:i + 65] - lo).contiguous(), max_seqlen=max_seqlen)
        pieces.append((slice(lo, hi), slice(i, i + 64), extra, lambda lse, lo=lo, hi=hi: lse[:, lo:hi]))

    def big():
        q, k, v, dout = (randn(total, h, d, seed=14 + i) for i in range(4))
        _assert_split_calls_agree(q, k, v, dout, bounds, pieces, cu_seqlens=cu, max_seqlen=max_seqlen)

    run_locked(big)


# ---------------------------------------------------------------- Q/K RMSNorm


def _qk_args(seed: int):
    q, k = randn(64, 4096, seed=seed), randn(64, 4096, seed=seed + 1)
    w = randn(4096 + 1024, seed=seed + 2)
    return q, k, w[:4096], w[4096:]


def test_qk_rmsnorm_at_the_32bit_limit():
    """q, k [N=64, 4096 / 1024] rows ~2**31 / 64 elements apart (q spans 2**31 - 1 elements, less a row): the same
    bits as compact copies."""
    q, k, wq, wk = _qk_args(4)
    qc, kc = q.clone(), k[:, :1024].clone()
    cute_kernels.qk_rmsnorm_(qc, kc, wq, wk, 1e-6)

    def far():
        fq, fk = far_copies([q, k], INT32_MAX)
        fk = fk[:, :1024]
        assert span_of(fq) > INT32_MAX - 8192
        cute_kernels.qk_rmsnorm_(fq, fk, wq, wk, 1e-6)
        torch.cuda.synchronize()
        assert torch.equal(fq, qc)
        assert torch.equal(fk, kc)

    run_locked(far)


def test_qk_rmsnorm_past_the_32bit_limit_is_refused():
    q, k, wq, _ = _qk_args(6)

    def far():
        fq, fk = far_copies([q, k], INT32_MAX + 8192)
        assert span_of(fq) > INT32_MAX
        with pytest.raises(ValueError, match="32-bit"):
            cute_kernels.qk_rmsnorm_(fq, fk, wq, wq, 1e-6)
        assert torch.equal(fq, q)

    run_locked(far)


# ---------------------------------------------------------------- mHC mix + Sinkhorn


def _hc_params(k: int, seed: int):
    return randn(24, k, seed=seed, dtype=torch.float32) * 0.01, randn(3, seed=seed + 1, dtype=torch.float32).abs() + 0.5, \
        randn(24, seed=seed + 2, dtype=torch.float32) * 0.1


@pytest.mark.parametrize("method", ["tma", "walk"])
@pytest.mark.parametrize("span", [INT32_MAX, 2**31 + 2**20, 2**32 + 2**20])
def test_hc_mix_far_apart_rows(method, span):
    """x [M=64, K=20480] with rows ~span / 64 elements apart (padded rows, e.g. a slice of a wider buffer): the
    same bits as a compact copy; the walk method refuses x past 2**31 elements (ValueError before any launch)."""
    k = 20480
    x = randn(64, k, seed=7)
    hc_fn, hc_scale, hc_base = _hc_params(k, seed=8)
    ref = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)

    def far():
        (fx,) = far_copies([x], span)
        assert span_of(fx) > span - 64 * 8 - k
        if method == "walk" and span_of(fx) > INT32_MAX:  # the walk's 32-bit offsets; the TMA method takes any x
            with pytest.raises(ValueError, match="32-bit"):
                cute_kernels.hc_mix_sinkhorn(fx, hc_fn, hc_scale, hc_base, method=method)
            return
        got = cute_kernels.hc_mix_sinkhorn(fx, hc_fn, hc_scale, hc_base, method=method)
        torch.cuda.synchronize()
        for name, a, b in zip(("pre", "post", "comb"), got, ref):
            assert torch.equal(a, b), name

    run_locked(far)


@pytest.mark.parametrize("method", ["tma", "walk"])
def test_hc_mix_hc_fn_at_the_32bit_limit(method):
    """hc_fn [24, K] float32 with its rows ~2**31 / 23 elements apart, spanning 2**31 - 1 elements (less a row)."""
    k = 2048
    hc_fn, hc_scale, hc_base = _hc_params(k, seed=9)
    x = randn(40, k, seed=11)
    ref = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)

    def far():
        (f_fn,) = far_copies([hc_fn], INT32_MAX)
        assert span_of(f_fn) > INT32_MAX - 2 * k
        got = cute_kernels.hc_mix_sinkhorn(x, f_fn, hc_scale, hc_base, method=method)
        torch.cuda.synchronize()
        for name, a, b in zip(("pre", "post", "comb"), got, ref):
            assert torch.equal(a, b), name

    run_locked(far)


# ---------------------------------------------------------------- scale


def test_scale_at_the_32bit_limit():
    """The largest x the kernel takes (2**31 - 8 bf16 elements, 4 GB): every element scaled, the last ones too."""
    cute_kernels.scale(torch.ones(64, device="cuda", dtype=torch.bfloat16), 3.0)  # (compiles outside the lock)

    def big():
        x = torch.full((2**31 - 8,), 1.5, dtype=torch.bfloat16, device="cuda")
        x[-4096:] = randn(4096, seed=12)
        y = cute_kernels.scale(x, 3.0)
        torch.cuda.synchronize()
        assert torch.equal(y[-4096:], (x[-4096:].float() * 3.0).to(torch.bfloat16))
        assert bool((y[:-4096] == 4.5).all())

    run_locked(big)
