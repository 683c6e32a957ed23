"""Is the hc_mix walk at M = 4096 bound per SM or by DRAM?  The walk alone (config_for(4096): 4 CTAs per
128-row tile) at M = 3584 ... 4096 (28 ... 32 row tiles, 112 ... 128 of the 132 SMs): if its time stays
flat as tiles drop, each CTA's rate is the limit and spreading M=4096 over all 132 SMs would pay; if it
falls with M, DRAM is.  Also the op at each M.  us per call, CUDA graph, median of shuffled rounds.

    python3 bench/hc_mix_walk_scaling.py [--rounds=N]
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import json
import math
import random
import statistics
import sys

import torch

from cute_kernels.kernels import hc_mix_tma as tma
from cute_kernels.kernels.hc_mix import SP_COLS
from cute_kernels.runtime.timing import copy_bandwidth_gbps, cuda_time_us
from hc_mix_tail_probe import compiled_part

K = 20480


def main(argv):
    rounds = 7
    for a in argv:
        if not a.startswith("--rounds=") or not a[9:].isdigit() or int(a[9:]) < 1:
            raise SystemExit(f"unknown argument {a!r}\n{__doc__}")
        rounds = int(a[9:])
    bw = copy_bandwidth_gbps()
    print(json.dumps({"copy_gbps": round(bw, 1), "rounds": rounds}), flush=True)
    cfg = tma.config_for(4096)
    fw = compiled_part(cfg, "walk")
    calls, nbytes = {}, {}
    for m in (3584, 3840, 3968, 4096):
        g = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn(m, K, device="cuda", generator=g).bfloat16()
        w = torch.randn(24, K, device="cuda", generator=g) / math.sqrt(K)
        s = torch.rand(3, device="cuda", generator=g) + 0.5
        b = torch.randn(24, device="cuda", generator=g)
        ws = torch.zeros(tma.workspace_rows(m, cfg), SP_COLS, device="cuda")
        outs = (torch.empty(m, 4, device="cuda"), torch.empty(m, 4, device="cuda"), torch.empty(m, 16, device="cuda"),
                torch.empty(1, SP_COLS, device="cuda"))
        args = (x, w, s, b, *outs, 20, 1e-6, 1e-6, ws)
        calls[f"walk_{m}"] = lambda a=args: fw(*a)
        calls[f"op_{m}"] = lambda x=x, w=w, s=s, b=b: tma.hc_mix_sinkhorn_tma(x, w, s, b, config=cfg)
        nbytes[f"walk_{m}"] = nbytes[f"op_{m}"] = m * K * 2
    times = {n: [] for n in calls}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(calls)
        rng.shuffle(order)
        for n in order:
            times[n].append(round(cuda_time_us(calls[n]), 2))
    for n in calls:
        t = statistics.median(times[n])
        print(json.dumps({"case": n, "us": t, "copy_frac": round(nbytes[n] / t / 1e3 / bw, 3), "all": times[n]}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
