"""The kernel registry that ``cute-kernels compile/check/bench`` walk.

Each entry names a module that defines these functions:

* ``compile_targets() -> list[CompileTarget]``: every shipped configuration, compilable on a CPU;
* ``check() -> list[CheckResult]``: GPU correctness on real-sized random inputs vs the reference;
* ``bench(shapes: str | None) -> list[dict]``: benchmark records (``cute-kernels bench``);
* ``bench_shapes(shapes: str | None)``: the ``--shapes`` spec parsed, or ``ValueError`` naming what the
  kernel accepts (the CLI calls it before anything runs, on any machine; ``bench`` calls it too).
* ``shipped_configs() -> dict[str, config]``: the shipped configs by a label saying where each applies
  (``cute-kernels configs``, :func:`cute_kernels.tuning.shipped_configs`).

Modules are imported lazily, so one broken kernel cannot stop the others (or ``import cute_kernels``).
A kernel issue adds one line to ``KERNELS``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Hashable

KERNELS: dict[str, str] = {
    "scale": "cute_kernels.kernels.scale",
    "ranker_fwd": "cute_kernels.kernels.ranker_fwd",
    "qknorm": "cute_kernels.kernels.qknorm",
    "qknorm_tp": "cute_kernels.kernels.qknorm_tp",
    "hc_mix": "cute_kernels.kernels.hc_mix",
    "ranker_bwd": "cute_kernels.kernels.ranker_bwd",
}


@dataclass(frozen=True)
class CompileTarget:
    """One compilable configuration: ``compile_cached(kernel, key, build)`` compiles it."""

    kernel: str
    label: str
    key: Hashable
    build: Callable[[], tuple] = field(compare=False, repr=False)


@dataclass
class CheckResult:
    """One row of ``cute-kernels check``: a case, its error figures and the bar it must pass."""

    kernel: str
    case: str
    passed: bool
    max_abs_err: float
    rel_err: float
    tol: float
    note: str = ""


def names() -> list[str]:
    """Registered kernel names, in registry order."""
    return list(KERNELS)


def module(name: str):
    """Import and return the module of kernel ``name`` (``KeyError`` for an unknown name)."""
    if name not in KERNELS:
        raise KeyError(f"unknown kernel {name!r}; registered: {', '.join(KERNELS)}")
    return importlib.import_module(KERNELS[name])


def word_spec(kernel: str, shapes: str | None, words: tuple[str, ...], default: str) -> set[str]:
    """A ``--shapes`` spec made of ``+``-joined words from ``words`` (None or empty = ``default``) as a
    set; ``ValueError`` naming the unknown words and the accepted ones."""
    spec = shapes or default
    given = [w.strip() for w in spec.split("+")]
    if "" in given:
        raise ValueError(f"bench --shapes for {kernel}: {spec!r} has an empty word (a '+' at an end or two in a "
                         f"row); expected '+'-joined words from: {', '.join(words)} (e.g. {default!r})")
    unknown = [w for w in given if w not in words]
    if unknown:
        raise ValueError(f"bench --shapes for {kernel}: unknown {', '.join(map(repr, unknown))}; expected "
                         f"'+'-joined words from: {', '.join(words)} (e.g. {default!r})")
    return set(given)


def no_spec(kernel: str, shapes: str | None, what: str) -> None:
    """``ValueError`` unless ``shapes`` is None or empty: the kernel's bench always runs ``what``."""
    if shapes:
        raise ValueError(f"bench --shapes: {kernel} takes none (it always runs {what}); got {shapes!r}")
