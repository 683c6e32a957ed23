"""Argument checks that run before any launch, with messages that say what to change.

Every public op validates its tensors here: a bad dtype, shape, stride, device or alignment
raises ``TypeError``/``ValueError`` in Python instead of a hang or a wrong answer on the GPU.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Iterable, Sequence

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false, guard_or_true

from .arch import check_device


def or_false(cond) -> bool:
    """``cond`` where it is a bool (eager calls: no call into torch); for a symbolic one, torch's ``guard_or_false``
    (False where only the data decides it, a size from ``x[mask]`` under torch.compile; else decided, guarded)."""
    return cond if cond.__class__ is bool else guard_or_false(cond)


def or_true(cond) -> bool:
    """As :func:`or_false`, True where only the data decides."""
    return cond if cond.__class__ is bool else guard_or_true(cond)


def check_tensor(
    name: str,
    t,
    *,
    dtypes: Iterable[torch.dtype] | None = None,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    cuda: bool = True,
    last_dim_contiguous: bool = True,
    align_bytes: int = 16,
    data_pointer: bool = True,
) -> None:
    """Validate one tensor argument.

    Args:
        name: the argument's name, used in messages.
        dtypes: allowed dtypes (``TypeError`` otherwise).
        ndim / shape: expected rank, and sizes (``None`` entries are free).
        cuda: must live on a CUDA device.
        last_dim_contiguous: stride of the last dim must be 1 (vector / TMA loads).
        align_bytes: data pointer and every non-unit stride (in bytes) must be multiples of this
            (16 for 128-bit vector loads and TMA); 0 disables the check (and the data pointer's).
        data_pointer: False checks the strides only (fake tensors at trace time have no data pointer).
    Raises:
        TypeError: not a tensor, not dense (sparse layouts), or wrong dtype.
        ValueError: wrong rank, shape, device, stride (a broadcast view, stride 0 in a dim of size > 1,
            included) or alignment, or no data (a data pointer of 0: a freed storage); the stride, alignment and
            data rules are skipped for an empty tensor (no element is read or written: e.g. the expanded
            gradient of an empty output).
        RuntimeError: the tensor's GPU is not a Hopper (sm_90) GPU.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided or t.is_nested:
        raise TypeError(f"{name} must be a dense (strided) tensor, got "
                        f"{'a nested tensor' if t.is_nested else f'layout {t.layout}'}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            expected = f"one of {allowed}" if len(dtypes) > 1 else allowed
            raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; expected {expected}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dim{'' if ndim == 1 else 's'}, got shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    if cuda:
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
        check_device(t.device)
    # no element to read or write (an empty gradient may come with strides 0): layout is moot; a size known only
    # when the graph runs (x[mask] under torch.compile) counts as not empty here (guard_or_false: no guard on it)
    if or_false(t.numel() == 0):
        return
    # (sizes and strides only the data decides, x[mask] under torch.compile: a last dim not proven contiguous is
    # refused, as the eager call refuses it for any size past 1; a stride 0 only where the trace proves it)
    if last_dim_contiguous and t.dim() > 0 and or_true(t.stride(-1) != 1) and or_true(t.shape[-1] > 1):
        raise ValueError(f"{name} must be contiguous in its last dim (stride 1), got strides {t.stride()}")
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        # an expand()ed view: TMA boxes and written outputs need distinct rows
        if or_false(stride == 0) and or_true(size > 1):
            raise ValueError(f"{name} is a broadcast view (stride 0 in dim {d}, strides {t.stride()}); "
                             "pass .contiguous()")
    if align_bytes:
        ptr = t.data_ptr() if data_pointer else None
        if ptr == 0:  # (the kernel would fault on it and take the CUDA context down)
            raise ValueError(f"{name} has no data: data pointer 0 for {t.numel()} elements (a freed storage, e.g. "
                             "after untyped_storage().resize_(0), or a fake tensor used outside its mode)")
        if ptr is not None and ptr % align_bytes:
            raise ValueError(f"{name}'s data pointer is not {align_bytes}-byte aligned (a sliced view?); "
                             "pass .contiguous() or an aligned slice")
        es = t.element_size()
        for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
            # (a stride that only the data knows, max(1, u0) for x[mask]'s rows, is left to the call's own check)
            misaligned = or_false(stride != 1) and or_false((stride * es) % align_bytes != 0)
            if misaligned and or_false(size > 1):
                raise ValueError(
                    f"{name}'s stride {stride} in dim {d} is not a multiple of {align_bytes} bytes; "
                    "pass a contiguous tensor"
                )


def check_same_device(**tensors) -> None:
    """All given tensors on one device (``ValueError`` otherwise)."""
    devs = {n: t.device for n, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devs.values())) > 1:
        raise ValueError("tensors on different devices: " + ", ".join(f"{n}={d}" for n, d in devs.items()))


F32_MAX = float(torch.finfo(torch.float32).max)
F32_MIN_NORMAL = 2.0 ** -126  # float32's smallest normal (smaller eps values flush to 0)
INT32_MAX = 2**31 - 1


def element_span(t: torch.Tensor) -> int:
    """Elements from a tensor's first to one past its last: ``1 + sum((size - 1) * |stride|)`` (0 if empty).
    Symbolic sizes (torch.compile with dynamic shapes) stay symbolic: no ``int()``, which would specialize
    them and recompile the caller for every new size; an emptiness only the data knows (``x[mask]``) is not
    asked, as :func:`check_tensor` does not ask it."""
    if or_false(t.numel() == 0):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))


def exceeds(size, limit: int) -> bool:
    """``size > limit`` for a size limit of the kernels (32-bit offsets, work-tile counts, row counts).  A
    symbolic size (torch.compile / torch.export with dynamic shapes) exceeds it only where the trace's facts
    prove it: the check then adds no guard to the trace (``torch.export`` with a plain ``Dim`` would have to
    carry the limit as that dimension's ``max=``, and on some products torch fails to phrase that guard), and
    the op checks the concrete sizes again when it runs."""
    if isinstance(size, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        return statically_known_true(size > limit)
    return size > limit


def known(value):
    """A symbolic size's value in the call being traced (its hint: torch.compile / torch.export trace fake
    tensors whose sizes are symbols), for an error message; anything else as it is.  No guard is added."""
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        hint = getattr(value.node, "hint", None)
        return value if hint is None else hint
    return value


def _sym_values(args) -> dict[str, str]:
    """The values behind the symbolic sizes in ``args`` (fake tensors' sizes, strides, offsets and element
    counts, and SymInt / SymFloat scalars, also inside lists and tuples): a map from the text torch prints for
    each (``"s85"``, ``"96*s0*s34"``) to the example value the trace was made with (its hint).  Sizes without a
    hint (data-dependent ones) are left out."""
    values: dict[str, str] = {}
    pending = list(args)
    while pending:
        a = pending.pop()
        if isinstance(a, torch.Tensor):
            pending.extend((*a.shape, *a.stride(), a.storage_offset(), a.numel()))
        elif isinstance(a, (list, tuple)):
            pending.extend(a)
        elif isinstance(a, (torch.SymInt, torch.SymFloat)) and known(a) is not a:
            values[str(a)] = str(known(a))
    return values


def with_sym_values(message: str, args) -> str:
    """``message`` with the symbolic sizes torch printed in it (``bounds must have shape [s85, 4], got [s52,
    s0]``) replaced by the values of the call being traced (``[2, 4], got [3, 4]``): an argument check that fails
    under ``torch.compile(dynamic=True)`` / ``torch.export`` runs on fake tensors whose sizes are symbols.
    ``args``: the checked call's arguments, where the values are read (:func:`_sym_values`).  A whole expression
    that is some size's own (a stride ``96*s0*s34``) becomes that size's value; in any other expression each
    symbol that is a size becomes its value (``ceil(s0/128)`` -> ``ceil(40/128)``).  Text without such symbols
    comes back unchanged."""
    values = _sym_values(args)
    if not values:
        return message
    keys = sorted(values, key=len, reverse=True)  # longest first: "s34*s0" before "s34"
    pattern = re.compile("|".join(rf"(?<!\w){re.escape(k)}(?!\w)" for k in keys))
    return pattern.sub(lambda m: values[m.group(0)], message)


def data_dependent_message(op: str, cond, named: dict) -> str:
    """The message for an argument check of ``op`` that a size only the data decides leaves open: ``cond`` (the
    sympy expression torch could not decide) and, for each of its symbols, the arguments in ``named`` (argument
    name -> value) whose sizes hold it (``q.shape[0]``)."""
    symbols = getattr(cond, "free_symbols", set())
    sources = []
    for arg, value in named.items():
        dims = ([(f"{arg}.shape[{i}]", d) for i, d in enumerate(value.shape)] if isinstance(value, torch.Tensor)
                else [(arg, value)] if isinstance(value, torch.SymInt) else [])
        for label, size in dims:
            if isinstance(size, torch.SymInt) and size.node.expr.free_symbols & symbols:
                sources.append(f"{label} = {size.node.expr}")
    where = f" ({', '.join(sources)})" if sources else ""
    return (f"cute_kernels::{op}: an argument check asks {cond}, which only the data decides{where}: a size from "
            "x[mask], nonzero() or .item() under torch.compile / torch.export. State what holds with torch._check "
            "before the call, e.g. torch._check(k.shape[0] == q.shape[0]) for sizes that must match, "
            "torch._check(n >= 1), torch._check(n % 8 == 0); a head dim or a row width must not depend on the data")


def check_extent(name: str, t: torch.Tensor, *, limit: int = INT32_MAX) -> None:
    """``ValueError`` unless every element of ``t`` lies within ``limit`` elements of its first (the
    kernels compute element offsets with 32-bit integers: a larger tensor would wrap them; symbolic sizes:
    see :func:`exceeds`)."""
    span = element_span(t)
    if exceeds(span, limit):
        raise ValueError(f"{name} spans {span} elements (shape {list(t.shape)}, strides {list(t.stride())}); the "
                         f"kernels index with 32-bit offsets (at most {limit}): split the call")


def check_distinct_rows(name: str, t: torch.Tensor, why: str) -> None:
    """``ValueError`` (ending in ``why``) when the rows of the 2-D tensor ``t`` overlap in memory (more than
    one row and a row stride below the width; the stride's test first, and a row count that only the data
    knows, ``x[mask]`` under torch.compile, counts as more than one)."""
    if or_false(t.stride(0) < t.shape[1]) and or_true(t.shape[0] > 1):
        raise ValueError(f"{name}'s rows overlap in memory (row stride {t.stride(0)} < width {t.shape[1]}): {why}")


def check_value_known(name: str, value, advice: str = "the kernels' ops take Python numbers; pass one") -> None:
    """``ValueError`` for a number that only the running graph knows: under torch.compile, a scalar taken from a
    tensor (``.item()`` with ``capture_scalar_outputs``), which Dynamo shows to Python as a plain float or int.
    A custom op's float argument cannot take one (torch refuses it when it traces the op); an int argument can
    once ``torch._check`` bounds it (then this passes and the range checks decide; ``advice`` says so for
    :func:`check_int`); comparing an unbounded one with its range failed inside torch's sympy (session 69).
    Raised here, Dynamo breaks the graph without ``fullgraph`` and the call runs eagerly, with the value.
    Eagerly, and for constants or symbols with a hint (comparing those installs a guard), nothing: two
    comparisons that torch's ``guard_or_false`` reads as False only where they cannot be decided (a NaN
    constant is left to the range checks after this, which refuse it)."""
    if not torch.compiler.is_compiling():  # (the eager calls: one check)
        return
    if type(value).__module__ == "numpy":  # (Dynamo traces it as a tensor)
        raise TypeError(f"{name} is a numpy {type(value).__name__}: under torch.compile the ops take Python numbers; "
                        f"pass float({name}) or int({name})")
    if type(value) not in (int, float):  # (a number type of its own is a constant; torch 2.9's Dynamo cannot
        return  # compare an IntEnum)
    if guard_or_true(value == value) and not (guard_or_false(value < 1e300) or guard_or_false(value >= 1e300)):
        raise ValueError(f"{name} is a value known only when the compiled graph runs (a tensor's .item()): "
                         f"{advice}, or compile without fullgraph=True (the call then runs eagerly)")


def plain_real(value: numbers.Real) -> int | float:
    """A real number of a type of its own as a Python ``int`` (an ``Integral``: ``IntEnum``, numpy ints) or
    ``float``, the way Dynamo traces it: an ``int`` subclass through ``int()`` (Dynamo's ``float()`` of an
    ``IntEnum`` recurses), a ``Rational`` (``fractions.Fraction``) as numerator / denominator, which is how
    ``float()`` rounds it (torch 2.9's Dynamo cannot trace ``float()`` of one).  ``OverflowError`` past float's
    range, as ``float()``."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Rational):
        return int(value.numerator) / int(value.denominator)
    return float(value)


def check_real(name: str, value, *, low: float | None = None, high: float = F32_MAX, low_open: bool = False) -> float:
    """A real scalar argument (``int``/``float``/numpy real; not ``bool``, not a string) as a float.

    Raises ``TypeError`` for another type, ``ValueError`` unless it is finite and within
    ``[low, high]`` (``(low, high]`` with ``low_open``); the default ``high`` is float32's max and without
    ``low`` the value must be >= -float32's max, since kernels take such scalars as float32.  Messages name
    the argument.  A symbolic value (torch.compile with dynamic shapes) is returned as is: the op checks the
    concrete value when it runs; one only the running graph knows is a ``ValueError`` (:func:`check_value_known`).
    """
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {shown(value)}")
    check_value_known(name, value)
    # an int past float's range: refused before float() raises (Dynamo cannot trace the OverflowError's handler;
    # nor, in torch 2.9, an IntEnum's comparison: the plain int is compared)
    if isinstance(value, int) and not -2**1023 <= int(value) <= 2**1023:
        raise ValueError(f"{name}={short_repr(value)} is out of float range")
    try:
        v = value if type(value) is float else float(plain_real(value))  # (a Python float, the usual case: as is)
    except OverflowError:
        raise ValueError(f"{name}={short_repr(value)} is out of float range") from None
    # without a lower bound: finite in float32 on both sides (-1e39 would reach the kernel as -inf); NaN stops at
    # the first test (under dynamic=True Dynamo traces the bounds as symbolic floats, which refuse a NaN comparison)
    if (not -math.inf < v < math.inf or v > high  # (comparisons, not math.isfinite: dynamo traces them)
            or (v < -F32_MAX if low is None else (v <= low if low_open else v < low))):
        if torch.compiler.is_compiling():  # dynamo cannot format a symbolic value (dynamic=True): a fixed text
            raise ValueError(name + " is not finite or out of its range (the eager call's message gives the bounds)")
        # (9 significant digits: a float32 bound printed shorter can read as the value refused, e.g. <= 3.40282e+38
        # beside a refused 3.4028235e+38)
        bounds = ([f">= {-F32_MAX:.9g}"] if low is None else [f"{'>' if low_open else '>='} {low:.9g}"]) + (
            [f"<= {high:.9g}"] if math.isfinite(high) else [])
        # (numpy prints float32's max as 3.4028235e+38, a Python float above it: say which value is meant)
        note = (f" (float32's max is {F32_MAX!r}; numpy's repr 3.4028235e+38 rounds it up: pass "
                "float(numpy.finfo(numpy.float32).max))" if high == F32_MAX and (v > 0 or low is None)
                and F32_MAX < abs(v) <= 3.4028235e38 else "")
        raise ValueError(f"{name} must be finite{', ' + ' and '.join(bounds) if bounds else ''}, got "
                         f"{short_repr(value)}{note}")
    return v


def check_float_tensors(**tensors) -> None:
    """For the CPU references: each named argument must be a floating-point torch.Tensor of any device,
    shape and layout (``TypeError`` naming the first that is not)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{name} must be a floating-point torch.Tensor, got {got}")


def check_f32_eps(name: str, value) -> float:
    """An epsilon a kernel takes as float32: a real number (``TypeError`` otherwise), finite in float32,
    ``>= 0``, and 0 or at least float32's smallest normal ``2**-126`` (``ValueError``: a smaller one
    would become 0)."""
    v = check_real(name, value, low=0.0)
    if isinstance(v, torch.SymFloat):
        return v
    if 0 < v < F32_MIN_NORMAL:
        raise ValueError(f"{name}={short_repr(value)} is below float32's smallest normal number (1.18e-38): it would "
                         "become 0; pass 0 or a larger value")
    return v


def check_bool(name: str, value) -> bool:
    """A flag argument: a Python bool, or a numpy bool (returned as a bool, as numpy reals are accepted where
    numbers are); ``TypeError`` naming the argument and the value's type otherwise (an int too: 0 / 1 would
    pass silently where a flag was meant)."""
    if isinstance(value, bool):
        return value
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {kind.__module__ + '.' if kind.__module__ != 'builtins' else ''}"
                    f"{kind.__name__} {short_repr(value)}")


def check_int(name: str, value, *, low: int = 1, high: int = INT32_MAX) -> int:
    """An integer argument (not ``bool``) in ``[low, high]``: ``TypeError`` / ``ValueError`` naming it
    (a symbolic one, under torch.compile with dynamic shapes, is returned as is; see :func:`check_real`)."""
    if isinstance(value, torch.SymInt):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {shown(value)}")
    check_value_known(name, value, f"bound it with torch._check({name} >= {low}) and torch._check({name} <= {high}) "
                      "so that the trace can decide its range")
    v = int(value)
    if not low <= v <= high:
        raise ValueError(f"{name}={short_repr(v)} must be in [{low}, {high}]")
    return v


_TRACEABLE_REPR = (bool, str, type(None))  # the types whose repr Dynamo traces (it fails on numbers)


def short_repr(value, limit: int = 40) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters; while torch.compile traces, that of a
    bool, str or None only, ``<traced value>`` for anything else (see :func:`shown`)."""
    if torch.compiler.is_compiling() and type(value) not in _TRACEABLE_REPR:  # (Dynamo formats neither a tensor nor
        return "<traced value>"  # a number, constant or symbolic: its own error would replace ours)
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def shown(value) -> str:
    """``value`` for an error message: its type and its repr, cut to 40 characters; while torch.compile traces,
    its type and, but for a bool, str or None, ``<traced value>`` (Dynamo can format neither a tensor nor a number
    there, and its own error would then replace ours)."""
    if torch.compiler.is_compiling() and type(value).__module__ == "numpy":  # (a numpy scalar reads as an array)
        return f"numpy {type(value).__name__} <traced value> (under torch.compile pass a Python number: float(x))"
    return f"{type(value).__name__} {short_repr(value)}"


def signature(t) -> tuple | None:
    """What a cached validation may key on: shape, strides, dtype and device of a tensor (None for
    None).  The data pointer is not part of it: callers re-check its alignment on every call."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


MEMO_LIMIT = 4096  # signatures kept per memo (later ones are checked in full on every call)
_MISS = object()


def validated_once(memo: dict, tensors: tuple, scalars: tuple, aligned, check):
    """``check()`` once per argument signature, its result kept in ``memo``: the :func:`signature` of
    each of ``tensors`` plus the type and value of each of ``scalars`` (types too: ``True == 1 == 1.0``
    hash alike, but a bool may be refused where an int is not).  A later call with the same signature
    returns the kept result when ``aligned()`` (what a signature does not fix: the data pointers'
    alignment) holds, and runs ``check()`` again otherwise.  Non-tensor, strideless (sparse, nested)
    or unhashable arguments are never kept: ``check()`` runs and says what is wrong.  Saves ~10 us of host time
    per eager call."""
    try:
        key = tuple(signature(t) for t in tensors) + tuple((type(s), s) for s in scalars)
        hit = memo.get(key, _MISS)
    except (AttributeError, TypeError, RuntimeError):  # (sparse / nested tensors have no strides)
        key, hit = None, _MISS
    if hit is not _MISS and aligned():
        return hit
    result = check()
    if key is not None and len(memo) < MEMO_LIMIT:
        memo[key] = result
    return result


def aligned_data(align: int, *tensors) -> bool:
    """Whether every given tensor (None entries skipped) has data (a data pointer other than 0: not a freed
    storage) aligned to ``align`` bytes: what a cached validation re-checks on each call (the pointers are not
    part of an argument signature).  An empty tensor may have a pointer of 0: False, so its call is checked in
    full, where an empty tensor passes."""
    for t in tensors:
        if t is not None:
            p = t.data_ptr()
            if not p or p % align:
                return False
    return True


def byte_extent(t: torch.Tensor) -> tuple[int, int]:
    """``[first, last + 1)`` bytes of memory that tensor ``t`` can touch (empty for no elements)."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def check_outputs_disjoint(outputs: dict, inputs: dict) -> None:
    """``ValueError`` when an output buffer (a name -> tensor or None) shares memory with another
    output or with an input (conservatively: their byte extents intersect).  Kernels write outputs
    while they read inputs, so an alias gives wrong results, or destroys an input."""
    named = [(n, byte_extent(t)) for n, t in outputs.items() if t is not None]
    others = named + [(n, byte_extent(t)) for n, t in inputs.items() if isinstance(t, torch.Tensor)]
    for i, (name, (a0, a1)) in enumerate(named):
        for other, (b0, b1) in others[i + 1:]:
            if a0 < b1 and b0 < a1:
                raise ValueError(f"{name} shares memory with {other}: output buffers must not overlap "
                                 "each other or any input")


class ValidatedConfig:
    """Base of the kernels' frozen config dataclasses: ``validate()`` runs when a config is constructed
    (``Config(...)`` and ``dataclasses.replace``), so an illegal config never exists: the constructor raises
    ``TypeError`` (a field of the wrong type) or ``ValueError`` with the reason (shared memory budget, WGMMA
    shape, head dim, register split, ...).  ``validate()`` stays callable (it is idempotent)."""

    def __post_init__(self) -> None:
        self.validate()


def check_config_fields(config) -> None:
    """Every field of a frozen config dataclass has its default's type: ``bool`` fields a ``bool``,
    ``int`` fields an ``int`` (not a bool), fields defaulting to None None or a ``bool`` (None or an ``int``
    where the field's metadata says ``{"type": int}``).  Raises ``TypeError`` naming the field (a
    ``tile_m=64.0`` would otherwise fail late, inside torch)."""
    import dataclasses

    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        default = f.default
        if default is None and f.metadata.get("type") is int:
            ok, want = value is None or type(value) is int, "None or an int"
        elif isinstance(default, bool):
            ok, want = type(value) is bool, "a bool"
        elif isinstance(default, int):
            ok, want = type(value) is int, "an int"
        elif default is None:
            ok, want = value is None or type(value) is bool, "None, True or False"
        else:
            continue
        if not ok:
            kind = type(value)
            kind = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            raise TypeError(f"{type(config).__name__}.{f.name}={value!r} ({kind}): must be {want}")
