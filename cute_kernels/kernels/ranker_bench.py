"""What the ranker forward's and backward's benchmarks share (``cute-kernels bench --kernel ranker_fwd`` /
``ranker_bwd``): the issues' shapes, the peers' loading, the interleaved CUDA-graph timing loop and the host-time
records ("eager", "isolated").  Each kernel module's ``bench()`` says what one case runs (its inputs, our calls
and variants, the peers' arguments) and :func:`run` does the rest.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import torch

from ..runtime.timing import SETTLE_S, rotated

BENCH_CASES = [  # B, hist, cand, Hq, Hkv, D, cap   (the first is the issues' headline shape)
    (4, 4096, 512, 16, 16, 128, None),
    (4, 4096, 512, 16, 16, 128, 50.0),
    (4, 4096, 512, 16, 4, 128, None),
    (4, 4096, 512, 16, 16, 64, None),
    (1, 16384, 1024, 16, 16, 128, None),
    (16, 1024, 256, 16, 16, 128, None),
    (8, 2048, 2048, 8, 8, 128, None),
]
SHORT_CASES = BENCH_CASES[-2:]  # the issues' short, candidate-heavy shapes
# D=256 (the backward's head-dim split schedule): the headline shape and the short B=16 one (``--shapes d256``)
D256_CASES = [(4, 4096, 512, 16, 16, 256, None), (16, 1024, 256, 16, 16, 256, None)]

# Ours and the strongest peer are also timed as a torch user calls them: "eager" (back-to-back calls: host
# time shows only where it exceeds the kernel's) and "isolated" (one call on an idle GPU, synchronized after
# each: all of the host time counts; how the project's peer measurements, shared/bench-peers outside this
# repository, took the peer figures quoted in issues 3 and 4)
EAGER_IMPLS = ("cute_kernels", "fa4_mask_mod")


def bench_cases(spec: set[str], cases: list) -> list:
    """The bench cases a ``bench_shapes`` spec picks from ``cases``, in their order: ``headline`` the first two,
    ``mid`` those between (GQA 16/4, D=64, B=1 16K), ``short`` the last two (the issues' short, candidate-heavy
    shapes), any union of them; otherwise (``all``, or none of the three) all of them."""
    picked = ((cases[:2] if "headline" in spec else []) + (cases[2:-2] if "mid" in spec else [])
              + (cases[-2:] if "short" in spec else []))
    return picked or list(cases)


def load_peers(name: str):
    """``bench/<name>.py`` of a source checkout as a module (None when absent: an installed package)."""
    path = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # torch.compile (Flex) re-imports the mask_mod's module by name
    spec.loader.exec_module(mod)
    return mod


def time_us(fn) -> tuple[float, str]:
    """``(us per call, "graph")`` by CUDA-graph timing, or ``(us, "eager")`` for a call that cannot be captured
    (a peer; the reason is printed); either after :data:`SETTLE_S` seconds of calls (before session 82 the loop's
    first impl of each case, ours, was timed straight after the set-up's idle spell: up to ~13% faster at the
    short shapes than after the other impls, ``bench/ranker_timing_order_probe.py``)."""
    from ..runtime.timing import cuda_time_us

    current = torch.cuda.current_stream()  # (:func:`run`'s stream: the inputs and a peer's forward were made on it)
    stream = None if current == torch.cuda.default_stream() else current
    try:
        return cuda_time_us(fn, graph=True, stream=stream, settle_s=SETTLE_S), "graph"
    except Exception as exc:  # noqa: BLE001 (a peer that cannot be captured is timed eagerly; say why)
        print(f"CUDA-graph capture failed ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}); "
              "timing eagerly", file=sys.stderr, flush=True)
        torch.cuda.synchronize()
        return cuda_time_us(fn, graph=False, settle_s=SETTLE_S), "eager"


def _eager_time_us(fn) -> float:
    from ..runtime.timing import cuda_time_us

    return cuda_time_us(fn, graph=False, settle_s=SETTLE_S)


def _isolated_time_us(fn) -> float:
    from ..runtime.timing import cuda_time_us

    return cuda_time_us(fn, graph=False, inner=1)


_EAGER_TIMERS = (("eager", _eager_time_us), ("isolated", _isolated_time_us))


def host_mode_records(kernel: str, impls: list, times: dict, shape: dict, flops: int) -> list[dict]:
    """Records of :data:`EAGER_IMPLS` timed "eager" and "isolated" (only "isolated" for one whose rounds were
    timed eagerly already: its CUDA-graph capture failed); ``impls``: (name, fn) pairs; ``times``: name ->
    [(us, mode), ...] of the rounds, or None (failed: no records).  Each record also holds ``torch_mul_us``: the
    same timer on :func:`_host_yardstick` right after, a measure of the host's speed at that moment (it varies
    1.5x between runs on the H200's host, and an isolated call's time includes all of its host work)."""
    recs = []
    yardstick = None
    for impl, fn in impls:
        if impl not in EAGER_IMPLS or not times.get(impl):
            continue
        for mode, timer in _EAGER_TIMERS:
            if mode == times[impl][0][1]:
                continue
            try:
                t = timer(fn)
            except Exception as exc:  # noqa: BLE001 (a record says why)
                recs.append(dict(kernel=kernel, impl=impl, shape=shape, mode=mode, error=repr(exc)[:200]))
                break
            yardstick = yardstick or _host_yardstick()
            recs.append(dict(kernel=kernel, impl=impl, shape=shape, time_us=round(t, 1), mode=mode,
                             tflops=round(flops / t / 1e6, 1), torch_mul_us=round(timer(yardstick), 1),
                             **({"settle_s": SETTLE_S} if mode == "eager" else {})))
    return recs


def _host_yardstick():
    """``torch.mul`` of an 8-element CUDA tensor by itself (one tiny launch: its eager time is host time)."""
    a = torch.ones(8, device="cuda")
    return lambda: torch.mul(a, a)


def skipped_peer_records(kernel: str, shape: dict, peers, budget_s: float) -> list[dict]:
    """One error record per peer a bench left out of a shape because its peers' time budget was spent."""
    return [dict(kernel=kernel, impl=name, shape=shape,
                 error=f"skipped: the peers' time budget (peer_budget_s={budget_s:g}) was spent before this shape")
            for name in peers]


class Case(NamedTuple):
    """What a kernel's ``bench()`` sets up for one shape (its ``setup(case, generator)``): the record's ``shape``,
    the useful FLOPs of one call, ``impls`` ((name, fn) pairs: ours and our variants) and ``peer_args`` (what
    each ``make`` of the peers module's ``PEERS`` takes)."""

    shape: dict
    flops: int
    impls: list
    peer_args: tuple


def run(kernel: str, cases: list, setup: Callable[[tuple, torch.Generator], Case], peers_mod, peer_budget_s: float,
        rounds: int, echo: bool, timer: Optional[Callable] = None) -> list[dict]:
    """Time each case: ours, our variants and the peers of ``peers_mod`` (None: no peers; skipped, with a record
    each, once ``peer_budget_s`` seconds have gone by: their compiles are slow), interleaved over ``rounds``
    (the machine drifts; round ``r`` starts at the ``r``-th impl, so no impl is always timed first), by ``timer``
    (:func:`time_us`: after :data:`SETTLE_S` seconds of calls); then :data:`EAGER_IMPLS` "eager" and "isolated"
    (:func:`host_mode_records`).  Records: one per (impl, mode) with ``time_us`` (the best round), ``tflops``,
    ``runs_us`` (and ``settle_s`` where :func:`time_us` timed them); an ``error`` record for an impl that fails
    (its later rounds are skipped).  ``echo`` prints each case's records as JSON lines when it ends.

    On a GPU everything (set-up, the peers' forwards, timing) runs on one stream of the bench's own, on which
    :func:`time_us` captures: a peer's backward (``torch.autograd.grad``) runs on the stream its forward ran on, so
    a forward on the legacy default stream cannot be captured.  Until session 70 the first case's peers were
    timed eagerly for that reason (FA4, Flex and cuDNN alike), and the later cases' captured only because the
    failed capture had left torch's capture stream current
    (``bench/results/logs/2026-12-06_s70_h100_ranker_bwd_first_case_capture.log``)."""
    args = (kernel, cases, setup, peers_mod, peer_budget_s, rounds, echo, timer or time_us)
    if not torch.cuda.is_available():  # (the CPU tests' fake timers)
        return _run_cases(*args)
    caller, bench_stream = torch.cuda.current_stream(), torch.cuda.Stream()
    bench_stream.wait_stream(caller)  # (torch's streams do not wait for the legacy stream by themselves)
    try:
        with torch.cuda.stream(bench_stream):
            return _run_cases(*args)
    finally:
        caller.wait_stream(bench_stream)


def _run_cases(kernel, cases, setup, peers_mod, peer_budget_s, rounds, echo, timer) -> list[dict]:
    t_start = time.time()
    recs: list[dict] = []
    n_printed = 0
    for case in cases:
        # a generator of our own: a peer whose CUDA-graph capture failed can leave the default
        # generator unusable ("Offset increment outside graph capture")
        gen = torch.Generator(device="cuda").manual_seed(len(recs))
        c = setup(case, gen)
        impls = list(c.impls)
        if peers_mod is not None and time.time() - t_start < peer_budget_s:
            for name, make in peers_mod.PEERS.items():
                try:
                    impls.append((name, make(*c.peer_args)))
                except Exception as exc:  # noqa: BLE001 (a record per failing peer)
                    recs.append(dict(kernel=kernel, impl=name, shape=c.shape, error=repr(exc)[:200]))
        elif peers_mod is not None:  # (said in the records: a table without the peers' rows would not say why)
            recs.extend(skipped_peer_records(kernel, c.shape, peers_mod.PEERS, peer_budget_s))
        times: dict[str, Optional[list]] = {}
        for r in range(rounds):
            for impl, fn in rotated(impls, r):  # (each round starts one impl later)
                if impl in times and times[impl] is None:
                    continue
                try:
                    times.setdefault(impl, []).append(timer(fn))
                except Exception as exc:  # noqa: BLE001
                    times[impl] = None
                    recs.append(dict(kernel=kernel, impl=impl, shape=c.shape, error=repr(exc)[:200]))
        for impl, ts in times.items():
            if ts:
                t = min(x[0] for x in ts)
                recs.append(dict(kernel=kernel, impl=impl, shape=c.shape, time_us=round(t, 1), mode=ts[0][1],
                                 tflops=round(c.flops / t / 1e6, 1), runs_us=[round(x[0], 1) for x in ts],
                                 **({"settle_s": SETTLE_S} if timer is time_us else {})))
        recs += host_mode_records(kernel, impls, times, c.shape, c.flops)
        if echo:
            for r in recs[n_printed:]:
                print(json.dumps(r), flush=True)
            n_printed = len(recs)
        c = impls = fn = None  # (frees this shape's inputs before the next shape's)
    return recs
