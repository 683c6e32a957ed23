import pytest
import torch

import cute_kernels

from cute_kernels.runtime.validate import check_same_device, check_tensor


def test_rejects_non_tensor():
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        check_tensor("x", [1, 2], cuda=False)


def test_rejects_dtype():
    with pytest.raises(TypeError, match="x has dtype float64"):
        check_tensor("x", torch.zeros(8, dtype=torch.float64), dtypes=(torch.float16,), cuda=False)


def test_rejects_cpu_when_cuda_needed():
    with pytest.raises(ValueError, match="CUDA device"):
        check_tensor("x", torch.zeros(8))


def test_rejects_shape_and_rank():
    with pytest.raises(ValueError, match="must have 2 dims"):
        check_tensor("x", torch.zeros(8), ndim=2, cuda=False)
    with pytest.raises(ValueError, match=r"shape \[\*, 4\]"):
        check_tensor("x", torch.zeros(3, 5), shape=(None, 4), cuda=False)


def test_rejects_non_unit_last_stride():
    with pytest.raises(ValueError, match="contiguous in its last dim"):
        check_tensor("x", torch.zeros(8, 8).t(), cuda=False)


def test_rejects_misaligned_pointer_and_stride():
    base = torch.zeros(64, dtype=torch.float16)
    with pytest.raises(ValueError, match="16-byte aligned"):
        check_tensor("x", base[1:9], cuda=False)
    with pytest.raises(ValueError, match="stride 12 in dim 0"):
        check_tensor("x", torch.zeros(4, 12, dtype=torch.float16)[:, :8], cuda=False)


def test_accepts_good_tensor():
    check_tensor("x", torch.zeros(4, 16, dtype=torch.float16)[:, :8], dtypes=(torch.float16,), ndim=2, cuda=False)


def test_same_device():
    check_same_device(a=torch.zeros(1), b=torch.zeros(1))
    with pytest.raises(ValueError, match="different devices"):
        check_same_device(a=torch.zeros(1), b=torch.zeros(1, device="meta"))


def test_check_real():
    import numpy as np

    from cute_kernels.runtime.validate import check_real

    assert check_real("eps", 0, low=0.0) == 0.0
    assert check_real("eps", np.float32(1e-6), low=0.0) == pytest.approx(1e-6)
    for bad in (True, "1e-6", None):
        with pytest.raises(TypeError, match="eps must be a real number"):
            check_real("eps", bad, low=0.0)
    for bad in (-1e-9, float("nan"), float("inf"), 1e39):
        with pytest.raises(ValueError, match="eps must be finite"):
            check_real("eps", bad, low=0.0)
    with pytest.raises(ValueError, match="> 0"):
        check_real("t", 0.0, low=0.0, low_open=True)


def test_check_int():
    from cute_kernels.runtime.validate import check_int

    assert check_int("n", 3) == 3
    for bad in (True, 1.5, "3"):
        with pytest.raises(TypeError, match="n must be an int"):
            check_int("n", bad)
    with pytest.raises(ValueError, match=r"n=0 must be in \[1, 2147483647\]"):
        check_int("n", 0)
    with pytest.raises(ValueError):
        check_int("n", 2**31)


def _strideless():
    """Tensors with no strides: sparse CSR and COO, and a nested tensor (whose layout reads strided)."""
    nested = torch.nested.nested_tensor([torch.zeros(2, 128), torch.zeros(3, 128)]).bfloat16()
    return [torch.zeros(4, 128).to_sparse_csr().bfloat16(), torch.zeros(4, 128).to_sparse().bfloat16(), nested]


def test_sparse_and_nested_tensors_get_a_clear_error():
    from cute_kernels.runtime.validate import check_tensor

    for t in _strideless():
        with pytest.raises(TypeError, match="dense"):
            check_tensor("x", t, cuda=False)


def test_public_ops_refuse_strideless_tensors_with_a_type_error():
    """Through every public op (their signature memos and fast paths touch strides before the full
    check): a TypeError, never torch's RuntimeError about missing strides."""
    import cute_kernels as ck

    w = torch.ones(128, dtype=torch.bfloat16)
    bounds = torch.zeros(1, 4, dtype=torch.int32)
    for t in _strideless():
        calls = [lambda: ck.hc_mix_sinkhorn(t, torch.zeros(24, 128), torch.ones(3), torch.zeros(24)),
                 lambda: ck.hc_mix_sinkhorn(t, torch.zeros(24, 128), torch.ones(3), torch.zeros(24), method="tma"),
                 lambda: ck.ranker_attention(t, t, t, bounds),
                 lambda: ck.qk_rmsnorm_(t, t, w, w, 1e-6),
                 lambda: ck.scale(t, 2.0)]
        for call in calls:
            with pytest.raises(TypeError, match="dense"):
                call()


def test_validated_once_keys_on_signature_and_rechecks_alignment():
    """check() runs once per signature (shapes, strides, dtype, device, scalar types and values); a hit
    still needs aligned(); scalars of another type (True vs 1) or non-tensors are checked in full."""
    from cute_kernels.runtime.validate import validated_once

    memo, calls = {}, []

    def check(result="ok"):
        calls.append(result)
        return result

    t = torch.zeros(4, 8)
    assert validated_once(memo, (t,), (1,), lambda: True, check) == "ok" and len(calls) == 1
    assert validated_once(memo, (torch.ones(4, 8),), (1,), lambda: True, check) == "ok" and len(calls) == 1
    validated_once(memo, (t,), (1,), lambda: False, check)  # misaligned pointer: full check again
    validated_once(memo, (t,), (True,), lambda: True, check)  # bool is not int here
    validated_once(memo, (t.t(),), (1,), lambda: True, check)  # other shape and strides
    validated_once(memo, (t[:, :4],), (1,), lambda: True, check)  # 4x4, padded rows: strides (8, 1)
    validated_once(memo, (torch.ones(4, 8)[:, :4],), (1,), lambda: True, check)  # the same signature: kept
    validated_once(memo, (torch.zeros(4, 4),), (1,), lambda: True, check)  # same shape, strides (4, 1): checked
    assert len(calls) == 6
    validated_once(memo, ("not a tensor",), (1,), lambda: True, check)
    validated_once(memo, (t,), ([1],), lambda: True, check)  # unhashable scalar
    assert len(calls) == 8 and len(memo) == 5


def test_references_refuse_non_tensors_and_integer_tensors():
    """The CPU references check their tensors too (a TypeError, not an AttributeError or an int result)."""
    import cute_kernels as ck

    q, w = torch.zeros(2, 8), torch.ones(8)
    for bad in (None, torch.zeros(2, 8, dtype=torch.int32)):
        with pytest.raises(TypeError):
            ck.qk_rmsnorm_reference(q, q, w, bad if bad is None else torch.ones(8, dtype=torch.int32), 1e-6)
        with pytest.raises(TypeError):
            ck.qk_rmsnorm_reference(bad if bad is not None else None, q, w, w, 1e-6)
        with pytest.raises(TypeError):
            ck.scale_reference(bad, 2.0)
    out_q, _ = ck.qk_rmsnorm_reference(q + 1, q, w, w, 1e-6)
    assert torch.allclose(out_q, torch.ones(2, 8))


def test_rejects_broadcast_views():
    """An expand()ed tensor (stride 0 in a dim of size > 1): TMA boxes and written outputs need distinct rows."""
    with pytest.raises(ValueError, match=r"broadcast view \(stride 0 in dim 0"):
        check_tensor("q", torch.zeros(1, 64, dtype=torch.bfloat16).expand(2, 64), cuda=False)  # (2 rows: the least)
    with pytest.raises(ValueError, match="stride 0 in dim 1"):
        check_tensor("q", torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16).expand(2, 300, 4, 64), cuda=False)
    check_tensor("q", torch.zeros(1, 64, dtype=torch.bfloat16).expand(1, 64), cuda=False)  # size-1 dims: any stride


def test_check_extent_refuses_spans_past_32_bit_offsets():
    from cute_kernels.runtime.validate import check_extent, element_span

    ok = torch.empty_strided((2, 3), (2**30, 1), device="meta")
    assert element_span(ok) == 2**30 + 3
    check_extent("x", ok)
    big = torch.empty_strided((3, 3), (2**30, 1), device="meta")  # last element at offset 2**31 + 2
    with pytest.raises(ValueError, match="x spans 2147483651 elements.*32-bit offsets"):
        check_extent("x", big)
    assert element_span(torch.empty(0, 5, device="meta")) == 0


def test_ranker_takes_and_qknorm_refuses_tensors_past_32_bit_offsets():
    """Found by a newcomer review (session 20): the forward's self-term loads formed batch/head offsets in 32 bits
    (PTX mul.lo.s32 before the widening), and nothing refused a q of 2.4e9 elements; then the ops refused spans of
    2**31 elements or more.  Since session 54 the ranker kernels take 64-bit strides (runtime.fake.wide_stride:
    GPU-tested past 2**31 in tests/gpu/test_large_offsets_gpu.py) and accept them; qknorm still refuses."""
    from cute_kernels.kernels import qknorm, ranker_bwd, ranker_fwd

    bf = torch.bfloat16
    q = torch.empty_strided((3, 8, 2, 128), (2**30, 256, 128, 1), device="meta", dtype=bf)
    small = torch.empty((3, 8, 2, 128), device="meta", dtype=bf)
    bounds = torch.zeros(3, 4, dtype=torch.int32, device="meta")
    ranker_fwd._validate(q, small, small, bounds, None, None, "tanh", None, None, cuda=False, pointers=False)
    lse = torch.empty(3, 2, 8, device="meta")
    ranker_bwd._validate_backward(small, small, small, small, lse, q, bounds, None, None, "tanh", None, None,
                                  cuda=False, pointers=False)
    qq = torch.empty_strided((3, 4096), (2**30, 1), device="meta", dtype=bf)
    with pytest.raises(ValueError, match="q spans .*32-bit offsets"):
        qknorm.validate_qk_shapes(qq, torch.empty(3, 1024, device="meta", dtype=bf),
                                  torch.empty(4096, device="meta", dtype=bf), torch.empty(1024, device="meta", dtype=bf),
                                  1e-6, cuda=False)


def test_ranker_fake_strides_are_64_bit(monkeypatch):
    """The compiled ranker kernels' q/k/v/dout/out strides are 64-bit symbols, so every element offset computed
    from them is 64-bit (what lets the ops take tensors past 2**31 elements; with 32-bit ones the forward faulted
    there, session 54): the forward's compile arguments and the backward's fakes."""
    from cute_kernels.kernels import ranker_fwd as rf
    from cute_kernels.kernels.ranker_bwd_buffers import BwdFakes
    from cute_kernels.runtime.fake import wide_stride

    assert wide_stride(8).width == 64
    monkeypatch.setattr(rf, "compile_cached", lambda name, key, build: build())  # (the arguments, no compile)
    for varlen in (False, True):
        widths = [64] * (2 if varlen else 3)
        _, args = rf._compile(torch.bfloat16, rf.CONFIGS[128], 1, "none", varlen)
        for t in args[:3]:  # q, k, v
            assert [getattr(st, "width", None) for st in t.stride[:-1]] == widths, t.stride
        f = BwdFakes(128, varlen)
        t = f.inputs(f.hq, torch.bfloat16)
        assert [getattr(st, "width", None) for st in t.stride[:-1]] == widths, t.stride


def test_check_bool_takes_numpy_bools_and_names_other_types():
    import numpy as np

    from cute_kernels.runtime.validate import check_bool

    assert check_bool("flag", True) is True and check_bool("flag", np.bool_(True)) is True
    assert check_bool("flag", np.False_) is False
    for bad, shown in ((1, "int 1"), ("yes", "str 'yes'"), (None, "NoneType None"),
                       (np.int64(1), r"numpy.int64 (np.int64\(1\)|1)")):  # (numpy 2 / 1 reprs)
        with pytest.raises(TypeError, match=f"flag must be a bool, got {shown}"):
            check_bool("flag", bad)


def test_empty_tensors_skip_the_layout_rules():
    """An empty tensor has no element to read or write: the stride and alignment rules do not apply (the
    gradient of an empty output's ``.sum()`` is an all-stride-0 expansion), dtype and shape rules do."""
    g = torch.zeros((), dtype=torch.bfloat16).expand(0, 16, 4, 64)
    check_tensor("dout", g, dtypes=(torch.bfloat16,), ndim=4, cuda=False, align_bytes=16)
    with pytest.raises(ValueError, match="stride"):  # one element more: the rules apply
        check_tensor("dout", torch.zeros((), dtype=torch.bfloat16).expand(1, 16, 4, 64), cuda=False)
    with pytest.raises(TypeError, match="dtype"):
        check_tensor("dout", g.float(), dtypes=(torch.bfloat16,), cuda=False)


def test_meta_tensors_take_the_ops_fakes():
    """The public functions on meta tensors (a model initialised on the meta device) return meta outputs of
    the right shapes through the registered ops' fakes; the checks still run."""
    x = torch.empty(8, 20480, dtype=torch.bfloat16, device="meta")
    pre, post, comb = cute_kernels.hc_mix_sinkhorn(x, torch.empty(24, 20480, device="meta"),
                                                   torch.empty(3, device="meta"), torch.empty(24, device="meta"))
    assert pre.device.type == "meta" and (pre.shape, post.shape, comb.shape) == ((8, 4), (8, 4), (8, 4, 4))
    q = torch.empty(4, 4096, dtype=torch.bfloat16, device="meta")
    k = torch.empty(4, 1024, dtype=torch.bfloat16, device="meta")
    wq, wk = torch.empty(4096, dtype=torch.bfloat16, device="meta"), torch.empty(1024, dtype=torch.bfloat16, device="meta")
    assert cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6) is None
    with pytest.raises(TypeError, match="dtype"):
        cute_kernels.qk_rmsnorm_(q, k, wq.float(), wk, 1e-6)


def test_torch_func_transforms_are_refused_clearly():
    """Under torch.func (grad, vmap) every public function raises NotImplementedError naming torch.func, before
    any other check (torch's own errors there speak of setup_context or data pointers)."""
    bf = torch.bfloat16
    b = torch.tensor([[0, 8, 8, 16]], dtype=torch.int32)
    q, k = torch.randn(1, 16, 2, 64, dtype=bf), torch.randn(1, 16, 2, 64, dtype=bf)
    x, w, sc, base = torch.randn(2, 4, 64, dtype=bf), torch.randn(24, 64), torch.rand(3), torch.randn(24)
    qq, kk = torch.randn(4, 128, dtype=bf), torch.randn(4, 64, dtype=bf)
    wq, wk = torch.ones(128, dtype=bf), torch.ones(64, dtype=bf)
    calls = [
        lambda: torch.func.grad(lambda t: cute_kernels.ranker_attention(t, k, k, b).float().sum())(q),
        lambda: torch.func.grad(lambda t: cute_kernels.ranker_attention(q, t, k, b).float().sum())(k),
        lambda: torch.func.vmap(lambda t: cute_kernels.ranker_attention(t, k, k, b))(q[None].expand(3, -1, -1, -1, -1)),
        lambda: torch.func.vmap(lambda t: cute_kernels.hc_mix_sinkhorn(t, w, sc, base))(x),
        lambda: torch.func.vmap(lambda a: cute_kernels.qk_rmsnorm_(a, kk, wq, wk, 1e-6))(qq[None].expand(2, -1, -1)),
        lambda: torch.func.grad(lambda t: cute_kernels.scale(t, 2.0).float().sum())(torch.randn(16)),
        lambda: torch.func.vmap(lambda t: cute_kernels.ranker_attention_backward(t, k, k, t, torch.zeros(1, 2, 16), t, b)
                                )(q[None].expand(2, -1, -1, -1, -1)),
    ]
    for i, call in enumerate(calls):
        with pytest.raises(NotImplementedError, match="torch.func") as info:
            call()
        # the pointer to .backward() only where there is a backward (ranker_attention: the first three calls)
        assert (".backward()" in str(info.value)) == (i < 3), str(info.value)


def test_float32_max_as_numpy_prints_it_is_explained():
    """numpy prints float32's max as 3.4028235e+38, a Python float just above it: the refusal says which value
    is meant (session 72, a newcomer's finding); float32's max itself passes."""
    from cute_kernels.runtime.validate import F32_MAX, check_real

    for v in (3.4028235e38, -3.4028235e38):
        with pytest.raises(ValueError, match=r"float32's max is 3.4028234663852886e\+38"):
            check_real("alpha", v)
    with pytest.raises(ValueError) as info:
        check_real("cap", -3.4028235e38, low=0.0)
    assert "float32's max is" not in str(info.value)
    with pytest.raises(ValueError) as info:
        check_real("alpha", 1e39)
    assert "float32's max is" not in str(info.value)
    assert check_real("alpha", F32_MAX) == F32_MAX


def _small_cpu_inputs():
    """Small CPU arguments of every op (bounds, ranker q/k, hc_mix x/hc_fn/scale/base, qknorm q/k/weights): the
    calls reach their device check."""
    bf = torch.bfloat16
    b = torch.tensor([[0, 8, 8, 16]], dtype=torch.int32)
    q, k = torch.randn(1, 16, 2, 64, dtype=bf), torch.randn(1, 16, 2, 64, dtype=bf)
    x, w, sc, base = torch.randn(2, 256, dtype=bf), torch.randn(24, 256), torch.rand(3), torch.randn(24)
    qq, kk = torch.randn(4, 128, dtype=bf), torch.randn(4, 64, dtype=bf)
    wq, wk = torch.ones(128, dtype=bf), torch.ones(64, dtype=bf)
    return b, q, k, x, w, sc, base, qq, kk, wq, wk


def test_forward_mode_ad_is_refused_clearly():
    """A dual tensor (torch.autograd.forward_ad) reaching any public function raises NotImplementedError: the
    outputs came back without a tangent, and qk_rmsnorm_ left its input's old tangent in place, silently
    (session 72, a newcomer's finding).  Outside a dual level, and with only primal tensors inside one, the
    calls run as before (here: to the CPU device error)."""
    import torch.autograd.forward_ad as fwAD

    b, q, k, x, w, sc, base, qq, kk, wq, wk = _small_cpu_inputs()
    with fwAD.dual_level():
        calls = [
            lambda d: cute_kernels.ranker_attention(d(q), k, k, b),
            lambda d: cute_kernels.ranker_attention(q, k, d(k), b, return_lse=True),
            lambda d: cute_kernels.hc_mix_sinkhorn(x, d(w), sc, base),
            lambda d: cute_kernels.qk_rmsnorm_(d(qq), kk, wq, wk, 1e-6),
            lambda d: cute_kernels.scale(d(x), 2.0),
            lambda d: cute_kernels.ranker_attention_backward(q, k, k, q, torch.zeros(1, 2, 16), d(q), b),
        ]
        for i, call in enumerate(calls):
            with pytest.raises(NotImplementedError, match="forward-mode AD") as info:
                call(lambda t: fwAD.make_dual(t, torch.randn_like(t)))
            assert (".backward()" in str(info.value)) == (i < 2), str(info.value)
            with pytest.raises(ValueError, match="CUDA"):  # primal tensors inside the level: no refusal
                call(lambda t: t)


def test_forward_mode_ad_is_refused_by_the_registered_ops_too():
    """``torch.ops.cute_kernels.*`` called directly with a dual tensor raise too (session 73): torch's custom ops
    have no forward-mode formula, so they ran and dropped the tangent silently (the registered forward's
    autograd formula included) where only the public wrappers refused it.  Primal tensors inside the level
    run as before (here: to the CPU device error)."""
    import torch.autograd.forward_ad as fwAD

    from cute_kernels.kernels import hc_mix, qknorm, qknorm_tp, ranker_bwd, ranker_fwd, scale  # noqa: F401

    b, q, k, x, w, sc, base, qq, kk, wq, wk = _small_cpu_inputs()
    ops = torch.ops.cute_kernels
    with fwAD.dual_level():
        calls = {
            "ranker_attention_fwd": lambda d: ops.ranker_attention_fwd(d(q), k, k, b),
            "ranker_attention_bwd": lambda d: ops.ranker_attention_bwd(q, k, k, q, torch.zeros(1, 2, 16), d(q), b),
            "hc_mix_sinkhorn": lambda d: ops.hc_mix_sinkhorn(x, d(w), sc, base),
            "qk_rmsnorm_": lambda d: ops.qk_rmsnorm_(d(qq), kk, wq, wk, 1e-6),
            "scale": lambda d: ops.scale(d(x), 2.0),
        }
        for name, call in calls.items():
            with pytest.raises(NotImplementedError, match=f"cute_kernels.{name} does not support forward-mode AD"):
                call(lambda t: fwAD.make_dual(t, torch.randn_like(t)))
            with pytest.raises(ValueError, match="CUDA"):
                call(lambda t: t)
        with pytest.raises(NotImplementedError, match="parallel_qk_rmsnorm_ does not support forward-mode AD"):
            ops.parallel_qk_rmsnorm_(fwAD.make_dual(qq, torch.randn_like(qq)), kk, wq, wk, 1e-6, 5)


def test_config_field_type_error_names_a_numpy_type():
    """A NumPy bool in a config's bool field: the message names numpy's type, not a bare 'bool'."""
    import dataclasses

    import numpy as np

    from cute_kernels.kernels import ranker_bwd as rb

    with pytest.raises(TypeError, match=r"\(numpy\.\w+\): must be a bool"):
        dataclasses.replace(rb.CONFIGS[128], deterministic=np.bool_(True)).validate()


def test_a_tensor_without_data_is_refused():
    """A non-empty tensor whose data pointer is 0 (its storage freed by ``resize_(0)``, as FSDP frees parameter
    shards) would make a kernel fault and take the CUDA context down: refused; an empty one is fine."""
    from cute_kernels.runtime.validate import check_tensor

    t = torch.zeros(4, 8, dtype=torch.bfloat16)
    t.untyped_storage().resize_(0)
    assert t.data_ptr() == 0 and t.numel() == 32
    with pytest.raises(ValueError, match="t has no data"):
        check_tensor("t", t, cuda=False)
    check_tensor("t", t, cuda=False, data_pointer=False)  # (fake tensors at trace time: strides only)
    check_tensor("e", torch.zeros(0, 8, dtype=torch.bfloat16), cuda=False)


def test_scalars_known_only_when_the_graph_runs():
    """A scalar from a tensor's ``.item()`` under torch.compile (``capture_scalar_outputs``): Dynamo shows it as a
    plain float, which no custom op's float argument takes.  With ``fullgraph=True`` our ValueError names the
    argument (it failed inside torch's sympy before session 69, comparing the value against its range); without
    it, Dynamo breaks the graph there and the call runs eagerly, with the value (here on CPU tensors, so the
    eager call's device error).  An int from ``.item()`` (a packed call's ``max_seqlen``) passes once
    ``torch._check`` bounds it, as docs/torch.md says, and the error says so otherwise.  Constants under
    torch.compile are checked as before."""
    q = torch.zeros(1, 128, 2, 64, device="meta", dtype=torch.bfloat16)
    bounds = torch.zeros(1, 4, dtype=torch.int32, device="meta")
    scale = torch.tensor(0.125, device="meta")
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            def from_item(q, s):
                return cute_kernels.ranker_attention(q, q, q, bounds, softmax_scale=s.item())

            with pytest.raises(Exception, match="known only when the compiled graph runs"):
                torch.compile(from_item, fullgraph=True, backend="eager")(q, scale)

            def scaled(x, s):
                return cute_kernels.scale(x, s.item())

            with pytest.raises(ValueError, match="CUDA device"):  # (eager after the graph break)
                torch.compile(scaled, backend="eager")(torch.ones(8, dtype=torch.bfloat16), torch.tensor(2.0))

            packed = torch.zeros(300, 2, 64, dtype=torch.bfloat16)
            cu = torch.tensor([0, 100, 300], dtype=torch.int32)
            packed_bounds = torch.tensor([[0, 50, 50, 100], [0, 150, 150, 200]], dtype=torch.int32)

            def packed_call(checked):
                def call(q, cu):
                    m = (cu[1:] - cu[:-1]).max().item()
                    if checked:  # (docs/torch.md: bounded, an int the trace can decide, which the op takes)
                        torch._check(m >= 0)  # (the bounds the error names)
                        torch._check(m <= 2**31 - 1)
                    return cute_kernels.ranker_attention(q, q, q, packed_bounds, cu_seqlens=cu, max_seqlen=m)
                return torch.compile(call, fullgraph=True, backend="eager")

            with pytest.raises(Exception, match=r"max_seqlen is a value known only .* torch\._check"):
                packed_call(False)(packed, cu)
            torch._dynamo.reset()
            with pytest.raises(ValueError, match="CUDA device"):  # (traced; refused when the graph runs on CPU)
                packed_call(True)(packed, cu)

            def constant(q, s):
                return cute_kernels.ranker_attention(q, q, q, bounds, softmax_scale=s)

            with pytest.raises(Exception, match="softmax_scale is not finite or out of its range"):
                torch.compile(constant, fullgraph=True, backend="eager")(q, -1.0)
            assert torch.compile(constant, fullgraph=True, backend="eager")(q, 0.125).shape == q.shape
    finally:
        torch._dynamo.reset()
