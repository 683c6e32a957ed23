"""Markdown tables of a ``cute-kernels bench --json`` file (one per kernel): one row per (shape, impl, mode).  Attention
records show useful TFLOP/s and the speed relative to the FlashAttention-4 mask_mod peer of the same
shape and timing mode (graph / eager / isolated; a graph row against FA4's eager time where FA4 could not
be captured, marked so; eager and isolated rows show the record's ``torch_mul_us``, the host's speed then);
bandwidth kernels (records with ``gbps``) show GB/s and the fraction of the measured copy rate; records with
neither (the emulated tensor-parallel bench's latencies) show their times alone.

    python3 bench/summarize.py bench/results/2026-11-29_h200_ranker_bwd_s2.json > table.md

The file may also hold JSON lines (``.jsonl``) or a ``{"results": [...]}`` wrapper; correctness records (the
tensor-parallel runs': ``passed`` and no time) show as "check passed" / "check FAILED".
"""

from __future__ import annotations

import json
import math
import sys


def table(records: list[dict]) -> str:
    """The header line (GPU, date, commit, torch of the first record) and one markdown table per kernel."""
    kernels = list(dict.fromkeys(r.get("kernel") for r in records))
    parts = [_kernel_table([r for r in records if r.get("kernel") == kern]) for kern in kernels]
    if len(kernels) > 1:
        parts = [f"### {kern}\n\n{part}" for kern, part in zip(kernels, parts)]
    meta = records[0] if records else {}
    head = f"{meta.get('gpu', '?')}, {meta.get('date', '?')}, commit {meta.get('commit', '?')}, torch {meta.get('torch', '?')}"
    settle = sorted({r["settle_s"] for r in records if r.get("settle_s")})
    if settle:  # (the ranker, Q/K norm and hc_mix benches since session 82: each timing after that long of calls)
        head += f"; graph and eager times taken after {', '.join(f'{x:g}' for x in settle)} s of calls (settled clocks)"
    return head + "\n\n" + "\n\n".join(parts) + "\n"


def _kernel_table(records: list[dict]) -> str:
    bandwidth = any("gbps" in r for r in records)
    latency = not bandwidth and not any("tflops" in r for r in records)  # (qknorm_tp's: times alone)
    cols = (["shape", "impl", "mode", "time (us)", "GB/s", "of copy rate"] if bandwidth else
            ["shape", "impl", "mode", "time (us)"] if latency else
            ["shape", "impl", "mode", "time (us)", "useful TFLOP/s", "vs fa4_mask_mod"])
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    fa4 = {}  # (shape, mode) -> FlashAttention-4's time: each row compares with FA4 timed the same way
    for r in records:
        if r.get("impl") == "fa4_mask_mod" and r.get("time_us"):
            fa4.setdefault((json.dumps(r.get("shape"), sort_keys=True), r.get("mode")), r["time_us"])
    for r in records:
        shape = r.get("shape", {})
        key = json.dumps(shape, sort_keys=True)
        label = ",".join(f"{k}={v}" for k, v in shape.items() if k != "dtype")
        if r.get("time_us") is None:
            if "passed" in r:  # a correctness record (the tensor-parallel runs'), not a timing
                what = "check passed" if r["passed"] else f"check FAILED: {str(r.get('error', ''))[:50]}"
            else:
                what = f"error: {str(r.get('error', '?'))[:60]}"
            lines.append(f"| {label} | {r.get('impl')} | {r.get('mode') or ''} | {what} |" + ("" if latency else " | |"))
            continue
        if bandwidth:
            # (hc_mix records the fraction as copy_bw_frac, qknorm as copy_frac)
            share = r.get("copy_bw_frac", r.get("copy_frac"))
            frac = f"{share:.1%}" if share is not None else ""
            extra = f"{r['gbps']:.0f} | {frac}" if r.get("gbps") is not None else " | "
        else:
            rel = ""
            if (key, r.get("mode")) in fa4:
                rel = f"{fa4[key, r.get('mode')] / r['time_us']:.2f}x"
            elif r.get("mode") == "graph" and (key, "eager") in fa4:  # FA4's graph capture failed: its eager time
                rel = f"{fa4[key, 'eager'] / r['time_us']:.2f}x (FA4 eager)"
            extra = f"{r.get('tflops', '')} | {rel}"
        mode = r.get("mode", "")
        if _is_number(r.get("torch_mul_us")):  # eager / isolated rows: the host's speed then (a tiny torch launch)
            mode = f"{mode} (torch.mul {r['torch_mul_us']:.1f} us)"
        if latency:
            lines.append(f"| {label} | {r['impl']} | {mode} | {r['time_us']:.1f} |")
            continue
        lines.append(f"| {label} | {r['impl']} | {mode} | {r['time_us']:.1f} | {extra} |")
    return "\n".join(lines)


def load_records(path: str) -> list[dict]:
    """The bench records in ``path``: a JSON list of records, one record, a ``{"results": [...]}`` wrapper (some
    probe files), or JSON lines (one record per line, the ``.jsonl`` files); entries without ``impl`` are left out.
    ``ValueError`` saying what the file holds when it has no record (e.g. ``bench/overhead.py``'s timing dict),
    naming the line of JSON lines that does not parse, or naming the record whose fields have the wrong type
    (:func:`check_record`)."""
    with open(path) as f:
        text = f.read()
    if not text.strip():
        raise ValueError("the file is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # JSON lines (or an error, reported with its line)
        data = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    data.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"line {number} is not JSON ({exc.msg}, column {exc.colno})") from None
    if isinstance(data, dict) and isinstance(data.get("results"), list):
        data = data["results"]
    elif isinstance(data, dict) and "impl" in data:  # one record on its own
        data = [data]
    records = [r for r in data if isinstance(r, dict) and "impl" in r] if isinstance(data, list) else []
    if not records:  # (entries without "impl", e.g. a run's copy-rate line, are left out of the table)
        kind = f"a dict with keys {sorted(data)[:6]}" if isinstance(data, dict) else f"a {type(data).__name__}"
        raise ValueError(f"no bench records (dicts with 'impl', 'shape', 'time_us'): {kind}")
    for number, record in enumerate(records, 1):
        check_record(record, number)
    return records


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_record(record: dict, number: int = 1) -> None:
    """``ValueError`` unless the fields the tables read have their types: ``impl`` a string, ``kernel`` and
    ``mode`` absent, null or strings, ``shape`` a dict, ``time_us`` null or a finite number >= 0,
    ``tflops`` / ``gbps`` / ``copy_frac`` / ``copy_bw_frac`` / ``torch_mul_us`` absent, null or numbers."""
    def bad(what):
        raise ValueError(f"record {number} ({record.get('impl')!r}): {what}")
    if not isinstance(record["impl"], str):
        bad(f"impl must be a string, got {type(record['impl']).__name__}")
    for key in ("kernel", "mode"):
        if record.get(key) is not None and not isinstance(record[key], str):
            bad(f"{key} must be a string, got {type(record[key]).__name__}")
    if not isinstance(record.get("shape", {}), dict):
        bad(f"shape must be an object (name -> value), got {type(record['shape']).__name__}")
    t = record.get("time_us")
    if t is not None and not (_is_number(t) and math.isfinite(t) and t >= 0):
        bad(f"time_us must be a finite number >= 0 or null, got {t!r}")
    for key in ("tflops", "gbps", "copy_frac", "copy_bw_frac", "torch_mul_us"):
        if record.get(key) is not None and not _is_number(record[key]):
            bad(f"{key} must be a number, got {record[key]!r}")


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        raise SystemExit(0)
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    try:
        records = load_records(sys.argv[1])
    except (OSError, ValueError) as exc:  # (json.JSONDecodeError is a ValueError)
        raise SystemExit(f"summarize: {sys.argv[1]}: {exc}") from None
    print(table(records))
