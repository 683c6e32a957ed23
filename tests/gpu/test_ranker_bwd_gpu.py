"""GPU tests of the ranker attention backward (issue 4) against float64 reference gradients (H200).

Written without GPU access: the first GPU session runs them (see the report of issue 4).  Each case:
fresh random bf16/fp16 inputs, our forward (out, lse), our backward into NaN-poisoned dq/dk/dv, compared
with the float64 autograd reference; the tolerance is FlashAttention's: twice the error of the same
reference computed in the input dtype, plus 1e-3 (and 1% of the largest gradient as a floor).
"""

import itertools

import pytest
import torch
from seeding import generator
from side_stream import run_behind_a_sleep
from test_ranker_fwd_gpu import HUGE_SOFT_SIGN, huge_soft_sign_inputs
from test_ranker_fwd_gpu import _check as check_forward

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

import cute_kernels  # noqa: E402,F401
from cute_kernels.kernels import ranker_bwd as rb  # noqa: E402
from cute_kernels.kernels import ranker_bwd_buffers as buffers  # noqa: E402
from cute_kernels.kernels import ranker_fwd as rf  # noqa: E402


def _tensors(shape_q, shape_kv, dtype=torch.bfloat16, seed=0):
    g = generator(seed)
    mk = lambda shape: torch.randn(*shape, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    return mk(shape_q), mk(shape_kv), mk(shape_kv), mk(shape_q)


def _compare(name, q, k, v, do, bounds, cap=None, cap_method="tanh", cu_seqlens=None, max_seqlen=None, scale=None,
             config=None):
    kw = dict(softmax_scale=scale, cap=cap, cap_method=cap_method, cu_seqlens=cu_seqlens)
    out, lse = rf.ranker_attention(q, k, v, bounds, return_lse=True, max_seqlen=max_seqlen, **kw)
    # (compact, as the explicit API wants its dq / dk / dv, whatever the layout of q, k, v)
    poison = lambda t: torch.full(t.shape, float("nan"), device=t.device, dtype=t.dtype)  # noqa: E731
    dq, dk, dv = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, max_seqlen=max_seqlen, dq=poison(q),
                                              dk=poison(k), dv=poison(v), config=config, **kw)
    torch.cuda.synchronize()
    ref = rb.ranker_attention_backward_reference(q, k, v, bounds, do, **kw)
    low = rb.ranker_attention_backward_reference(q, k, v, bounds, do, compute_dtype=q.dtype, **kw)
    # the float64 gradients given the kernel's own (bf16) out: what the forward's rounding of O does to them.
    # That allowance is only as small as out's error: hold out to the forward tests' bar first
    check_forward(f"{name} (forward)", out, lse, q, k, v, bounds, cap, cap_method, cu_seqlens, scale)
    given_out = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, out=out, **kw)
    for gname, a, r, lo, ro in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low, given_out):
        if cu_seqlens is not None:  # packed tokens past cu_seqlens[-1] belong to no sequence: zero
            end = int(cu_seqlens[-1])
            assert (a[end:] == 0).all(), f"{name}: {gname} not zero past cu_seqlens[-1]"
        assert not torch.isnan(a).any(), f"{name}: NaN in {gname} (unwritten rows?)"
        err = (a.double() - r).abs().max().item() if a.numel() else 0.0
        base = (lo.double() - r).abs().max().item() if a.numel() else 0.0
        tol = rb.grad_tolerance(r, lo, ro)
        print(f"[ranker_bwd] {name} {gname}: max|err|={err:.3e} ({q.dtype} ref {base:.3e}, tol {tol:.3e})")
        assert err <= tol, f"{name}: {gname} error {err} > {tol}"
    return dq, dk, dv


CASES = [  # name, B, S, Hq, Hkv, D, bounds, cap, cap_method, dtype
    ("headline-small", 2, 700, 4, 4, 128, [[0, 517, 517, 700], [37, 400, 450, 611]], None, "tanh", torch.bfloat16),
    ("d64", 2, 700, 4, 4, 64, [[0, 517, 517, 700], [37, 400, 450, 611]], None, "tanh", torch.bfloat16),
    ("gqa2-d64-odd", 2, 389, 4, 2, 64, [[7, 263, 263, 389], [0, 129, 129, 257]], None, "tanh", torch.bfloat16),
    ("gqa4-tanh", 2, 333, 8, 2, 128, [[0, 200, 200, 333], [5, 129, 130, 300]], 30.0, "tanh", torch.bfloat16),
    ("gqa2-d64-softsign", 1, 301, 4, 2, 64, [[0, 250, 250, 301]], 5.0, "soft_sign", torch.bfloat16),
    ("softsign-fp16", 1, 300, 2, 1, 128, [[0, 250, 250, 300]], 5.0, "soft_sign", torch.float16),
    ("tanh-small-cap", 1, 260, 2, 2, 64, [[3, 131, 131, 260]], 2.0, "tanh", torch.bfloat16),
    ("empty-history", 2, 300, 2, 2, 128, [[0, 0, 0, 300], [10, 10, 100, 200]], None, "tanh", torch.bfloat16),
    ("empty-candidates", 1, 300, 2, 2, 128, [[0, 300, 300, 300]], None, "tanh", torch.bfloat16),
    ("cand-before-hist", 1, 520, 2, 2, 128, [[200, 500, 0, 150]], None, "tanh", torch.bfloat16),
    ("out-of-range", 2, 400, 2, 2, 128, [[-5, 1000, 900, 2000], [350, 9999, -7, 20]], None, "tanh", torch.bfloat16),
    ("overlap", 1, 400, 2, 2, 128, [[0, 300, 200, 400]], None, "tanh", torch.bfloat16),
    ("gap-tiles", 1, 1000, 2, 2, 128, [[0, 70, 900, 1000]], 20.0, "tanh", torch.bfloat16),
    ("one-row", 1, 1, 2, 2, 128, [[0, 1, 0, 1]], None, "tanh", torch.bfloat16),
    ("all-empty", 2, 130, 2, 2, 128, [[5, 5, 9, 9], [0, 0, 0, 0]], None, "tanh", torch.bfloat16),
    ("hist-one-block", 3, 200, 2, 2, 128, [[0, 64, 64, 200], [1, 2, 2, 3], [100, 101, 101, 199]], None, "tanh",
     torch.bfloat16),
    ("odd-lengths-gqa", 2, 389, 6, 3, 128, [[7, 263, 263, 389], [0, 129, 129, 257]], 15.0, "tanh", torch.bfloat16),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_fixed_length(case):
    name, b, s, hq, hkv, d, rows, cap, capm, dtype = case
    q, k, v, do = _tensors((b, s, hq, d), (b, s, hkv, d), dtype)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    _compare(name, q, k, v, do, bounds, cap, capm)


@pytest.mark.parametrize("cap,hkv,varlen", [(None, 2, False), (20.0, 2, False), (None, 1, False), (None, 2, True)])
def test_skip_key_bias_same_bits(cap, hkv, varlen):
    """skip_key_bias (KV blocks wholly inside the history leave out the key-mask bias add): the same bits
    as with the add, in the deterministic mode; history starts and ends inside blocks and on block edges,
    candidates before and after it; MHA, GQA (a group per CTA at this size) and packed sequences."""
    q, k, v, do = _tensors((2, 700, 2, 128), (2, 700, hkv, 128), seed=5)
    rows = [[37, 517, 517, 700], [128, 384, 0, 100]]
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    kw = dict(cap=cap)
    if varlen:  # two packed sequences of 700 and 555 tokens (the second starts mid-block)
        q, k, v, do = (t.reshape(1400, *t.shape[2:])[:1255] for t in (q, k, v, do))
        kw.update(cu_seqlens=torch.tensor([0, 700, 1255], device="cuda", dtype=torch.int32), max_seqlen=700)
    out, lse = rf.ranker_attention(q, k, v, bounds, return_lse=True, **kw)
    base = rb.dataclasses.replace(rb.config_for(128, cap is not None), deterministic=True)
    a, b = (rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, config=rb.dataclasses.replace(
        base, skip_key_bias=skb), **kw) for skb in (False, True))
    for name, x, y in zip(("dq", "dk", "dv"), a, b):
        assert torch.equal(x, y), f"{name}: skip_key_bias changed the bits"
    _compare(f"skip-key-bias-cap{cap}-hkv{hkv}-varlen{varlen}", q, k, v, do, bounds, **kw)


@pytest.mark.parametrize("d,hkv,varlen", [(128, 4, False), (64, 2, False), (128, 2, True)])
def test_soft_sign_saturates_where_the_scaled_score_overflows(d, hkv, varlen):
    """The backward of the forward test of that name: with the cap at 2**-126, ``softmax_scale * q.k / cap``
    overflows to +-inf; the capped score is +-cap and its slope 0 (dQ = dK = 0 up to the candidates' tiny
    terms, dV = P^T dO of a near-uniform P), in the mainloop and in the postprocess's self terms alike, no NaN."""
    q, k, v, do = _tensors((2, 300, 4, d), (2, 300, hkv, d), seed=54)
    q, k = q * 8, k * 8
    bounds = torch.tensor([[0, 200, 200, 300], [3, 131, 131, 290]], device="cuda", dtype=torch.int32)
    kw = dict(cap=2.0**-126, cap_method="soft_sign")
    if varlen:
        q, k, v, do = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v, do))
        kw.update(cu_seqlens=torch.tensor([0, 300, 600], device="cuda", dtype=torch.int32), max_seqlen=300)
    _compare(f"soft_sign-cap-2^-126-d{d}-hkv{hkv}-varlen{varlen}", q, k, v, do, bounds, **kw)


@pytest.mark.parametrize("d", [128, 64])
def test_soft_sign_huge_finite_scaled_scores(d):
    """The backward of the forward test of that name (cap 5, softmax_scale 2**100, about 14% of the x in (2**126,
    2**128)): dv = P^T dO with those keys at their full weight, dq = dk = 0 up to float32 (the slope
    1 / (1 + |x|)^2 is 2**-200 or less at every key), against the float64 reference (bfloat16 torch overflows)."""
    q, k, v, bounds = huge_soft_sign_inputs(d, seed=56)
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype, generator=generator(57))
    kw = HUGE_SOFT_SIGN
    out, lse = rf.ranker_attention(q, k, v, bounds, return_lse=True, **kw)
    got = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, **kw)
    ref = rb.ranker_attention_backward_reference(q, k, v, bounds, do, **kw)
    for name, a, r in zip(("dq", "dk", "dv"), got, ref):
        err = (a.double() - r).abs().max().item()
        assert torch.isfinite(a).all() and err <= 2**-7 * r.abs().max().item() + 1e-2, (name, err)


def test_softmax_scale():
    q, k, v, do = _tensors((1, 300, 2, 128), (1, 300, 2, 128), seed=3)
    bounds = torch.tensor([[0, 200, 200, 300]], device="cuda", dtype=torch.int32)
    _compare("scale", q, k, v, do, bounds, scale=0.05)
    _compare("scale-cap", q, k, v, do, bounds, cap=10.0, scale=0.2)
    # 0 (accepted: uniform attention; dQ = dK = 0) with a history end inside a tile: no NaN
    bounds = torch.tensor([[3, 200, 200, 300]], device="cuda", dtype=torch.int32)
    _compare("scale=0", q, k, v, do, bounds, scale=0.0)


@pytest.mark.parametrize("d,hq,hkv,cap,group", [
    (128, 2, 2, None, None), (64, 4, 2, 20.0, None), (64, 4, 2, None, None), (128, 4, 1, None, None),
    (64, 4, 2, 20.0, True), (128, 4, 1, None, True), (128, 8, 1, 20.0, True), (128, 8, 1, 20.0, False)])
def test_varlen(d, hq, hkv, cap, group):
    """Packed sequences incl. empty, one-token and history-only ones, a packed tail that belongs to no
    sequence, max_seqlen above the longest; GQA as the host picks it (one query head per CTA at this
    size) and forced both ways (``group``), up to a ratio of 8."""
    cfg = None if group is None else rb.dataclasses.replace(rb.config_for(d, cap is not None), gqa_group_per_cta=group)
    lens = [100, 0, 333, 64, 1]
    rows = [[0, 70, 70, 100], [0, 0, 0, 0], [3, 200, 200, 333], [0, 64, 64, 64], [0, 0, 0, 1]]
    total = sum(lens) + 17  # packed tail that belongs to no sequence
    q, k, v, do = _tensors((total, hq, d), (total, hkv, d), seed=1)
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), device="cuda", dtype=torch.int32)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    _compare(f"varlen-d{d}-{hq}/{hkv}", q, k, v, do, bounds, cap, cu_seqlens=cu, config=cfg)
    _compare(f"varlen-d{d}-{hq}/{hkv}-maxlen", q, k, v, do, bounds, cap, cu_seqlens=cu, max_seqlen=400, config=cfg)


def test_gqa_group_picked_by_the_host(monkeypatch):
    """The default config (gqa_group_per_cta=None) takes a group per CTA once the CTAs fill two waves:
    with the SM count patched down to 1, a small GQA call resolves to it, runs it and is right."""
    picked = []
    real = rb.resolve_gqa_group
    monkeypatch.setattr(rb, "resolve_gqa_group", lambda *a: picked.append(real(*a)) or picked[-1])
    monkeypatch.setattr(rb, "sm_count", lambda device: 1)
    q, k, v, do = _tensors((2, 389, 8, 128), (2, 389, 2, 128), seed=14)
    bounds = torch.tensor([[7, 263, 263, 389], [0, 129, 130, 300]], device="cuda", dtype=torch.int32)
    _compare("gqa-auto-group", q, k, v, do, bounds, cap=20.0)
    assert picked and picked[-1].gqa_group_per_cta is True


def test_repeated_calls_agree_closely():
    """The default mode is not bitwise reproducible (float32 reduce-adds in arrival order)."""
    q, k, v, do = _tensors((2, 500, 4, 128), (2, 500, 2, 128), seed=4)
    bounds = torch.tensor([[0, 400, 400, 500], [10, 300, 300, 480]], device="cuda", dtype=torch.int32)
    out, lse = rf.ranker_attention(q, k, v, bounds, return_lse=True)
    a = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds)
    b = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fields", [dict(ds_stages=1, dq_per_wg=False, dq_first=False),
                                    dict(ds_stages=1, dq_first=True), dict(dq_first=True, dk_from_smem=True)],
                         ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("d,hkv,cap,group", [(128, 2, 20.0, False), (128, 2, 20.0, True), (64, 4, None, None)])
def test_sync_variants(fields, d, hkv, cap, group):
    """The mainloop's other synchronisation schedules (one dS^T buffer, one shared dQ hand-off, dK first or
    from smem; session 10 ships two buffers, per-warpgroup hand-off, dQ first at D=128) are still right
    at odd lengths, with and without GQA, and bitwise deterministic in deterministic mode."""
    cfg = rb.dataclasses.replace(rb.config_for(d, cap is not None), gqa_group_per_cta=group, **fields)
    q, k, v, do = _tensors((2, 389, 4, d), (2, 389, hkv, d), seed=8)
    bounds = torch.tensor([[7, 263, 263, 389], [0, 129, 129, 257]], device="cuda", dtype=torch.int32)
    _compare(f"sync-{fields}", q, k, v, do, bounds, cap=cap, config=cfg)
    det = rb.dataclasses.replace(cfg, deterministic=True)
    out, lse = rf.ranker_attention(q, k, v, bounds, cap=cap, return_lse=True)
    a, b = (rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, cap=cap, config=det) for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def _check_config_both_gqa_forms(tag, cfg, d, hkv, cap, varlen, seed):
    """``cfg`` (GQA form forced both ways when Hkv < Hq = 4) against float64 at odd lengths (packed with
    an empty-candidates sequence when ``varlen``), then its deterministic mode bitwise on repeat."""
    if varlen:
        cu = torch.tensor([0, 389, 400, 789], device="cuda", dtype=torch.int32)
        q, k, v, do = _tensors((800, 4, d), (800, hkv, d), seed=seed)
        bounds = torch.tensor([[7, 263, 263, 389], [0, 11, 0, 0], [0, 129, 129, 389]], device="cuda",
                              dtype=torch.int32)
    else:
        cu = None
        q, k, v, do = _tensors((2, 389, 4, d), (2, 389, hkv, d), seed=seed)
        bounds = torch.tensor([[7, 263, 263, 389], [0, 129, 130, 300]], device="cuda", dtype=torch.int32)
    for group in ((True, False) if hkv < 4 else (None,)):
        c = rb.dataclasses.replace(cfg, gqa_group_per_cta=group)
        _compare(f"{tag}-{hkv}-{group}-{varlen}", q, k, v, do, bounds, cap=cap, cu_seqlens=cu, config=c)
    det = rb.dataclasses.replace(cfg, deterministic=True)
    out, lse = rf.ranker_attention(q, k, v, bounds, cap=cap, return_lse=True, cu_seqlens=cu)
    a, b = (rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, cap=cap, cu_seqlens=cu, config=det)
            for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("hkv,varlen,fields", [(4, False, {}), (2, False, {}), (2, True, {}),
                                               (2, False, dict(dq_per_wg=False)), (2, True, dict(dq_split_rows=False))])
def test_dq_split_rows(hkv, varlen, fields):
    """D=64 with 128 q rows per step and dQ = dS K split by q rows between the warpgroups (dq_split_rows,
    shipped since session 14: n64 WGMMAs, each warpgroup reduce-adding its 64 rows; or, without
    dq_per_wg, one hand-off of the whole tile; or, ``dq_split_rows=False``, split by head dim, each warpgroup's
    64 x 32 MMA tile twice over the rows): right against float64 at odd lengths, GQA both ways, varlen;
    deterministic bitwise on repeat."""
    cfg = rb.dataclasses.replace(rb.config_for(64, False), **{"dq_split_rows": True, **fields})
    _check_config_both_gqa_forms(f"dq-split-rows{fields}", cfg, 64, hkv, None, varlen, seed=25)


SPLIT_CASES = [  # name, B, S, Hq, Hkv, D, bounds, cap, cap_method, dtype (D=256: the head-dim split schedule)
    ("d256", 2, 700, 4, 4, 256, [[0, 517, 517, 700], [37, 400, 450, 611]], None, "tanh", torch.bfloat16),
    ("d256-gqa2-tanh-odd", 2, 389, 4, 2, 256, [[7, 263, 263, 389], [0, 129, 130, 300]], 15.0, "tanh", torch.bfloat16),
    ("d256-softsign-fp16", 1, 300, 2, 1, 256, [[0, 250, 250, 300]], 5.0, "soft_sign", torch.float16),
    ("d256-empty-history", 2, 300, 2, 2, 256, [[0, 0, 0, 300], [10, 10, 100, 200]], None, "tanh", torch.bfloat16),
    ("d256-empty-candidates", 1, 300, 2, 2, 256, [[0, 300, 300, 300]], None, "tanh", torch.bfloat16),
    ("d256-cand-before-hist", 1, 520, 2, 2, 256, [[200, 500, 0, 150]], None, "tanh", torch.bfloat16),
    ("d256-out-of-range", 2, 400, 2, 2, 256, [[-5, 1000, 900, 2000], [350, 9999, -7, 20]], None, "tanh",
     torch.bfloat16),
    ("d256-gap-tiles", 1, 1000, 2, 2, 256, [[0, 70, 900, 1000]], 20.0, "tanh", torch.bfloat16),
    ("d256-one-row", 1, 1, 2, 2, 256, [[0, 1, 0, 1]], None, "tanh", torch.bfloat16),
    ("d256-all-empty", 2, 130, 2, 2, 256, [[5, 5, 9, 9], [0, 0, 0, 0]], None, "tanh", torch.bfloat16),
    ("d256-hist-one-block", 3, 200, 2, 2, 256, [[0, 64, 64, 200], [1, 2, 2, 3], [100, 101, 101, 199]], None, "tanh",
     torch.bfloat16),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: c[0])
def test_head_dim_256(case):
    """D=256 (config_for: the head-dim split schedule, 64 keys x 64 q rows, one Q/dO stage) against float64 over
    the fixed-length matrix: odd lengths, empty and out-of-range segments, caps, GQA, fp16, one token."""
    name, b, s, hq, hkv, d, rows, cap, capm, dtype = case
    assert rb.config_for(d, cap is not None).split_head_dim
    q, k, v, do = _tensors((b, s, hq, d), (b, s, hkv, d), dtype, seed=31)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    _compare(name, q, k, v, do, bounds, cap, capm)


@pytest.mark.parametrize("d,fields", [(256, {}), (256, dict(ds_stages=1)), (256, dict(dq_per_wg=False)),
                                      (256, dict(dq_zero_in_mainloop=False)),
                                      (128, dict(stages=2)), (64, dict(stages=2))],
                         ids=lambda x: str(x) if isinstance(x, int) else ",".join(f"{k}={v}" for k, v in x.items()))
@pytest.mark.parametrize("hkv,cap,varlen", [(4, None, False), (2, 20.0, False), (2, None, True)])
def test_split_head_dim_schedule(d, fields, hkv, cap, varlen):
    """The head-dim split schedule (split_head_dim) at D=256 with its synchronisation variants (one sP^T/sdS^T
    buffer, one dQ hand-off; the preprocess zeroing dQ, as past 44 KV blocks) and at D=128 and 64 (where the
    keys-split schedule ships): right against float64 at odd lengths, GQA both ways, varlen with an empty-candidates
    sequence, a cap; deterministic bitwise on repeat (and against float64 in test_deterministic_first_store)."""
    base = rb.CONFIGS[256] if d == 256 else rb.dataclasses.replace(
        rb.RankerBwdConfig(head_dim=d), tile_m=64, tile_n=64, stages=1, split_head_dim=True)
    cfg = rb.dataclasses.replace(base, **fields)
    _check_config_both_gqa_forms(f"split-d{d}{fields}", cfg, d, hkv, cap, varlen, seed=33)


def test_head_dim_256_autograd_and_deterministic_flag():
    """D=256 through autograd (ranker_attention(...).backward()): the gradients are ranker_attention_backward's,
    bit for bit under torch's deterministic flag, and equal on a second run."""
    q, k, v, do = _tensors((2, 300, 4, 256), (2, 300, 2, 256), seed=35)
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)

    def grads():
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        cute_kernels.ranker_attention(qq, kk, vv, bounds, cap=30.0).backward(do)
        return qq.grad, kk.grad, vv.grad

    torch.use_deterministic_algorithms(True)
    try:
        a, b = grads(), grads()
    finally:
        torch.use_deterministic_algorithms(False)
    out, lse = rf.ranker_attention(q, k, v, bounds, cap=30.0, return_lse=True)
    direct = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, cap=30.0, deterministic=True)
    for x, y, z in zip(a, b, direct):
        assert torch.equal(x, y) and torch.equal(x, z)


def _poison_new_empty(monkeypatch):
    """Every CUDA buffer the backward allocates with ``Tensor.new_empty`` (its per-row LSE2 / dPsum, the float32
    dQ accumulator, the int32 flags) comes out poisoned: NaN floats, int32 7s."""
    real_new_empty = torch.Tensor.new_empty

    def poisoned(self, *shape, **kw):
        t = real_new_empty(self, *shape, **kw)
        if t.is_cuda:
            t.fill_(float("nan") if t.is_floating_point() else 7)
        return t

    monkeypatch.setattr(torch.Tensor, "new_empty", poisoned)


@pytest.mark.parametrize("stagger", [0, 2])
@pytest.mark.parametrize("d,hkv,cap,varlen", [(128, 4, None, False), (128, 2, 20.0, False), (128, 2, None, True),
                                              (64, 2, None, False), (64, 4, 5.0, True), (256, 2, 20.0, False),
                                              (256, 2, None, True)])
def test_deterministic_first_store(d, hkv, cap, varlen, stagger, monkeypatch):
    """The deterministic mode's first KV block in order stores its dQ tile, the others add (the accumulator
    is not zeroed); q blocks no KV block reaches (an empty history, rows past the segments) read zeros in
    the postprocess.  Against float64 at odd lengths, GQA both ways, varlen with an empty-candidates
    sequence; bitwise on repeat; with the accumulator poisoned with NaN first (a tile left unwritten, or
    added onto before its store, shows).  ``stagger``: ``walk_stagger``, the order being the staggered
    walks' (the first to reach a q block stores it)."""
    cfg = rb.dataclasses.replace(rb.config_for(d, cap is not None), deterministic=True, walk_stagger=stagger)
    _check_config_both_gqa_forms(f"det-first-store-d{d}", cfg, d, hkv, cap, varlen, seed=31)
    # empty histories (no mainloop work: every counter stays 0) beside a normal row, NaN-poisoned accumulator
    q, k, v, do = _tensors((3, 300, 4, d), (3, 300, hkv, d), seed=32)
    bounds = torch.tensor([[0, 0, 0, 300], [5, 5, 10, 200], [3, 250, 250, 300]], device="cuda", dtype=torch.int32)
    _poison_new_empty(monkeypatch)
    _compare(f"det-first-store-empty-d{d}", q, k, v, do, bounds, cap=cap, config=cfg)
    if varlen:  # the packed form too: sequences with and without history
        cu = torch.tensor([0, 300, 300, 600, 900], device="cuda", dtype=torch.int32)
        qv, kv_, vv, dov = (t.reshape(900, *t.shape[2:]) for t in (q, k, v, do))
        vb = torch.tensor([[0, 0, 0, 300], [0, 0, 0, 0], [5, 5, 10, 200], [3, 250, 250, 300]], device="cuda",
                          dtype=torch.int32)
        _compare(f"det-first-store-empty-varlen-d{d}", qv, kv_, vv, dov, vb, cap=cap, cu_seqlens=cu, config=cfg)


@pytest.mark.parametrize("stagger", [1, 3])
@pytest.mark.parametrize("d,hq,hkv,cap,group", [(128, 4, 4, None, None), (128, 8, 2, 20.0, True),
                                                (128, 8, 2, None, False), (64, 4, 2, None, True),
                                                (64, 4, 4, 5.0, None)])
def test_walk_stagger(d, hq, hkv, cap, group, stagger):
    """``walk_stagger`` (each KV block's walk over the q blocks starts ``(n_kv - 1 - rank) * stagger`` steps in): right
    against float64 on sequences of many KV blocks (up to 14 here, the stagger capped where a sequence has
    few q blocks per KV block), GQA both forms; its deterministic mode (adds in the walks' visiting order)
    bitwise equal over four runs and right too."""
    q, k, v, do = _tensors((3, 1800, hq, d), (3, 1800, hkv, d), seed=41)
    bounds = torch.tensor([[0, 1700, 1700, 1800], [63, 1100, 1100, 1799], [0, 200, 200, 1800]], device="cuda",
                          dtype=torch.int32)
    _check_stagger(q, k, v, do, bounds, d, cap, group, stagger)


def test_walk_stagger_long_sequences():
    """A launch whose sequences may hold more than STAGGER_MAX_KV_BLOCKS history KV blocks runs KV order
    (``resolve_walk_stagger`` drops the stagger); right, deterministic bitwise on repeat."""
    s = 128 * rb.STAGGER_MAX_KV_BLOCKS + 300
    q, k, v, do = _tensors((2, s, 2, 64), (2, s, 2, 64), seed=43)
    bounds = torch.tensor([[0, s - 200, s - 200, s], [100, 2000, 2000, 2500]], device="cuda", dtype=torch.int32)
    _check_stagger(q, k, v, do, bounds, 64, None, None, 2)


def _check_stagger(q, k, v, do, bounds, d, cap, group, stagger):
    """``walk_stagger=stagger`` against float64, then its deterministic mode against float64 and bitwise on
    three more runs."""
    cfg = rb.dataclasses.replace(rb.config_for(d, cap is not None), gqa_group_per_cta=group, walk_stagger=stagger)
    tag = f"stagger{stagger}-d{d}-{q.shape[-2]}/{k.shape[-2]}-{group}-S{q.shape[1]}"
    _compare(tag, q, k, v, do, bounds, cap=cap, config=cfg)
    det = rb.dataclasses.replace(cfg, deterministic=True)
    got = _compare(f"{tag}-det", q, k, v, do, bounds, cap=cap, config=det)
    out, lse = rf.ranker_attention(q, k, v, bounds, cap=cap, return_lse=True)
    for _ in range(3):
        again = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, cap=cap, config=det)
        assert all(torch.equal(a, b) for a, b in zip(got, again))


@pytest.mark.parametrize("fields", [dict(dq_swap_ab=False), dict(tile_m=80, ds_stages=1),
                                    dict(tile_m=80, ds_stages=1, dq_first=False), dict(dq_zero_in_mainloop=False)],
                         ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("hkv,cap,varlen", [(4, None, False), (2, 20.0, False), (2, None, True)])
def test_dq_forms(fields, hkv, cap, varlen):
    """The D=128 dQ GEMM's other forms beside the shipped dQ^T = K^T dS^T: dQ = dS K (dq_swap_ab=False),
    and FA3's 80-row q tiles (which need dq_swap_ab): right against float64 (odd lengths, GQA both
    ways, a cap, varlen), deterministic bitwise on repeat."""
    cfg = rb.dataclasses.replace(rb.config_for(128, cap is not None), **fields)
    _check_config_both_gqa_forms(f"dq-{fields}", cfg, 128, hkv, cap, varlen, seed=15)


DQ_FORMS = {"dq_zero_in_mainloop": dict(dq_zero_in_mainloop=True),
            "claim-at-once": dict(dq_zero_in_mainloop=True, dq_zero_wait_cycles=0),
            "preprocess-zeroes": dict(dq_zero_in_mainloop=False)}


@pytest.mark.parametrize("zeroing", list(DQ_FORMS))
@pytest.mark.parametrize("d,hq,hkv,cap,group", [(128, 4, 4, None, None), (128, 4, 2, 20.0, True),
                                                (128, 4, 2, None, False), (64, 4, 4, None, None),
                                                (64, 4, 2, 5.0, False)])
def test_dq_zeroing_with_poisoned_buffers(d, hq, hkv, cap, group, zeroing, monkeypatch):
    """The default mode's dQ accumulator zeroed by the mainloop's KV blocks (``dq_zero_in_mainloop``, each
    add waiting for its tile's flag; ``claim-at-once``: an add that finds its tile's zeroing not begun stores
    its dQ there instead) or by the preprocess: with every buffer the backward allocates through
    ``Tensor.new_empty`` poisoned first (NaN floats, int32 7s: a tile added onto before its zeroing, a flag
    left unzeroed, a q block read back without a flag all show), right against float64 at odd lengths,
    with an empty history beside normal rows, fixed length and packed."""
    _poison_new_empty(monkeypatch)
    cfg = rb.dataclasses.replace(rb.config_for(d, cap is not None), gqa_group_per_cta=group, **DQ_FORMS[zeroing])
    q, k, v, do = _tensors((3, 389, hq, d), (3, 389, hkv, d), seed=51)
    bounds = torch.tensor([[7, 263, 263, 389], [0, 0, 0, 389], [0, 129, 130, 300]], device="cuda",
                          dtype=torch.int32)
    _compare(f"dq-zeroing-{zeroing}-d{d}-{hq}/{hkv}-{group}", q, k, v, do, bounds, cap=cap, config=cfg)
    cu = torch.tensor([0, 389, 389, 778, 1167], device="cuda", dtype=torch.int32)
    vb = torch.tensor([[7, 263, 263, 389], [0, 0, 0, 0], [0, 0, 0, 389], [0, 129, 130, 300]], device="cuda",
                      dtype=torch.int32)
    packed = [t.reshape(1167, *t.shape[2:]) for t in (q, k, v, do)]
    _compare(f"dq-zeroing-{zeroing}-varlen-d{d}-{hq}/{hkv}-{group}", *packed, vb, cap=cap, cu_seqlens=cu,
             config=cfg)


def _zeroing_config(wait, **fields):
    """The shipped uncapped D=128 config with ``dq_zero_in_mainloop`` on and ``dq_zero_wait_cycles=wait``
    (None: the shipped bound), plus ``fields``."""
    if wait is not None:
        fields["dq_zero_wait_cycles"] = wait
    return rb.dataclasses.replace(rb.config_for(128, False), dq_zero_in_mainloop=True, **fields)


@pytest.mark.parametrize("wait", [None, 0], ids=["default-wait", "claim-at-once"])
@pytest.mark.parametrize("hkv", [32, 8])
def test_dq_zeroing_across_waves(wait, hkv, monkeypatch):
    """``dq_zero_in_mainloop`` where a sequence's KV blocks straddle two waves of CTAs (9 history KV blocks
    per (sequence, head), 288 CTAs on at most 132 SMs): the first wave's KV blocks reach tiles whose zeroing
    KV block starts only when a CTA of the wave ends, so their adds time out (``dq_zero_wait_cycles``, ~2 us
    against a CTA's life here of tens of us; at once with 0) and store their dQ instead, and the late zeroing
    KV blocks leave those tiles.  Buffers poisoned, right against float64; GQA 4:1 with one query head per
    CTA too."""
    _poison_new_empty(monkeypatch)
    cfg = _zeroing_config(wait, gqa_group_per_cta=False if hkv < 32 else None)
    q, k, v, do = _tensors((1, 1152, 32, 128), (1, 1152, hkv, 128), seed=53)
    bounds = torch.tensor([[0, 1100, 1100, 1152]], device="cuda", dtype=torch.int32)
    _compare(f"dq-zeroing-waves-{wait}-{hkv}", q, k, v, do, bounds, config=cfg)


def test_dq_zeroing_bound_forces_claims():
    """The zeroing's bounded wait where it must act: one sequence and head with three more history KV blocks
    than the GPU has SMs (one mainloop CTA fits per SM), the mainloop launched alone (``resolve_dq_zeroing``
    would turn the zeroing off for such a call).  Every resident CTA reaches the tiles whose zeroing KV blocks
    cannot start until one of them ends: without the bound they would all spin forever; with it they claim
    those tiles and one stores its dQ there (flag ``DQ_TILE_STORED``).  Accumulator and dK/dV NaN-poisoned;
    right against float64."""
    d = 128
    cfg = rb.dataclasses.replace(rb.CONFIGS[d], dq_zero_in_mainloop=True)
    assert 2 * (cfg.smem_bytes() + rb.STATIC_SMEM_BYTES) > rf.SMEM_CAPACITY  # one CTA per SM
    s = (torch.cuda.get_device_properties(0).multi_processor_count + 3) * cfg.tile_n
    q, k, v, do = _tensors((1, s, 1, d), (1, s, 1, d), seed=55)
    bounds = torch.tensor([[0, s, s, s]], device="cuda", dtype=torch.int32)  # all history: no self terms
    ex = rb.ranker_attention_backward_explicit(q, k, v, bounds, do)
    prow, lse2, dpsum = _mainloop_stats(ex[3], ex[4], cfg.tile_m)
    dq_acc = torch.full((1, 1, prow, d), float("nan"), device="cuda")
    flags = torch.zeros((1, 1, prow // cfg.tile_m), device="cuda", dtype=torch.int32)
    dk, dv = (torch.full_like(k, float("nan")) for _ in range(2))
    scale = 1.0 / d ** 0.5
    rb._fn("main", q.dtype, cfg, 1, "none", False)(
        q, k, v, do, lse2, dpsum, dq_acc, dk, dv, bounds, None, flags, None, scale * rf.LOG2_E, scale, 1.0, 1, s)
    torch.cuda.synchronize()
    assert ((flags == rb.DQ_TILE_READY) | (flags == rb.DQ_TILE_STORED)).all(), flags
    assert int((flags == rb.DQ_TILE_STORED).sum()) >= 3, flags  # the late KV blocks' tiles at least
    tol = dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(scale * dq_acc[:, :, :s].double().transpose(1, 2), ex[0], **tol)
    torch.testing.assert_close(dk.double(), ex[1], **tol)
    torch.testing.assert_close(dv.double(), ex[2], **tol)


@pytest.mark.parametrize("wait", [None, 0], ids=["default-wait", "claim-at-once"])
def test_dq_zeroing_many_tiles_per_kv_block(wait, monkeypatch):
    """``dq_zero_in_mainloop`` where one KV block owns over a thousand dQ tiles (a history of one KV block, 4300
    candidates, 16 query heads on one KV head with the group per CTA: 69 q blocks x 16 heads = 1104 tiles,
    claimed and opened 32 at a time; a per-lane bit per 32 tiles, as first written, overflowed past 1024):
    buffers poisoned, right against float64."""
    _poison_new_empty(monkeypatch)
    cfg = _zeroing_config(wait, gqa_group_per_cta=True)
    q, k, v, do = _tensors((1, 4400, 16, 128), (1, 4400, 1, 128), seed=54)
    bounds = torch.tensor([[0, 100, 100, 4400]], device="cuda", dtype=torch.int32)
    _compare(f"dq-zeroing-many-tiles-{wait}", q, k, v, do, bounds, config=cfg)


@pytest.mark.parametrize("group", [True, False], ids=["group", "per-head"])
@pytest.mark.parametrize("d,hq,hkv,cap,capm,varlen,det", [
    (128, 8, 2, None, "tanh", False, False), (128, 6, 2, 15.0, "tanh", False, False),
    (64, 4, 1, 5.0, "soft_sign", False, False), (128, 4, 2, 20.0, "tanh", True, False),
    (128, 8, 2, 20.0, "tanh", True, True), (64, 4, 2, None, "tanh", False, True)])
def test_gqa_forms(group, d, hq, hkv, cap, capm, varlen, det):
    """GQA both ways (gqa_group_per_cta: a CTA walks every query head of its KV head and stores dK/dV
    once, or one query head per CTA with float32 accumulators), forced by the config since the host
    picks per-head at these small sizes: right against float64 at odd lengths, varlen, caps,
    deterministic mode (bitwise on repeat).  With a group per CTA dK/dV are bitwise reproducible in
    the default mode too (no reduce-adds)."""
    cfg = rb.dataclasses.replace(rb.config_for(d, cap is not None), gqa_group_per_cta=group, deterministic=det)
    if varlen:
        cu = torch.tensor([0, 389, 400, 789], device="cuda", dtype=torch.int32)
        q, k, v, do = _tensors((800, hq, d), (800, hkv, d), seed=12)
        bounds = torch.tensor([[7, 263, 263, 389], [0, 11, 0, 0], [0, 129, 129, 389]], device="cuda",
                              dtype=torch.int32)
    else:
        cu = None
        q, k, v, do = _tensors((2, 389, hq, d), (2, 389, hkv, d), seed=12)
        bounds = torch.tensor([[7, 263, 263, 389], [0, 129, 130, 300]], device="cuda", dtype=torch.int32)
    kw = dict(cap=cap, cap_method=capm, cu_seqlens=cu)
    _compare(f"gqa-{'group' if group else 'per-head'}-d{d}-{hq}/{hkv}", q, k, v, do, bounds, config=cfg, **kw)
    out, lse = rf.ranker_attention(q, k, v, bounds, return_lse=True, **kw)
    a, b = (rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, config=cfg, **kw) for _ in range(2))
    if det:
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    elif group:
        assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


@pytest.mark.parametrize("d,cap,hq,hkv,varlen", [(128, 20.0, 4, 4, False), (128, 20.0, 8, 2, False),
                                                (128, 20.0, 4, 2, True), (64, None, 4, 4, False),
                                                (64, None, 4, 2, True)])
def test_deterministic_mode(d, cap, hq, hkv, varlen):
    """Same bits on every run (ordered float32 adds), and still right; D=64 without a cap runs
    config_for's 128-row q tiles (rb.D64_UNCAPPED)."""
    if varlen:
        cu = torch.tensor([0, 300, 700], device="cuda", dtype=torch.int32)
        q, k, v, do = _tensors((700, hq, d), (700, hkv, d), seed=6)
        bounds = torch.tensor([[0, 250, 250, 300], [5, 300, 310, 400]], device="cuda", dtype=torch.int32)
    else:
        cu = None
        q, k, v, do = _tensors((2, 600, hq, d), (2, 600, hkv, d), seed=6)
        bounds = torch.tensor([[0, 500, 500, 600], [30, 333, 340, 590]], device="cuda", dtype=torch.int32)
    out, lse = rf.ranker_attention(q, k, v, bounds, cap=cap, return_lse=True, cu_seqlens=cu)
    runs = [rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, cap=cap, cu_seqlens=cu,
                                         deterministic=True) for _ in range(4)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
    cfg = rb.dataclasses.replace(rb.config_for(d, cap is not None), deterministic=True)
    assert cfg.tile_m == (128 if d == 64 and cap is None else 64)
    _compare(f"deterministic-d{d}", q, k, v, do, bounds, cap=cap, cu_seqlens=cu, config=cfg)


def test_autograd_and_compile():
    q, k, v, do = _tensors((2, 300, 4, 128), (2, 300, 2, 128), seed=5)
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)

    def loss_grads(fn):
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        o = fn(qq, kk, vv)
        o.backward(do)
        return o.detach(), qq.grad, kk.grad, vv.grad

    eager = loss_grads(lambda a, b, c: cute_kernels.ranker_attention(a, b, c, bounds, cap=30.0))
    compiled_fn = torch.compile(lambda a, b, c: cute_kernels.ranker_attention(a, b, c, bounds, cap=30.0),
                                fullgraph=True)
    comp = loss_grads(compiled_fn)
    ref = rb.ranker_attention_backward_reference(q, k, v, bounds, do, cap=30.0)
    for name, e, c, r in zip(("dq", "dk", "dv"), eager[1:], comp[1:], ref):
        torch.testing.assert_close(e, c, rtol=2e-2, atol=2e-2, msg=name)  # eager vs compiled: same kernels
        tol = 1e-2 * r.abs().max().item() + 2e-2
        assert (e.double() - r).abs().max().item() <= tol, name
    # the forward's values are the no-grad path's
    torch.testing.assert_close(eager[0], cute_kernels.ranker_attention(q, k, v, bounds, cap=30.0), rtol=0, atol=0)


@pytest.mark.parametrize("deterministic", [False, True])
def test_opcheck(deterministic):
    """``torch.library.opcheck`` of ``torch.ops.cute_kernels.ranker_attention_bwd`` (GQA 4/2, tanh cap): schema
    (no input mutated or aliased), the fake's dQ/dK/dV metadata against the real op's, and the op under AOT
    dispatch with dynamic shapes against the eager op's values."""
    q, k, v, do = _tensors((2, 300, 4, 128), (2, 300, 2, 128), seed=23)
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)
    out, lse = cute_kernels.ranker_attention(q, k, v, bounds, cap=30.0, return_lse=True)
    torch.library.opcheck(rb.ranker_attention_backward_op.op, (q, k, v, out, lse, do, bounds),
                          dict(cap=30.0, deterministic=deterministic))


@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["eager", "no-grad", "compiled"])
def test_autocast_casts_float32_inputs(amp_dtype, mode):
    """Under torch.autocast, float32 q, k, v (e.g. out of an RMSNorm, which autocast runs in float32) are cast to
    the autocast dtype as SDPA casts them: out has that dtype, with the bits of a call on the cast inputs (the same
    kernels), and the float32 leaves get float32 gradients, bitwise those of the cast inputs (torch's deterministic
    flag on).  An input already in the autocast dtype is not cast, also where the eager call has a launch plan for
    the all-16-bit signature (kept by the reference call).  Without autocast float32 is still refused."""
    torch._dynamo.reset()
    q, k, v, do = _tensors((2, 300, 4, 128), (2, 300, 2, 128), dtype=torch.float32, seed=47)
    k = k.to(amp_dtype)  # one input already in the autocast dtype
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)
    call = lambda a, b, c: cute_kernels.ranker_attention(a, b, c, bounds, cap=30.0, return_lse=True)  # noqa: E731
    fn = torch.compile(call, fullgraph=True) if mode == "compiled" else call
    grad = mode != "no-grad"
    cast = [t.detach().to(amp_dtype) for t in (q, k, v)]
    want_out, want_lse = call(*cast)  # (eager, no grad: keeps the plan of the all-16-bit call)
    dout = do.to(amp_dtype)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        if grad:  # the cast inputs' own gradients
            ref = [t.clone().requires_grad_(True) for t in cast]
            call(*ref)[0].backward(dout)
            want_grads = [t.grad for t in ref]
        for leaves in ([t.detach().clone().requires_grad_(grad) for t in (q, k, v)],  # q and v float32
                       [cast[0].clone().requires_grad_(grad), k.float().requires_grad_(grad),
                        cast[2].clone().requires_grad_(grad)]):  # only k float32
            with torch.autocast("cuda", dtype=amp_dtype), torch.set_grad_enabled(grad):
                out, lse = fn(*leaves)
            assert out.dtype == amp_dtype and lse.dtype == torch.float32
            assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
            if grad:
                out.backward(dout)
                for name, leaf, w in zip(("dq", "dk", "dv"), leaves, want_grads):
                    assert leaf.grad.dtype == leaf.dtype, name
                    assert torch.equal(leaf.grad, w.to(leaf.dtype)), name
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    with pytest.raises(TypeError, match="dtype|bfloat16|float16"):
        cute_kernels.ranker_attention(q, k.float(), v, bounds)
    torch._dynamo.reset()


def test_torch_deterministic_flag_makes_autograd_bitwise():
    """torch.use_deterministic_algorithms(True): the autograd backward (eager and torch.compile) gives the same
    bits on every run, those of ranker_attention_backward(deterministic=True)."""
    q, k, v, do = _tensors((2, 333, 8, 128), (2, 333, 2, 128), seed=45)
    bounds = torch.tensor([[0, 200, 200, 333], [5, 129, 130, 300]], device="cuda", dtype=torch.int32)

    def grads(fn):
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        fn(qq, kk, vv).backward(do)
        return qq.grad, kk.grad, vv.grad

    call = lambda a, b, c: cute_kernels.ranker_attention(a, b, c, bounds, cap=30.0)  # noqa: E731
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)  # (warn_only: torch's own ops in the test may lack one)
    try:
        out, lse = cute_kernels.ranker_attention(q, k, v, bounds, cap=30.0, return_lse=True)
        want = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, cap=30.0, deterministic=True)
        torch._dynamo.reset()
        compiled = torch.compile(call, fullgraph=True)
        for name, fn in (("eager", call), ("eager", call), ("compiled", compiled), ("compiled", compiled)):
            for g, w, n in zip(grads(fn), want, ("dq", "dk", "dv")):
                assert torch.equal(g, w), f"{name}: {n}"
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch._dynamo.reset()


@pytest.mark.parametrize("form", ["non-reentrant", "reentrant", "non-reentrant compiled"])
def test_activation_checkpointing(form):
    """``torch.utils.checkpoint`` around the op (activation checkpointing of an attention layer: its forward
    runs again during the backward, with grad on): out and LSE as the plain call's, and the gradients of q, k
    and v through a loss on both, bitwise those of the plain call (torch's deterministic flag on); the
    non-reentrant form also inside torch.compile."""
    torch._dynamo.reset()
    q, k, v, do = _tensors((2, 300, 4, 128), (2, 300, 2, 128), seed=61)
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)

    def layer(a, b, c):
        out, lse = cute_kernels.ranker_attention(a, b, c, bounds, cap=30.0, return_lse=True)
        return out, lse

    def step(fn):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = fn(*leaves)
        finite = torch.isfinite(lse.detach())  # (rows of neither segment: lse -inf, no gradient)
        loss = (out.float() * do.float()).sum() + 0.25 * torch.where(finite, lse, 0.0).sum()
        loss.backward()
        return (out.detach(), lse.detach(), *(t.grad for t in leaves))

    reentrant = form == "reentrant"
    checkpointed = lambda a, b, c: torch.utils.checkpoint.checkpoint(layer, a, b, c,  # noqa: E731
                                                                     use_reentrant=reentrant)
    if form.endswith("compiled"):
        checkpointed = torch.compile(checkpointed, fullgraph=True)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)  # (warn_only: torch's own ops in the test may lack one)
    try:
        want = step(layer)
        got = step(checkpointed)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch._dynamo.reset()
    assert want[2].abs().max() > 0  # (the LSE term and the out term both reach q)
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert torch.equal(g, w), f"{form}: {name}"


def test_runs_on_the_current_stream():
    """On a side stream whose inputs are written there behind a long sleep (:func:`side_stream.run_behind_a_sleep`),
    the forward and every kernel of the backward launch on that stream (a launch on another stream would read the
    inputs before they are written), and neither waits for the device: the bits of the calls on the default
    stream (torch's deterministic flag on)."""
    q, k, v, do = _tensors((2, 300, 4, 128), (2, 300, 2, 128), seed=67)
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)

    def step(fill):
        leaves = [fill(t).requires_grad_(True) for t in (q, k, v)]
        out, lse = cute_kernels.ranker_attention(*leaves, bounds, return_lse=True)
        out.backward(fill(do))
        return (out.detach(), lse.detach(), *(t.grad for t in leaves))

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        want = step(torch.clone)
        got = run_behind_a_sleep(step)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert torch.equal(g, w), name


def test_reduce_overhead_training_steps():
    """torch.compile(mode="reduce-overhead") (CUDA-graph trees over the forward and the backward) for four
    steps with new values each time: gradients as the eager op's (same kernels; dQ's float32 atomics may
    order differently) and near the float64 reference."""
    torch._dynamo.reset()
    q, k, v, do = _tensors((2, 300, 4, 128), (2, 300, 2, 128), seed=43)
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)
    compiled = torch.compile(lambda a, b, c: cute_kernels.ranker_attention(a, b, c, bounds),
                             mode="reduce-overhead", fullgraph=True)
    g = generator(44)

    def grads(fn):
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        fn(qq, kk, vv).backward(do)
        return qq.grad.clone(), kk.grad.clone(), vv.grad.clone()

    for step in range(4):
        for t in (q, k, v, do):
            t.copy_(torch.randn(t.shape, device="cuda", generator=g))
        eager = grads(lambda a, b, c: cute_kernels.ranker_attention(a, b, c, bounds))
        comp = grads(compiled)
        ref = rb.ranker_attention_backward_reference(q, k, v, bounds, do)
        for name, e, c, r in zip(("dq", "dk", "dv"), eager, comp, ref):
            torch.testing.assert_close(c, e, rtol=1e-2, atol=1e-2, msg=f"step {step}: {name}")
            assert (c.double() - r).abs().max().item() <= 1e-2 * r.abs().max().item() + 2e-2, f"step {step}: {name}"
    torch._dynamo.reset()


LSE_GRAD_CASES = [  # name, B, S, Hq, Hkv, D, bounds, cap, cap_method
    ("mha", 2, 300, 2, 2, 128, [[0, 200, 200, 300], [37, 150, 160, 290]], None, "tanh"),
    ("gqa-tanh", 2, 333, 8, 2, 128, [[0, 200, 200, 333], [5, 129, 130, 300]], 30.0, "tanh"),
    ("d64-softsign", 1, 301, 4, 2, 64, [[0, 250, 250, 301]], 5.0, "soft_sign"),
    ("d64-empty-rows", 2, 260, 2, 2, 64, [[3, 131, 131, 200], [0, 0, 0, 0]], None, "tanh"),
]


@pytest.mark.parametrize("case", LSE_GRAD_CASES, ids=lambda c: c[0])
def test_lse_gradient(case):
    """The gradient of a loss on both outputs, ``sum(out * dO) + sum(lse * dLSE)``: ours (``dlse=``) against
    the float64 autograd reference through its LSE; NaN dLSE on rows with no valid key is ignored; a loss
    on the LSE alone (dO = 0) too."""
    name, b, s, hq, hkv, d, rows, cap, capm = case
    q, k, v, do = _tensors((b, s, hq, d), (b, s, hkv, d), seed=21)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    kw = dict(cap=cap, cap_method=capm)
    out, lse = rf.ranker_attention(q, k, v, bounds, return_lse=True, **kw)
    dlse = torch.randn(lse.shape, device="cuda", generator=generator(22))
    dlse[torch.isinf(lse)] = float("nan")
    for label, dout in (("out+lse", do), ("lse-only", torch.zeros_like(do))):
        poison = lambda t: torch.full_like(t, float("nan"))  # noqa: E731
        got = rb.ranker_attention_backward(q, k, v, out, lse, dout, bounds, dlse=dlse, dq=poison(q), dk=poison(k),
                                           dv=poison(v), **kw)
        ref = rb.ranker_attention_backward_reference(q, k, v, bounds, dout, dlse=dlse, **kw)
        low = rb.ranker_attention_backward_reference(q, k, v, bounds, dout, dlse=dlse, compute_dtype=q.dtype, **kw)
        no_lse = rb.ranker_attention_backward_reference(q, k, v, bounds, dout, **kw)
        for gname, a, r, lo, n in zip(("dq", "dk", "dv"), got, ref, low, no_lse):
            err = (a.double() - r).abs().max().item()
            tol = rb.grad_tolerance(r, lo)
            print(f"[ranker_bwd] dlse {name} {label} {gname}: max|err|={err:.3e} (tol {tol:.3e})")
            assert not torch.isnan(a).any(), f"{name} {label}: NaN in {gname}"
            assert err <= tol, f"{name} {label}: {gname} error {err} > {tol}"
            if gname == "dq":  # the LSE's term is there: leaving it out would fail this test (dV has none)
                assert (r - n).norm() > 0.1 * r.norm(), f"{name} {label}: {gname} barely has dLSE's term"


def test_lse_gradient_autograd_and_compile():
    """A loss on ``lse`` through autograd (eager and torch.compile): the same gradients as the explicit
    backward with ``dlse``; the LSE alone as the loss (no gradient for out: dO = 0); varlen."""
    q, k, v, do = _tensors((2, 300, 4, 128), (2, 300, 2, 128), seed=23)
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)
    w = torch.randn(2, 4, 300, device="cuda", generator=generator(24))

    def grads(fn, with_out=True):
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        o, lse = fn(qq, kk, vv)
        assert lse.requires_grad
        loss = (torch.where(torch.isfinite(lse), lse, 0) * w).sum()
        if with_out:
            loss = loss + (o.float() * do.float()).sum()
        loss.backward()
        return qq.grad, kk.grad, vv.grad

    call = lambda a, b, c: cute_kernels.ranker_attention(a, b, c, bounds, cap=30.0, return_lse=True)  # noqa: E731
    eager = grads(call)
    comp = grads(torch.compile(call, fullgraph=True))
    lse_only = grads(call, with_out=False)
    out, lse = rf.ranker_attention(q, k, v, bounds, cap=30.0, return_lse=True)
    want = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, cap=30.0, dlse=w)
    want_lse_only = rb.ranker_attention_backward(q, k, v, out, lse, torch.zeros_like(do), bounds, cap=30.0, dlse=w)
    ref = rb.ranker_attention_backward_reference(q, k, v, bounds, do, cap=30.0, dlse=w)
    for name, e, c, x, r in zip(("dq", "dk", "dv"), eager, comp, want, ref):
        torch.testing.assert_close(e, x, rtol=2e-2, atol=2e-2, msg=name)
        torch.testing.assert_close(c, x, rtol=2e-2, atol=2e-2, msg=name)
        assert (e.double() - r).abs().max().item() <= 1e-2 * r.abs().max().item() + 2e-2, name
    for name, e, x in zip(("dq", "dk", "dv"), lse_only, want_lse_only):
        torch.testing.assert_close(e, x, rtol=2e-2, atol=2e-2, msg=name)
    assert (lse_only[2] == 0).all()  # dV has no LSE term
    # varlen, and a broadcast (stride-0) dLSE: the gradient of lse.sum()
    lens = [100, 0, 233]
    cu = torch.tensor([0, 100, 100, 333], device="cuda", dtype=torch.int32)
    vb = torch.tensor([[0, 70, 70, 100], [0, 0, 0, 0], [3, 200, 200, 233]], device="cuda", dtype=torch.int32)
    qv, kv_, vv_, dov = _tensors((sum(lens) + 5, 4, 64), (sum(lens) + 5, 4, 64), seed=25)
    outv, lsev = rf.ranker_attention(qv, kv_, vv_, vb, return_lse=True, cu_seqlens=cu)
    ones = torch.ones((), device="cuda").expand(lsev.shape)
    got = rb.ranker_attention_backward(qv, kv_, vv_, outv, lsev, dov, vb, cu_seqlens=cu, dlse=ones)
    ref = rb.ranker_attention_backward_reference(qv, kv_, vv_, vb, dov, cu_seqlens=cu, dlse=ones)
    low = rb.ranker_attention_backward_reference(qv, kv_, vv_, vb, dov, cu_seqlens=cu, dlse=ones,
                                                 compute_dtype=qv.dtype)
    for name, a, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
        assert (a.double() - r).abs().max().item() <= rb.grad_tolerance(r, lo), name


def test_use_config_runs_the_autograd_backward_with_the_block_config():
    """``ranker_bwd.use_config``: autograd's backward inside the block compiles and launches the block's
    mainloop config (its key lands in the compiled-function table; the shipped config's does not when it
    was not there) and its gradients match the float64 reference."""
    import dataclasses

    q, k, v, do = _tensors((2, 300, 4, 128), (2, 300, 4, 128), seed=6)
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)
    cfg = dataclasses.replace(rb.CONFIGS[128], ds_stages=1)
    mains = lambda: {key for kind, key in rb._FNS if kind == "main"}  # noqa: E731
    rb._FNS.clear()
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with rb.use_config(cfg):
        cute_kernels.ranker_attention(qq, kk, vv, bounds).backward(do)
    assert any(cfg in key for key in mains()), mains()
    assert not any(rb.config_for(128, False) in key for key in mains())
    ref = rb.ranker_attention_backward_reference(q, k, v, bounds, do)
    for name, g, r in zip(("dq", "dk", "dv"), (qq.grad, kk.grad, vv.grad), ref):
        tol = 1e-2 * r.abs().max().item() + 2e-2
        assert (g.double() - r).abs().max().item() <= tol, name


def test_check_rows_pass():
    rows = rb.check()
    for r in rows:
        print(r)
    assert all(r.passed for r in rows)


# ---------------------------------------------------------------- the pre/postprocess kernels in isolation
# (so that a failure of the whole backward can be located: these two are independent of the mainloop)
def _mainloop_stats(lse, dps, tile_m):
    """What the preprocess would hand the mainloop, from the float64 reference's ``lse`` / ``dPsum``
    ``[B, H, S]``: (padded rows, LSE in log2 units with +inf for rows without keys, dPsum), float32,
    rows padded to whole q tiles (+inf / 0 in the padding)."""
    nb, hq, s = lse.shape
    rows = buffers.padded_rows(s, nb, tile_m, False)
    lse2 = torch.full((nb, hq, rows), float("inf"), device="cuda")
    lse2[:, :, :s] = torch.where(torch.isfinite(lse), lse * rf.LOG2_E, torch.full_like(lse, float("inf"))).float()
    dpsum = torch.zeros((nb, hq, rows), device="cuda")
    dpsum[:, :, :s] = dps.float()
    return rows, lse2, dpsum


def _padded_rows_of(cu, nb, s, tile_m):
    """Per sequence: (packed start, padded start, length) as the kernels lay the per-row buffers out."""
    if cu is None:
        return [(0, 0, s)] * nb
    cu = [int(x) for x in cu.tolist()]
    return [(cu[b], buffers.padded_offset(cu[b], b, tile_m), cu[b + 1] - cu[b]) for b in range(nb)]


@pytest.mark.parametrize("flagged", [False, True], ids=["", "flagged"])
@pytest.mark.parametrize("with_dlse", [False, True], ids=["", "dlse"])
@pytest.mark.parametrize("d,varlen", [(128, False), (64, False), (128, True)])
def test_preprocess_alone(d, varlen, with_dlse, flagged):
    """LSE2, dPsum (less dLSE on rows with a finite LSE, when given) and the zeroed dQ accumulator, or with
    ``dq_flagged`` (the deterministic mainloop, whose first KV block stores each tile, or one that zeroes
    the tiles itself) the q blocks' flags zeroed and the accumulator left as it was."""
    tm = rb.CONFIGS[d].tile_m
    hq = 3
    if varlen:
        lens = [70, 0, 129, 5]
        nb, total = len(lens), sum(lens) + 3
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), device="cuda", dtype=torch.int32)
        o, do = (torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        lse = torch.randn(hq, total, device="cuda")
        lse[:, 3] = -float("inf")
        rows = buffers.padded_rows(total, nb, tm, True)
        shape, max_seqlen = (hq, rows), max(lens)
    else:
        nb, s, cu = 2, 150, None
        o, do = (torch.randn(nb, s, hq, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        lse = torch.randn(nb, hq, s, device="cuda")
        lse[0, 1, 7] = -float("inf")
        rows = buffers.padded_rows(s, nb, tm, False)
        shape, max_seqlen = (nb, hq, rows), s
    lse2, dpsum = (torch.full(shape, float("nan"), device="cuda") for _ in range(2))
    dq_acc = torch.full(shape + (d,), float("nan"), device="cuda")
    flags = None
    if flagged:  # (B, Hq, rows / tile_m), packed (1, Hq, rows / tile_m); garbage first
        flags = torch.full(((1,) if varlen else (nb,)) + (hq, rows // tm), 7, device="cuda", dtype=torch.int32)
    dlse = None
    if with_dlse:
        dlse = torch.randn(lse.shape, device="cuda")
        dlse[torch.isinf(lse)] = float("nan")  # ignored where the LSE is -inf
        rb._fn("pre", torch.bfloat16, d, tm, varlen, flagged, True)(o, do, lse, dlse, lse2, dpsum, dq_acc, flags,
                                                                     cu, nb, max_seqlen)
    else:
        rb._fn("pre", torch.bfloat16, d, tm, varlen, flagged, False)(o, do, lse, None, lse2, dpsum, dq_acc, flags,
                                                                      cu, nb, max_seqlen)
    torch.cuda.synchronize()
    dot = (o.float() * do.float()).sum(-1)  # [B, S, H] / [T, H]
    if with_dlse:  # dPsum - dLSE on finite rows
        dl = torch.where(torch.isinf(lse), torch.zeros_like(dlse), dlse)
        dot = dot - (dl.transpose(0, 1) if varlen else dl.transpose(1, 2))
    for b, (start, pad, n) in enumerate(_padded_rows_of(cu, nb, o.shape[1] if not varlen else 0, tm)):
        span = -(-n // tm) * tm
        sel = (lambda t: t[:, pad:pad + span]) if varlen else (lambda t: t[b])
        want_lse = (lse[:, start:start + n] if varlen else lse[b]) * rf.LOG2_E
        want_lse = torch.where(torch.isinf(want_lse), torch.full_like(want_lse, float("inf")), want_lse)
        want_dot = (dot[start:start + n] if varlen else dot[b]).transpose(0, 1)
        torch.testing.assert_close(sel(lse2)[:, :n], want_lse)
        assert torch.isinf(sel(lse2)[:, n:]).all() and (sel(lse2)[:, n:] > 0).all()
        torch.testing.assert_close(sel(dpsum)[:, :n], want_dot, rtol=1e-4, atol=1e-4)
        assert (sel(dpsum)[:, n:] == 0).all()
        assert (sel(dq_acc).isnan() if flagged else sel(dq_acc) == 0).all()
        if flagged:  # every q block of the sequence's rows zeroed
            blocks = -(-n // tm)
            f = flags[0, :, pad // tm:pad // tm + blocks] if varlen else flags[b, :, :blocks]
            assert (f == 0).all(), f


@pytest.mark.parametrize("hkv", [2, 1])
def test_zero_dout_candidates_get_positive_zero_dk_dv(hkv):
    """Candidate rows with dO = 0 (outside the loss): their keys' dK and dV (the self term alone) are +0.0
    bit for bit, never -0.0 (a -0.0 product is added to +0.0, as in the GQA path)."""
    q, k, v, do = _tensors((2, 300, 2, 128), (2, 300, hkv, 128), seed=21)
    bounds = torch.tensor([[0, 200, 200, 300], [5, 129, 140, 290]], device="cuda", dtype=torch.int32)
    do[0, 200:300] = 0
    do[1, 140:290] = 0
    out, lse = rf.ranker_attention(q, k, v, bounds, return_lse=True)
    dq, dk, dv = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds)
    for t in (dk, dv):
        cand = torch.cat([t[0, 200:300].reshape(-1), t[1, 140:290].reshape(-1)])
        assert (cand.view(torch.int16) == 0).all(), "a -0.0 (or nonzero) in dK/dV of a zero-dO candidate"


@pytest.mark.parametrize("hq,hkv,cap,capm,acc,flagged", [
    (2, 2, None, "tanh", False, False), (4, 2, 7.0, "tanh", True, False), (4, 1, 3.0, "soft_sign", True, False),
    (4, 2, 7.0, "tanh", False, False), (2, 2, None, "tanh", False, True), (4, 2, 7.0, "tanh", True, True)])
def test_postprocess_alone(hq, hkv, cap, capm, acc, flagged):
    """Given float32 accumulators (random) and the true LSE/dPsum, the postprocess writes dQ = scale * acc
    + self terms, GQA dK/dV = acc + self terms when the mainloop left dK/dV in float32 accumulators
    (one query head per CTA), else (MHA, GQA with a group per CTA) dK/dV only on the self-term rows,
    summed over the group's query heads.  ``flagged``: the accumulator's q blocks whose flag is 0 read as
    zeros (NaN there)."""
    d, nb, s = 128, 2, 150
    tm = rb.CONFIGS[d].tile_m
    g = hq // hkv
    q, k, v, do = _tensors((nb, s, hq, d), (nb, s, hkv, d), seed=9)
    bounds = torch.tensor([[0, 90, 90, 150], [10, 40, 30, 140]], device="cuda", dtype=torch.int32)
    scale = 1.0 / d ** 0.5
    ex = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, cap=cap, cap_method=capm)
    lse, dps = ex[3], ex[4]  # float64 [B, H, S]
    rows, lse2, dpsum = _mainloop_stats(lse, dps, tm)
    dq_acc = torch.randn((nb, hq, rows, d), device="cuda")
    flags = None
    if flagged:  # every other q block unwritten (NaN, flag 0), the others flagged with a count
        flags = torch.zeros((nb, hq, rows // tm), device="cuda", dtype=torch.int32)
        flags[:, :, 1::2] = 3
        dq_acc.view(nb, hq, rows // tm, tm, d)[flags == 0] = float("nan")
    sentinel = 3.0
    dq, dk, dv = (torch.full_like(t, sentinel) for t in (q, k, v))
    dk_acc = dv_acc = None
    if acc:
        dk_acc, dv_acc = (torch.randn(k.shape, device="cuda") for _ in range(2))
    scale_log2 = (cap if cap is not None else scale) * rf.LOG2_E
    rb._fn("post", q.dtype, d, tm, g, "none" if cap is None else capm, False, acc, flagged)(
        q, k, v, do, lse2, dpsum, dq_acc, flags, dq, dk, dv, dk_acc, dv_acc, bounds, None, scale_log2, scale,
        cap if cap is not None else 1.0, nb, s)
    torch.cuda.synchronize()
    # expected self terms (float64), candidates outside the history
    want_dq = scale * dq_acc.nan_to_num(0.0)[:, :, :s].double().transpose(1, 2)
    self_dk = torch.zeros(k.shape, dtype=torch.float64, device="cuda")
    self_dv = torch.zeros(v.shape, dtype=torch.float64, device="cuda")
    rows_self = torch.zeros(nb, s, dtype=torch.bool, device="cuda")
    for b in range(nb):
        hl, hh, cl, ch = (int(x) for x in bounds[b])
        for j in range(s):
            if not (cl <= j < ch and not hl <= j < hh):
                continue
            rows_self[b, j] = True
            for h in range(hq):
                qj, dj = q[b, j, h].double(), do[b, j, h].double()
                kj, vj = k[b, j, h // g].double(), v[b, j, h // g].double()
                sr = scale * (qj @ kj)
                if cap is None:
                    sc, dc = sr, 1.0
                elif capm == "tanh":
                    t = torch.tanh(sr / cap)
                    sc, dc = cap * t, 1 - t * t
                else:
                    sc, dc = sr / (1 + sr.abs() / cap), 1 / (1 + sr.abs() / cap) ** 2
                p = torch.exp(sc - lse[b, h, j])
                ds = p * (dj @ vj - dps[b, h, j]) * dc
                want_dq[b, j, h] += scale * ds * kj
                self_dk[b, j, h // g] += scale * ds * qj
                self_dv[b, j, h // g] += p * dj
    tol = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dq.double(), want_dq, **tol)
    if acc:
        torch.testing.assert_close(dk.double(), dk_acc.double() + self_dk, **tol)
        torch.testing.assert_close(dv.double(), dv_acc.double() + self_dv, **tol)
    else:
        m = rows_self[:, :, None, None].expand_as(dk)
        torch.testing.assert_close(dk.double()[m], self_dk[m], **tol)
        torch.testing.assert_close(dv.double()[m], self_dv[m], **tol)
        assert (dk[~m] == sentinel).all() and (dv[~m] == sentinel).all()  # mainloop rows untouched


@pytest.mark.parametrize("zeroing", ["preprocess-zeroes", "dq_zero_in_mainloop", "claim-at-once"])
@pytest.mark.parametrize("s,hq,hkv,rows,cap,group", [
    (128, 1, 1, [[0, 128, 128, 128]], None, None),  # one history KV block, one CTA's work: the simplest case
    (300, 2, 2, [[0, 200, 200, 300], [37, 150, 160, 290]], None, None),
    (300, 4, 2, [[0, 200, 200, 300], [37, 150, 160, 290]], 10.0, False),
    (300, 4, 2, [[0, 200, 200, 300], [37, 150, 160, 290]], 10.0, True),
    (700, 2, 2, [[0, 0, 0, 700], [0, 600, 600, 700], [400, 650, 100, 300]], None, None),  # empty history
])
def test_mainloop_alone(s, hq, hkv, rows, cap, group, zeroing):
    """The mainloop given exact LSE2/dPsum and a zeroed accumulator: dQaccum * scale, dK, dV equal the
    reference gradients without the candidate self terms (those rows' dK/dV are zero).  GQA: into
    zeroed float32 accumulators (one query head per CTA) or straight into dK/dV (a group per CTA).
    ``dq_zero_in_mainloop``: the accumulator NaN-poisoned and the flags zeroed instead; the KV blocks zero
    their share of the tiles first, so every q block that the mask lets a history KV block reach comes out
    flagged (1, or 4 where a timed-out add stored its dQ) and right, every other one unflagged and untouched."""
    d, nb = 128, len(rows)
    cfg = rb.dataclasses.replace(rb.CONFIGS[d], gqa_group_per_cta=group, **DQ_FORMS[zeroing])
    zeroing = cfg.dq_zero_in_mainloop
    tm, g = cfg.tile_m, hq // hkv
    q, k, v, do = _tensors((nb, s, hq, d), (nb, s, hkv, d), seed=11)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    scale = 1.0 / d ** 0.5
    ex = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, cap=cap)
    lse, dps = ex[3], ex[4]
    prow, lse2, dpsum = _mainloop_stats(lse, dps, tm)
    dq_acc = torch.full((nb, hq, prow, d), float("nan") if zeroing else 0.0, device="cuda")
    flags = torch.zeros((nb, hq, prow // tm), device="cuda", dtype=torch.int32) if zeroing else None
    if g > 1 and not group:
        dk, dv = (torch.zeros(k.shape, device="cuda") for _ in range(2))
    else:
        dk, dv = (torch.full_like(k, float("nan")) for _ in range(2))
    scale_log2 = (cap if cap is not None else scale) * rf.LOG2_E
    rb._fn("main", q.dtype, cfg, g, "none" if cap is None else "tanh", False)(
        q, k, v, do, lse2, dpsum, dq_acc, dk, dv, bounds, None, flags, None, scale_log2, scale,
        cap if cap is not None else 1.0, nb, s)
    torch.cuda.synchronize()
    if zeroing:  # flags: 1 on the q blocks holding history or candidate rows of a row with a history
        want_flags = torch.zeros_like(flags)
        for b, (hl, hh, cl, ch) in enumerate(rows):
            if hh > hl:
                for m in range(prow // tm):
                    lo, hi = m * tm, min((m + 1) * tm, s)
                    if (lo < hh and hi > hl) or (lo < ch and hi > cl):
                        want_flags[b, :, m] = 1
        written = torch.where(flags == rb.DQ_TILE_STORED, rb.DQ_TILE_READY, flags)  # zeroed, or an add's store
        assert torch.equal(written, want_flags), (flags, want_flags)
        unwritten = (flags == 0)[:, :, :, None, None].expand(nb, hq, prow // tm, tm, d).reshape(nb, hq, prow, d)
        assert dq_acc[unwritten].isnan().all()
        dq_acc = torch.where(unwritten, torch.zeros_like(dq_acc), dq_acc)
    # the reference without the self terms: mask the diagonal of candidates outside the history away
    self_rows = torch.zeros(nb, s, dtype=torch.bool, device="cuda")
    for b, (hl, hh, cl, ch) in enumerate(rows):
        j = torch.arange(s, device="cuda")
        self_rows[b] = (j >= cl) & (j < ch) & ~((j >= hl) & (j < hh))
    want_dq, want_dk, want_dv = (t.clone() for t in ex[:3])
    for b in range(nb):
        for j in torch.nonzero(self_rows[b]).flatten().tolist():
            for h in range(hq):
                qj, dj = q[b, j, h].double(), do[b, j, h].double()
                kj, vj = k[b, j, h // g].double(), v[b, j, h // g].double()
                sr = scale * (qj @ kj)
                sc, dc = (sr, 1.0) if cap is None else (cap * torch.tanh(sr / cap), 1 - torch.tanh(sr / cap) ** 2)
                p = torch.exp(sc - lse[b, h, j])
                ds = p * (dj @ vj - dps[b, h, j]) * dc
                want_dq[b, j, h] -= scale * ds * kj
                want_dk[b, j, h // g] -= scale * ds * qj
                want_dv[b, j, h // g] -= p * dj
    got_dq = scale * dq_acc[:, :, :s].double().transpose(1, 2)
    tol = dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(got_dq, want_dq, **tol)
    assert not torch.isnan(dk).any() and not torch.isnan(dv).any()
    torch.testing.assert_close(dk.double(), want_dk, **tol)
    torch.testing.assert_close(dv.double(), want_dv, **tol)
    assert (dq_acc[:, :, s:] == 0).all()  # padding rows of the accumulator: nothing added (zero dS there)
