"""Throwaway A/B (session 47): the forward at a57ccec (ranker_fwd_s47base, an untracked copy) vs the working
tree's, interleaved rounds, CUDA graphs, with an A/A pair."""
import sys

import torch

sys.path.insert(0, "bench")
from probe_timing import ranker_inputs, time_configs  # noqa: E402

from cute_kernels.kernels import ranker_fwd as rf_new, ranker_fwd_s47base as rf_base  # noqa: E402
from cute_kernels.kernels.ranker_flops import useful_flops  # noqa: E402

CASES = [(4, 4096, 512, 16, 16, 128, None), (16, 1024, 256, 16, 16, 128, None), (8, 2048, 2048, 8, 8, 128, None),
         (4, 4096, 512, 16, 16, 128, 50.0), (4, 4096, 512, 16, 16, 64, None), (4, 4096, 512, 16, 4, 128, None)]
cases = []
for i, case in enumerate(CASES):
    key, q, k, v, bounds, _ = ranker_inputs(case, seed=i)

    o1, l1 = rf_new._ranker_impl(q, k, v, bounds, None, case[-1], "tanh", None, None)
    o2, l2 = rf_base._ranker_impl(q, k, v, bounds, None, case[-1], "tanh", None, None)
    assert torch.equal(o1, o2) and torch.equal(l1, l2), key
    cases.append((key, q, k, v, bounds, case[-1], useful_flops(q, bounds, gemms=2), {"new": rf_new, "base": rf_base}))
print("bitwise equal on every case", flush=True)
launch = lambda q, k, v, bounds, cap, mod: mod._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None)  # noqa
time_configs(cases, rounds=int(sys.argv[1]) if len(sys.argv) > 1 else 5, launch=launch, shuffle_seed=4747,
             control=True)
