"""GPU tests of inputs whose elements lie far apart in memory: the kernels' address arithmetic at and past
32-bit element offsets.

Each input is a view with few rows but a huge row (or batch) stride over one shared storage, so that its last
element sits 2**31 - 1 to ~2**32 elements (4-9 GB) after its first while the math stays small; and for the ranker
attention, compact problems past 2**31 elements (q of 2.15e9 elements, fixed length and packed) against the same
problem split into calls below it.  The contract tested: an input the argument checks accept gives the same bits
as the same call on compact copies (the kernels' schedules do not depend on strides) or split into smaller calls;
an input past what a kernel can address is refused with ``ValueError`` before any launch.  The ranker kernels
take 64-bit strides (session 54; until then they refused spans of 2**31 elements or more, and past that their
address arithmetic faulted); ``qk_rmsnorm_``, ``hc_mix_sinkhorn``'s hc_fn and its walk method keep 32-bit
offsets and refuse.  Storage: up to ~50 GB of device memory per test, freed after it.
"""

import gc

import pytest
import torch
from seeding import generator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

import cute_kernels  # noqa: E402
from cute_kernels.kernels import ranker_bwd as rb  # noqa: E402

INT32_MAX = 2**31 - 1


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def far_views(rows: int, inner: tuple, n: int, dtype, span: int, seed: int):
    """``n`` views of shape ``(rows, *inner)`` (``inner`` compact) over one storage, their row stride the
    largest multiple of 16 bytes for which each view's elements span at most ``span`` (first to last,
    inclusive), the n views interleaved (view i's row r at ``r * stride + i * row``).  Rows filled with random
    values; the storage between them is left uninitialized."""
    row = 1
    for d in inner:
        row *= d
    vec = 16 // torch.empty((), dtype=dtype).element_size()
    stride = (span - row) // (rows - 1) // vec * vec
    assert stride >= n * row, "span too small for the rows"
    buf = torch.empty((rows - 1) * stride + n * row, dtype=dtype, device="cuda")
    inner_strides = torch.empty(inner).stride()
    g = generator(seed, "cuda")
    views = []
    for i in range(n):
        t = buf.as_strided((rows, *inner), (stride, *inner_strides), storage_offset=i * row)
        t.copy_(torch.randn((rows, *inner), generator=g, device="cuda", dtype=torch.float32).to(dtype))
        views.append(t)
    return views


def span_of(t: torch.Tensor) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))


# ---------------------------------------------------------------- ranker attention


def _ranker_inputs(varlen: bool, span: int, seed: int, n: int = 3):
    """q, k, v (+ ``n - 3`` more tensors like q) far apart: fixed length [B=2, S, H, D] with a huge batch stride,
    or packed [T, H, D] with a huge row stride; the bounds give odd history / candidate lengths."""
    h, d = 2, 128
    if varlen:
        lens = [150, 77]
        views = far_views(sum(lens), (h, d), n, torch.bfloat16, span, seed)
        cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32, device="cuda")
        bounds = torch.tensor([[0, 120, 120, 150], [0, 70, 70, 77]], dtype=torch.int32, device="cuda")
        return views, bounds, dict(cu_seqlens=cu, max_seqlen=max(lens))
    s = 300
    views = far_views(2, (s, h, d), n, torch.bfloat16, span, seed)
    bounds = torch.tensor([[0, 257, 257, 300], [3, 200, 210, 290]], dtype=torch.int32, device="cuda")
    return views, bounds, {}


@pytest.mark.parametrize("varlen", [False, True])
def test_ranker_forward_at_the_32bit_limit(varlen):
    """q, k, v spanning exactly 2**31 - 1 elements (the argument checks' limit; byte offsets near 2**32): the
    same output and LSE, bit for bit, as compact copies."""
    (q, k, v), bounds, kw = _ranker_inputs(varlen, INT32_MAX, seed=1)
    assert max(span_of(t) for t in (q, k, v)) > INT32_MAX - 4096
    out, lse = cute_kernels.ranker_attention(q, k, v, bounds, cap=30.0, return_lse=True, **kw)
    ref_out, ref_lse = cute_kernels.ranker_attention(q.contiguous(), k.contiguous(), v.contiguous(), bounds,
                                                     cap=30.0, return_lse=True, **kw)
    torch.cuda.synchronize()
    assert torch.equal(out, ref_out)
    assert torch.equal(lse, ref_lse)


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("deterministic", [True, False])
def test_ranker_backward_at_the_32bit_limit(varlen, deterministic):
    """q, k, v, out, dout spanning exactly 2**31 - 1 elements: the same gradients as compact copies (bit for bit
    in the deterministic mode; within float32 reduce-add reordering in the default one)."""
    (q, k, v, out, dout), bounds, kw = _ranker_inputs(varlen, INT32_MAX, seed=2, n=5)
    o, lse = cute_kernels.ranker_attention(q, k, v, bounds, return_lse=True, **kw)
    out.copy_(o)
    grads = rb.ranker_attention_backward(q, k, v, out, lse, dout, bounds, deterministic=deterministic, **kw)
    ref = rb.ranker_attention_backward(q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous(), lse,
                                       dout.contiguous(), bounds, deterministic=deterministic, **kw)
    torch.cuda.synchronize()
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert not g.isnan().any(), name
        if deterministic:
            assert torch.equal(g, r), name
        else:
            torch.testing.assert_close(g, r, rtol=2e-2, atol=2e-2 * r.abs().max().item(), msg=name)


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("cap", [None, 50.0])
def test_ranker_past_the_32bit_limit(varlen, cap):
    """q, k, v, out, dout spanning ~2**32 elements (element offsets past 2**31, byte offsets past 2**33): the same
    output, LSE and (deterministic) gradients as compact copies.  Until session 54 the forward faulted here."""
    (q, k, v, out, dout), bounds, kw = _ranker_inputs(varlen, 2**32 + 2**20, seed=3, n=5)
    assert span_of(q) > 2**32
    o, lse = cute_kernels.ranker_attention(q, k, v, bounds, cap=cap, return_lse=True, **kw)
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    ref_o, ref_lse = cute_kernels.ranker_attention(qc, kc, vc, bounds, cap=cap, return_lse=True, **kw)
    torch.cuda.synchronize()
    assert torch.equal(o, ref_o)
    assert torch.equal(lse, ref_lse)
    out.copy_(o)
    grads = rb.ranker_attention_backward(q, k, v, out, lse, dout, bounds, cap=cap, deterministic=True, **kw)
    ref = rb.ranker_attention_backward(qc, kc, vc, o, lse, dout.contiguous(), bounds, cap=cap, deterministic=True,
                                       **kw)
    torch.cuda.synchronize()
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert torch.equal(g, r), name


def _assert_split_calls_agree(q, k, v, dout, bounds, pieces, **kw):
    """The forward and the deterministic backward of the whole problem against ``pieces`` calls (each a list of
    (slice of the token-major tensors, slice of bounds, extra kwargs)), bit for bit."""
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


def test_ranker_compact_problem_past_2_31_elements():
    """B=228, 4096 + 512 tokens, 16 heads, D=128: q, k, v, out, dq, dk, dv of 2.15e9 elements each and a float32
    dQ accumulator past 2**31 too; per-row bounds of two kinds.  Bit for bit the same as four calls of 57 rows."""
    b, s, h, d = 228, 4608, 16, 128
    g = generator(13, "cuda")
    q, k, v, dout = (torch.randn(b, s, h, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    assert q.numel() > 2**31
    bounds = torch.tensor([[0, 4096, 4096, 4608]] * b, dtype=torch.int32, device="cuda")
    bounds[1::3] = torch.tensor([0, 3000, 3001, 4600], dtype=torch.int32)
    pieces = [(slice(i, i + 57), slice(i, i + 57), {}, lambda lse, i=i: lse[i:i + 57]) for i in range(0, b, 57)]
    _assert_split_calls_agree(q, k, v, dout, bounds, pieces)


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
    q, k, v, dout = (torch.randn(total, h, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    max_seqlen = int(lens.max())
    pieces = []
    for i in range(0, nseq, 64):
        lo, hi = int(cu[i]), int(cu[i + 64])
        extra = dict(cu_seqlens=(cu[i:i + 65] - lo).contiguous(), max_seqlen=max_seqlen)
        pieces.append((slice(lo, hi), slice(i, i + 64), extra, lambda lse, lo=lo, hi=hi: lse[:, lo:hi]))
    _assert_split_calls_agree(q, k, v, dout, bounds, pieces, cu_seqlens=cu, max_seqlen=max_seqlen)


# ---------------------------------------------------------------- Q/K RMSNorm


def test_qk_rmsnorm_at_the_32bit_limit():
    """q, k [N=64, 4096 / 1024] rows ~2**31 / 64 elements apart (q spans exactly 2**31 - 1): the same bits as
    compact copies."""
    n = 64
    q, k = far_views(n, (4096,), 2, torch.bfloat16, INT32_MAX, seed=4)
    k = k[:, :1024]
    assert span_of(q) > INT32_MAX - 8192
    w = torch.randn(4096 + 1024, generator=generator(5, "cuda"), device="cuda").to(torch.bfloat16)
    qc, kc = q.clone(), k.clone()
    cute_kernels.qk_rmsnorm_(q, k, w[:4096], w[4096:], 1e-6)
    cute_kernels.qk_rmsnorm_(qc, kc, w[:4096], w[4096:], 1e-6)
    torch.cuda.synchronize()
    assert torch.equal(q, qc)
    assert torch.equal(k, kc)


def test_qk_rmsnorm_past_the_32bit_limit_is_refused():
    q, k = far_views(64, (4096,), 2, torch.bfloat16, INT32_MAX + 8192, seed=6)
    assert span_of(q) > INT32_MAX
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    before = q.clone()
    with pytest.raises(ValueError):
        cute_kernels.qk_rmsnorm_(q, k, w, w, 1e-6)
    assert torch.equal(q, before)


# ---------------------------------------------------------------- mHC mix + Sinkhorn


def _hc_params(k: int, seed: int):
    g = generator(seed, "cuda")
    hc_fn = torch.randn(24, k, generator=g, device="cuda") * 0.01
    hc_scale = torch.rand(3, generator=g, device="cuda") + 0.5
    hc_base = torch.randn(24, generator=g, device="cuda") * 0.1
    return hc_fn, hc_scale, hc_base


@pytest.mark.parametrize("method", ["tma", "walk"])
@pytest.mark.parametrize("span", [INT32_MAX, 2**31 + 2**20, 2**32 + 2**20])
def test_hc_mix_far_apart_rows(method, span):
    """x [M=64, K=20480] with rows ~span / 64 elements apart (padded rows, e.g. a slice of a wider buffer): the
    same bits as a compact copy; the walk method refuses x past 2**31 elements (ValueError before any launch)."""
    k = 20480
    (x,) = far_views(64, (k,), 1, torch.bfloat16, span, seed=7)
    hc_fn, hc_scale, hc_base = _hc_params(k, seed=8)
    ref = cute_kernels.hc_mix_sinkhorn(x.contiguous(), hc_fn, hc_scale, hc_base, method=method)
    if method == "walk" and span_of(x) > INT32_MAX:  # the walk's 32-bit offsets; the TMA method takes any x
        with pytest.raises(ValueError, match="32-bit"):
            cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
        return
    got = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    torch.cuda.synchronize()
    for name, a, b in zip(("pre", "post", "comb"), got, ref):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("method", ["tma", "walk"])
def test_hc_mix_hc_fn_at_the_32bit_limit(method):
    """hc_fn [24, K] float32 with its rows ~2**31 / 23 elements apart, spanning exactly 2**31 - 1 elements."""
    k = 2048
    (hc_fn,) = far_views(24, (k,), 1, torch.float32, INT32_MAX, seed=9)
    hc_fn.mul_(0.01)
    _, hc_scale, hc_base = _hc_params(k, seed=10)
    x = torch.randn(40, k, generator=generator(11, "cuda"), device="cuda").to(torch.bfloat16)
    got = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    ref = cute_kernels.hc_mix_sinkhorn(x, hc_fn.contiguous(), hc_scale, hc_base, method=method)
    torch.cuda.synchronize()
    for name, a, b in zip(("pre", "post", "comb"), got, ref):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------- scale


def test_scale_at_the_32bit_limit():
    """The largest x the kernel takes (2**31 - 8 bf16 elements, 4 GB): every element scaled, the last ones too."""
    n = 2**31 - 8
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    x.fill_(1.5)
    x[-4096:] = torch.randn(4096, generator=generator(12, "cuda"), device="cuda").to(torch.bfloat16)
    y = cute_kernels.scale(x, 3.0)
    torch.cuda.synchronize()
    assert torch.equal(y[-4096:], (x[-4096:].float() * 3.0).to(torch.bfloat16))
    assert bool((y[:-4096] == 4.5).all())
