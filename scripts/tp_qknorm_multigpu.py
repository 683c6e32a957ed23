"""Tensor-parallel Q/K RMSNorm (``ParallelQKNorm``) on 2, 4 or 8 real GPUs: correctness, stress, late and
missing ranks, latency (issue 6).  One process per GPU, NCCL, from the source tree (no install).

    python3 scripts/tp_qknorm_multigpu.py --out DIR [--world N | --world 2,4,8] [--quick]
        [--cases correctness,stress,late_rank,missing_rank,latency] [--deadline-s 560] [--seed 0]

On the project's device tool (a machine with several GPUs; the DSL kit is staged in ``.devkit``):

    run  kind: nvidia-h200-x4   (or nvidia-h200-x2 / nvidia-h200-x8)
         carry: [".devkit"]
         command: source .devkit/prelude.sh && python3 scripts/tp_qknorm_multigpu.py --out $OUT

Prefix ``CUTE_KERNELS_COMMIT=<sha>`` to stamp the commit when the device copy has no git metadata.  The device
tool brings back only a limited number of files from ``$OUT`` (session 26: the records and per-rank logs of
one world were left out), so pack them: ``--out $OUT/tp && tar czf $OUT/tp.tgz -C $OUT tp && rm -rf $OUT/tp``.
``--world`` defaults to ``torch.cuda.device_count()`` (rounded down to 2, 4 or 8); with fewer than 2 GPUs
the script prints why and exits 2.  A full run of one world should take a few minutes (estimated, not yet
measured: each case is a fresh set of processes, mostly start-up); ``--deadline-s`` (default 560, under the
tool's 600 s per command) stops starting cases that cannot finish, and reports them as not run.  For
G = 2, 4 and 8 on one x8 machine: one call per world (``--world 2``, ``--world 4``, default 8), or
``--world 2,4,8 --quick`` in one call.

Cases (each one spawns ``world`` processes with ``torch.multiprocessing``, NCCL, a file store):

* ``correctness``: every rank's q and k shards against the float64 reference of the gathered full
  tensors (``all_gather`` of the ranks' random shards, ``qknorm_tp.parallel_reference``), Q=6144 K=1024
  and Q=4096 K=1024, float16/bfloat16/float32, N from 1 up to the buffer capacity (8192) with odd values,
  shards as strided views of a NaN-padded qkv-like buffer (padding and rows >= N must stay NaN), zero
  rows; the unfused path (sums, ``all_reduce``, scale) is checked the same way for bfloat16;
* ``stress``: 10000 consecutive launches with N drawn from one fixed seed (the same sequence on every
  rank), ranks never joined between launches, each launch checked on the GPU; then 10000 CUDA-graph
  replays, one graph per N bucket, bucket sequence from one fixed seed;
* ``late_rank``: one rank (the last, then rank 0) sleeps a few seconds before its call; all ranks
  complete (the others wait inside the kernel) and are correct;
* ``missing_rank``: the last rank never calls; the others get ``PeerTimeoutError`` after the bounded
  wait (``timeout_s`` = 1 s here), further calls are refused, and ``reset()`` on every rank recovers;
* ``latency``: per-call time for N = 1, 8, 64, 512, 4096, 8192 (bfloat16): fused ``ParallelQKNorm``
  vs the unfused path (``ParallelQKNorm._run_unfused``: local sums -> ``torch.distributed.all_reduce``
  -> scale) vs NCCL ``all_reduce`` of the q/k shards themselves (one [N, (Q+K)/G] buffer); CUDA graph
  of ``inner`` calls and eager calls; CUDA events, median of ``reps`` samples, each sample started
  after a host barrier and a one-element NCCL all_reduce (so the ranks start together); rank 0's
  median is ``time_us``, every rank's median is kept in ``time_us_ranks``.

A parent watchdog bounds every case: a case that does not finish in time is reported as a hang (its
processes get SIGUSR1, which dumps their Python stacks into the logs, then SIGKILL); a process that
fails makes its peers be killed after a grace period.  Multicast stays off everywhere: the parent sets
``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1`` in
``os.environ`` before spawning, and every process checks them before it touches CUDA.  Every case
launches each kernel once while nothing spins (warm-up) before ranks run out of step: CUDA's lazy
module loading may synchronize a context, which would stall a rank whose previous launch waits for a
peer (see ``cute_kernels/kernels/qknorm_tp.py``).

Writes into DIR: ``tp_qknorm.json`` (a list of records: ``kernel="qknorm_tp"``, ``case``, ``impl``,
``mode``, ``shape`` = {world, n, q, k, dtype}, ``time_us`` (latency records; null for checks), ``passed``,
errors, and ``cute_kernels.cli.run_metadata()`` date/GPU/commit/torch plus the kernel-source fingerprint),
``summary.txt`` (the text printed last), ``logs/w<G>_<case>.rank<r>.log`` (each process's output) and
``parts/`` (raw per-rank records).  Exit status: 0 all passed, 1 a failure, 2 no usable GPUs / bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KERNEL = "qknorm_tp"
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SUPPORTED_WORLDS = (2, 4, 8)
SHAPES = ((6144, 1024), (4096, 1024))  # (Q, K) full sizes
DTYPE_NAMES = ("float16", "bfloat16", "float32")
CAPACITY = 8192  # push-buffer capacity (max_tokens) of every case but missing_rank
LATENCY_NS = (1, 8, 64, 512, 4096, 8192)
EPS = 1e-6
# (rtol, atol) per dtype: one rounding step of outputs up to ~10 (as tests/gpu/test_qknorm_tp_gpu.py)
TOL = {"float32": (2e-5, 2e-5), "bfloat16": (2**-7, 1e-2), "float16": (2**-10, 2e-3)}
CASES = ("correctness", "stress", "late_rank", "missing_rank", "latency")
CASE_TIMEOUT_S = {"correctness": 300, "stress": 300, "late_rank": 150, "missing_rank": 150, "latency": 240,
                  "_selftest_ok": 120, "_selftest_hang": 20}
FAIL_GRACE_S = 20.0  # peers of a failed process get this long to finish before they are killed


# ----------------------------------------------------------------------------- plan (CPU-testable)

def build_env(base: dict | None = None) -> dict:
    """The environment every rank process runs with: ``base`` (default ``os.environ``) with multicast
    forced off (``NO_MULTICAST_ENV``), the checkout first on ``PYTHONPATH`` and ``CUTE_DSL_ARCH``
    defaulting to sm_90a.  Returns a new dict; ``apply_env`` puts it into ``os.environ``."""
    env = dict(os.environ if base is None else base)
    env.update(NO_MULTICAST_ENV)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in paths if p != str(ROOT)])
    env.setdefault("CUTE_DSL_ARCH", "sm_90a")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def apply_env() -> dict:
    """Set ``build_env()`` in ``os.environ`` (spawned processes inherit it); returns the values set."""
    env = build_env()
    changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
    os.environ.update(changed)
    return {k: os.environ[k] for k in (*NO_MULTICAST_ENV, "PYTHONPATH", "CUTE_DSL_ARCH")}


def env_problems() -> list[str]:
    """What is wrong with this process's multicast settings (empty when all are as required)."""
    return [f"{k}={os.environ.get(k)!r} (need {v!r})" for k, v in NO_MULTICAST_ENV.items() if os.environ.get(k) != v]


def correctness_ns(capacity: int = CAPACITY, quick: bool = False) -> list[int]:
    """Token counts of the correctness case: 1 .. capacity, odd values and both sides of powers of two."""
    ns = [1, 3, 64, 333, 4097, capacity] if quick else [
        1, 2, 3, 5, 8, 31, 64, 127, 128, 333, 1000, 2047, 4096, 4099, capacity - 1, capacity]
    return sorted({n for n in ns if 1 <= n <= capacity})


def n_sequence(seed: int, count: int, capacity: int = CAPACITY) -> list[int]:
    """The stress case's N per launch: extremes first, then uniform in [1, capacity] from ``seed``.

    Depends on the arguments only (``random.Random``, no hash randomization, no rank), so every rank
    derives the same sequence: ranks must make the same calls with the same N."""
    rng = random.Random(seed)
    head = [1, capacity, 1, capacity, 2, capacity - 1]
    return (head + [rng.randint(1, capacity) for _ in range(max(0, count - len(head)))])[:count]


def graph_buckets(capacity: int = CAPACITY, quick: bool = False) -> list[int]:
    """N of the CUDA graphs of the stress case (one graph each)."""
    ns = [1, 17, 333, capacity] if quick else [1, 2, 17, 64, 255, 1000, 3001, capacity]
    return sorted({n for n in ns if 1 <= n <= capacity})


def bucket_sequence(seed: int, count: int, buckets: int) -> list[int]:
    """Which graph each stress replay runs: every bucket once (in order), then uniform from ``seed``."""
    rng = random.Random(seed)
    head = list(range(buckets))
    return (head + [rng.randrange(buckets) for _ in range(max(0, count - buckets))])[:count]


def plan(world: int, quick: bool = False, seed: int = 0) -> dict:
    """Every number a case uses (identical on every rank: it depends on its arguments only)."""
    launches = 1000 if quick else 10000
    return dict(
        world=world, quick=quick, seed=seed, capacity=CAPACITY, eps=EPS,
        shapes=[list(s) for s in SHAPES], dtypes=list(DTYPE_NAMES),
        correctness_ns=correctness_ns(CAPACITY, quick),
        unfused_ns=[1, 333, 4096],
        stress=dict(q=4096, k=1024, dtype="bfloat16", launches=launches, seed=seed + 1,
                    graph_buckets=graph_buckets(CAPACITY, quick), graph_seed=seed + 2),
        late=dict(n=333, sleep_s=2.0 if quick else 4.0, timeout_s=10.0),
        missing=dict(n=64, capacity=256, timeout_s=1.0),
        latency=dict(shapes=[[4096, 1024]] if quick else [[4096, 1024], [6144, 1024]], dtype="bfloat16",
                     ns=list(LATENCY_NS), reps=10 if quick else 30, inner=10 if quick else 20, warmup=3),
    )


def parse_worlds(text: str | None, gpus: int) -> list[int]:
    if text is None:  # all GPUs (the largest supported world that fits when the count is odd)
        return [max((w for w in SUPPORTED_WORLDS if w <= gpus), default=gpus)]
    try:
        return [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        return []


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


# ----------------------------------------------------------------------------- records

def _part_path(parts: Path, world: int, case: str, rank: int) -> Path:
    return parts / f"w{world}_{case}.rank{rank}.jsonl"


class RecordWriter:
    """Append-only JSON lines (flushed per record, so a killed process keeps what it had)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "a", buffering=1)

    def write(self, **rec) -> None:
        self.f.write(json.dumps(rec, default=str) + "\n")
        self.f.flush()


def read_parts(parts: Path, world: int, case: str) -> list[dict]:
    recs = []
    for p in sorted(parts.glob(f"w{world}_{case}.rank*.jsonl")):
        for line in p.read_text().splitlines():
            if line.strip():
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by a kill
    return recs


# ----------------------------------------------------------------------------- rank process

@dataclass
class Ctx:
    rank: int
    world: int
    plan: dict
    out: RecordWriter
    cpu_group: object = None  # gloo group for host barriers and small host gathers

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} rank {self.rank}] {msg}", flush=True)

    def check(self, case: str, impl: str, shape: dict, passed: bool, **extra) -> None:
        self.out.write(kind="check", case=case, impl=impl, rank=self.rank, shape=shape, passed=bool(passed), **extra)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.cpu_group)

    def gather_object(self, obj) -> list:
        import torch.distributed as dist

        everyone = [None] * self.world
        dist.all_gather_object(everyone, obj, group=self.cpu_group)
        return everyone


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def _errors(q, k, ref_q, ref_k, rtol: float):
    """GPU tensor [2]: (max over q and k of |out - ref| - rtol |ref|, max |out - ref|); NaN propagates."""
    import torch

    dq, dk = (q.float() - ref_q.float()).abs(), (k.float() - ref_k.float()).abs()
    excess = torch.maximum((dq - rtol * ref_q.float().abs()).amax(), (dk - rtol * ref_k.float().abs()).amax())
    return torch.stack([excess, torch.maximum(dq.amax(), dk.amax())])


def _gathered_inputs(ctx: Ctx, cap: int, q_dim: int, k_dim: int, dtype, seed: int, zero_rows=(1, 200)):
    """This rank's random shards, the full tensors gathered from all ranks, and this rank's float64
    reference (``parallel_reference`` of the gathered tensors) in the input dtype."""
    import torch
    import torch.distributed as dist

    from cute_kernels.kernels.qknorm_tp import parallel_reference

    qw, kw = q_dim // ctx.world, k_dim // ctx.world
    gen = torch.Generator(device="cuda").manual_seed(seed * 1009 + ctx.rank)
    q = (torch.randn(cap, qw, generator=gen, device="cuda") * 2).to(dtype)
    k = torch.randn(cap, kw, generator=gen, device="cuda").to(dtype)
    wq = torch.randn(qw, generator=gen, device="cuda").to(dtype)
    wk = torch.randn(kw, generator=gen, device="cuda").to(dtype)
    for r in zero_rows:  # a token whose q and k are zero on every rank
        if r < cap:
            q[r].zero_()
            k[r].zero_()

    def gathered(x):
        parts = [torch.empty_like(x) for _ in range(ctx.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    qf, kf, wqf, wkf = gathered(q), gathered(k), gathered(wq), gathered(wk)
    assert torch.equal(qf[:, ctx.rank * qw:(ctx.rank + 1) * qw], q), "gathered tensor is not in rank order"
    ref_q, ref_k = parallel_reference(qf, kf, wqf, wkf, EPS, ctx.world)[ctx.rank]
    del qf, kf
    return q, k, wq, wk, ref_q, ref_k


def _new_norm(ctx: Ctx, cap: int, q_dim: int, k_dim: int, dtype, timeout_s: float = 10.0):
    from cute_kernels.kernels.qknorm_tp import ParallelQKNorm

    inst = ParallelQKNorm(None, cap, q_dim, k_dim, dtype, timeout_s=timeout_s)
    if not inst.fused:
        raise RuntimeError("ParallelQKNorm chose the unfused path (ranks not all P2P-reachable, or "
                           "CUTE_KERNELS_QKNORM_UNFUSED=1): nothing of the fused kernel would be tested")
    return inst


def _exchange_kind(inst) -> str:
    return "symm_mem" if getattr(inst, "_symm_handle", None) is not None else "cuda_ipc"


def case_correctness(ctx: Ctx) -> None:
    import torch

    p = ctx.plan
    cap = p["capacity"]
    for q_dim, k_dim in p["shapes"]:
        for dname in p["dtypes"]:
            dtype = _dtype(dname)
            rtol, atol = TOL[dname]
            inst = _new_norm(ctx, cap, q_dim, k_dim, dtype)
            q, k, wq, wk, ref_q, ref_k = _gathered_inputs(ctx, cap, q_dim, k_dim, dtype, p["seed"])
            qw, kw = q.shape[1], k.shape[1]
            # shards as strided views of a qkv-like buffer with NaN padding (8 columns) and NaN rows >= N
            buf = torch.empty(cap, qw + kw + 8, device="cuda", dtype=dtype)
            impls = [("cute_kernels_fused", p["correctness_ns"], inst)]
            if dname == "bfloat16":
                impls.append(("torch_unfused", p["unfused_ns"], lambda *a: inst._run_unfused(*a)))
            for impl, ns, fn in impls:
                for n in ns:
                    buf.fill_(float("nan"))
                    buf[:n, :qw].copy_(q[:n])
                    buf[:n, qw:qw + kw].copy_(k[:n])
                    qv, kv = buf[:n, :qw], buf[:n, qw:qw + kw]
                    fn(qv, kv, wq, wk, EPS)
                    torch.cuda.synchronize()
                    inst.check_error(synchronize=False)
                    excess, err = _errors(qv, kv, ref_q[:n], ref_k[:n], rtol).tolist()
                    pad_ok = bool(buf[:n, qw + kw:].isnan().all()) and bool(buf[n:].isnan().all())
                    ok = excess <= atol and pad_ok
                    ctx.check("correctness", impl, dict(world=ctx.world, n=n, q=q_dim, k=k_dim, dtype=dname), ok,
                              max_abs_err=err, max_excess=excess, atol=atol, rtol=rtol, padding_untouched=pad_ok,
                              exchange=_exchange_kind(inst))
                    if not ok:
                        ctx.log(f"FAIL correctness {impl} Q={q_dim} K={k_dim} {dname} N={n}: err {err:.3g} "
                                f"excess {excess:.3g} padding_untouched={pad_ok}")
            ctx.log(f"correctness Q={q_dim} K={k_dim} {dname} done")
            del buf, q, k, ref_q, ref_k
            torch.cuda.empty_cache()


def case_stress(ctx: Ctx) -> None:
    import torch

    from cute_kernels.kernels.qknorm_tp import PeerTimeoutError

    s = ctx.plan["stress"]
    cap, dname = ctx.plan["capacity"], s["dtype"]
    dtype = _dtype(dname)
    rtol, atol = TOL[dname]
    inst = _new_norm(ctx, cap, s["q"], s["k"], dtype)
    src_q, src_k, wq, wk, ref_q, ref_k = _gathered_inputs(ctx, cap, s["q"], s["k"], dtype, ctx.plan["seed"] + 7)
    work_q, work_k = torch.empty_like(src_q), torch.empty_like(src_k)
    err = torch.zeros(2, device="cuda")  # (max excess over rtol |ref|, max |out - ref|) over all launches
    shape = dict(world=ctx.world, q=s["q"], k=s["k"], dtype=dname, n="1..%d" % cap)

    def one_launch(n: int) -> None:
        work_q[:n].copy_(src_q[:n])
        work_k[:n].copy_(src_k[:n])
        inst(work_q[:n], work_k[:n], wq, wk, EPS)
        torch.maximum(err, _errors(work_q[:n], work_k[:n], ref_q[:n], ref_k[:n], rtol), out=err)

    for n in (1, 7, cap):  # warm-up: every kernel loaded while nothing spins
        one_launch(n)
        torch.cuda.synchronize()
        ctx.barrier()
    err.zero_()

    # eager: consecutive launches, ranks never joined
    seq = n_sequence(s["seed"], s["launches"], cap)
    t0 = time.perf_counter()
    for i, n in enumerate(seq):
        one_launch(n)
        if inst._error_np[0]:
            raise PeerTimeoutError(f"rank {ctx.rank}: a wait timed out, seen at eager launch {i} (N={n})")
        if i % 1000 == 0:
            ctx.log(f"stress eager launch {i}/{len(seq)}")
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    inst.check_error()
    e, a = err.tolist()
    ctx.check("stress", "cute_kernels_fused", shape, e <= atol, mode="eager", launches=len(seq), max_excess=e,
              max_abs_err=a, atol=atol, wall_s=wall, max_n=max(seq), seq_head=seq[:8])
    ctx.log(f"stress eager: {len(seq)} launches in {wall:.1f} s, max excess {e:.3g}")

    # CUDA graphs: one per N bucket, each with its own memory pool (replayed in any order), seeded order
    buckets = s["graph_buckets"]
    for n in buckets:
        one_launch(n)
    torch.cuda.synchronize()
    ctx.barrier()
    err.zero_()
    graphs = []
    for n in buckets:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):  # NCCL watchdog thread
            one_launch(n)
        graphs.append(g)
    torch.cuda.synchronize()
    err.zero_()
    ctx.barrier()
    order = bucket_sequence(s["graph_seed"], s["launches"], len(buckets))
    t0 = time.perf_counter()
    for i, b in enumerate(order):
        graphs[b].replay()
        if inst._error_np[0]:
            raise PeerTimeoutError(f"rank {ctx.rank}: a wait timed out, seen at graph replay {i} (N={buckets[b]})")
        if i % 1000 == 0:
            ctx.log(f"stress graph replay {i}/{len(order)}")
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    inst.check_error()
    e, a = err.tolist()
    ctx.check("stress", "cute_kernels_fused", dict(shape, n=buckets), e <= atol, mode="graph", launches=len(order),
              max_excess=e, max_abs_err=a, atol=atol, wall_s=wall, graphs=len(graphs))
    ctx.log(f"stress graph: {len(order)} replays in {wall:.1f} s, max excess {e:.3g}")


def case_late_rank(ctx: Ctx) -> None:
    import torch

    lp = ctx.plan["late"]
    q_dim, k_dim, dname, n = 4096, 1024, "bfloat16", lp["n"]
    rtol, atol = TOL[dname]
    inst = _new_norm(ctx, 1024, q_dim, k_dim, _dtype(dname), timeout_s=lp["timeout_s"])
    src_q, src_k, wq, wk, ref_q, ref_k = _gathered_inputs(ctx, n, q_dim, k_dim, _dtype(dname), ctx.plan["seed"] + 11)
    work_q, work_k = torch.empty_like(src_q), torch.empty_like(src_k)

    def call():
        work_q.copy_(src_q)
        work_k.copy_(src_k)
        inst(work_q, work_k, wq, wk, EPS)

    call()  # warm-up
    _errors(work_q, work_k, ref_q, ref_k, rtol).tolist()
    torch.cuda.synchronize()
    inst.check_error()
    for late in sorted({ctx.world - 1, 0}, reverse=True):
        ctx.barrier()
        if ctx.rank == late:
            time.sleep(lp["sleep_s"])
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        inst.check_error()
        e, a = _errors(work_q, work_k, ref_q, ref_k, rtol).tolist()
        ctx.check("late_rank", "cute_kernels_fused", dict(world=ctx.world, n=n, q=q_dim, k=k_dim, dtype=dname),
                  e <= atol, variant=f"rank {late} late by {lp['sleep_s']} s", late_rank=late, is_late=ctx.rank == late,
                  call_wall_s=wall, max_excess=e, max_abs_err=a, atol=atol)
        ctx.log(f"late rank {late}: my call took {wall:.3f} s, excess {e:.3g}")


def case_missing_rank(ctx: Ctx) -> None:
    import torch

    from cute_kernels.kernels.qknorm_tp import PeerTimeoutError

    mp_ = ctx.plan["missing"]
    q_dim, k_dim, dname, n, timeout_s = 4096, 1024, "bfloat16", mp_["n"], mp_["timeout_s"]
    rtol, atol = TOL[dname]
    inst = _new_norm(ctx, mp_["capacity"], q_dim, k_dim, _dtype(dname), timeout_s=timeout_s)
    src_q, src_k, wq, wk, ref_q, ref_k = _gathered_inputs(ctx, n, q_dim, k_dim, _dtype(dname), ctx.plan["seed"] + 13)
    work_q, work_k = torch.empty_like(src_q), torch.empty_like(src_k)
    shape = dict(world=ctx.world, n=n, q=q_dim, k=k_dim, dtype=dname)

    def call():
        work_q.copy_(src_q)
        work_k.copy_(src_k)
        inst(work_q, work_k, wq, wk, EPS)

    call()  # warm-up with every rank
    _errors(work_q, work_k, ref_q, ref_k, rtol).tolist()
    torch.cuda.synchronize()
    inst.check_error()
    ctx.barrier()
    missing = ctx.world - 1
    if ctx.rank == missing:
        ctx.check("missing_rank", "cute_kernels_fused", shape, True, variant=f"rank {missing} never calls",
                  role="missing (did not call)", timeout_s=timeout_s)
    else:
        t0 = time.perf_counter()
        call()
        got, msg = "no error", ""
        try:
            inst.check_error()
        except PeerTimeoutError as exc:
            got, msg = "PeerTimeoutError", str(exc)
        wall = time.perf_counter() - t0
        try:
            call()
            refused = False
        except PeerTimeoutError:
            refused = True
        bounded = 0.5 * timeout_s <= wall <= 3 * timeout_s + 5
        ok = got == "PeerTimeoutError" and refused and bounded
        ctx.check("missing_rank", "cute_kernels_fused", shape, ok, variant=f"rank {missing} never calls",
                  role="waiting", error=got, message=msg[:300], wait_s=wall, timeout_s=timeout_s,
                  next_call_refused=refused, wait_bounded=bounded)
        ctx.log(f"missing rank: got {got} after {wall:.2f} s (timeout {timeout_s} s), next call refused={refused}")
    ctx.barrier()  # every waiting rank's launch has ended (check_error synchronized)
    inst.reset()  # collective
    call()
    torch.cuda.synchronize()
    inst.check_error()
    e, a = _errors(work_q, work_k, ref_q, ref_k, rtol).tolist()
    ctx.check("missing_rank", "cute_kernels_fused", shape, e <= atol, variant="after reset() on every rank",
              max_excess=e, max_abs_err=a, atol=atol)


def _timed(ctx: Ctx, fn, graph: bool, reps: int, inner: int, warmup: int):
    """(median us per call on this rank, error text or None); collective: every rank calls it alike."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ctx.barrier()
    problem = None
    if graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, capture_error_mode="thread_local"):  # NCCL watchdog thread
                for _ in range(inner):
                    fn()
            run = g.replay
        except Exception as exc:  # a baseline that cannot be captured: reported, not fatal
            problem = f"graph capture failed: {type(exc).__name__}: {exc}"[:300]
        problems = ctx.gather_object(problem)
        if any(problems):
            torch.cuda.synchronize()
            return None, next(p for p in problems if p)
    else:
        def run():
            for _ in range(inner):
                fn()
    tiny = torch.zeros(1, device="cuda")
    samples = []
    for _ in range(reps):
        ctx.barrier()
        dist.all_reduce(tiny)  # the ranks' GPUs leave this together: a common start
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / inner)
    return statistics.median(samples), None


def case_latency(ctx: Ctx) -> None:
    import torch
    import torch.distributed as dist

    lp = ctx.plan["latency"]
    dname = lp["dtype"]
    dtype = _dtype(dname)
    for q_dim, k_dim in lp["shapes"]:
        inst = _new_norm(ctx, max(lp["ns"]), q_dim, k_dim, dtype)
        qw, kw = q_dim // ctx.world, k_dim // ctx.world
        wq, wk = torch.ones(qw, device="cuda", dtype=dtype), torch.ones(kw, device="cuda", dtype=dtype)
        for n in lp["ns"]:
            fused_buf = torch.randn(n, qw + kw, device="cuda").to(dtype)  # q and k as views of one qkv-like row
            unfused_buf = fused_buf.clone()
            shards = torch.zeros(n, qw + kw, device="cuda", dtype=dtype)  # zeros: repeated sums stay finite
            fq, fk, uq, uk = fused_buf[:, :qw], fused_buf[:, qw:], unfused_buf[:, :qw], unfused_buf[:, qw:]
            impls = (
                ("cute_kernels_fused", lambda: inst(fq, fk, wq, wk, EPS)),
                ("torch_unfused", lambda: inst._run_unfused(uq, uk, wq, wk, EPS)),
                ("nccl_allreduce_qk_shards", lambda: dist.all_reduce(shards)),
            )
            for impl, fn in impls:
                for mode in ("graph", "eager"):
                    t, problem = _timed(ctx, fn, mode == "graph", lp["reps"], lp["inner"], lp["warmup"])
                    times = ctx.gather_object(t)
                    if ctx.rank == 0:
                        ok = problem is None or impl != "cute_kernels_fused"
                        ctx.out.write(kind="latency", case="latency", kernel=KERNEL, impl=impl, mode=mode,
                                      shape=dict(world=ctx.world, n=n, q=q_dim, k=k_dim, dtype=dname),
                                      time_us=times[0], time_us_ranks=times,
                                      time_us_max=max(times) if None not in times else None,
                                      reps=lp["reps"], inner=lp["inner"], passed=ok, note=problem,
                                      exchange=_exchange_kind(inst))
            inst.check_error()
            ctx.log(f"latency Q={q_dim} K={k_dim} N={n} done")


def _selftest_ok(ctx: Ctx) -> None:
    """CPU self-test case (gloo, no CUDA): the launcher machinery, used by tests/test_tp_launcher.py."""
    ctx.barrier()
    seq = n_sequence(ctx.plan["seed"] + 1, 50)
    everyone = ctx.gather_object(seq)
    ctx.check("_selftest_ok", "launcher", dict(world=ctx.world), all(s == seq for s in everyone),
              env_ok=not env_problems())


def _selftest_hang(ctx: Ctx) -> None:
    """CPU self-test case: rank 0 never returns (the watchdog must kill it); the others finish."""
    if ctx.rank == 0:
        ctx.log("hanging on purpose")
        while True:
            time.sleep(1)


CASE_FUNCS = {"correctness": case_correctness, "stress": case_stress, "late_rank": case_late_rank,
              "missing_rank": case_missing_rank, "latency": case_latency,
              "_selftest_ok": _selftest_ok, "_selftest_hang": _selftest_hang}


def _worker(rank: int, world: int, case: str, cfg: dict) -> None:
    """One rank of one case (spawned).  Output goes to its log; records to its part file."""
    log = open(cfg["logs"] / f"w{world}_{case}.rank{rank}.log", "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    import faulthandler

    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)  # the watchdog asks for stacks
    out = RecordWriter(_part_path(cfg["parts"], world, case, rank))
    cpu_only = case.startswith("_selftest")
    ctx = Ctx(rank, world, cfg["plan"], out)
    code = 0
    try:
        bad = env_problems()
        if bad:
            raise RuntimeError("multicast must stay off; environment has " + ", ".join(bad))
        import torch
        import torch.distributed as dist

        if cpu_only:
            dist.init_process_group("gloo", init_method=cfg["init"], rank=rank, world_size=world)
            ctx.cpu_group = dist.group.WORLD
        else:
            torch.cuda.set_device(rank)
            dist.init_process_group("nccl", init_method=cfg["init"], rank=rank, world_size=world,
                                    device_id=torch.device("cuda", rank))
            ctx.cpu_group = dist.new_group(backend="gloo")
            if rank == 0:
                from cute_kernels.cli import run_metadata
                from cute_kernels.runtime.cache import source_fingerprint

                meta = run_metadata()
                meta["source_fingerprint"] = source_fingerprint()
                meta["gpu_count"] = torch.cuda.device_count()
                out.write(kind="meta", meta=meta)
        ctx.log(f"{case}: world {world}, env " + " ".join(f"{k}={os.environ.get(k)}" for k in NO_MULTICAST_ENV))
        t0 = time.perf_counter()
        CASE_FUNCS[case](ctx)
        ctx.barrier()
        out.write(kind="done", case=case, rank=rank, wall_s=time.perf_counter() - t0)
        ctx.log(f"{case}: done")
        # no destroy_process_group(): tearing down NCCL next to live peer mappings could block, and the
        # process ends right here (os._exit) anyway
    except BaseException as exc:  # recorded for the parent; peers blocked on us are killed by its watchdog
        code = 1
        traceback.print_exc()
        out.write(kind="error", case=case, rank=rank, error=f"{type(exc).__name__}: {exc}"[:1000])
    log.flush()
    os._exit(code)  # no atexit handlers (a destroy of a broken NCCL group could block)


# ----------------------------------------------------------------------------- parent

@dataclass
class CaseOutcome:
    world: int
    case: str
    exitcodes: list
    reason: str | None  # hang / crash text, None when every process exited 0
    wall_s: float
    log_tails: dict = field(default_factory=dict)


def _tail(path: Path, lines: int = 6) -> str:
    """The end of a rank's log; after a stack dump: the last log line before it and the innermost frames."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    dumps = [i for i, t in enumerate(text) if t.startswith("Current thread ")]
    if not dumps:
        return "\n".join(text[-lines:])
    first = min(i for i, t in enumerate(text) if t.startswith(("Current thread ", "Thread 0x")))
    before = [t for t in text[:first] if t.startswith("[")][-1:]
    return "\n".join(before + text[dumps[-1]:dumps[-1] + lines])


def run_case(world: int, case: str, cfg: dict, timeout_s: float) -> CaseOutcome:
    """Spawn ``world`` rank processes for ``case``; watchdog: kill all on timeout (a hang) or shortly
    after one of them failed."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    store_dir = Path(tempfile.mkdtemp(prefix=f"tpqk_w{world}_{case}_"))
    cfg = dict(cfg, init=f"file://{store_dir / 'store'}")
    for p in cfg["parts"].glob(f"w{world}_{case}.rank*.jsonl"):
        p.unlink()
    procs = [ctx.Process(target=_worker, args=(r, world, case, cfg), name=f"tp_qknorm-{case}-{r}")
             for r in range(world)]
    t0 = time.monotonic()
    reason = None
    try:
        for p in procs:
            p.start()
        first_fail = None
        while True:
            time.sleep(0.2)
            codes = [p.exitcode for p in procs]
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if first_fail is None and any(c not in (None, 0) for c in codes):
                first_fail = now
            if first_fail is not None and now - first_fail > FAIL_GRACE_S:
                reason = (f"rank(s) {[r for r, c in enumerate(codes) if c not in (None, 0)]} failed; "
                          f"rank(s) {[r for r, c in enumerate(codes) if c is None]} still running after "
                          f"{FAIL_GRACE_S:g} s: killed")
                break
            if now - t0 > timeout_s:
                reason = (f"HANG: watchdog fired after {timeout_s:.0f} s; rank(s) "
                          f"{[r for r, c in enumerate(codes) if c is None]} still running: killed "
                          "(Python stacks in their logs)")
                break
    finally:
        alive = [p for p in procs if p.exitcode is None and p.pid is not None]
        for p in alive:
            try:
                os.kill(p.pid, signal.SIGUSR1)  # faulthandler: dump stacks into the rank's log
            except OSError:
                pass
        if alive:
            time.sleep(2.0)
        for p in alive:
            p.kill()
        for p in procs:
            p.join(timeout=10)
        shutil.rmtree(store_dir, ignore_errors=True)
    codes = [p.exitcode for p in procs]
    if reason is None and any(c != 0 for c in codes):
        reason = f"process exit codes {codes}"
    tails = {r: _tail(cfg["logs"] / f"w{world}_{case}.rank{r}.log") for r in range(world)} if reason else {}
    return CaseOutcome(world, case, codes, reason, time.monotonic() - t0, tails)


def merge_records(world: int, case: str, recs: list[dict],
                  outcome: CaseOutcome | None) -> tuple[list[dict], dict | None]:
    """Check records merged over ranks (one per case/impl/mode/variant/shape: passed on every rank,
    worst error), latency records as written by rank 0, plus a record for a crashed/hung case.
    Returns (records, meta)."""
    meta = next((r["meta"] for r in recs if r.get("kind") == "meta"), None)
    recs = [r for r in recs if r.get("case") == case]
    groups: dict[str, list[dict]] = {}
    merged = []
    for r in recs:
        if r.get("kind") == "check":
            key = json.dumps([r["case"], r["impl"], r.get("mode"), r.get("variant"), r["shape"]], sort_keys=True)
            groups.setdefault(key, []).append(r)
        elif r.get("kind") == "latency":
            merged.append({k: v for k, v in r.items() if k != "kind"})
    for rows in groups.values():
        first = rows[0]
        rec = dict(kernel=KERNEL, case=first["case"], impl=first["impl"], mode=first.get("mode"), shape=first["shape"],
                   time_us=None, ranks=sorted(r["rank"] for r in rows))
        if first.get("variant"):
            rec["variant"] = first["variant"]
        rec["passed"] = all(r["passed"] for r in rows) and len({r["rank"] for r in rows}) == world
        for k in ("max_abs_err", "max_excess", "wall_s", "wait_s", "call_wall_s"):
            vals = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
            if vals:
                rec[k] = max(vals)
        skip = {"kind", "case", "impl", "mode", "shape", "rank", "passed", "variant"}
        rec["per_rank"] = [{k: v for k, v in r.items() if k not in skip} for r in sorted(rows, key=lambda r: r["rank"])]
        merged.append(rec)
    errors = [r for r in recs if r.get("kind") == "error"]
    done = {r["rank"] for r in recs if r.get("kind") == "done"}
    if outcome is not None and (outcome.reason or errors or len(done) != world):
        merged.append(dict(kernel=KERNEL, case=case, impl="process", mode=None, shape=dict(world=world), time_us=None,
                           passed=False, error=outcome.reason or "not every rank finished",
                           rank_errors={r["rank"]: r["error"] for r in errors}, exitcodes=outcome.exitcodes,
                           log_tails=outcome.log_tails, wall_s=outcome.wall_s))
    return merged, meta


def _fmt_us(t) -> str:
    return f"{t:8.2f}" if isinstance(t, (int, float)) else "     n/a"


def summarize(records: list[dict], worlds: list[int], cases: list[str], not_run: list[tuple]) -> tuple[str, bool]:
    lines, all_ok = [], True
    lat = [r for r in records if r.get("case") == "latency" and r.get("time_us", 0) is not None and "n" in r["shape"]]
    if lat:
        lines.append("latency per call, us (rank 0 median): fused ParallelQKNorm | unfused (sums, all_reduce, scale) "
                     "| NCCL all_reduce of the q/k shards")
        short = {"cute_kernels_fused": "fused", "torch_unfused": "unfused", "nccl_allreduce_qk_shards": "nccl_ar"}
        cols = [(i, m) for i in short for m in ("graph", "eager")]
        lines.append(f"{'G':>2} {'Q':>5} {'K':>5} {'N':>5} " + " ".join(f"{short[i] + '/' + m:>14}" for i, m in cols))
        table = {}
        for r in lat:
            s = r["shape"]
            table.setdefault((s["world"], s["q"], s["k"], s["n"]), {})[(r["impl"], r["mode"])] = r["time_us"]
        for key in sorted(table):
            lines.append(f"{key[0]:>2} {key[1]:>5} {key[2]:>5} {key[3]:>5} " +
                         " ".join(f"{_fmt_us(table[key].get(c)):>14}" for c in cols))
        lines.append("")
    lines.append(f"tp_qknorm multi-GPU summary ({len(records)} records)")
    for w in worlds:
        for case in cases:
            rows = [r for r in records if r.get("case") == case and r["shape"].get("world") == w]
            skipped = [x for x in not_run if x[0] == w and x[1] == case]
            if skipped:
                lines.append(f"  NOT RUN G={w} {case:<13} {skipped[0][2]}")
                all_ok = False
                continue
            bad = [r for r in rows if not r.get("passed")]
            ok = bool(rows) and not bad
            all_ok &= ok
            detail = f"{len(rows) - len(bad)}/{len(rows)} records passed"
            errs = [r["max_abs_err"] for r in rows if isinstance(r.get("max_abs_err"), (int, float))]
            if errs:
                detail += f", worst |out - ref| {max(errs):.3g}"
            lines.append(f"  {'PASS' if ok else 'FAIL'}    G={w} {case:<13} {detail}")
            for r in bad[:8]:
                false = sorted({k for pr in r.get("per_rank", []) for k, v in pr.items() if v is False})
                what = r.get("error") or (f"max_abs_err={r.get('max_abs_err')} max_excess={r.get('max_excess')}"
                                          f"{' false: ' + ','.join(false) if false else ''} {r.get('variant') or ''}")
                lines.append(f"      failed: {r['impl']} {r.get('mode') or ''} {json.dumps(r['shape'])}: {what}")
                for rank, tail in (r.get("log_tails") or {}).items():
                    if tail:
                        lines.append(f"      rank {rank} log tail:")
                        lines += ["        " + t for t in tail.splitlines()]
    lines.append(f"OVERALL: {'PASS' if all_ok else 'FAIL'}")
    return "\n".join(lines), all_ok


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tp_qknorm_multigpu.py",
        description="ParallelQKNorm on several GPUs (one process per GPU, NCCL): correctness, stress, "
                    "late/missing rank, latency.  Exit 0 pass, 1 fail, 2 no usable GPUs / bad usage.")
    ap.add_argument("--out", required=True, help="output folder (tp_qknorm.json, summary.txt, logs/)")
    ap.add_argument("--world", default=None,
                    help="GPUs (ranks) per run, 2, 4 or 8, or a comma list such as 2,4,8 "
                         "(default: torch.cuda.device_count())")
    ap.add_argument("--quick", action="store_true", help="fewer N values, 1000 stress launches, fewer timing reps")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of cases (default all: {','.join(CASES)})")
    ap.add_argument("--deadline-s", type=float, default=560.0,
                    help="stop starting cases after this many seconds in total (default 560)")
    ap.add_argument("--seed", type=int, default=0, help="seed of data and N sequences (same on every rank)")
    ap.epilog = ("device tool: run with kind nvidia-h200-x4 (or x2/x8), carry [\".devkit\"], command "
                 "'source .devkit/prelude.sh && python3 scripts/tp_qknorm_multigpu.py --out $OUT/tp; "
                 "tar czf $OUT/tp.tgz -C $OUT tp && rm -rf $OUT/tp' (the tool brings back only a few files)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    t_start = time.monotonic()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASE_FUNCS]
    if unknown:
        print(f"tp_qknorm_multigpu: unknown case(s) {unknown}; choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    gpus = gpu_count()
    selftest = all(c.startswith("_selftest") for c in cases)
    if gpus < 2 and not selftest:
        print(f"tp_qknorm_multigpu: needs at least 2 CUDA GPUs (one process per GPU), found {gpus}. "
              "Run it on a machine with 2, 4 or 8 GPUs, e.g. the device tool's nvidia-h200-x4.", file=sys.stderr)
        print(f"tp_qknorm_multigpu: not run (found {gpus} GPUs)")
        return 2
    worlds = parse_worlds(args.world, gpus)
    if not worlds:
        print(f"tp_qknorm_multigpu: --world {args.world!r}: expected 2, 4 or 8 or a comma list such as 2,4,8",
              file=sys.stderr)
        return 2
    for w in worlds:
        if w not in SUPPORTED_WORLDS or (not selftest and w > gpus):
            print(f"tp_qknorm_multigpu: --world {w}: must be one of {SUPPORTED_WORLDS} (Q and K split evenly) "
                  f"and at most the {gpus} GPUs found", file=sys.stderr)
            return 2
    env = apply_env()  # before any process is spawned
    print("environment for every rank: " + " ".join(f"{k}={v}" for k, v in env.items() if k in NO_MULTICAST_ENV),
          flush=True)
    out = Path(args.out).resolve()
    cfg = dict(parts=out / "parts", logs=out / "logs")
    for d in cfg.values():
        d.mkdir(parents=True, exist_ok=True)

    records, meta, not_run = [], None, []
    for w in worlds:
        cfg["plan"] = plan(w, args.quick, args.seed)
        for case in cases:
            left = args.deadline_s - (time.monotonic() - t_start)
            scale = 0.6 if args.quick and not case.startswith("_selftest") else 1.0
            timeout = min(CASE_TIMEOUT_S.get(case, 60) * scale, left - 10)
            if timeout < 45 and not case.startswith("_selftest"):
                not_run.append((w, case, f"out of time ({left:.0f} s left of --deadline-s {args.deadline_s:g})"))
                print(f"G={w} {case}: not run, {left:.0f} s left", flush=True)
                continue
            print(f"G={w} {case}: starting ({world_txt(w, case)}, watchdog {timeout:.0f} s)", flush=True)
            outcome = run_case(w, case, cfg, timeout)
            recs, m = merge_records(w, case, read_parts(cfg["parts"], w, case), outcome)
            meta = meta or m
            records += recs
            bad = [r for r in recs if not r.get("passed")]
            status = ("ok" if not bad and outcome.reason is None
                      else f"FAIL ({outcome.reason or f'{len(bad)} failed records'})")
            print(f"G={w} {case}: {status} in {outcome.wall_s:.1f} s", flush=True)
            write_records(out, records, meta)  # after every case: a run cut short keeps what it had

    if meta is None:
        try:
            from cute_kernels.cli import run_metadata

            meta = run_metadata()
        except Exception as exc:
            meta = dict(error=f"no metadata: {exc}")
    write_records(out, records, meta)
    print(f"records: {out / 'tp_qknorm.json'}, logs: {cfg['logs']}", flush=True)
    text, ok = summarize(records, worlds, cases, not_run)
    (out / "summary.txt").write_text(text + "\n")
    print(text, flush=True)
    return 0 if ok else 1


def write_records(out: Path, records: list[dict], meta: dict | None) -> None:
    """DIR/tp_qknorm.json: every record, stamped with the run metadata (date, GPU, commit, torch)."""
    for r in records:
        for k, v in (meta or {}).items():
            r.setdefault(k, v)
    tmp = out / "tp_qknorm.json.tmp"
    with open(tmp, "w") as f:
        json.dump(records, f, indent=1, default=str)
    os.replace(tmp, out / "tp_qknorm.json")


def world_txt(w: int, case: str = "") -> str:
    return f"{w} processes" + (", CPU self-test" if case.startswith("_selftest") else f", GPUs 0..{w - 1}")


if __name__ == "__main__":
    sys.exit(main())
