"""Backward mainloop synchronisation variants (session 10 probe; config fields ds_stages, dq_per_wg):
two dS^T smem buffers, which drop the barrier before each dS^T write, and per-warpgroup dQ hand-off
barriers (each MMA warpgroup gives its half of dQ to the dQ warp without waiting for the other), as
FlashAttention-4's sm90 backward does; vs the shipped config, on the bench shapes.

Checks first: dK and dV bitwise equal to the shipped config's (same GEMMs, same order), and in
deterministic mode dQ too (the same float32 adds in the same order, only split into column halves).

    python3 bench/ranker_bwd_sync_probe.py   (H200: bench/results/logs/2026-11-30_s10_ranker_bwd_sync.log)
"""
import dataclasses as dc
import json
from types import SimpleNamespace

import torch
from probe_timing import time_configs

from cute_kernels.kernels import ranker_bwd as rb
from cute_kernels.kernels.ranker_fwd import ranker_attention
from cute_kernels.kernels.ranker_mask import admitted_pairs


def launch(x, k, v, bounds, cap, cfg):
    return rb.ranker_attention_backward(x.q, k, v, x.o, x.lse, x.do, bounds, cap=cap, config=cfg)


data = []
for nb, hist, cand, hq, hkv, d, cap in rb.BENCH_CASES:
    s = hist + cand
    g = torch.Generator(device="cuda").manual_seed(len(data))
    q, do = (torch.randn(nb, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(nb, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    bounds = torch.tensor([[0, hist, hist, s]] * nb, device="cuda", dtype=torch.int32)
    o, lse = ranker_attention(q, k, v, bounds, cap=cap, return_lse=True)
    x = SimpleNamespace(q=q, o=o, lse=lse, do=do)
    base = rb.config_for(d, cap is not None)
    cfgs = {"base": base, "ds2": dc.replace(base, ds_stages=2), "dq_per_wg": dc.replace(base, dq_per_wg=True),
            "both": dc.replace(base, ds_stages=2, dq_per_wg=True)}
    key = f"B={nb},h={hist},c={cand},H={hq}/{hkv},D={d},cap={cap}"
    ref = launch(x, k, v, bounds, cap, base)
    ref_det = launch(x, k, v, bounds, cap, dc.replace(base, deterministic=True))
    eq = {}
    for name, cfg in cfgs.items():
        got = launch(x, k, v, bounds, cap, cfg)
        got_det = launch(x, k, v, bounds, cap, dc.replace(cfg, deterministic=True))
        eq[name] = dict(dk_dv=[torch.equal(got[1], ref[1]), torch.equal(got[2], ref[2])],
                        dq_rel=round(((got[0].float() - ref[0].float()).norm() / ref[0].float().norm()).item(), 6),
                        det_bitwise=all(torch.equal(a, b) for a, b in zip(got_det, ref_det)))
    print(json.dumps({"shape": key, "checks": eq}), flush=True)
    flops = 10 * d * hq * admitted_pairs(bounds.cpu(), [s] * nb)
    data.append((key, x, k, v, bounds, cap, flops, cfgs))
time_configs(data, launch=launch)
