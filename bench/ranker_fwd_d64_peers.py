"""Session 8: D=64 forward, shipped three-warpgroup config vs the earlier two-warpgroup one vs FlashAttention-4
(mask_mod) and FlexAttention, same run, 3 interleaved rounds (median), CUDA graph (eager if capture fails).

    python3 bench/ranker_fwd_d64_peers.py      (H200: bench/results/2026-11-30_h200_ranker_fwd_d64_s8.json)
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import json, statistics, torch
from cute_kernels.kernels import ranker_bench, ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import admitted_pairs

peers = ranker_bench.load_peers("ranker_fwd_peers")
old = rf.RankerFwdConfig(head_dim=64, tile_n=128, stages=4)
res, modes = {}, {}
shapes = [(4, 4096, 512, 16, 16, None), (16, 1024, 256, 16, 16, None)]
setups = []
for nb, hist, cand, hq, hkv, cap in shapes:
    s = hist + cand
    g = torch.Generator(device="cuda").manual_seed(nb)
    q, k, v = (torch.randn(nb, s, h, 64, device="cuda", dtype=torch.bfloat16, generator=g) for h in (hq, hkv, hkv))
    bounds = torch.tensor([[0, hist, hist, s]] * nb, device="cuda", dtype=torch.int32)
    flops = 4 * 64 * hq * admitted_pairs(bounds.cpu(), [s] * nb)
    impls = {"cute_kernels": lambda q=q, k=k, v=v, b=bounds: rf.ranker_attention(q, k, v, b),
             "cute_kernels_2wg": lambda q=q, k=k, v=v, b=bounds: rf._ranker_impl(q, k, v, b, None, None, "tanh", None, None, config=old)}
    for name in ("fa4_mask_mod", "flex_attention"):
        try:
            impls[name] = peers.PEERS[name](q, k, v, bounds, cap)
        except Exception as e:
            print(json.dumps({"peer": name, "error": repr(e)[:200]}), flush=True)
    setups.append((f"B={nb},hist={hist},cand={cand},H={hq},D=64", flops, impls))
for r in range(3):
    for key, flops, impls in setups:
        for name, fn in impls.items():
            t, mode = ranker_bench.time_us(fn)
            res.setdefault((key, name), []).append(t); modes[(key, name)] = mode
for key, flops, impls in setups:
    print(json.dumps({"shape": key, **{n: [round(statistics.median(ts), 1), round(flops / statistics.median(ts) / 1e6), modes[(kk, n)]]
                                       for (kk, n), ts in res.items() if kk == key}}), flush=True)
