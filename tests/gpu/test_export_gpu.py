"""GPU: programs exported with ``torch.export`` that call the ops, saved, then loaded and run in a fresh process
that only imports ``torch`` and ``cute_kernels`` (the lookup of each op in ``torch.ops.cute_kernels`` imports
its kernel module): the same bits as the eager call in this process, for every op."""

import subprocess
import sys

import torch

import cute_kernels as ck


class Attn(torch.nn.Module):
    def forward(self, q, k, v, bounds):
        return ck.ranker_attention(q, k, v, bounds, cap=30.0, return_lse=True)


class Norm(torch.nn.Module):
    def forward(self, q, k, wq, wk):
        ck.qk_rmsnorm_(q, k, wq, wk, 1e-6)
        return q, k


class Mix(torch.nn.Module):
    def forward(self, x, fn, scale, base):
        return ck.hc_mix_sinkhorn(x, fn, scale, base)


class Scale(torch.nn.Module):
    def forward(self, x):
        return ck.scale(x, 0.75)


def _cases():
    g = torch.Generator(device="cuda").manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    rn = lambda *s, dtype=torch.bfloat16: torch.randn(*s, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    q, k, v = rn(2, 200, 4, 128), rn(2, 200, 2, 128), rn(2, 200, 2, 128)
    bounds = torch.tensor([[0, 150, 150, 200], [10, 97, 120, 190]], device="cuda", dtype=torch.int32)
    return {
        "attn": (Attn(), (q, k, v, bounds)),
        "norm": (Norm(), (rn(37, 512), rn(37, 128), rn(512), rn(128))),
        "mix": (Mix(), (rn(64, 1024), rn(24, 1024, dtype=torch.float32), rn(3, dtype=torch.float32),
                        rn(24, dtype=torch.float32))),
        "scale": (Scale(), (rn(4096),)),
    }


def test_exported_programs_load_after_a_plain_import_and_match_eager(tmp_path):
    cases = _cases()
    expected = {}
    for name, (mod, args) in cases.items():
        ep = torch.export.export(mod, tuple(a.clone() for a in args))
        torch.export.save(ep, tmp_path / f"{name}.pt2")
        out = mod(*(a.clone() for a in args))
        expected[name] = out if isinstance(out, tuple) else (out,)
    torch.save({n: a for n, (_, a) in cases.items()}, tmp_path / "inputs.pt")
    code = ("import sys, torch, cute_kernels\n"
            "assert not any(m.startswith('cute_kernels.kernels.') for m in sys.modules)\n"
            f"d = {str(tmp_path)!r}\n"
            "inputs = torch.load(d + '/inputs.pt')\n"
            "outs = {}\n"
            "for name, args in inputs.items():\n"
            "    out = torch.export.load(f'{d}/{name}.pt2').module()(*args)\n"
            "    outs[name] = tuple(out) if isinstance(out, (tuple, list)) else (out,)\n"
            "torch.save(outs, d + '/outputs.pt')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = torch.load(tmp_path / "outputs.pt")
    for name, want in expected.items():
        assert len(got[name]) == len(want), name
        for g_, w in zip(got[name], want):
            assert g_.shape == w.shape and g_.dtype == w.dtype, name
            assert torch.equal(g_, w), (name, (g_.float() - w.float()).abs().max().item())
