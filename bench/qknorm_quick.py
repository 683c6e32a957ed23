"""Quick H200 figures for qknorm (G = 1) and qknorm_tp (emulated G), one JSON line each.

    python3 bench/qknorm_quick.py [g1|tp|all]

The full tables are ``cute-kernels bench --kernel qknorm`` / ``--kernel qknorm_tp`` (the modules' bench()).
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)

import json
import sys

import torch

import cute_kernels  # noqa: F401
from cute_kernels.kernels import qknorm, qknorm_tp
from cute_kernels.runtime.timing import cuda_time_us


def _p(rec):
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rec.items() if k != "kernel"}),
          flush=True)


def g1():
    for rec in qknorm.bench():
        _p(rec)


def tp():
    dtype = torch.bfloat16
    for world, ns in ((4, (1, 64, 512, 4096, 8192)), (2, (64, 4096)), (8, (64, 4096))):
        ranks = qknorm_tp.ParallelQKNorm.emulated(world, 8192, 4096, 1024, dtype)
        st = [torch.cuda.Stream() for _ in range(world)]
        for n in ns:
            qs = [torch.randn(n, 4096 // world, device="cuda", dtype=dtype) for _ in range(world)]
            ks = [torch.randn(n, 1024 // world, device="cuda", dtype=dtype) for _ in range(world)]
            wq = [torch.ones(4096 // world, device="cuda", dtype=dtype)] * world
            wk = [torch.ones(1024 // world, device="cuda", dtype=dtype)] * world
            for impl, fn in (("fused", lambda: qknorm_tp.emulated_step(ranks, st, qs, ks, wq, wk, 1e-6)),
                             ("unfused", lambda: qknorm_tp.unfused_emulated_step(ranks, qs, ks, wq, wk, 1e-6))):
                _p(dict(g=world, n=n, impl=impl, graph_us=cuda_time_us(fn, graph=True)))
        for r in ranks:
            r.check_error()


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("g1", "all"):
        g1()
    if what in ("tp", "all"):
        tp()
