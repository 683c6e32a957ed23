"""config_for's row-tile spreading (``tile_rows``: 33 tiles of 125 rows x 4 CTAs = 132 CTAs at M = 4096,
132 x 125 at 16384) against the same config with 128-row tiles (128 CTAs), and the split-K Triton
baseline: us per call in a CUDA graph, medians of shuffled rounds, the copy rate first; outputs
checked bit-equal between the two configs.

    python3 bench/hc_mix_spread_probe.py [--rounds=N]
"""
import dataclasses
import json
import math
import random
import statistics
import sys

import torch

from cute_kernels.kernels import hc_mix_tma as tma
from cute_kernels.runtime.timing import copy_bandwidth_gbps, cuda_time_us

K = 20480


def main(argv):
    rounds = int(argv[0].split("=", 1)[1]) if argv else 7
    bw = copy_bandwidth_gbps()
    print(json.dumps({"copy_gbps": round(bw, 1), "rounds": rounds}), flush=True)
    calls, nbytes = {}, {}
    for m in (3584, 4096, 16384):
        g = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn(m, K, device="cuda", generator=g).bfloat16()
        w = torch.randn(24, K, device="cuda", generator=g) / math.sqrt(K)
        s = torch.rand(3, device="cuda", generator=g) + 0.5
        b = torch.randn(24, device="cuda", generator=g)
        spread = tma.config_for(m)
        plain = dataclasses.replace(spread, tile_rows=0)
        outs = [tma.hc_mix_sinkhorn_tma(x, w, s, b, config=c) for c in (spread, plain)]
        same = all(torch.equal(a, c) for a, c in zip(*outs))
        print(json.dumps({"m": m, "tile_rows": spread.rows, "ctas": -(-m // spread.rows) * spread.ctas_per_tile,
                          "bits_equal": same}), flush=True)
        for name, cfg in (("spread", spread), ("plain", plain), ("spread_again", spread)):
            calls[f"{name}_{m}"] = lambda x=x, w=w, s=s, b=b, cfg=cfg: tma.hc_mix_sinkhorn_tma(x, w, s, b, config=cfg)
            nbytes[f"{name}_{m}"] = m * K * 2
    times = {n: [] for n in calls}
    rng = random.Random(1)
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
