"""CPU tests of the ranker attention backward: float64 reference gradients, q-block ranges,
configs, sm_90a compiles of the three kernels and the PTX/SASS features they promise."""

import itertools
import math

import pytest
import torch

import cute_kernels  # noqa: F401  (sets CUTE_DSL_ARCH before cutlass is imported)
from cute_kernels.kernels import ranker_bwd as rb
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import q_block_ranges
from cute_kernels.runtime.artifacts import PTX_FEATURES, SASS_FEATURES, find_features
from cute_kernels.runtime.cache import compile_record

CASES = [  # S, bounds rows
    (13, [[0, 9, 9, 13]]),
    (13, [[2, 7, 9, 12], [0, 0, 0, 13]]),  # gap rows; empty history (candidates attend only themselves)
    (11, [[3, 11, 0, 3], [-4, 50, 20, 30]]),  # candidates before history; out-of-range bounds
    (10, [[0, 6, 4, 10], [5, 5, 5, 5]]),  # overlapping segments; all empty
]
CAPS = [(None, "tanh"), (3.0, "tanh"), (2.0, "soft_sign")]


def _inputs(nb, s, hq, hkv, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return mk(nb, s, hq, d), mk(nb, s, hkv, d), mk(nb, s, hkv, d), mk(nb, s, hq, d)


@pytest.mark.parametrize("s,rows", CASES)
@pytest.mark.parametrize("cap,cap_method", CAPS)
@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 2)])
def test_explicit_gradients_match_autograd(s, rows, cap, cap_method, hq, hkv):
    q, k, v, do = _inputs(len(rows), s, hq, hkv, 8)
    bounds = torch.tensor(rows, dtype=torch.int32)
    kw = dict(softmax_scale=0.41, cap=cap, cap_method=cap_method)
    ref = rb.ranker_attention_backward_reference(q, k, v, bounds, do, **kw)
    exp = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, **kw)
    for name, a, b in zip(("dq", "dk", "dv"), ref, exp[:3]):
        assert torch.isfinite(a).all() and torch.isfinite(b).all(), name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)
    # lse and dpsum of the explicit form match the forward reference
    o, lse = rf.ranker_attention_reference(q, k, v, bounds, return_lse=True, compute_dtype=torch.float64, **kw)
    torch.testing.assert_close(exp[3].float(), lse, equal_nan=True)
    torch.testing.assert_close(exp[4], (do * o).sum(-1).transpose(1, 2))


def test_rows_without_keys_get_zero_gradients():
    q, k, v, do = _inputs(1, 10, 2, 2, 8)
    bounds = torch.tensor([[2, 5, 7, 9]], dtype=torch.int32)  # rows 0, 1, 5, 6, 9 attend nothing
    dq, dk, dv = rb.ranker_attention_backward_reference(q, k, v, bounds, do, cap=5.0)
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    for i in (0, 1, 5, 6, 9):
        assert dq[0, i].abs().max() == 0
    # keys outside the history and the candidates get nothing; a candidate key only its own query's term
    for j in (0, 1, 5, 6, 9):
        assert dk[0, j].abs().max() == 0 and dv[0, j].abs().max() == 0
    assert dv[0, 7].abs().max() > 0


def test_candidate_self_term_formula():
    """A candidate j outside the history: dV_j = P_jj dO_j, dK_j = dS_jj q_j scale (the postprocess's terms)."""
    q, k, v, do = _inputs(1, 9, 1, 1, 8, seed=3)
    bounds = torch.tensor([[0, 5, 6, 9]], dtype=torch.int32)
    scale, cap = 0.3, 4.0
    dq, dk, dv, lse, dpsum = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, softmax_scale=scale,
                                                                   cap=cap)
    for j in (6, 7, 8):
        s_raw = scale * (q[0, j, 0] @ k[0, j, 0])
        t = math.tanh(s_raw / cap)
        p = math.exp(cap * t - lse[0, 0, j])
        ds = p * (do[0, j, 0] @ v[0, j, 0] - dpsum[0, 0, j]) * (1 - t * t)
        torch.testing.assert_close(dv[0, j, 0], p * do[0, j, 0])
        torch.testing.assert_close(dk[0, j, 0], ds * scale * q[0, j, 0])


def test_varlen_reference_matches_padded():
    s_list, hq, hkv, d = [7, 0, 12], 4, 2, 8
    rows = [[0, 4, 4, 7], [0, 0, 0, 0], [2, 9, 9, 12]]
    qs, ks, vs, dos = zip(*[_inputs(1, s, hq, hkv, d, seed=i) for i, s in enumerate(s_list)])
    cat = lambda ts: torch.cat([t[0] for t in ts], 0)  # noqa: E731
    cu = torch.tensor([0, 7, 7, 19], dtype=torch.int32)
    bounds = torch.tensor(rows, dtype=torch.int32)
    for fn in (rb.ranker_attention_backward_reference, rb.ranker_attention_backward_explicit):
        packed = fn(cat(qs), cat(ks), cat(vs), bounds, cat(dos), cap=2.0, cu_seqlens=cu)
        off = 0
        for i, s in enumerate(s_list):
            if s == 0:
                continue
            one = fn(qs[i], ks[i], vs[i], bounds[i:i + 1], dos[i], cap=2.0)
            for a, b in zip(packed[:3], one[:3]):
                torch.testing.assert_close(a[off:off + s], b[0])
            off += s


def test_reference_gradcheck_tiny():
    """Finite differences of the float64 forward reference agree with the gradients (tiny shapes)."""
    q, k, v, _ = _inputs(1, 6, 2, 1, 4)
    bounds = torch.tensor([[1, 4, 3, 6]], dtype=torch.int32)
    for cap, m in CAPS:
        f = lambda q, k, v: rf.ranker_attention_reference(  # noqa: E731
            q, k, v, bounds, cap=cap, cap_method=m, compute_dtype=torch.float64)
        assert torch.autograd.gradcheck(f, tuple(t.clone().requires_grad_(True) for t in (q, k, v)))


def test_reference_argument_errors():
    q, k, v, do = _inputs(1, 5, 2, 2, 8)
    b = torch.tensor([[0, 3, 3, 5]], dtype=torch.int32)
    with pytest.raises(ValueError, match="dout"):
        rb.ranker_attention_backward_reference(q, k, v, b, do[:, :4])
    with pytest.raises(ValueError, match="cap"):
        rb.ranker_attention_backward_explicit(q, k, v, b, do, cap=-1.0)


def test_q_block_ranges_brute_force():
    s = 11
    for tm in (2, 3, 4):
        for hl, hh, cl, ch in itertools.product(range(s + 1), repeat=4):
            if hh < hl or ch < cl:
                continue
            want = sorted({i // tm for i in range(s) if hl <= i < hh or cl <= i < ch})
            lo1, n1, lo2, n2 = q_block_ranges(hl, hh, cl, ch, tm)
            assert list(range(lo1, lo1 + n1)) + list(range(lo2, lo2 + n2)) == want, (hl, hh, cl, ch, tm)


def test_padded_offsets_leave_room():
    tm = 64
    cu = [0, 1, 65, 200, 200, 329]
    nb = len(cu) - 1
    total = rb.padded_rows(cu[-1], nb, tm, varlen=True)
    ends = []
    for b in range(nb):
        start = rb.padded_offset(cu[b], b, tm)
        assert start % tm == 0
        ends.append(start + -(-(cu[b + 1] - cu[b]) // tm) * tm)
        if b:
            assert start >= ends[b - 1]
    assert ends[-1] <= total
    assert rb.padded_rows(100, 3, tm, varlen=False) == 128


def test_configs_validate():
    for cfg in rb.CONFIGS.values():
        cfg.validate()
        assert cfg.smem_bytes() <= rf.SMEM_CAPACITY
    import dataclasses

    base = rb.CONFIGS[128]
    for kw, msg in ((dict(head_dim=256), "head dims"), (dict(tile_n=64), "tile_n"), (dict(stages=9), "stages"),
                    (dict(deterministic=True), "deterministic"), (dict(mma_regs=250), "multiples of 8"),
                    (dict(tile_m=128), "accumulator registers")):
        with pytest.raises(ValueError, match=msg):
            dataclasses.replace(base, **kw).validate()


@pytest.mark.parametrize("target", rb.compile_targets(), ids=lambda t: t.label)
def test_mainloop_compiles_sm90a(target):
    target.build()
    rec = compile_record(target.kernel, target.key)
    ptx = find_features(rec.ptx, PTX_FEATURES)
    for feat in ("wgmma", "tma load (cp.async.bulk.tensor)", "tma reduce-add", "setmaxnreg", "named barrier",
                 "mbarrier", "stmatrix"):
        assert feat in ptx, (feat, ptx)
    _, _, g, _, varlen = target.key
    if g == 1 and not varlen:
        assert "tma store (cp.async.bulk.tensor)" in ptx
    if varlen:
        assert "st.global.v4 (16B stores)" in ptx
    assert "cp.reduce.async.bulk.tensor" in rec.ptx and ".global.shared::cta.add" in rec.ptx  # dQ (float32 map)
    assert rec.ptx.count("wgmma.mma_async") >= 5
    if rec.sass:
        sass = find_features(rec.sass, SASS_FEATURES)
        for feat in ("HGMMA", "USETMAXREG", "UTMALDG", "UTMAREDG"):
            assert feat in sass, (feat, sass)
