"""Where the eager host time of one ``hc_mix_sinkhorn`` call goes (M=1, K=20480: the kernels are short, so the
host time shows).

    python3 bench/hc_mix_host_breakdown.py

Times (host, us per call, 2000 back-to-back calls after 200 warm-up, best of 5 interleaved rounds) the public call
(both methods) and its layers: the op's body without the eager fast path's checks (``.impl``), the cached argument
checks, ``hc_mix_tma.launch`` (config choice, allocations, launch), the launch with the outputs preallocated
(``out=``), the raw compiled (tvm-ffi) call with every buffer preallocated, the config choice and compiled-function
lookup alone, the four allocations, and torch.mul for scale.
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import math

import torch

import cute_kernels
from cute_kernels.kernels import hc_mix as mod
from cute_kernels.kernels import hc_mix_tma as tma
from probe_timing import report_host_times


def main():
    m, k = 1, 20480
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = torch.randn(mod.N_MIX, k, device="cuda", generator=g) / math.sqrt(k)
    s, b = torch.rand(3, device="cuda", generator=g) + 0.5, torch.randn(mod.N_MIX, device="cuda", generator=g)
    args = (x, w, s, b)
    cute_kernels.hc_mix_sinkhorn(*args)
    cute_kernels.hc_mix_sinkhorn(*args, method="walk")
    cfg = tma._launch_config(tma.config_for(m), False)
    fn = tma._compile(cfg)
    out = (x.new_empty((m, 4), dtype=torch.float32), x.new_empty((m, 4), dtype=torch.float32),
           x.new_empty((m, 4, 4), dtype=torch.float32))
    ws = x.new_empty((tma.workspace_rows(m, cfg), mod.SP_COLS), dtype=torch.float32)
    comb2d = out[2].view(m, 16)
    y = torch.randn(2048, device="cuda", dtype=torch.bfloat16)

    def choose():
        c = tma._launch_config(tma.config_for(m), False)
        return tma._compile(c), tma.workspace_rows(m, c)

    calls = {
        "hc_mix_sinkhorn (public, tma)": lambda: cute_kernels.hc_mix_sinkhorn(*args),
        "hc_mix_sinkhorn (public, walk)": lambda: cute_kernels.hc_mix_sinkhorn(*args, method="walk"),
        "hc_mix_sinkhorn.impl (no fast-path checks)": lambda: mod.hc_mix_sinkhorn.impl(*args),
        "_validate_cached": lambda: mod._validate_cached(x, w, s, b, 20, 1e-6, 1e-6),
        "hc_mix_tma.launch": lambda: tma.launch(x, w, s, b, 20, 1e-6, 1e-6),
        "hc_mix_tma.launch, out= given": lambda: tma.launch(x, w, s, b, 20, 1e-6, 1e-6, out=out),
        "config choice + compiled lookup": choose,
        "raw compiled call (13 args)": lambda: fn(x, w, s, b, out[0], out[1], comb2d, ws[:1], 20, 1e-6, 1e-6, ws),
        "4 x new_empty": lambda: (x.new_empty((m, 4), dtype=torch.float32), x.new_empty((m, 4), dtype=torch.float32),
                                  x.new_empty((m, 4, 4), dtype=torch.float32),
                                  x.new_empty(ws.shape, dtype=torch.float32)),
        "torch.mul (2048 bf16)": lambda: torch.mul(y, 2.0),
    }
    report_host_times(calls, width=44)


if __name__ == "__main__":
    main()
