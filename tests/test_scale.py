"""The tiny scale kernel: CPU compile for sm_90a, PTX/SASS features, reference, validation."""

import pytest
import torch

import cute_kernels
from cute_kernels.kernels import scale as mod
from cute_kernels.runtime.cache import compile_record


@pytest.mark.parametrize("target", mod.compile_targets(), ids=lambda t: t.label)
def test_compiles_with_16_byte_vectors(target):
    target.build()
    rec = compile_record(target.kernel, target.key)
    assert ".target sm_90a" in rec.ptx
    assert "ld.global.v4 (16B loads)" in rec.ptx_features
    assert "st.global.v4 (16B stores)" in rec.ptx_features
    assert "local memory (spill)" not in rec.ptx_features
    if rec.sass:
        assert "LDG.E.128" in rec.sass_features and "STG.E.128" in rec.sass_features


def test_reference():
    x = torch.tensor([1.0, -2.0, 3.5, 0.0], dtype=torch.bfloat16)
    assert torch.equal(cute_kernels.scale_reference(x, 2.0), torch.tensor([2.0, -4.0, 7.0, 0.0], dtype=torch.bfloat16))


def test_validation_before_launch():
    with pytest.raises(TypeError, match="dtype float64"):
        cute_kernels.scale(torch.zeros(8, dtype=torch.float64), 1.0)
    with pytest.raises(ValueError, match="CUDA device"):
        cute_kernels.scale(torch.zeros(8, dtype=torch.float16), 1.0)


def test_short_rows_of_a_contiguous_x_are_accepted():
    """The kernel reads x flat: a contiguous x whose rows are shorter than 16 bytes (bf16 [4, 4], float32 [2, 2])
    passes, as the docstring promises (it was refused as "stride 4 in dim 0 is not a multiple of 16 bytes; pass a
    contiguous tensor"); a non-contiguous one and a misaligned flat view still fail (meta tensors: every check but
    the data pointer's)."""
    for shape, dtype in (((4, 4), torch.bfloat16), ((8, 2), torch.bfloat16), ((2, 3, 4), torch.bfloat16),
                         ((2, 2), torch.float32)):
        x = torch.empty(*shape, dtype=dtype, device="meta")
        assert cute_kernels.scale(x, 2.0).shape == shape
    with pytest.raises(ValueError, match="contiguous"):
        cute_kernels.scale(torch.empty(4, 16, dtype=torch.bfloat16, device="meta")[:, :8], 2.0)
    with pytest.raises(ValueError, match="multiple of 8"):
        cute_kernels.scale(torch.empty(5, 3, dtype=torch.bfloat16, device="meta"), 2.0)


def test_config_validation():
    with pytest.raises(ValueError, match="multiple of 32"):
        mod.ScaleConfig(threads=100).validate()
    with pytest.raises(ValueError, match="unroll"):
        mod.ScaleConfig(unroll=0).validate()
    for bad in (dict(threads=128.0), dict(unroll=2.5), dict(unroll="4"), dict(unroll=True)):
        with pytest.raises(TypeError, match=next(iter(bad))):
            mod.ScaleConfig(**bad).validate()


def test_reference_checks_alpha_like_the_op():
    import torch

    from cute_kernels.kernels import scale as mod

    for bad, exc in ((float("nan"), ValueError), (True, TypeError), (1e39, ValueError), (-1e39, ValueError)):
        with pytest.raises(exc, match="alpha"):
            mod.scale_reference(torch.ones(8), bad)
    assert torch.equal(mod.scale_reference(torch.ones(8, dtype=torch.bfloat16), 0.5), torch.full((8,), 0.5).bfloat16())


def test_element_count_must_fit_32_bits():
    x = torch.empty(2**31, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="below 2\\*\\*31"):
        mod._fake(x, 2.0)
    assert mod._fake(torch.empty(2**31 - 8, dtype=torch.bfloat16, device="meta"), 2.0).shape == (2**31 - 8,)


@pytest.mark.parametrize("alpha", [float("nan"), float("inf")])
def test_registered_op_checks_alpha_on_meta_tensors(alpha):
    """torch.ops.cute_kernels.scale (the registered op, which the public wrapper's precheck does not guard)
    refuses a non-finite alpha at trace time, as the other ops' fakes refuse their bad scalars."""
    cute_kernels.register_ops()
    x = torch.empty(1024, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="alpha"):
        torch.ops.cute_kernels.scale(x, alpha)


def test_meta_tensors_by_keyword_take_the_op():
    """A keyword call whose first keyword is a scalar still sees its meta tensors (session 50's newcomer review:
    the wrapper took the first keyword value as the tensor to test and sent the call to the eager impl, which
    refused the meta device); the in-place Q/K norm alike."""
    m = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")  # noqa: E731
    out = cute_kernels.scale(alpha=2.0, x=m(64))
    assert out.is_meta and out.shape == (64,)
    assert cute_kernels.qk_rmsnorm_(eps=1e-6, q=m(4, 128), k=m(4, 64), q_weight=m(128), k_weight=m(64)) is None


def test_eager_call_looks_up_the_compiled_function_once_per_dtype(monkeypatch):
    """The eager path compiles (or loads) once per dtype and then reuses the function; a 1-D x goes to the kernel
    as it is, any other shape as a flat view of the same storage; ``y`` is new, shaped like x."""
    compiled, launched = [], []

    def fake_compile(dtype, config):
        compiled.append((dtype, config))
        return lambda x, y, alpha: launched.append((x.shape, x.data_ptr(), y.shape, alpha))

    monkeypatch.setattr(mod, "_compile", fake_compile)
    monkeypatch.setattr(mod, "_FNS", {})
    check_x = mod._check_x
    monkeypatch.setattr(mod, "_check_x", lambda x: check_x(x, cuda=False, pointers=False))  # (no GPU here)
    flat = torch.zeros(64, dtype=torch.bfloat16)
    cube = torch.zeros(2, 4, 8, dtype=torch.bfloat16)
    assert mod._scale_impl(flat, 2.0).shape == (64,) and mod._scale_impl(cube, 3).shape == (2, 4, 8)
    mod._scale_impl(torch.zeros(8, dtype=torch.float32), 0.5)
    assert compiled == [(torch.bfloat16, mod.ScaleConfig()), (torch.float32, mod.ScaleConfig())]
    assert launched == [((64,), flat.data_ptr(), (64,), 2.0), ((64,), cube.data_ptr(), (64,), 3.0),
                        ((8,), launched[2][1], (8,), 0.5)]
    assert all(isinstance(a, float) for *_, a in launched)
