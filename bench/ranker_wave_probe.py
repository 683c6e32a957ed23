"""Wave quantization probe: is the last, partial wave of tiles a measurable cost of the ranker kernels?

The forward's persistent CTAs take tiles ``c, c + grid, ...`` (static round-robin), so a call costs
``ceil(tiles / grid)`` tile-times, not ``tiles / grid``; the backward's CTAs are scheduled by the
hardware, with the same last partial wave.  This probe times both directions at head counts whose
work fills whole waves of the H200's 132 SMs and at the bench's head count (16), same shape
otherwise, and prints the time per tile (forward) or per history KV block (backward): if the partial
wave costs what the round count says, the per-tile time at H=16 is ``ceil(w) / w`` times the full-wave
one (w: waves of work).

    python3 bench/ranker_wave_probe.py [--rounds=N] [--short]

``--short``: the forward at the bench's two short, candidate-heavy shapes (B=16 1K+256 H=16: 2560 tiles, 19.39
waves; B=8 2K+2K H=8: 2048 tiles, 15.52 waves) against head counts whose tiles fill whole waves (H=33 at both:
40 and 64 full waves) and on 128 CTAs (20 and 16 full rounds of the same tiles).

``--grid-ab``: the forward on every bench shape (``ranker_bench.BENCH_CASES``, config as the public call
chooses it) on one persistent CTA per SM (twice: the A/A pair) and on the fewest CTAs that keep the same
number of tile rounds, ``ceil(tiles / ceil(tiles / SMs))`` (e.g. 128 for 2560 tiles on 132 SMs), interleaved.

Forward tiles: B x H x ceil(S / tile_m); backward CTAs with work: B x H x ceil(hist / tile_n).
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import json
import math
import random
import statistics
import sys

import torch
from probe_timing import ranker_inputs, time_configs

from cute_kernels.kernels import ranker_bwd as rb
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import admitted_pairs
from cute_kernels.runtime.timing import cuda_time_us

# (label, B, hist, cand, H, D, forward max_ctas or None)
FWD_CASES = [
    ("D128 H=11 (12 full waves)", 4, 4096, 512, 11, 128, None),
    ("D128 H=16 (17.45 waves)", 4, 4096, 512, 16, 128, None),
    ("D128 H=16 on 128 CTAs (18 waves)", 4, 4096, 512, 16, 128, 128),
    ("D128 H=22 (24 full waves)", 4, 4096, 512, 22, 128, None),
    ("D64 H=11 (8 full waves)", 4, 4096, 512, 11, 64, None),
    ("D64 H=16 (11.64 waves)", 4, 4096, 512, 16, 64, None),
]
SHORT_FWD_CASES = [
    ("B16 1K+256 H=16 (19.39 waves)", 16, 1024, 256, 16, 128, None),
    ("B16 1K+256 H=16 on 128 CTAs (20 rounds)", 16, 1024, 256, 16, 128, 128),
    ("B16 1K+256 H=33 (40 full waves)", 16, 1024, 256, 33, 128, None),
    ("B8 2K+2K H=8 (15.52 waves)", 8, 2048, 2048, 8, 128, None),
    ("B8 2K+2K H=8 on 128 CTAs (16 rounds)", 8, 2048, 2048, 8, 128, 128),
    ("B8 2K+2K H=33 (64 full waves)", 8, 2048, 2048, 33, 128, None),
]
# (label, B, hist, cand, H, D)
BWD_CASES = [
    ("bwd D128 H=8 (7.76 waves)", 4, 4096, 512, 8, 128),
    ("bwd D128 H=16 (15.5 waves)", 4, 4096, 512, 16, 128),
    ("bwd D128 H=33 (32 full waves)", 4, 4096, 512, 33, 128),
]


def main(rounds: int, short: bool = False):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "sms": sms, "rounds": rounds}), flush=True)
    jobs = []
    for label, nb, hist, cand, h, d, max_ctas in SHORT_FWD_CASES if short else FWD_CASES:
        _, q, k, v, bounds, _ = ranker_inputs((nb, hist, cand, h, h, d, None), seed=len(jobs))
        cfg = rf.shipped_config(torch.bfloat16, d, "none")
        tiles = nb * h * math.ceil((hist + cand) / cfg.tile_m)
        grid = min(tiles, max_ctas or sms)
        fn = (lambda q=q, k=k, v=v, b=bounds, c=cfg, m=max_ctas:
              rf._ranker_impl(q, k, v, b, None, None, "tanh", None, None, config=c, max_ctas=m))
        jobs.append((label, fn, tiles, grid))
    for label, nb, hist, cand, h, d in [] if short else BWD_CASES:
        _, q, k, v, bounds, do = ranker_inputs((nb, hist, cand, h, h, d, None), seed=len(jobs), dout=True)
        out, lse = rf.ranker_attention(q, k, v, bounds, return_lse=True)
        cfg = rb.CONFIGS[d]
        tiles = nb * h * math.ceil(hist / cfg.tile_n)
        fn = (lambda q=q, k=k, v=v, o=out, l=lse, do=do, b=bounds:
              rb.ranker_attention_backward(q, k, v, o, l, do, b))
        jobs.append((label, fn, tiles, sms))
    times = {label: [] for label, *_ in jobs}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(jobs)
        rng.shuffle(order)
        for label, fn, *_ in order:
            times[label].append(cuda_time_us(fn, reps=8, inner=5))
    for label, _, tiles, grid in jobs:
        us = statistics.median(times[label])
        waves = tiles / grid
        print(json.dumps({"case": label, "us": round(us, 1), "tiles": tiles, "grid": grid,
                          "waves": round(waves, 2), "rounds": math.ceil(waves),
                          "us_per_tile": round(us / tiles * grid, 2),
                          "us_per_round": round(us / math.ceil(waves), 2),
                          "spread_pct": round(100 * (max(times[label]) - min(times[label])) / us, 1)}), flush=True)


def grid_ab(rounds: int):
    """``--grid-ab`` (see the module's docstring), through ``probe_timing.time_configs``: prints per shape the
    median us and useful TFLOP/s of each grid (``sms_again``: the A/A pair) and their spreads over rounds."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "sms": sms, "rounds": rounds}), flush=True)
    cases = []
    for case in rf.BENCH_CASES:
        nb, hist, cand, hq, hkv, d, cap = case
        key, q, k, v, bounds, _ = ranker_inputs(case, seed=len(cases))
        cfg = rf.config_for_shape(torch.bfloat16, nb, hist + cand, hq, hkv, d, "tanh" if cap else "none", False,
                                  cap=cap)
        tiles = nb * hq * math.ceil((hist + cand) / cfg.tile_m)
        grids = {"sms": sms, "balanced": math.ceil(tiles / math.ceil(tiles / sms))}
        print(json.dumps({"shape": key, "tiles": tiles, "grids": grids}), flush=True)
        cases.append((key, q, k, v, bounds, cap, 4 * d * hq * admitted_pairs(bounds.cpu(), [hist + cand] * nb),
                      grids))

    def launch(q, k, v, bounds, cap, grid):
        return rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, max_ctas=grid)

    time_configs(cases, rounds=rounds, launch=launch, shuffle_seed=0, control=True)


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        raise SystemExit(0)
    r = [a for a in sys.argv[1:] if a.startswith("--rounds=")]
    n_rounds = int(r[0].split("=")[1]) if r else 5
    if "--grid-ab" in sys.argv[1:]:
        grid_ab(n_rounds)
    else:
        main(n_rounds, short="--short" in sys.argv[1:])
