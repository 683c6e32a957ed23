"""Small ranker_fwd launches for compute-sanitizer (memcheck / racecheck); not a pytest file.

Usage on the GPU machine: compute-sanitizer --tool memcheck python3 tests/gpu/sanitize_ranker_fwd.py
"""
import os

import torch

import cute_kernels

torch.manual_seed(0)
# D=64 runs tile_n=128 without a cap and 112 with one; D=128 with the tanh cap runs CAP_CONFIGS[("tanh", 128)];
# D=256 one tile per CTA (checked_max without a cap, fixed_row_max with one).  ``SANITIZE_HEAD_DIMS=256`` (a
# comma list) keeps only those head dims' launches (a shorter run)
ONLY = {int(x) for x in os.environ.get("SANITIZE_HEAD_DIMS", "").split(",") if x}
for d, cap in ((128, None), (64, None), (64, 20.0), (128, 30.0), (256, None), (256, 30.0)):
    if ONLY and d not in ONLY:
        continue
    q = torch.randn(2, 300, 2, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 300, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 300, 2, d, device="cuda", dtype=torch.bfloat16)
    bounds = torch.tensor([[0, 200, 200, 300], [5, 129, 250, 290]], device="cuda", dtype=torch.int32)
    o, l = cute_kernels.ranker_attention(q, k, v, bounds, cap=cap, return_lse=True)
    cu = torch.tensor([0, 100, 300], device="cuda", dtype=torch.int32)
    bv = torch.tensor([[0, 70, 70, 100], [0, 150, 150, 200]], device="cuda", dtype=torch.int32)
    ov = cute_kernels.ranker_attention(q[0], k[0], v[0], bv, cap=cap, cu_seqlens=cu, max_seqlen=200)
    # persistent schedules (D=64: three consumer warpgroups) with several tiles per CTA: the round-robin
    # scheduler barriers carry over from tile to tile
    from cute_kernels.kernels import ranker_fwd as rf
    ctas = 3  # (ignored by one-tile-per-CTA configs: D=256)
    op, _ = rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, max_ctas=ctas)
    if cap is not None:  # soft_sign with x = scale * q.k / cap past 2**126 and at +-inf (the clamp)
        rf._ranker_impl(q * 8, k * 8, v, bounds, None, 2.0**-126, "soft_sign", None, None, max_ctas=ctas)
    if cap is None:  # checked_max: rows scaled 40x fail its check: the online max and the retry pass too
        q[1, 150:] *= 40
        rf._ranker_impl(q, k, v, bounds, None, None, "tanh", None, None, config=rf.CONFIGS[d], max_ctas=ctas)
        rf._ranker_impl(q[1], k[1], v[1], bv, None, None, "tanh", cu, 200, config=rf.CONFIGS[d], max_ctas=ctas)
        one = q[:1, :1]  # one token
        rf._ranker_impl(one, one, one, bounds[:1] * 0 + torch.tensor([0, 1, 0, 1], device="cuda", dtype=torch.int32),
                        None, None, "tanh", None, None, config=rf.CONFIGS[d])
        if rf.CONFIGS[d].self_kv_tma:  # its self block also one tile per CTA, where sO aliases sQ
            import dataclasses

            rf._ranker_impl(q, k, v, bounds, None, None, "tanh", None, None,
                            config=dataclasses.replace(rf.CONFIGS[d], persistent=False))
            # an empty history: the candidate tiles load Q and their own K/V rows only
            no_hist = torch.tensor([[0, 0, 0, 300], [40, 40, 20, 290]], device="cuda", dtype=torch.int32)
            rf._ranker_impl(q, k, v, no_hist, None, None, "tanh", None, None, config=rf.CONFIGS[d], max_ctas=3)
            rf._ranker_impl(q, k, v, no_hist, None, None, "tanh", None, None,
                            config=dataclasses.replace(rf.CONFIGS[d], persistent=False))
torch.cuda.synchronize()
print("sanitize run done", float(o.float().abs().sum()), float(ov.float().abs().sum()))
