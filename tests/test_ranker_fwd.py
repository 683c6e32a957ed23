"""CPU tests of the ranker attention forward: reference, mask helpers, validation, sm_90a compile."""

import dataclasses
import math
import re
import warnings

import pytest
import torch

import cute_kernels  # noqa: F401  (sets CUTE_DSL_ARCH before cutlass is imported)
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import admitted_pairs, clamp_bounds, dense_mask
from ranker_fwd_stand_in import stand_in_forward  # (tests/ is on sys.path)


def _brute_force(q, k, v, bounds, scale, cap=None, cap_method="tanh"):
    """Row-by-row float64 loops over the mask as the issue states it (no dense-mask helper)."""
    nb, s, hq, d = q.shape
    g = hq // k.shape[2]
    out = torch.zeros(nb, s, hq, d, dtype=torch.float64)
    lse = torch.full((nb, hq, s), -math.inf, dtype=torch.float64)
    for b in range(nb):
        hl, hh, cl, ch = (int(x) for x in bounds[b])
        hl = min(max(hl, 0), s); hh = min(max(hh, hl), s)
        cl = min(max(cl, 0), s); ch = min(max(ch, cl), s)
        for i in range(s):
            qh, qc = hl <= i < hh, cl <= i < ch
            keys = [j for j in range(s) if (hl <= j < hh and (qh or qc)) or (qc and j == i)]
            if not keys:
                continue
            for h in range(hq):
                qi = q[b, i, h].double()
                ks = k[b, keys, h // g].double()
                sc = scale * (ks @ qi)
                if cap is not None:
                    sc = cap * torch.tanh(sc / cap) if cap_method == "tanh" else sc / (1 + sc.abs() / cap)
                l = torch.logsumexp(sc, 0)
                out[b, i, h] = torch.softmax(sc, 0) @ v[b, keys, h // g].double()
                lse[b, h, i] = l
    return out, lse


CASES = [  # S, bounds rows
    (13, [[0, 9, 9, 13]]),
    (13, [[2, 7, 9, 12], [0, 0, 0, 13]]),  # gap rows; empty history
    (11, [[3, 11, 0, 3], [-4, 50, 20, 30]]),  # candidates before history; out-of-range bounds
    (10, [[0, 6, 4, 10], [5, 5, 5, 5]]),  # overlapping segments; all empty
]


@pytest.mark.parametrize("s,rows", CASES)
@pytest.mark.parametrize("cap,cap_method", [(None, "tanh"), (3.0, "tanh"), (2.0, "soft_sign")])
def test_reference_matches_brute_force(s, rows, cap, cap_method):
    torch.manual_seed(0)
    nb, hq, hkv, d = len(rows), 4, 2, 8
    q = torch.randn(nb, s, hq, d, dtype=torch.float64)
    k = torch.randn(nb, s, hkv, d, dtype=torch.float64)
    v = torch.randn(nb, s, hkv, d, dtype=torch.float64)
    bounds = torch.tensor(rows, dtype=torch.int32)
    scale = 0.37
    o, l = rf.ranker_attention_reference(q, k, v, bounds, softmax_scale=scale, cap=cap, cap_method=cap_method,
                                         return_lse=True, compute_dtype=torch.float64)
    ro, rl = _brute_force(q, k, v, bounds, scale, cap, cap_method)
    assert not torch.isnan(o).any() and not torch.isnan(l).any()
    torch.testing.assert_close(o, ro, atol=1e-10, rtol=1e-10)
    assert torch.equal(torch.isinf(l), torch.isinf(rl.float()))
    fin = torch.isfinite(rl)
    torch.testing.assert_close(l[fin].double(), rl[fin], atol=1e-5, rtol=1e-5)


def test_reference_hand_checked():
    """One query, history of two keys, a candidate with its self key: numbers by hand."""
    q = torch.zeros(1, 3, 1, 2, dtype=torch.float64)
    k = torch.zeros(1, 3, 1, 2, dtype=torch.float64)
    v = torch.zeros(1, 3, 1, 2, dtype=torch.float64)
    q[0, 2, 0] = torch.tensor([1.0, 0.0])
    k[0, :, 0] = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    v[0, :, 0] = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    bounds = torch.tensor([[0, 2, 2, 3]], dtype=torch.int32)
    o, l = rf.ranker_attention_reference(q, k, v, bounds, softmax_scale=1.0, return_lse=True,
                                         compute_dtype=torch.float64)
    e = [math.e ** 1, math.e ** 0, math.e ** 2]  # scores of row 2 vs keys 0, 1 (history), 2 (self)
    z = sum(e)
    assert o[0, 2, 0, 0].item() == pytest.approx((e[0] + 5 * e[2]) / z)
    assert o[0, 2, 0, 1].item() == pytest.approx((e[1] + 5 * e[2]) / z)
    assert l[0, 0, 2].item() == pytest.approx(math.log(z))


@pytest.mark.parametrize("val", [100.0, 1000.0, 2000.0])
def test_reference_weights_sum_to_one_at_large_scores(val):
    """Two equal history keys, v = 1: every admitted row's output is exactly 1 in float32 whatever the
    scores' size (exp(s - lse) alone summed to 0.998 at scores 8e4 and to 2 at 3.2e7: a newcomer review)."""
    b = torch.tensor([[0, 2, 0, 0]], dtype=torch.int32)
    q, v = torch.full((1, 2, 1, 8), val), torch.ones(1, 2, 1, 8)
    out = rf.ranker_attention_reference(q, q, v, b, softmax_scale=1.0)
    assert torch.equal(out, torch.ones_like(out))


def test_varlen_reference_equals_padded():
    torch.manual_seed(1)
    lens = [5, 9, 1]
    hq, d = 2, 4
    cu = torch.tensor([0, 5, 14, 15], dtype=torch.int32)
    q = torch.randn(15, hq, d, dtype=torch.float64)
    k = torch.randn(15, hq, d, dtype=torch.float64)
    v = torch.randn(15, hq, d, dtype=torch.float64)
    bounds = torch.tensor([[0, 3, 3, 5], [1, 6, 6, 9], [0, 0, 0, 1]], dtype=torch.int32)
    o, l = rf.ranker_attention_reference(q, k, v, bounds, cu_seqlens=cu, return_lse=True, compute_dtype=torch.float64)
    for b, n in enumerate(lens):
        sl = slice(int(cu[b]), int(cu[b + 1]))
        ro, rl = rf.ranker_attention_reference(q[None, sl], k[None, sl], v[None, sl], bounds[b:b + 1],
                                               return_lse=True, compute_dtype=torch.float64)
        torch.testing.assert_close(o[sl], ro[0])
        torch.testing.assert_close(l[:, sl], rl[0])


def test_mask_helpers():
    m = dense_mask([1, 3, 3, 5], 6)
    want = torch.zeros(6, 6, dtype=torch.bool)
    want[1:5, 1:3] = True  # history and candidate rows see the history keys
    want[3, 3] = want[4, 4] = True  # candidate self keys
    assert torch.equal(m, want)
    assert clamp_bounds(torch.tensor([-3, 99, 7, 2]), 10).tolist() == [0, 10, 7, 7]
    b = torch.tensor([[0, 4096, 4096, 4608]] * 2)
    assert admitted_pairs(b, [4608, 4608]) == 2 * (4608 * 4096 + 512)
    for row, s in (([1, 3, 3, 5], 6), ([0, 6, 4, 10], 10), ([3, 11, 0, 3], 11)):
        assert admitted_pairs(torch.tensor([row]), [s]) == int(dense_mask(row, s).sum())


def _args(**kw):
    q = torch.zeros(2, 64, 4, 128, dtype=torch.bfloat16)
    base = dict(q=q, k=torch.zeros(2, 64, 2, 128, dtype=torch.bfloat16), v=torch.zeros(2, 64, 2, 128, dtype=torch.bfloat16),
                bounds=torch.zeros(2, 4, dtype=torch.int32), softmax_scale=None, cap=None, cap_method="tanh",
                cu_seqlens=None, max_seqlen=None, cuda=False)
    base.update(kw)
    return base


def test_validation_accepts_good_args():
    assert rf._validate(**_args())[0] is False


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(q=torch.zeros(2, 64, 4, 128)), TypeError, "dtype"),
    (dict(bounds=torch.zeros(2, 4, dtype=torch.int64)), TypeError, "bounds"),
    (dict(bounds=torch.zeros(3, 4, dtype=torch.int32)), ValueError, "bounds"),
    (dict(q=torch.zeros(2, 64, 4, 96, dtype=torch.bfloat16)), ValueError, "head dim"),
    (dict(q=torch.zeros(2, 64, 3, 128, dtype=torch.bfloat16)), ValueError, "multiple of Hkv"),
    (dict(k=torch.zeros(2, 64, 2, 128, dtype=torch.float16)), TypeError, "share a dtype"),
    (dict(q=torch.zeros(2, 64, 4, 256, dtype=torch.bfloat16)[..., ::2]), ValueError, "contiguous"),
    (dict(cap=-1.0), ValueError, "cap"),
    (dict(cap_method="relu"), ValueError, "cap_method"),
    (dict(max_seqlen=5), ValueError, "cu_seqlens"),
    (dict(q=torch.zeros(2, 64, 4, 128, dtype=torch.bfloat16)[:, :32]), ValueError, "batch and sequence"),
])
def test_validation_errors(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        rf._validate(**_args(**kw))


def test_cuda_required():
    with pytest.raises(ValueError, match="CUDA"):
        rf.ranker_attention(torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16), torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16),
                            torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16), torch.zeros(1, 4, dtype=torch.int32))


def test_autocast_casts_only_float32_inputs_under_autocast():
    """The autocast cast (GPU-tested through the op in tests/gpu/test_ranker_bwd_gpu.py), here on CPU tensors under
    CPU autocast: float32 q and v are cast to the autocast dtype, k already float16 is not; a bfloat16 input beside
    them is a TypeError naming the cast; nothing is cast without autocast; meta tensors follow CUDA's autocast
    (shape inference sees the CUDA call's dtypes), not CPU's; the op still refuses the CPU device."""
    q = torch.randn(1, 8, 2, 64)
    k = q.to(torch.float16)
    args = (q, k, q)
    assert all(a is b for a, b in zip(rf._autocast_inputs(*args), args))  # autocast off
    meta = tuple(t.to("meta") for t in args)
    with torch.autocast("cpu", dtype=torch.float16):
        cq, ck, cv = rf._autocast_inputs(*args)
        assert cq.dtype == cv.dtype == torch.float16 and ck is k
        with pytest.raises(TypeError, match="autocast.*k is torch.bfloat16"):
            rf._autocast_inputs(q, q.to(torch.bfloat16), q)
        assert all(a is b for a, b in zip(rf._autocast_inputs(*meta), meta))  # (CUDA's autocast is off)
        with pytest.raises(ValueError, match="CUDA"):
            rf.ranker_attention(q, q, q, torch.zeros(1, 4, dtype=torch.int32))
    before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)  # (this machine may have no CUDA: the state alone)
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    try:
        out, lse = rf.ranker_attention(*(t.to(torch.float32) for t in meta), torch.empty(1, 4, dtype=torch.int32,
                                                                                         device="meta"),
                                       return_lse=True)
        assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    finally:
        torch.set_autocast_enabled("cuda", before[0])
        torch.set_autocast_dtype("cuda", before[1])


def test_references_ignore_autocast():
    """The torch references compute in their documented dtypes inside an autocast block (whose matmuls would
    otherwise run in 16 bits): the same values as outside it."""
    from cute_kernels.kernels import ranker_bwd as rb

    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 70, 2, 64, generator=g) for _ in range(4))
    bounds = torch.tensor([[0, 50, 50, 70]], dtype=torch.int32)
    want = rf.ranker_attention_reference(q, k, v, bounds), rb.ranker_attention_backward_reference(q, k, v, bounds, do,
                                                                                                  compute_dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = rf.ranker_attention_reference(q, k, v, bounds), rb.ranker_attention_backward_reference(
            q, k, v, bounds, do, compute_dtype=torch.float32)
    assert torch.equal(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        assert torch.equal(a, b)


def test_illegal_configs_are_refused_at_construction():
    """Issue 3: an illegal config is rejected when constructed, with the reason (directly, through
    dataclasses.replace and through the --config parser), for every kernel's config class."""
    import dataclasses

    from cute_kernels.kernels import hc_mix_tma, hc_mix_walk, qknorm, qknorm_tp, ranker_bwd, scale
    from cute_kernels.layouts import kernel_layouts as kl
    from cute_kernels.runtime.validate import ValidatedConfig

    for cls in (rf.RankerFwdConfig, ranker_bwd.RankerBwdConfig, hc_mix_walk.HcMixConfig, hc_mix_tma.HcMixTmaConfig,
                qknorm.QKNormConfig, qknorm.QKNormTuning, qknorm_tp.ParallelQKNormConfig, scale.ScaleConfig):
        assert issubclass(cls, ValidatedConfig), cls
    with pytest.raises(ValueError, match="WGMMA M"):
        rf.RankerFwdConfig(tile_m=96)
    with pytest.raises(ValueError, match="shared memory"):
        dataclasses.replace(rf.CONFIGS[128], stages=4)
    with pytest.raises(ValueError, match="supported head dims"):
        kl.ranker_config("head_dim=96")
    with pytest.raises(TypeError, match="tile_n"):
        rf.RankerFwdConfig(tile_n=128.0)
    with pytest.raises(ValueError, match="accumulator registers"):
        ranker_bwd.RankerBwdConfig(tile_m=128)
    with pytest.raises(ValueError, match="unroll"):
        scale.ScaleConfig(unroll=0)
    with pytest.raises(ValueError, match="bulk_stages"):
        qknorm.QKNormTuning(bulk_stages=1)
    # a change that fits only together with another one is made in one replace (the parsers do so)
    assert kl.ranker_bwd_config("head_dim=64,tile_m=128").dq_split_rows


def test_config_validate():
    for cfg in rf.CONFIGS.values():
        cfg.validate()
    with pytest.raises(ValueError, match="WGMMA M"):
        rf.RankerFwdConfig(tile_m=192).validate()
    with pytest.raises(ValueError, match="shared memory"):
        rf.RankerFwdConfig(head_dim=128, tile_n=128, stages=4).validate()
    with pytest.raises(ValueError, match="head_dim"):
        rf.RankerFwdConfig(head_dim=96).validate()
    with pytest.raises(ValueError, match="tile_n"):
        rf.RankerFwdConfig(tile_n=72).validate()
    with pytest.raises(ValueError, match="shared memory"):  # persistent needs its own sO
        rf.RankerFwdConfig(head_dim=256, tile_n=64, stages=2, persistent=True).validate()
    with pytest.raises(ValueError, match="registers"):
        rf.RankerFwdConfig(head_dim=256, tile_n=256, stages=1).validate()
    three = dict(head_dim=64, tile_m=192, stages=4, consumer_wgs=3, producer_regs=32, consumer_regs=160)
    rf.RankerFwdConfig(tile_n=112, **three).validate()
    with pytest.raises(ValueError, match="accumulator registers"):  # ptxas: spills 56 bytes at 160 registers
        rf.RankerFwdConfig(tile_n=128, **three).validate()
    rf.RankerFwdConfig(tile_n=128, intra_wg_overlap=False, **three).validate()  # P reuses S's registers
    with pytest.raises(ValueError, match="accumulator registers"):
        rf.RankerFwdConfig(tile_n=176, intra_wg_overlap=False, **three).validate()
    with pytest.raises(ValueError, match="register split"):  # 512 threads: 128 registers each at launch
        rf.RankerFwdConfig(tile_n=112, **{**three, "consumer_regs": 168}).validate()
    with pytest.raises(ValueError, match="consumer_wgs"):
        rf.RankerFwdConfig(tile_m=256, consumer_wgs=4).validate()
    with pytest.raises(ValueError, match="must not get more"):  # ptxas C7406, a setmaxnreg.dec above every count
        rf.RankerFwdConfig(head_dim=64, tile_n=64, stages=2, producer_regs=200, consumer_regs=120).validate()
    for cfg in rf.CAP_CONFIGS.values():
        cfg.validate()
    with pytest.raises(ValueError, match="exclude each other"):
        rf.RankerFwdConfig(fixed_row_max=True, checked_max=True).validate()


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("cap_method", ["none", "tanh", "soft_sign"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_shipped_d64_configs_do_not_spill(dtype, cap_method, varlen):
    """D=64 ships three consumer warpgroups at 160 registers without the intra-warpgroup overlap: tile_n=128
    without a cap (with the overlap it spills), 112 with one (the varlen kernels spill 8-32 bytes at 128
    with a cap).  Every dtype / cap / varlen variant compiles without local memory."""
    from cute_kernels.runtime.cache import compile_record

    cfg = rf.shipped_config(dtype, 64, cap_method)
    assert cfg.consumer_wgs == 3 and not cfg.intra_wg_overlap and cfg.tile_n == (128 if cap_method == "none" else 112)
    assert rf.config_for_shape(dtype, 1, 256, 4, 4, 64, cap_method, varlen=varlen) == cfg
    rf._compile(dtype, cfg, 1, cap_method, varlen)
    rec = compile_record(rf.NAME, (str(dtype), cfg, 1, cap_method, varlen))
    assert all(r.stack_bytes == 0 for r in rec.resources), [r.stack_bytes for r in rec.resources]


@pytest.mark.parametrize("dtype,cap_method,varlen", [
    (torch.bfloat16, "tanh", False), (torch.bfloat16, "tanh", True), (torch.float16, "tanh", False),
    (torch.bfloat16, "soft_sign", False), (torch.float16, "soft_sign", True)])
def test_shipped_capped_d128_config_does_not_spill(dtype, cap_method, varlen):
    """With a cap, D=128 ships three consumer warpgroups (tile_n=64), the row max fixed at 0 for bfloat16."""
    from cute_kernels.runtime.cache import compile_record

    cfg = rf.shipped_config(dtype, 128, cap_method)
    assert cfg.consumer_wgs == 3 and cfg.tile_n == 64 and cfg.fixed_row_max == (dtype == torch.bfloat16)
    assert rf.config_for_shape(dtype, 1, 256, 4, 4, 128, cap_method, varlen=varlen) == cfg
    for hr in (1, 4):
        rf._compile(dtype, cfg, hr, cap_method, varlen)
        rec = compile_record(rf.NAME, (str(dtype), cfg, hr, cap_method, varlen))
        assert all(not r.stack_bytes for r in rec.resources), [r.stack_bytes for r in rec.resources]
        # soft_sign clamps x = scale * q.k / cap to +-2**100 before 1 / (1 + |x|) (sm90_helpers.soft_sign_unit)
        assert ("min.NaN.xorsign.abs.f32" in rec.ptx) == (cap_method == "soft_sign")


def test_fixed_row_max_ships_on_the_capped_bf16_configs_and_drops_the_running_max():
    """``fixed_row_max``: P against a row max fixed at 0 where the cap bounds the scores.  Shipped on the
    capped configs but soft_sign D=64 (which would spill), for bfloat16 only; the kernel refuses it without
    a cap or in float16; its consumer has no max reduction (no ``max.f32`` in the PTX, where the online form
    has one per score) and no O rescale."""
    import dataclasses

    import cutlass

    from cute_kernels.runtime.cache import compile_record

    for (capm, d), cfg in rf.CAP_CONFIGS.items():
        assert cfg.fixed_row_max == ((capm, d) != ("soft_sign", 64)), (capm, d)
        assert not rf.shipped_config(torch.float16, d, capm).fixed_row_max
    assert not any(c.fixed_row_max for c in rf.CONFIGS.values())
    fixed = rf.CAP_CONFIGS[("tanh", 128)]
    with pytest.raises(ValueError, match="fixed_row_max needs bfloat16 and a cap"):
        rf.RankerAttentionFwd(cutlass.BFloat16, fixed, 1, "none", False)
    with pytest.raises(ValueError, match="fixed_row_max needs bfloat16 and a cap"):
        rf.RankerAttentionFwd(cutlass.Float16, fixed, 1, "tanh", False)
    online = dataclasses.replace(fixed, fixed_row_max=False)
    maxes = {}
    for cfg in (fixed, online):
        rf._compile(torch.bfloat16, cfg, 1, "tanh", False)
        ptx = compile_record(rf.NAME, (str(torch.bfloat16), cfg, 1, "tanh", False)).ptx
        maxes[cfg.fixed_row_max] = len(re.findall(r"\bmax(\.\w+)*\.f32\b", ptx))
    assert maxes[True] == 0 and maxes[False] >= 64, maxes


@pytest.mark.parametrize("dtype,cap,fixed", [
    (torch.bfloat16, 50.0, True), (torch.bfloat16, 2.0, True), (torch.bfloat16, 50.001, False),
    (torch.bfloat16, 1e6, False), (torch.float16, 10.0, False)])
def test_fixed_row_max_only_where_the_cap_bounds_p(monkeypatch, dtype, cap, fixed):
    """The host launches a fixed-max config only for bfloat16 with cap <= FIXED_MAX_CAP (P stays within
    (e^-50, e^50)); otherwise the same tile shape with the online max, also for a config passed in."""
    launched = stand_in_forward(monkeypatch)
    monkeypatch.setattr(rf, "_DROPPED_WARNED", set())
    assert rf.fixed_row_max_applies(dtype, cap) == fixed
    q = torch.zeros(1, 16, 2, 128, dtype=dtype)
    bounds = torch.zeros(1, 4, dtype=torch.int32)
    for config in (None, rf.CAP_CONFIGS[("tanh", 128)]):
        with warnings.catch_warnings(record=True) as got:  # (a caller's config is told its fixed max is dropped)
            warnings.simplefilter("always")
            rf._ranker_impl(q, q, q, bounds, None, cap, "tanh", None, None, config=config)
        dropped = [w for w in got if "online max" in str(w.message)]
        assert len(dropped) == len(got) == (config is not None and not fixed), [str(w.message) for w in got]
        cfg = launched[-1][0][1]
        assert cfg.fixed_row_max == fixed and cfg.consumer_wgs == 3 and cfg.tile_n == 64


rf_validate = rf._validate


def _refuse_misaligned(args) -> None:
    """What the compiled function's own argument checks (tvm-ffi) do with a misaligned tensor before they
    launch, for the stand-in kernels below: a ValueError (16-byte aligned 16-bit tensors, 4-byte the rest)."""
    for t in args:
        if isinstance(t, torch.Tensor) and t.data_ptr() % (16 if t.element_size() == 2 else 4):
            raise ValueError("Misaligned Tensor data (stand-in for tvm-ffi's check)")


def _attention_entry(ptx: str) -> str:
    """The attention kernel's body in a compiled forward's PTX (its only kernel)."""
    parts = re.split(r"\.visible \.entry ", ptx)
    bodies = [p for p in parts[1:] if p.startswith("kernel_cutlass_kernel_")]
    assert len(bodies) == 1, [p[:40] for p in parts[1:]]
    return bodies[0]


@pytest.mark.parametrize("varlen", [False, True])
def test_no_lse_variant(varlen):
    """The kernel variant for calls without ``return_lse`` (``lse=None``): the shipped D=128 config compiles
    without local memory and its attention kernel has no float32 global stores (the LSE's are its only
    ones; O goes by TMA or 16-byte stores: ``st.global.v4``), where the variant with the LSE has them."""
    from cute_kernels.runtime.cache import compile_record

    cfg = rf.chosen_config(rf.shipped_config(torch.bfloat16, 128, "none"), torch.bfloat16, None)
    rf._compile(torch.bfloat16, cfg, 1, "none", varlen, with_lse=False)
    rf._compile(torch.bfloat16, cfg, 1, "none", varlen)
    without = compile_record(rf.NAME, rf.compile_key(torch.bfloat16, cfg, 1, "none", varlen, with_lse=False))
    with_lse = compile_record(rf.NAME, rf.compile_key(torch.bfloat16, cfg, 1, "none", varlen))
    assert without is not with_lse
    assert all(r.stack_bytes == 0 for r in without.resources), [r.stack_bytes for r in without.resources]
    f32_stores = lambda rec: len(re.findall(r"st\.global\.[bf]32\s", _attention_entry(rec.ptx)))  # (not .v4)
    assert f32_stores(without) == 0 < f32_stores(with_lse)


@pytest.mark.parametrize("target", rf.compile_targets(), ids=lambda t: t.label)
def test_compiles_for_sm90a(target):
    from cute_kernels.runtime.cache import compile_record

    target.build()
    rec = compile_record(target.kernel, target.key)
    ptx, sass = rec.ptx or "", rec.sass or ""
    assert "wgmma.mma_async" in ptx
    assert re.search(r"cp\.async\.bulk\.tensor\.\dd\.shared::(cta|cluster)\.global", ptx), "no TMA load"
    assert "setmaxnreg" in ptx
    assert re.search(r"bar\.arrive\s+(%r\d+|2), 256", ptx), "no warp-scheduler named barrier"
    cfg = target.key[1]
    attention = _attention_entry(ptx)
    # the epilogue's named barriers: with wg_epilogue (shipped at D=128 without a cap; fixed length only) each
    # consumer warpgroup's own (EpilogueWG1-3, 128 threads, the id from the warpgroup index: two per epilogue)
    # and no barrier of every consumer (Epilogue, id 1: 256 or 384 threads), else that one; besides them
    # checked_max's vote barrier (128 threads)
    assert cfg.wg_epilogue == (cfg.head_dim == 128 and target.key[3] == "none")
    wg = cfg.wg_epilogue and not target.key[4]
    every = re.search(r"bar\.sync\s+1, (256|384)", attention)
    assert not every if wg else every, "the epilogue's barrier of every consumer"
    n128 = len(re.findall(r"bar\.sync\s+%r\d+, 128;", attention))
    assert n128 == 2 * wg + cfg.checked_max, f"{n128} named barriers of 128 threads"
    # checked_max: each warp votes on its rows' check after a tile, the votes meet behind the warpgroup's named
    # barrier (128 threads); once the CTA's own tiles are done its consumers arrive at RetryList (id 11: 32 + 128
    # per consumer warpgroup), where the producer warp waits, and wait for each other at RetryListConsumers (12)
    retry = all(re.search(pattern, attention) for pattern in (
        r"bar\.arrive\s+11, (288|416);", r"bar\.sync\s+11, (288|416);", r"bar\.sync\s+12, (256|384);"))
    assert ("vote.sync.all" in attention) == bool(retry) == cfg.checked_max, "checked_max's vote and retry barriers"
    assert not re.search(r"\b(ld|st)\.local", ptx), "register spills"
    if "varlen" not in target.label:
        assert re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta", ptx), "no TMA store"
    if sass:
        assert "USETMAXREG" in sass and "HGMMA" in sass and "UTMALDG" in sass


def test_cached_validation_still_rejects(monkeypatch):
    """The per-signature cache skips repeated checks but never a misaligned pointer or a new bad signature."""
    full = rf._validate
    monkeypatch.setattr(rf, "_validate", lambda *a: full(*a, cuda=False))
    monkeypatch.setattr(rf, "_VALIDATED", {})
    a = _args()
    args = (a["q"], a["k"], a["v"], a["bounds"], None, None, "tanh", None, None)
    assert rf._validate_cached(*args) == rf._validate_cached(*args)
    assert len(rf._VALIDATED) == 1
    flat = torch.zeros(a["q"].numel() + 8, dtype=torch.bfloat16)
    q_mis = flat[1:1 + a["q"].numel()].view(a["q"].shape)  # same shape and strides, pointer off by 2 bytes
    with pytest.raises(ValueError, match="aligned"):
        rf._validate_cached(q_mis, *args[1:])
    with pytest.raises(TypeError, match="dtype"):
        rf._validate_cached(a["q"].float(), *args[1:])
    with pytest.raises(TypeError, match="torch.Tensor"):
        rf._validate_cached(None, *args[1:])


# ---------------------------------------------------------------- scalar arguments and varlen offsets
@pytest.mark.parametrize("kw,exc,msg", [
    (dict(cap=True), TypeError, "cap"),
    (dict(cap="3.0"), TypeError, "cap"),
    (dict(cap=math.inf), ValueError, "cap"),
    (dict(cap=math.nan), ValueError, "cap"),
    (dict(cap=0.0), ValueError, "cap"),
    (dict(cap=1e-300), ValueError, "cap"),  # rounds to 0 in float32
    (dict(softmax_scale=2.0, cap=1.2e-38), ValueError, "above float32 max / 4"),  # 1.7e38: finite, over the bound
    (dict(softmax_scale=True), TypeError, "softmax_scale"),
    (dict(softmax_scale="0.1"), TypeError, "softmax_scale"),
    (dict(softmax_scale=math.nan), ValueError, "softmax_scale"),
    (dict(softmax_scale=1e300), ValueError, "softmax_scale"),
    (dict(softmax_scale=10**400), ValueError, "softmax_scale"),
    (dict(softmax_scale=1e-50), ValueError, "softmax_scale"),  # float32 would flush it to 0 (as cap above)
    (dict(cap_method=["tanh"]), TypeError, "cap_method"),
    (dict(cap_method=3), TypeError, "cap_method"),
    (dict(cap_method="tan"), ValueError, "cap_method"),
])
def test_scalar_validation(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        rf._validate(**_args(**kw))
    with pytest.raises(exc, match=msg):  # the reference applies the same rules
        a = _args(**kw)
        rf.ranker_attention_reference(a["q"], a["k"], a["v"], a["bounds"], a["softmax_scale"], a["cap"],
                                      a["cap_method"])


def test_scalar_validation_accepts_reals():
    import numpy as np

    for kw in (dict(cap=3), dict(cap=np.float32(2.5)), dict(softmax_scale=0.0), dict(softmax_scale=np.float64(0.1)),
               dict(cap=30.0, cap_method="soft_sign")):
        rf._validate(**_args(**kw))


def test_negative_softmax_scale_is_rejected():
    """The online softmax keeps its running max over raw scores: a negative scale would turn it into
    a running min and overflow exp2 (NaN); rejected in the op and the reference alike."""
    with pytest.raises(ValueError, match="softmax_scale"):
        rf._validate(**_args(softmax_scale=-0.5))
    a = _args()
    with pytest.raises(ValueError, match="softmax_scale"):
        rf.ranker_attention_reference(a["q"], a["k"], a["v"], a["bounds"], softmax_scale=-0.5)


def test_non_tensor_inputs_are_type_errors_also_with_grad_mode():
    a = _args()
    with pytest.raises(TypeError):
        cute_kernels.ranker_attention([1.0], a["k"], a["v"], a["bounds"])  # grad mode on: no AttributeError


def test_use_config_takes_a_forward_config_only():
    from cute_kernels.kernels.ranker_bwd import RankerBwdConfig

    for bad in (RankerBwdConfig(), None, {"head_dim": 128}):
        with pytest.raises(TypeError, match="RankerFwdConfig"):
            with rf.use_config(bad):
                pass
    assert not rf._OVERRIDES


def test_fake_outputs_are_compact_like_the_real_ones():
    """torch.compile plans with the fake's strides: they must match the real (compact) outputs."""
    q = torch.zeros(2, 4, 8, 64, dtype=torch.bfloat16).transpose(1, 2)  # [B, S, H, D] view of [B, H, S, D]
    out, lse = rf._fake(q, q, q, torch.zeros(2, 4, dtype=torch.int32))
    assert out.shape == q.shape and out.is_contiguous() and not q.is_contiguous()
    from cute_kernels.kernels import ranker_bwd as rb

    assert all(t.is_contiguous() for t in rb._fake_bwd(q, q, q, q, lse, q, torch.zeros(2, 4, dtype=torch.int32)))


def test_varlen_reference_covers_tokens_past_the_last_sequence():
    """T = 10 packed tokens, sequences cover 7: out has T rows (0 past 7), lse [Hq, T] (-inf past 7)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(10, 2, 64, generator=g) for _ in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    bounds = torch.tensor([[0, 2, 2, 3], [0, 3, 3, 4]], dtype=torch.int32)
    out, lse = rf.ranker_attention_reference(q, k, v, bounds, cu_seqlens=cu, return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 10)
    assert (out[7:] == 0).all() and torch.isneginf(lse[:, 7:]).all() and torch.isfinite(lse[:, :7]).all()


def _varlen_args(cu, nb=None, t=16, **kw):
    cu = torch.tensor(cu, dtype=torch.int32) if not isinstance(cu, torch.Tensor) else cu
    nb = cu.shape[0] - 1 if nb is None else nb
    base = dict(q=torch.zeros(t, 4, 64, dtype=torch.bfloat16), k=torch.zeros(t, 2, 64, dtype=torch.bfloat16),
                v=torch.zeros(t, 2, 64, dtype=torch.bfloat16), bounds=torch.zeros(nb, 4, dtype=torch.int32),
                softmax_scale=None, cap=None, cap_method="tanh", cu_seqlens=cu, max_seqlen=None)
    base.update(kw)
    return base


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(cu=torch.tensor([0, 5, 16], dtype=torch.int64)), TypeError, "cu_seqlens has dtype int64"),
    (dict(cu=[0, 5, 16], nb=3), ValueError, "cu_seqlens has 3 entries"),
    (dict(cu=[0]), ValueError, "at least 2"),
    (dict(cu=[0, 5, 16], max_seqlen=True), TypeError, "max_seqlen"),
    (dict(cu=[0, 5, 16], max_seqlen=11.0), TypeError, "max_seqlen"),
    (dict(cu=[0, 5, 16], max_seqlen=-1), ValueError, "max_seqlen"),
    (dict(cu=[0, 5, 16], max_seqlen=2**31), ValueError, "max_seqlen"),
])
def test_varlen_signature_validation(kw, exc, msg):
    a = _varlen_args(**kw)
    with pytest.raises(exc, match=msg):
        rf._validate(**a, cuda=False)


@pytest.fixture
def fake_launch(monkeypatch):
    """_ranker_impl on CPU tensors: validation without the CUDA requirement, a recording stand-in kernel."""
    launched = stand_in_forward(monkeypatch)
    monkeypatch.setattr(rf, "_capturing", lambda t: False, raising=False)

    def run(**kw):
        a = _varlen_args(**kw)
        rf._ranker_impl(a["q"], a["k"], a["v"], a["bounds"], a["softmax_scale"], a["cap"], a["cap_method"],
                        a["cu_seqlens"], a["max_seqlen"])
        return launched[-1][1][11]  # the max_seqlen handed to the kernel

    return run


@pytest.mark.parametrize("cu,max_seqlen,msg", [
    ([1, 5, 16], None, r"cu_seqlens\[0\] must be 0"),
    ([1, 5, 16], 11, r"cu_seqlens\[0\] must be 0"),
    ([0, 9, 5, 16], None, r"non-decreasing: cu_seqlens\[2\]=5 < cu_seqlens\[1\]=9"),
    ([0, 9, 5, 16], 11, "non-decreasing"),
    ([0, 2**31 - 1, -5], 2**31 - 1, "non-decreasing"),  # int32 differences would wrap
    ([0, 5, 17], None, r"cu_seqlens\[-1\]=17 exceeds the 16 packed tokens"),
    ([0, 5, 17], 12, "exceeds"),
    ([0, 5, 16], 10, r"max_seqlen=10 is smaller than sequence 1's length 11 \(cu_seqlens\[2\] - cu_seqlens\[1\]\)"),
])
def test_varlen_values_checked_before_launch(fake_launch, cu, max_seqlen, msg):
    with pytest.raises(ValueError, match=msg):
        fake_launch(cu=cu, max_seqlen=max_seqlen)


def test_varlen_values_checked_on_every_call(fake_launch):
    """The per-signature cache must not skip the value check: same signature, new bad values."""
    assert fake_launch(cu=[0, 5, 16], max_seqlen=11) == 11
    assert fake_launch(cu=[0, 5, 16]) == 11  # computed from the offsets
    assert fake_launch(cu=[0, 5, 16], max_seqlen=500) == 16  # clamped to the packed total
    assert fake_launch(cu=[0, 0, 7]) == 7  # empty sequences are fine; cu[-1] < T too
    with pytest.raises(ValueError, match="smaller than sequence"):
        fake_launch(cu=[0, 1, 16], max_seqlen=11)
    with pytest.raises(ValueError, match="non-decreasing"):
        fake_launch(cu=[0, 12, 3], max_seqlen=11)


def test_varlen_values_trusted_during_capture(fake_launch, monkeypatch):
    monkeypatch.setattr(rf, "_capturing", lambda t: True, raising=False)
    assert fake_launch(cu=[0, 9, 5, 16], max_seqlen=11) == 11  # no host read under capture: caller's duty
    with pytest.raises(ValueError, match="max_seqlen is required"):
        fake_launch(cu=[0, 5, 16])


def test_cached_validation_is_type_aware(monkeypatch):
    """True == 1 hash alike: a cached cap=1 must not let cap=True through."""
    full = rf._validate
    monkeypatch.setattr(rf, "_validate", lambda *a: full(*a, cuda=False))
    monkeypatch.setattr(rf, "_VALIDATED", {})
    a = _args()
    args = [a["q"], a["k"], a["v"], a["bounds"], 1, 1, "tanh", None, None]
    rf._validate_cached(*args)
    with pytest.raises(TypeError, match="cap"):
        rf._validate_cached(*args[:5], True, *args[6:])
    with pytest.raises(TypeError, match="softmax_scale"):
        rf._validate_cached(*args[:4], True, *args[5:])


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(k=torch.zeros(2, 5, 3, 8), v=torch.zeros(2, 5, 3, 8)), ValueError, "multiple of Hkv"),
    (dict(bounds=torch.zeros(3, 4, dtype=torch.int32)), ValueError, "bounds must be"),
    (dict(cu_seqlens=torch.tensor([0, 5, 10], dtype=torch.int32)), ValueError, "3 dims"),
    (dict(k=torch.zeros(2, 6, 2, 8), v=torch.zeros(2, 6, 2, 8)), ValueError, "share all sizes"),
    (dict(max_seqlen=5), ValueError, "only meaningful"),
])
def test_reference_validation(kw, exc, msg):
    a = dict(q=torch.zeros(2, 5, 4, 8), k=torch.zeros(2, 5, 2, 8), v=torch.zeros(2, 5, 2, 8),
             bounds=torch.zeros(2, 4, dtype=torch.int32))
    a.update(kw)
    with pytest.raises(exc, match=msg):
        rf.ranker_attention_reference(**a)


@pytest.mark.parametrize("cu,nb,max_seqlen,msg", [
    ([0, 5, 10], 3, None, r"B = len\(cu_seqlens\) - 1 = 2"),
    ([0, 5, 11], 2, None, "exceeds the 10 packed tokens"),
    ([0, 6, 5], 2, None, "non-decreasing"),
    ([2, 5, 10], 2, None, r"cu_seqlens\[0\] must be 0"),
    ([0, 5, 10], 2, 4, "smaller than sequence"),
    ([], 0, None, "at least 2 entries"),
    ([0], 0, None, "at least 2 entries"),
])
def test_reference_varlen_validation(cu, nb, max_seqlen, msg):
    q = torch.zeros(10, 4, 8)
    k = torch.zeros(10, 2, 8)
    with pytest.raises(ValueError, match=msg):
        rf.ranker_attention_reference(q, k, k, torch.zeros(nb, 4, dtype=torch.int32),
                                      cu_seqlens=torch.tensor(cu, dtype=torch.int32), max_seqlen=max_seqlen)


def test_scalars_that_would_overflow_float32_in_the_kernel_are_rejected():
    from cute_kernels.kernels import ranker_fwd as rf

    for scale, cap, what in ((3e38, None, "softmax_scale"), (None, 3e38, "cap"), (100.0, 1.2e-38, "above float32 max / 4")):
        with pytest.raises(ValueError, match=what):
            rf._check_scalars(scale, cap, "tanh")
    rf._check_scalars(0.1, 50.0, "tanh")
    rf._check_scalars(None, None, "soft_sign")


def test_use_config_overrides_within_the_block_only():
    import dataclasses

    cfg = dataclasses.replace(rf.CONFIGS[128], stages=3, tile_n=96)
    with rf.use_config(cfg) as c:
        assert c is cfg and rf._OVERRIDES[128] is cfg
        inner = dataclasses.replace(cfg, intra_wg_overlap=not cfg.intra_wg_overlap)
        with rf.use_config(inner):
            assert rf._OVERRIDES[128] is inner
        assert rf._OVERRIDES[128] is cfg
    assert 128 not in rf._OVERRIDES
    with pytest.raises(ValueError, match="shared memory"):  # rejected before the block runs
        with rf.use_config(dataclasses.replace(rf.CONFIGS[128], stages=3)):
            raise AssertionError("entered")
    assert 128 not in rf._OVERRIDES


def test_use_config_blocks_in_several_threads_leave_no_override(monkeypatch):
    """Blocks opened and closed in several threads at once: once all are closed no override is left (a block
    opened while another thread's was closing was lost from the stack, and the closing one then put back a
    config of a block already closed: every later call of that head dim ran it, and no call took a launch plan;
    or it popped the override while another thread's block was still open).
    (use_config stays process-wide: an open block applies to every thread's calls.)"""
    from thread_helpers import run_threads

    monkeypatch.setattr(rf, "_OVERRIDES", {})
    monkeypatch.setattr(rf, "_OVERRIDE_STACKS", {})
    base = rf.shipped_config(torch.bfloat16, 128, "none")
    configs = [base, dataclasses.replace(base, tile_n=96), dataclasses.replace(base, stages=1)]
    lost = []  # a block that found no override of its head dim while open

    def blocks(cfg):
        for _ in range(10000):
            with rf.use_config(cfg):
                if 128 not in rf._OVERRIDES:
                    lost.append(cfg)

    run_threads(blocks, [(c,) for c in configs])
    assert (len(lost), rf._OVERRIDES, [s for s in rf._OVERRIDE_STACKS.values() if s]) == (0, {}, [])


def test_use_config_for_another_head_dim_warns(monkeypatch):
    """A call whose head dim no open use_config block is for runs the tuned / shipped config, with a
    RuntimeWarning naming the blocks' head dims (it was silent: a newcomer's D=64 config around a D=128 call);
    a call of the block's head dim runs the block's config without one."""
    import dataclasses
    import warnings

    launched = stand_in_forward(monkeypatch)
    cfg64 = dataclasses.replace(rf.shipped_config(torch.bfloat16, 64, "none"), stages=3)
    q128, q64 = (torch.randn(1, 128, 2, d).to(torch.bfloat16) for d in (128, 64))
    bounds = torch.tensor([[0, 96, 96, 128]], dtype=torch.int32)
    with rf.use_config(cfg64):
        for call in (cute_kernels.ranker_attention, rf.config_for_call):  # the warning names this file's line
            with pytest.warns(RuntimeWarning, match=r"head_dim \[64\], not this call's head_dim=128") as rec:
                call(q128, q128, q128, bounds)
            assert [w.filename for w in rec] == [__file__], call
        assert launched[-1][0][1] == rf.shipped_config(torch.bfloat16, 128, "none")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            cute_kernels.ranker_attention(q64, q64, q64, bounds)
        assert launched[-1][0][1] == cfg64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cute_kernels.ranker_attention(q128, q128, q128, bounds)


@pytest.mark.parametrize("dtype,d,cap,cap_method,varlen,own", [
    (torch.bfloat16, 128, None, "tanh", False, False), (torch.float16, 128, None, "tanh", False, False),
    (torch.bfloat16, 64, 30.0, "tanh", False, False), (torch.bfloat16, 128, 60.0, "tanh", False, False),
    (torch.bfloat16, 64, 5.0, "soft_sign", False, False), (torch.bfloat16, 128, None, None, True, False),
    (torch.bfloat16, 256, 20.0, "soft_sign", False, False), (torch.bfloat16, 128, 10.0, "tanh", False, True),
])
def test_config_for_call_is_the_launched_config(monkeypatch, dtype, d, cap, cap_method, varlen, own):
    """config_for_call (CPU and meta tensors, no launch) names the config the call launches, the fixed max dropped
    where it does not apply and a use_config block's config for the head dim (``own``: a checked_max config with a
    cap, which runs with the online max)."""
    import contextlib
    import dataclasses
    import warnings

    launched = stand_in_forward(monkeypatch)
    n, s = (1, 300) if varlen else (2, 150)
    q = torch.randn(*((s,) if varlen else (n, s)), 4, d).to(dtype)
    k = torch.randn(*q.shape[:-2], 2, d).to(dtype)
    bounds = torch.tensor([[0, 100, 100, 150]] * n, dtype=torch.int32)
    cu = torch.tensor([0, 300], dtype=torch.int32) if varlen else None
    args = (q, k, k, bounds)
    kw = dict(cap=cap, cap_method=cap_method, cu_seqlens=cu)
    block = contextlib.nullcontext()
    if own:
        block = rf.use_config(dataclasses.replace(rf.shipped_config(dtype, d, "none"), stages=1))
    with block, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (own: the dropped checked_max's warning)
        want = rf.config_for_call(*args, **kw)
        meta_kw = {**kw, "cu_seqlens": None if cu is None else cu.to("meta")}
        assert rf.config_for_call(*(t.to("meta") for t in args), **meta_kw) == want
        cute_kernels.ranker_attention(*args, **kw)
    assert launched[-1][0][1] == want
    assert (want.checked_max or want.fixed_row_max) == (dtype == torch.bfloat16 and (cap is None or cap <= 50)
                                                         and not own and not (d == 64 and cap_method == "soft_sign"))


def test_config_for_call_applies_the_work_tile_limit():
    """config_for_call refuses what the launch would: more than 2^30 work tiles for the chosen tile_m (meta
    tensors; a packed call with max_seqlen too), where it named a config until session 83 (newcomer audit)."""
    q = torch.empty(1024, 2**20, 1024, 64, dtype=torch.bfloat16, device="meta")
    bounds = torch.zeros(1024, 4, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="exceed 2\\^30 work tiles"):
        rf.config_for_call(q, q, q, bounds)
    packed = torch.empty(2**30, 1024, 64, dtype=torch.bfloat16, device="meta")
    cu = torch.zeros(1025, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="exceed 2\\^30 work tiles"):
        rf.config_for_call(packed, packed, packed, bounds, cu_seqlens=cu, max_seqlen=2**20)
    assert rf.config_for_call(packed, packed, packed, bounds, cu_seqlens=cu).head_dim == 64  # (no max_seqlen)
    assert rf.config_for_call(q[:, :1024], q[:, :1024], q[:, :1024], bounds).head_dim == 64


def test_trace_time_check_includes_devices():
    """The fake (torch.compile / make_fx) refuses tensors on different devices, as the eager call does."""
    q = torch.empty(1, 128, 2, 128, dtype=torch.bfloat16, device="meta")
    bounds = torch.zeros(1, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="different devices"):
        rf._fake(q, q, q, bounds)
    out, lse = rf._fake(q, q, q, bounds.to("meta"))
    assert out.shape == q.shape and lse.shape == (1, 2, 128)


def test_cap_method_none_means_no_cap_everywhere():
    """cap_method=None is no cap in ranker_attention (here on meta tensors: the registered op), its backward,
    the references and shipped_config alike (session 40 review: the op raised TypeError where shipped_config
    took it); with a cap it is the ValueError of cap_method='none'."""
    from cute_kernels.kernels import ranker_bwd as rb

    qm = torch.empty(1, 128, 2, 128, dtype=torch.bfloat16, device="meta")
    bm = torch.empty(1, 4, dtype=torch.int32, device="meta")
    out, lse = rf.ranker_attention(qm, qm, qm, bm, cap_method=None, return_lse=True)
    assert out.shape == qm.shape and lse.shape == (1, 2, 128)
    with pytest.raises(ValueError, match="cap_method='none'"):
        rf.ranker_attention(qm, qm, qm, bm, cap=30.0, cap_method=None)
    dq, dk, dv = rb.ranker_attention_backward(qm, qm, qm, out, lse, qm, bm, cap_method=None)
    assert dq.shape == dk.shape == dv.shape == qm.shape
    q = torch.randn(1, 9, 2, 64, dtype=torch.float64)
    b = torch.tensor([[0, 6, 6, 9]], dtype=torch.int32)
    assert torch.equal(rf.ranker_attention_reference(q, q, q, b, cap_method=None),
                       rf.ranker_attention_reference(q, q, q, b, cap_method="none"))
    grads = rb.ranker_attention_backward_reference(q, q, q, b, q, cap_method=None)
    for g, h in zip(grads, rb.ranker_attention_backward_reference(q, q, q, b, q, cap_method="none")):
        assert torch.equal(g, h)
    assert rf.shipped_config(torch.bfloat16, 128, None) == rf.shipped_config(torch.bfloat16, 128, "none")
    assert rf.tuned_shape_key(1, 128, 2, 2, 128, None) == rf.tuned_shape_key(1, 128, 2, 2, 128, "none")
    for g, h in zip(rb.ranker_attention_backward_explicit(q, q, q, b, q, cap_method=None),
                    rb.ranker_attention_backward_explicit(q, q, q, b, q, cap_method="none")):
        assert torch.equal(g, h)


def test_skip_unit_rescale_ships_on_the_three_warpgroup_configs_only():
    """skip_unit_rescale (a warp vote around O *= factors) measured faster on three consumer warpgroups and
    slower on the two-warpgroup D=128 config; it compiles to a vote in the consumer loop."""
    import re

    from cute_kernels.runtime.cache import compile_record

    shipped = [*rf.CONFIGS.values(), *rf.CAP_CONFIGS.values()]
    assert all(c.skip_unit_rescale == (c.consumer_wgs == 3) for c in shipped)
    for cfg, capm in ((rf.CONFIGS[64], "none"), (rf.CONFIGS[128], "none")):
        rf._compile(torch.bfloat16, cfg, 1, capm, False)
        ptx = compile_record(rf.NAME, (str(torch.bfloat16), cfg, 1, capm, False)).ptx
        assert bool(re.search(r"vote\.sync\.any", ptx)) == cfg.skip_unit_rescale


def test_broadcast_kv_is_rejected_before_launch():
    """k expanded over the sequence (stride 0) would reach the TMA descriptor: a ValueError instead."""
    q = torch.zeros(2, 300, 4, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16).expand(2, 300, 4, 64)
    bounds = torch.tensor([[0, 200, 200, 300]] * 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="k is a broadcast view"):
        rf._validate(q, k, q, bounds, None, None, "tanh", None, None, cuda=False)
    rf._validate(q, k.contiguous(), q, bounds, None, None, "tanh", None, None, cuda=False)


def test_tile_count_limit():
    """The kernel walks its work tiles with an Int32 index stepping by the grid size (the tile count with one
    CTA per tile): more than 2^30 of them is a ValueError before the launch; _ranker_impl calls the check."""
    import inspect

    assert "_check_tile_count(max_seqlen, cfg.tile_m, hq, nb, varlen)" in inspect.getsource(rf._ranker_impl)
    rf._check_tile_count(4608, 128, 16, 4)
    rf._check_tile_count(2**20, 128, 16, 2**13)  # 8192 x 16 x 8192 = 2^30: the last allowed
    with pytest.raises(ValueError, match="2\\^30 work tiles"):  # tile + gridDim.x would reach 2^31
        rf._check_tile_count(2**20, 128, 16, 2**13 + 1)
    # the op's fake (meta tensors, tracing) checks it too for packed calls, at the largest tile_m (and with
    # max_seqlen clamped to the packed total T, as the eager call clamps it: T = 2**20 here)
    q = torch.empty(2**20, 8, 128, device="meta", dtype=torch.bfloat16)
    bounds = torch.empty(2**16 + 1, 4, device="meta", dtype=torch.int32)
    cu = torch.empty(2**16 + 2, device="meta", dtype=torch.int32)
    with pytest.raises(ValueError, match="2\\^30 work tiles"):
        rf._fake(q, q, q, bounds, cu_seqlens=cu, max_seqlen=2**20)
    rf._fake(q, q, q, bounds, cu_seqlens=cu, max_seqlen=2**16)
    # and for fixed-length calls (B = 2^16 rows of 192 tokens x Hq = 2^16: 2^32 tiles at any tile_m)
    q4 = torch.empty(2**16, 192, 2**16, 64, device="meta", dtype=torch.bfloat16)
    k4 = torch.empty(2**16, 192, 1, 64, device="meta", dtype=torch.bfloat16)
    b4 = torch.empty(2**16, 4, device="meta", dtype=torch.int32)
    with pytest.raises(ValueError, match="2\\^30 work tiles.*split the batch or the heads"):  # (no max_seqlen advice)
        cute_kernels.ranker_attention(q4, k4, k4, b4)
    rf._fake(q4[: 2**13], k4[: 2**13], k4[: 2**13], b4[: 2**13])  # 2^29 tiles at tile_m = 192: accepted


def test_compile_targets_are_the_shipped_configs():
    """`cute-kernels compile` warms what a default call runs (the tanh target: CAP_CONFIGS, three warpgroups;
    without a cap, checked_max at any length); bf16 D=128 without a cap also in the variant without the LSE (a
    call without return_lse)."""
    forms = set()
    for t in rf.compile_targets():
        (dtype, cfg, _, capm, varlen), extra = t.key[:5], t.key[5:]
        assert cfg == rf.shipped_config(getattr(torch, dtype[6:]), cfg.head_dim, capm), t.label
        assert extra in ((), ("no_lse",)) and (extra == ()) == ("no-lse" not in t.label), t.label
        forms.add((cfg.head_dim, capm, varlen, extra == ()))
    assert {(128, "none", False, True), (128, "tanh", False, True), (64, "none", False, True),
            (128, "none", True, True), (128, "none", False, False)} <= forms
    assert len({t.key for t in rf.compile_targets()}) == len(rf.compile_targets())  # (no target twice)


def test_self_kv_tma_ships_on_d128_without_a_cap_and_compiles_to_ldmatrix():
    """The candidate tiles' own K/V rows by TMA through the K/V pipeline, read with q_i from smem by ldmatrix
    (session 25), ship on the two-warpgroup D=128 config (tile_m == tile_n), with an L2 prefetch of that block
    at the tile's start (cp.async.bulk.prefetch.tensor, SASS UTMAPF; session 26); the three-warpgroup
    configs (tile_m != tile_n) read them from global memory, with no prefetch, and a config asking for
    self_kv_tma with tile_m != tile_n compiles to that global-memory path (no ldmatrix)."""
    from cute_kernels.runtime.cache import compile_record

    assert [d for d, c in rf.CONFIGS.items() if c.self_kv_tma] == [128]
    odd = dataclasses.replace(rf.CONFIGS[128], tile_n=96)
    assert odd.self_kv_tma and odd.tile_m != odd.tile_n
    cases = ((rf.CONFIGS[128], "none", True), (rf.CAP_CONFIGS[("tanh", 128)], "tanh", False), (odd, "none", False))
    for cfg, capm, ldmatrix in cases:
        for varlen in (False, True):
            rf._compile(torch.bfloat16, cfg, 1, capm, varlen)
            rec = compile_record(rf.NAME, (str(torch.bfloat16), cfg, 1, capm, varlen))
            assert ("ldmatrix.sync.aligned" in rec.ptx) == ldmatrix, (cfg, varlen)
            # the L2 prefetch of the self block (prefetch_self_kv) goes with the self stage's TMA load
            assert ("cp.async.bulk.prefetch.tensor" in rec.ptx) == ldmatrix, (cfg, varlen)
            assert all(r.stack_bytes == 0 for r in rec.resources)
            if rec.sass:
                assert ("LDSM" in rec.sass) == ldmatrix == ("UTMAPF" in rec.sass)


def test_exp2_scale_floor():
    """The kernels' exp2 multiplier: scale * log2(e) (or cap * log2(e)), floored at the smallest normal
    float32, so softmax_scale = 0 (accepted) keeps masked keys at -inf * scale = -inf instead of NaN."""
    tiny = torch.finfo(torch.float32).tiny
    assert rf.exp2_scale(0.125, None) == 0.125 * rf.LOG2_E
    assert rf.exp2_scale(0.125, 30.0) == 30.0 * rf.LOG2_E
    assert rf.exp2_scale(0.0, None) == tiny and rf.exp2_scale(1e-45, None) == tiny
    s = torch.tensor([-float("inf"), 0.0, -3.0, 1e4], dtype=torch.float32) * rf.exp2_scale(0.0, None)
    assert s[0] == -float("inf") and not torch.isnan(s).any()
    assert torch.equal(torch.exp2(s[1:]), torch.ones(3))


def test_argument_rules_found_by_the_session_15_review():
    """cap_method="none" (the library's own spelling for no cap) is accepted without a cap and refused with
    one; the reference checks return_lse's type and gives TypeError for a non-tensor cu_seqlens; the
    backward reference TypeError for a non-tensor dout; the register rule's message says it is measured."""
    from cute_kernels.kernels import ranker_bwd as rb

    q = torch.randn(1, 8, 2, 64)
    b = torch.tensor([[0, 6, 6, 8]], dtype=torch.int32)
    rf._check_scalars(None, None, "none")
    with pytest.raises(ValueError, match="cap_method='none'"):
        rf._check_scalars(None, 10.0, "none")
    out = rf.ranker_attention_reference(q, q, q, b, cap_method="none")
    assert torch.allclose(out, rf.ranker_attention_reference(q, q, q, b))
    with pytest.raises(TypeError, match="return_lse"):
        rf.ranker_attention_reference(q, q, q, b, return_lse=1)
    with pytest.raises(TypeError, match="cu_seqlens"):
        rf.ranker_attention_reference(q[0], q[0], q[0], b, cu_seqlens=[0, 8])
    with pytest.raises(TypeError, match="dout"):
        rb.ranker_attention_backward_reference(q, q, q, b, [[1.0]])
    with pytest.raises(ValueError, match="a measured rule"):
        rf.RankerFwdConfig(head_dim=128, tile_n=176).validate()


def test_varlen_bounds_rows_must_match_the_sequences():
    """Packed calls: one bounds row per sequence, said in the message (singular for one sequence)."""
    q = torch.zeros(8, 2, 64, dtype=torch.bfloat16, device="meta")
    cu = torch.zeros(2, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match=r"bounds has 2 rows; cu_seqlens has 2 entries, i.e. B = 1 sequence, so "
                                         r"bounds must have 1 row \(one per sequence\)"):
        rf._validate(q, q, q, torch.zeros(2, 4, dtype=torch.int32, device="meta"), None, None, "tanh", cu, None,
                     cuda=False, pointers=False)
    cu3 = torch.zeros(3, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match=r"bounds has 1 row; cu_seqlens has 3 entries, i.e. B = 2 sequences, so "
                                         r"bounds must have 2 rows"):
        rf._validate(q, q, q, torch.zeros(1, 4, dtype=torch.int32, device="meta"), None, None, "tanh", cu3, None,
                     cuda=False, pointers=False)


def test_reference_refuses_meta_bounds_and_cu_seqlens():
    """bounds (or cu_seqlens) on 'meta' with data tensors failed inside torch ('Cannot copy out of meta
    tensor'); now a ValueError naming the argument (newcomer review, session 20)."""
    from cute_kernels.kernels.ranker_fwd import ranker_attention_reference

    q = torch.randn(1, 8, 2, 16)
    bounds = torch.tensor([[0, 6, 6, 8]], dtype=torch.int32)
    with pytest.raises(ValueError, match="bounds"):
        ranker_attention_reference(q, q, q, bounds.to("meta"))
    packed = torch.randn(8, 2, 16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens"):
        ranker_attention_reference(packed, packed, packed, bounds, cu_seqlens=cu.to("meta"))
    ranker_attention_reference(packed, packed, packed, bounds, cu_seqlens=cu)  # the same with data: fine


def test_reference_refuses_fake_tensors_with_a_message():
    """Under FakeTensorMode the reference raised torch's DataDependentOutputException (it reads the bounds'
    values); now the ValueError meta tensors get (newcomer review, session 20)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cute_kernels.kernels.ranker_fwd import ranker_attention_reference

    with FakeTensorMode():
        q = torch.randn(1, 8, 2, 16)
        with pytest.raises(ValueError, match="fake"):
            ranker_attention_reference(q, q, q, torch.zeros(1, 4, dtype=torch.int32))


def test_checked_max_ships_uncapped_bf16(monkeypatch):
    """Without a cap, the shipped D=64/128/256 configs take checked_max (the fixed max, checked after each tile) for
    bfloat16 at any sequence length; float16 and caps run the online max (a capped config: fixed_row_max); a
    config passed in is taken as given; the kernel refuses checked_max with a cap or float16."""
    import cutlass

    assert rf.CONFIGS[64].checked_max and rf.CONFIGS[128].checked_max and rf.CONFIGS[256].checked_max
    assert not any(c.checked_max for c in rf.CAP_CONFIGS.values())
    assert not rf.shipped_config(torch.float16, 128, "none").checked_max
    with pytest.raises(ValueError, match="checked_max needs bfloat16 and no cap"):
        rf.RankerAttentionFwd(cutlass.BFloat16, rf.CONFIGS[128], 1, "tanh", False)
    with pytest.raises(ValueError, match="checked_max needs bfloat16 and no cap"):
        rf.RankerAttentionFwd(cutlass.Float16, rf.CONFIGS[128], 1, "none", False)
    launched = stand_in_forward(monkeypatch)
    for dtype, seq, cap, config, want in (
            (torch.bfloat16, 3000, None, None, True), (torch.bfloat16, 16, None, None, True),
            (torch.float16, 3000, None, None, False), (torch.bfloat16, 3000, 30.0, None, False),
            (torch.bfloat16, 16, None, dataclasses.replace(rf.CONFIGS[128], checked_max=False), False)):
        q = torch.zeros(1, seq, 2, 128, dtype=dtype)
        rf._ranker_impl(q, q, q, torch.zeros(1, 4, dtype=torch.int32), None, cap, "tanh", None, None, config=config)
        (_, cfg, *_), args = launched[-1]
        assert cfg.checked_max == want, (dtype, seq, cap, config)
        assert len(args) == 7 + 6  # (q, k, v, bounds, out, lse, cu_seqlens, then the scalars: no buffer of its own)


def test_caller_config_whose_fixed_max_does_not_apply_warns_once(monkeypatch):
    """A caller's config asking for fixed_row_max / checked_max where it does not apply (float16; fixed_row_max
    without a cap or above FIXED_MAX_CAP; checked_max with a cap) runs with the online max and says so once per
    (config, dtype, cap) (RuntimeWarning; every time where warnings are errors); the shipped choice and a config
    whose fixed max applies stay silent."""
    launched = stand_in_forward(monkeypatch)
    monkeypatch.setattr(rf, "_DROPPED_WARNED", set())
    capped = rf.shipped_config(torch.bfloat16, 128, "tanh")
    assert capped.fixed_row_max
    cases = ((torch.bfloat16, None, rf.CONFIGS[128], None), (torch.bfloat16, 30.0, capped, None),
             (torch.bfloat16, None, None, None), (torch.float16, 30.0, None, None),
             (torch.float16, 30.0, capped, "needs bfloat16"), (torch.bfloat16, 80.0, capped, "<= FIXED_MAX_CAP"),
             (torch.bfloat16, 30.0, rf.CONFIGS[128], "without a cap"), (torch.float16, None, rf.CONFIGS[128], "bfloat16"),
             (torch.bfloat16, None, capped, "needs a cap"))
    for dtype, cap, config, msg in cases:
        q = torch.zeros(1, 64, 2, 128, dtype=dtype)
        for rep in range(2):
            with warnings.catch_warnings(record=True) as got:
                warnings.simplefilter("always")
                rf._ranker_impl(q, q, q, torch.zeros(1, 4, dtype=torch.int32), None, cap, "tanh", None, None,
                                config=config)
            texts = [str(w.message) for w in got if issubclass(w.category, RuntimeWarning)]
            if msg is None or rep == 1:
                assert texts == [], (dtype, cap, config, texts)
            else:
                assert len(texts) == 1 and msg in texts[0] and "online max" in texts[0], texts
                cfg = launched[-1][0][1]
                assert not cfg.fixed_row_max and not cfg.checked_max
    # where warnings are errors, each such call raises (none runs silently after the first)
    q = torch.zeros(1, 64, 2, 128, dtype=torch.float16)
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeWarning, match="online max"):
                rf._ranker_impl(q, q, q, torch.zeros(1, 4, dtype=torch.int32), None, 20.0, "tanh", None, None,
                                config=capped)


def test_bench_host_mode_records(monkeypatch):
    """The bench's eager / isolated rows: only ours and FA4 + mask_mod (isolated only where the rounds were eager
    already); a timer's failure becomes that mode's error record and skips the impl's later modes."""
    from cute_kernels.kernels import ranker_bench as fwd

    calls = []

    def timer(mode, us):
        def t(fn):
            calls.append((mode, fn()))
            if us is None:
                raise RuntimeError("boom")
            return us
        return t

    monkeypatch.setattr(fwd, "_EAGER_TIMERS", (("eager", timer("eager", 200.0)), ("isolated", timer("isolated", 400.0))))
    monkeypatch.setattr(fwd, "_host_yardstick", lambda: (lambda: "mul"))  # (the real one needs CUDA)
    impls = [("cute_kernels", lambda: "ours"), ("fa4_mask_mod", lambda: "fa4"), ("flex_attention", lambda: "flex")]
    times = {"cute_kernels": [(100.0, "graph")], "fa4_mask_mod": [(150.0, "eager")], "flex_attention": [(90.0, "graph")]}
    recs = fwd.host_mode_records("ranker_fwd", impls, times, {"B": 1}, flops=4 * 10**8)
    assert [(r["impl"], r["mode"], r["time_us"], r["tflops"], r["torch_mul_us"]) for r in recs] == [
        ("cute_kernels", "eager", 200.0, 2.0, 200.0), ("cute_kernels", "isolated", 400.0, 1.0, 400.0),
        ("fa4_mask_mod", "isolated", 400.0, 1.0, 400.0)]  # (its rounds ran eagerly: no second eager record)
    # each timing is followed by the same timer on the host yardstick
    assert calls == [("eager", "ours"), ("eager", "mul"), ("isolated", "ours"), ("isolated", "mul"),
                     ("isolated", "fa4"), ("isolated", "mul")]
    monkeypatch.setattr(fwd, "_EAGER_TIMERS", (("eager", timer("eager", None)), ("isolated", timer("isolated", 1.0))))
    recs = fwd.host_mode_records("ranker_fwd", impls, times, {"B": 1}, flops=1)
    assert [(r["impl"], r["mode"], r.get("error")) for r in recs] == [
        ("cute_kernels", "eager", "RuntimeError('boom')"), ("fa4_mask_mod", "isolated", None)]


def test_eager_launch_plan(monkeypatch):
    """A fixed-length eager call whose argument signature ran once before launches the kept plan (same
    compiled function and scalar arguments, fresh outputs; the bounds' values are not part of it; without
    return_lse, a plan of its own whose kernel variant takes no LSE); a
    misaligned data pointer, another scalar type, a packed call or a use_config block take the full path,
    and tuning.reload() forgets the plans."""
    import dataclasses

    from cute_kernels import tuning

    assert any(m is rf._PLANS for m in tuning._memos)
    full = []
    launched = stand_in_forward(monkeypatch, kernel=_refuse_misaligned)
    impl = rf._ranker_impl
    monkeypatch.setattr(rf, "_ranker_impl", lambda *a, **kw: full.append(kw.get("plan_key")) or impl(*a, **kw))
    seq = 300

    def tensors(offset=0):
        base = torch.zeros(2 * seq * 2 * 128 + offset, dtype=torch.bfloat16)
        return base[offset:].view(2, seq, 2, 128)

    q, bounds = tensors(), torch.tensor([[0, 5, 5, 9]] * 2, dtype=torch.int32)
    out, lse = rf.ranker_attention(q, q, q, bounds, return_lse=True)
    assert len(full) == 1 and full[0] is not None and len(rf._PLANS) == 1
    first_key = full[0]
    (_, cfg, *_), first = launched[-1]
    assert cfg == rf.CONFIGS[128] and cfg.checked_max and launched[-1][0][5]  # (the variant writing the LSE)
    q2, bounds2 = tensors(), torch.tensor([[1, 3, 3, 4]] * 2, dtype=torch.int32)
    out2, lse2 = rf.ranker_attention(q2, q2, q2, bounds2, return_lse=True)
    assert len(full) == 1  # the plan
    _, args = launched[-1]
    assert args[0] is q2 and args[3] is bounds2 and args[4] is out2 and args[5] is lse2 and args[6] is None
    assert args[7:] == first[7:]
    assert out2.shape == q2.shape and lse2.shape == lse.shape == (2, 2, seq) and lse2.dtype == torch.float32
    assert out2.data_ptr() != out.data_ptr()
    for t in (out2, lse2):  # fresh compact buffers (out: empty_like of the compact q)
        assert t.stride() == torch.empty(t.shape).stride() and t.untyped_storage().nbytes() == t.nbytes
    assert all(not isinstance(x, torch.Tensor) for x in rf._PLANS[first_key])  # a plan holds no device memory
    # a q that is not compact (heads-major storage seen as [B, S, H, D]; a size-1 dim with an odd stride):
    # compact outputs all the same, from the full path and from the plan
    for qt in (torch.zeros(2, 2, seq, 128, dtype=torch.bfloat16).transpose(1, 2),
               torch.zeros(seq, 2, 128, dtype=torch.bfloat16).as_strided((1, seq, 2, 128), (8, 256, 128, 1))):
        for _ in range(2):
            o, l = rf.ranker_attention(qt, qt, qt, bounds2[:qt.shape[0]], return_lse=True)
            assert o.shape == qt.shape and o.stride() == torch.empty(qt.shape).stride()
            assert l.stride() == torch.empty(l.shape).stride() and launched[-1][1][4] is o
    full.clear()
    full.append(first_key)
    with pytest.raises(ValueError, match="16-byte aligned"):  # same key, 2-byte aligned q: the compiled
        rf.ranker_attention(tensors(offset=1), q2, q2, bounds2)  # function refuses, the full path explains
    assert len(full) == 2
    rf.ranker_attention(q2, q2, q2, bounds2, softmax_scale=1)  # an int scale: its own signature
    rf.ranker_attention(q2, q2, q2, bounds2, softmax_scale=1.0)
    assert len(full) == 4 and len(rf._PLANS) == 5  # (with the two non-compact qs')
    out3 = rf.ranker_attention(q2, q2, q2, bounds2, softmax_scale=1.0)  # without return_lse: no LSE at all
    assert len(full) == 4 and launched[-1][1][4] is out3 and launched[-1][1][5] is None
    assert not launched[-1][0][5]  # (its own compiled variant)
    with rf.use_config(dataclasses.replace(rf.CONFIGS[128], tile_n=96)):
        rf.ranker_attention(q2, q2, q2, bounds2)
    assert len(full) == 5 and full[-1] is None and launched[-1][0][1].tile_n == 96
    rf.ranker_attention(q2, q2, q2, bounds2, return_lse=True)
    assert len(full) == 5 and launched[-1][0][1] == cfg
    cu = torch.tensor([0, seq], dtype=torch.int32)
    rf.ranker_attention(q2[0], q2[0], q2[0], bounds2[:1], cu_seqlens=cu)
    assert len(full) == 6 and full[-1] is None
    monkeypatch.setattr(tuning, "_memos", [rf._PLANS])
    tuning.reload()
    assert not rf._PLANS


def test_eager_launch_plan_edges(monkeypatch):
    """What must not be kept or reused: a plan chosen before a tuning.reload() that ran during its first
    call (e.g. while it compiled), a plan whose config choice _CHOSEN does not keep (it may change between
    calls), and a cached validation for a bounds tensor whose pointer is not 4-byte aligned."""
    from cute_kernels import tuning

    launched = stand_in_forward(monkeypatch, kernel=_refuse_misaligned)
    q = torch.zeros(2, 64, 2, 64, dtype=torch.bfloat16)
    bounds = torch.tensor([[0, 5, 5, 9]] * 2, dtype=torch.int32)

    compile_stand_in = rf._compile

    def compile_with_reload(*a):  # a reload while the first call compiles
        tuning.reload()
        return compile_stand_in(*a)

    monkeypatch.setattr(rf, "_compile", compile_with_reload)
    rf.ranker_attention(q, q, q, bounds)
    assert launched and not rf._PLANS and not rf._CHOSEN
    monkeypatch.setattr(rf, "_compile", compile_stand_in)
    rf.ranker_attention(q, q, q, bounds)
    assert len(rf._PLANS) == 1
    rf._PLANS.clear()
    monkeypatch.setattr(rf, "_CHOSEN", {i: None for i in range(4096)})  # full: choices are not kept
    rf.ranker_attention(q, q, q, bounds)
    assert not rf._PLANS
    storage = torch.zeros(40, dtype=torch.uint8).untyped_storage()[1:33]
    odd = torch.empty(0, dtype=torch.int32).set_(storage, 0, (2, 4), (4, 1))  # same signature, 1 mod 4
    with pytest.raises(ValueError, match="4-byte aligned"):
        rf.ranker_attention(q, q, q, odd)


def test_eager_plan_refused_launch_takes_the_full_path(monkeypatch):
    """The plan's key leaves k's, v's and the bounds' dtypes, v's shape, alignment and devices to the compiled
    function's own checks (tvm-ffi refuses before it launches): such a call must raise the full path's error
    (not the compiled function's), and a refusal the full path's checks pass re-raises the compiled one's."""
    full, tried = [], []
    impl = rf._ranker_impl
    monkeypatch.setattr(rf, "_ranker_impl", lambda *a, **kw: full.append(1) or impl(*a, **kw))

    def tvm_ffi_like(args):  # the compiled function's own argument checks
        q, k, v, bounds = args[:4]
        tried.append(q)
        if any(t.is_meta for t in (q, k, v, bounds)):  # (tvm-ffi's packing fails before its checks)
            raise RuntimeError("Cannot pack tensors on meta (stand-in)")
        _refuse_misaligned((q, k, v, bounds))
        if k.dtype != q.dtype or v.dtype != q.dtype or bounds.dtype not in (torch.int32, torch.uint32):
            raise ValueError("Mismatched Tensor dtype (stand-in; tvm-ffi takes uint32 for int32)")
        if v.shape != k.shape:
            raise ValueError("Mismatched Tensor shape (stand-in)")
        if getattr(bounds, "refused", False):
            raise TypeError("refused by the stand-in only")

    launched = stand_in_forward(monkeypatch, kernel=tvm_ffi_like)
    q = torch.zeros(2, 64, 4, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 64, 2, 64, dtype=torch.bfloat16)
    bounds = torch.tensor([[0, 5, 5, 9]] * 2, dtype=torch.int32)
    rf.ranker_attention(q, k, k, bounds)
    rf.ranker_attention(q, k, k, bounds)
    assert len(full) == 1 and len(launched) == 2 and len(rf._PLANS) == 1  # the second call: the plan
    cases = [((q, k, k.half(), bounds), TypeError, "must share a dtype"),
             ((q, k, k.as_strided((2, 64, 1, 64), k.stride()), bounds), ValueError, "same shape"),  # (k's strides)
             ((q, k, torch.zeros(k.numel() + 8, dtype=k.dtype)[4:4 + k.numel()].view(k.shape), bounds), ValueError,
              "16-byte aligned"),
             ((q, k.to("meta"), k, bounds), ValueError, "k has no data")]  # (a RuntimeError from the launch)
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            rf.ranker_attention(*args)
    # each launched the plan first (refused), then the full path explained it before any launch
    assert len(tried) == 2 + len(cases) and len(full) == 1 + len(cases) and len(launched) == 2
    odd = bounds.clone()
    odd.refused = True  # the full path's checks pass it: the compiled function's own error, launched by neither
    with pytest.raises(TypeError, match="refused by the stand-in only"):
        rf.ranker_attention(q, k, k, odd)
    assert len(launched) == 2 and len(tried) == 4 + len(cases)  # (the plan's launch, then the full path's)
    # uint32 bounds, which the compiled function would take for int32 (values >= 2**31 read as negative), and
    # int64 ones: the key holds the bounds' dtype, so the full path refuses them before any launch
    for other in (torch.uint32, torch.int64):
        with pytest.raises(TypeError, match="int32"):
            rf.ranker_attention(q, k, k, bounds.to(other))
    assert len(launched) == 2 and len(tried) == 4 + len(cases)
    rf.ranker_attention(q, k, k, bounds)  # the plan again
    assert len(launched) == 3 and len(full) == 4 + len(cases)


def test_cached_validation_rechecks_for_data(monkeypatch):
    """The full path's validation once per signature (``_validate_cached``) re-checks what a signature does not
    fix: the pointers' alignment and that there is data (a storage freed by ``resize_(0)`` keeps its shape and
    strides; its data pointer is 0)."""
    monkeypatch.setattr(rf, "_validate", lambda *a: rf_validate(*a, cuda=False))
    monkeypatch.setattr(rf, "_VALIDATED", {})
    q = torch.zeros(2, 64, 2, 64, dtype=torch.bfloat16)
    bounds = torch.tensor([[0, 5, 5, 9]] * 2, dtype=torch.int32)
    rf._validate_cached(q, q, q, bounds, None, None, "tanh", None, None)
    freed = torch.zeros_like(q)
    freed.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="v has no data"):
        rf._validate_cached(q, q, freed, bounds, None, None, "tanh", None, None)
    empty = torch.zeros(2, 0, 2, 64, dtype=torch.bfloat16)  # (an empty tensor may have no data: checked, fine)
    for _ in range(2):
        rf._validate_cached(empty, empty, empty, bounds, None, None, "tanh", None, None)


def test_flop_counter_counts_useful_flops():
    """FlopCounterMode counts the ops' useful FLOPs (2 * D * Hq per admitted pair and GEMM; 2 GEMMs forward, 5
    backward): exactly from the bounds' (and cu_seqlens') values where the tensors have data (here the formula
    on CPU tensors, against the dense mask's count), the dense upper bound on meta tensors."""
    from torch.utils.flop_counter import FlopCounterMode

    from cute_kernels.kernels import ranker_flops
    from cute_kernels.kernels.ranker_mask import dense_mask

    g = torch.Generator().manual_seed(5)
    nb, s, hq, d = 3, 37, 4, 64
    bounds = torch.randint(-5, s + 5, (nb, 4), generator=g, dtype=torch.int32)
    q = torch.zeros(nb, s, hq, d)
    want = sum(int(dense_mask(bounds[b], s).sum()) for b in range(nb))
    assert ranker_flops.pairs(q, bounds) == want
    assert ranker_flops.useful_flops(q, bounds, gemms=2) == 4 * d * hq * want
    cu = torch.tensor([0, 10, 10, 31], dtype=torch.int32)  # packed: lengths 10, 0, 21 (+ 6 tokens of none)
    packed = torch.zeros(37, hq, d)
    want_packed = sum(int(dense_mask(bounds[b], n).sum()) if n else 0 for b, n in enumerate((10, 0, 21)))
    assert ranker_flops.pairs(packed, bounds, cu) == want_packed
    meta = lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, dtype=dtype, device="meta")
    assert ranker_flops.pairs(meta(nb, s, hq, d), meta(nb, 4, dtype=torch.int32)) == nb * s * s
    assert ranker_flops.pairs(meta(37, hq, d), meta(3, 4, dtype=torch.int32), meta(4, dtype=torch.int32), 21) == 37 * 21
    with pytest.MonkeyPatch.context() as mp:  # while a graph capture runs the host may not read the bounds
        mp.setattr(ranker_flops, "capturing", lambda t: True)
        assert ranker_flops.pairs(q, bounds) == nb * s * s and ranker_flops.pairs(packed, bounds, cu, 21) == 37 * 21
    mq, mkv, mb = meta(2, 64, 4, 64), meta(2, 64, 2, 64), meta(2, 4, dtype=torch.int32)
    mq.requires_grad_(True)
    with FlopCounterMode(display=False) as counter:
        rf.ranker_attention(mq, mkv, mkv, mb).sum().backward()
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    dense = 2 * 64 * 64 * 4 * 64  # B S S Hq D
    assert counts["cute_kernels.ranker_attention_fwd"] == 4 * dense  # 2 FLOPs per multiply-add, 2 GEMMs
    assert counts["cute_kernels.ranker_attention_bwd"] == 10 * dense


def test_shipped_config_refuses_bad_arguments():
    """A typo in the cap method, another dtype (a string included) or head dim: a clear error, not another
    config (session 36 review: ``"tahn"`` gave the uncapped config, float32 the float16 one)."""
    for args, exc, msg in (((torch.bfloat16, 128, "tahn"), ValueError, "cap_method='tahn'"),
                           ((torch.float32, 128), TypeError, "torch.bfloat16 or torch.float16"),
                           (("bfloat16", 128), TypeError, "torch.bfloat16 or torch.float16"),
                           ((torch.bfloat16, 96), ValueError, "head_dim=96"),
                           ((torch.bfloat16, True), TypeError, "head_dim must be an int"),  # (a bool: TypeError)
                           ((torch.bfloat16, 128.0), TypeError, "head_dim must be an int"),
                           ((torch.bfloat16, 128, 5), TypeError, "cap_method must be a str")):  # (as the op)
        with pytest.raises(exc, match=re.escape(msg)):
            rf.shipped_config(*args)
    # None means no cap, as ranker_attention's cap=None (newcomer review, session 39)
    assert rf.shipped_config(torch.bfloat16, 128, None) == rf.shipped_config(torch.bfloat16, 128, "none")
    # numpy integers, as the ops take them (newcomer review, session 50)
    import numpy as np

    assert rf.shipped_config(torch.bfloat16, np.int64(128)) == rf.shipped_config(torch.bfloat16, 128)


def test_use_config_docstring_example_fits():
    """The one-field change ``use_config``'s docstring shows validates (its earlier example, stages=3 on the
    persistent D=128 config, needed more smem than the SM has)."""
    assert 'tile_n=96)' in rf.use_config.__doc__
    cfg = dataclasses.replace(rf.shipped_config(torch.bfloat16, 128, "none"), tile_n=96)
    with rf.use_config(cfg):
        assert rf._OVERRIDES[128] is cfg
    with pytest.raises(ValueError, match="shared memory"):
        dataclasses.replace(rf.shipped_config(torch.bfloat16, 128, "none"), stages=3).validate()


def test_prefetch_self_kv_needs_self_kv_tma():
    cfg = rf.shipped_config(torch.bfloat16, 128, "none")
    assert cfg.prefetch_self_kv and cfg.self_kv_tma
    with pytest.raises(ValueError, match="prefetch_self_kv .* needs self_kv_tma"):
        dataclasses.replace(cfg, self_kv_tma=False).validate()
    dataclasses.replace(cfg, self_kv_tma=False, prefetch_self_kv=False).validate()


def test_fake_clamps_max_seqlen_like_the_eager_call():
    """A packed call with a generous max_seqlen (allowed up to 2**31 - 1) is checked against the work-tile
    limit with max_seqlen clamped to the packed total, as the eager call does: accepted on meta tensors
    (and so under torch.compile); a numpy integer is checked too."""
    np = pytest.importorskip("numpy")
    q = torch.empty(4096, 128, 128, dtype=torch.bfloat16, device="meta")
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    bounds = torch.empty(2, 4, dtype=torch.int32, device="meta")
    for ms in (2**31 - 1, np.int64(2**31 - 1)):
        assert cute_kernels.ranker_attention(q, q, q, bounds, cu_seqlens=cu, max_seqlen=ms).shape == q.shape
    big = torch.empty(2**23, 1, 64, dtype=torch.bfloat16, device="meta")  # 2**16 tiles x 2**15 sequences
    cu_many = torch.empty(2**15 + 1, dtype=torch.int32, device="meta")
    b_many = torch.empty(2**15, 4, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="work tiles"):
        cute_kernels.ranker_attention(big, big, big, b_many, cu_seqlens=cu_many, max_seqlen=np.int64(2**23))


def test_func_transforms_over_bounds_are_refused():
    """vmap over the bounds alone (q, k, v plain tensors): the documented NotImplementedError, not a
    data-pointer or device error from deeper down."""
    q = torch.zeros(1, 16, 2, 64, dtype=torch.bfloat16)
    bounds = torch.tensor([[[0, 8, 8, 16]], [[0, 4, 4, 16]]], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="torch.func"):
        torch.func.vmap(lambda b: cute_kernels.ranker_attention(q, q, q, b))(bounds)


def test_reference_takes_any_real_scale_and_cap():
    """The argument checks accept any real number (Fraction included); the reference computes with it."""
    import fractions

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 64, dtype=torch.float64) for _ in range(3))
    bounds = torch.tensor([[0, 8, 8, 16]], dtype=torch.int32)
    got = rf.ranker_attention_reference(q, k, v, bounds, softmax_scale=fractions.Fraction(1, 10),
                                        cap=fractions.Fraction(5), compute_dtype=torch.float64)
    want = rf.ranker_attention_reference(q, k, v, bounds, softmax_scale=0.1, cap=5.0, compute_dtype=torch.float64)
    assert torch.equal(got, want)


def test_masked_step_in_loop_traces_one_copy_of_the_step():
    """masked_step_in_loop (shipped at D=128 without a cap; session 47: ~1 s of compile): the overlapped history
    loop's masked last step runs as the loop's last iteration, so the kernel holds one copy of the overlapped
    step per history loop (fixed and online max) instead of two: fewer WGMMA instructions in the PTX (96 -> 64
    in session 47).  The capped three-warpgroup config keeps the separate step (its tanh cap ran slower)."""
    from cute_kernels.runtime.cache import compile_record

    shipped = rf.shipped_config(torch.bfloat16, 128)
    assert shipped.masked_step_in_loop and shipped.intra_wg_overlap
    assert not rf.shipped_config(torch.bfloat16, 128, "tanh").masked_step_in_loop
    wgmmas = {}
    for cfg in (shipped, dataclasses.replace(shipped, masked_step_in_loop=False)):
        rf._compile(torch.bfloat16, cfg, 1, "none", False)
        ptx = compile_record(rf.NAME, (str(torch.bfloat16), cfg, 1, "none", False)).ptx
        wgmmas[cfg.masked_step_in_loop] = ptx.count("wgmma.mma_async")
    # one overlapped step (a QK and a PV GEMM, head_dim / 16 and tile_n / 16 WGMMAs) fewer per history loop
    step = shipped.head_dim // 16 + shipped.tile_n // 16
    assert wgmmas[False] - wgmmas[True] == 2 * step, wgmmas


@pytest.mark.parametrize("dtype,cap_method,varlen", [
    (torch.bfloat16, "none", False), (torch.bfloat16, "none", True), (torch.bfloat16, "tanh", False),
    (torch.bfloat16, "soft_sign", True), (torch.float16, "none", False)])
def test_shipped_d256_configs(dtype, cap_method, varlen):
    """D=256 ships one tile per CTA (two consumer warpgroups, tile_n=64) with the fixed max: checked_max without a
    cap, fixed_row_max with one (bfloat16; session 53: +11-19% / +21-30% over the online max), float16 the online
    max; every variant compiles without local memory."""
    from cute_kernels.runtime.cache import compile_record

    cfg = rf.chosen_config(rf.shipped_config(dtype, 256, cap_method), dtype, None if cap_method == "none" else 30.0)
    assert cfg.consumer_wgs == 2 and cfg.tile_n == 64 and not cfg.persistent
    bf16 = dtype == torch.bfloat16
    assert cfg.checked_max == (bf16 and cap_method == "none") and cfg.fixed_row_max == (bf16 and cap_method != "none")
    rf._compile(dtype, cfg, 1, cap_method, varlen)
    rec = compile_record(rf.NAME, (str(dtype), cfg, 1, cap_method, varlen))
    assert all(not r.stack_bytes for r in rec.resources), [r.stack_bytes for r in rec.resources]


def test_caller_config_that_spills_gets_a_warning():
    """A caller's config whose kernel keeps registers in local memory (bf16 D=64 soft_sign varlen at tile_n=128:
    16 B of stack; session 36's fp16 D=128 soft_sign varlen with early_rescale, 8 B then, no longer spills since
    session 47's one history loop) gets a RuntimeWarning at its first launch (warn_if_spills, which
    _ranker_impl calls for config= / use_config); a shipped config none."""
    spilling = dataclasses.replace(rf.shipped_config(torch.bfloat16, 64, "soft_sign"), tile_n=128, stages=4)
    spilling.validate()
    args = (torch.bfloat16, spilling, 1, "soft_sign", True)
    rf._compile(*args)
    with pytest.warns(RuntimeWarning, match="local memory") as rec:
        assert rf.warn_if_spills(*args) > 0
    assert [w.filename for w in rec] == [__file__]  # the caller's line (runtime.warn), not the package's
    shipped = (torch.float16, rf.shipped_config(torch.float16, 128, "soft_sign"), 1, "soft_sign", True)
    rf._compile(*shipped)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rf.warn_if_spills(*shipped) == 0
    import inspect

    assert "warn_if_spills(q.dtype, cfg" in inspect.getsource(rf._ranker_impl)


def test_spill_warning_reads_the_record_of_the_call(monkeypatch):
    """``warn_if_spills`` reads the compile record of exactly the call's key (the no-LSE variant has its own)."""
    from cute_kernels.runtime import artifacts, cache

    cfg = dataclasses.replace(rf.CONFIGS[128], stages=1)
    for with_lse, stack in ((True, 16), (False, 0)):
        rec = artifacts.CompileRecord(rf.NAME, "", "sm_90a", resources=[artifacts.KernelResources("k", 168, 0, stack)])
        key = rf.compile_key(torch.bfloat16, cfg, 2, "tanh", True, with_lse)
        monkeypatch.setitem(cache._records, (rf.NAME, key, cache.target_arch()), rec)
    with pytest.warns(RuntimeWarning, match=r"ranker_fwd config .*GQA 2, cap tanh, varlen\) keeps 16 B"):
        assert rf.warn_if_spills(torch.bfloat16, cfg, 2, "tanh", True) == 16
    assert rf.warn_if_spills(torch.bfloat16, cfg, 2, "tanh", True, with_lse=False) == 0
