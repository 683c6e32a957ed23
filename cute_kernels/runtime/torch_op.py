"""torch.library registration with an eager fast path.

``torch.library.custom_op`` makes an op visible to ``torch.compile`` and safe in CUDA-graph capture, but its
dispatch adds ~2-10 us of host time per eager call (``bench/overhead*.py``: the registered ``scale`` op 24.1 us, the
fast path 14.3, on one H100 host), as much as our small kernels take. :func:`custom_op` registers the op and returns
a callable that goes through the registered op while anything traces (torch.compile / torch.export /
torch.jit.trace, or a Python dispatch mode such as ``make_fx``'s or a FakeTensorMode: a direct call would be
invisible to them and the traced graph would lose the kernel), and calls the implementation directly otherwise. Ops
that return new tensors also go through the registered op when grad mode is on and an argument requires grad: the
outputs then take part in autograd like the compiled op's do, and ``backward()`` raises torch's "no autograd
formula" error instead of gradients being dropped silently. Ops that mutate their inputs (and have no backward)
refuse, while tracing as eagerly, arguments that require grad in grad mode: traced, the in-place op would otherwise
pass gradients through as if it were not there.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import numbers
from typing import Callable, Iterable

import torch
from torch.autograd import forward_ad as _fwad
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .validate import data_dependent_message, plain_real, with_sym_values


_is_compiling = torch.compiler.is_compiling
_jit_tracing = torch._C._get_tracing_state  # torch.jit.trace's state: None unless it traces
_inference_mode = torch.is_inference_mode_enabled


def tracing() -> bool:
    """True while torch.compile / torch.export / torch.jit.trace trace or a Python dispatch mode (make_fx,
    FakeTensorMode) is active: a call must then go through the registered op, which they see (a direct call
    would leave the kernel out of the traced graph: ``torch.jit.trace`` recorded only the output's allocation
    until session 69)."""
    return _is_compiling() or _get_current_dispatch_mode() is not None or _jit_tracing() is not None


def autograd_records() -> bool:
    """True where autograd would record an op on tensors that require grad: grad mode on and not inference
    mode (inside ``torch.inference_mode()`` it records nothing, even under ``torch.enable_grad()``).  While
    torch.compile traces, grad mode alone (Dynamo cannot trace the inference-mode query: a graph break)."""
    return torch.is_grad_enabled() and (_is_compiling() or not _inference_mode())


def refuse_inference_tensors(name: str, *mutated: torch.Tensor) -> None:
    """``RuntimeError`` when one of the tensors an op updates in place is an inference tensor and inference mode
    is off: torch refuses that for its own in-place ops (eagerly and under torch.compile), so the kernels, which
    write through raw pointers, refuse it too (eager and compiled calls then agree)."""
    if not _inference_mode() and any(t.is_inference() for t in mutated):
        raise RuntimeError(f"{name} updates its inputs in place, and an inference tensor (made under "
                           "torch.inference_mode()) is among them while inference mode is off: torch refuses "
                           "in-place updates of inference tensors outside inference mode; call it inside "
                           "torch.inference_mode(), or on a .clone() made outside it")


try:  # private, so looked up once and optional: without them the check below is skipped
    _is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    _transform_active = torch._C._functorch.peek_interpreter_stack  # None outside every torch.func transform
except AttributeError:  # pragma: no cover (a torch without functorch's C API)
    _is_functorch_wrapped = _transform_active = None


def _any_dual(args) -> bool:
    """Whether a tensor among ``args`` carries a tangent of the current forward-AD level.  Looked up with the
    thread's excluded dispatch keys cleared: inside an in-place custom op's kernel (below ADInplaceOrView) torch
    2.9's ``unpack_dual`` fails an internal assert on every tensor, dual or not."""
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                        torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)):
        return any(isinstance(t, torch.Tensor) and _fwad.unpack_dual(t).tangent is not None for t in args)


def refuse_func_transforms(name: str, *args, differentiable: bool = False) -> None:
    """``NotImplementedError`` when one of ``args`` is a tensor wrapped by a ``torch.func`` transform (grad, vjp,
    vmap, jacrev...): the kernels take raw CUDA buffers, and torch's custom ops support neither those
    transforms' autograd (grad / vjp) nor batching rules (vmap) for them, so the call would otherwise
    fail deeper with an unrelated message (``setup_context``, "no data pointer", "not on a CUDA device").
    Likewise for a dual tensor of forward-mode AD (``torch.autograd.forward_ad``, inside a ``dual_level``): the
    ops have no forward-mode formula, and their outputs would come back without a tangent (an in-place op's
    input would keep its old one) with no error.  ``differentiable``: the function has a backward
    (``ranker_attention``), so the message points to ``.backward()`` / ``torch.autograd.grad`` for gradients;
    the others have none to point to.  (Eager calls only: while torch.compile traces, Dynamo cannot trace these
    checks, and torch's own handling applies.)"""
    if _is_compiling():
        return  # Dynamo cannot trace these C calls (a graph break)
    hint = " (for gradients, use .backward() / torch.autograd.grad)" if differentiable else ""
    if _fwad._current_level >= 0 and _any_dual(args):
        raise NotImplementedError(f"cute_kernels.{name} does not support forward-mode AD (a dual tensor of "
                                  f"torch.autograd.forward_ad): pass primal tensors{hint}")
    if _transform_active is None or _transform_active() is None:
        return  # (eagerly, the common case: one C call)
    if any(isinstance(t, torch.Tensor) and _is_functorch_wrapped(t) for t in args):
        raise NotImplementedError(f"cute_kernels.{name} does not support torch.func transforms (grad, vjp, vmap, "
                                  f"...): call it outside them{hint}")


def without_autocast(fn: Callable) -> Callable:
    """``fn`` run with ``torch.autocast`` off (CPU and, where present, CUDA): the torch references compute in the
    dtype they document, also when called inside an autocast block (whose matmuls would otherwise run in 16 bits)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        cuda = torch.cuda.is_available()  # (torch.autocast("cuda") warns where there is no CUDA)
        with torch.autocast("cpu", enabled=False), \
                (torch.autocast("cuda", enabled=False) if cuda else contextlib.nullcontext()):
            return fn(*args, **kwargs)

    return wrapped


def plain_eager() -> bool:
    """True in plain eager mode: nothing traces (:func:`tracing` is False), no ``torch.func`` transform is
    active and no forward-mode AD level is open, so neither :func:`tracing` nor :func:`refuse_func_transforms`
    need run (one check for the eager hot paths: four C calls)."""
    return (not _is_compiling() and _get_current_dispatch_mode() is None and _jit_tracing() is None
            and (_transform_active is None or _transform_active() is None) and _fwad._current_level < 0)


def register_flops(packet, formula: Callable, *, get_raw: bool = False) -> None:
    """Register ``formula`` as ``torch.utils.flop_counter``'s FLOP count of the op ``packet``
    (``torch.ops.cute_kernels.<name>``; ``get_raw``: the formula takes the call's tensors, else their shapes).
    Once: a second registration (a module reload) keeps the first, where torch would raise.
    A ``FlopCounterMode`` copies torch's formulas when it is made; the counters active now (the module loads
    at its op's first use, e.g. inside ``with FlopCounterMode():``) get the formula too, so they do not count
    the op as 0 FLOPs.  (A counter made before the load and entered after it still misses it.)"""
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    if packet not in flop_registry:
        register_flop_formula(packet, get_raw=get_raw)(formula)
    for counter in _active_flop_counters():
        counter.flop_registry.setdefault(packet, flop_registry[packet])


def _active_flop_counters() -> list:
    """The ``torch.utils.flop_counter.FlopCounterMode`` objects whose mode is on the dispatch stack now ([] where
    this torch keeps them otherwise: private names)."""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
        from torch.utils.flop_counter import _FlopCounterMode
        stack = _get_current_dispatch_mode_stack()
    except (ImportError, AttributeError):
        return []
    return [m.counter for m in stack
            if isinstance(m, _FlopCounterMode) and isinstance(getattr(m.counter, "flop_registry", None), dict)]


def capturing(t) -> bool:
    """Whether ``t`` is a CUDA tensor and the current CUDA stream of its device (where its kernels launch), or of
    the current device, captures a graph: the host must not read device values then (a sync would break the
    capture), nor keep memory it allocates (the graph's pool)."""
    if not t.is_cuda:
        return False
    if torch.cuda.is_current_stream_capturing():
        return True
    index = t.device.index
    if index is None or index == torch.cuda.current_device():
        return False
    with torch.cuda.device(index):  # (torch asks the current device's current stream only)
        return torch.cuda.is_current_stream_capturing()


def without_data(t) -> bool:
    """True for a tensor that has no data to launch a kernel on: a fake tensor (FakeTensorMode, torch.compile
    tracing) or one on the "meta" device."""
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # private module: then only "meta" is recognised
        FakeTensor = ()
    return isinstance(t, torch.Tensor) and (isinstance(t, FakeTensor) or t.device.type == "meta")


def _requires_grad(args, kwargs) -> bool:
    return autograd_records() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values()))


def _tensor_params(op) -> list[tuple[int, str, bool]]:
    """(position, name, optional) of the op schema's Tensor / Optional[Tensor] arguments ([] where this torch
    does not expose the schema that way: the dispatcher's own error then stands)."""
    try:
        arguments = op._opoverload._schema.arguments
    except AttributeError:
        return []
    out = []
    for i, a in enumerate(arguments):
        t = a.type
        optional = isinstance(t, torch.OptionalType)
        if isinstance(t.getElementType() if optional else t, torch.TensorType):
            out.append((i, a.name, optional))
    return out


class _EagerFastPath:
    def __init__(self, op, impl: Callable, precheck: Callable | None, grad_via_op: bool, name: str,
                 mutated: tuple[str, ...] = ()):
        self.op = op
        self.name = name
        self.impl = impl
        self.precheck = precheck
        self.grad_via_op = grad_via_op
        self.tensor_params = _tensor_params(op)
        # the schema's first tensor argument by name: a keyword call's meta test (its first keyword may be a scalar)
        self.first_tensor = self.tensor_params[0][1] if self.tensor_params else None
        self.signature = inspect.signature(impl)
        params = list(self.signature.parameters)
        self.mutated = tuple((params.index(n), n) for n in mutated)  # (position, name) of the in-place arguments
        functools.update_wrapper(self, impl)

    def __get__(self, obj, objtype=None):
        """(Never bound: a descriptor only to Python's ``help()``, which then shows the op like a function,
        its signature and docstring, instead of this class's.)"""
        return self

    def check_arguments(self, args, kwargs) -> None:
        """TypeError naming the op for arguments its signature does not take (missing, unknown, too many): else
        the first function to see them, the precheck, would name itself (``<lambda>() missing ...``)."""
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"cute_kernels.{self.name}(): {exc}") from None

    def check_tensor_types(self, args, kwargs) -> None:
        """TypeError naming the argument for a non-tensor where the schema wants a tensor (the dispatcher
        would raise a RuntimeError about the schema instead)."""
        for i, name, optional in self.tensor_params:
            if i < len(args):
                v = args[i]
            elif name in kwargs:
                v = kwargs[name]
            else:
                continue
            if not isinstance(v, torch.Tensor) and not (optional and v is None):
                raise TypeError(f"{name} must be a torch.Tensor{' or None' if optional else ''}, "
                                f"got {type(v).__name__}")

    def __call__(self, *args, **kwargs):
        # (the eager case in as few calls as possible: this runs on every call of every op)
        compiling = _is_compiling()
        if not compiling and (_fwad._current_level >= 0
                              or _transform_active is not None and _transform_active() is not None):
            refuse_func_transforms(self.name, *args, *kwargs.values())
        # meta tensors (the first tensor argument on the "meta" device): the op, whose fake gives the output shapes
        first = args[0] if args else kwargs.get(self.first_tensor)
        if (compiling or _get_current_dispatch_mode() is not None or getattr(first, "is_meta", False)
                or _jit_tracing() is not None or (self.grad_via_op and _requires_grad(args, kwargs))):
            if not compiling:  # (Dynamo reports a bad call itself)
                self.check_arguments(args, kwargs)
            self.check_tensor_types(args, kwargs)
            if not self.grad_via_op and _requires_grad(args, kwargs):  # eager: the impl raises the same
                raise RuntimeError(f"cute_kernels::{self.name} works in place and has no backward: call it on "
                                   "tensors that do not require grad, or under torch.no_grad()")
            if self.mutated and not compiling:  # (meta tensors, dispatch modes: as the impl refuses them eagerly;
                # compiled, torch's functionalization refuses an inference tensor's in-place update itself)
                refuse_inference_tensors(f"cute_kernels.{self.name}", *(
                    v for i, n in self.mutated
                    if isinstance(v := (args[i] if i < len(args) else kwargs.get(n)), torch.Tensor)))
            if self.precheck is not None:  # the op's schema would turn a bool into 1 / 1.0 unseen
                self.precheck(*args, **kwargs)
            if compiling:  # (Dynamo cannot put a Fraction or another Real subclass in the graph: a float there)
                args, kwargs = _plain_numbers(args), dict(zip(kwargs, _plain_numbers(kwargs.values())))
            return self.op(*args, **kwargs)
        return self.impl(*args, **kwargs)


def _plain_numbers(values) -> tuple:
    """``values`` with each real number of a type of its own (``fractions.Fraction``, an ``IntEnum``, another
    ``numbers.Real``) as a Python float or int: the eager schema takes those through ``__float__`` /
    ``__index__``, Dynamo's graph does not ("Failed to convert args/kwargs to proxy").  Tensors, symbolic sizes,
    Python's own numbers and bools, numpy scalars (refused under torch.compile with their own advice) and
    everything else pass as they are."""
    return tuple(plain_real(v) if type(v) not in _PLAIN_TYPES and isinstance(v, numbers.Real)
                 and not isinstance(v, (torch.SymInt, torch.SymFloat)) and type(v).__module__ != "numpy" else v
                 for v in values)


_PLAIN_TYPES = (torch.Tensor, int, float, bool, str, type(None))


def _values_in_errors(fake: Callable, name: str) -> Callable:
    """``fake`` whose argument errors (``TypeError`` / ``ValueError``) name the traced call's sizes, not the
    symbols torch.compile / torch.export trace them as (:func:`.validate.with_sym_values`): the exception itself
    is re-raised, its message rewritten.  A check that a size only the data decides leaves open (torch's
    ``GuardOnDataDependentSymNode``: ``x[mask]``, ``nonzero``, ``.item()`` sizes) becomes a ``ValueError``
    naming the op, the question, the arguments whose sizes it asks about, and ``torch._check`` as the way to
    tell the trace what holds (:func:`.validate.data_dependent_message`)."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    params = list(inspect.signature(fake).parameters)

    @functools.wraps(fake)
    def checked(*args, **kwargs):
        try:
            return fake(*args, **kwargs)
        except (TypeError, ValueError) as exc:
            if len(exc.args) == 1 and isinstance(exc.args[0], str):
                exc.args = (with_sym_values(exc.args[0], (*args, *kwargs.values())),)
            raise
        except GuardOnDataDependentSymNode as exc:
            named = {**dict(zip(params, args)), **kwargs}
            raise ValueError(data_dependent_message(name, exc.cond, named)) from exc

    return checked


def custom_op(name: str, *, mutates_args: Iterable[str] | str, fake: Callable | None = None,
              precheck: Callable | None = None):
    """Decorator: register ``impl`` as ``torch.ops.cute_kernels.<name>``; return the fast-path caller.

    ``fake``: the meta implementation (output shapes); ops that only mutate inputs may omit it.
    ``precheck``: called with the Python arguments before the registered op (only there: ``impl``
    checks them itself), for the checks the schema's conversions would hide (``True`` passed as an
    int or float).  The registered op stays reachable as ``.op`` (e.g. for ``torch.library.opcheck``).
    """

    def deco(impl: Callable):
        def registered_impl(*args, **kwargs):
            # a direct torch.ops.cute_kernels call with a dual tensor (the fast path refuses it before this): torch's
            # custom ops have no forward-mode formula and would drop the tangent silently
            if _fwad._current_level >= 0:
                refuse_func_transforms(name, *args, *kwargs.values())
            return impl(*args, **kwargs)

        # (the schema inferred from impl itself: its module's names resolve its string annotations)
        schema = torch.library.infer_schema(impl, mutates_args=mutates_args)
        op = torch.library.custom_op(f"cute_kernels::{name}", registered_impl, mutates_args=mutates_args,
                                     schema=schema)
        if fake is not None:
            op.register_fake(_values_in_errors(fake, name))
        else:
            op.register_fake(lambda *a, **k: None)
        mutated = (mutates_args,) if isinstance(mutates_args, str) else tuple(mutates_args)
        return _EagerFastPath(op, impl, precheck, grad_via_op=not mutates_args, name=name, mutated=mutated)

    return deco


def register_on_lookup(namespace: str, op_modules: dict[str, str]) -> bool:
    """Make a lookup in ``torch.ops.<namespace>`` of an op of ``op_modules`` (op name -> the module that
    registers it) that is not registered yet import its module first: so ``torch.ops.cute_kernels.<op>`` and
    ``torch.export.load`` of a program that calls our ops work after a plain ``import cute_kernels``, whose ops
    otherwise register only when their module is imported (which imports the DSL, a second or two).  Other
    names, and an op whose module is being imported (``torch.library`` looks its name up before defining it),
    stay as torch looks them up.  An exception from the import (e.g. the DSL missing) reaches the lookup, ``hasattr``
    included.  Returns False, changing nothing, where this torch has no
    ``torch._ops._OpNamespace`` to extend (then the modules must be imported by hand)."""
    base = getattr(getattr(torch, "_ops", None), "_OpNamespace", None)
    if base is None:
        return False
    ns = getattr(torch.ops, namespace)  # (torch makes the namespace object on its first lookup)
    if type(ns) is not base:
        return isinstance(ns, base)  # (already extended: a reload of the package)

    class RegisteringNamespace(base):
        def __getattr__(self, op_name: str):
            try:
                return super().__getattr__(op_name)
            except AttributeError:
                if op_name not in op_modules:
                    raise
            importlib.import_module(op_modules[op_name])  # (a module mid-import comes back as it is)
            # the packet torch made and cached here while the module registered its op (its FLOP formula is keyed
            # on it): a second lookup would make another and replace it
            packet = self.__dict__.get(op_name)
            return packet if packet is not None else super().__getattr__(op_name)

    # (torch names each op packet after the namespace class's module: torch.export serializes that name, so it must
    # stay torch's, "torch._ops")
    RegisteringNamespace.__module__ = base.__module__
    ns.__class__ = RegisteringNamespace
    return True
