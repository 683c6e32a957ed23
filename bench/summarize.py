"""Markdown table of a ``cute-kernels bench --json`` file: one row per (shape, impl), with each
impl's speed relative to the FlashAttention-4 mask_mod peer of the same shape when present.

    python3 bench/summarize.py bench/results/2026-11-29_h200_ranker_bwd_s2.json > table.md
"""

from __future__ import annotations

import json
import sys


def table(records: list[dict]) -> str:
    cols = ["shape", "impl", "mode", "time (us)", "useful TFLOP/s", "vs fa4_mask_mod"]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    fa4 = {}
    for r in records:
        if r.get("impl") == "fa4_mask_mod" and r.get("time_us"):
            fa4[json.dumps(r.get("shape"), sort_keys=True)] = r["time_us"]
    for r in records:
        shape = r.get("shape", {})
        key = json.dumps(shape, sort_keys=True)
        label = ",".join(f"{k}={v}" for k, v in shape.items() if k != "dtype")
        if r.get("time_us") is None:
            lines.append(f"| {label} | {r.get('impl')} | | error: {str(r.get('error', '?'))[:60]} | | |")
            continue
        rel = f"{fa4[key] / r['time_us']:.2f}x" if key in fa4 else ""
        lines.append(f"| {label} | {r['impl']} | {r.get('mode', '')} | {r['time_us']:.1f} | "
                     f"{r.get('tflops', '')} | {rel} |")
    meta = records[0] if records else {}
    head = f"{meta.get('gpu', '?')}, {meta.get('date', '?')}, commit {meta.get('commit', '?')}, torch {meta.get('torch', '?')}"
    return head + "\n\n" + "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        print(table(json.load(f)))
