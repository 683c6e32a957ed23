"""hc_mix tma: the fused epilogue (``HcMixTmaConfig.fused_epilogue``, one kernel: with one CTA per row tile
the walk CTA runs its rows' epilogue; what :func:`config_for` ships at level 0) against the same config as
two kernels (walk, then the reduction kernel), at M where config_for picks level 0; us per call in a CUDA
graph of 10 calls, median of interleaved rounds (order shuffled per round), the shipped config timed
twice (the A/A pair says how large a difference is noise); outputs checked bit-equal first.

    python3 bench/hc_mix_fused_probe.py [--rounds=N] [M,M,...]   (on the GPU)
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import dataclasses
import json
import math
import random
import statistics
import sys

import torch

from cute_kernels.kernels import hc_mix_tma as tma
from cute_kernels.runtime.timing import copy_bandwidth_gbps, cuda_time_us


def main(ms, rounds):
    k = 20480
    print(json.dumps({"copy_gbps": round(copy_bandwidth_gbps(), 1), "rounds": rounds}), flush=True)
    cases = []
    for m in ms:
        g = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        w = torch.randn(24, k, device="cuda", generator=g) / math.sqrt(k)
        s = torch.rand(3, device="cuda", generator=g) + 0.5
        b = torch.randn(24, device="cuda", generator=g)
        shipped = tma.config_for(m)
        if not shipped.fused_epilogue:
            print(json.dumps({"m": m, "skipped": f"config_for picks level {shipped.cta_level}: no fused epilogue"}))
            continue
        cfgs = {"shipped": shipped, "two_kernels": dataclasses.replace(shipped, fused_epilogue=False),
                "shipped_again": shipped}
        want = tma.hc_mix_sinkhorn_tma(x, w, s, b, config=shipped)
        got = tma.hc_mix_sinkhorn_tma(x, w, s, b, config=cfgs["two_kernels"])
        print(json.dumps({"m": m, "cta_level": shipped.cta_level,
                          "two_kernels_bitwise_equal": all(torch.equal(p, q) for p, q in zip(got, want))}), flush=True)
        cases.append((m, x, w, s, b, cfgs))
    times = {}
    rng = random.Random(0)
    for _ in range(rounds):
        order = [(c, name) for c in cases for name in c[5]]
        rng.shuffle(order)
        for (m, x, w, s, b, cfgs), name in order:
            fn = lambda cfg=cfgs[name]: tma.hc_mix_sinkhorn_tma(x, w, s, b, config=cfg)
            times.setdefault((m, name), []).append(cuda_time_us(fn))
    for m, *_ in cases:
        print(json.dumps({"m": m, **{n: round(statistics.median(v), 2) for (mm, n), v in times.items() if mm == m},
                          "all": {n: [round(t, 2) for t in v] for (mm, n), v in times.items() if mm == m}}), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    rounds = 5
    for a in list(args):
        if a.startswith("--rounds="):
            rounds = int(a.split("=", 1)[1])
            args.remove(a)
        elif a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
    ms = [int(v) for v in args[0].split(",")] if args else [16384, 32768]
    main(ms, rounds)
