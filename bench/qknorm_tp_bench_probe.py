"""Diagnose the emulated tensor-parallel bench (``cute-kernels bench --kernel qknorm_tp``): for each G and N,
time the fused step (graph, then eager) as the bench does, printing progress, and on a peer timeout print
where it happened, reset every rank and go on.

    python3 bench/qknorm_tp_bench_probe.py [--unfused] [G ...]

``--unfused`` also times the unfused torch path after the fused one at every N, as the bench does.
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import json
import sys
import time

import torch

from cute_kernels.kernels import qknorm_tp as mod
from cute_kernels.runtime.timing import cuda_time_us

unfused = "--unfused" in sys.argv[1:]
worlds = [int(a) for a in sys.argv[1:] if a != "--unfused"] or [8]
q_dim, k_dim, dtype = 4096, 1024, torch.bfloat16
for world in worlds:
    ranks = mod.ParallelQKNorm.emulated(world, 8192, q_dim, k_dim, dtype, timeout_s=3.0)
    streams = [torch.cuda.Stream() for _ in range(world)]
    print(json.dumps({"world": world, "resident_ctas_per_rank": ranks[0]._resident, "rows": ranks[0].config.norm.rows,
                      "threads": ranks[0].config.norm.threads}), flush=True)
    for n in (1, 8, 64, 512, 4096, 8192):
        qs = [torch.randn(n, q_dim // world, device="cuda", dtype=dtype) for _ in range(world)]
        ks = [torch.randn(n, k_dim // world, device="cuda", dtype=dtype) for _ in range(world)]
        wqs = [torch.ones(q_dim // world, device="cuda", dtype=dtype) for _ in range(world)]
        wks = [torch.ones(k_dim // world, device="cuda", dtype=dtype) for _ in range(world)]
        impls = [("fused", lambda: mod.emulated_step(ranks, streams, qs, ks, wqs, wks, 1e-6))]
        if unfused:
            impls.append(("unfused", lambda: mod.unfused_emulated_step(ranks, qs, ks, wqs, wks, 1e-6)))
        for (impl, fn), graph in [(i, g) for i in impls for g in (True, False)]:
            t0 = time.time()
            try:
                t = cuda_time_us(fn, graph=graph)
                torch.cuda.synchronize()
                for r in ranks:
                    r.check_error()
                res = {"us": round(t, 2)}
            except mod.PeerTimeoutError as exc:
                res = {"timeout": str(exc)[:90]}
                for r in ranks:
                    r.reset()
            print(json.dumps({"world": world, "n": n, "impl": impl, "graph": graph, **res, "wall_s": round(time.time() - t0, 2)}),
                  flush=True)
