"""Backward mainloop config variants vs the shipped config (:func:`ranker_bwd.config_for`) on the bench
shapes: checks, then CUDA-graph medians of interleaved rounds (``probe_timing.time_configs``).

Each argument is a variant ``NAME=field:value[,field:value...]`` of RankerBwdConfig fields:

    python3 bench/ranker_bwd_config_probe.py ds1=ds_stages:1 shared_dq=dq_per_wg:False
    python3 bench/ranker_bwd_config_probe.py dk_smem=dq_first:True,dk_from_smem:True

(a variant equal to the shipped config is dropped: at D=128 ``dq_first:True`` is shipped).
``--fa4`` adds FlashAttention-4's backward with the ranker mask_mod (bench/ranker_bwd_peers.py; timed
eagerly where its CUDA-graph capture fails, as in the bench); ``--d64`` keeps the D=64 shapes only,
``--headline`` the headline shape without and with the tanh cap (the issue's "tanh within 10%" pair),
``--d256`` the D=256 shapes (``ranker_bwd.D256_CASES``) instead.
Timing options as the forward probe's (``--rounds=N``, ``--seed=N``; shuffled order, A/A pair).
``--jobs=N``: first compile every kernel the probe launches in N processes (into the disk compile
cache, which the probe then loads), instead of one after another on first launch (a cold device
spends minutes there).

Checks per variant: dK and dV bitwise equal to the shipped config's (MHA, and GQA with a group per CTA
in both: same GEMMs in the same order; a variant that changes the GQA form, or the summation order of
the heads (one query head per CTA adds them in arrival order), is expected to differ), dQ's relative
difference, and in deterministic mode all of dQ, dK, dV bitwise equal (likewise within one GQA form).

Runs recorded: bench/results/logs/2026-11-30_s10_ranker_bwd_sync.log (the session-10 sync variants, when
``ds_stages=1, dq_per_wg=False`` was shipped), 2026-11-30_s10_ranker_bwd_dq_first_rs.log and ..._dq_first_smem.log.
"""
import dataclasses as dc
import json
import sys
from types import SimpleNamespace

import torch
from probe_timing import case_key, probe_options, ranker_inputs, time_configs, variant_configs

from cute_kernels.kernels import ranker_bwd as rb
from cute_kernels.kernels.ranker_fwd import ranker_attention
from cute_kernels.kernels.ranker_mask import admitted_pairs


def launch(x, k, v, bounds, cap, cfg):
    if callable(cfg):  # a peer's prepared backward call
        return cfg()
    return rb.ranker_attention_backward(x.q, k, v, x.o, x.lse, x.do, bounds, cap=cap, config=cfg)


def _precompile_one(a):
    rb.compile_preprocess(*a["pre"]), rb._compile(*a["main"]), rb.compile_postprocess(*a["post"])


def probe_cases(d64: bool = False, headline: bool = False, d256: bool = False) -> list:
    """The bench shapes a probe runs (``--d64``, ``--headline``, ``--d256``; all of BENCH_CASES by default);
    ``ValueError`` for ``--d256`` with another of them."""
    if d256 and (d64 or headline):
        raise ValueError("--d256 runs the D=256 shapes only: leave out --d64 and --headline")
    if d256:
        return list(rb.D256_CASES)
    return [c for c in (rb.BENCH_CASES[:2] if headline else rb.BENCH_CASES) if not d64 or c[5] == 64]


def precompile(variants, jobs: int, cases):
    """Compile, in ``jobs`` spawned processes, the three backward kernels of every call :func:`main`
    makes (the forward's, one per shape, compile on first use)."""
    import contextlib
    import io
    import multiprocessing as mp

    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    todo = {}
    for nb, hist, cand, hq, hkv, d, cap in cases:
        with contextlib.redirect_stdout(io.StringIO()):  # main() reports invalid variants
            cfgs = variant_configs(rb.config_for(d, cap is not None), variants, "")
        for cfg in cfgs.values():
            for det in (False, True):  # launch() passes the default cap method, "tanh"
                a = rb.call_launch_args(torch.bfloat16, dc.replace(cfg, deterministic=det), hq // hkv, nb, hkv,
                                        hist + cand, cap, "tanh", False, num_sms)
                todo[repr(a)] = a
    with mp.get_context("spawn").Pool(jobs) as pool:
        pool.map(_precompile_one, [todo[key] for key in sorted(todo)], chunksize=1)
    print(json.dumps({"precompiled": len(todo), "jobs": jobs}), flush=True)


def _time_graph_or_eager(fn, reps, inner):
    """CUDA-graph timing, or eager timing for a call that cannot be captured (FlashAttention-4's backward,
    as in the bench), each after ``SETTLE_S`` seconds of calls."""
    from cute_kernels.runtime.timing import SETTLE_S, cuda_time_us

    try:
        return cuda_time_us(fn, graph=True, reps=reps, inner=inner, settle_s=SETTLE_S)
    except Exception as exc:  # noqa: BLE001 (capture failed): said once per message, then timed eagerly
        msg = f"{type(exc).__name__}: {exc}"[:160]
        if msg not in _EAGER_SAID:
            _EAGER_SAID.add(msg)
            print(json.dumps({"timing": "eager (CUDA-graph capture failed)", "error": msg}), flush=True)
        torch.cuda.synchronize()
        return cuda_time_us(fn, graph=False, reps=reps, inner=inner, settle_s=SETTLE_S)


_EAGER_SAID: set = set()


def main(variants, timing: dict, cases, fa4: bool = False):
    data = []
    for case in cases:
        nb, hist, cand, hq, hkv, d, cap = case
        # the variants first: a misspelled field fails before any input is built
        base = rb.config_for(d, cap is not None)
        cfgs = variant_configs(base, variants, case_key(case))
        key, q, k, v, bounds, do = ranker_inputs(case, seed=len(data), dout=True)
        o, lse = ranker_attention(q, k, v, bounds, cap=cap, return_lse=True)
        x = SimpleNamespace(q=q, o=o, lse=lse, do=do)
        ref = launch(x, k, v, bounds, cap, base)
        ref_det = launch(x, k, v, bounds, cap, dc.replace(base, deterministic=True))
        checks = {}
        for name, cfg in cfgs.items():
            got = launch(x, k, v, bounds, cap, cfg)
            got_det = launch(x, k, v, bounds, cap, dc.replace(cfg, deterministic=True))
            checks[name] = dict(
                dk_dv_bitwise=[torch.equal(got[1], ref[1]), torch.equal(got[2], ref[2])],
                dq_rel=round(((got[0].float() - ref[0].float()).norm() / ref[0].float().norm()).item(), 6),
                det_bitwise=all(torch.equal(a, b) for a, b in zip(got_det, ref_det)))
        print(json.dumps({"shape": key, "checks": checks}), flush=True)
        if fa4:
            from ranker_bwd_peers import fa4_mask_mod

            try:
                cfgs["fa4_mask_mod"] = fa4_mask_mod(q, k, v, bounds, do, cap)
            except Exception as exc:  # noqa: BLE001 (a line per failing peer)
                print(json.dumps({"shape": key, "fa4_mask_mod": repr(exc)[:200]}), flush=True)
        flops = 10 * d * hq * admitted_pairs(bounds.cpu(), [hist + cand] * nb)
        data.append((key, x, k, v, bounds, cap, flops, cfgs))
    time_configs(data, launch=launch, time_us=_time_graph_or_eager if fa4 else None, **timing)


if __name__ == "__main__":
    variants, opts = probe_options(sys.argv[1:], flags=("--fa4", "--d64", "--headline", "--d256"), doc=__doc__,
                                   jobs=True)
    jobs, fa4 = opts.pop("jobs"), opts.pop("fa4")
    cases = probe_cases(opts.pop("d64"), opts.pop("headline"), opts.pop("d256"))
    if jobs:
        precompile(variants, jobs, cases)
    main(variants, opts, cases, fa4=fa4)
