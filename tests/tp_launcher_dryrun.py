"""Dry run of scripts/tp_qknorm_multigpu.py's GPU cases on CPU; not a pytest module (tests/test_tp_launcher.py runs it).

    python3 tests/tp_launcher_dryrun.py OUTDIR [CASES]        # CASES: comma list, default all five

Two rank processes (spawn, gloo, file store) run the launcher's case functions unchanged, with:
``torch.cuda`` calls replaced by CPU stand-ins (synchronize/events/streams; a "graph" runs its body once
at capture and nothing at replay), ``device="cuda"`` tensor factories mapped to the CPU, and
``ParallelQKNorm`` replaced by an emulation that exchanges the per-token sums with a gloo all_reduce
(bounded wait -> ``PeerTimeoutError``, refusal until ``reset()``).  So this checks the cases' own code
(data, gathering, reference, checks, timing and records) and the summary, not the kernel.
``DRYRUN_BUG=scale|pad`` makes the emulation wrong on purpose (the cases must then fail).
"""

import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import tp_qknorm_multigpu as tp  # noqa: E402

WORLD = 2


def install_cpu_stand_ins() -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    def on_cpu(dev):
        return "cpu" if dev == "cuda" or (isinstance(dev, torch.device) and dev.type == "cuda") else dev

    for name in ("randn", "zeros", "empty", "ones", "full"):
        def factory(*a, _f=getattr(torch, name), **kw):
            if "device" in kw:
                kw["device"] = on_cpu(kw["device"])
            return _f(*a, **kw)
        setattr(torch, name, factory)
    cpu_generator = torch.Generator
    torch.Generator = lambda device=None: cpu_generator()

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self, *a):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    class Graph:
        def replay(self):
            pass

    class Stream:
        def wait_stream(self, other):
            pass

    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.Event = Event
    torch.cuda.CUDAGraph = Graph
    torch.cuda.graph = lambda g, pool=None, **k: contextlib.nullcontext()
    torch.cuda.graph_pool_handle = lambda: None
    torch.cuda.Stream = Stream
    torch.cuda.current_stream = lambda *a: Stream()
    torch.cuda.stream = lambda s: contextlib.nullcontext()

    from cute_kernels.kernels import qknorm_tp as mod

    class EmulatedNorm:
        """ParallelQKNorm's host contract, with the sums exchanged by a gloo all_reduce."""

        def __init__(self, group, max_tokens, q_dim, k_dim, dtype, *, timeout_s=10.0):
            self.world, self.rank, self.group = dist.get_world_size(), dist.get_rank(), None
            self.max_tokens, self.q_dim, self.k_dim, self.dtype = max_tokens, q_dim, k_dim, dtype
            self.fused, self._failed, self.timeout_s = True, False, timeout_s
            self._error_np = np.zeros(1, np.int32)
            self._calls = []  # shapes of the exchanges this rank joined
            self._side = dist.new_group(backend="gloo")

        def __call__(self, q, k, q_weight, k_weight, eps):
            if self._failed or self._error_np[0]:
                self.check_error()
            assert q.shape[0] <= self.max_tokens and q.dtype == self.dtype
            assert q.shape[1] == self.q_dim // self.world and k.shape[1] == self.k_dim // self.world
            sums = torch.stack([q.float().square().sum(-1), k.float().square().sum(-1)])
            self._calls.append(list(sums.shape))
            try:
                dist.all_reduce(sums, async_op=True).wait(timeout=timedelta(seconds=self.timeout_s))
            except Exception:
                self._error_np[0] = 1
                return
            mod._scale_in_place(q, k, q_weight, k_weight, eps, sums, self.q_dim, self.k_dim)
            bug = os.environ.get("DRYRUN_BUG")
            if bug == "scale" and q.shape[0] > 100:
                q.mul_(1.02)
            if bug == "pad" and q.shape[0] > 100 and q.stride(0) > q.shape[1] + k.shape[1]:
                q.as_strided((q.shape[0], 1), (q.stride(0), 1), q.storage_offset() + q.shape[1] + k.shape[1]).zero_()

        _run_unfused = mod.ParallelQKNorm._run_unfused

        def check_error(self, synchronize=True):
            if self._failed or self._error_np[0]:
                self._failed = True
                raise mod.PeerTimeoutError(f"emulated rank {self.rank}: a peer did not deliver its sums")

        def reset(self):
            self._error_np[0], self._failed = 0, False
            everyone = [None] * self.world
            dist.all_gather_object(everyone, self._calls, group=self._side)
            longest = max(everyone, key=len)
            for shape in longest[len(self._calls):]:  # join the exchange this rank skipped (gloo must pair it)
                dist.all_reduce(torch.zeros(shape))
            self._calls = list(longest)
            dist.barrier()

    mod.ParallelQKNorm = EmulatedNorm


def small_plan() -> dict:
    p = tp.plan(WORLD, quick=True)
    p.update(capacity=300, shapes=[[128, 32], [96, 32]], correctness_ns=[1, 3, 64, 299, 300], unfused_ns=[1, 300])
    p["stress"].update(q=128, k=32, launches=40, graph_buckets=[1, 17, 300])
    p["late"].update(sleep_s=1.0)
    p["latency"].update(shapes=[[128, 32]], ns=[1, 8, 64], reps=3, inner=2, warmup=1)
    return p


def worker(rank: int, init: str, out: str, cases: list) -> None:
    import torch.distributed as dist

    install_cpu_stand_ins()
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    ctx = tp.Ctx(rank, WORLD, small_plan(), tp.RecordWriter(Path(out) / f"rank{rank}.jsonl"))
    ctx.cpu_group = dist.new_group(backend="gloo")
    code = 0
    for case in cases:
        try:
            tp.CASE_FUNCS[case](ctx)
            ctx.barrier()
        except Exception:
            traceback.print_exc()
            ctx.out.write(kind="error", case=case, rank=rank, error=traceback.format_exc()[-500:])
            code = 1
            break
    sys.stdout.flush()
    os._exit(code)


def main() -> int:
    import torch.multiprocessing as mp

    out = Path(sys.argv[1])
    cases = sys.argv[2].split(",") if len(sys.argv) > 2 else list(tp.CASES)
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("rank*.jsonl"):
        f.unlink()
    store = tempfile.mkdtemp(prefix="tp_dryrun_")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, f"file://{store}/store", str(out), cases)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()
    recs = [json.loads(line) for f in sorted(out.glob("rank*.jsonl")) for line in f.read_text().splitlines() if line]
    records = []
    for case in cases:
        outcome = tp.CaseOutcome(WORLD, case, [p.exitcode for p in procs],
                                 None if all(p.exitcode == 0 for p in procs) else "a rank failed", 0.0)
        merged, _ = tp.merge_records(WORLD, case, recs + [dict(kind="done", case=case, rank=r) for r in range(WORLD)],
                                     outcome)
        records += merged
    text, ok = tp.summarize(records, [WORLD], cases, [])
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
