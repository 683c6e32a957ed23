"""Markdown table of a ``cute-kernels bench --json`` file: one row per (shape, impl).  Attention
records show useful TFLOP/s and the speed relative to the FlashAttention-4 mask_mod peer of the same
shape and timing mode (graph / eager); bandwidth kernels (records with ``gbps``) show GB/s and the fraction of the measured copy rate.

    python3 bench/summarize.py bench/results/2026-11-29_h200_ranker_bwd_s2.json > table.md
"""

from __future__ import annotations

import json
import sys


def table(records: list[dict]) -> str:
    bandwidth = any("gbps" in r for r in records)
    cols = (["shape", "impl", "mode", "time (us)", "GB/s", "of copy rate"] if bandwidth else
            ["shape", "impl", "mode", "time (us)", "useful TFLOP/s", "vs fa4_mask_mod"])
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    fa4 = {}  # (shape, mode) -> FlashAttention-4's time: eager rows compare with its eager time
    for r in records:
        if r.get("impl") == "fa4_mask_mod" and r.get("time_us"):
            fa4[json.dumps(r.get("shape"), sort_keys=True), r.get("mode")] = r["time_us"]
    for r in records:
        shape = r.get("shape", {})
        key = json.dumps(shape, sort_keys=True), r.get("mode")
        label = ",".join(f"{k}={v}" for k, v in shape.items() if k != "dtype")
        if r.get("time_us") is None:
            lines.append(f"| {label} | {r.get('impl')} | | error: {str(r.get('error', '?'))[:60]} | | |")
            continue
        if bandwidth:
            frac = f"{r['copy_bw_frac']:.0%}" if r.get("copy_bw_frac") is not None else ""
            extra = f"{r['gbps']:.0f} | {frac}" if r.get("gbps") is not None else " | "
        else:
            rel = f"{fa4[key] / r['time_us']:.2f}x" if key in fa4 else ""
            extra = f"{r.get('tflops', '')} | {rel}"
        lines.append(f"| {label} | {r['impl']} | {r.get('mode', '')} | {r['time_us']:.1f} | {extra} |")
    meta = records[0] if records else {}
    head = f"{meta.get('gpu', '?')}, {meta.get('date', '?')}, commit {meta.get('commit', '?')}, torch {meta.get('torch', '?')}"
    return head + "\n\n" + "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        raise SystemExit(0)
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    try:
        with open(sys.argv[1]) as f:
            records = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"summarize: cannot read {sys.argv[1]}: {exc}") from None
    print(table(records))
