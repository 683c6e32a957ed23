"""Hyper-connection mix statistics + Sinkhorn (DeepSeek mHC, seed 001): the torch op :func:`hc_mix_sinkhorn`,
its argument rules, launch glue, float64 reference, check and bench.  Its two kernels: ``method="tma"`` (the
default), :mod:`.hc_mix_tma`; ``method="walk"``, :mod:`.hc_mix_walk`; what they share, :mod:`.hc_mix_shared`.

For each row of ``x [M, K]`` (bf16) this computes the manifold-constrained hyper-connection
coefficients (mHC, arXiv 2512.24880; seed ``001_ea94da0ccc866503``), hc_mult = 4:

    a   = x . hc_fn^T                      (24 values, float32-accurate)
    r   = 1 / sqrt(sum(x^2) / K + rms_eps)
    pre  = sigmoid(a[0:4] * r * hc_scale[0] + hc_base[0:4]) + hc_eps
    post = 2 * sigmoid(a[4:8] * r * hc_scale[1] + hc_base[4:8])
    comb = sinkhorn(a[8:24] * r * hc_scale[2] + hc_base[8:24])  (4x4, row-major; the exact
           steps, with hc_eps, are in :func:`hc_mix_sinkhorn`'s docstring)

The two kernels differ in their bits (each is bitwise deterministic and batch invariant: the same row gives the
same bits for every M, config and run); their modules give their designs, reduction orders and figures.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from ..registry import CheckResult, CompileTarget
from ..runtime.torch_op import custom_op, register_flops, without_autocast
from ..runtime.validate import (INT32_MAX, aligned_data, check_f32_eps, check_float_tensors, check_int,
                                check_same_device, check_distinct_rows, check_extent, check_tensor, element_span,
                                exceeds, shown, validated_once)
from . import hc_mix_walk as walk
from .hc_mix_shared import HC, K_ALIGN, N_MIX, N_PIECES, SP_COLS

NAME = "hc_mix"
MAX_ROWS = 65535 * 16  # rows of x: 65535 row blocks of 16 (the grid's y limit)
MAX_K = (INT32_MAX // N_MIX) // K_ALIGN * K_ALIGN  # hc_fn [24, K] spans < 2**31 elements


# ---------------------------------------------------------------------- compile + torch glue
def compile_targets() -> list[CompileTarget]:
    """The configs ``method="tma"`` (the default) picks (hc_mix_tma.config_for), first, then the walk's shipped
    configs, so ``cute-kernels compile --kernel hc_mix`` prebuilds both methods."""
    from . import hc_mix_tma

    tma = {}  # config -> an M that picks it (the full configs: ``cute-kernels configs --kernel hc_mix``)
    for m in hc_mix_tma.LEVEL_EXAMPLE_M:
        tma.setdefault(hc_mix_tma.config_for(m), m)
    return ([CompileTarget(hc_mix_tma.NAME, f"method=tma cta_level={c.cta_level} (M={m})", c,
                           build=lambda c=c: hc_mix_tma._compile(c)) for c, m in tma.items()]
            + [CompileTarget(NAME, f"method=walk tile_m={c.tile_m} warps_m={c.warps_m} stages={c.stages}", c,
                             build=lambda c=c: walk._compile(c)) for c in walk.SHIPPED])


def shipped_configs() -> dict:
    """``{label: config}`` (``cute-kernels configs``): the walk's shipped configs (:data:`.hc_mix_walk.SHIPPED`),
    then the six that ``method="tma"`` (the default) picks, one per CTA level, labelled by an M that gets it and
    the M range that gets the same pick (other M: ``hc_mix_tma.config_for``)."""
    from . import hc_mix_tma

    out = {"method=walk M<=256": walk.SMALL, "method=walk M>256": walk.MEDIUM,
           "method=walk LARGE (never picked: slower)": walk.LARGE}
    for m in hc_mix_tma.LEVEL_EXAMPLE_M:
        lo, hi = hc_mix_tma.level_range(m)
        out[f"method=tma (default) M={m} (the same pick for M {lo}-{hi}; other M: config_for)"] = \
            hc_mix_tma.config_for(m)
    return out


def _check_scalars(sinkhorn_iters, rms_eps, hc_eps) -> None:
    """``sinkhorn_iters`` an int (not bool / float) in [1, 2**31 - 1] (the kernel's Int32 loop count);
    ``rms_eps`` and ``hc_eps`` real numbers (not bool / str), finite in float32, >= 0, and 0 or at least
    float32's smallest normal 2**-126 (the kernels take them as float32).
    ``TypeError`` for a wrong type, ``ValueError`` for a bad value, each naming the argument."""
    check_int("sinkhorn_iters", sinkhorn_iters, low=1)
    check_f32_eps("rms_eps", rms_eps)
    check_f32_eps("hc_eps", hc_eps)


def _check_k(name: str, k: int) -> None:
    """K (``name``: where it was read) a positive multiple of :data:`K_ALIGN` and at most :data:`MAX_K`
    (``ValueError``)."""
    if k % K_ALIGN or k == 0:
        raise ValueError(f"{name}={k} must be a positive multiple of {K_ALIGN}")
    if k > MAX_K:
        raise ValueError(f"{name}={k}: at most {MAX_K} (both kernels take hc_fn's sizes and strides as 32-bit "
                         f"integers and index it with 32-bit offsets: hc_fn [{N_MIX}, K] must span fewer than 2**31 "
                         "elements)")


def _validate(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps=1e-6, hc_eps=1e-6, cuda: bool = True,
              pointers: bool = True):
    """Every argument rule; ``pointers=False`` skips the data-pointer alignment checks (fake tensors at
    trace time have no data pointers; the strides are checked)."""
    _check_scalars(sinkhorn_iters, rms_eps, hc_eps)
    check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2, cuda=cuda, align_bytes=0)
    k = x.shape[1]
    _check_k("x.shape[1]", k)
    check_tensor("x", x, cuda=cuda, data_pointer=pointers)  # then the alignment of pointer and row stride
    check_distinct_rows("x", x, "not supported (the kernels' loads were tested on distinct rows only); pass "
                             "x.contiguous()")
    if isinstance(hc_fn, torch.Tensor) and hc_fn.dtype == torch.bfloat16 and hc_fn.dim() == 2 \
            and hc_fn.shape[0] == N_PIECES * N_MIX:
        raise TypeError("hc_fn is a [72, K] bf16 tensor, the pieces the removed hc_mix_split_weights made; the "
                        "kernels split hc_fn themselves now: pass the float32 hc_fn [24, K]")
    check_tensor("hc_fn", hc_fn, dtypes=(torch.float32,), shape=(N_MIX, k), cuda=cuda, data_pointer=pointers)
    check_extent("hc_fn", hc_fn)  # (32-bit sizes and strides in both kernels; a padded row stride can pass 2**31)
    check_tensor("hc_scale", hc_scale, dtypes=(torch.float32,), shape=(3,), cuda=cuda, align_bytes=4,
                 data_pointer=pointers)
    check_tensor("hc_base", hc_base, dtypes=(torch.float32,), shape=(N_MIX,), cuda=cuda, align_bytes=4,
                 data_pointer=pointers)
    check_same_device(x=x, hc_fn=hc_fn, hc_scale=hc_scale, hc_base=hc_base)
    if exceeds(x.shape[0], MAX_ROWS):  # (symbolic sizes: only where the trace proves it)
        raise ValueError(f"x has {x.shape[0]} rows; at most {MAX_ROWS} supported")


_VALIDATED: dict = {}  # argument signature (shapes, strides, dtypes, devices, scalars, method) -> launch plan


def _validate_cached(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, method: str = "tma") -> tuple:
    """:func:`_validate` (and for ``method="walk"`` its 32-bit extent rule) once per argument signature
    (:func:`~cute_kernels.runtime.validate.validated_once`), and the call's launch plan kept with it
    (:func:`_plan`); later calls only re-check that the data pointers are aligned and not 0 (a freed
    storage: then the full check, which refuses it).  Returns the plan."""
    def check():
        _validate(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps)
        if method == "walk":
            _check_walk_extent(x)
        return _plan(x.shape[0], method)

    return validated_once(_VALIDATED, (x, hc_fn, hc_scale, hc_base), (sinkhorn_iters, rms_eps, hc_eps, method),
                          lambda: aligned_data(16, x, hc_fn) and aligned_data(4, hc_scale, hc_base), check)


def _plan(m: int, method: str) -> tuple:
    """``(compile_fn, workspace_rows)`` of an M-row call with ``method``'s default config (a function of M
    only: no tuning), for :func:`run_compiled`: what a signature fixes, so an eager call skips the config
    choice and the compiled-function lookup (about 3 us of host time on the H200's host, session 35).  Holds
    no device memory.  The compile itself waits for the first launch (M = 0 launches nothing)."""
    if method == "tma":
        from . import hc_mix_tma

        cfg, rows = hc_mix_tma.sized_config(m)
        return functools.cache(lambda: hc_mix_tma._compile(cfg)), rows
    cfg = walk.config_for(m, store_mix=False)
    return functools.cache(lambda: walk._compile(cfg)), None


def split_pieces(hc_fn: torch.Tensor) -> torch.Tensor:
    """``[72, K]`` bf16: row ``24 p + n`` = piece p (lo, mid, hi) of ``hc_fn[n]``.

    hi = rn(w), mid = rn(w - hi), lo = rn(w - hi - mid) (round to nearest even, exact differences):
    the same values as the kernels' split (:func:`.hc_mix_shared._split3_bf16x2`: in registers in the walk, into shared
    memory in :mod:`.hc_mix_tma`).  ``|hi + mid + lo - w| <= 2^-27 |w|`` for ``2^-110 <= |w| <= 3.39e38`` (bf16's
    largest finite value) and ``<= 2^-134`` below; a larger ``|w|`` gives an infinite hi (NaN in the sum).
    """
    hi = hc_fn.bfloat16()
    r1 = hc_fn - hi.float()
    mid = r1.bfloat16()
    lo = (r1 - mid.float()).bfloat16()
    return torch.cat([lo, mid, hi], 0).contiguous()


def run_compiled(compile_fn, x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, mix=None, out=None,
                 workspace_rows=None):
    """The launch glue both hc_mix kernels share: allocate ``pre [M, 4]``, ``post [M, 4]``,
    ``comb [M, 4, 4]`` float32 (or use ``out``: tests pass poisoned buffers) and, for M > 0, launch
    ``compile_fn()`` with ``mix`` (or a dummy row) as the raw-statistics buffer;
    ``workspace_rows``: rows of a ``[rows, 25]`` float32 workspace passed last (hc_mix_tma's).  Without
    ``mix`` the kernels are compiled not to touch the raw-statistics buffer (``store_mix`` off), so its
    dummy is the workspace's first row when there is one (no second allocation), else one row of its
    own (the outputs may not share memory: a custom op's outputs must not alias each other)."""
    m = x.shape[0]
    if out is not None:
        pre, post, comb = out
    else:
        pre = x.new_empty((m, HC), dtype=torch.float32)  # (new_empty: less host time than torch.empty(device=))
        post = x.new_empty((m, HC), dtype=torch.float32)
        comb = x.new_empty((m, HC, HC), dtype=torch.float32)
    if m:
        extra = () if workspace_rows is None else (x.new_empty((workspace_rows, SP_COLS), dtype=torch.float32),)
        if mix is None:
            mix = extra[0][:1] if extra else x.new_empty((1, SP_COLS), dtype=torch.float32)
        compile_fn()(x, hc_fn, hc_scale, hc_base, pre, post, comb.view(m, HC * HC), mix,
                     int(sinkhorn_iters), float(rms_eps), float(hc_eps), *extra)
    return pre, post, comb


WALK_MAX_OFFSET = INT32_MAX  # the walk indexes x with 32-bit element offsets
BENCH_K = 20480  # the bench's K (issue 7's shape)
BENCH_MAX_M = WALK_MAX_OFFSET // BENCH_K  # the most rows the bench's walk can take at that K


def _check_walk_extent(x: torch.Tensor) -> None:
    """The walk computes x's element offsets in 32 bits: refuse an x that spans more elements."""
    m = x.shape[0]
    span = element_span(x)  # (x's last dim is contiguous: (M - 1) * row stride + K)
    if exceeds(span, WALK_MAX_OFFSET):  # (symbolic sizes: only where the trace proves it)
        raise ValueError(f"x spans {span} elements (M={m}, row stride {x.stride(0)}); method='walk' indexes x "
                         f"with 32-bit offsets (at most {WALK_MAX_OFFSET}): use method='tma' or fewer rows per call")


def _launch(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, mix=None, config=None,
            out=None):
    """Launch on validated inputs; ``out`` = preallocated (pre, post, comb) (tests poison them)."""
    _check_walk_extent(x)
    store_mix = mix is not None  # (a config's store_mix without a mix buffer would write past the dummy row)
    cfg = walk.config_for(x.shape[0], store_mix=store_mix) if config is None else \
        config if config.store_mix == store_mix else dataclasses.replace(config, store_mix=store_mix)
    return run_compiled(lambda: walk._compile(cfg), x, hc_fn, hc_scale,
                        hc_base, sinkhorn_iters, rms_eps, hc_eps, mix=mix, out=out)


METHODS = ("walk", "tma")  # not "kernel": inductor's FallbackKernel.create takes that name


def _check_method(method) -> None:
    if not isinstance(method, str):  # (TypeError, as ranker_attention's cap_method)
        raise TypeError(f"method must be a str, one of {METHODS}; got {shown(method)}")
    if method not in METHODS:
        raise ValueError(f"method={method!r}: must be one of {METHODS}")


def _fake(x, hc_fn, hc_scale, hc_base, sinkhorn_iters=20, rms_eps=1e-6, hc_eps=1e-6, method="tma"):
    _check_method(method)
    _validate(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, cuda=False, pointers=False)
    if method == "walk":
        _check_walk_extent(x)  # shapes and strides only: the same error at trace time
    m = x.shape[0]
    return (x.new_empty(m, HC, dtype=torch.float32), x.new_empty(m, HC, dtype=torch.float32),
            x.new_empty(m, HC, HC, dtype=torch.float32))


def _precheck(x, hc_fn, hc_scale, hc_base, sinkhorn_iters=20, rms_eps=1e-6, hc_eps=1e-6, method="tma"):
    _check_method(method)
    _check_scalars(sinkhorn_iters, rms_eps, hc_eps)


@custom_op("hc_mix_sinkhorn", mutates_args=(), fake=_fake, precheck=_precheck)
def hc_mix_sinkhorn(x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                    sinkhorn_iters: int = 20, rms_eps: float = 1e-6, hc_eps: float = 1e-6, method: str = "tma"
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mHC pre/post/comb coefficients of each row (DeepSeek mHC, arXiv 2512.24880; seed 001).

    Per row, with ``a = x . hc_fn^T`` (24 values) and ``r = 1 / sqrt(sum(x^2) / K + rms_eps)``::

        pre  = sigmoid(a[0:4] * r * hc_scale[0] + hc_base[0:4]) + hc_eps
        post = 2 * sigmoid(a[4:8] * r * hc_scale[1] + hc_base[4:8])
        C    = (a[8:24] * r * hc_scale[2] + hc_base[8:24]).view(4, 4)      # row-major
        C    = softmax(C, over each row) + hc_eps                          # every entry + hc_eps
        C    = C / (column sums of C + hc_eps)                             # column normalize
        repeat sinkhorn_iters - 1 times:
            C = C / (row sums of C + hc_eps)                               # row normalize
            C = C / (column sums of C + hc_eps)                            # column normalize
        comb = C

    (exactly :func:`hc_mix_sinkhorn_reference`; ``sinkhorn_iters = 1`` is the softmax and one
    column normalization).  The kernel computes every reciprocal (sigmoids, Sinkhorn) with ``rcp.approx``
    and ``r`` with ``rsqrt``: within a few float32 ulps of the IEEE forms (errors against float64 <= 4e-7).

    Args:
        x: ``[M, K]`` bfloat16 CUDA tensor, last dim contiguous, 16-byte aligned with a row stride that is a
            multiple of 16 bytes and at least K (rows must not overlap), K a multiple of 64 and at most
            89478464 (hc_fn ``[24, K]`` spans fewer than 2**31 elements),
            ``0 <= M <= 1048560`` (65535 row blocks of 16: the grid's y limit); ``method="walk"`` also
            needs ``(M - 1) * row stride + K < 2**31`` (32-bit offsets; M < 104858 at K = 20480).
        hc_fn: ``[24, K]`` float32 (mix weights: 4 pre, 4 post, 16 comb), last dim contiguous, row
            stride a multiple of 16 bytes (4 elements), 16-byte aligned, spanning fewer than 2**31 elements
            (both methods).
        hc_scale: ``[3]`` float32 (pre, post, comb scales).  hc_base: ``[24]`` float32 biases.  Both contiguous.
        sinkhorn_iters: int (not bool / float) in ``[1, 2**31 - 1]``.
        rms_eps, hc_eps: real numbers (not bool), finite (float32 range), ``>= 0``, and 0 or ``>= 2**-126``
            (a smaller value would become 0 in float32).  With
            ``rms_eps = 0`` an all-zero row has ``r = inf`` and gives NaN, as the formula does.
        method: ``"tma"`` (default; :mod:`.hc_mix_tma`: TMA + WGMMA, faster at every M measured on
            the H200: 9.1-9.4 us instead of 12.2-12.9 at M <= 128 (session 35), about 2x from M = 512 up; a
            hidden float32 workspace of 100 bytes x CTAs per row tile for every row of the 128-row tiles:
            819 KB at M = 1, 6.4 KB per row up to M = 256, 3.2 KB up to 512, 400 B per row at 4096)
            or ``"walk"`` (:mod:`.hc_mix_walk`'s per-thread K walk, the default until session 7).  Each is batch
            invariant on its own but their bits differ: pick one per deployment and keep it.
    Returns:
        ``pre [M, 4]``, ``post [M, 4]``, ``comb [M, 4, 4]``, float32.  ``a = x . hc_fn^T`` is
        float32-accurate (bf16x3 tensor-core products); each row's bits are independent of M.
    Raises:
        TypeError: wrong tensor dtype; sinkhorn_iters not an int; rms_eps / hc_eps not real numbers; method
            not a str.
        ValueError: wrong shape, device, alignment, strides or K, rows of x that overlap; sinkhorn_iters out of
            range; rms_eps /
            hc_eps negative, not finite or below 2**-126 (but not 0); a method other than ``"walk"`` and
            ``"tma"``; x too large for the walk's 32-bit offsets; hc_fn spanning 2**31 elements or more.
        RuntimeError: in ``backward()`` when an input required grad: forward only (the op has no autograd
            formula: torch raises its "no autograd formula" error rather than dropping the gradient);
            a tensor on a GPU that is not a Hopper (sm_90) GPU, or a process whose CuTe DSL targets another
            arch (at the call).
    FLOP counting: ``torch.utils.flop_counter.FlopCounterMode`` counts the mix GEMM, ``2 * M * K * 24`` (a counter made
    before this module loaded and entered after misses it; one active while it loads, e.g. around the first
    call, or made after ``cute_kernels.register_ops()`` counts it).
    Weights: both methods multiply x by hc_fn split into three bf16 pieces (hi + mid + lo) inside the kernel, on
    every call, from the float32 hc_fn in memory: a weight changed by any means (an optimizer step, fused or not,
    a collective, a write through ``.data``) is always seen, in CUDA graphs and under torch.compile too.
    """
    _check_method(method)
    compiled, workspace_rows = _validate_cached(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps, method)
    return run_compiled(compiled, x, hc_fn, hc_scale, hc_base, sinkhorn_iters, rms_eps, hc_eps,
                        workspace_rows=workspace_rows)


def _flops(x_shape, hc_fn_shape, *args, out_shape=None, **kwargs) -> int:
    """``torch.utils.flop_counter.FlopCounterMode``'s count of the op: the mix GEMM ``x [M, K] . hc_fn^T [K, 24]``,
    2 FLOPs per multiply-add (the bf16x3 split's three products and the per-row epilogue not counted)."""
    m, k = x_shape
    return 2 * m * k * N_MIX


register_flops(torch.ops.cute_kernels.hc_mix_sinkhorn, _flops)


def hc_mix_raw(x: torch.Tensor, hc_fn: torch.Tensor, config: walk.HcMixConfig | None = None):
    """Testing aid: the walk kernel's raw ``a [M, 24]`` and ``sum x^2 [M]`` (same reduction as the op's
    ``method="walk"``; :func:`.hc_mix_tma.hc_mix_sinkhorn_tma` takes ``mix=`` for the default).  Same
    argument rules as the op; ``config``: an :class:`.hc_mix_walk.HcMixConfig` or None."""
    if not isinstance(x, torch.Tensor) or not isinstance(hc_fn, torch.Tensor):
        raise TypeError(f"x and hc_fn must be torch.Tensors, got {type(x).__name__} and {type(hc_fn).__name__}")
    if config is not None and not isinstance(config, walk.HcMixConfig):
        raise TypeError(f"config must be an HcMixConfig, got {type(config).__name__}")
    _validate(x, hc_fn, torch.ones(3, device=x.device), torch.zeros(N_MIX, device=x.device), 1)
    m = x.shape[0]
    mix = torch.empty(max(m, 1), SP_COLS, dtype=torch.float32, device=x.device)
    _launch(x, hc_fn, torch.ones(3, device=x.device), torch.zeros(N_MIX, device=x.device), 1, 1e-6, 1e-6,
            mix=mix, config=config)
    return mix[:m, :N_MIX], mix[:m, N_MIX]


@without_autocast
def hc_mix_sinkhorn_reference(x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor,
                              hc_base: torch.Tensor, sinkhorn_iters: int = 20, rms_eps: float = 1e-6,
                              hc_eps: float = 1e-6, dtype: torch.dtype = torch.float64):
    """Reference of :func:`hc_mix_sinkhorn` in ``dtype`` (float64 by default, or float32; any device).

    Returns float32 ``pre [M, 4]``, ``post [M, 4]``, ``comb [M, 4, 4]`` (and computes in ``dtype``).
    The scalars follow the op's rules (``TypeError`` / ``ValueError`` naming the argument); the
    tensors may have any float dtype and any one device with data (all on it; not "meta"), but their
    shapes must be the op's (``x [M, K]``, ``hc_fn [24, K]``, ``hc_scale [3]``, ``hc_base [24]``, any
    K >= 1): ``ValueError`` otherwise.  As in the op, ``rms_eps = 0`` gives NaN on an all-zero row of ``x``
    (``0 * rsqrt(0)``), and the run time grows linearly with ``sinkhorn_iters`` (no cap beyond int32).
    ``dtype``: torch.float64 or torch.float32 (``TypeError`` otherwise).
    """
    _check_scalars(sinkhorn_iters, rms_eps, hc_eps)
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    check_float_tensors(x=x, hc_fn=hc_fn, hc_scale=hc_scale, hc_base=hc_base)
    check_same_device(x=x, hc_fn=hc_fn, hc_scale=hc_scale, hc_base=hc_base)
    if x.device.type == "meta":
        raise ValueError("the reference computes values: it needs tensors with data, not 'meta' ones")
    if x.dim() != 2 or x.shape[1] < 1:
        raise ValueError(f"x must be [M, K] with K >= 1, got {list(x.shape)}")
    if tuple(hc_fn.shape) != (N_MIX, x.shape[1]):
        raise ValueError(f"hc_fn must be [{N_MIX}, {x.shape[1]}], got {list(hc_fn.shape)}")
    if tuple(hc_scale.shape) != (3,) or tuple(hc_base.shape) != (N_MIX,):
        raise ValueError(f"hc_scale must be [3] and hc_base [{N_MIX}], got {list(hc_scale.shape)} and "
                         f"{list(hc_base.shape)}")
    pre, post, comb = _reference(x, hc_fn, hc_scale, hc_base, sinkhorn_iters, float(rms_eps), float(hc_eps), dtype)
    return pre.float(), post.float(), comb.float()


def _reference(x, hc_fn, hc_scale, hc_base, sinkhorn_iters=20, rms_eps=1e-6, hc_eps=1e-6,
               dtype=torch.float64):
    xd = x.to(dtype)
    a = xd @ hc_fn.to(dtype).t()
    k = x.shape[1]
    r = torch.rsqrt((xd * xd).sum(-1, keepdim=True) / k + rms_eps)
    scale = hc_scale.to(dtype)
    base = hc_base.to(dtype)
    pre = torch.sigmoid(a[:, :HC] * r * scale[0] + base[:HC]) + hc_eps
    post = 2 * torch.sigmoid(a[:, HC:2 * HC] * r * scale[1] + base[HC:2 * HC])
    c = (a[:, 2 * HC:] * r * scale[2] + base[2 * HC:]).view(-1, HC, HC)
    c = torch.softmax(c, dim=-1) + hc_eps
    c = c / (c.sum(-2, keepdim=True) + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        c = c / (c.sum(-1, keepdim=True) + hc_eps)
        c = c / (c.sum(-2, keepdim=True) + hc_eps)
    return pre, post, c


def check() -> list[CheckResult]:
    """Norm-wise error of ``a`` and max abs error of the outputs vs float64, K = 20480, both methods."""
    import math

    from . import hc_mix_tma

    rows = []
    for m in (1, 511, 4096):
        k = 20480
        x = torch.randn(m, k, device="cuda").bfloat16()
        hc_fn = torch.randn(N_MIX, k, device="cuda") / math.sqrt(k)
        hc_scale = torch.rand(3, device="cuda") + 0.5
        hc_base = torch.randn(N_MIX, device="cuda")
        a64 = x.double() @ hc_fn.double().t()
        mix = torch.empty(m, SP_COLS, device="cuda")
        hc_mix_tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base, mix=mix)
        for method, a in (("walk", hc_mix_raw(x, hc_fn)[0]), ("tma", mix[:, :N_MIX])):
            err_a = ((a.double() - a64).norm() / a64.norm()).item()
            rows.append(CheckResult(NAME, f"a method={method} M={m} K={k}", err_a <= 2e-6, float("nan"), err_a,
                                    2e-6))
        want = hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base)
        for method in METHODS:
            got = hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
            err = max((g.double() - w.double()).abs().max().item() for g, w in zip(got, want))
            rows.append(CheckResult(NAME, f"pre/post/comb method={method} M={m} K={k}", err <= 1e-5, err,
                                    float("nan"), 1e-5))
    return rows


def _splitk_baseline():
    """The split-K Triton baseline from ``bench/hc_mix_splitk_triton.py`` (None without Triton or
    without that file, e.g. in an installed package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "hc_mix_splitk_triton.py"
    try:
        spec = importlib.util.spec_from_file_location("hc_mix_splitk_triton", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.hc_mix_splitk_triton
    except (ImportError, FileNotFoundError):
        return None


BENCH_MS = (1, 16, 128, 512, 1024, 2048, 4096, 16384)


def bench_shapes(shapes: str | None) -> list[int]:
    """:func:`bench`'s ``shapes`` spec: comma-separated row counts ``1 <= M <= BENCH_MAX_M`` (None or
    empty: :data:`BENCH_MS`); ``ValueError`` for anything else."""
    if not shapes:
        return list(BENCH_MS)
    try:
        ms = [int(s) for s in shapes.split(",")]
    except ValueError:
        ms = []
    if not ms or min(ms) < 1 or max(ms) > BENCH_MAX_M:
        raise ValueError(f"bench --shapes for {NAME}: expected comma-separated row counts 1 <= M <= {BENCH_MAX_M} "
                         f"(K = {BENCH_K}; the bench times method='walk' too, whose offsets are 32-bit), e.g. "
                         f"'4096' or '1,512,4096'; got {shapes!r}")
    return ms


def bench(shapes: str | None = None) -> list[dict]:
    """us per call inside a CUDA graph (10 calls per replay) and GB/s of reading x once (M*K*2 B), each timing
    after :data:`~cute_kernels.runtime.timing.SETTLE_S` seconds of calls (the board's sustained clock, session 82).

    Ours: ``method="tma"`` (the default, impl ``cute_kernels_tma``; session 34's records also have
    ``cute_kernels_tma_pieces``, the pieces made beforehand, and their ``cute_kernels_tma`` ran a split kernel
    before the walk: since session 35 the walk splits hc_fn itself) and ``method="walk"``
    (``cute_kernels_walk``; records up to session 7's call the walk kernel ``cute_kernels``).
    Peers in the same process: the float32 torch reference and the split-K Triton baseline.
    ``shapes``: comma-separated M values (K = 20480), default 1,16,128,512,1024,2048,4096,16384.
    """
    import math

    from ..runtime.timing import SETTLE_S, copy_bandwidth_gbps, cuda_time_us

    k = BENCH_K
    ms = bench_shapes(shapes)
    copy_bw = copy_bandwidth_gbps()
    splitk = _splitk_baseline()
    recs = []
    for m in ms:
        x = torch.randn(m, k, device="cuda").bfloat16()
        hc_fn = torch.randn(N_MIX, k, device="cuda") / math.sqrt(k)
        hc_scale = torch.rand(3, device="cuda") + 0.5
        hc_base = torch.randn(N_MIX, device="cuda")
        args = (x, hc_fn, hc_scale, hc_base)
        impls = [("cute_kernels_walk", lambda: hc_mix_sinkhorn(*args, method="walk")),
                 ("cute_kernels_tma", lambda: hc_mix_sinkhorn(*args, method="tma")),
                 ("torch_fp32_reference", lambda: _reference(*args, dtype=torch.float32))]
        if splitk is not None:
            impls.append(("triton_splitk", lambda: splitk(*args)))
        for impl, fn in impls:
            t = cuda_time_us(fn, graph=True, settle_s=SETTLE_S)  # (each after SETTLE_S s of calls)
            gbps = m * k * 2 / t / 1e3
            recs.append(dict(kernel=NAME, impl=impl, shape=dict(m=m, k=k), mode="graph", time_us=t,
                             gbps=gbps, copy_bw_frac=gbps / copy_bw, copy_gbps=copy_bw, settle_s=SETTLE_S))
    return recs
