"""Vectorized scale ``y = alpha * x``: the smallest kernel that exercises the whole path.

It exists to prove the pipeline every other kernel uses: CPU compile for sm_90a, the on-disk
compile cache, a tvm-ffi call from torch on the current stream, the custom op, and the GPU check.

Design: one CTA of ``threads`` threads covers ``threads * vec * unroll`` elements; each thread
loads ``unroll`` 16-byte vectors (``vec = 128 / dtype bits`` elements) with predicates for the
ragged tail, scales in float32, and stores 16-byte vectors.  The PTX must show ``ld.global.v4``
and ``st.global.v4``.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32

from ..registry import CheckResult, CompileTarget
from ..runtime.cache import compile_cached
from ..runtime.fake import cute_dtype, fake_stream, fake_tensor
from ..runtime.torch_op import custom_op
from ..runtime.validate import (ValidatedConfig, check_config_fields, check_float_tensors, check_real, check_tensor,
                                exceeds)

NAME = "scale"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class ScaleConfig(ValidatedConfig):
    """Tile of the scale kernel: ``threads`` per CTA, ``unroll`` 16-byte vectors per thread."""

    threads: int = 128
    unroll: int = 4

    def validate(self) -> None:
        """``TypeError`` for a field that is not an int, ``ValueError`` (with the rule) for a value out of range."""
        check_config_fields(self)
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"threads={self.threads}: must be a multiple of 32 in [32, 1024]")
        if self.unroll < 1 or self.unroll > 16:
            raise ValueError(f"unroll={self.unroll}: must be in [1, 16]")


_CONFIG = ScaleConfig()  # the one config: compiled for every dtype, launched by scale()


class ScaleKernel:
    """``y[i] = alpha * x[i]`` over a flat, 16-byte aligned tensor of any length."""

    def __init__(self, dtype: type[cutlass.Numeric], config: ScaleConfig):
        self.dtype = dtype
        self.config = config
        self.vec = 128 // dtype.width

    @cute.jit
    def __call__(self, mX: cute.Tensor, mY: cute.Tensor, alpha: Float32, stream):
        thr_layout = cute.make_layout(self.config.threads)
        val_layout = cute.make_layout(self.vec)
        tile = self.config.threads * self.vec * self.config.unroll
        gX = cute.zipped_divide(mX, (tile,))  # ((tile), (num_tiles))
        gY = cute.zipped_divide(mY, (tile,))
        cX = cute.zipped_divide(cute.make_identity_tensor(mX.shape), (tile,))
        self.kernel(gX, gY, cX, mX.shape[0], alpha, thr_layout, val_layout).launch(
            grid=[cute.size(gX, mode=[1]), 1, 1], block=[self.config.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, gX: cute.Tensor, gY: cute.Tensor, cX: cute.Tensor, n: Int32, alpha: Float32,
               thr_layout: cute.Layout, val_layout: cute.Layout):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        copy_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        thr_copy = cute.make_tiled_copy_tv(copy_atom, thr_layout, val_layout).get_slice(tidx)
        tXgX = thr_copy.partition_S(gX[None, bidx])  # (vec, unroll)
        tXgY = thr_copy.partition_D(gY[None, bidx])
        tXcX = thr_copy.partition_S(cX[None, bidx])
        tXrX = cute.make_fragment_like(tXgX)
        tXrX.fill(0)
        in_bounds = cute.make_rmem_tensor(cute.make_layout(self.config.unroll), cutlass.Boolean)
        for i in cutlass.range_constexpr(self.config.unroll):
            in_bounds[i] = cute.elem_less(tXcX[(0, i)], (n,))  # n % vec == 0 (host check)
        for i in cutlass.range_constexpr(self.config.unroll):
            if in_bounds[i]:
                cute.copy(copy_atom, tXgX[None, i], tXrX[None, i])
        tXrY = cute.make_fragment_like(tXgY)
        tXrY.store((tXrX.load().to(Float32) * alpha).to(self.dtype))
        for i in cutlass.range_constexpr(self.config.unroll):
            if in_bounds[i]:
                cute.copy(copy_atom, tXrY[None, i], tXgY[None, i])


def _compile(dtype: torch.dtype, config: ScaleConfig):
    def build():
        n = cute.sym_int(divisibility=128 // (torch.finfo(dtype).bits))
        return ScaleKernel(cute_dtype(dtype), config), (
            fake_tensor(dtype, (n,)), fake_tensor(dtype, (n,)), Float32(1.0), fake_stream())

    return compile_cached(NAME, (str(dtype), config), build)


def compile_targets() -> list[CompileTarget]:
    return [CompileTarget(NAME, f"{str(d).replace('torch.', '')} {_CONFIG}", (str(d), _CONFIG),
                          build=lambda d=d: _compile(d, _CONFIG)) for d in DTYPES]


def shipped_configs() -> dict[str, ScaleConfig]:
    """``{label: config}`` of the compile targets (``cute-kernels configs``): the one config, per dtype."""
    return {str(d).replace("torch.", ""): _CONFIG for d in DTYPES}


def _check_x(x: torch.Tensor, cuda: bool = True, pointers: bool = True) -> torch.Tensor:
    """The checks of ``x``; returns its flat view (x itself when 1-D), which the kernel reads."""
    one_dim = isinstance(x, torch.Tensor) and x.dim() == 1
    check_tensor("x", x, dtypes=DTYPES, cuda=cuda, data_pointer=pointers, align_bytes=16 if one_dim else 0)
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous, got strides {x.stride()}")
    flat = x if one_dim else x.view(-1)
    if not one_dim:  # the flat view's 16-byte alignment counts, not each row's length in bytes
        check_tensor("x", flat, cuda=False, data_pointer=pointers)
    vec = 16 // x.element_size()
    if x.numel() % vec:
        raise ValueError(f"x.numel()={x.numel()} must be a multiple of {vec} (16-byte vectors)")
    if exceeds(x.numel(), 2**31 - 1):  # the kernel's element count is a 32-bit integer (symbolic: see exceeds)
        raise ValueError(f"x.numel()={x.numel()} must be below 2**31 (32-bit element count); split the call")
    return flat


_FNS: dict = {}  # dtype -> the compiled function of _CONFIG (the eager call's lookup: no config or key to build)


def _scale_impl(x: torch.Tensor, alpha: float) -> torch.Tensor:
    check_real("alpha", alpha)
    x_flat = _check_x(x)  # (the kernel takes flat tensors: x itself when 1-D, no view's host time)
    y = torch.empty_like(x)
    if x.numel():
        fn = _FNS.get(x.dtype)
        if fn is None:
            fn = _FNS[x.dtype] = _compile(x.dtype, _CONFIG)
        fn(x_flat, y if x_flat is x else y.view(-1), float(alpha))
    return y


def _fake(x, alpha):
    check_real("alpha", alpha)  # (the registered op's own path: the public wrapper's precheck is not on it)
    _check_x(x, cuda=False, pointers=False)  # at trace time: the rules a fake tensor allows
    return torch.empty_like(x)


@custom_op("scale", mutates_args=(), fake=_fake,
           precheck=lambda x, alpha: check_real("alpha", alpha))
def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """``alpha * x`` computed in float32 and rounded to ``x.dtype``.

    Args:
        x: CUDA tensor, float16/bfloat16/float32, contiguous, 16-byte aligned, ``numel`` a
            multiple of 16 bytes' worth of elements (8 for 16-bit types, 4 for float32) and below 2**31.
        alpha: real number (not bool / str), finite in float32.
    Returns:
        A new tensor like ``x``.
    Raises:
        TypeError: wrong dtype; alpha not a real number.  ValueError: not CUDA, not contiguous,
        misaligned, bad length (including ``numel >= 2**31``); alpha not finite in float32.
        RuntimeError: in ``backward()`` when ``x`` required grad (the op has no autograd formula: torch
        raises rather than dropping the gradient); a tensor on a GPU that is not a Hopper (sm_90) GPU, or a
        process whose CuTe DSL targets another arch (at the call).
    The foundation kernel (the pipeline every other kernel uses): a plain elementwise product, no paper.
    """
    return _scale_impl(x, alpha)


def scale_reference(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """float32 reference of :func:`scale`: ``alpha * x`` in float32, rounded to ``x.dtype``.

    ``x``: a tensor of any shape, float dtype and device; ``alpha``: as for :func:`scale` (a real
    number, finite in float32: ``TypeError`` / ``ValueError`` otherwise; a non-float ``x``:
    ``TypeError``)."""
    check_float_tensors(x=x)
    check_real("alpha", alpha)
    return (x.float() * alpha).to(x.dtype)


def check() -> list[CheckResult]:
    rows = []
    for dtype in DTYPES:
        for n in (8, 8 * 1000 + 8, 1 << 24):
            x = torch.randn(n, device="cuda", dtype=dtype)
            alpha = float(torch.randn(()).item())
            y = scale(x, alpha)
            ref = scale_reference(x, alpha)
            err = (y.float() - ref.float()).abs().max().item()
            rel = err / max(ref.float().abs().max().item(), 1e-30)
            rows.append(CheckResult(NAME, f"{str(dtype)[6:]} n={n}", err == 0.0, err, rel, 0.0))
    return rows


def bench_shapes(shapes: str | None) -> None:
    """:func:`bench` takes no ``shapes`` spec: ``ValueError`` unless it is None."""
    from ..registry import no_spec

    no_spec(NAME, shapes, 'n = 2^12, 2^20, 2^28')


def bench(shapes: str | None = None) -> list[dict]:
    """``cute-kernels bench --kernel scale``: :func:`scale` by 2 against ``x * 2.0`` on bf16 vectors of 2^12, 2^20
    and 2^28 elements, each in a CUDA graph and eager, after :data:`~cute_kernels.runtime.timing.SETTLE_S` seconds
    of calls.  One record per (n, impl, mode): ``time_us`` (median per call) and ``gbps`` (bytes read and written
    over that time).  Needs a CUDA device; ``ValueError`` for a ``shapes`` spec."""
    bench_shapes(shapes)
    from ..runtime.timing import SETTLE_S, cuda_time_us

    recs = []
    for n in (1 << 12, 1 << 20, 1 << 28):
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        nbytes = 2 * x.numel() * x.element_size()
        for impl, fn in (("cute_kernels", lambda: scale(x, 2.0)), ("torch", lambda: x * 2.0)):
            for graph in (True, False):
                t = cuda_time_us(fn, graph=graph, settle_s=SETTLE_S)
                recs.append(dict(kernel=NAME, impl=impl, shape=dict(n=n, dtype="bfloat16"),
                                 mode="graph" if graph else "eager", time_us=t, gbps=nbytes / t / 1e3,
                                 settle_s=SETTLE_S))
    return recs
