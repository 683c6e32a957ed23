"""GPU tests of the ranker attention forward against the float64 reference (H200)."""


import pytest
import torch
from seeding import generator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

import cute_kernels  # noqa: E402,F401
from cute_kernels.kernels import ranker_fwd as rf  # noqa: E402


def _run(q, k, v, bounds, cap=None, cap_method="tanh", cu_seqlens=None, max_seqlen=None, scale=None, config=None,
         max_ctas=None):
    """Our kernel into NaN-poisoned output buffers."""
    out = torch.full_like(q, float("nan"))
    if cu_seqlens is None:
        lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device=q.device)
    else:
        lse = torch.full((q.shape[1], q.shape[0]), float("nan"), device=q.device)
    o, l = rf._ranker_impl(q, k, v, bounds, scale, cap, cap_method, cu_seqlens, max_seqlen, out=out, lse=lse,
                           config=config, max_ctas=max_ctas)
    torch.cuda.synchronize()
    return o, l


def _compare(name, q, k, v, bounds, cap=None, cap_method="tanh", cu_seqlens=None, max_seqlen=None, scale=None,
             config=None, max_ctas=None):
    o, l = _run(q, k, v, bounds, cap, cap_method, cu_seqlens, max_seqlen, scale, config, max_ctas)
    return _check(name, o, l, q, k, v, bounds, cap, cap_method, cu_seqlens, scale, config)


def _check(name, o, l, q, k, v, bounds, cap=None, cap_method="tanh", cu_seqlens=None, scale=None, config=None):
    """``o``, ``l`` (our output and LSE) against the float64 reference; the bar: 2x torch's error in q's dtype."""
    kw = dict(softmax_scale=scale, cap=cap, cap_method=cap_method, cu_seqlens=cu_seqlens, return_lse=True)
    ro, rl = rf.ranker_attention_reference(q, k, v, bounds, compute_dtype=torch.float64, **kw)
    lo, _ = rf.ranker_attention_reference(q, k, v, bounds, compute_dtype=q.dtype, **kw)
    # the reference output is rounded to q.dtype; compare against the float64 values before rounding
    ro64 = rf.ranker_attention_reference(q, k, v, bounds, compute_dtype=torch.float64,
                                         **{**kw, "return_lse": False}).float()
    err = (o.float() - ro64).abs().max().item() if o.numel() else 0.0
    base = (lo.float() - ro64).abs().max().item() if o.numel() else 0.0
    tol = 2 * base + 1e-3
    cfg = rf.chosen_config(config or rf.shipped_config(q.dtype, q.shape[-1], "none" if cap is None else cap_method),
                            q.dtype, cap)
    if (cfg.fixed_row_max or cfg.checked_max) and o.numel():
        # the PV GEMM takes P rounded to bf16 (relative 2**-8) and the row sum the float32 P; with the online
        # max the largest P is exactly 1, with the fixed one no P need be, so a row whose weight sits on keys
        # of one score (one key, or scores saturated at +cap) is off by up to 2**-8 before the output's own
        # rounding: up to one bf16 ulp more (torch's bf16 reference is exact there)
        tol += 2**-7 * ro64.abs().max().item()
    fin = torch.isfinite(rl)
    lse_err = (l[fin] - rl[fin]).abs().max().item() if fin.any() else 0.0
    print(f"[ranker_fwd] {name}: max|out-ref64|={err:.3e} (torch {q.dtype} ref {base:.3e}, tol {tol:.3e}) "
          f"max|lse-ref64|={lse_err:.3e}")
    assert not torch.isnan(o).any(), f"{name}: NaN in out (unwritten rows?)"
    assert not torch.isnan(l).any(), f"{name}: NaN in lse"
    assert torch.equal(torch.isinf(l), torch.isinf(rl)), f"{name}: -inf LSE pattern differs"
    assert err <= tol, f"{name}: out error {err} > {tol}"
    assert lse_err <= 2e-2, f"{name}: lse error {lse_err}"
    return o, l


def _qkv(b, s, hq, hkv, d, dtype=torch.bfloat16, seed=0):
    g = generator(seed)
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)
    return mk(hq), mk(hkv), mk(hkv)


CASES = [  # name, B, S, Hq, Hkv, D, bounds, cap, cap_method, dtype
    ("headline-small", 2, 700, 4, 4, 128, [[0, 517, 517, 700], [37, 400, 450, 611]], None, "tanh", torch.bfloat16),
    ("d64", 2, 700, 4, 4, 64, [[0, 517, 517, 700], [37, 400, 450, 611]], None, "tanh", torch.bfloat16),
    ("gqa4-tanh", 2, 333, 8, 2, 128, [[0, 200, 200, 333], [5, 129, 130, 300]], 30.0, "tanh", torch.bfloat16),
    ("softsign-fp16", 1, 300, 2, 1, 128, [[0, 250, 250, 300]], 5.0, "soft_sign", torch.float16),
    ("tanh-small-cap", 1, 260, 2, 2, 64, [[3, 131, 131, 260]], 2.0, "tanh", torch.bfloat16),
    ("empty-history", 2, 300, 2, 2, 128, [[0, 0, 0, 300], [10, 10, 100, 200]], None, "tanh", torch.bfloat16),
    ("empty-candidates", 1, 300, 2, 2, 128, [[0, 300, 300, 300]], None, "tanh", torch.bfloat16),
    ("cand-before-hist", 1, 520, 2, 2, 128, [[200, 500, 0, 150]], None, "tanh", torch.bfloat16),
    ("out-of-range", 2, 400, 2, 2, 128, [[-5, 1000, 900, 2000], [350, 9999, -7, 20]], None, "tanh", torch.bfloat16),
    ("overlap", 1, 400, 2, 2, 128, [[0, 300, 200, 400]], None, "tanh", torch.bfloat16),
    ("gap-tiles", 1, 1000, 2, 2, 128, [[0, 70, 900, 1000]], 20.0, "tanh", torch.bfloat16),
    ("one-row", 1, 1, 2, 2, 128, [[0, 1, 0, 1]], None, "tanh", torch.bfloat16),
    ("d256-gqa2", 2, 300, 4, 2, 256, [[0, 200, 200, 300], [3, 131, 131, 290]], 30.0, "tanh", torch.bfloat16),
    # D=256 without a cap (its own config, CONFIGS[256]; GPU-run since session 53) and fp16 with soft_sign
    ("d256", 2, 333, 4, 4, 256, [[0, 217, 217, 333], [37, 200, 250, 311]], None, "tanh", torch.bfloat16),
    ("d256-fp16-softsign-gqa2", 1, 300, 4, 2, 256, [[3, 250, 250, 300]], 5.0, "soft_sign", torch.float16),
    ("hist-one-block", 3, 200, 2, 2, 128, [[0, 64, 64, 200], [1, 2, 2, 3], [100, 101, 101, 199]], None, "tanh", torch.bfloat16),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_fixed_length(case):
    name, b, s, hq, hkv, d, rows, cap, capm, dtype = case
    q, k, v = _qkv(b, s, hq, hkv, d, dtype)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    _compare(name, q, k, v, bounds, cap, capm)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("headline-small", "gqa4-tanh", "hist-one-block")],
                         ids=lambda c: c[0])
def test_non_overlapped_schedule(case):
    """The simpler schedule (no softmax/PV overlap inside a warpgroup) stays correct too."""
    import dataclasses

    name, b, s, hq, hkv, d, rows, cap, capm, dtype = case
    q, k, v = _qkv(b, s, hq, hkv, d, dtype)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    cfg = dataclasses.replace(rf.CONFIGS[d], intra_wg_overlap=False)
    _compare(name + " no-overlap", q, k, v, bounds, cap, capm, config=cfg)


PERSISTENT_CASES = [c for c in CASES if c[0] in ("headline-small", "gqa4-tanh", "empty-history", "gap-tiles",
                                                  "hist-one-block")]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize("case", PERSISTENT_CASES, ids=lambda c: c[0])
def test_persistent_schedule(case, overlap):
    """Persistent CTAs (7 of them, so each runs many tiles: pipelines, named barriers and sO reuse
    carry across tiles, including skipped tiles)."""
    import dataclasses

    name, b, s, hq, hkv, d, rows, cap, capm, dtype = case
    q, k, v = _qkv(b, s, hq, hkv, d, dtype)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    cfg = dataclasses.replace(rf.CONFIGS[d], persistent=True, intra_wg_overlap=overlap)
    _compare(f"{name} persistent{'' if overlap else ' no-overlap'}", q, k, v, bounds, cap, capm,
             config=cfg, max_ctas=7)


@pytest.mark.parametrize("case", [c for c in CASES if c[5] == 128 and c[0] in ("headline-small", "gqa4-tanh",
                                                                                "empty-history", "out-of-range")],
                         ids=lambda c: c[0])
def test_one_tile_per_cta(case):
    """D=128 ships persistent; the one-CTA-per-tile schedule (sO aliasing sQ) stays correct."""
    import dataclasses

    name, b, s, hq, hkv, d, rows, cap, capm, dtype = case
    q, k, v = _qkv(b, s, hq, hkv, d, dtype)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    cfg = dataclasses.replace(rf.CONFIGS[d], persistent=False)
    _compare(name + " one-tile-per-cta", q, k, v, bounds, cap, capm, config=cfg)


SELF_KV_CASES = [c for c in CASES if c[5] == 128 and c[7] is None and c[0] in (
    "headline-small", "empty-history", "cand-before-hist", "out-of-range", "overlap", "hist-one-block")] + [
    ("gap-tiles-nocap", 1, 1000, 2, 2, 128, [[0, 70, 900, 1000]], None, "tanh", torch.bfloat16)]


@pytest.mark.parametrize("variant", ["fp16", "stages1", "stages1-one-tile-per-cta", "stages3-one-tile-per-cta",
                                     "no-overlap-fp16", "prefetch-toggled", "prefetch-toggled-one-tile-per-cta"])
@pytest.mark.parametrize("case", SELF_KV_CASES, ids=lambda c: c[0])
def test_self_kv_tma_forms(case, variant):
    """``self_kv_tma`` (the candidate tiles' own K/V rows through the K/V pipeline, read with ldmatrix) in the
    forms float16 and the tuner reach (session 25 review): float16 (the online max), 1 K/V stage persistent
    with 7 CTAs and one tile per CTA, 3 stages one tile per CTA (persistent does not fit), without the
    intra-warpgroup overlap, with the L2 prefetch of the self block toggled; against float64, and
    bitwise against the same config reading q_i, k_i, v_i from global memory."""
    import dataclasses

    name, b, s, hq, hkv, d, rows, cap, capm, dtype = case
    dtype = torch.float16 if "fp16" in variant else dtype
    q, k, v = _qkv(b, s, hq, hkv, d, dtype)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    cfg = rf.shipped_config(dtype, d, "none")
    assert cfg.self_kv_tma
    if variant.startswith("stages"):
        cfg = dataclasses.replace(cfg, stages=int(variant[6]), persistent="one-tile" not in variant)
    if variant.startswith("no-overlap"):
        cfg = dataclasses.replace(cfg, intra_wg_overlap=False)
    if variant.startswith("prefetch"):  # the L2 prefetch of the self block, on where shipped off and vice versa
        cfg = dataclasses.replace(cfg, prefetch_self_kv=not cfg.prefetch_self_kv,
                                  persistent="one-tile" not in variant)
    max_ctas = None if "one-tile" in variant else 7
    o, l = _compare(f"{name} self_kv_tma {variant}", q, k, v, bounds, config=cfg, max_ctas=max_ctas)
    og, lg = _run(q, k, v, bounds, config=dataclasses.replace(cfg, self_kv_tma=False, prefetch_self_kv=False),
                  max_ctas=max_ctas)
    assert torch.equal(o, og) and torch.equal(l, lg), "self_kv_tma changed the bits"


@pytest.mark.parametrize("variant", ["wg", "defer", "wg+defer"])
@pytest.mark.parametrize("schedule", ["persistent", "one-tile-per-cta", "varlen"])
@pytest.mark.parametrize("d,cap", [(128, None), (64, None), (128, 30.0)])
def test_wg_epilogue(d, cap, schedule, variant):
    """The epilogue per consumer warpgroup (``wg_epilogue``) and the deferred wait for the O store's read of
    sO (``defer_store_wait``; both shipped at D=128 without a cap) give the same bits as one epilogue for the tile that waits at
    once, and match float64, on the shipped configs (D=128, D=64's three warpgroups, D=128 tanh's three),
    persistent with 7 CTAs, one tile per CTA (sO aliasing sQ) and packed sequences (where both flags are inert:
    the varlen kernels keep one epilogue per tile)."""
    import dataclasses

    b, s, hq, hkv = 2, 700, 4, 2
    q, k, v = _qkv(b, s, hq, hkv, d)
    bounds = torch.tensor([[0, 517, 517, 700], [37, 400, 450, 611]], device="cuda", dtype=torch.int32)
    shipped = rf.shipped_config(torch.bfloat16, d, "none" if cap is None else "tanh")
    assert shipped.wg_epilogue == shipped.defer_store_wait == (d == 128 and cap is None)  # (what ships)
    if schedule == "one-tile-per-cta":
        shipped = dataclasses.replace(shipped, persistent=False)
    tile_epilogue = dataclasses.replace(shipped, wg_epilogue=False, defer_store_wait=False)
    cfg = dataclasses.replace(shipped, wg_epilogue="wg" in variant, defer_store_wait="defer" in variant)
    kw = dict(max_ctas=None if schedule == "one-tile-per-cta" else 7)
    if schedule == "varlen":
        cu = torch.tensor([0, 300, 700], device="cuda", dtype=torch.int32)
        q, k, v = q[0], k[0], v[0]
        bounds = torch.tensor([[0, 200, 200, 300], [3, 131, 131, 390]], device="cuda", dtype=torch.int32)
        kw.update(cu_seqlens=cu, max_seqlen=400)
    o, l = _compare(f"epilogue {variant} d={d} cap={cap} {schedule}", q, k, v, bounds, cap, config=cfg, **kw)
    o0, l0 = _run(q, k, v, bounds, cap, config=tile_epilogue, **kw)
    assert torch.equal(o, o0) and torch.equal(l, l0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("schedule", ["persistent", "one-tile-per-cta", "varlen"])
@pytest.mark.parametrize("rows", [[[0, 517, 517, 700], [37, 400, 450, 611]],  # 5 and 3 history blocks
                                  [[0, 128, 128, 700], [0, 256, 256, 300]],  # 1 and 2 (no middle step)
                                  [[64, 100, 0, 700], [0, 700, 700, 700]]],  # 1 edge block; history only
                         ids=["odd-edges", "one-two-blocks", "one-edge-block"])
def test_early_rescale(rows, schedule, dtype):
    """``early_rescale`` (O's rescale between the next S and PV GEMM issues; shipped at D=128) gives the same
    bits as the rescale right after the softmax and matches float64, on the online max (``checked_max`` off,
    float16), persistent with 7 CTAs, one tile per CTA and packed sequences, with 1, 2, 3 and 5 history blocks
    per tile (the loop's first, middle and last steps)."""
    import dataclasses

    b, s, hq, hkv, d = 2, 700, 4, 2, 128
    q, k, v = _qkv(b, s, hq, hkv, d, dtype)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    shipped = rf.shipped_config(dtype, d, "none")
    assert shipped.early_rescale and shipped.intra_wg_overlap
    cfg = dataclasses.replace(shipped, checked_max=False, persistent=schedule != "one-tile-per-cta")
    kw = dict(max_ctas=None if schedule == "one-tile-per-cta" else 7)
    if schedule == "varlen":
        cu = torch.tensor([0, 300, 700], device="cuda", dtype=torch.int32)
        q, k, v = q[0], k[0], v[0]  # (sequences of 300 and 400 tokens: the bounds clamp to them)
        kw.update(cu_seqlens=cu, max_seqlen=400)
    o, l = _compare(f"early_rescale {schedule} {dtype} {rows}", q, k, v, bounds, config=cfg, **kw)
    o0, l0 = _run(q, k, v, bounds, config=dataclasses.replace(cfg, early_rescale=False), **kw)
    assert torch.equal(o, o0) and torch.equal(l, l0), "early_rescale changed the bits"


THREE_WG_CASES = [c for c in CASES if c[5] == 128 and c[0] not in ("softsign-fp16",)] + [
    ("softsign-fp16", 1, 300, 2, 1, 64, [[0, 250, 250, 300]], 5.0, "soft_sign", torch.float16),
    ("fp16-gqa2", 2, 700, 4, 2, 64, [[0, 517, 517, 700], [37, 400, 450, 611]], None, "tanh", torch.float16)]


@pytest.mark.parametrize("schedule", ["shipped", "one-tile-per-cta", "overlap"])
@pytest.mark.parametrize("case", THREE_WG_CASES, ids=lambda c: c[0])
def test_d64_three_warpgroups(case, schedule):
    """D=64 ships three consumer warpgroups (tile_m=192, round-robin WGMMA turns), persistent, without the
    softmax/PV overlap inside a warpgroup (tile_n=128 without a cap, 112 with one): the D=128 cases at D=64,
    bfloat16 and float16, persistent with 7 CTAs (the turns carry across tiles), one tile per CTA, and with
    the overlap (tile_n=112, which fits)."""
    import dataclasses

    name, b, s, hq, hkv, _, rows, cap, capm, dtype = case
    q, k, v = _qkv(b, s, hq, hkv, 64, dtype)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    shipped = rf.shipped_config(dtype, 64, capm if cap else "none")  # tile_n 128 without a cap, 112 with one
    assert shipped.consumer_wgs == 3 and rf.config_for_shape(dtype, b, s, hq, hkv, 64, capm if cap else "none") == shipped
    kw = {"shipped": {}, "one-tile-per-cta": dict(persistent=False),
          "overlap": dict(intra_wg_overlap=True, tile_n=112)}[schedule]
    cfg = dataclasses.replace(shipped, **kw)
    _compare(f"{name} D=64 3wg {schedule}", q, k, v, bounds, cap, capm, config=cfg,
             max_ctas=7 if cfg.persistent else None)


@pytest.mark.parametrize("schedule", ["persistent", "one-tile-per-cta"])
@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("gqa4-tanh", "gap-tiles", "empty-history", "one-row")],
                         ids=lambda c: c[0])
def test_d128_tanh_three_warpgroups(case, schedule):
    """The tanh cap at D=128 ships three consumer warpgroups (tile_m=192, tile_n=64): persistent with 7
    CTAs (turns carried across tiles) and one tile per CTA, with the tanh cap whatever the case's cap."""
    import dataclasses

    name, b, s, hq, hkv, d, rows, cap, _, dtype = case
    q, k, v = _qkv(b, s, hq, hkv, d, dtype)
    bounds = torch.tensor(rows, device="cuda", dtype=torch.int32)
    cfg = rf.CAP_CONFIGS[("tanh", 128)]
    assert rf.config_for_shape(dtype, b, s, hq, hkv, 128, "tanh") == cfg
    if schedule != "persistent":
        cfg = dataclasses.replace(cfg, persistent=False)
    _compare(f"{name} D=128 tanh 3wg {schedule}", q, k, v, bounds, cap or 25.0, "tanh", config=cfg,
             max_ctas=7 if cfg.persistent else None)


@pytest.mark.parametrize("d", [128, 64])
def test_persistent_varlen(d):
    import dataclasses

    lens = [300, 1, 517, 129, 0, 64]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
    t, hq = int(cu[-1]), 4
    q = torch.randn(t, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(t, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(t, 2, d, device="cuda", dtype=torch.bfloat16)
    bounds = torch.tensor([[0, 250, 250, 300], [0, 0, 0, 1], [7, 400, 410, 517], [0, 129, 129, 129],
                           [0, 0, 0, 0], [0, 10, 10, 64]], device="cuda", dtype=torch.int32)
    cfg = dataclasses.replace(rf.CONFIGS[d], persistent=True)
    _compare(f"varlen persistent D={d}", q, k, v, bounds, cu_seqlens=cu, max_seqlen=max(lens), config=cfg, max_ctas=5)


def test_strided_inputs():
    """q, k, v as views of one packed [B, S, 3, H, D] tensor (non-contiguous head/seq strides)."""
    qkv = torch.randn(2, 300, 3, 4, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    bounds = torch.tensor([[0, 250, 250, 300], [0, 129, 129, 256]], device="cuda", dtype=torch.int32)
    _compare("strided", q, k, v, bounds)


def test_softmax_scale():
    q, k, v = _qkv(1, 200, 2, 2, 128)
    bounds = torch.tensor([[0, 150, 150, 200]], device="cuda", dtype=torch.int32)
    _compare("scale=0.3", q, k, v, bounds, scale=0.3)
    # 0 (accepted: uniform attention) with a history end inside a tile: masked keys stay -inf, no NaN
    bounds = torch.tensor([[3, 150, 150, 200]], device="cuda", dtype=torch.int32)
    _compare("scale=0", q, k, v, bounds, scale=0.0)
    _compare("scale=0 tanh", q, k, v, bounds, scale=0.0, cap=5.0)


@pytest.mark.parametrize("d,dtype,varlen", [(128, torch.bfloat16, False), (64, torch.bfloat16, False),
                                             (128, torch.float16, True)])
def test_soft_sign_saturates_where_the_scaled_score_overflows(d, dtype, varlen):
    """soft_sign with the smallest cap taken (2**-126) and scores of a few hundred: ``x = softmax_scale * q.k / cap``
    passes 2**126 and overflows float32 to +-inf on most keys.  The capped score is then +-cap (x / (1 + |x|)
    = +-1), as in float64; before session 53 ``rcp.approx.ftz`` flushed 1 / (1 + |x|) to 0 there, which gave
    inf * 0 = NaN.  (At this cap +-cap and 0 give the same softmax: the finite half of the old bug is
    :func:`test_soft_sign_huge_finite_scaled_scores`'s.)"""
    q, k, v = _qkv(2, 300, 4, 2, d, dtype=dtype, seed=53)
    q, k = q * 8, k * 8
    cap = 2.0**-126
    x = (q[0, :, 0].float() @ k[0, :, 0].float().T) * (d**-0.5 / cap)
    assert torch.isinf(x).float().mean() > 0.5  # the case this test is for
    bounds = torch.tensor([[0, 200, 200, 300], [3, 131, 131, 290]], device="cuda", dtype=torch.int32)
    if varlen:
        cu = torch.tensor([0, 300, 600], device="cuda", dtype=torch.int32)
        q, k, v = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
        _compare("soft_sign-cap-2^-126-varlen", q, k, v, bounds, cap=cap, cap_method="soft_sign", cu_seqlens=cu,
                 max_seqlen=300)
    else:
        _compare("soft_sign-cap-2^-126", q, k, v, bounds, cap=cap, cap_method="soft_sign")


HUGE_SOFT_SIGN = dict(softmax_scale=2.0**100, cap=5.0, cap_method="soft_sign")


def huge_soft_sign_inputs(d, seed):
    """q, k, v ``[2, 300, 4 / 2, d]`` bf16 and bounds for :data:`HUGE_SOFT_SIGN` (cap 5, softmax_scale 2**100): q.k of
    std ~2.3e8 (1.1 * 2**12 per element), so ``x = softmax_scale * q.k / cap`` passes 2**126 at 1.46 std (~14% of
    the keys) and would overflow at 5.9 (none does); both checked on batch 0, head 0."""
    q, k, v = _qkv(2, 300, 4, 2, d, seed=seed)
    q, k = q * 4505.0, k * 4505.0 * (128 / d) ** 0.5
    x = (q[0, :, 0].double() @ k[0, :, 0].double().T) * (HUGE_SOFT_SIGN["softmax_scale"] / HUGE_SOFT_SIGN["cap"])
    assert 0.05 < ((x.abs() > 2.0**126) & (x.abs() < 2.0**128)).double().mean() and (x.abs() < 2.0**128).all()
    bounds = torch.tensor([[0, 200, 200, 300], [3, 131, 131, 290]], device="cuda", dtype=torch.int32)
    return q, k, v, bounds


@pytest.mark.parametrize("d", [128, 64])
def test_soft_sign_huge_finite_scaled_scores(d):
    """soft_sign with cap 5 and softmax_scale 2**100: ``x = softmax_scale * q.k / cap`` lies in (2**126, 2**128) on
    about 14% of the keys (finite; none overflows), where the capped score is +-5, the largest a score can
    be.  Before session 53 the flushed 1 / (1 + |x|) made those scores 0 (the row's heaviest keys dropped to
    weight e^0 against e^5).  Against the float64 reference directly: its ``softmax_scale * q.k`` alone passes
    float32's range, so torch's bfloat16 form (the other tests' bar) is NaN here; the kernels form
    ``q.k * (softmax_scale / cap)``."""
    q, k, v, bounds = huge_soft_sign_inputs(d, seed=55)
    kw = HUGE_SOFT_SIGN
    o, l = _run(q, k, v, bounds, cap=kw["cap"], cap_method=kw["cap_method"], scale=kw["softmax_scale"])
    ro, rl = rf.ranker_attention_reference(q, k, v, bounds, return_lse=True, compute_dtype=torch.float64, **kw)
    err = (o.double() - ro.double()).abs().max().item()
    fin = torch.isfinite(rl)
    assert torch.isfinite(o).all() and err <= 2**-7 * ro.abs().max().item() + 1e-2, err
    assert torch.equal(torch.isinf(l), torch.isinf(rl))
    assert (l[fin].double() - rl[fin].double()).abs().max().item() <= 2e-2


@pytest.mark.parametrize("d,hkv,cap", [(128, 2, None), (64, 1, 10.0), (256, 4, None)])
def test_varlen(d, hkv, cap):
    lens = [300, 1, 517, 129, 0, 64]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
    t, hq = int(cu[-1]), 4
    g = generator(3)
    q = torch.randn(t, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(t, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(t, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    bounds = torch.tensor([[0, 250, 250, 300], [0, 0, 0, 1], [7, 400, 410, 517], [0, 129, 129, 129],
                           [0, 0, 0, 0], [0, 10, 10, 64]], device="cuda", dtype=torch.int32)
    _compare(f"varlen d={d} hkv={hkv}", q, k, v, bounds, cap=cap, cu_seqlens=cu, max_seqlen=max(lens))


@pytest.mark.parametrize("capture", [False, True])
def test_varlen_tokens_past_the_last_sequence(capture):
    """T > cu_seqlens[-1]: the trailing tokens get out = 0 and lse = -inf (poisoned buffers before), eager
    (host-known tail) and inside a CUDA graph (device-side mask)."""
    cu = torch.tensor([0, 100, 237], device="cuda", dtype=torch.int32)
    t, g = 300, generator(4)
    q, k, v = (torch.randn(t, h, 128, device="cuda", dtype=torch.bfloat16, generator=g) for h in (4, 2, 2))
    bounds = torch.tensor([[0, 70, 70, 100], [0, 100, 100, 137]], device="cuda", dtype=torch.int32)
    if not capture:
        _compare("varlen tail", q, k, v, bounds, cu_seqlens=cu)
        return
    out = torch.full_like(q, float("nan"))
    lse = torch.full((4, t), float("nan"), device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rf._ranker_impl(q, k, v, bounds, None, None, "tanh", cu, 137, out=out, lse=lse)
    graph.replay()
    torch.cuda.synchronize()
    ro, rl = rf.ranker_attention_reference(q, k, v, bounds, cu_seqlens=cu, return_lse=True)
    assert (out[237:] == 0).all() and torch.isneginf(lse[:, 237:]).all()
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out.float() - ro.float()).abs().max().item() < 3e-2


def test_public_api_and_determinism():
    q, k, v = _qkv(2, 640, 4, 4, 128, seed=7)
    bounds = torch.tensor([[0, 512, 512, 640], [0, 300, 300, 640]], device="cuda", dtype=torch.int32)
    o1, l1 = cute_kernels.ranker_attention(q, k, v, bounds, return_lse=True)
    o2, l2 = cute_kernels.ranker_attention(q, k, v, bounds, return_lse=True)
    o3 = cute_kernels.ranker_attention(q, k, v, bounds)
    torch.cuda.synchronize()
    assert torch.equal(o1, o2) and torch.equal(o1, o3) and torch.equal(l1, l2)
    assert l1.shape == (2, 4, 640) and l1.dtype == torch.float32


@pytest.mark.parametrize("case", [
    ("short", 2, 700, 4, 2, 128, None, None), ("long", 1, 2300, 2, 2, 128, None, None),
    ("d64", 2, 700, 4, 4, 64, None, None), ("tanh", 2, 700, 4, 2, 128, 30.0, None),
    ("varlen-tail", 1, 900, 4, 2, 128, None, [0, 300, 700]), ("fp16", 2, 700, 4, 2, 128, None, None)],
    ids=lambda c: c[0])
def test_without_lse(case):
    """Without ``return_lse`` the public call launches the kernel variant that writes no LSE: the same output
    bits as with it, on the first call (full path) and the next (the kept plan), for the online max, the
    checked fixed max (checked_max), D=64's three warpgroups, a tanh cap and packed sequences with tokens past the
    last one (zeroed)."""
    name, b, s, hq, hkv, d, cap, cu = case
    q, k, v = _qkv(b, s, hq, hkv, d, torch.float16 if name == "fp16" else torch.bfloat16, seed=5)
    kw = dict(cap=cap)
    if cu is not None:
        q, k, v = q[0], k[0], v[0]
        kw.update(cu_seqlens=torch.tensor(cu, device="cuda", dtype=torch.int32))
        bounds = torch.tensor([[0, 250, 250, 300], [9, 200, 200, 400]], device="cuda", dtype=torch.int32)
    else:
        bounds = torch.tensor([[0, s - 77, s - 77, s], [40, 300, 350, 611]][:b], device="cuda", dtype=torch.int32)
    o_ref, l_ref = cute_kernels.ranker_attention(q, k, v, bounds, return_lse=True, **kw)
    _check(f"without-lse {name}", o_ref, l_ref, q, k, v, bounds, cap, cu_seqlens=kw.get("cu_seqlens"))
    for _ in range(2):  # the full path, then the plan (fixed length)
        o = cute_kernels.ranker_attention(q, k, v, bounds, **kw)
        torch.cuda.synchronize()
        assert torch.equal(o, o_ref), name


def test_eager_launch_plan():
    """Later eager calls of an argument signature launch the plan the first call kept (``_ranker_eager``):
    right against the float64 reference for other tensors and other bounds' values, fresh outputs each call;
    a misaligned q of the same signature is refused by the full path."""
    q, k, v = _qkv(1, 2200, 2, 2, 128, seed=11)
    first = torch.tensor([[0, 2100, 2100, 2200]], device="cuda", dtype=torch.int32)
    o1 = cute_kernels.ranker_attention(q, k, v, first)
    key = rf._plan_key(q, k, v, first, None, None, "tanh", False)  # (without return_lse: no LSE)
    assert key in rf._PLANS
    q2, k2, v2 = _qkv(1, 2200, 2, 2, 128, seed=12)
    for i, bounds in enumerate(([[0, 2100, 2100, 2200]], [[5, 1500, 1600, 2190]], [[0, 0, 0, 2200]])):
        b = torch.tensor(bounds, device="cuda", dtype=torch.int32)
        o, l = cute_kernels.ranker_attention(q2, k2, v2, b, return_lse=True)
        torch.cuda.synchronize()
        assert o.data_ptr() != o1.data_ptr() and o.is_contiguous() and l.is_contiguous()
        _check(f"plan-{i}", o, l, q2, k2, v2, b)
    bad = torch.empty(q.numel() + 8, device="cuda", dtype=q.dtype)[1:1 + q.numel()].view(q.shape)
    with pytest.raises(ValueError, match="16-byte aligned"):
        cute_kernels.ranker_attention(bad, k, v, first)


@pytest.mark.parametrize("case", ["v_fp16", "k_fp16", "v_heads", "k_misaligned", "v_misaligned",
                                  "bounds_cpu", "v_cpu", "bounds_column_major", "k_meta"])
def test_arguments_refused_at_the_launch_get_the_full_paths_error(case):
    """The kept plan's key (``_plan_key``) leaves k's and v's dtypes, v's shape, alignment, the bounds' layout
    and the devices to the compiled function's own checks (tvm-ffi, before it launches; a meta k fails in its
    packing, a RuntimeError): such a call must raise the full path's error (``_validate``'s, not tvm-ffi's),
    launch nothing, and leave the plan working."""
    import re

    q, k, v = _qkv(2, 300, 4, 2, 128, seed=21)
    bounds = torch.tensor([[0, 200, 200, 300], [3, 150, 160, 290]], device="cuda", dtype=torch.int32)
    ref = cute_kernels.ranker_attention(q, k, v, bounds)
    key = rf._plan_key(q, k, v, bounds, None, None, "tanh", False)
    assert key in rf._PLANS
    misaligned = lambda t: torch.empty(t.numel() + 8, device="cuda", dtype=t.dtype)[4:4 + t.numel()].view(t.shape)
    args = {"v_fp16": (q, k, v.half(), bounds), "k_fp16": (q, k.half(), v, bounds),
            "v_heads": (q, k, v.as_strided((2, 300, 1, 128), v.stride()), bounds),
            "k_misaligned": (q, misaligned(k), v, bounds), "v_misaligned": (q, k, misaligned(v), bounds),
            "bounds_cpu": (q, k, v, bounds.cpu()), "v_cpu": (q, k, v.cpu(), bounds),
            "bounds_column_major": (q, k, v, bounds.t().contiguous().t()),
            "k_meta": (q, k.to("meta"), v, bounds)}[case]  # (tvm-ffi cannot pack it: a RuntimeError)
    assert rf._plan_key(*args, None, None, "tanh", False) == key  # (so the plan's launch is what refuses)
    with pytest.raises((TypeError, ValueError)) as expected:
        rf._validate(*args, None, None, "tanh", None, None)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        cute_kernels.ranker_attention(*args)
    out = cute_kernels.ranker_attention(q, k, v, bounds)  # the plan again, the same bits
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


@pytest.mark.parametrize("other", [torch.uint32, torch.int64])
def test_bounds_of_another_dtype_refused_after_an_int32_plan(other):
    """The compiled function takes uint32 for its int32 bounds (tvm-ffi accepts either signedness), which would
    read values >= 2**31 as negative: the plan's key holds the bounds' dtype, so uint32 (and int64) bounds get
    the full path's TypeError also after an int32 call of the same shape kept a plan."""
    q, k, v = _qkv(1, 256, 2, 2, 128, seed=23)
    bounds = torch.tensor([[0, 200, 200, 256]], device="cuda", dtype=torch.int32)
    cute_kernels.ranker_attention(q, k, v, bounds)
    assert rf._plan_key(q, k, v, bounds, None, None, "tanh", False) in rf._PLANS
    with pytest.raises(TypeError, match="int32"):
        cute_kernels.ranker_attention(q, k, v, bounds.to(other))


def test_torch_compile_and_graph():
    q, k, v = _qkv(1, 256, 2, 2, 128, seed=9)
    bounds = torch.tensor([[0, 200, 200, 256]], device="cuda", dtype=torch.int32)
    ref = cute_kernels.ranker_attention(q, k, v, bounds)
    f = torch.compile(lambda q, k, v, b: cute_kernels.ranker_attention(q, k, v, b) * 1.0, fullgraph=True)
    torch.testing.assert_close(f(q, k, v, bounds), ref, atol=0, rtol=0)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cute_kernels.ranker_attention(q, k, v, bounds)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        out = cute_kernels.ranker_attention(q, k, v, bounds)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("form", ["fixed", "tanh-gqa", "varlen"])
def test_opcheck(form, grad):
    """``torch.library.opcheck`` of ``torch.ops.cute_kernels.ranker_attention_fwd``: its schema (no input mutated
    or aliased), the fake's output metadata against the real op's, the autograd registration (with inputs that
    require grad) and the op under AOT dispatch with dynamic shapes, against the eager op's values and gradients."""
    cap, cu, max_seqlen = (30.0 if form == "tanh-gqa" else None), None, None
    if form == "varlen":
        q, k, v = (t[0].clone() for t in _qkv(1, 700, 4, 2, 128, seed=21))
        cu = torch.tensor([0, 250, 700], device="cuda", dtype=torch.int32)
        bounds = torch.tensor([[0, 200, 200, 250], [10, 300, 300, 450]], device="cuda", dtype=torch.int32)
        max_seqlen = 450
    else:
        q, k, v = _qkv(2, 300, 4, 2 if cap else 4, 128, seed=21)
        bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)
    q, k, v = (t.requires_grad_(grad) for t in (q, k, v))
    torch.library.opcheck(rf._ranker_op.op, (q, k, v, bounds),
                          dict(cap=cap, cu_seqlens=cu, max_seqlen=max_seqlen))


@pytest.mark.parametrize("compiled", [False, True])
def test_inference_mode(compiled):
    """Under ``torch.inference_mode()`` (serving): the no-grad call's bits, out and LSE, for inference tensors
    and for normal tensors that require grad (no autograd graph: the outputs are inference tensors), eager and
    under torch.compile; outside it, inference tensors as inputs give the same bits too."""
    torch._dynamo.reset()
    q, k, v = _qkv(2, 300, 4, 2, 128, seed=63)
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)
    call = lambda a, b, c, bb: cute_kernels.ranker_attention(a, b, c, bb, cap=30.0, return_lse=True)  # noqa: E731
    fn = torch.compile(call, fullgraph=True) if compiled else call
    with torch.no_grad():
        want = call(q, k, v, bounds)
    with torch.inference_mode():
        inf_q, inf_k, inf_v, inf_bounds = (t.clone() for t in (q, k, v, bounds))
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    for name, args in (("inference tensors", (inf_q, inf_k, inf_v, inf_bounds)),
                       ("tensors that require grad", (*leaves, bounds))):
        with torch.inference_mode():
            got = fn(*args)
        for g, w, what in zip(got, want, ("out", "lse")):
            assert g.is_inference() and not g.requires_grad, f"{name}: {what}"
            assert torch.equal(g, w), f"{name}: {what}"
    for g, w, what in zip(fn(inf_q, inf_k, inf_v, inf_bounds), want, ("out", "lse")):
        assert torch.equal(g, w), f"inference tensors outside inference mode: {what}"
    torch._dynamo.reset()


@pytest.mark.parametrize("return_lse", [False, True])
def test_reduce_overhead(return_lse):
    """torch.compile(mode="reduce-overhead") (CUDA-graph trees: warm-up, recording, replays) with new values
    in q, k, v and the bounds on every call: the eager op's bits each time."""
    torch._dynamo.reset()
    q, k, v = _qkv(2, 300, 4, 2, 128, seed=41)
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 160, 290]], device="cuda", dtype=torch.int32)
    f = torch.compile(lambda q, k, v, b: cute_kernels.ranker_attention(q, k, v, b, return_lse=return_lse),
                      mode="reduce-overhead", fullgraph=True)
    g = generator(42)
    for step in range(4):
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, device="cuda", generator=g))
        bounds[1, 0] = step * 7
        want = cute_kernels.ranker_attention(q, k, v, bounds, return_lse=return_lse)
        got = f(q, k, v, bounds)
        for a, b in zip(*((got, want) if return_lse else ((got,), (want,)))):
            assert torch.equal(a, b), f"step {step}"
    torch._dynamo.reset()


def test_reduce_overhead_varlen():
    """The packed form under torch.compile(mode="reduce-overhead"), new cu_seqlens values (same total) and new
    q, k, v on every call, max_seqlen given: the eager op's bits each time."""
    torch._dynamo.reset()
    q, k, v = (t[0] for t in _qkv(1, 700, 4, 2, 64, seed=47))
    cu = torch.tensor([0, 300, 700], device="cuda", dtype=torch.int32)
    bounds = torch.tensor([[0, 200, 200, 300], [10, 300, 300, 400]], device="cuda", dtype=torch.int32)
    f = torch.compile(lambda q, k, v, b, cu: cute_kernels.ranker_attention(q, k, v, b, cu_seqlens=cu, max_seqlen=450),
                      mode="reduce-overhead", fullgraph=True)
    g = generator(48)
    for step in range(4):
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, device="cuda", generator=g))
        cu[1] = 250 + 50 * step
        want = cute_kernels.ranker_attention(q, k, v, bounds, cu_seqlens=cu, max_seqlen=450)
        assert torch.equal(f(q, k, v, bounds, cu), want), f"step {step}"
    torch._dynamo.reset()


def _relative_error(name, o, ref, base):
    """max |o - ref| / max |ref| with the same measure of torch's own dtype reference (``base``)."""
    scale = ref.float().abs().max().clamp_min(1e-30)
    err = ((o.float() - ref.float()).abs().max() / scale).item()
    base_err = ((base.float() - ref.float()).abs().max() / scale).item()
    print(f"[ranker_fwd] {name}: relative error {err:.3e} (torch dtype ref {base_err:.3e})")
    assert not torch.isnan(o).any(), name
    assert err <= 2 * base_err + 2e-3, f"{name}: relative error {err} vs torch's {base_err}"


@pytest.mark.parametrize("d", [128, 64, 256])
@pytest.mark.parametrize("cap_method", ["tanh", "soft_sign"])
@pytest.mark.parametrize("cap", [2.0, 30.0, 50.0, 50.5, 80.0])
def test_fixed_row_max_at_saturated_scores(d, cap_method, cap):
    """The capped configs take P against a row max fixed at 0 (``fixed_row_max``) for bfloat16 with a
    cap <= FIXED_MAX_CAP (50) and the online max above it.  Scores 20x larger than unit-variance ones sit
    at the cap's ends (P from e^-cap to e^cap), with GQA, a varied history and candidates on both sides."""
    import dataclasses

    q, k, v = _qkv(2, 333, 4, 2, d, seed=int(cap * 10) + d)
    q = q * 20
    bounds = torch.tensor([[0, 200, 200, 333], [40, 290, 3, 40]], device="cuda", dtype=torch.int32)
    shipped = rf.shipped_config(torch.bfloat16, d, cap_method)
    assert shipped.fixed_row_max == ((cap_method, d) != ("soft_sign", 64))  # (soft_sign D=64 would spill)
    assert rf.fixed_row_max_applies(torch.bfloat16, cap) == (cap <= rf.FIXED_MAX_CAP)
    for fixed in (True, False):  # (fixed=True above the limit runs the online max: the host strips it)
        cfg = dataclasses.replace(shipped, fixed_row_max=fixed)
        _compare(f"saturated {cap_method} cap={cap} D={d} fixed={fixed}", q, k, v, bounds, cap,
                 cap_method, config=cfg, max_ctas=7 if cfg.persistent else None)


@pytest.mark.parametrize("v_scale", [1e-12, 1e4])
@pytest.mark.parametrize("score_sign", [1.0, -1.0])
def test_fixed_row_max_extreme_values(v_scale, score_sign):
    """At the fixed max's documented limits: every score of a row near +cap or near -cap (P all ~e^50 or
    all ~e^-50, the LSE far from 0), v tiny or large; the error relative to the output's size stays at
    torch's own bfloat16 level, and the LSE stays exact."""
    g = torch.Generator(device="cuda").manual_seed(7)
    b, s, h, d = 1, 300, 2, 128
    base_dir = torch.randn(1, 1, h, d, device="cuda", generator=g)
    k = (base_dir + 0.05 * torch.randn(b, s, h, d, device="cuda", generator=g)).to(torch.bfloat16)
    q = (score_sign * 8 * base_dir.expand(b, s, h, d)).to(torch.bfloat16)  # q.k ~ +-8 * |base|^2 >> cap
    v = (v_scale * torch.randn(b, s, h, d, device="cuda", generator=g)).to(torch.bfloat16)
    bounds = torch.tensor([[0, 250, 250, 300]], device="cuda", dtype=torch.int32)
    cap = rf.FIXED_MAX_CAP
    assert rf.shipped_config(torch.bfloat16, d, "tanh").fixed_row_max
    o, lse = _run(q, k, v, bounds, cap, "tanh")
    kw = dict(cap=cap, cap_method="tanh")
    ref, ref_lse = rf.ranker_attention_reference(q, k, v, bounds, compute_dtype=torch.float64, return_lse=True, **kw)
    ref64 = rf.ranker_attention_reference(q, k, v, bounds, compute_dtype=torch.float64, **kw)
    low = rf.ranker_attention_reference(q, k, v, bounds, compute_dtype=torch.bfloat16, **kw)
    _relative_error(f"extreme v_scale={v_scale} sign={score_sign}", o, ref64, low)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - ref_lse[fin]).abs().max().item() <= 2e-2
    assert ref_lse[fin].abs().min().item() > 40  # the rows' scores really sit at the cap's ends


def test_fixed_row_max_only_where_it_applies():
    """float16 and caps above FIXED_MAX_CAP run the same config with the online max."""
    assert not rf.shipped_config(torch.float16, 128, "tanh").fixed_row_max
    assert rf.fixed_row_max_applies(torch.bfloat16, 50.0) and not rf.fixed_row_max_applies(torch.bfloat16, 50.01)
    assert not rf.fixed_row_max_applies(torch.float16, 10.0) and not rf.fixed_row_max_applies(torch.bfloat16, None)
    q, k, v = _qkv(1, 200, 2, 2, 128, dtype=torch.float16)
    bounds = torch.tensor([[0, 150, 150, 200]], device="cuda", dtype=torch.int32)
    _compare("fp16 tanh D=128 (online max)", q * 20, k, v, bounds, 30.0, "tanh",
             config=rf.CAP_CONFIGS[("tanh", 128)], max_ctas=7)


def test_fixed_row_max_saturated_at_plus_cap_constant_v():
    """Every admitted score far above the cap (tanh saturates to exactly 1, all P equal) and v constant per
    column: the exact answer is v; with the fixed max each P is rounded alike, so the output may be one
    bf16 ulp off (2**-8 relative before rounding), never more (the review's case, session 21)."""
    g = torch.Generator(device="cuda").manual_seed(11)
    b, s, h, d = 1, 256, 2, 128
    direction = torch.randn(1, 1, h, d, device="cuda", generator=g)
    k = (direction.expand(b, s, h, d) * 8).to(torch.bfloat16)
    q = (direction.expand(b, s, h, d) * 8).to(torch.bfloat16)  # q.k / sqrt(d) ~ 725 >= 14 cap: tanh = 1.0
    v = torch.full((b, s, h, d), 1.1875, device="cuda", dtype=torch.bfloat16)
    v[..., 1::2] = -37.25
    bounds = torch.tensor([[0, 200, 200, 256]], device="cuda", dtype=torch.int32)
    for cap in (2.0, 30.0, 50.0):
        o, _ = _run(q, k, v, bounds, cap, "tanh")
        rel = ((o.float() - v.float()).abs() / v.float().abs()).max().item()
        assert rel <= 2**-7, f"cap={cap}: relative error {rel} above one bf16 ulp"


def _scaled_rows(q, spans, factor=30.0):
    """``q`` with the rows of each ``(batch, lo, hi, head)`` span scaled by ``factor``: their scores reach ~90, past
    what checked_max's fixed max keeps (a sum of P above CHECKED_SUM_MAX), so their warpgroups fall back."""
    q = q.clone()
    for b, lo, hi, h in spans:
        q[b, lo:hi, h] *= factor
    return q


@pytest.mark.parametrize("schedule", ["persistent", "one-tile-per-cta"])
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("d", [128, 64, 256])
def test_checked_max_fallback_tiles(d, varlen, schedule):
    """checked_max (uncapped bf16: every tile first runs the fixed max, checks its row sums and O, and a failing
    warpgroup falls back to the online max and retries the tile at its CTA's end): rows scaled 30x in tiles
    whose warpgroups then fail; in one tile both warpgroups fail (one retry), and with 7 CTAs one CTA has two
    warpgroups failing different tiles (two retries), the other tiles pass; GQA 2; fixed length and packed;
    also one tile per CTA (the retry reloads Q into sQ, which sO aliases there); bitwise equal on a second run."""
    import dataclasses

    cfg = rf.CONFIGS[d]
    assert cfg.checked_max
    max_ctas = 7
    if schedule == "one-tile-per-cta":
        cfg, max_ctas = dataclasses.replace(cfg, persistent=False), None
    elif not cfg.persistent:  # (D=256 ships one tile per CTA; persistent it fits one K/V stage)
        cfg = dataclasses.replace(cfg, persistent=True, stages=1)
    q, k, v = _qkv(2, 700, 4, 2, d, seed=d + varlen)
    # 6 (D=128) / 4 (D=64) q tiles per sequence and head, tiles m-block fastest then head then batch
    m = cfg.tile_m
    q = _scaled_rows(q, [(0, m + 2, 2 * m + 4, 0),  # both warpgroups of tile 1 (and the first rows of tile 2)
                         (0, 3 * m + 64, 3 * m + 128, 0),  # the second warpgroup of tile 3
                         (0, 4 * m, 4 * m + 64, 1),  # the first warpgroup of head 1's tile 4 (CTA of tile 3 for D=128)
                         (1, 600, 700, 3)])
    bounds = torch.tensor([[0, 517, 517, 700], [37, 400, 450, 611]], device="cuda", dtype=torch.int32)
    if varlen:
        cu = torch.tensor([0, 700, 1400], device="cuda", dtype=torch.int32)
        pack = lambda x: x.reshape(1400, *x.shape[2:])  # noqa: E731
        args, kw = (pack(q), pack(k), pack(v), bounds), dict(cu_seqlens=cu, max_seqlen=700)
    else:
        args, kw = (q, k, v, bounds), {}
    o, l = _compare(f"checked_max fallback D={d}{' varlen' if varlen else ''} {schedule}", *args, config=cfg,
                    max_ctas=max_ctas, **kw)
    o2, l2 = _run(*args, config=cfg, max_ctas=max_ctas, **kw)
    assert torch.equal(o, o2) and torch.equal(l, l2), "checked_max: not bitwise equal on a second run"


def _one_score(q, k, row, key, score):
    """Query ``row`` and key ``key`` (batch 0, head 0) set to one random direction, scaled so that their score
    ``q.k / sqrt(D)`` is ``score`` (in place)."""
    d = q.shape[-1]
    direction = torch.randn(d, device="cuda")
    x = (direction / direction.norm() * score**0.5 * d**0.25).to(q.dtype)
    k[0, key, 0] = x
    q[0, row, 0] = x


def test_checked_max_one_large_score_falls_back():
    """One q row parallel to a key with a score of ~100 (e^100 overflows float32), every other score small: that
    row's sum of P is inf against the fixed max, so its warpgroup must retry with the online max."""
    cfg = rf.CONFIGS[128]
    q, k, v = _qkv(1, 600, 2, 2, 128, seed=5)
    q, k = q * 0.1, k * 0.1
    _one_score(q, k, row=300, key=50, score=100.0)
    bounds = torch.tensor([[0, 400, 400, 600]], device="cuda", dtype=torch.int32)
    _compare("checked_max one score of 100", q, k, v, bounds, config=cfg, max_ctas=3)


def test_checked_max_overflowing_product_falls_back():
    """A score of 60 (P = e^60 against the fixed max: within CHECKED_SUM_MAX) on a key whose v is 1e13: P * v
    overflows float32 in the PV GEMM, so O's check must send the warpgroup to the online max (P = 1 there)."""
    cfg = rf.CONFIGS[128]
    q, k, v = _qkv(1, 300, 1, 1, 128, seed=6)
    q, k = q * 0.1, k * 0.1
    _one_score(q, k, row=150, key=20, score=60.0)
    v[0, 20, 0] = 1e13
    bounds = torch.tensor([[0, 250, 250, 300]], device="cuda", dtype=torch.int32)
    o, _ = _compare("checked_max P*v overflow", q, k, v, bounds, config=cfg, max_ctas=2)
    assert torch.isfinite(o).all()


@pytest.mark.parametrize("schedule", ["persistent", "one-tile-per-cta"])
def test_checked_max_empty_history_self_term(schedule):
    """An empty history (D=128's self_kv_tma: a candidate tile then loads only Q and its own K/V rows through the
    pipelines, no history block): candidates attend only themselves (out = v, LSE = s_ii); one candidate's own
    score of 100 overflows the fixed max, so its warpgroup retries with the online max; the second batch row has
    candidates before an empty history span."""
    import dataclasses

    cfg = rf.CONFIGS[128]
    assert cfg.checked_max and rf.self_kv_tma_taken(cfg)
    max_ctas = 3
    if schedule == "one-tile-per-cta":
        cfg, max_ctas = dataclasses.replace(cfg, persistent=False), None
    q, k, v = _qkv(2, 300, 2, 2, 128, seed=11)
    _one_score(q, k, row=150, key=150, score=100.0)
    bounds = torch.tensor([[0, 0, 0, 300], [40, 40, 20, 290]], device="cuda", dtype=torch.int32)
    o, _ = _compare(f"empty history self term {schedule}", q, k, v, bounds, config=cfg, max_ctas=max_ctas)
    assert torch.equal(o[0, :, 0], v[0, :, 0]), "a candidate with no history attends only itself: out = v"


@pytest.mark.parametrize("d", [128, 64, 256])
def test_checked_max_low_scores_fall_back(d):
    """Every score of a batch row near -40 (q = -c k, every key the same direction): the sum of P against the
    fixed max is ~n e^-40, under CHECKED_SUM_MIN, so those warpgroups retry with the online max (uniform
    attention: the mean of v); the other batch row keeps the fixed max."""
    cfg = rf.CONFIGS[d]
    q, k, v = _qkv(2, 400, 2, 2, d, seed=7 + d)
    u = torch.randn(d, device="cuda")
    u = u / u.norm()
    k[0] = (u * d**0.25 * 40**0.5).to(torch.bfloat16)
    q[0] = (-u * d**0.25 * 40**0.5).to(torch.bfloat16)  # q.k / sqrt(d) = -40
    bounds = torch.tensor([[0, 300, 300, 400], [0, 333, 333, 400]], device="cuda", dtype=torch.int32)
    _compare(f"checked_max scores of -40 D={d}", q, k, v, bounds, config=cfg, max_ctas=3)


def test_flop_counter_reads_the_bounds():
    """FlopCounterMode with CUDA tensors: the forward and backward ops counted at their useful FLOPs from the
    bounds' (and cu_seqlens') values (4 and 10 x D x Hq per admitted pair), the outputs as without the counter."""
    from torch.utils.flop_counter import FlopCounterMode

    from cute_kernels.kernels.ranker_mask import dense_mask

    q, k, v = _qkv(2, 300, 4, 2, 128, seed=21)
    bounds = torch.tensor([[0, 200, 200, 300], [17, 150, 140, 260]], device="cuda", dtype=torch.int32)
    pairs = sum(int(dense_mask(bounds[b].cpu(), 300).sum()) for b in range(2))
    plain = cute_kernels.ranker_attention(q, k, v, bounds)
    q.requires_grad_(True)
    with FlopCounterMode(display=False) as counter:
        out = cute_kernels.ranker_attention(q, k, v, bounds)
        out.float().sum().backward()
    counts = {str(key): n for key, n in counter.get_flop_counts()["Global"].items()}
    assert counts["cute_kernels.ranker_attention_fwd"] == 4 * 128 * 4 * pairs
    assert counts["cute_kernels.ranker_attention_bwd"] == 10 * 128 * 4 * pairs
    assert torch.equal(out.detach(), plain) and q.grad is not None
    cu = torch.tensor([0, 250, 600], device="cuda", dtype=torch.int32)
    qp, kp, vp = (t.detach().reshape(600, t.shape[2], 128) for t in (q, k, v))
    with FlopCounterMode(display=False) as counter:
        cute_kernels.ranker_attention(qp, kp, vp, bounds, cu_seqlens=cu)
    packed = int(dense_mask(bounds[0].cpu(), 250).sum()) + int(dense_mask(bounds[1].cpu(), 350).sum())
    assert counter.get_total_flops() == 4 * 128 * 4 * packed
