"""CPU tests of the ranker attention backward: float64 reference gradients, q-block ranges,
configs, sm_90a compiles of the three kernels and the PTX/SASS features they promise."""

import dataclasses
import itertools
import math
import re
import warnings

import numpy as np
import pytest
import torch

import cute_kernels  # noqa: F401  (sets CUTE_DSL_ARCH before cutlass is imported)
from cute_kernels.kernels import ranker_bwd as rb
from cute_kernels.kernels import ranker_bwd_buffers as buffers
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import clamp_bounds, q_block_ranges
from cute_kernels.runtime.artifacts import PTX_FEATURES, SASS_FEATURES, find_features, sass_loops
from cute_kernels.runtime.cache import compile_record

CASES = [  # S, bounds rows
    (13, [[0, 9, 9, 13]]),
    (13, [[2, 7, 9, 12], [0, 0, 0, 13]]),  # gap rows; empty history (candidates attend only themselves)
    (11, [[3, 11, 0, 3], [-4, 50, 20, 30]]),  # candidates before history; out-of-range bounds
    (10, [[0, 6, 4, 10], [5, 5, 5, 5]]),  # overlapping segments; all empty
]
CAPS = [(None, "tanh"), (3.0, "tanh"), (2.0, "soft_sign")]


@pytest.fixture(autouse=True)
def _fresh_validation_memo(monkeypatch):
    """Each test starts without the backward's cached validations (tests replace _validate_backward)."""
    monkeypatch.setattr(rb, "_VALIDATED", {})


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


@pytest.mark.parametrize("cu", [None, [0, 5, 5, 13]], ids=["fixed", "varlen"])
def test_explicit_gradients_given_out(cu):
    """``out=``: dPsum comes from the given forward output.  The exact O gives the exact gradients; an O
    off by a little on a one-key row (dQ = dK = 0 exactly there) gives them dO.dO_err-sized values, what
    ``grad_tolerance(ref, low, ref_given_out)`` then allows; a misshapen ``out`` is a ValueError."""
    if cu is None:
        q, k, v, do = _inputs(2, 13, 4, 2, 8, seed=3)
        bounds = torch.tensor([[0, 9, 9, 13], [0, 1, 0, 1]], dtype=torch.int32)  # batch row 1: one one-key row
        cu_t, row = None, (1, 0)
    else:
        q, k, v, do = (t.reshape(26, t.shape[2], 8)[:15] for t in _inputs(2, 13, 4, 2, 8, seed=3))  # 2 past cu[-1]
        bounds = torch.tensor([[0, 3, 3, 5], [0, 0, 0, 0], [0, 1, 0, 1]], dtype=torch.int32)  # token 5: one key
        cu_t, row = torch.tensor(cu, dtype=torch.int32), (5,)
    kw = dict(cap=3.0, cu_seqlens=cu_t)
    exact = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, **kw)
    o = rf.ranker_attention_reference(q, k, v, bounds, compute_dtype=torch.float64, **kw)
    if cu is not None:  # the reference returns cu_seqlens[-1] rows; the kernel's out has them all
        o = torch.cat([o, torch.zeros_like(q[o.shape[0]:])])
    given = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, out=o, **kw)
    for name, a, b in zip(("dq", "dk", "dv", "lse", "dpsum"), exact, given):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True, msg=name)
    assert exact[0][row].abs().max() < 1e-12 and exact[1][row].abs().max() < 1e-12  # one key: P is constant
    o_off = o.clone()
    o_off[row] += 2.0 ** -7  # one bf16 ulp of a value near 1
    off = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, out=o_off, **kw)
    assert off[0][row].abs().max() > 1e-3 and off[1][row].abs().max() > 1e-3  # the inherited error
    torch.testing.assert_close(off[2], exact[2], rtol=0, atol=0)  # dV has no dPsum term
    assert rb.grad_tolerance(exact[0], exact[0], off[0]) >= (off[0] - exact[0]).abs().max().item() + 1e-3
    with pytest.raises(ValueError, match="out must be shaped like q"):
        rb.ranker_attention_backward_explicit(q, k, v, bounds, do, out=o[:, :-1] if cu is None else o[1:], **kw)


@pytest.mark.parametrize("cu", [None, [0, 4, 4, 11]], ids=["fixed", "varlen"])
@pytest.mark.parametrize("cap,cap_method", CAPS)
def test_lse_gradient_explicit_matches_autograd(cap, cap_method, cu):
    """With the gradient of the LSE (``dlse``): the explicit form (dPsum less dLSE, the kernels' math) agrees
    with autograd through the reference's LSE; rows with no valid key ignore dLSE (NaN there included) and
    get zero gradients; dV has no LSE term; the LSE term is there in dQ and dK."""
    if cu is None:
        q, k, v, do = _inputs(2, 11, 4, 2, 8, seed=5)
        bounds = torch.tensor([[1, 6, 6, 10], [0, 0, 0, 0]], dtype=torch.int32)
        dlse = torch.randn(2, 4, 11, dtype=torch.float32, generator=torch.Generator().manual_seed(6))
        empty = [(slice(None), slice(None), [0, 10]), (1,)]
    else:
        q, k, v, do = (t[0] for t in _inputs(1, 13, 4, 2, 8, seed=5))  # 2 packed tail tokens
        cu = torch.tensor(cu, dtype=torch.int32)
        bounds = torch.tensor([[0, 2, 2, 4], [0, 0, 0, 0], [1, 5, 5, 6]], dtype=torch.int32)
        dlse = torch.randn(4, 13, dtype=torch.float32, generator=torch.Generator().manual_seed(6))
        empty = [(slice(None), [4, 10, 11, 12])]
    for idx in empty:
        dlse[idx] = float("nan")
    kw = dict(softmax_scale=0.41, cap=cap, cap_method=cap_method, cu_seqlens=cu)
    ref = rb.ranker_attention_backward_reference(q, k, v, bounds, do, dlse=dlse, **kw)
    exp = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, dlse=dlse, **kw)
    base = rb.ranker_attention_backward_reference(q, k, v, bounds, do, **kw)
    for name, a, b, c in zip(("dq", "dk", "dv"), ref, exp[:3], base):
        assert torch.isfinite(a).all() and torch.isfinite(b).all(), name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)
        if name == "dv":
            torch.testing.assert_close(a, c, rtol=0, atol=0)
        else:
            assert (a - c).norm() > 0.05 * a.norm(), name
    # a float64 dLSE is not rounded to float32 on its way through the reference's LSE
    ref64 = rb.ranker_attention_backward_reference(q, k, v, bounds, do, dlse=dlse.double() / 3, **kw)
    exp64 = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, dlse=dlse.double() / 3, **kw)
    for a, b in zip(ref64, exp64[:3]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # the LSE alone as the loss (dO = 0)
    zero = torch.zeros_like(do)
    ref = rb.ranker_attention_backward_reference(q, k, v, bounds, zero, dlse=dlse, **kw)
    exp = rb.ranker_attention_backward_explicit(q, k, v, bounds, zero, dlse=dlse, **kw)
    for a, b in zip(ref, exp[:3]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert (ref[2] == 0).all() and ref[0].abs().max() > 0


def test_lse_gradient_finite_differences():
    """d(sum(lse * w)) / dq by central differences of the float64 LSE (from the explicit form) at a few
    entries: the reference's dLSE gradient, a tanh cap."""
    q, k, v, do = _inputs(1, 7, 2, 1, 4, seed=8)
    bounds = torch.tensor([[0, 4, 4, 7]], dtype=torch.int32)
    w = torch.randn(1, 2, 7, dtype=torch.float32, generator=torch.Generator().manual_seed(9))
    kw = dict(cap=3.0, cap_method="tanh")
    dq, dk, _ = rb.ranker_attention_backward_reference(q, k, v, bounds, torch.zeros_like(do), dlse=w, **kw)

    def f(qq, kk):
        return (rb.ranker_attention_backward_explicit(qq, kk, v, bounds, do, **kw)[3] * w.double()).sum().item()

    h = 1e-6
    for t, g, idx in ((q, dq, (0, 5, 1, 2)), (q, dq, (0, 1, 0, 0)), (k, dk, (0, 2, 0, 3)), (k, dk, (0, 6, 0, 1))):
        plus, minus = t.clone(), t.clone()
        plus[idx] += h
        minus[idx] -= h
        args = lambda x: (x, k) if t is q else (q, x)  # noqa: E731
        fd = (f(*args(plus)) - f(*args(minus))) / (2 * h)
        assert abs(fd - g[idx].item()) <= 1e-6 * max(1.0, abs(fd)), (idx, fd, g[idx].item())


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


def test_varlen_reference_trailing_tokens_get_zero_gradients():
    """Packed tokens past cu_seqlens[-1] (the GPU varlen test has 17 of them): zero gradients, the
    rest as without the tail; the autograd and explicit references agree."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(12, h, 4, generator=g) for h in (2, 1, 1))
    do = torch.randn(q.shape, generator=g)
    bounds = torch.tensor([[0, 3, 3, 5], [1, 3, 0, 4]], dtype=torch.int32)
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    ref = rb.ranker_attention_backward_reference(q, k, v, bounds, do, cap=3.0, cu_seqlens=cu)
    exp = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, cap=3.0, cu_seqlens=cu)
    head = rb.ranker_attention_backward_reference(q[:9], k[:9], v[:9], bounds, do[:9], cap=3.0, cu_seqlens=cu)
    for a, b, h, t in zip(ref, exp[:3], head, (q, k, v)):
        assert a.shape == t.shape and a.dtype == torch.float64
        assert (a[9:] == 0).all() and a[:9].abs().max() > 0
        torch.testing.assert_close(a[:9], h)
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # all sequences empty, and a tail: all zeros, shaped like the inputs
    empty = rb.ranker_attention_backward_reference(q, k, v, bounds, do, cu_seqlens=torch.zeros(3, dtype=torch.int32))
    for a, t in zip(empty, (q, k, v)):
        assert a.shape == t.shape and (a == 0).all()


def test_reference_runs_under_no_grad_and_inference_mode():
    """The autograd reference differentiates also under torch.no_grad and torch.inference_mode (inference
    tensors as inputs too, packed with dlse): the same gradients as in grad mode."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(12, h, 8, generator=g) for h in (2, 1, 1))
    do = torch.randn(q.shape, generator=g)
    dlse = torch.randn(2, 12, generator=g)
    bounds = torch.tensor([[0, 3, 3, 5], [1, 3, 0, 4]], dtype=torch.int32)
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    args = (q, k, v, bounds, do)
    want = rb.ranker_attention_backward_reference(*args, cap=3.0, cu_seqlens=cu, dlse=dlse)
    with torch.no_grad():
        got_no_grad = rb.ranker_attention_backward_reference(*args, cap=3.0, cu_seqlens=cu, dlse=dlse)
    with torch.inference_mode():
        inference = [t.clone() for t in (*args, cu, dlse)]
        assert all(t.is_inference() for t in inference)
        got_inference = rb.ranker_attention_backward_reference(*inference[:5], cap=3.0, cu_seqlens=inference[5],
                                                               dlse=inference[6])
    for got in (got_no_grad, got_inference):
        for a, b in zip(got, want):
            assert a.abs().max() > 0
            torch.testing.assert_close(a, b, rtol=0, atol=0)


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


def _walk_schedule(count, n_kv, walk_stagger):
    """The staggered walks of :meth:`RankerAttentionBwd.walk_index` in plain ints: per KV block rank, the
    walk index of each step, with the stagger capped as ``block_work`` caps it."""
    stagger = min(walk_stagger, count // n_kv) * (n_kv <= rb.STAGGER_MAX_KV_BLOCKS)
    return stagger, [[(i + (n_kv - 1 - r) * stagger) % count for i in range(count)] for r in range(n_kv)]


def _add_position(t, rank, n_kv, stagger):
    """:meth:`RankerAttentionBwd.dq_add_position`'s formula in plain ints."""
    if stagger == 0:
        return rank
    rho = n_kv - 1 - rank
    first = min(n_kv - 1, t // stagger)
    return first - rho + n_kv * (first < rho)


@pytest.mark.parametrize("walk_stagger", [1, 2, 3, 64])
def test_dq_add_positions_follow_the_staggered_walks(walk_stagger):
    """Deterministic mode with ``walk_stagger``: for every q block, the KV blocks' add positions are a
    permutation of 0..n_kv-1 that follows the step at which each reaches it (ties, which the cap prevents,
    would need an order), so each waits only for KV blocks that got there at an earlier step (no wait
    cycle), and for the KV block just below it (the highest for the lowest); and every walk visits every q
    block once.  Brute force over the block counts a sequence can
    have (``count >= n_kv``; fewer q blocks than KV blocks, 80-row tiles, cap the stagger to 0)."""
    for n_kv in (*range(1, 20), rb.STAGGER_MAX_KV_BLOCKS, rb.STAGGER_MAX_KV_BLOCKS + 1):
        for count in range(1, 3 * n_kv + 5):
            stagger, walks = _walk_schedule(count, n_kv, walk_stagger)
            assert all(sorted(w) == list(range(count)) for w in walks)
            for t in range(count):
                steps = [w.index(t) for w in walks]
                pos = [_add_position(t, r, n_kv, stagger) for r in range(n_kv)]
                assert sorted(pos) == list(range(n_kv)), (n_kv, count, t, pos)
                order = sorted(range(n_kv), key=lambda r: (steps[r], r))  # who reaches t when (KV order on a tie)
                assert [order.index(r) for r in range(n_kv)] == pos, (n_kv, count, t, steps, pos)
                if stagger:
                    assert len(set(steps)) == n_kv  # no two KV blocks at one q block in the same step
                    # each waits for the KV block below it (launched before it), the lowest for the highest
                    for p in range(1, n_kv):
                        assert order[p - 1] == (order[p] - 1) % n_kv, (n_kv, count, t, order)


def test_resolve_walk_stagger():
    """The stagger stays where a sequence's KV blocks fit in a third of the SMs and under the kernel's cap,
    else 0."""
    import dataclasses

    cfg = dataclasses.replace(rb.CONFIGS[128], walk_stagger=2)
    assert rb.resolve_walk_stagger(cfg, 4608, 132).walk_stagger == 2  # 36 KV blocks
    assert rb.resolve_walk_stagger(cfg, 128 * 44, 132).walk_stagger == 2  # a third of the SMs
    assert rb.resolve_walk_stagger(cfg, 128 * 44 + 1, 132).walk_stagger == 0
    assert rb.resolve_walk_stagger(cfg, 128 * 64, 264).walk_stagger == 2
    assert rb.resolve_walk_stagger(cfg, 128 * 64 + 1, 264).walk_stagger == 0  # the kernel's cap
    assert rb.resolve_walk_stagger(cfg, 128 * 5, 16).walk_stagger == 2  # a 16-SM MIG slice
    assert rb.resolve_walk_stagger(cfg, 128 * 5 + 1, 16).walk_stagger == 0
    assert rb.resolve_walk_stagger(rb.CONFIGS[128], 128, 132) is rb.CONFIGS[128]
    # None: the deterministic mode's stagger, none in the default mode
    assert rb.CONFIGS[128].walk_stagger is None and rb.CONFIGS[128].walk_stagger_steps() == 0
    det = dataclasses.replace(rb.CONFIGS[128], deterministic=True)
    assert det.walk_stagger_steps() == rb.DETERMINISTIC_WALK_STAGGER > 0
    assert rb.resolve_walk_stagger(det, 4608, 132) is det
    assert rb.resolve_walk_stagger(det, 16384, 132).walk_stagger == 0
    a = rb.call_launch_args(torch.bfloat16, cfg, 1, 1, 16, 16384 + 1024, None, "tanh", False, 132)
    assert a["main"][1].walk_stagger == 0


def test_padded_offsets_leave_room():
    tm = 64
    cu = [0, 1, 65, 200, 200, 329]
    nb = len(cu) - 1
    total = buffers.padded_rows(cu[-1], nb, tm, varlen=True)
    ends = []
    for b in range(nb):
        start = buffers.padded_offset(cu[b], b, tm)
        assert start % tm == 0
        ends.append(start + -(-(cu[b + 1] - cu[b]) // tm) * tm)
        if b:
            assert start >= ends[b - 1]
    assert ends[-1] <= total
    assert buffers.padded_rows(100, 3, tm, varlen=False) == 128


def test_configs_validate():
    for cfg in (*rb.CONFIGS.values(), rb.D64_UNCAPPED):
        cfg.validate()
        assert cfg.smem_bytes() + rb.STATIC_SMEM_BYTES <= rf.SMEM_CAPACITY
    import dataclasses

    base = rb.CONFIGS[128]
    for kw, msg in ((dict(head_dim=256), "needs split_head_dim"), (dict(head_dim=96), "head dims"),
                    (dict(tile_n=64), "tile_n"), (dict(stages=9), "stages"),
                    (dict(split_head_dim=True), "split_head_dim: tile_n=128"),
                    (dict(split_head_dim=True, tile_n=64), "keys-split schedule"),
                    (dict(head_dim=256, tile_n=64, split_head_dim=True, dq_first=False, dq_swap_ab=False,
                          skip_key_bias=False), "shared memory"),
                    (dict(mma_regs=250), "multiple of 8"), (dict(producer_regs=16), r"multiple of 8 in \[24, 256\]"),
                    (dict(tile_m=128), "accumulator registers"), (dict(ds_stages=3), "ds_stages"),
                    (dict(tile_m=80, stages=3), "shared memory"),
                    (dict(dq_first=False, dk_from_smem=True), "dk_from_smem needs dq_first"),
                    (dict(tile_m=80, dq_swap_ab=False), "use dq_swap_ab"), (dict(tile_m=96), "tile_m"),
                    (dict(head_dim=64, tile_m=64), "dq_swap_ab: head_dim=64"),
                    (dict(walk_stagger=-1), "walk_stagger"), (dict(walk_stagger=65), "walk_stagger"),
                    (dict(dq_zero_wait_cycles=-1), "dq_zero_wait_cycles"),
                    (dict(dq_zero_wait_cycles=1 << 40), "dq_zero_wait_cycles")):
        with pytest.raises(ValueError, match=msg):
            dataclasses.replace(base, **kw).validate()
    with pytest.raises(ValueError, match="must not get more"):  # ptxas C7406, a setmaxnreg.dec above every count
        dataclasses.replace(rb.CONFIGS[64], producer_regs=200, mma_regs=152).validate()
    for bad in (True, 1.5, "3"):  # (an int: a bool or float is refused, not truncated)
        with pytest.raises(TypeError, match="dq_zero_wait_cycles"):
            dataclasses.replace(base, dq_zero_wait_cycles=bad)


SPLIT_128 = dict(split_head_dim=True, tile_n=64, dq_first=False, dq_swap_ab=False, skip_key_bias=False)


@pytest.mark.parametrize("fields", [{}, dict(tile_m=80, ds_stages=1), dict(tile_m=80, ds_stages=1, stages=1),
                                    dict(stages=3, ds_stages=1), dict(head_dim=64, dq_swap_ab=False),
                                    dict(head_dim=64, tile_m=128, dq_swap_ab=False),
                                    dict(head_dim=256), dict(head_dim=256, ds_stages=1),
                                    dict(**SPLIT_128, ds_stages=1), dict(**SPLIT_128, stages=3)],
                         ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()) or "shipped")
def test_smem_bytes_is_the_struct_size(fields):
    """RankerBwdConfig.smem_bytes (what validate() checks against the limit, with the 1024 B of static
    smem) equals the size of the kernel's SharedStorage struct (alignment padding and the 1024-byte
    rounding of the total included), so a config that fits is not refused and one that does not is."""
    import cutlass
    from cute_kernels.layouts.static import trace

    fields = dict(fields)  # (the parameter's dict is shared: not popped in place)
    base = rb.CONFIGS[fields.pop("head_dim")] if fields.get("head_dim") == 256 else rb.CONFIGS[128]
    cfg = rb.dataclasses.replace(base, **fields)
    box = {}

    def build():
        box["struct"] = rb.shared_storage(cutlass.BFloat16, cfg, rb.smem_layouts(cutlass.BFloat16, cfg))
        return 0

    trace(build)
    assert box["struct"].__sizeof__() == cfg.smem_bytes()


def test_dq_split_rows_compiles():
    """dq_split_rows (shipped at D=64 with 128 q rows: dQ = dS K with the rows split between the
    warpgroups): n64 dQ WGMMAs instead of n32, each warpgroup's part 64 rows x 64 float32 columns (two 64x32 TMA boxes),
    no spills; refused with dq_swap_ab or 64-row tiles."""
    import dataclasses

    cfg = rb.D64_UNCAPPED
    assert cfg.dq_split_rows  # shipped
    args = rb.launch_args(torch.bfloat16, cfg, 1, "none", False)
    rb._compile(*args["main"])
    rec = compile_record(rb.NAME, (str(torch.bfloat16), *args["main"][1:]))
    assert "m64n32k16" not in rec.ptx  # (m64n64 is there either way: the dK/dV GEMMs at D=64)
    assert rec.ptx.count("cp.reduce.async.bulk.tensor") == 4 and all(r.stack_bytes == 0 for r in rec.resources)
    cols = rb.launch_args(torch.bfloat16, dataclasses.replace(cfg, dq_split_rows=False), 1, "none", False)
    rb._compile(*cols["main"])
    assert "m64n32k16" in compile_record(rb.NAME, (str(torch.bfloat16), *cols["main"][1:])).ptx
    for bad in (dict(tile_m=64), dict(head_dim=128, dq_swap_ab=True)):  # 64-row tiles; dQ^T = K^T dS^T
        with pytest.raises(ValueError, match="dq_split_rows"):
            dataclasses.replace(cfg, **bad).validate()


def test_80_row_tiles_compile():
    """FA3's 80-row q tiles (dq_swap_ab, one dS^T buffer): n80 WGMMAs for S^T/dP^T and dQ^T, and the
    LSE/dPsum smem stages (TMA destinations) 128-byte apart (the 320-byte stride faulted on the GPU)."""
    import dataclasses

    cfg = dataclasses.replace(rb.CONFIGS[128], tile_m=80, ds_stages=1)
    args = rb.launch_args(torch.bfloat16, cfg, 1, "none", False)
    rb._compile(*args["main"])
    rec = compile_record(rb.NAME, (str(torch.bfloat16), *args["main"][1:]))
    assert "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16" in rec.ptx
    assert cfg.smem_bytes() + rb.STATIC_SMEM_BYTES <= rf.SMEM_CAPACITY
    assert rb.stats_stage_stride(80) == 96 and rb.stats_stage_stride(64) == 64


@pytest.mark.parametrize("target", [t for t in rb.compile_targets() if t.kernel == rb.NAME], ids=lambda t: t.label)
def test_mainloop_compiles_sm90a(target):
    target.build()
    rec = compile_record(target.kernel, target.key)
    ptx = find_features(rec.ptx, PTX_FEATURES)
    for feat in ("wgmma", "tma load (cp.async.bulk.tensor)", "tma reduce-add", "setmaxnreg", "named barrier",
                 "mbarrier", "stmatrix"):
        assert feat in ptx, (feat, ptx)
    _, cfg, g, _, varlen = target.key
    # ordered adds (deterministic: add-counters) or tiles zeroed in the mainloop (flags set by exchange): an acquire
    # spin, then the release of int32 flags; neither without them (a long-sequence target: the preprocess zeroes)
    release = "atom.global.release.add" if cfg.deterministic else "atom.global.release.exch"
    assert ("atom.global.acquire.add" in rec.ptx and release in rec.ptx) is rb.dq_flagged(cfg)
    if cfg.deterministic:  # the first add in order TMA-stores its dQ tile
        assert re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta", rec.ptx)
    # dq_zero_in_mainloop zeroes sdQ with 16-byte shared stores of four 0s, then TMA-stores it over its dQ tiles
    zeroes = re.search(r"st\.shared\.v4\.\w+\s+\[[^]]+\], \{0f00000000", rec.ptx) is not None
    assert zeroes is cfg.dq_zero_in_mainloop
    # ... after claiming each tile by compare-and-swap (as does an add that times out waiting for a tile's zeroing)
    assert ("atom.global.cas.b32" in rec.ptx) is cfg.dq_zero_in_mainloop
    assert ("atom.global.release.cas.b32" in rec.ptx) is cfg.dq_zero_in_mainloop  # the zeroed tiles opened
    if g == 1 and not varlen:
        assert "tma store (cp.async.bulk.tensor)" in ptx
    if varlen and g == 1:  # predicated 16-byte dK/dV stores (GQA: TMA reduce-adds)
        assert "st.global.v4 (16B stores)" in ptx
    assert "cp.reduce.async.bulk.tensor" in rec.ptx and ".global.shared::cta.add" in rec.ptx  # dQ (float32 map)
    assert rec.ptx.count("wgmma.mma_async") >= 5
    # soft_sign clamps x = scale * q.k / cap to +-2**100 before 1 / (1 + |x|) (sm90_helpers.soft_sign_unit)
    assert ("min.NaN.xorsign.abs.f32" in rec.ptx) == (target.key[3] == "soft_sign")
    if rec.sass:
        sass = find_features(rec.sass, SASS_FEATURES)
        for feat in ("HGMMA", "USETMAXREG", "UTMALDG", "UTMAREDG"):
            assert feat in sass, (feat, sass)


# Mainloops that ptxas spills a few bytes in, as shipped (label -> stack bytes at most): the D=128 configs
# issue the dQ GEMM first (dq_first), measured faster with these spills than without dq_first (see
# ranker_bwd.CONFIGS); the tanh cap adds its own.  Every other shipped mainloop must be spill-free, and a
# listed one that stops spilling fails too, so the table stays true.
KNOWN_SPILL_BYTES = {  # ptxas stack bytes of the shipped D=128 config (dQ^T = K^T dS^T, session 12); MHA tanh with
    # skip_key_bias's two q-block loops (session 29): 16 (24 with one loop)
    # (24 since session 49's claims of the zeroed tiles in the dQ warp)
    "bfloat16 D=128 gqa=1 cap=tanh": 24,
    # soft_sign: a compile target since session 66 (a newcomer found its spill unlisted; not measured for speed)
    "bfloat16 D=128 gqa=1 cap=soft_sign": 40,
    # GQA group tanh: 8 B until session 48, 24 since the dQ warp zeroes tiles (dq_zero_in_mainloop; the spills
    # are in the MMA warpgroups' loop, five values kept across it)
    "bfloat16 D=128 gqa=4 group cap=tanh": 24,
    "bfloat16 D=128 gqa=4 group cap=tanh varlen det": 8,
    "bfloat16 D=128 gqa=4 per-head cap=tanh varlen det": 8,
}
# Where those bytes are spent: LDL / STL per iteration of each q-block loop (the innermost SASS loops of 200+
# instructions, in address order; MHA has two, skip_key_bias's: whole history KV blocks, the headline's, first,
# then KV blocks that need the key bias), at most.  A loop with none where the table lists some fails, as above.
KNOWN_QBLOCK_LOOP_SPILLS = {
    "bfloat16 D=128 gqa=1 cap=tanh": (3, 11),
    "bfloat16 D=128 gqa=1 cap=soft_sign": (17, 15),
    "bfloat16 D=128 gqa=4 group cap=tanh": (11,),
    "bfloat16 D=128 gqa=4 group cap=tanh varlen det": (4,),
    "bfloat16 D=128 gqa=4 per-head cap=tanh varlen det": (2,),
}
QBLOCK_LOOP_MIN_INSTRUCTIONS = 200  # the q-block loops have 396-692 instructions, the others at most 83


@pytest.mark.parametrize("s,sms,det,want", [
    (4608, 132, False, True),                 # 36 KV blocks <= min(64, 132 // 3)
    (44 * 128, 132, False, True),             # 44: the edge
    (44 * 128 + 1, 132, False, False),        # 45 KV blocks: the preprocess zeroes
    (16384 + 1024, 132, False, False),
    (1280, 30, False, True), (1281, 30, False, False),  # a MIG slice of 30 SMs: 10 blocks at most
    (1280, 132, True, False),                 # the deterministic mode does not use it
])
def test_resolve_dq_zeroing(s, sms, det, want):
    """dq_zero_in_mainloop stays on where a sequence's history KV blocks fit at once in a third of the SMs
    (and at most STAGGER_MAX_KV_BLOCKS): a KV block's first dQ add may wait for another's start.  The
    pre/postprocess keys follow it (flags, no accumulator zeroing), also in the deterministic mode."""
    cfg = rb.dataclasses.replace(rb.CONFIGS[128], deterministic=det)
    got = rb.resolve_dq_zeroing(cfg, s, sms)
    assert got.dq_zero_in_mainloop is want
    a = rb.call_launch_args(torch.bfloat16, cfg, 1, 2, 4, s, None, "tanh", False, sms)
    assert a["main"][1].dq_zero_in_mainloop is want
    assert a["pre"][4] is a["post"][7] is (want or det)
    off = rb.dataclasses.replace(cfg, dq_zero_in_mainloop=False)
    assert rb.resolve_dq_zeroing(off, 128, 132) is off


def test_call_launch_args_follows_the_eager_call():
    """call_launch_args (the eager backward's keys, also what the probe precompiles): cap method "none"
    without a cap, the given one with a cap; the GQA form resolved."""
    cfg = rb.CONFIGS[128]
    a = rb.call_launch_args(torch.bfloat16, cfg, 4, 4, 4, 4608, None, "tanh", False, 132)
    assert a["main"][3] == "none" and a["post"][4] == "none" and a["main"][1].gqa_group_per_cta is True
    a = rb.call_launch_args(torch.bfloat16, cfg, 4, 1, 2, 4608, 20.0, "soft_sign", True, 132)
    assert a["main"][3] == "soft_sign" and a["main"][1].gqa_group_per_cta is False and a["post"][6]


@pytest.mark.parametrize("g,nb,hkv,s,sms,given,want", [
    (1, 4, 16, 4608, 132, None, None),     # MHA: None (the field changes nothing there: one compile key)
    (1, 4, 16, 4608, 132, True, None),
    (4, 4, 4, 4608, 132, None, True),      # 4 * 4 * 36 = 576 CTAs >= 2 waves: a group per CTA
    (4, 1, 2, 4608, 132, None, False),     # 72 CTAs: one query head per CTA (288)
    (8, 2, 1, 16896, 132, None, True),     # 2 * 1 * 132 = 264: exactly two waves
    (8, 2, 1, 16768, 132, None, False),    # 262 CTAs
    (4, 1, 2, 4608, 132, True, True),      # an explicit choice is kept
    (4, 4, 4, 4608, 132, False, False),
])
def test_resolve_gqa_group(g, nb, hkv, s, sms, given, want):
    cfg = rb.dataclasses.replace(rb.CONFIGS[128], gqa_group_per_cta=given)
    assert rb.resolve_gqa_group(cfg, g, nb, hkv, s, sms).gqa_group_per_cta is want
    with pytest.raises(TypeError, match="gqa_group_per_cta"):
        rb.dataclasses.replace(cfg, gqa_group_per_cta=1).validate()


@pytest.mark.parametrize("target", [t for t in rb.compile_targets() if t.kernel == rb.NAME], ids=lambda t: t.label)
def test_mainloop_register_spills_bounded(target):
    target.build()
    rec = compile_record(target.kernel, target.key)
    assert "local memory (spill)" not in find_features(rec.ptx, PTX_FEATURES)
    if not rec.sass:
        pytest.skip("no SASS (disassembler unavailable)")
    stack = max(r.stack_bytes or 0 for r in rec.resources)
    bound = KNOWN_SPILL_BYTES.get(target.label, 0)
    assert stack <= bound, (target.label, stack, bound)
    assert (stack > 0) == (bound > 0), f"{target.label}: {stack} B of stack; update KNOWN_SPILL_BYTES"
    assert ("LDL/STL (local memory)" in find_features(rec.sass, SASS_FEATURES)) == (bound > 0)
    loops = [lp for lp in sass_loops(rec.sass) if lp.innermost and lp.instructions >= QBLOCK_LOOP_MIN_INSTRUCTIONS]
    spills = tuple(lp.local_memory for lp in loops)
    bounds = KNOWN_QBLOCK_LOOP_SPILLS.get(target.label, (0,) * len(loops))
    assert len(spills) == len(bounds) and all(0 < n <= b or n == b == 0 for n, b in zip(spills, bounds)), (
        f"{target.label}: LDL/STL per q-block loop iteration {spills} (loops of {[lp.instructions for lp in loops]} "
        f"instructions), KNOWN_QBLOCK_LOOP_SPILLS says at most {bounds}: update the table")


# ---------------------------------------------------------------- the three-kernel plan, emulated in float64
def _emulate(q, k, v, bounds, do, scale, cap, cap_method, tile_m=4, tile_n=4):
    """The kernels' algorithm in torch (one sequence batch, fixed length): preprocess (dPsum, LSE2 with
    +inf on empty rows), the mainloop per history KV block over the q blocks of q_block_ranges with
    the key mask only, the postprocess's candidate self terms.  Checks the decomposition, not the DSL."""
    nb, s, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    out = rf.ranker_attention_reference(q, k, v, bounds, scale, cap, cap_method, compute_dtype=torch.float64)
    lse = rb.ranker_attention_backward_explicit(q, k, v, bounds, do, scale, cap, cap_method)[3]  # float64 LSE
    log2e = 1 / math.log(2)
    lse2 = torch.where(torch.isfinite(lse), lse * log2e, torch.full_like(lse, math.inf))  # B, H, S
    dpsum = (do * out).sum(-1).transpose(1, 2)  # B, H, S
    scale_log2 = (cap if cap is not None else scale) * log2e

    def capf(x):  # raw q.k -> (t, cap')
        if cap is None:
            return x, torch.ones_like(x)
        xx = x * scale / cap
        if cap_method == "tanh":
            t = torch.tanh(xx)
            return t, 1 - t * t
        inv = 1 / (1 + xx.abs())
        return xx * inv, inv * inv

    dq_acc = torch.zeros(nb, s, hq, d, dtype=torch.float64)
    dk = torch.zeros(nb, s, hkv, d, dtype=torch.float64)
    dv = torch.zeros(nb, s, hkv, d, dtype=torch.float64)
    for b in range(nb):
        hl, hh, cl, ch = (int(x) for x in clamp_bounds(bounds[b], s))
        lo1, n1, lo2, n2 = q_block_ranges(hl, hh, cl, ch, tile_m)
        mblocks = list(range(lo1, lo1 + n1)) + list(range(lo2, lo2 + n2))
        for n in range(-(-s // tile_n)):
            keys = torch.arange(n * tile_n, min(s, (n + 1) * tile_n))
            if not (n * tile_n < hh and (n + 1) * tile_n > hl):
                continue  # no query reaches: zeros
            kbias = torch.where((keys >= hl) & (keys < hh), 0.0, -math.inf).double()
            for h in range(hq):
                kk, vv = k[b, keys, h // g], v[b, keys, h // g]
                for m in mblocks:
                    rows = torch.arange(m * tile_m, min(s, (m + 1) * tile_m))
                    qq, dd = q[b, rows, h], do[b, rows, h]
                    st = kk @ qq.T  # S^T (keys, rows), raw
                    t, dcap = capf(st)
                    p = torch.exp2(t * scale_log2 - lse2[b, h, rows][None] + kbias[:, None])
                    dpt = vv @ dd.T
                    ds = p * dcap * (dpt - dpsum[b, h, rows][None])
                    dv[b, keys, h // g] += p @ dd
                    dk[b, keys, h // g] += scale * ds @ qq
                    dq_acc[b, rows, h] += ds.T @ kk
        # postprocess: self terms of candidates outside the history
        for j in range(s):
            if not (cl <= j < ch and not hl <= j < hh):
                continue
            for h in range(hq):
                sj = q[b, j, h] @ k[b, j, h // g]
                t, dcap = capf(sj)
                p = torch.exp2(t * scale_log2 - lse2[b, h, j])
                ds = p * (do[b, j, h] @ v[b, j, h // g] - dpsum[b, h, j]) * dcap * scale
                dq_acc[b, j, h] += ds / scale * k[b, j, h // g]
                dk[b, j, h // g] += ds * q[b, j, h]
                dv[b, j, h // g] += p * do[b, j, h]
    return scale * dq_acc, dk, dv


@pytest.mark.parametrize("s,rows", CASES + [(17, [[1, 10, 3, 16]]), (16, [[8, 16, 0, 8]])])
@pytest.mark.parametrize("cap,cap_method", CAPS)
def test_kernel_plan_matches_reference(s, rows, cap, cap_method):
    q, k, v, do = _inputs(len(rows), s, 4, 2, 8, seed=5)
    bounds = torch.tensor(rows, dtype=torch.int32)
    got = _emulate(q, k, v, bounds, do, 0.37, cap, cap_method)
    ref = rb.ranker_attention_backward_reference(q, k, v, bounds, do, softmax_scale=0.37, cap=cap,
                                                 cap_method=cap_method)
    for name, a, r in zip(("dq", "dk", "dv"), got, ref):
        torch.testing.assert_close(a, r, rtol=1e-9, atol=1e-9, msg=name)


# ---------------------------------------------------------------- pre/postprocess kernels, validation
@pytest.mark.parametrize("d,tm,varlen,flagged,dlse", [(128, 64, False, False, False), (64, 64, True, False, False),
                                                    (64, 128, False, False, False), (128, 64, False, True, True),
                                                    (128, 64, True, True, False)])
def test_preprocess_compiles_vectorized_no_spills(d, tm, varlen, flagged, dlse):
    """16-byte loads (and, zeroing the dQ accumulator, 16-byte stores), no spills; with ``dq_flagged`` (the
    deterministic mainloop, whose first KV block stores its dQ tile, or one that zeroes the tiles itself) no
    accumulator stores."""
    from cute_kernels.kernels import ranker_bwd_preprocess as pre

    key = (str(torch.bfloat16), d, tm, varlen, flagged, dlse)
    pre.compile_preprocess(torch.bfloat16, d, tm, varlen, flagged, dlse)
    rec = compile_record(pre.NAME, key)
    ptx = find_features(rec.ptx, PTX_FEATURES)
    assert "ld.global.v4 (16B loads)" in ptx, ptx
    assert ("st.global.v4 (16B stores)" in ptx) is not flagged, ptx
    assert "local memory (spill)" not in ptx
    if rec.sass:
        sass = find_features(rec.sass, SASS_FEATURES)
        assert "LDG.E.128" in sass and "LDL/STL (local memory)" not in sass, sass


@pytest.mark.parametrize("d,tm,g,capm,varlen,acc", [
    (128, 64, 1, "tanh", False, False), (128, 64, 4, "none", False, True), (128, 64, 4, "none", False, False),
    (64, 64, 2, "soft_sign", True, True), (64, 128, 2, "none", False, False),
    (64, 128, 1, "none", True, False)])  # MHA varlen: spilled 8 B before the dQ loads were hoisted
@pytest.mark.parametrize("flagged", [False, True], ids=["", "flagged"])
def test_postprocess_compiles_vectorized_no_spills(d, tm, g, capm, varlen, acc, flagged):
    from cute_kernels.kernels import ranker_bwd_postprocess as post

    key = (str(torch.bfloat16), d, tm, g, capm, varlen, acc, flagged)
    post.compile_postprocess(torch.bfloat16, d, tm, g, capm, varlen, acc, flagged)
    rec = compile_record(post.NAME, key)
    ptx = find_features(rec.ptx, PTX_FEATURES)
    assert "ld.global.v4 (16B loads)" in ptx and "st.global.v4 (16B stores)" in ptx, ptx
    assert "local memory (spill)" not in ptx
    assert ("min.NaN.xorsign.abs.f32" in rec.ptx) == (capm == "soft_sign")  # the self terms' soft_sign clamp
    if rec.sass:
        sass = find_features(rec.sass, SASS_FEATURES)
        assert "STG.E.128" in sass and "LDL/STL (local memory)" not in sass, sass


def _bf16_args(nb=2, s=9, hq=4, hkv=2, d=64):
    q, k, v, do = (t.to(torch.bfloat16) for t in _inputs(nb, s, hq, hkv, d))
    out = torch.zeros_like(q)
    lse = torch.zeros(nb, hq, s, dtype=torch.float32)
    bounds = torch.tensor([[0, 5, 5, 9]] * nb, dtype=torch.int32)
    return q, k, v, out, lse, do, bounds


def test_backward_argument_errors():
    q, k, v, out, lse, do, bounds = _bf16_args()
    val = lambda **kw: rb._validate_backward(  # noqa: E731
        *[kw.get(n, x) for n, x in zip(("q", "k", "v", "out", "lse", "dout", "bounds"),
                                       (q, k, v, out, lse, do, bounds))], None, None, "tanh", None, None, cuda=False)
    assert val()[0] is False
    with pytest.raises(ValueError, match="dout"):
        val(dout=do[:, :8])
    with pytest.raises(TypeError, match="out"):
        val(out=out.float())
    with pytest.raises(TypeError, match="out"):
        val(out=out.half())  # another 16-bit dtype: the kernels would read its bits as q's dtype
    with pytest.raises(TypeError, match="dout"):
        val(dout=do.half())
    with pytest.raises(TypeError, match="lse"):
        val(lse=lse.double())
    with pytest.raises(ValueError, match="lse"):
        val(lse=lse[:, :2])
    with pytest.raises(ValueError, match="contiguous"):
        val(lse=lse.transpose(1, 2).contiguous().transpose(1, 2))
    # dlse: float32 shaped like lse, any strides (a broadcast gradient of lse.sum() included)
    dval = lambda dlse: rb._validate_backward(  # noqa: E731
        q, k, v, out, lse, do, bounds, None, None, "tanh", None, None, cuda=False, dlse=dlse)
    assert dval(torch.ones(()).expand(lse.shape))[0] is False
    assert dval(lse.transpose(1, 2).contiguous().transpose(1, 2))[0] is False
    with pytest.raises(TypeError, match="dlse.*float32"):
        dval(lse.double())
    with pytest.raises(ValueError, match="dlse.*shaped like lse"):
        dval(lse[:, :2])
    with pytest.raises(TypeError, match="dlse"):
        dval([0.0])
    with pytest.raises(TypeError, match="dlse must be a dense"):
        dval(lse.to_sparse())
    n = lse.numel()  # a float32 view 1 byte off (a uint8 storage's slice): read as float32 by the preprocess
    odd = torch.empty(0, dtype=torch.float32).set_(torch.zeros(4 * n + 8, dtype=torch.uint8).untyped_storage()[1:],
                                                   0, lse.shape, lse.stride())
    with pytest.raises(ValueError, match="dlse's data pointer is 0 or not 4-byte aligned"):
        dval(odd)
    freed = torch.zeros_like(lse)
    freed.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="dlse's data pointer is 0"):
        dval(freed)
    q2, k2, v2, out2, lse2, do2, b2 = _bf16_args(d=256)  # (D=256: the head-dim split schedule)
    assert rb._validate_backward(q2, k2, v2, out2, lse2, do2, b2, None, None, "tanh", None, None, cuda=False)[-1] == 256
    with pytest.raises(ValueError, match="CUDA"):  # the public function, on CPU tensors: before any launch
        rb.ranker_attention_backward(q, k, v, out, lse, do, bounds)


def test_backward_head_dim_message_lists_backward_dims():
    """D=32 is rejected by the forward's check too; the message must list the backward's dims (64, 128, 256)."""
    q, k, v, out, lse, do, bounds = _bf16_args(d=32)
    for call in (lambda: rb._validate_backward(q, k, v, out, lse, do, bounds, None, None, "tanh", None, None,
                                               cuda=False),
                 lambda: rb.ranker_attention_backward(q, k, v, out, lse, do, bounds)):
        with pytest.raises(ValueError, match="head dim") as e:
            call()
        assert "supported: [64, 128, 256]" in str(e.value), str(e.value)


def test_backward_output_buffer_and_option_errors():
    q, k, v, out, lse, do, bounds = _bf16_args()
    val = lambda **kw: rb._validate_backward(  # noqa: E731
        q, k, v, out, lse, do, bounds, None, None, "tanh", None, None, cuda=False, **kw)
    assert val(dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v))[0] is False
    with pytest.raises(TypeError, match="dq"):
        val(dq=q.float())
    with pytest.raises(TypeError, match="dk"):
        val(dk=[1.0])
    with pytest.raises(ValueError, match="dk"):
        val(dk=torch.empty_like(q))  # q's shape: Hq != Hkv
    with pytest.raises(ValueError, match="dv.*shape"):
        val(dv=v[:, :8])
    with pytest.raises(ValueError, match="dq.*contiguous"):
        val(dq=q.transpose(0, 1).contiguous().transpose(0, 1))
    with pytest.raises(ValueError, match="dv.*contiguous"):  # last dim contiguous, rows padded
        val(dv=torch.empty(2, 9, 2, 72, dtype=v.dtype)[..., :64])
    with pytest.raises(TypeError, match="deterministic"):
        val(deterministic=1)
    with pytest.raises(TypeError, match="deterministic"):
        val(deterministic="yes")
    with pytest.raises(TypeError, match="config"):
        val(config={"head_dim": 64})
    assert val(config=rb.CONFIGS[64], deterministic=True)[5] == 64


def test_backward_validates_everything_before_writing(monkeypatch):
    """Varlen: bad cu_seqlens values or bad buffers raise before dq/dk/dv are zeroed (the caller's
    buffers stay as they were), also when every sequence is empty (no launch).  CPU tensors: the
    device check is relaxed, the rest of the public function runs as is."""
    real = rb._validate_backward
    monkeypatch.setattr(rb, "_validate_backward", lambda *a, **kw: real(*a, **{**kw, "cuda": False}))
    t, hq, hkv, d = 12, 4, 2, 64
    q, k, v, do = (x[0].to(torch.bfloat16) for x in _inputs(1, t, hq, hkv, d))
    out = torch.zeros_like(q)
    lse = torch.zeros(hq, t, dtype=torch.float32)
    bounds = torch.tensor([[0, 3, 3, 5], [0, 2, 2, 4]], dtype=torch.int32)
    nan = lambda x: torch.full_like(x, float("nan"))  # noqa: E731
    dq, dk, dv = nan(q), nan(k), nan(v)
    call = lambda cu, **kw: rb.ranker_attention_backward(  # noqa: E731
        q, k, v, out, lse, do, bounds, cu_seqlens=torch.tensor(cu, dtype=torch.int32),
        **{"dq": dq, "dk": dk, "dv": dv, **kw})
    for cu in ([0, 5, 13], [0, 5, 3], [1, 5, 9]):  # past T, decreasing, not starting at 0
        with pytest.raises(ValueError, match="cu_seqlens"):
            call(cu)
    assert dq.isnan().all() and dk.isnan().all() and dv.isnan().all()  # not zeroed by the bad calls
    with pytest.raises(ValueError, match="max_seqlen"):
        rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, cu_seqlens=torch.tensor([0, 5, 9],
                                     dtype=torch.int32), max_seqlen=3, dq=dq, dk=dk, dv=dv)
    for bad in (dict(dk=dk.float()), dict(dv=nan(q)), dict(deterministic=2), dict(config="default")):
        with pytest.raises((TypeError, ValueError)):
            call([0, 0, 0], **bad)  # all sequences empty: validated all the same
    assert dq.isnan().all() and dk.isnan().all() and dv.isnan().all()  # untouched
    res = call([0, 0, 0])  # all empty: zero gradients, no launch
    assert res[0] is dq and all((x == 0).all() for x in res)


def test_ranker_attention_is_differentiable(monkeypatch):
    """The autograd wiring on a CPU: the forward and backward implementations replaced by the torch
    reference, so that the plumbing is what is tested: the forward op's registered autograd (saved
    tensors, argument order, which grads come back), reached through ``ranker_attention`` and through
    ``torch.ops.cute_kernels.ranker_attention_fwd`` itself; no grad mode takes neither op."""
    calls = []

    def fwd(q, k, v, bounds, scale, cap, method, cu, ms, out=None, lse=None, config=None, max_ctas=None, plan_key=None,
            with_lse=True):
        calls.append("fwd")
        return rf.ranker_attention_reference(q, k, v, bounds, scale, cap, method, True, cu, ms)

    def bwd(q, k, v, out, lse, dout, bounds, scale, cap, method, cu, ms, **kw):
        calls.append("bwd")
        return tuple(g.to(q.dtype) for g in rb.ranker_attention_backward_reference(
            q, k, v, bounds, dout, scale, cap, method, cu, ms, compute_dtype=torch.float64))

    monkeypatch.setattr(rf, "_ranker_impl", fwd)
    monkeypatch.setattr(rb, "_backward_impl", bwd)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 40, h, 64, generator=g, dtype=torch.float64).requires_grad_(h == 4) for h in (4, 2, 2))
    bounds = torch.tensor([[0, 30, 30, 40]], dtype=torch.int32)
    want = None
    for call in (lambda: cute_kernels.ranker_attention(q, k, v, bounds, cap=5.0),
                 lambda: torch.ops.cute_kernels.ranker_attention_fwd(q, k, v, bounds, None, 5.0)[0]):
        calls.clear()
        q.grad = None
        out = call()
        do = torch.randn(out.shape, generator=g, dtype=out.dtype)
        out.backward(do)
        assert calls == ["fwd", "bwd"] and k.grad is None and v.grad is None
        want = rb.ranker_attention_backward_reference(q.detach(), k, v, bounds, do, cap=5.0)[0]
        torch.testing.assert_close(q.grad, want)
    with pytest.raises(RuntimeError, match="no double backward"):
        out = cute_kernels.ranker_attention(q, k, v, bounds, cap=5.0)
        torch.autograd.grad(out.sum(), q, create_graph=True)
    monkeypatch.setattr(rf, "_ranker_op", lambda *a: (_ for _ in ()).throw(AssertionError("op taken")))
    with torch.no_grad():  # no grad mode: the implementation, no op
        calls.clear()
        cute_kernels.ranker_attention(q, k, v, bounds)
        assert calls == ["fwd"]
    assert cute_kernels.ranker_attention_backward is rb.ranker_attention_backward
    assert cute_kernels.ranker_attention_backward_reference is rb.ranker_attention_backward_reference
    assert hasattr(torch.ops.cute_kernels, "ranker_attention_bwd")


@pytest.fixture
def deterministic_flag():
    """Restores torch's deterministic-algorithms flag (and its warn_only) after the test."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_backward_follows_torchs_deterministic_flag(monkeypatch, deterministic_flag):
    """torch.use_deterministic_algorithms(True) makes the autograd backward and ranker_attention_backward
    without ``deterministic=`` take the ordered (deterministic) mode; an explicit ``deterministic=`` wins."""
    seen = []

    def fwd(q, k, v, bounds, scale, cap, method, cu, ms, out=None, lse=None, config=None, max_ctas=None, plan_key=None,
            with_lse=True):
        return rf.ranker_attention_reference(q, k, v, bounds, scale, cap, method, True, cu, ms)

    def bwd(q, k, v, out, lse, dout, bounds, scale, cap, method, cu, ms, **kw):
        seen.append(kw["deterministic"])
        return tuple(torch.zeros_like(t) for t in (q, k, v))

    monkeypatch.setattr(rf, "_ranker_impl", fwd)
    monkeypatch.setattr(rb, "_backward_impl", bwd)
    q, k, v = (torch.randn(1, 40, 2, 64, dtype=torch.float64).requires_grad_() for _ in range(3))
    bounds = torch.tensor([[0, 30, 30, 40]], dtype=torch.int32)
    for flag in (False, True, False):
        torch.use_deterministic_algorithms(flag)
        out, lse = cute_kernels.ranker_attention(q, k, v, bounds, return_lse=True)
        out.sum().backward()
        args = (q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), out.detach(), bounds)
        rb.ranker_attention_backward(*args)
        rb.ranker_attention_backward(*args, deterministic=False)
        rb.ranker_attention_backward(*args, deterministic=True)
        assert seen == [flag, flag, False, True], (flag, seen)
        seen.clear()


def test_meta_tensors_give_shapes_forward_and_backward():
    """Tensors on the meta device (a model initialised there) take the ops' fakes: output shapes and the
    argument checks, forward and backward, no launch."""
    q = torch.empty(2, 16, 4, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, 16, 2, 128, dtype=torch.bfloat16, device="meta")
    bounds = torch.empty(2, 4, dtype=torch.int32, device="meta")
    out, lse = cute_kernels.ranker_attention(q, k, k, bounds, return_lse=True)
    assert out.device.type == "meta" and out.shape == q.shape and lse.shape == (2, 4, 16)
    qg = q.clone().requires_grad_()
    cute_kernels.ranker_attention(qg, k, k, bounds).sum().backward()
    assert qg.grad.device.type == "meta" and qg.grad.shape == q.shape
    qg.grad = None
    cute_kernels.ranker_attention(qg, k, k, bounds, return_lse=True)[1].sum().backward()  # a loss on lse alone
    assert qg.grad.device.type == "meta" and qg.grad.shape == q.shape
    grads = cute_kernels.ranker_attention_backward(q, k, k, out, lse, out, bounds)
    assert [t.shape for t in grads] == [q.shape, k.shape, k.shape]
    grads = cute_kernels.ranker_attention_backward(q, k, k, out, lse, out, bounds, dlse=lse)
    assert [t.shape for t in grads] == [q.shape, k.shape, k.shape]
    with pytest.raises(ValueError, match="dlse"):
        cute_kernels.ranker_attention_backward(q, k, k, out, lse, out, bounds, dlse=lse[:, :1])
    with pytest.raises(TypeError, match="bfloat16"):  # the checks still run
        cute_kernels.ranker_attention(q.float(), k, k, bounds)
    with pytest.raises(ValueError, match="eager-only"):
        cute_kernels.ranker_attention_backward(q, k, k, out, lse, out, bounds, deterministic=True, dq=torch.empty_like(q))


def test_empty_inputs_backward_with_an_expanded_gradient():
    """``.sum()`` of an empty output hands back an expanded (all strides 0) gradient: accepted (no element
    to read), empty gradients come back (the public backward on fake tensors: no launch)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        for shape in ((0, 16, 4, 64), (2, 0, 4, 64)):
            q = torch.empty(shape, dtype=torch.bfloat16, requires_grad=True)
            bounds = torch.empty(shape[0], 4, dtype=torch.int32)
            cute_kernels.ranker_attention(q, q.detach(), q.detach(), bounds).sum().backward()
            assert q.grad.shape == q.shape


def test_varlen_buffers_untouched_when_a_late_check_fails(monkeypatch):
    """Every check before any buffer is written: the config's head dim (checked after the cached argument
    validation) comes before the varlen zeroing of user-given dq/dk/dv."""
    q, k, v, out, lse, do, bounds = _bf16_args()
    qp, kp, vp, outp, dop = (t[0] for t in (q, k, v, out, do))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    monkeypatch.setattr(rb, "_validate_backward", lambda *a, **kw: (True, 2, 9, 4, 2, 64))
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (qp, kp, vp))
    with pytest.raises(ValueError, match="config.head_dim=128 does not match the inputs' head dim 64"):
        rb._backward_impl(qp, kp, vp, outp, lse[0], dop, bounds, None, None, "tanh", cu, None, dq=dq, dk=dk, dv=dv,
                          config=rb.config_for(128, False))
    assert dq.isnan().all() and dk.isnan().all() and dv.isnan().all()


def test_grad_tolerance_is_the_flash_attention_bar():
    ref = torch.tensor([1.0, -4.0], dtype=torch.float64)
    assert rb.grad_tolerance(ref, torch.tensor([1.1, -4.0])) == pytest.approx(2 * 0.1 + 1e-3, rel=1e-6)
    assert rb.grad_tolerance(ref, ref.clone()) == pytest.approx(0.04 + 1e-3)  # floor: 1% of max |ref|
    assert rb.grad_tolerance(ref[:0], ref[:0]) == 1e-3


def test_backward_refuses_output_buffers_that_alias():
    """dq/dk/dv are written (varlen: zeroed first) while q, k, v, out, dout are read: an alias would
    destroy an input or give wrong gradients."""
    q, k, v, out, lse, do, bounds = _bf16_args()
    val = lambda **kw: rb._validate_backward(  # noqa: E731
        q, k, v, out, lse, do, bounds, None, None, "tanh", None, None, cuda=False, **kw)
    dk = torch.empty_like(k)
    for kw, match in ((dict(dq=q), "dq shares memory with q"), (dict(dq=do.view_as(q)), "dq shares memory with dout"),
                      (dict(dq=out), "dq.*out"), (dict(dk=dk, dv=dk), "dk shares memory with dv"),
                      (dict(dv=v), "dv.*v")):
        with pytest.raises(ValueError, match=match):
            val(**kw)
    both = torch.empty(2, *k.shape, dtype=k.dtype)  # disjoint halves of one buffer are fine
    val(dk=both[0], dv=both[1])


def test_forward_return_lse_must_be_a_bool():
    q, k, v, out, lse, do, bounds = _bf16_args()
    with pytest.raises(TypeError, match="return_lse"):
        cute_kernels.ranker_attention(q, k, v, bounds, return_lse="no")


def test_config_for_picks_128_row_tiles_only_for_uncapped_d64():
    """D=64 without a cap: 128 q rows per step (measured faster); with a cap (its 128-row mainloop
    spills) and at D=128: CONFIGS; an unsupported head dim is a ValueError."""
    assert rb.config_for(64, False) == rb.D64_UNCAPPED and rb.D64_UNCAPPED.tile_m == 128
    assert rb.config_for(64, True) == rb.CONFIGS[64] and rb.CONFIGS[64].tile_m == 64
    assert rb.config_for(128, False) == rb.config_for(128, True) == rb.CONFIGS[128]
    rb.D64_UNCAPPED.validate()
    with pytest.raises(ValueError, match="supported"):
        rb.config_for(96, False)
    for bad in ((64.0, False), (64, "no"), (True, False), (np.bool_(True), False)):
        with pytest.raises(TypeError):
            rb.config_for(*bad)
    # numpy integers, as the forward's shipped_config and the ops take them (session 73, a newcomer's finding)
    assert rb.config_for(np.int64(64), False) == rb.D64_UNCAPPED
    assert rb.config_for(np.int32(128), True) == rb.CONFIGS[128]
    shipped = {rb.dataclasses.replace(t.key[1], deterministic=False, gqa_group_per_cta=None)
               for t in rb.compile_targets() if t.kernel == rb.NAME}
    assert rb.D64_UNCAPPED in shipped  # CI compiles (and spill-checks) what config_for ships


def test_grid_limits_are_checked_before_launch():
    """B above CUDA's grid z limit (the backward's (block, head, batch) grids): a ValueError, not a failed launch."""
    t = 70000
    q = torch.zeros(t, 2, 64, dtype=torch.bfloat16)
    cu = torch.arange(t + 1, dtype=torch.int32)  # 70000 one-token sequences
    bounds = torch.tensor([[0, 1, 1, 1]] * t, dtype=torch.int32)
    lse = torch.zeros(2, t)
    with pytest.raises(ValueError, match="at most 65535 sequences"):
        rb._validate_backward(q, q, q, q, lse, q, bounds, None, None, "tanh", cu, 1, cuda=False)
    empty = q[:0]  # no tokens: nothing is launched, so no limit (zeros come back)
    rb._validate_backward(empty, empty, empty, empty, lse[:, :0], empty, bounds, None, None, "tanh",
                          torch.zeros(t + 1, dtype=torch.int32), 0, cuda=False)


def test_traced_backward_goes_through_the_registered_op():
    """make_fx (and torch.compile) see torch.ops.cute_kernels.ranker_attention_bwd; its fake checks the
    pointer-free rules, so a bad call fails while tracing; eager-only arguments are refused there."""
    from torch.fx.experimental.proxy_tensor import make_fx

    bf = torch.bfloat16
    q = torch.zeros(2, 300, 4, 64, dtype=bf)
    kv = torch.zeros(2, 300, 2, 64, dtype=bf)
    lse = torch.zeros(2, 4, 300)
    bounds = torch.tensor([[0, 200, 200, 300]] * 2, dtype=torch.int32)
    trace = make_fx(lambda *a: rb.ranker_attention_backward(*a, cap=30.0, deterministic=True), tracing_mode="fake")
    g = trace(q, kv, kv, q, lse, q, bounds)
    assert "cute_kernels.ranker_attention_bwd" in g.code
    with pytest.raises(ValueError, match="lse must have shape"):
        trace(q, kv, kv, q, lse[:, :, :299], q, bounds)
    with pytest.raises(ValueError, match="head dim 96"):
        trace(*(torch.zeros(2, 300, 4, 96, dtype=bf),) * 4, lse, torch.zeros(2, 300, 4, 96, dtype=bf), bounds)
    with pytest.raises(TypeError, match="cap"):
        make_fx(lambda *a: rb.ranker_attention_backward(*a, cap=True), tracing_mode="fake")(q, kv, kv, q, lse, q, bounds)
    with pytest.raises(ValueError, match="different devices"):  # the fake compares devices too
        trace(q, kv, kv, q.to("meta"), lse, q, bounds)
    qv, cu = q[0], torch.tensor([0, 100, 300], dtype=torch.int32)  # varlen: max_seqlen=True is no 1
    with pytest.raises(TypeError, match="max_seqlen"):
        make_fx(lambda *a: rb.ranker_attention_backward(*a, cu_seqlens=cu, max_seqlen=True), tracing_mode="fake")(
            qv, kv[0], kv[0], qv, lse[0], qv, bounds)


def test_eager_only_backward_arguments_under_dispatch_modes():
    """dq/dk/dv/config are eager-only: refused under torch.compile and on fake or meta tensors; under another
    dispatch mode (a flop counter on real tensors) the call runs the eager implementation, which validates
    as usual."""
    from torch.utils.flop_counter import FlopCounterMode

    q = torch.zeros(2, 300, 4, 64, dtype=torch.bfloat16)
    lse = torch.zeros(2, 4, 300)
    bounds = torch.tensor([[0, 200, 200, 300]] * 2, dtype=torch.int32)
    with FlopCounterMode(display=False), pytest.raises(ValueError, match="CUDA device"):  # eager path: CPU refused
        rb.ranker_attention_backward(q, q, q, q, lse, q, bounds, dq=torch.empty_like(q))
    with pytest.raises(Exception, match="eager-only"):
        torch.compile(lambda *a: rb.ranker_attention_backward(*a, dq=torch.empty_like(a[0])), fullgraph=True,
                      backend="eager")(q, q, q, q, lse, q, bounds)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:  # fake tensors have no data to launch on: refused, not an internal error
        fq, flse, fb = (mode.from_tensor(t) for t in (q, lse, bounds))
        with pytest.raises(ValueError, match="eager-only"):
            rb.ranker_attention_backward(fq, fq, fq, fq, flse, fq, fb, dq=torch.empty_like(fq))
    with pytest.raises(ValueError, match="eager-only"):
        mq = q.to("meta")
        rb.ranker_attention_backward(mq, mq, mq, mq, lse.to("meta"), mq, bounds.to("meta"), config=rb.CONFIGS[64])


@pytest.mark.parametrize("same", ["qkv", "kv"])
def test_compiled_autograd_accepts_one_tensor_as_several_inputs(same):
    """torch.compile(fullgraph=True) of a differentiable call with q is k is v (self-attention on one
    tensor) or k is v: Dynamo refuses one tensor as two inputs of an autograd.Function, so the call passes
    views; on CPU tensors the trace then completes and the run fails on the device rule, as with
    distinct tensors (newcomer review, session 10)."""
    import cute_kernels as ck

    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    bounds = torch.tensor([[0, 6, 6, 8]], dtype=torch.int32)
    if same == "qkv":
        def f(q, k, b):
            return ck.ranker_attention(q, q, q, b).float().sum()
    else:
        def f(q, k, b):
            return ck.ranker_attention(q, k, k, b).float().sum()
    with pytest.raises(Exception, match="must be on a CUDA device"):
        torch.compile(f, fullgraph=True, backend="eager")(q, k, bounds)


def test_compile_targets_cover_each_call_they_stand_for():
    """``cute-kernels compile`` leaves nothing to compile for a call with a target's mainloop: its
    preprocess and postprocess (ranker_bwd.launch_args, what the eager call launches) are targets too."""
    from cute_kernels.kernels import ranker_bwd_postprocess as post, ranker_bwd_preprocess as pre

    targets = rb.compile_targets()
    keys = {(t.kernel, t.key) for t in targets}
    mains = [t for t in targets if t.kernel == rb.NAME]
    assert mains
    for t in mains:
        dtype_s, cfg, g, capm, varlen = t.key
        args = rb.launch_args(getattr(torch, dtype_s[6:]), cfg, g, capm, varlen)
        assert (pre.NAME, (dtype_s, *args["pre"][1:])) in keys, t.label
        assert (pre.NAME, (dtype_s, *args["pre"][1:-1], True)) in keys, t.label  # with a dLSE
        assert (post.NAME, (dtype_s, *args["post"][1:])) in keys, t.label
        assert args["post"][6] == (g > 1 and cfg.gqa_group_per_cta is False)


def test_compile_targets_cover_the_bench_calls():
    """Every kernel an eager default-mode backward launches at the bench shapes (H200: 132 SMs) is a compile
    target, also where a long sequence (16K) turns dq_zero_in_mainloop off."""
    keys = {(t.kernel, t.key) for t in rb.compile_targets()}
    from cute_kernels.kernels import ranker_bwd_postprocess as post, ranker_bwd_preprocess as pre

    for nb, hist, cand, hq, hkv, d, cap in rb.BENCH_CASES:
        a = rb.call_launch_args(torch.bfloat16, rb.config_for(d, cap is not None), hq // hkv, nb, hkv, hist + cand,
                                cap, "tanh", False, 132)
        for name, kind in ((rb.NAME, "main"), (pre.NAME, "pre"), (post.NAME, "post")):
            assert (name, (str(torch.bfloat16), *a[kind][1:])) in keys, (name, nb, hist, cand, hq, hkv, d, cap)
    assert any(t.label.endswith(" long") for t in rb.compile_targets())


@pytest.mark.parametrize("cls,kw", [
    (rb.RankerBwdConfig, dict(tile_m=64.0)), (rb.RankerBwdConfig, dict(deterministic=1)),
    (rb.RankerBwdConfig, dict(dq_first="no")), (rb.RankerBwdConfig, dict(gqa_group_per_cta="yes")),
    (rb.RankerBwdConfig, dict(walk_stagger=True)), (rb.RankerBwdConfig, dict(walk_stagger=2.0)),
    (rf.RankerFwdConfig, dict(stages=True)), (rf.RankerFwdConfig, dict(persistent=1)),
])
def test_config_field_types(cls, kw):
    """A config field of the wrong type is a TypeError naming it at validate() (before any buffer or
    launch), not a late failure inside torch (tile_m=64.0) or a silently truthy value (dq_first='no')."""
    name = next(iter(kw))
    with pytest.raises(TypeError, match=rf"{cls.__name__}\.{name}="):
        cls(**kw).validate()


def test_pre_and_postprocess_issue_their_loads_before_their_stores():
    """The preprocess issues every row pass's global loads before its first store, the MHA postprocess
    its dQ-accumulator loads (16-byte) before its first store (a pass's loads used to wait behind the
    previous pass's stores: 6 such loads came first then, 12 now)."""
    import re

    from cute_kernels.kernels import ranker_bwd_postprocess as post, ranker_bwd_preprocess as pre

    pre.compile_preprocess(torch.bfloat16, 128, 64, False, False, False)
    post.compile_postprocess(torch.bfloat16, 128, 64, 1, "tanh", False, False, False)
    recs = (compile_record(pre.NAME, (str(torch.bfloat16), 128, 64, False, False, False)),
            compile_record(post.NAME, (str(torch.bfloat16), 128, 64, 1, "tanh", False, False, False)))
    if not all(r.sass for r in recs):
        pytest.skip("no SASS (disassembler unavailable)")
    ops = re.findall(r"\b(LDG\.E[.A-Z0-9]*|STG\.E[.A-Z0-9]*)", recs[0].sass)
    first_store = next(i for i, o in enumerate(ops) if o.startswith("STG"))
    assert not any(o.startswith("LDG") for o in ops[first_store:]), ops  # preprocess: all loads first
    ops = re.findall(r"\b(LDG\.E[.A-Z0-9]*|STG\.E[.A-Z0-9]*)", recs[1].sass)
    first_store = next(i for i, o in enumerate(ops) if o.startswith("STG"))
    # 4 passes x 2 dQ-accumulator vectors, and pass 0's 4 self-term loads
    assert sum(o.startswith("LDG") and o.endswith(".128") for o in ops[:first_store]) >= 12, ops


def test_references_refuse_what_the_op_refuses_and_take_empty_batches():
    """The references (forward and backward) check dtype/device agreement, the head dim, meta tensors,
    compute_dtype and dout's dtype with clean errors, and take B = 0 as the op does (empty outputs)."""
    q = torch.randn(2, 16, 2, 8)
    b = torch.tensor([[0, 10, 10, 16]] * 2, dtype=torch.int32)
    out, lse = rf.ranker_attention_reference(q[:0], q[:0], q[:0], b[:0], return_lse=True)
    assert out.shape == (0, 16, 2, 8) and lse.shape == (0, 2, 16)
    grads = rb.ranker_attention_backward_reference(q[:0], q[:0], q[:0], b[:0], q[:0])
    assert all(g.shape == (0, 16, 2, 8) for g in grads)
    with pytest.raises(TypeError, match="share a dtype"):
        rf.ranker_attention_reference(q.bfloat16(), q.double(), q.double(), b)
    with pytest.raises(ValueError, match="head dim"):
        rf.ranker_attention_reference(q[..., :0], q[..., :0], q[..., :0], b)
    with pytest.raises(ValueError, match="not 'meta'"):
        rf.ranker_attention_reference(*(q.to("meta"),) * 3, b)
    with pytest.raises(TypeError, match="compute_dtype"):
        rb.ranker_attention_backward_reference(q, q, q, b, q, compute_dtype=torch.int64)
    with pytest.raises(TypeError, match="dout must have q's dtype"):
        rb.ranker_attention_backward_reference(q, q, q, b, q.long())
    with pytest.raises(TypeError, match="dout must have q's dtype"):
        rb.ranker_attention_backward_reference(q.double(), q.double(), q.double(), b, q)
    with pytest.raises(ValueError, match="dout must be on q's device"):
        rb.ranker_attention_backward_reference(q, q, q, b, q.to("meta"))


def test_double_backward_always_raises():
    """A backward that builds a graph (create_graph=True) raises, also when the incoming gradient does not
    require grad (torch's once_differentiable, used before, then returned gradients whose own gradient
    silently missed the attention's terms; newcomer review, session 15); first-order gradients and an
    aot_eager training trace are unaffected."""
    import cute_kernels as ck
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        q = mode.from_tensor(torch.randn(2, 16, 4, 128, dtype=torch.bfloat16)).requires_grad_()
        b = mode.from_tensor(torch.tensor([[0, 12, 12, 16]] * 2, dtype=torch.int32))
        loss = ck.ranker_attention(q, q, q, b).float().sum() + (q.float() ** 2).sum()
        with pytest.raises(RuntimeError, match="no double backward"):
            torch.autograd.grad(loss, q, create_graph=True)
        g, = torch.autograd.grad(ck.ranker_attention(q, q, q, b).float().sum(), q)
        assert g.shape == q.shape
    q = torch.randn(1, 16, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    b = torch.tensor([[0, 12, 12, 16]], dtype=torch.int32)
    with pytest.raises(ValueError, match="must be on a CUDA device"):  # traced forward + backward, then the run
        torch.compile(lambda q, b: ck.ranker_attention(q, q, q, b).float().sum(), fullgraph=True,
                      backend="aot_eager")(q, b).backward()


def test_use_config_overrides_the_backward_within_the_block_only():
    """``ranker_bwd.use_config``: the backward's pick (resolve_config) is the block's config for its head dim,
    capped or not; an explicit config still wins; nested blocks restore; an invalid or wrongly typed config
    is refused before the block runs."""
    import dataclasses

    cfg = dataclasses.replace(rb.CONFIGS[128], stages=1)
    assert rb.resolve_config(None, 128, False) is rb.config_for(128, False)
    with rb.use_config(cfg) as c:
        assert c is cfg
        assert rb.resolve_config(None, 128, False) is cfg and rb.resolve_config(None, 128, True) is cfg
        with pytest.warns(RuntimeWarning, match=r"head_dim \[128\], not this call's head_dim=64"):
            assert rb.resolve_config(None, 64, False) is rb.config_for(64, False)  # other head dims untouched
        explicit = rb.config_for(128, True)
        assert rb.resolve_config(explicit, 128, False) is explicit
        inner = dataclasses.replace(cfg, ds_stages=1)
        with rb.use_config(inner):
            assert rb.resolve_config(None, 128, False) is inner
        assert rb.resolve_config(None, 128, False) is cfg
    assert not rb._OVERRIDES
    for bad in (rf.CONFIGS[128], None, {"head_dim": 128}):
        with pytest.raises(TypeError, match="RankerBwdConfig"):
            with rb.use_config(bad):
                raise AssertionError("entered")
    with pytest.raises(ValueError):  # rejected before the block runs
        with rb.use_config(dataclasses.replace(rb.CONFIGS[128], tile_m=48)):
            raise AssertionError("entered")
    assert not rb._OVERRIDES


def test_use_config_blocks_closed_out_of_order_leave_no_override():
    """Blocks that close out of order (interleaved generators): the newest still-open block wins, and once
    all are closed no override is left (both directions share the mechanism)."""
    import dataclasses

    for mod_, base in ((rb, rb.CONFIGS[128]), (rf, rf.CONFIGS[128])):
        a, b = dataclasses.replace(base, stages=1), dataclasses.replace(base, stages=2)
        ca, cb = mod_.use_config(a), mod_.use_config(b)
        ca.__enter__()
        cb.__enter__()
        assert mod_._OVERRIDES[128] is b
        ca.__exit__(None, None, None)
        assert mod_._OVERRIDES[128] is b
        cb.__exit__(None, None, None)
        assert 128 not in mod_._OVERRIDES


def test_cols_in_history_agrees_with_col_valid():
    """RankerSegments.cols_in_history (skip_key_bias's test of a whole KV block) is true exactly when every key
    of the block passes col_valid: history starts and ends inside and on block edges, empty, clamped."""
    from cutlass import Int32

    from cute_kernels.kernels.ranker_mask import RankerSegments

    for hl, hh, seqlen in ((37, 517, 700), (0, 384, 700), (128, 256, 300), (5, 5, 64), (0, 130, 130)):
        seg = RankerSegments(Int32(hl), Int32(hh), Int32(hh), Int32(seqlen), Int32(seqlen))
        for lo in range(0, seqlen + 128, 64):
            want = all(bool(seg.col_valid(Int32(c))) for c in range(lo, lo + 128))
            assert bool(seg.cols_in_history(Int32(lo), Int32(lo + 128))) == want, (hl, hh, lo)


def test_wrong_config_type_on_meta_tensors_is_a_type_error():
    """A config that is not a RankerBwdConfig is a TypeError naming it on meta tensors too (the eager-only
    rule for config used to answer first, with a ValueError about tracing)."""
    q = torch.empty(1, 128, 2, 128, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(1, 2, 128, device="meta")
    bounds = torch.empty(1, 4, dtype=torch.int32, device="meta")
    with pytest.raises(TypeError, match="RankerBwdConfig, got str"):
        rb.ranker_attention_backward(q, q, q, q, lse, q, bounds, config="fast")


def test_meta_backward_takes_a_dq_accumulator_past_2_31_elements():
    """Many short packed sequences pad the float32 dQ accumulator (rows to whole q tiles per sequence) past
    2**31 elements while q stays below: taken since session 54 (64-bit offsets in the kernels; until then a
    ValueError), on meta tensors as on the GPU (tests/gpu/test_large_offsets_gpu.py runs such problems)."""
    t, h, d, nb = 2**19, 16, 128, 2**14
    assert math.prod(rb.accum_row_shape(t, nb, h, 64, True)) * d > 2**31
    q = torch.empty(t, h, d, dtype=torch.bfloat16, device="meta", requires_grad=True)
    cu = torch.empty(nb + 1, dtype=torch.int32, device="meta")
    bounds = torch.empty(nb, 4, dtype=torch.int32, device="meta")
    out = cute_kernels.ranker_attention(q, q, q, bounds, cu_seqlens=cu, max_seqlen=32)
    out.sum().backward()
    assert q.grad.shape == q.shape


def test_backward_validation_once_per_signature(monkeypatch):
    """The eager backward validates an argument signature once (``_validate_backward_cached``): later calls
    re-check only the pointers' alignment, so a misaligned tensor of a validated signature still gets the full
    check's error before any launch; calls with dq/dk/dv buffers (their overlap with the inputs depends on the
    pointers) and other scalars are checked in full; packed calls check cu_seqlens' values every time."""
    real, checked = rb._validate_backward, []
    monkeypatch.setattr(rb, "_validate_backward",
                        lambda *a, **kw: checked.append(1) or real(*a, **{**kw, "cuda": False}))
    calls = []
    monkeypatch.setattr(rb, "_fn", lambda kind, *key: (lambda *args: calls.append((kind, args))))
    monkeypatch.setattr(rb, "_FNS", {})  # (a kernel compiled earlier in the session would skip the recorder)
    monkeypatch.setattr(rb, "sm_count", lambda device: 132)
    q, k, v, out, lse, do, bounds = _bf16_args()
    for _ in range(3):
        rb.ranker_attention_backward(q, k, v, out, lse, do, bounds)
    assert len(checked) == 1 and len(calls) == 9
    misaligned = torch.zeros(do.numel() + 8, dtype=do.dtype)[1:1 + do.numel()].view(do.shape)
    with pytest.raises(ValueError, match="16-byte aligned"):
        rb.ranker_attention_backward(q, k, v, out, lse, misaligned, bounds)
    assert len(checked) == 2 and len(calls) == 9
    freed = torch.zeros_like(do)
    freed.untyped_storage().resize_(0)  # (data pointer 0: same signature, "aligned", no data)
    with pytest.raises(ValueError, match="dout has no data"):
        rb.ranker_attention_backward(q, k, v, out, lse, freed, bounds)
    assert len(checked) == 3 and len(calls) == 9
    rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, softmax_scale=0.5)  # another scalar: checked
    assert len(checked) == 4
    dq = torch.empty_like(q)
    for _ in range(2):  # output buffers: checked every time
        rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, dq=dq)
    assert len(checked) == 6
    with pytest.raises(ValueError, match="shares memory"):  # (a buffer that is an input: the full check says so)
        rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, dq=do)
    assert len(checked) == 7
    packed = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v, out, do)]
    lse_p = lse.transpose(0, 1).reshape(lse.shape[1], -1).contiguous()
    for cu in ([0, 9, 18], [0, 4, 18]):  # one signature (checked once), two sets of values: both run
        rb.ranker_attention_backward(*packed[:4], lse_p, packed[4], bounds,
                                     cu_seqlens=torch.tensor(cu, dtype=torch.int32))
    assert len(checked) == 8 and len(calls) == 9 + 5 * 3
    with pytest.raises(ValueError, match="cu_seqlens"):  # its values are checked on every call
        rb.ranker_attention_backward(*packed[:4], lse_p, packed[4], bounds,
                                     cu_seqlens=torch.tensor([0, 19, 18], dtype=torch.int32))
    for _ in range(2):  # with a gradient of the LSE: one more signature, checked once
        rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, dlse=torch.ones_like(lse))
    assert len(checked) == 9
    odd = torch.empty(0, dtype=torch.float32).set_(  # (same signature, 1 byte off)
        torch.zeros(4 * lse.numel() + 8, dtype=torch.uint8).untyped_storage()[1:], 0, lse.shape, lse.stride())
    with pytest.raises(ValueError, match="dlse's data pointer"):
        rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, dlse=odd)


def test_caller_config_is_checked_for_spills_when_first_built(monkeypatch):
    """A caller's mainloop config (config=, use_config) other than the shipped one is checked for register
    spills once, when its kernel is first built in the process (the forward's rule); the shipped config, also
    passed explicitly or in the deterministic mode, is not (its spills are KNOWN_SPILL_BYTES)."""
    real = rb._validate_backward
    monkeypatch.setattr(rb, "_validate_backward", lambda *a, **kw: real(*a, **{**kw, "cuda": False}))
    monkeypatch.setattr(rb, "_FNS", {})
    for name in ("_compile", "compile_preprocess", "compile_postprocess"):
        monkeypatch.setattr(rb, name, lambda *key: (lambda *args: None))
    checked = []
    monkeypatch.setattr(rb, "warn_if_spills", lambda kernel, key, what: checked.append(key[1]))
    monkeypatch.setattr(rb, "sm_count", lambda device: 132)
    args = _bf16_args()  # D=64, no cap
    shipped = rb.config_for(64, False)
    for config in (None, shipped, None):
        rb.ranker_attention_backward(*args, config=config)
    rb.ranker_attention_backward(*args, config=shipped, deterministic=True)
    assert checked == []
    other = dataclasses.replace(shipped, stages=1)
    for _ in range(2):
        rb.ranker_attention_backward(*args, config=other)
    assert [c.stages for c in checked] == [1]
    with rb.use_config(dataclasses.replace(shipped, ds_stages=1)):
        for _ in range(2):
            rb.ranker_attention_backward(*args)
    assert [(c.stages, c.ds_stages) for c in checked] == [(1, shipped.ds_stages), (shipped.stages, 1)]


def test_spill_warning_names_the_config_and_the_bytes(monkeypatch):
    from cute_kernels.runtime import artifacts, cache

    key = ("a key",)
    record = artifacts.CompileRecord("ranker_bwd", str(key), "sm_90a",
                                     resources=[artifacts.KernelResources("k", 168, 0, 24)])
    monkeypatch.setitem(cache._records, ("ranker_bwd", key, cache.target_arch()), record)
    with pytest.warns(RuntimeWarning, match="my config keeps 24 B per thread in local memory"):
        assert cache.warn_if_spills("ranker_bwd", key, "my config") == 24
    record.resources[0].stack_bytes = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.warn_if_spills("ranker_bwd", key, "my config") == 0


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_host_path_runs_to_the_launches(monkeypatch, deterministic, varlen):
    """The eager backward's host code end to end on CPU tensors, with the three compiled launches replaced by
    recorders: every buffer it makes (the deterministic mode's semaphores included) and the launch order.
    (Session 36: a renamed local broke the deterministic branch, caught only by the GPU tests.)"""
    real = rb._validate_backward
    monkeypatch.setattr(rb, "_validate_backward", lambda *a, **kw: real(*a, **{**kw, "cuda": False}))
    calls = []
    monkeypatch.setattr(rb, "_fn", lambda kind, *key: (lambda *args: calls.append((kind, args))))
    monkeypatch.setattr(rb, "_FNS", {})  # (a kernel compiled earlier in the session would skip the recorder)
    monkeypatch.setattr(rb, "sm_count", lambda device: 132)
    q, k, v, out, lse, do, bounds = _bf16_args()
    kw = {}
    if varlen:
        q, k, v, out, do = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v, out, do))
        lse = lse.transpose(0, 1).reshape(lse.shape[1], -1).contiguous()
        kw = dict(cu_seqlens=torch.tensor([0, 9, 18], dtype=torch.int32))
    dq, dk, dv = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, deterministic=deterministic, **kw)
    assert [c[0] for c in calls] == ["pre", "main", "post"]
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
