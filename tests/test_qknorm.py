"""Fused Q/K RMSNorm (G = 1): CPU compile of every shipped config, PTX features, tiling, reference, validation."""

import dataclasses
import math
import re

import numpy as np
import pytest
import torch

import cute_kernels
from cute_kernels.kernels import qknorm as mod
from cute_kernels.kernels import sm90_helpers
from cute_kernels.runtime.cache import compile_record


@pytest.mark.parametrize("target", mod.compile_targets(), ids=lambda t: t.label)
def test_compiles_with_16_byte_vectors(target):
    target.build()
    rec = compile_record(target.kernel, target.key)
    assert ".target sm_90a" in rec.ptx
    assert "ld.global.v4 (16B loads)" in rec.ptx_features
    bulk = len(target.key) > 3 and target.key[3].bulk_stages
    if bulk:  # rows move by bulk copies; only the weights by 16-byte loads
        assert {"bulk load (cp.async.bulk)", "bulk store (cp.async.bulk)", "mbarrier"} <= set(rec.ptx_features)
    else:
        assert "st.global.v4 (16B stores)" in rec.ptx_features
    # one CTA per row tile: the L2 prefetch of the rows of a CTA L2_PREFETCH_BYTES later (session 32)
    per_tile = len(target.key) == 3
    assert ("L2 prefetch (cp.async.bulk.prefetch)" in rec.ptx_features) == per_tile
    if per_tile:
        assert "cp.async.bulk.prefetch.L2.global" in rec.ptx
    assert "local memory (spill)" not in rec.ptx_features
    assert "rsqrt.approx" in rec.ptx
    if rec.sass:
        assert "LDG.E.128" in rec.sass_features and (bulk or "STG.E.128" in rec.sass_features)
        assert "LDL/STL (local memory)" not in rec.sass_features  # ptxas spills show only in SASS
    assert all(not r.stack_bytes for r in rec.resources)


def test_widest_rows_compile_without_spills_and_wider_are_rejected():
    widest = 256 * mod._MAX_ROW_VECS * 8  # bf16 elements
    mod._compile(torch.bfloat16, widest, 1024)
    rec = compile_record(mod.NAME, (str(torch.bfloat16), widest, 1024))
    assert all(not r.stack_bytes for r in rec.resources)
    if rec.sass:
        assert "LDL/STL (local memory)" not in rec.sass_features
    with pytest.raises(ValueError, match="fit in registers"):
        mod.QKNormConfig.for_shape(widest + 256 * 8, 1024, torch.bfloat16, tuning=mod.DEFAULT_TUNING)
    with pytest.raises(ValueError, match="fit in registers"):
        mod.validate_qk_args(torch.zeros(2, widest + 256 * 8, dtype=torch.bfloat16), torch.zeros(2, 64, dtype=torch.bfloat16),
                             torch.ones(widest + 256 * 8, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16),
                             1e-6, cuda=False)


@pytest.mark.parametrize("tuning", [mod.QKNormTuning(2, False, 792), mod.QKNormTuning(4, True, 5)])
@pytest.mark.parametrize("qk", [(4096, 1024), (8 * 97, 24)])
def test_persistent_tiles_compile_to_a_loop_without_spills(tuning, qk):
    """``persistent_ctas``: the tile loop is a loop in the PTX (a branch back to a label above it; the
    one-CTA-per-tile kernel has none), 16-byte vectors, no spills; ragged columns included."""
    mod._compile(torch.bfloat16, *qk, tuning)
    rec = compile_record(mod.NAME, (str(torch.bfloat16), *qk, tuning))
    assert re.search(r"ld\.global[.\w:]*\.v4\.", rec.ptx) and re.search(r"st\.global[.\w:]*\.v4\.", rec.ptx)
    assert "local memory (spill)" not in rec.ptx_features
    assert all(not r.stack_bytes for r in rec.resources)
    body = rec.ptx[rec.ptx.index(".entry"):]
    assert "nctaid.x" in body  # the stride of the tile loop
    assert _back_branches(body), "no loop in the persistent kernel"
    mod._compile(torch.bfloat16, *qk)
    per_tile = compile_record(mod.NAME, (str(torch.bfloat16), *qk)).ptx
    assert not _back_branches(per_tile[per_tile.index(".entry"):])


def _back_branches(ptx: str) -> list[str]:
    """Labels that a ``bra`` after them jumps back to (whole label tokens)."""
    out = []
    for m in re.finditer(r"^\s*(\$[\w$]+):", ptx, flags=re.M):
        if re.search(rf"\bbra(\.uni)?\s+{re.escape(m.group(1))};", ptx[m.end():]):
            out.append(m.group(1))
    return out


def test_tuning_validation():
    with pytest.raises(ValueError, match="persistent_ctas"):
        mod.QKNormConfig.for_shape(4096, 1024, torch.bfloat16, tuning=mod.QKNormTuning(2, False, -1))
    with pytest.raises(TypeError, match="persistent_ctas"):
        mod.QKNormConfig.for_shape(4096, 1024, torch.bfloat16, tuning=mod.QKNormTuning(2, False, 1.5))


@pytest.mark.parametrize("dtype,qw,kw", [(torch.bfloat16, 24576, 8), (torch.float16, 8, 24576),
                                          (torch.bfloat16, 16384, 128), (torch.bfloat16, 12288, 12288),
                                          (torch.float32, 12288, 64)])
def test_wide_next_to_narrow_or_wide_compiles_without_spills(dtype, qw, kw):
    """A wide part next to a narrow one keeps one row per CTA (at most MAX_CTA_THREADS threads: the
    narrow part gets idle lanes; 544-thread CTAs spilled), and two wide parts fit the register estimate."""
    cfg = mod.QKNormConfig.for_shape(qw, kw, dtype, tuning=mod.DEFAULT_TUNING)
    assert cfg.threads <= mod.MAX_CTA_THREADS
    mod._compile(dtype, qw, kw)
    rec = compile_record(mod.NAME, (str(dtype), qw, kw))
    assert all(not r.stack_bytes for r in rec.resources)
    assert all(r.registers <= sm90_helpers.max_registers_per_thread(cfg.block_threads) for r in rec.resources)


def test_register_cap_counts_warps_per_sub_partition():
    """A CTA's warps are spread over the SM's four sub-partitions of 16384 registers: a 544-thread CTA (17 warps, 5
    on one sub-partition) gets 96 registers per thread, not 65536 / 544 = 120.  A hand-built config of that size
    whose estimate (120) fit the old 65536 / threads bound compiled with 80 B of spills: it is refused now."""
    assert [sm90_helpers.max_registers_per_thread(t) for t in (128, 384, 416, 512, 544, 1024)] == [
        248, 168, 128, 128, 96, 64]
    cfg = dict(q=mod.RowTiling(20480, 8, 256, 10), k=mod.RowTiling(128, 8, 16, 1), rows=2, q_dim=20480, k_dim=128)
    with pytest.raises(ValueError, match="which has 96"):
        mod.QKNormConfig(**cfg)


def test_two_wide_parts_that_would_spill_are_refused():
    """q and k both 24576 wide (16-bit; 12288 in float32): 512 threads of 12 vectors each would spill
    (ptxas: 256 B of stack): a ValueError naming both widths, before any launch."""
    for dtype, w in ((torch.bfloat16, 24576), (torch.float32, 12288)):
        with pytest.raises(ValueError, match=f"q rows of {w} and k rows of {w}"):
            mod.QKNormConfig.for_shape(w, w, dtype, tuning=mod.DEFAULT_TUNING)
        with pytest.raises(ValueError, match="would spill"):
            mod.validate_qk_args(torch.zeros(2, w, dtype=dtype), torch.zeros(2, w, dtype=dtype), torch.ones(w, dtype=dtype),
                                 torch.ones(w, dtype=dtype), 1e-6, cuda=False)


def test_too_wide_row_error_names_the_tensor():
    wide = 256 * mod._MAX_ROW_VECS * 8 + 256 * 8
    with pytest.raises(ValueError, match="^k: a row of"):
        mod.validate_qk_args(torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(2, wide, dtype=torch.bfloat16),
                             torch.ones(64, dtype=torch.bfloat16), torch.ones(wide, dtype=torch.bfloat16), 1e-6, cuda=False)


def test_odd_widths_compile():
    """Widths that are multiples of 8 but not of the thread count (predicated column vectors)."""
    for dtype, qw, kw in ((torch.bfloat16, 8 * 97, 8 * 3), (torch.float32, 4000, 8)):
        cfg = mod.QKNormConfig.for_shape(qw, kw, dtype)
        assert cfg.q.ragged or cfg.k.ragged
        mod._compile(dtype, qw, kw)
        assert "ld.global.v4 (16B loads)" in compile_record(mod.NAME, (str(dtype), qw, kw)).ptx_features


@pytest.mark.parametrize("dtype", mod.DTYPES)
@pytest.mark.parametrize("width", [8, 16, 24, 128, 256, 512, 768, 1000, 1024, 1536, 2048, 3072, 4096, 6144, 8 * 1031, 16384])
def test_row_tiling_covers_row(dtype, width):
    vec = mod.vec_elems(dtype)
    if width % vec:
        pytest.skip("not a multiple of the vector")
    t = mod.RowTiling.choose(width, vec)
    if width > 256 * mod._MAX_ROW_VECS * vec:  # fp32 16384: 16 vectors per thread would spill
        with pytest.raises(ValueError, match="fit in registers"):
            t.validate()
        return
    t.validate()
    assert t.threads * t.vecs >= t.nvec
    assert t.threads * (t.vecs - 1) < t.nvec  # no thread is all padding in its last slot... of every row
    cfg = mod.QKNormConfig.for_shape(width, 1024 if dtype != torch.float32 else 512, dtype)
    assert cfg.threads <= 1024 and cfg.q_threads % 32 == 0 and cfg.k_threads % 32 == 0


def test_tp_tilings_are_exact():
    """The tensor-parallel tiling (TP_TUNING) at the shipped per-rank shapes: no predicated columns and about 4
    vectors per thread."""
    from cute_kernels.kernels import qknorm_tp

    for qw, kw in mod.shipped_shapes():
        cfg = mod.QKNormConfig.for_shape(qw, kw, torch.bfloat16, tuning=qknorm_tp.TP_TUNING)
        assert not cfg.q.ragged and not cfg.k.ragged, cfg
        assert 3 <= cfg.q.vecs <= 4 and cfg.k.vecs == 4, cfg


def test_default_tuning_tilings_are_exact():
    """The one-GPU default (2 vectors per thread, the fastest at large N on the H200) at shipped shapes; it is
    for_shape's default and QKNormConfig's."""
    for qw, kw in mod.shipped_shapes():
        cfg = mod.QKNormConfig.for_shape(qw, kw, torch.bfloat16, tuning=mod.DEFAULT_TUNING)
        assert not cfg.q.ragged and not cfg.k.ragged, cfg
        assert cfg.threads <= 1024 and cfg.q.vecs <= 4, cfg
        assert mod.QKNormConfig.for_shape(qw, kw, torch.bfloat16) == cfg
        assert mod.QKNormConfig(cfg.q, cfg.k, cfg.rows, cfg.q_dim, cfg.k_dim) == cfg


def test_config_validation():
    with pytest.raises(ValueError, match="multiple of 8"):
        mod.QKNormConfig.for_shape(4100, 1024, torch.bfloat16)
    with pytest.raises(ValueError, match="power of two"):
        mod.RowTiling(1024, 8, 48, 3).validate()
    with pytest.raises(ValueError, match="do not cover"):
        mod.RowTiling(1024, 8, 32, 2).validate()
    with pytest.raises(ValueError, match="multiples of 32"):
        mod.QKNormConfig(mod.RowTiling(512, 8, 16, 4), mod.RowTiling(128, 8, 4, 4), 1, 512, 128).validate()


def test_reference_hand_checked():
    q = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float32)
    k = torch.tensor([[1.0, 1.0, 1.0, 1.0], [2.0, 0.0, 0.0, 0.0]], dtype=torch.float32)
    wq = torch.tensor([1.0, 2.0])
    wk = torch.tensor([1.0, 1.0, 1.0, -1.0])
    rq, rk = cute_kernels.qk_rmsnorm_reference(q, k, wq, wk, 0.0)
    s = 1 / math.sqrt(12.5)
    torch.testing.assert_close(rq[0], torch.tensor([3 * s, 8 * s]))
    assert torch.isnan(rq[1]).all()  # 0 * rsqrt(0): NaN, as torch's rms_norm with eps = 0
    torch.testing.assert_close(rk, torch.tensor([[1.0, 1.0, 1.0, -1.0], [2.0, 0.0, 0.0, 0.0]]))
    rq, _ = cute_kernels.qk_rmsnorm_reference(q, k, wq, wk, 1.0)
    torch.testing.assert_close(rq[1], torch.zeros(2))
    torch.testing.assert_close(rq[0], torch.tensor([3.0, 8.0]) / math.sqrt(13.5))


def test_reference_refuses_tensors_on_two_devices():
    q, k = torch.randn(2, 8), torch.randn(2, 4)
    with pytest.raises(ValueError, match="different devices"):
        cute_kernels.qk_rmsnorm_reference(q, k, torch.ones(8, device="meta"), torch.ones(4), 1e-6)


def test_reference_matches_torch_rms_norm():
    q = torch.randn(5, 64, dtype=torch.float64)
    k = torch.randn(5, 16, dtype=torch.float64)
    wq, wk = torch.randn(64, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    rq, rk = cute_kernels.qk_rmsnorm_reference(q, k, wq, wk, 1e-5)
    torch.testing.assert_close(rq, torch.nn.functional.rms_norm(q, (64,), wq, 1e-5))
    torch.testing.assert_close(rk, torch.nn.functional.rms_norm(k, (16,), wk, 1e-5))


def test_reference_with_global_sums():
    """The TP form: shards normalized with the sums over all shards equal the unsharded result."""
    q = torch.randn(3, 32, dtype=torch.float64)
    k = torch.randn(3, 8, dtype=torch.float64)
    wq, wk = torch.randn(32, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    full_q, full_k = cute_kernels.qk_rmsnorm_reference(q, k, wq, wk, 1e-6)
    ssq, ssk = (q * q).sum(-1), (k * k).sum(-1)
    for g in range(2):
        sq, sk = slice(16 * g, 16 * g + 16), slice(4 * g, 4 * g + 4)
        rq, rk = cute_kernels.qk_rmsnorm_reference(q[:, sq], k[:, sk], wq[sq], wk[sk], 1e-6, q_dim=32, k_dim=8,
                                                   q_sumsq=ssq, k_sumsq=ssk)
        torch.testing.assert_close(rq, full_q[:, sq])
        torch.testing.assert_close(rk, full_k[:, sk])


def _args(n=4, qd=64, kd=16, dtype=torch.bfloat16):
    return (torch.zeros(n, qd, dtype=dtype), torch.zeros(n, kd, dtype=dtype),
            torch.ones(qd, dtype=dtype), torch.ones(kd, dtype=dtype))


def test_validation_before_launch():
    q, k, wq, wk = _args()
    with pytest.raises(ValueError, match="CUDA device"):
        cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
    with pytest.raises(TypeError, match="dtype float64"):
        cute_kernels.qk_rmsnorm_(q.double(), k, wq, wk, 1e-6)
    with pytest.raises(ValueError, match="2 dims"):
        cute_kernels.qk_rmsnorm_(q[None], k, wq, wk, 1e-6)


def test_validation_rules_without_gpu():
    v = lambda *a, **kw: mod.validate_qk_args(*a, cuda=False, **kw)  # noqa: E731
    q, k, wq, wk = _args()
    v(q, k, wq, wk, 1e-6)
    with pytest.raises(TypeError, match="k has dtype float16"):
        v(q, k.half(), wq, wk, 1e-6)
    with pytest.raises(TypeError, match="q_weight has dtype float32"):
        v(q, k, wq.float(), wk, 1e-6)
    with pytest.raises(ValueError, match="same number of tokens"):
        v(q, k[:3], wq, wk, 1e-6)
    with pytest.raises(ValueError, match=r"q_weight must have shape \[64\]"):
        v(q, k, wq[:32], wk, 1e-6)
    with pytest.raises(ValueError, match="multiple of 8"):
        qq, _, ww, _ = _args(qd=60)
        v(qq, k, ww, wk, 1e-6)
    with pytest.raises(ValueError, match="contiguous in its last dim"):
        v(torch.zeros(64, 4, dtype=torch.bfloat16).t(), k, wq, wk, 1e-6)
    with pytest.raises(ValueError, match="stride"):
        big = torch.zeros(4, 68, dtype=torch.bfloat16)
        v(big[:, :64], k, wq, wk, 1e-6)  # row stride 136 bytes: not a multiple of 16
    with pytest.raises(ValueError, match="eps"):
        v(q, k, wq, wk, -1.0)
    with pytest.raises(ValueError, match="eps"):
        v(q, k, wq, wk, float("nan"))
    big = torch.zeros(4, 64 + 2 * 16, dtype=torch.bfloat16)  # a fused qkv buffer: q and k are strided views
    v(big[:, :64], big[:, 64:80], wq, wk, 1e-6)


class _CudaLike:
    """A CPU tensor that claims to be on cuda:0 (for the eager fast-path test without a GPU); ``shape``, ``stride``
    and ``ptr`` stand in for its own where given (a layout no CPU tensor could hold: only the fast path reads it)."""

    def __init__(self, t, shape=None, stride=None, ptr=None):
        self.t, self._stride, self._ptr = t, stride, ptr
        self.dtype, self.shape, self.is_cuda, self.requires_grad = t.dtype, shape or t.shape, True, False

    def stride(self):
        return self._stride or self.t.stride()

    def data_ptr(self):
        return self._ptr or self.t.data_ptr()

    def get_device(self):
        return 0

    def element_size(self):
        return self.t.element_size()

    def is_inference(self):
        return self.t.is_inference()


@pytest.mark.parametrize("eps,exc", [
    (True, TypeError), (False, TypeError), ("1e-6", TypeError), (None, TypeError), (torch.tensor(1e-6), TypeError),
    (-1e-6, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
    (1e300, ValueError), pytest.param(10**400, ValueError, id="10**400"),  # inf in float32 / beyond float
    (1e-40, ValueError),  # below float32's smallest normal: would be flushed to 0
])
def test_eps_rules(eps, exc, monkeypatch):
    q, k, wq, wk = _args()
    with pytest.raises(exc, match="eps"):
        cute_kernels.qk_rmsnorm_(q, k, wq, wk, eps)  # checked before the device rule
    with pytest.raises(exc, match="eps"):
        mod.validate_qk_args(q, k, wq, wk, eps, cuda=False)
    with pytest.raises(exc, match="eps"):
        mod.qk_rmsnorm_reference(q, k, wq, wk, eps)
    cuda_like = [_CudaLike(t) for t in (q, k, wq, wk)]
    monkeypatch.setattr(mod, "_DEVICE_OK", set())
    assert mod.fast_path_key(*cuda_like, 1e-6) is None  # a device not yet checked to be Hopper: slow path
    monkeypatch.setattr(mod, "_DEVICE_OK", {0})
    # the stand-ins pass the fast path's other rules: (N, the compiled kernel's key)
    assert mod.fast_path_key(*cuda_like, 1e-6) == (q.shape[0], (q.dtype, q.shape[1], k.shape[1]))
    assert mod.fast_path_key(*cuda_like, eps) is None  # the eager fast path must not skip the eps rule


def test_fast_path_declines_inference_tensors_outside_inference_mode(monkeypatch):
    """q or k made under torch.inference_mode(): the fast path takes them inside inference mode only; outside it
    the slow path refuses them (torch's rule for in-place updates of inference tensors, :func:`check_no_grad`)."""
    monkeypatch.setattr(mod, "_DEVICE_OK", {0})
    q, k, wq, wk = _args()
    with torch.inference_mode():
        iq, ik = q.clone(), k.clone()
    want = (q.shape[0], (q.dtype, q.shape[1], k.shape[1]))
    for args in ((iq, k), (q, ik), (iq, ik)):
        cuda_like = [_CudaLike(t) for t in (*args, wq, wk)]
        assert mod.fast_path_key(*cuda_like, 1e-6) is None
        with torch.inference_mode():
            assert mod.fast_path_key(*cuda_like, 1e-6) == want
        with pytest.raises(RuntimeError, match="inference tensor"):
            mod.check_no_grad(*args, wq, wk)
    assert mod.fast_path_key(*[_CudaLike(t) for t in (q, k, wq, wk)], 1e-6) == want


def test_fast_path_declines_what_the_slow_path_must_judge(monkeypatch):
    """Zero tokens, empty rows and rows wider than the kernel takes go to the slow path (which raises
    for the last two, and for q is k even with N = 0), never straight to a launch."""
    monkeypatch.setattr(mod, "_DEVICE_OK", {0})
    bf = torch.bfloat16
    widest = mod._MAX_WIDTH_VECS * 8
    ok = lambda n, qw, kw: [torch.zeros(n, qw, dtype=bf), torch.zeros(n, kw, dtype=bf), torch.ones(qw, dtype=bf),
                            torch.ones(kw, dtype=bf)]
    assert mod.fast_path_key(*[_CudaLike(t) for t in ok(2, widest, 8)], 1e-6) == (2, (bf, widest, 8))
    for n, qw, kw in ((0, 64, 64), (2, 0, 64), (2, 64, 0), (2, widest + 8, 64), (2, 64, widest + 8)):
        args = ok(n, qw, kw)
        assert mod.fast_path_key(*[_CudaLike(t) for t in args], 1e-6) is None, (n, qw, kw)
        if n:
            with pytest.raises(ValueError):
                mod.validate_qk_args(*args, 1e-6, cuda=False)
    q = torch.zeros(0, 64, dtype=bf)
    with pytest.raises(ValueError, match="overlap"):
        mod.validate_qk_args(q, q, torch.ones(64, dtype=bf), torch.ones(64, dtype=bf), 1e-6, cuda=False)


def test_fast_path_with_launch_checks_leaves_the_weights_and_k_dtype_to_the_launch(monkeypatch):
    """qk_rmsnorm_'s fast path (launch_checks=True) skips exactly the rules the compiled function checks before it
    launches (k's and the weights' dtype, k's token count, the weights' shapes and unit strides, row-stride
    divisibility, unit column strides, alignment, their devices) or the kernel's key does (widths no config
    takes); the strict form (the tensor-parallel op's) keeps them; both keep every other rule."""
    monkeypatch.setattr(mod, "_DEVICE_OK", {0})
    bf = torch.bfloat16
    q, k = torch.zeros(3, 64, dtype=bf), torch.zeros(3, 16, dtype=bf)
    wq, wk = torch.ones(64, dtype=bf), torch.ones(16, dtype=bf)
    key = (3, (bf, 64, 16))
    left_to_launch = [(q, k.half(), wq, wk), (q, k, wq.float(), wk), (q, k, torch.ones(72, dtype=bf), wk),
                      (q, k, wq, torch.ones(32, dtype=bf)[::2])]
    left_to_launch += [(q, torch.zeros(2, 16, dtype=bf), wq, wk), (q, torch.zeros(3, 32, dtype=bf)[:, ::2], wq, wk),
                       (q, torch.zeros(3 * 16 + 1, dtype=bf)[1:].view(3, 16), wq, wk)]  # N, column stride, alignment
    for args in left_to_launch:
        like = [_CudaLike(t) for t in args]
        assert mod.fast_path_key(*like, 1e-6) is None
        assert mod.fast_path_key(*like, 1e-6, launch_checks=True) == key
    like = [_CudaLike(t) for t in (q[:, :60], k, wq, wk)]  # a width no config takes: _compile_key refuses it
    assert mod.fast_path_key(*like, 1e-6) is None
    assert mod.fast_path_key(*like, 1e-6, launch_checks=True) == (3, (bf, 60, 16))
    # q's dtype picks the kernel, whose launch then refuses the bf16 k and weights
    assert mod.fast_path_key(*[_CudaLike(t) for t in (q.half(), k, wq, wk)], 1e-6, launch_checks=True) == (
        3, (torch.float16, 64, 16))
    for args in [(q, q[:, :16], wq, wk), (q, k, q[0], wk), (q, k, wq, k[1]),  # q/k overlap, a weight inside q / k
                 (q.as_strided((3, 64), (32, 1)), k, wq, wk),  # overlapping rows
                 (torch.zeros(3, 68, dtype=bf)[:, :64], k, wq, wk),  # a row stride of 68: the slow path explains
                 (torch.zeros(1, 68, dtype=bf).as_strided((1, 64), (67, 1)), k[:1], wq, wk)]:  # N = 1, legal: its
        # launch view is the slow path's
        like = [_CudaLike(t) for t in args]
        assert mod.fast_path_key(*like, 1e-6, launch_checks=True) is None
        assert mod.fast_path_key(*like, 1e-6) is None
    assert mod.fast_path_key(*[_CudaLike(t) for t in (q, k, wq, wk)], 1e-6, launch_checks=True) == key


def test_zero_width_rows_are_named():
    bf = torch.bfloat16
    q, k = torch.empty(4, 0, dtype=bf, device="meta"), torch.empty(4, 128, dtype=bf, device="meta")
    w0, wk = torch.empty(0, dtype=bf, device="meta"), torch.empty(128, dtype=bf, device="meta")
    with pytest.raises(ValueError, match=r"q has 0 columns: q and k must be \[N, Q\] and \[N, K\] with Q, K >= 1"):
        cute_kernels.qk_rmsnorm_(q, k, w0, wk, 1e-6)
    with pytest.raises(ValueError, match="k has 0 columns"):
        mod.validate_qk_args(k, q, wk, w0, 1e-6, cuda=False)


def test_fast_path_refuses_a_freed_storage(monkeypatch):
    """A tensor whose storage was freed (``untyped_storage().resize_(0)``, as FSDP frees parameters) keeps its shape
    and strides but has data pointer 0: the fast path (either form) leaves it to the slow path, which refuses it;
    the launch would fault on it and take the CUDA context down."""
    monkeypatch.setattr(mod, "_DEVICE_OK", {0})
    bf = torch.bfloat16
    q, k, wq, wk = torch.zeros(3, 64, dtype=bf), torch.zeros(3, 16, dtype=bf), torch.ones(64, dtype=bf), torch.ones(16, dtype=bf)
    for i in range(4):
        args = [q, k, wq, wk]
        args[i] = torch.zeros_like(args[i])
        args[i].untyped_storage().resize_(0)
        like = [_CudaLike(t) for t in args]
        assert mod.fast_path_key(*like, 1e-6, launch_checks=True) is None, i
        assert mod.fast_path_key(*like, 1e-6) is None, i
        with pytest.raises(ValueError, match="no data"):
            mod.validate_qk_args(*args, 1e-6, cuda=False)


def test_weight_overlapping_q_or_k_is_refused(monkeypatch):
    """q and k are written in place while the weights are read: a weight sharing elements with them
    is refused (slow path explains, fast path declines); one in the gap between rows is fine."""
    buf = torch.zeros(4, 4096 + 1024 + 1024, dtype=torch.bfloat16)
    q, k = buf[:, :4096], buf[:, 4096:5120]
    wk_ok = buf[0, 5120:6144]  # the unused third column block: in the row gaps of q and k
    monkeypatch.setattr(mod, "_DEVICE_OK", {0})
    for wq, wk, bad in ((q[1], torch.ones(1024, dtype=torch.bfloat16), "q_weight overlaps q"),
                        (torch.ones(4096, dtype=torch.bfloat16), k[2], "k_weight overlaps k")):
        with pytest.raises(ValueError, match=bad):
            mod.validate_qk_args(q, k, wq, wk, 1e-6, cuda=False)
        assert mod.fast_path_key(*[_CudaLike(t) for t in (q, k, wq, wk)], 1e-6) is None
    mod.validate_qk_args(q, k, torch.ones(4096, dtype=torch.bfloat16), wk_ok, 1e-6, cuda=False)


def test_a_tensor_tvm_ffi_cannot_pack_gets_the_slow_paths_error(monkeypatch):
    """The fast path leaves k's dtype and device to the compiled function (launch_checks); a k that tvm-ffi
    cannot pack at all (meta, a bit dtype) fails there with a RuntimeError before any check or launch: the
    call must raise the slow path's error instead, and write nothing."""
    q, k, wq, wk = _args(n=4, qd=4096, kd=1024)
    launched = []

    def launcher(*args):  # a stand-in with tvm-ffi's packing
        if any(t.is_meta or t.dtype == torch.bits16 for t in args if isinstance(t, torch.Tensor)):
            raise RuntimeError("Cannot pack tensors on meta / bit types are not supported by dlpack (stand-in)")
        launched.append(args)

    monkeypatch.setattr(mod, "_DEVICE_OK", {-1})  # (the CPU tensors pass the fast path's device test)
    monkeypatch.setattr(mod, "_launchers", {(torch.bfloat16, 4096, 1024): launcher})
    for bad in (torch.empty(4, 1024, dtype=torch.bfloat16, device="meta"), k.view(torch.bits16)):
        # (the bit dtype reaches the launch, which refuses it; the meta tensor's data pointer 0 sends it to the
        # slow path already, since session 54)
        assert (mod.fast_path_key(q, bad, wq, wk, 1e-6, launch_checks=True) is None) == bad.is_meta
        with pytest.raises((TypeError, ValueError)) as expected:  # (on this CPU: q is not on a CUDA device)
            mod._explain_refused_launch(q, bad, wq, wk, 1e-6)
        with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
            cute_kernels.qk_rmsnorm_(q, bad, wq, wk, 1e-6)
    assert not launched
    cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)  # (the stand-in launches good arguments)
    assert len(launched) == 1


def test_eps_accepts_reals():
    import numpy as np

    q, k, wq, wk = _args()
    for eps in (0, 1e-6, np.float32(1e-5), np.float64(1e-6), 3):
        mod.validate_qk_args(q, k, wq, wk, eps, cuda=False)
        mod.check_eps(eps)


def test_overlapping_tensors_are_rejected():
    """In place over rows that alias (stride-0 expand, overlapping rows) or q/k sharing memory: ValueError."""
    from cute_kernels.kernels import qknorm as m

    w = torch.ones(64, dtype=torch.bfloat16)
    k = torch.zeros(4, 64, dtype=torch.bfloat16)
    expanded = torch.zeros(1, 64, dtype=torch.bfloat16).expand(4, 64)
    buf = torch.zeros(64, dtype=torch.bfloat16)
    strided = torch.zeros(128, dtype=torch.bfloat16).as_strided((4, 64), (8, 1))
    with pytest.raises(ValueError, match="broadcast view"):
        m.validate_qk_args(expanded, k, w, w, 1e-6, cuda=False)
    with pytest.raises(ValueError, match="rows overlap"):
        m.validate_qk_args(strided, k, w, w, 1e-6, cuda=False)
    qkv = torch.zeros(4, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q and k overlap"):
        m.validate_qk_args(qkv[:, :64], qkv[:, 32:96], w, w, 1e-6, cuda=False)
    m.validate_qk_args(qkv[:, :64], qkv[:, 64:], w, w, 1e-6, cuda=False)  # disjoint column blocks: fine
    m.validate_qk_args(buf[None], buf[None].clone(), w, w, 1e-6, cuda=False)  # one row: any stride


def test_in_place_ops_respect_autograd():
    from cute_kernels.kernels import qknorm as m

    q, k, w = torch.zeros(2, 8), torch.zeros(2, 8), torch.ones(8)
    with pytest.raises(RuntimeError, match="no backward"):
        m.check_no_grad(q.requires_grad_(), k, w, w)
    for i in (2, 3):  # a weight that requires grad: its gradient would be lost, so it is refused too
        args = [torch.zeros(2, 8), torch.zeros(2, 8), w, w]
        args[i] = torch.ones(8, requires_grad=True)
        with pytest.raises(RuntimeError, match="no backward"):
            m.check_no_grad(*args)
    with torch.no_grad():
        m.check_no_grad(q, k, w, w)
    q.requires_grad_(False)
    a = torch.ones(2, 8, requires_grad=True)
    y = (a * q).sum()  # saves q for a's gradient
    before = (q._version, k._version)
    m.bump_versions(q, k)  # what the op does after the kernel wrote q and k
    assert (q._version, k._version) == (before[0] + 1, before[1] + 1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_single_row_with_any_stride_gets_a_launchable_view():
    from cute_kernels.kernels import qknorm as m

    buf = torch.zeros(1, 70, dtype=torch.bfloat16)
    q = buf.as_strided((1, 64), (67, 1))  # one row, odd stride: legal, the stride is never used
    v = m.launch_view(q)
    assert v.data_ptr() == q.data_ptr() and v.stride() == (64, 1) and v.shape == q.shape
    v.fill_(1.0)  # the same elements
    assert (q == 1).all()
    two = torch.zeros(2, 72, dtype=torch.bfloat16)[:, :64]
    assert m.launch_view(two) is two


def test_reference_refuses_wrong_weight_shapes():
    q, k, wq, wk = _args()
    for bad_wq in (wq[:1], wq.reshape(-1, 1)):
        with pytest.raises(ValueError, match="q_weight must be"):
            mod.qk_rmsnorm_reference(q, k, bad_wq, wk, 1e-6)


@pytest.mark.parametrize("kw,exc", [(dict(q_dim=-8), ValueError), (dict(q_dim=0), ValueError),
                                    (dict(k_dim=True), TypeError), (dict(q_dim=2.5), TypeError),
                                    (dict(q_sumsq=torch.ones(1)), ValueError),
                                    (dict(q_sumsq=torch.ones(1, 3)), ValueError),  # 3 sums, but not [N]
                                    (dict(k_sumsq=torch.ones(3, dtype=torch.int64)), TypeError)])
def test_reference_checks_its_divisors_and_sums(kw, exc):
    q, k = torch.ones(3, 8), torch.ones(3, 4)
    with pytest.raises(exc):
        cute_kernels.qk_rmsnorm_reference(q, k, torch.ones(8), torch.ones(4), 1e-6, **kw)


def test_reference_refuses_empty_rows():
    with pytest.raises(ValueError, match="Q, K >= 1"):
        cute_kernels.qk_rmsnorm_reference(torch.ones(2, 0), torch.ones(2, 4), torch.ones(0), torch.ones(4), 1e-6)


def test_trace_time_checks_need_no_pointers():
    """Under torch.compile / make_fx the op's fake runs the pointer-free rules, so a bad call fails
    while tracing (before, the fake accepted anything and the error came at run time)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    bf = torch.bfloat16
    q, k = torch.zeros(4, 64, dtype=bf), torch.zeros(4, 32, dtype=bf)
    w64, w32 = torch.ones(64, dtype=bf), torch.ones(32, dtype=bf)
    mod.validate_qk_shapes(q, k, w64, w32, 1e-6, cuda=False)
    bad = [(q, k, torch.ones(48, dtype=bf), w32), (q, q, w64, w64), (q, k[:3], w64, w32),
           (q, k, torch.ones(64), w32), (torch.zeros(2, 24584, dtype=bf), k[:2], torch.ones(24584, dtype=bf), w32)]
    for args in bad:
        with pytest.raises((TypeError, ValueError)):
            mod.validate_qk_shapes(*args, 1e-6, cuda=False)
    trace = make_fx(lambda *a: cute_kernels.qk_rmsnorm_(*a, 1e-6), tracing_mode="fake")
    assert "qk_rmsnorm_" in str(trace(q, k, w64, w32).graph)  # valid: traced through the op
    for args in bad:  # the fake refuses them while tracing
        with pytest.raises((TypeError, ValueError)):
            trace(*args)


def test_launch_key_by_bytes_against_l2(monkeypatch):
    """From PERSISTENT_MIN_TOKENS tokens, by q + k bytes against L2 (an H200: 132 SMs, 60 MiB): the
    persistent register kernel for PERSISTENT_SHAPES (16-bit 4096/1024, 10 KiB per token) up to 60% of
    L2 (N = 3686), then bulk-staged rows for BULK_STAGES up to 95% (N = 5836; 6144/1024, 14 KiB per
    token: from 30%, N = 1317, to N = 4169); one CTA per tile otherwise (float32, other shapes, past L2)."""
    monkeypatch.setitem(mod._device_limits, 7, (3 * 132, 60 * 2**20))
    key = (torch.bfloat16, 4096, 1024)
    got = {n: mod.launch_key(n, key, 7) for n in (1, 64, 1023, 1024, 3686, 3687, 4096, 5836, 5837, 16384)}
    assert got == {1: key, 64: key, 1023: key, 1024: key + (396,), 3686: key + (396,), 3687: key + (396, 6),
                   4096: key + (396, 6), 5836: key + (396, 6), 5837: key, 16384: key}
    assert mod.launch_key(2048, (torch.float16, 4096, 1024), 7) == (torch.float16, 4096, 1024, 396)
    wide = (torch.float16, 6144, 1024)
    got = {n: mod.launch_key(n, wide, 7) for n in (1024, 1316, 1317, 3072, 4169, 4170)}
    assert got == {1024: wide, 1316: wide, 1317: wide + (396, 4), 3072: wide + (396, 4), 4169: wide + (396, 4),
                   4170: wide}
    for other in ((torch.float32, 4096, 1024), (torch.bfloat16, 2048, 512)):
        assert mod.launch_key(2048, other, 7) == other
        assert mod.launch_key(4096, other, 7) == other


def test_device_limits_are_kept_by_device_index_never_under_none(monkeypatch):
    """device_limits(None) (the current device) reads the device that is current at each call: it was kept under
    None, so after torch.cuda.set_device a call named the first device's SMs and L2 (a GPU of another model or a
    MIG slice: another persistent CTA count, another kernel pick).  The limits are kept by index only."""
    import types

    current = [0]
    props = {0: types.SimpleNamespace(multi_processor_count=132, L2_cache_size=60 * 2**20),
             1: types.SimpleNamespace(multi_processor_count=16, L2_cache_size=10 * 2**20)}
    monkeypatch.setattr(mod, "_device_limits", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])

    def properties(d=None):  # (torch's: an index or a torch.device; None or no index: the current device)
        d = d.index if isinstance(d, torch.device) else d
        return props[current[0] if d is None else d]

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    per_sm = mod.PERSISTENT_CTAS_PER_SM
    assert mod.device_limits(None) == (per_sm * 132, 60 * 2**20)
    current[0] = 1
    assert mod.device_limits(None) == mod.device_limits(1) == (per_sm * 16, 10 * 2**20)
    assert mod.device_limits(torch.device("cuda")) == mod.device_limits(torch.device("cuda", 1)) == mod.device_limits(1)
    assert mod.device_limits(0) == (per_sm * 132, 60 * 2**20)
    assert set(mod._device_limits) == {0, 1}


def test_persistent_and_bulk_compile_keys_are_the_default_tiling():
    """The persistent and bulk-staged kernels keep the default tiling (so the bits of one CTA per token)
    and their compile targets are the ones qk_rmsnorm_ launches on an H200."""
    t = mod.QKNormTuning(mod.DEFAULT_TUNING.target_vecs, mod.DEFAULT_TUNING.streaming, mod.H200_PERSISTENT_CTAS)
    labels = {tg.label: tg.key for tg in mod.compile_targets() if "persistent" in tg.label or "bulk" in tg.label}
    want = {f"{d} q=4096 k=1024 persistent=396": (f"torch.{d}", 4096, 1024, t) for d in ("bfloat16", "float16")}
    for q, stages in ((4096, 6), (6144, 4)):
        tb = dataclasses.replace(t, bulk_stages=stages)
        want.update({f"{d} q={q} k=1024 bulk=396 stages={stages}": (f"torch.{d}", q, 1024, tb)
                     for d in ("bfloat16", "float16")})
    assert labels == want
    assert mod._compile_key((torch.bfloat16, 4096, 1024, 396)) is mod._compile(torch.bfloat16, 4096, 1024, t)
    tb = dataclasses.replace(t, bulk_stages=4)
    assert mod._compile_key((torch.float16, 6144, 1024, 396, 4)) is mod._compile(torch.float16, 6144, 1024, tb)


def test_bulk_kernel_ptx_stages_rows_through_bulk_copies():
    """``bulk_stages``: rows move by cp.async.bulk (global -> shared on a slot's mbarrier, shared -> global
    in bulk groups once the normalizing threads have arrived on the slot's second mbarrier, waited for
    before the slot is refilled), the scaled values reach the bulk store through a proxy fence; a
    producer warp beyond the q and k threads; no spills."""
    t = mod._persistent_tuning(mod.H200_PERSISTENT_CTAS, 6)
    mod._compile(torch.bfloat16, 4096, 1024, t)
    rec = compile_record(mod.NAME, (str(torch.bfloat16), 4096, 1024, t))
    body = rec.ptx[rec.ptx.index(".entry"):]
    for needle in ("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
                   "cp.async.bulk.global.shared::cta.bulk_group", "cp.async.bulk.commit_group",
                   "cp.async.bulk.wait_group.read", "mbarrier.arrive.expect_tx", "mbarrier.arrive.shared",
                   "mbarrier.try_wait.parity",
                   "fence.proxy.async.shared::cta", "ld.shared.v4", "st.shared.v4"):
        assert needle in body, needle
    assert "st.global" not in body  # every row goes back by the bulk store
    cfg = mod.QKNormConfig.for_shape(4096, 1024, torch.bfloat16, tuning=t)
    assert cfg.block_threads == cfg.threads + 32 == 352  # 256 q + 64 k threads and the producer warp
    assert "local memory (spill)" not in rec.ptx_features
    assert all(not r.stack_bytes for r in rec.resources)


@pytest.mark.parametrize("fields,shape,match", [
    ((2, False, 396, 1), (4096, 1024), "bulk_stages=1"),
    ((2, False, 0, 4), (4096, 1024), "persistent_ctas"),
    ((2, False, 396, 4), (512, 128), "one token row per CTA"),  # 4 rows per CTA
    ((2, False, 396, 4), (1000, 1024), "predicated"),
    ((2, False, 396, 24), (4096, 1024), "shared memory"),
    ((2, True, 396, 4), (4096, 1024), "streaming"),
    ((2, False, 2**29, 4), (4096, 1024), "2\\*\\*30")])
def test_bulk_stages_rules(fields, shape, match):
    """QKNormTuning's own rules refuse it when constructed; the tiling's (rows per CTA, smem) in for_shape."""
    with pytest.raises(ValueError, match=match):
        mod.QKNormConfig.for_shape(*shape, torch.bfloat16, tuning=mod.QKNormTuning(*fields))


@pytest.mark.parametrize("kw,exc", [(dict(target_vecs=9), ValueError), (dict(target_vecs=True), TypeError),
                                    (dict(streaming="no"), TypeError), (dict(streaming=None), TypeError),
                                    (dict(persistent_ctas=2.0), TypeError),
                                    (dict(bulk_stages=-1), ValueError), (dict(bulk_stages=2.0), TypeError),
                                    (dict(l2_prefetch_bytes=-1), ValueError), (dict(l2_prefetch_bytes=1.0), TypeError),
                                    (dict(l2_prefetch_bytes=2**31), ValueError),
                                    (dict(l2_prefetch_bytes=4096, persistent_ctas=396), ValueError),
                                    # exact ints, as the other kernels' configs (session 37 review)
                                    (dict(persistent_ctas=np.int64(5)), TypeError)])
def test_tuning_fields_are_checked(kw, exc):
    with pytest.raises(exc):
        mod.QKNormConfig.for_shape(4096, 1024, torch.bfloat16, tuning=mod.QKNormTuning(**kw))


@pytest.mark.parametrize("args,kw,exc", [((8.0, 1024, torch.bfloat16), {}, TypeError),
                                         ((64, 64, torch.int8), {}, TypeError),
                                         ((64, 64, torch.float64), {}, TypeError),
                                         ((64, 64, torch.bfloat16), dict(q_dim=0), ValueError),
                                         ((64, 64, torch.bfloat16), dict(k_dim=64.5), TypeError)])
def test_for_shape_checks_its_arguments(args, kw, exc):
    with pytest.raises(exc):
        mod.QKNormConfig.for_shape(*args, **kw)


def test_launch_key_checks_its_key():
    for bad in (("torch.bfloat16", 4096, 1024), (torch.bfloat16, 4096, 1024, 396), (torch.int8, 64, 64)):
        with pytest.raises(TypeError, match="key"):
            mod.launch_key(2048, bad, 0)


@pytest.mark.parametrize("which", ["k", "q_weight", "k_weight"])
def test_dtype_mismatch_names_the_tensor_and_q_dtype(which):
    """A tensor whose dtype differs from q's: a TypeError naming it and q's dtype (not a list of one)."""
    a = dict(q=torch.zeros(2, 64, dtype=torch.bfloat16), k=torch.zeros(2, 16, dtype=torch.bfloat16),
             q_weight=torch.ones(64, dtype=torch.bfloat16), k_weight=torch.ones(16, dtype=torch.bfloat16))
    a[which] = a[which].half()
    with pytest.raises(TypeError, match=f"{which} has dtype float16; it must match q's dtype bfloat16"):
        mod.validate_qk_args(a["q"], a["k"], a["q_weight"], a["k_weight"], 1e-6, cuda=False)


def test_config_and_launch_key_argument_types():
    """Hand-built configs and launch_key refuse wrong types and values with TypeError / ValueError (not a
    ZeroDivisionError or an AttributeError from inside)."""
    q, k = mod.RowTiling.choose(4096, 8, 2), mod.RowTiling.choose(1024, 8, 2)
    for rows, exc in ((0, ValueError), (-1, ValueError), (1.5, TypeError)):
        with pytest.raises(exc, match="rows"):
            mod.QKNormConfig(q, k, rows, 4096, 1024).validate()
    for tuning in (None, "fast"):
        with pytest.raises(TypeError, match="QKNormTuning"):
            mod.QKNormConfig(q, k, 1, 4096, 1024, tuning).validate()
        with pytest.raises(TypeError, match="QKNormTuning"):
            mod.QKNormConfig.for_shape(4096, 1024, torch.bfloat16, tuning=tuning)
    with pytest.raises(ValueError, match="q_dim=10"):
        mod.QKNormConfig.for_shape(4096, 1024, torch.bfloat16, q_dim=10)
    for tiling, exc in (((96, 3, 32, 1), ValueError), ((96, 0, 32, 1), ValueError), ((0, 8, 1, 1), ValueError),
                        ((96.0, 8, 12, 1), TypeError)):
        with pytest.raises(exc):
            mod.RowTiling(*tiling).validate()
    key = (torch.bfloat16, 4096, 1024)
    for n, exc in ((4096.5, TypeError), (-1, ValueError), (True, TypeError)):
        with pytest.raises(exc, match="n"):
            mod.launch_key(n, key, 0)
    for bad in (5, [torch.bfloat16, 4096, 1024], (torch.bfloat16, 4096.0, 1024), (torch.bfloat16, 0, 1024)):
        with pytest.raises(TypeError, match="key"):
            mod.launch_key(4096, bad, 0)


def test_l2_prefetch_distance_in_ctas():
    """``l2_prefetch_bytes`` -> CTAs ahead: the bytes over one CTA's q and k rows, at least 1, 0 when off."""
    def ahead(qk, dtype, nbytes):
        tuning = dataclasses.replace(mod.DEFAULT_TUNING, l2_prefetch_bytes=nbytes)
        return mod.QKNormConfig.for_shape(*qk, dtype, tuning=tuning).l2_prefetch_ctas

    assert ahead((4096, 1024), torch.bfloat16, mod.L2_PREFETCH_BYTES) == (4 << 20) // 10240 == 409
    assert ahead((6144, 1024), torch.bfloat16, mod.L2_PREFETCH_BYTES) == (4 << 20) // 14336 == 292
    assert ahead((4096, 1024), torch.float32, mod.L2_PREFETCH_BYTES) == (4 << 20) // 20480
    cfg = mod.QKNormConfig.for_shape(512, 128, torch.bfloat16, tuning=mod.DEFAULT_TUNING)
    assert cfg.rows > 1 and cfg.l2_prefetch_ctas == (4 << 20) // (cfg.rows * 640 * 2)  # several tokens a CTA
    assert ahead((4096, 1024), torch.bfloat16, 1) == 1 and ahead((4096, 1024), torch.bfloat16, 3 * 10240) == 3
    assert ahead((4096, 1024), torch.bfloat16, 0) == 0


def test_prefetch_guard_is_the_row_test():
    """The per-token kernel's prefetch guard (``prefetch_row_exists``, evaluated on DSL integers in the kernel)
    is ``tile * rows + r < n`` for every row ``r < rows`` of tile ``tile >= 0`` and ``n >= 1``."""
    for rows in (1, 2, 3, 4, 8, 32):
        for n in range(1, 70):
            for tile in range(0, 80):
                for r in range(rows):
                    assert mod.prefetch_row_exists(tile, r, n, rows) == (tile * rows + r < n), (rows, n, tile, r)


def test_reference_takes_any_eps_the_op_takes():
    """check_eps accepts any real number (a Fraction included): the reference computes with it as a float."""
    import fractions

    q, k = torch.randn(3, 16, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    wq, wk = torch.rand(16, dtype=torch.float64), torch.rand(8, dtype=torch.float64)
    got = mod.qk_rmsnorm_reference(q, k, wq, wk, fractions.Fraction(1, 10))
    want = mod.qk_rmsnorm_reference(q, k, wq, wk, 0.1)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_help_shows_the_ops_signature_and_docstring():
    """help() on an op (an eager fast-path object) shows it like a function: signature and docstring."""
    import pydoc

    for op, arg, first in ((cute_kernels.qk_rmsnorm_, "q_weight", "In-place fused RMSNorm"),
                           (cute_kernels.hc_mix_sinkhorn, "hc_scale", "mHC pre/post/comb")):
        text = pydoc.plain(pydoc.render_doc(op))
        assert f"{arg}:" in text and first in text, text[:300]


def test_docstring_example_of_a_wide_pair():
    """qk_rmsnorm_'s docstring example (session 61: it named K=3072 and 12544 as fitting next to bf16 Q=24576, which
    the register check of session 60 refuses)."""
    for kw in (8, 1272, 1288, 1784, 1800, 2048, 2304):
        mod.QKNormConfig.for_shape(24576, kw, torch.bfloat16)
    for kw in (1280, 1792, 3072, 12544):
        with pytest.raises(ValueError):
            mod.QKNormConfig.for_shape(24576, kw, torch.bfloat16)


def test_fast_path_declines_overlapping_k_rows_and_32_bit_extents(monkeypatch):
    """(Session 64's mutation pass: dropping either of these two rules from fast_path_key went unnoticed.)"""
    monkeypatch.setattr(mod, "_DEVICE_OK", {0})
    bf = torch.bfloat16
    q, k = torch.zeros(2, 64, dtype=bf), torch.zeros(80, dtype=bf).as_strided((2, 64), (8, 1))  # k's rows overlap
    like = [_CudaLike(t) for t in (q, k, torch.ones(64, dtype=bf), torch.ones(64, dtype=bf))]
    assert mod.fast_path_key(*like, 1e-6) is None
    assert mod.fast_path_key(*like, 1e-6, launch_checks=True) is None
    g = 1 << 40
    q = _CudaLike(torch.zeros(1, 8, dtype=bf), (3, 4096), (4096, 1), g)
    wq = _CudaLike(torch.zeros(8, dtype=bf), (4096,), (1,), 3 * g)
    wk = _CudaLike(torch.zeros(8, dtype=bf), (1024,), (1,), 4 * g)
    near = _CudaLike(torch.zeros(1, 8, dtype=bf), (3, 1024), (1024, 1), 2 * g)
    assert mod.fast_path_key(q, near, wq, wk, 1e-6) is not None
    far = _CudaLike(torch.zeros(1, 8, dtype=bf), (3, 1024), (2**30, 1), 2 * g)  # (N - 1) * stride + K > 2^31 - 1
    assert mod.fast_path_key(q, far, wq, wk, 1e-6) is None
    assert mod.fast_path_key(q, far, wq, wk, 1e-6, launch_checks=True) is None
