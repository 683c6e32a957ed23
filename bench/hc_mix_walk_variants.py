"""The hc_mix tma walk alone (no reduction kernel) at M = 4096 for walk configs that give the same bits:
the shipped one and without paired k tiles (``overlap``) (256-row tiles, half the hc_fn piece reads
from L2 per x byte, need 288 consumer registers: not compilable), and the shipped walk without the
piece loads (``x_only``: what the pieces' L2 traffic costs; its outputs are wrong); us per call,
CUDA graph of 10 calls, median of shuffled rounds, the shipped config timed twice (A/A).  (Session
19's log of it came from ab131ee, when the walk also took an arrival-counter argument.)

    python3 bench/hc_mix_walk_variants.py [--rounds=N] [--ncu]   (on the GPU; --ncu: two launches of each, no timing)
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
from cute_kernels.kernels.hc_mix import SP_COLS, _pieces
from cute_kernels.runtime.timing import copy_bandwidth_gbps, cuda_time_us
from hc_mix_tail_probe import Part, compiled_part
from cute_kernels.kernels.hc_mix import fake_launch_args
from cute_kernels.runtime.cache import compile_cached
from cute_kernels.runtime.fake import fake_tensor
import cutlass
import cutlass.cute as cute


class XOnlyWalk(Part):
    """The walk without the hc_fn piece loads (the WGMMAs read whatever the piece ring holds): what the
    walk costs without the pieces' L2 traffic (a measurement, wrong outputs)."""

    @property
    def tma_bytes(self):
        return self._x_bytes

    @tma_bytes.setter
    def tma_bytes(self, value):  # launch_walk sets x + pieces bytes; keep x's only
        from cutlass import BFloat16
        sX_layout, _ = tma.smem_layouts(self.config)
        self._x_bytes = cute.size_in_bytes(BFloat16, cute.select(sX_layout, mode=[0, 1]))

    @cute.jit
    def load(self, tma_X, tma_W, tma_atom_X, tma_atom_W, sX, sW, ring, m_block, kt_begin, kt_end):
        gX = cute.local_tile(tma_X, (self.tile_m, self.tile_k), (m_block, None))
        tXsX, tXgX = tma.cpasync.tma_partition(tma_atom_X, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2),
                                               cute.group_modes(gX, 0, 2))
        state = tma.pipeline.make_pipeline_state(tma.pipeline.PipelineUserType.Producer, self.stages)
        for kt in cutlass.range(kt_begin, kt_end, unroll=1):
            ring.producer_acquire(state)
            cute.copy(tma_atom_X, tXgX[None, kt], tXsX[None, state.index], tma_bar_ptr=ring.producer_get_barrier(state),
                      cache_policy=cutlass.Int64(tma.L2_EVICT_FIRST))
            state.advance()


def compiled_x_only(cfg):
    def build():
        args = fake_launch_args(pieces=True)
        p = fake_tensor(torch.float32, (cute.sym_int(), SP_COLS), stride=(SP_COLS, 1))
        return XOnlyWalk(cfg, "walk"), args[:-1] + (p, args[-1])
    return compile_cached("hc_probe_x_only", cfg, build)


def variants(m):
    shipped = tma.config_for(m)
    return {"shipped": shipped, "no_overlap": dataclasses.replace(shipped, overlap=False),
            "x_only": shipped, "shipped_again": shipped}


def main(rounds, ncu):
    m, k = 4096, 20480
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = torch.randn(24, k, device="cuda", generator=g) / math.sqrt(k)
    s = torch.rand(3, device="cuda", generator=g) + 0.5
    b = torch.randn(24, device="cuda", generator=g)
    pieces = _pieces(w)
    pre, post, comb = (torch.empty(m, n, device="cuda") for n in (4, 4, 16))
    mix = torch.empty(1, SP_COLS, device="cuda")
    calls = {}
    for name, cfg in variants(m).items():
        ws = torch.zeros(tma.workspace_rows(m, cfg), SP_COLS, device="cuda")
        walk = compiled_x_only(cfg) if name == "x_only" else compiled_part(cfg, "walk")
        calls[name] = (lambda walk=walk, ws=ws: walk(x, pieces, s, b, pre, post, comb, mix, 20, 1e-6, 1e-6, ws))
    for fn in calls.values():
        fn()
        fn()
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
    main(rounds, "--ncu" in args)
