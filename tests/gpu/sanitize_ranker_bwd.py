"""Small ranker_bwd launches for compute-sanitizer (memcheck / racecheck); not a pytest file.

Usage on the GPU machine: compute-sanitizer --tool racecheck python3 tests/gpu/sanitize_ranker_bwd.py
"""
import torch

import cute_kernels
from cute_kernels.kernels import ranker_bwd as rb

torch.manual_seed(0)
# (64, no cap): 128-row q tiles; 256: the head-dim split schedule
for d, hkv, cap in ((128, 2, None), (128, 1, 20.0), (64, 1, 20.0), (64, 2, None), (256, 2, None), (256, 1, 20.0)):
    q = torch.randn(2, 300, 2, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 300, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 300, hkv, d, device="cuda", dtype=torch.bfloat16)
    do = torch.randn_like(q)
    bounds = torch.tensor([[0, 200, 200, 300], [5, 129, 250, 290]], device="cuda", dtype=torch.int32)
    o, lse = cute_kernels.ranker_attention(q, k, v, bounds, cap=cap, return_lse=True)
    dq, dk, dv = rb.ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap)
    cu = torch.tensor([0, 100, 300], device="cuda", dtype=torch.int32)
    bv = torch.tensor([[0, 70, 70, 100], [0, 150, 150, 200]], device="cuda", dtype=torch.int32)
    ov, lv = cute_kernels.ranker_attention(q[0], k[0], v[0], bv, cap=cap, cu_seqlens=cu, max_seqlen=200,
                                           return_lse=True)
    g = rb.ranker_attention_backward(q[0], k[0], v[0], ov, lv, do[0], bv, cap=cap, cu_seqlens=cu, max_seqlen=200)
    gd = rb.ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap, deterministic=True)
    gdv = rb.ranker_attention_backward(q[0], k[0], v[0], ov, lv, do[0], bv, cap=cap, cu_seqlens=cu, max_seqlen=200,
                                       deterministic=True)
    # with the gradient of the LSE (the preprocess's dLSE variant), fixed length and packed
    gl = rb.ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap, dlse=torch.randn_like(lse))
    glv = rb.ranker_attention_backward(q[0], k[0], v[0], ov, lv, do[0], bv, cap=cap, cu_seqlens=cu, max_seqlen=200,
                                       dlse=torch.randn_like(lv))
    if hkv < q.shape[2]:  # GQA both ways (the host picks one head per CTA at this size)
        for group in (True, False):
            cfg = rb.dataclasses.replace(rb.config_for(d, cap is not None), gqa_group_per_cta=group)
            gg = rb.ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap, config=cfg)
            gv = rb.ranker_attention_backward(q[0], k[0], v[0], ov, lv, do[0], bv, cap=cap, cu_seqlens=cu,
                                              max_seqlen=200, config=cfg)
    if d == 64 and cap is None:  # dQ split by q rows between the warpgroups (dq_split_rows), with GQA both ways
        for group in (True, False):
            cfg = rb.dataclasses.replace(rb.config_for(d, False), dq_split_rows=True, gqa_group_per_cta=group)
            gs = rb.ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap, config=cfg)
            gsv = rb.ranker_attention_backward(q[0], k[0], v[0], ov, lv, do[0], bv, cap=cap, cu_seqlens=cu,
                                               max_seqlen=200, config=cfg)
        gsd = rb.ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap, deterministic=True, config=cfg)
    if d == 128:  # FA3's 80-row q tiles (not shipped; their first GPU run faulted on a misaligned TMA destination)
        cfg = rb.dataclasses.replace(rb.config_for(d, cap is not None), tile_m=80, ds_stages=1)
        g80 = rb.ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap, config=cfg)
        g80v = rb.ranker_attention_backward(q[0], k[0], v[0], ov, lv, do[0], bv, cap=cap, cu_seqlens=cu,
                                            max_seqlen=200, config=cfg)
    if d == 256:  # one sP^T / sdS^T buffer (a barrier before each write)
        cfg = rb.dataclasses.replace(rb.config_for(d, cap is not None), ds_stages=1)
        g1 = rb.ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap, config=cfg)
torch.cuda.synchronize()
print("sanitize run done", float(dq.float().abs().sum()), float(g[0].float().abs().sum()))
