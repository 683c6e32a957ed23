"""Host overhead of this checkout against another tree of the library, interleaved on one machine.

    python3 bench/overhead_ab.py --other PATH [--other-commit SHA] [--rounds N] [--json PATH]

PATH holds another version's ``cute_kernels`` package, e.g. one made with
``mkdir -p .ab/OLD && git archive OLD cute_kernels | tar -x -C .ab/OLD``. Each round runs
``bench/overhead.py`` once with this checkout's package first on ``PYTHONPATH`` and once with PATH's,
alternating which goes first, so that a host whose speed drifts over the minutes weighs on both alike.
Prints, for every call that ``overhead.py`` times, the best and median host us per call of each tree
over the rounds. Host figures move between machines: compare them only within one run of this script.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def one_run(tree, workdir):
    out = os.path.join(workdir, "r.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, os.path.join(HERE, "overhead.py"), "--json", out], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    with open(out) as f:
        return {name: rec["host_us_per_call"] for name, rec in json.load(f).items() if "host_us_per_call" in rec}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", required=True, help="a folder holding another version's cute_kernels package")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json")
    ap.add_argument("--other-commit", help="the commit PATH's package came from (stamped on the record)")
    args = ap.parse_args()
    other = os.path.abspath(args.other)
    if not os.path.isdir(os.path.join(other, "cute_kernels")):
        raise SystemExit(f"{other} holds no cute_kernels package")
    trees = {"this": ROOT, "other": other}
    runs = {"this": [], "other": []}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            for label in (("this", "other") if r % 2 == 0 else ("other", "this")):
                runs[label].append(one_run(trees[label], workdir))
                print(f"round {r + 1} {label} done", flush=True)
    names = [n for n in runs["this"][0] if n in runs["other"][0]]
    table = {}
    print(f"{'call (host us per call)':<46} {'this best':>9} {'median':>7} {'other best':>10} {'median':>7}")
    for n in names:
        row = {}
        for label in ("this", "other"):
            xs = [run[n] for run in runs[label]]
            row[label] = dict(best=min(xs), median=statistics.median(xs), all=xs)
        table[n] = row
        print(f"{n:<46} {row['this']['best']:9.2f} {row['this']['median']:7.2f} "
              f"{row['other']['best']:10.2f} {row['other']['median']:7.2f}")
    if args.json:
        sys.path.insert(0, ROOT)
        from cute_kernels.cli import run_metadata  # (date, GPU, this tree's commit: CUTE_KERNELS_COMMIT or git)

        with open(args.json, "w") as f:
            json.dump(dict(this=ROOT, other=other, other_commit=args.other_commit, rounds=args.rounds, calls=table,
                           **run_metadata()), f, indent=1)


if __name__ == "__main__":
    main()
