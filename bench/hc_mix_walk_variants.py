"""The hc_mix tma walk alone (no reduction kernel) at M = 4096 (``--m=``) for walk configs that give the same
bits: the shipped one, other ring depths, other ``load_group`` (the producer issuing a group of stages' TMA loads
back to back), and without paired k tiles (``overlap``) (256-row tiles, half the hc_fn reads from L2 per x byte,
need 288 consumer registers: not compilable); us per call, CUDA graph of 10 calls, median of shuffled rounds, the
shipped config timed twice (A/A); ``op_*``: the whole op (walk and reduction kernel) with each variant but the
A/A copy and ``no_overlap``.  Every variant's outputs are checked bitwise against the shipped config's first.
(Session 19's log of it came from ab131ee, when the walk also took an arrival-counter argument, and had an
``x_only`` variant without the hc_fn piece loads, dropped in session 35 when the walk began splitting hc_fn
itself.  Session 68's, on an H100, decided ``load_group``: STATUS.)

    python3 bench/hc_mix_walk_variants.py [--rounds=N] [--m=M] [--ncu]   (on the GPU; --ncu: two launches of each, no timing)
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
from cute_kernels.kernels.hc_mix import SP_COLS
from cute_kernels.runtime.timing import copy_bandwidth_gbps, cuda_time_us
from hc_mix_tail_probe import compiled_part


def variants(m):
    """The shipped config (twice: A/A), without paired k tiles where it pairs them, and other ring depths
    that fit in shared memory (same bits)."""
    shipped = tma.config_for(m)
    out = {"shipped": shipped}
    if shipped.overlap:
        out["no_overlap"] = dataclasses.replace(shipped, overlap=False)
    for group in (1, 2, 3):
        if group != shipped.load_group:
            out[f"group{group}"] = dataclasses.replace(shipped, load_group=group)
    for stages in range(3, 9):
        if stages == shipped.stages:
            continue
        try:  # (a config that does not fit in shared memory is refused when constructed)
            out[f"stages{stages}"] = dataclasses.replace(shipped, stages=stages)
        except ValueError:
            pass
    out["shipped_again"] = shipped
    return out


def main(rounds, ncu, m):
    k = 20480
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = torch.randn(24, k, device="cuda", generator=g) / math.sqrt(k)
    s = torch.rand(3, device="cuda", generator=g) + 0.5
    b = torch.randn(24, device="cuda", generator=g)
    pre, post, comb = (torch.empty(m, n, device="cuda") for n in (4, 4, 16))
    mix = torch.empty(1, SP_COLS, device="cuda")
    calls, workspaces = {}, {}
    for name, cfg in variants(m).items():
        ws = workspaces[name] = torch.zeros(tma.workspace_rows(m, cfg), SP_COLS, device="cuda")
        walk = compiled_part(cfg, "walk")
        calls[name] = (lambda walk=walk, ws=ws: walk(x, w, s, b, pre, post, comb, mix, 20, 1e-6, 1e-6, ws))
    results = {}
    for name, fn in calls.items():
        pre.fill_(float("nan")), post.fill_(float("nan")), comb.fill_(float("nan"))
        fn()
        fn()
        torch.cuda.synchronize()
        results[name] = [t.clone() for t in (pre, post, comb, workspaces[name])]
    base = results["shipped"]
    for name, got in results.items():  # same bits: outputs (fused epilogue) or the node sums (workspace)
        assert all(torch.equal(a, b) or (a.isnan().all() and b.isnan().all()) for a, b in zip(got, base)), name
    for name, cfg in variants(m).items():
        if name not in ("shipped_again", "no_overlap"):
            calls["op_" + name] = lambda cfg=cfg: tma.hc_mix_sinkhorn_tma(x, w, s, b, config=cfg)
    for name in [n for n in calls if n.startswith("op_")]:
        calls[name]()
    torch.cuda.synchronize()
    if ncu:
        return
    print(json.dumps({"copy_gbps": round(copy_bandwidth_gbps(), 1), "rounds": rounds, "m": m}), flush=True)
    times = {}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(calls)
        rng.shuffle(order)
        for name in order:
            times.setdefault(name, []).append(cuda_time_us(calls[name]))
    print(json.dumps({n: round(statistics.median(v), 2) for n, v in times.items()}), flush=True)
    print(json.dumps({n: [round(t, 2) for t in v] for n, v in times.items()}), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "-h" in args or "--help" in args:
        print(__doc__)
        sys.exit(0)
    rounds = next((int(a.split("=", 1)[1]) for a in args if a.startswith("--rounds=")), 7)
    m = next((int(a.split("=", 1)[1]) for a in args if a.startswith("--m=")), 4096)
    main(rounds, "--ncu" in args, m)
