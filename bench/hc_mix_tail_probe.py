"""Where the fixed cost of the tma hc_mix op goes (session 8): the op, the walk alone, the reduction kernel
alone (on a workspace the walk filled), and sinkhorn_iters = 1, at M = 128 / 2048 / 4096 / 16384; us per call,
CUDA graph of 10 calls, median of 5 interleaved rounds; the parts are checked bit-equal to the op.

    python3 bench/hc_mix_tail_probe.py    (H200: bench/results/logs/2026-11-30_s8_hc_mix_tail_probe.log)
"""
if __name__ == "__main__":  # (also imported as a module: the check only when run as a script)
    from probe_timing import gpu_script

    gpu_script(__doc__)
import dataclasses, json, math, statistics, torch, cutlass, cutlass.cute as cute
from cute_kernels.kernels import hc_mix_tma as tma
from cute_kernels.kernels.hc_mix_shared import fake_launch_args, SP_COLS
from cute_kernels.runtime.cache import compile_cached
from cute_kernels.runtime.fake import fake_tensor
from cute_kernels.runtime.timing import cuda_time_us, copy_bandwidth_gbps
from cutlass import Float32, Int32


class Part(tma.HcMixTmaKernel):
    """The op's kernel launching only the walk (``part="walk"``) or only the reduction kernel."""

    def __init__(self, config, part):
        super().__init__(config)
        self.part = part

    @cute.jit
    def __call__(self, mX, mW, mScale, mBase, mPre, mPost, mComb, mMix, sinkhorn_iters: Int32, rms_eps: Float32,
                 hc_eps: Float32, mPart, stream):
        if cutlass.const_expr(self.part == "walk"):
            self.launch_walk(mX, mW, mPart, (mScale, mBase, mPre, mPost, mComb, mMix, sinkhorn_iters, rms_eps, hc_eps),
                             stream)
        else:
            self.launch_reduce(mX, mScale, mBase, mPre, mPost, mComb, mMix, sinkhorn_iters, rms_eps, hc_eps, mPart,
                               stream)


def compiled_part(cfg, part):
    def build():
        args = fake_launch_args()
        p = fake_tensor(torch.float32, (cute.sym_int(), SP_COLS), stride=(SP_COLS, 1))
        return Part(cfg, part), args[:-1] + (p, args[-1])
    return compile_cached("hc_probe_" + part, cfg, build)


def main():
    k = 20480
    print(json.dumps({"copy_gbps": round(copy_bandwidth_gbps(), 1)}), flush=True)
    res = {}
    data = {}
    for m in (128, 2048, 4096, 16384):
        g = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16(); w = torch.randn(24, k, device="cuda", generator=g) / math.sqrt(k)
        s = torch.rand(3, device="cuda", generator=g) + 0.5; b = torch.randn(24, device="cuda", generator=g)
        cfg = dataclasses.replace(tma.config_for(m), fused_epilogue=False)  # the two kernels, timed apart
        rows = tma.workspace_rows(m, cfg)
        ws = torch.zeros(rows, SP_COLS, device="cuda")
        pre = torch.empty(m, 4, device="cuda"); post = torch.empty(m, 4, device="cuda"); comb = torch.empty(m, 16, device="cuda")
        mix = torch.empty(1, SP_COLS, device="cuda")
        fw, fr = compiled_part(cfg, "walk"), compiled_part(cfg, "reduce")
        args = lambda it=20, t=(x, w, s, b, pre, post, comb, mix), ws=ws: (*t, it, 1e-6, 1e-6, ws)
        fw(*args()); fr(*args()); torch.cuda.synchronize()
        ref = tma.hc_mix_sinkhorn_tma(x, w, s, b, config=cfg)
        assert torch.equal(comb.view(m, 4, 4), ref[2]) and torch.equal(pre, ref[0]), "parts differ from the op"
        data[m] = (x, w, s, b, cfg, fw, fr, args)
    for rnd in range(5):
        for m, (x, w, s, b, cfg, fw, fr, args) in data.items():
            for name, fn in (("op", lambda: tma.hc_mix_sinkhorn_tma(x, w, s, b)),
                             ("op_iters1", lambda: tma.hc_mix_sinkhorn_tma(x, w, s, b, sinkhorn_iters=1)),
                             ("walk_only", lambda: fw(*args())),
                             ("reduce_only", lambda: fr(*args())),
                             ("reduce_only_iters1", lambda: fr(*args(1))),
                             ("walk_then_reduce", lambda: (fw(*args()), fr(*args())))):
                res.setdefault((m, name), []).append(cuda_time_us(fn))
    for m in data:
        print(json.dumps({"m": m, "cta_level": data[m][4].cta_level, **{n: round(statistics.median(v), 2) for (mm, n), v in res.items() if mm == m}}), flush=True)
    print(json.dumps({f"{m}:{n}": [round(t, 2) for t in v] for (m, n), v in res.items()}))


if __name__ == "__main__":
    main()
