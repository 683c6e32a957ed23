"""hc_mix (mHC mix statistics + Sinkhorn): CPU compile for sm_90a, PTX/SASS features, reference."""

import math
import re

import pytest
import torch

import cute_kernels
from cute_kernels.kernels import hc_mix as mod
from cute_kernels.kernels import hc_mix_walk as walk
from cute_kernels.runtime.cache import compile_record


def test_compile_targets_cover_both_methods():
    from cute_kernels.kernels import hc_mix_tma

    kernels = {t.kernel for t in mod.compile_targets()}
    assert kernels == {mod.NAME, hc_mix_tma.NAME}
    assert {t.key for t in mod.compile_targets() if t.kernel == hc_mix_tma.NAME} == {
        hc_mix_tma.config_for(m) for m in hc_mix_tma.LEVEL_EXAMPLE_M}


@pytest.mark.parametrize("target", [t for t in mod.compile_targets() if t.kernel == mod.NAME], ids=lambda t: t.label)
def test_compiles_with_mma_sync_and_no_spills(target):
    target.build()
    rec = compile_record(target.kernel, target.key)
    assert ".target sm_90a" in rec.ptx
    assert "mma.sync" in rec.ptx_features
    assert re.search(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32", rec.ptx)
    assert re.search(r"cp\.async\.cg\.shared\.global(\.\w+)* \[[^]]+\], \[[^]]+\], 16(, 16)?;", rec.ptx)  # x
    assert re.search(r"cp\.async\.ca\.shared\.global(\.\w+)* \[[^]]+\], \[[^]]+\], 16(, 16)?;", rec.ptx)  # hc_fn
    assert "cp.async.wait_group" in rec.ptx
    assert "local memory (spill)" not in rec.ptx_features
    assert "ld.shared::cluster" in rec.ptx  # cluster reduction through distributed shared memory
    assert "barrier.cluster.arrive" in rec.ptx and "barrier.cluster.wait" in rec.ptx
    assert rec.ptx.count("cvt.rn.bf16x2.f32") >= 36  # in-register hi/mid/lo split of hc_fn
    if rec.sass:
        assert "LDL/STL (local memory)" not in rec.sass_features
        assert "LDGSTS.E.BYPASS.LTC128B.128" in rec.sass
        assert re.search(r"\bHMMA\.16816\.F32\.BF16\b", rec.sass)


def test_reference_hand_checked():
    # K = 64, x = 2 everywhere: sum x^2 / K = 4, r = 1/2 (rms_eps = 0)
    k = 64
    x = torch.full((1, k), 2.0, dtype=torch.bfloat16)
    hc_fn = torch.zeros(24, k)
    hc_fn[0] = 1.0 / 128  # a0 = 2 * 64 / 128 = 1 -> z0 = 1 * r * scale0 = 1 * 0.5 * 2 = 1
    hc_fn[5] = -1.0 / 64  # a5 = -2 -> z5 = -2 * 0.5 * 1 = -1
    scale = torch.tensor([2.0, 1.0, 1.0])
    base = torch.zeros(24)
    base[1] = 3.0
    base[8:24] = torch.diag(torch.full((4,), math.log(2.0))).reshape(-1)  # rows: (2,1,1,1)/5
    pre, post, comb = cute_kernels.hc_mix_sinkhorn_reference(x, hc_fn, scale, base, 20, 0.0, 0.0)
    sig = lambda z: 1.0 / (1.0 + math.exp(-z))  # noqa: E731
    torch.testing.assert_close(pre, torch.tensor([[sig(1.0), sig(3.0), 0.5, 0.5]]), rtol=0, atol=1e-7)
    torch.testing.assert_close(post, torch.tensor([[1.0, 2 * sig(-1.0), 1.0, 1.0]]), rtol=0, atol=1e-7)
    # softmax rows of diag(ln 2) are (0.4, 0.2, 0.2, 0.2) permuted: already doubly stochastic
    want = torch.full((4, 4), 0.2) + 0.2 * torch.eye(4)
    torch.testing.assert_close(comb[0], want, rtol=0, atol=1e-7)


def test_reference_rms_eps_inside_the_rsqrt():
    # K = 64, x = 2 everywhere: sum x^2 / K = 4; rms_eps = 12 -> r = rsqrt(4 + 12) = 1/4
    k = 64
    x = torch.full((1, k), 2.0, dtype=torch.bfloat16)
    hc_fn = torch.zeros(24, k)
    hc_fn[0] = 1.0 / 128  # a0 = 1 -> z0 = 1 * r * scale0 = 1/2
    pre, _, _ = cute_kernels.hc_mix_sinkhorn_reference(x, hc_fn, torch.tensor([2.0, 1.0, 1.0]), torch.zeros(24), 1,
                                                       12.0, 0.0)
    assert abs(pre[0, 0].item() - 1.0 / (1.0 + math.exp(-0.5))) < 1e-7


def test_reference_eps_placement():
    # all-zero logits: softmax 1/4 + eps, column sums 1 + 4 eps -> (1/4 + eps) / (1 + 5 eps), ...
    k, eps = 64, 1e-3
    x = torch.ones(1, k, dtype=torch.bfloat16)
    pre, post, comb = cute_kernels.hc_mix_sinkhorn_reference(
        x, torch.zeros(24, k), torch.ones(3), torch.zeros(24), 1, 0.0, eps)
    assert abs(pre[0, 0].item() - (0.5 + eps)) < 1e-7
    c = (0.25 + eps) / (4 * (0.25 + eps) + eps)
    assert abs(comb[0, 0, 0].item() - c) < 1e-7
    # two iterations: one more row then column normalization
    _, _, comb2 = cute_kernels.hc_mix_sinkhorn_reference(
        x, torch.zeros(24, k), torch.ones(3), torch.zeros(24), 2, 0.0, eps)
    c = c / (4 * c + eps)
    c = c / (4 * c + eps)
    assert abs(comb2[0, 0, 0].item() - c) < 1e-7


def test_reference_float32_close_to_float64():
    g = torch.Generator().manual_seed(0)
    m, k = 5, 512
    x = torch.randn(m, k, generator=g).bfloat16()
    hc_fn = torch.randn(24, k, generator=g) / math.sqrt(k)
    scale, base = torch.rand(3, generator=g) + 0.5, torch.randn(24, generator=g)
    r64 = mod._reference(x, hc_fn, scale, base, 20, 1e-6, 1e-6, torch.float64)
    r32 = mod._reference(x, hc_fn, scale, base, 20, 1e-6, 1e-6, torch.float32)
    for a, b in zip(r64, r32):
        assert (a - b.double()).abs().max().item() < 1e-5
    # doubly stochastic up to eps
    comb = r64[2]
    assert (comb.sum(-2) - 1).abs().max().item() < 1e-5
    assert (comb.sum(-1) - 1).abs().max().item() < 1e-3


def test_validation_before_launch():
    k = 128
    ok = dict(hc_fn=torch.zeros(24, k), hc_scale=torch.ones(3), hc_base=torch.zeros(24))
    with pytest.raises(TypeError, match="dtype float32"):
        cute_kernels.hc_mix_sinkhorn(torch.zeros(4, k), **ok)
    with pytest.raises(ValueError, match="CUDA device"):
        cute_kernels.hc_mix_sinkhorn(torch.zeros(4, k, dtype=torch.bfloat16), **ok)
    # shape checks (validated the same way on CUDA tensors)
    with pytest.raises(ValueError, match="multiple of 64"):
        mod._validate(torch.zeros(4, 96, dtype=torch.bfloat16), torch.zeros(24, 96), torch.ones(3),
                      torch.zeros(24), 20, cuda=False)
    with pytest.raises(ValueError, match=r"hc_fn must have shape \[24, 128\]"):
        mod._validate(torch.zeros(4, k, dtype=torch.bfloat16), torch.zeros(23, k), torch.ones(3),
                      torch.zeros(24), 20, cuda=False)
    with pytest.raises(TypeError, match="hc_fn has dtype bfloat16"):
        mod._validate(torch.zeros(4, k, dtype=torch.bfloat16), torch.zeros(24, k, dtype=torch.bfloat16),
                      torch.ones(3), torch.zeros(24), 20, cuda=False)
    with pytest.raises(ValueError, match="sinkhorn_iters"):
        mod._validate(torch.zeros(4, k, dtype=torch.bfloat16), **ok, sinkhorn_iters=0, cuda=False)
    mod._validate(torch.zeros(0, k, dtype=torch.bfloat16), **ok, sinkhorn_iters=20, cuda=False)


def test_config_validation_and_choice():
    with pytest.raises(ValueError, match="m_tiles"):
        walk.HcMixConfig(m_tiles=3).validate()
    with pytest.raises(ValueError, match="warps_m"):
        walk.HcMixConfig(warps_m=3).validate()
    with pytest.raises(ValueError, match="shared memory"):
        walk.HcMixConfig(m_tiles=1, warps_m=4, stages=4).validate()
    for m in (1, 128, 512, 4096, 16384):
        assert walk.config_for(m) in walk.SHIPPED
    assert walk.config_for(4096, store_mix=True).store_mix
    for cfg in walk.SHIPPED:
        cfg.validate()
        assert cfg.tile_m % walk.CLUSTER_K == 0


def test_split_pieces_reconstruct():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(24, 256, generator=g) * torch.logspace(-3, 3, 256)
    pieces = mod.split_pieces(w)
    assert pieces.shape == (72, 256) and pieces.dtype == torch.bfloat16
    lo, mid, hi = pieces.view(3, 24, 256).double()
    rel = ((lo + mid + hi - w.double()).abs() / w.double().abs()).max().item()
    assert rel <= 2.0 ** -27, rel
    assert torch.equal(hi, w.bfloat16().double())  # hi = round to nearest even
    # the documented edges: 2^-27 relative from 2^-110 up to bf16's largest finite value, 2^-134 absolute below
    # (float32 subnormals included), NaN above
    bf16_max = torch.finfo(torch.bfloat16).max
    wide = torch.cat([torch.rand(24, 512, generator=g) * 2.0 ** e + 2.0 ** e for e in range(-110, 127, 3)], 1)
    sign = torch.where(torch.rand(24, 1, generator=g) < 0.5, -1.0, 1.0)
    wide = torch.cat([wide, torch.full((24, 1), bf16_max)], 1) * sign
    lo, mid, hi = mod.split_pieces(wide).view(3, 24, -1).double()
    rel = ((lo + mid + hi - wide.double()).abs() / wide.double().abs()).max().item()
    assert rel <= 2.0 ** -27, rel
    tiny = torch.rand(24, 4096, generator=g) * 2.0 ** -110
    tiny[0, :64] = torch.rand(64, generator=g) * 2.0 ** -127
    lo, mid, hi = mod.split_pieces(tiny).view(3, 24, -1).double()
    assert (lo + mid + hi - tiny.double()).abs().max().item() <= 2.0 ** -134
    over = torch.full((24, 2), 3.4e38)  # past bf16's largest finite value (3.39e38)
    lo, mid, hi = mod.split_pieces(over).view(3, 24, -1).double()
    assert (lo + mid + hi).isnan().all()


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(sinkhorn_iters=True), TypeError, "sinkhorn_iters"),
    (dict(sinkhorn_iters=20.0), TypeError, "sinkhorn_iters"),
    (dict(sinkhorn_iters="20"), TypeError, "sinkhorn_iters"),
    (dict(sinkhorn_iters=0), ValueError, "sinkhorn_iters"),
    (dict(sinkhorn_iters=2**31), ValueError, "sinkhorn_iters"),
    (dict(rms_eps=True), TypeError, "rms_eps"),
    (dict(rms_eps="1e-6"), TypeError, "rms_eps"),
    (dict(rms_eps=-1e-6), ValueError, "rms_eps"),
    (dict(rms_eps=float("nan")), ValueError, "rms_eps"),
    (dict(rms_eps=float("inf")), ValueError, "rms_eps"),
    (dict(rms_eps=1e300), ValueError, "rms_eps"),  # inf in float32
    (dict(hc_eps=False), TypeError, "hc_eps"),
    (dict(hc_eps=None), TypeError, "hc_eps"),
    (dict(hc_eps=-0.5), ValueError, "hc_eps"),
    (dict(hc_eps=float("-inf")), ValueError, "hc_eps"),
    (dict(hc_eps=10**400), ValueError, "hc_eps"),
])
def test_scalar_validation(kw, exc, msg):
    k = 64
    tensors = (torch.zeros(4, k, dtype=torch.bfloat16), torch.zeros(24, k), torch.ones(3), torch.zeros(24))
    args = dict(sinkhorn_iters=20, rms_eps=1e-6, hc_eps=1e-6)
    args.update(kw)
    with pytest.raises(exc, match=msg):
        mod._validate(*tensors, **args, cuda=False)
    with pytest.raises(exc, match=msg):
        mod.hc_mix_sinkhorn_reference(*tensors, **args)


def test_scalar_validation_accepts():
    import numpy as np

    k = 64
    tensors = (torch.zeros(4, k, dtype=torch.bfloat16), torch.zeros(24, k), torch.ones(3), torch.zeros(24))
    for kw in (dict(sinkhorn_iters=1, rms_eps=0, hc_eps=0.0), dict(sinkhorn_iters=np.int64(3), rms_eps=np.float32(1e-5)),
               dict(sinkhorn_iters=2**31 - 1)):
        mod._validate(*tensors, **kw, cuda=False)


def test_public_op_checks_eps_before_launch():
    """The op passes rms_eps/hc_eps to the validator (CPU tensors would otherwise fail on the device check)."""
    k = 64
    with pytest.raises(ValueError, match="hc_eps"):
        cute_kernels.hc_mix_sinkhorn(torch.zeros(4, k, dtype=torch.bfloat16), torch.zeros(24, k), torch.ones(3),
                                     torch.zeros(24), 20, 1e-6, -1.0)


def test_reference_checks_shapes():
    x, w = torch.randn(3, 64), torch.randn(24, 64)
    s, b = torch.ones(3), torch.zeros(24)
    mod.hc_mix_sinkhorn_reference(x, w, s, b)
    for args, match in (((x, w[:, :32], s, b), "hc_fn"), ((x, w[:23], s, b), "hc_fn"), ((x[None], w, s, b), "x must"),
                        ((x, w, s[:2], b), "hc_scale"), ((x, w, s, b[:5]), "hc_base")):
        with pytest.raises(ValueError, match=match):
            mod.hc_mix_sinkhorn_reference(*args)
    with pytest.raises(TypeError):
        mod.hc_mix_sinkhorn_reference(x.long(), w, s, b)


@pytest.mark.parametrize("method", ["", "TMA", None, 1])
def test_unknown_method_refused_before_anything_else(method):
    k = 64
    with pytest.raises(ValueError if isinstance(method, str) else TypeError, match="method"):
        cute_kernels.hc_mix_sinkhorn(torch.zeros(4, k, dtype=torch.bfloat16), torch.zeros(24, k), torch.ones(3),
                                     torch.zeros(24), method=method)


def test_method_option_routes_after_validation(monkeypatch):
    """Both methods validate once per argument signature (the method part of it) and keep their launch plan:
    the walk's or the TMA kernel's compiled function, compiled at the first launch, and the TMA kernel's
    workspace rows; "tma" is the default."""
    from cute_kernels.kernels import hc_mix_tma

    full = mod._validate
    monkeypatch.setattr(mod, "_validate", lambda *a, **kw: full(*a, **kw, cuda=False))
    monkeypatch.setattr(mod, "_VALIDATED", {})
    compiles = []
    monkeypatch.setattr(walk, "_compile", lambda cfg: compiles.append("walk") or "walk-fn")
    monkeypatch.setattr(hc_mix_tma, "_compile", lambda cfg: compiles.append("tma") or "tma-fn")
    seen = []
    monkeypatch.setattr(mod, "run_compiled", lambda compiled, *a, workspace_rows=None, **kw:
                        seen.append((compiled(), workspace_rows)) or "out")
    x, w = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(24, 64)
    for kw in (dict(method="walk"), {}, dict(method="walk"), dict(method="tma")):
        assert cute_kernels.hc_mix_sinkhorn(x, w, torch.ones(3), torch.zeros(24), **kw) == "out"
    tma_rows = hc_mix_tma.workspace_rows(4, hc_mix_tma.config_for(4))
    assert seen == [("walk-fn", None), ("tma-fn", tma_rows), ("walk-fn", None), ("tma-fn", tma_rows)]
    assert len(mod._VALIDATED) == 2 and compiles == ["walk", "tma"]  # one plan and one compile per method


def test_method_option_in_the_op_schema():
    schema = str(torch.ops.cute_kernels.hc_mix_sinkhorn.default._schema)
    assert 'str method="tma"' in schema, schema


@pytest.mark.parametrize("method", ["walk", "tma"])
def test_torch_compile_lowers_the_method_argument(method):
    """Inductor lowers the op with the option (an argument named ``kernel`` collided with
    FallbackKernel.create's own: an InductorError the H200 run caught); on CPU tensors the compiled
    call then reaches our validation, which refuses them."""
    x, w = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(24, 64)
    f = torch.compile(lambda *a: cute_kernels.hc_mix_sinkhorn(*a, method=method), fullgraph=True)
    with pytest.raises(ValueError, match="CUDA|cuda"):
        f(x, w, torch.ones(3), torch.zeros(24))


@pytest.mark.parametrize("dtype", [torch.int32, "float64", torch.float16])
def test_reference_dtype_must_be_float32_or_float64(dtype):
    x, w = torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(24, 64)
    with pytest.raises(TypeError, match="dtype"):
        cute_kernels.hc_mix_sinkhorn_reference(x, w, torch.ones(3), torch.zeros(24), dtype=dtype)


def test_cached_validation_rechecks_alignment_and_scalar_types(monkeypatch):
    """The op validates once per argument signature; a later call with the same signature still gets
    the pointer-alignment check, and a bool where an int was cached is still refused."""
    full = mod._validate
    monkeypatch.setattr(mod, "_validate", lambda *a, **kw: full(*a, **kw, cuda=False))
    monkeypatch.setattr(mod, "_VALIDATED", {})
    k = 128
    base = torch.zeros(2 * k + 8, dtype=torch.bfloat16)
    aligned = base.as_strided((2, k), (k, 1), 0)
    shifted = base.as_strided((2, k), (k, 1), 1)  # same shape, strides, dtype, device: 2-byte offset
    args = (torch.zeros(24, k), torch.ones(3), torch.zeros(24))
    mod._validate_cached(aligned, *args, 20, 1e-6, 1e-6)
    assert len(mod._VALIDATED) == 1
    with pytest.raises(ValueError, match="align"):
        mod._validate_cached(shifted, *args, 20, 1e-6, 1e-6)
    with pytest.raises(TypeError, match="sinkhorn_iters"):
        mod._validate_cached(aligned, *args, True, 1e-6, 1e-6)
    with pytest.raises(ValueError, match="hc_fn"):
        mod._validate_cached(aligned, torch.zeros(24, k)[:, :k - 64].contiguous(), *args[1:], 20, 1e-6, 1e-6)
    freed = torch.zeros_like(aligned)  # same signature, but its storage freed (resize_(0): data pointer 0)
    freed.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="x has no data"):
        mod._validate_cached(freed, *args, 20, 1e-6, 1e-6)
    for i in range(3):
        freed_args = list(args)
        freed_args[i] = torch.zeros_like(args[i])
        freed_args[i].untyped_storage().resize_(0)
        with pytest.raises(ValueError, match="no data"):
            mod._validate_cached(aligned, *freed_args, 20, 1e-6, 1e-6)


def test_walk_refuses_x_beyond_its_32_bit_offsets():
    x = torch.empty(131072, 20480, dtype=torch.bfloat16, device="meta")  # 2.7e9 elements
    with pytest.raises(ValueError, match="32-bit"):
        mod._launch(x, torch.empty(24, 20480, device="meta"), torch.empty(3, device="meta"),
                    torch.empty(24, device="meta"), 20, 1e-6, 1e-6)
    mod._check_walk_extent(torch.empty(104857, 20480, dtype=torch.bfloat16, device="meta"))  # just fits


def test_walk_compiles_store_mix_only_with_a_mix_buffer(monkeypatch):
    """A caller's config with store_mix=True and no mix buffer would have the epilogue write 25 floats per row into
    the one-row dummy (past its end): the walk's launch compiles the config with store_mix following ``mix``, as the
    TMA path does (and with a buffer, store_mix on even where the config has it off)."""
    compiled = []
    monkeypatch.setattr(walk, "_compile", lambda cfg: compiled.append(cfg))
    monkeypatch.setattr(mod, "run_compiled", lambda compile_fn, *a, **k: compile_fn())
    x = torch.empty(3, 64, dtype=torch.bfloat16, device="meta")
    args = (x, torch.empty(24, 64, device="meta"), torch.empty(3, device="meta"), torch.empty(24, device="meta"),
            20, 1e-6, 1e-6)
    mod._launch(*args, config=walk.HcMixConfig(m_tiles=1, warps_m=1, stages=8, store_mix=True))
    mod._launch(*args, mix=torch.empty(3, 25, device="meta"), config=walk.HcMixConfig(m_tiles=1, warps_m=1, stages=8))
    mod._launch(*args)
    assert [c.store_mix for c in compiled] == [False, True, False]


@pytest.mark.parametrize("name", ["rms_eps", "hc_eps"])
def test_eps_that_float32_would_flush_to_zero_is_refused(name):
    with pytest.raises(ValueError, match="smallest normal"):
        mod._check_scalars(20, **{"rms_eps": 1e-6, "hc_eps": 1e-6, name: 1e-50})
    mod._check_scalars(20, **{"rms_eps": 1e-6, "hc_eps": 1e-6, name: 0.0})


def test_overlapping_rows_of_x_are_refused():
    """A row stride below K (rows that overlap) is refused by both methods before any launch (the kernels' loads
    were tested on distinct rows only); a single row may have any stride."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        buf = torch.empty(8 * 64 + 64, dtype=torch.bfloat16)
        scale, base, w = torch.empty(3), torch.empty(24), torch.empty(24, 128)
        for method in ("tma", "walk"):
            with pytest.raises(ValueError, match="rows overlap"):
                torch.ops.cute_kernels.hc_mix_sinkhorn(buf.as_strided((8, 128), (64, 1)), w, scale, base,
                                                       method=method)
            torch.ops.cute_kernels.hc_mix_sinkhorn(buf.as_strided((1, 128), (64, 1)), w, scale, base, method=method)


def test_hc_fn_must_be_float32_for_both_methods():
    """hc_fn is the float32 [24, K] for both methods (the kernels split it themselves): bf16 (a model cast to
    bf16), or 72 rows (the bf16 pieces session 34's hc_mix_split_weights made), is refused before any launch."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 128, dtype=torch.bfloat16)
        scale, base = torch.empty(3), torch.empty(24)
        for method in ("tma", "walk"):
            with pytest.raises(TypeError, match="hc_fn has dtype bfloat16"):
                torch.ops.cute_kernels.hc_mix_sinkhorn(x, torch.empty(24, 128, dtype=torch.bfloat16), scale, base,
                                                       method=method)
            with pytest.raises(TypeError, match="removed hc_mix_split_weights"):
                torch.ops.cute_kernels.hc_mix_sinkhorn(x, torch.empty(72, 128, dtype=torch.bfloat16), scale, base,
                                                       method=method)
    assert not hasattr(torch.ops.cute_kernels, "hc_mix_split_weights")


@pytest.mark.parametrize("bad", [dict(k=96), dict(x_dtype=torch.float32), dict(rows=23)])
def test_trace_time_checks_refuse_what_the_kernel_would(bad):
    """Under torch.compile / make_fx the fake implementation runs instead of ours: it applies the
    shape and dtype rules (not the pointer ones), so a bad call fails at trace time, clearly."""
    from torch.fx.experimental.proxy_tensor import make_fx

    k = bad.get("k", 128)
    x = torch.zeros(4, k, dtype=bad.get("x_dtype", torch.bfloat16))
    w = torch.zeros(bad.get("rows", 24), k)
    with pytest.raises((ValueError, TypeError)):
        make_fx(lambda x, w: cute_kernels.hc_mix_sinkhorn(x, w, torch.ones(3), torch.zeros(24)),
                tracing_mode="fake")(x, w)


def test_trace_time_check_includes_the_walk_extent():
    """method="walk" indexes x in 32 bits: the fake refuses an x too large for it, as the eager call does."""
    x = torch.empty(200000, 20480, dtype=torch.bfloat16, device="meta")
    w = torch.empty(24, 20480, device="meta")
    s, b = torch.empty(3, device="meta"), torch.empty(24, device="meta")
    with pytest.raises(ValueError, match="32-bit offsets"):
        mod._fake(x, w, s, b, method="walk")
    pre, post, comb = mod._fake(x, w, s, b)  # tma: no such limit
    assert comb.shape == (200000, 4, 4)


@pytest.mark.parametrize("m,exc", [(-3, ValueError), (True, TypeError), (2.5, TypeError)])
def test_walk_config_for_checks_m(m, exc):
    with pytest.raises(exc):
        walk.config_for(m)


@pytest.mark.parametrize("kw", [dict(m_tiles=1.0), dict(store_mix="x"), dict(stages=True)])
def test_walk_config_field_types(kw):
    with pytest.raises(TypeError):
        walk.HcMixConfig(**kw).validate()


def test_raw_and_emulation_refuse_wrong_types():
    from cute_kernels.kernels import hc_mix_tma

    with pytest.raises(TypeError, match="torch.Tensor"):
        mod.hc_mix_raw([[1.0]], torch.zeros(24, 64))
    with pytest.raises(TypeError, match="HcMixConfig"):
        mod.hc_mix_raw(torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(24, 64), config=hc_mix_tma.HcMixTmaConfig())
    with pytest.raises(TypeError, match="HcMixTmaConfig"):
        hc_mix_tma.emulate_mix(torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(24, 64), config=walk.HcMixConfig())


def test_reference_refuses_mixed_devices_and_meta():
    """A reference on tensors of different devices returned rows of garbage (hc_fn on meta) or failed deep in
    torch (hc_scale on meta); now a ValueError naming the devices (newcomer review, session 20)."""
    import cute_kernels

    x, fn, sc, bs = torch.randn(4, 64), torch.randn(24, 64), torch.rand(3) + 0.5, torch.randn(24)
    for args in ((x, fn.to("meta"), sc, bs), (x, fn, sc.to("meta"), bs)):
        with pytest.raises(ValueError, match="different devices"):
            cute_kernels.hc_mix_sinkhorn_reference(*args)
    with pytest.raises(ValueError, match="meta"):
        cute_kernels.hc_mix_sinkhorn_reference(*(t.to("meta") for t in (x, fn, sc, bs)))


def test_bench_shapes_refuse_more_rows_than_the_op_takes():
    with pytest.raises(ValueError, match="104857"):  # the walk's 32-bit offsets at K = 20480
        mod.bench_shapes("4096,104858")
    assert mod.bench_shapes("1,104857") == [1, 104857]


def test_k_past_the_32_bit_limit_is_refused_for_both_methods():
    """K is a 32-bit size in the kernels and hc_fn [24, K] must span < 2**31 elements: the largest K is
    accepted (meta tensors: shapes only), the next multiple of 64 and K = 2**31 are refused, walk and tma."""
    def call(k, method):
        return mod.hc_mix_sinkhorn(torch.empty(1, k, dtype=torch.bfloat16, device="meta"),
                                   torch.empty(24, k, device="meta"), torch.empty(3, device="meta"),
                                   torch.empty(24, device="meta"), method=method)

    assert mod.MAX_K * 24 < 2**31 <= (mod.MAX_K + 64) * 24 and mod.MAX_K % 64 == 0
    for method in ("walk", "tma"):
        call(mod.MAX_K, method)
        for k in (mod.MAX_K + 64, 2**31):
            with pytest.raises(ValueError, match="at most 89478464"):
                call(k, method)
    # hc_fn with a padded row stride: its span (not K alone) must stay below 2**31 elements
    wide = torch.empty(24, mod.MAX_K + 64, device="meta")[:, :mod.MAX_K]
    for method in ("walk", "tma"):
        with pytest.raises(ValueError, match="hc_fn spans"):
            mod.hc_mix_sinkhorn(torch.empty(1, mod.MAX_K, dtype=torch.bfloat16, device="meta"), wide,
                                torch.empty(3, device="meta"), torch.empty(24, device="meta"), method=method)


def test_flop_counter_counts_the_mix_gemm():
    """FlopCounterMode counts the op's mix GEMM, 2 * M * K * 24 (meta tensors: shapes only)."""
    from torch.utils.flop_counter import FlopCounterMode

    meta = lambda *shape, dtype=torch.float32: torch.empty(*shape, dtype=dtype, device="meta")
    with FlopCounterMode(display=False) as counter:
        cute_kernels.hc_mix_sinkhorn(meta(48, 20480, dtype=torch.bfloat16), meta(24, 20480), meta(3), meta(24))
    assert counter.get_total_flops() == 2 * 48 * 20480 * 24


def test_reference_takes_any_real_eps():
    """rms_eps / hc_eps: any real number the argument checks take (a Fraction included)."""
    import fractions

    x, fn = torch.randn(2, 64).bfloat16(), torch.randn(24, 64)
    got = mod.hc_mix_sinkhorn_reference(x, fn, torch.ones(3), torch.zeros(24), rms_eps=fractions.Fraction(1, 10**6),
                                        hc_eps=fractions.Fraction(1, 10**5))
    want = mod.hc_mix_sinkhorn_reference(x, fn, torch.ones(3), torch.zeros(24), rms_eps=1e-6, hc_eps=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
