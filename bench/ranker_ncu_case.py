"""One forward and one backward launch of the ranker attention per shape, for Nsight Compute (not a benchmark:
no timing here).  Shapes: the headline (B=4, history 4096 + 512 candidates, 16 heads, D=128) and B=16 history
1024 + 256 candidates; bf16, no cap; ``--head-dim 256`` (or 64) for another head dim.  Compiles and warms up
first, then brackets the profiled calls with cudaProfilerStart/Stop, so run it under ncu with
``--profile-from-start off``, e.g.

    ncu --profile-from-start off --kernel-name regex:"RankerAttention(Fwd|Bwd)" \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \\
        python3 bench/ranker_ncu_case.py
"""
import argparse

from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import torch

import cute_kernels

SHAPES = ((4, 4096, 512, 16), (16, 1024, 256, 16))  # (B, history, candidates, heads)


def inputs(b, hist, cand, h, d=128):
    s = hist + cand
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    bounds = torch.tensor([[0, hist, hist, s]] * b, device="cuda", dtype=torch.int32)
    return q, k, v, bounds


def step(q, k, v, bounds):
    out = cute_kernels.ranker_attention(q, k, v, bounds)
    out.backward(torch.ones_like(out))


parser = argparse.ArgumentParser(description="one ranker forward + backward per shape, for Nsight Compute")
parser.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256))
args = parser.parse_args()
cases = [inputs(*shape, d=args.head_dim) for shape in SHAPES]
for case in cases:  # compile and warm up
    step(*case)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for case in cases:
    step(*case)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
