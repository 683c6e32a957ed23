#!/usr/bin/env bash
# Runs everything GPU-side on a GPU machine, from the source tree (no install, no network):
#   scripts/gpu_run.sh OUTDIR [tests|check|bench|sanitize|notebooks|all] [--kernel NAME] [--jobs N]
#   (all = tests, check, bench and notebooks; sanitize runs on its own: compute-sanitizer memcheck, racecheck
#   and synccheck over the small-launch scripts tests/gpu/sanitize_*.py and qknorm_sanitize_case.py, which
#   launch every kernel at small shapes; the multi-GPU TP plan is scripts/tp_qknorm_multigpu.py)
# On the project's H200 through the device tool:
#   bash ../shared/device/stage.sh --peers         # once per checkout: the DSL kit (+ benchmark peers)
#   run: carry [".devkit"], command "source .devkit/prelude.sh && CUTE_KERNELS_COMMIT=<sha> bash scripts/gpu_run.sh $OUT all"
#   (the device copy's git metadata is not the checkout's: pass the commit so the records carry it)
# --jobs N: the GPU tests in N pytest processes at once (round-robin shards of the collected tests; most of a
# cold run is compiling kernels on the CPU: the forward file took 177 s in 4 shards on the H200's 16 cores,
# about 780 s in one process). The emulated tensor-parallel tests (test_qknorm_tp_gpu.py) wait on their peers
# with timeouts that other processes time-slicing the GPU can exceed (session 30: a 1000-launch stress timed
# out at launch 693 in a shard), so they run after the shards, in one process of their own. Tests that failed
# with torch.OutOfMemoryError beside the other shards (session 62: 12 shards on an 80 GB H100) run once more,
# alone, after them; any other failure keeps the run red; every shard draws the same random inputs
# (one CUTE_KERNELS_SEED); scripts/pytest_shards.py runs all that and writes gpu-tests.log, the summary.
# Writes into OUTDIR: info.txt (GPU, versions, cache), gpu-tests.log (and gpu-tests.xml with --jobs 1; with --jobs N
# the shards' own pytest logs, junit XML and records packed into gpu-tests-shards.tar.gz), check.txt, bench.json
# (records with date, GPU, commit) and bench.log, notebooks.log; sanitize: sanitize.txt and sanitize-logs.tar.gz.
# At most 7 files for mode all, which the device tool brings back whole (it returns 8 files a call). Copy
# bench.json into bench/results/ to back a claim in the README.
set -uo pipefail
usage="usage: gpu_run.sh OUTDIR [tests|check|bench|sanitize|notebooks|all] [--kernel NAME] [--jobs N]"
if [[ $# == 0 || ${1:-} == -h || ${1:-} == --help ]]; then
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; echo "$usage"; [[ $# == 0 ]] && exit 2; exit 0
fi
out=$1; shift
if [[ $out == -* ]]; then echo "gpu_run.sh: OUTDIR first ($usage)" >&2; exit 2; fi
what=all
if [[ $# -gt 0 && $1 != --* ]]; then what=$1; shift; fi
case $what in
  tests|check|bench|sanitize|notebooks|all) ;;
  *) echo "gpu_run.sh: unknown mode '$what' (tests, check, bench, sanitize, notebooks or all; all leaves out" \
          "sanitize)" >&2; exit 2 ;;
esac
kernel=
jobs=
root=$(cd "$(dirname "$0")/.." && pwd)
while [[ $# -gt 0 ]]; do
  if [[ $1 == --kernel && -n ${2:-} && -z $kernel ]]; then
    kernel=$2
    if [[ ! -f $root/tests/gpu/test_${kernel}_gpu.py ]]; then
      names=$(cd "$root/tests/gpu" && ls test_*_gpu.py | sed 's/^test_//; s/_gpu\.py$//' | tr '\n' ' ')
      echo "gpu_run.sh: unknown kernel '$kernel' (one of: $names)" >&2; exit 2
    fi
  elif [[ $1 == --jobs && -z $jobs ]]; then
    if [[ ! ${2:-} =~ ^[1-9][0-9]{0,2}$ ]]; then
      echo "gpu_run.sh: --jobs takes a whole number of pytest processes from 1 to 999, got '${2:-}'" >&2; exit 2
    fi
    if [[ $what != tests && $what != all ]]; then
      echo "gpu_run.sh: --jobs applies to the GPU tests (modes tests and all), not to '$what'" >&2; exit 2
    fi
    jobs=$2
  else echo "gpu_run.sh: unexpected arguments '$*' ($usage)" >&2; exit 2; fi
  shift 2
done
jobs=${jobs:-1}
kernel_args=()
[[ -n $kernel ]] && kernel_args=(--kernel "$kernel")
tests=(tests/gpu)
sanitize_scripts=(tests/gpu/sanitize_ranker_fwd.py tests/gpu/sanitize_ranker_bwd.py tests/gpu/sanitize_hc_mix.py
                  tests/gpu/qknorm_sanitize_case.py)
if [[ -n $kernel ]]; then
  tests=(tests/gpu/test_${kernel}_gpu.py)
  case $kernel in
    ranker_fwd|ranker_bwd|hc_mix) sanitize_scripts=(tests/gpu/sanitize_${kernel}.py) ;;
    qknorm|qknorm_tp) sanitize_scripts=(tests/gpu/qknorm_sanitize_case.py) ;;
    *) sanitize_scripts=() ;;
  esac
  # check and bench take registered kernels only (some GPU test files, e.g. ranker_fuzz, are not kernels)
  registered=$(sed -n '/^KERNELS/,/^}/p' "$root/cute_kernels/registry.py" | grep -o '^ *"[a-z_0-9]*"' | tr -d ' "')
  if [[ ($what == check || $what == bench || $what == all) && ! " $(echo $registered) " =~ " $kernel " ]]; then
    echo "gpu_run.sh: --kernel $kernel names a GPU test file, not a registered kernel, so mode '$what' cannot" \
         "check or bench it (registered: $(echo $registered)); use mode tests" >&2; exit 2
  fi
  if [[ $what == sanitize && ${#sanitize_scripts[@]} == 0 ]]; then
    echo "gpu_run.sh: no sanitizer script for --kernel $kernel (scripts exist for ranker_fwd, ranker_bwd," \
         "hc_mix, qknorm, qknorm_tp)" >&2; exit 2
  fi
fi
mkdir -p "$out" && out=$(cd "$out" && pwd)  # absolute: the rest runs from the repository root
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export CUTE_DSL_ARCH=${CUTE_DSL_ARCH:-sm_90a}
export PYTHONUNBUFFERED=1
cd "$root"
# on a machine without a usable CUDA GPU every GPU test would skip and check/bench fail one by one: stop here
if ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_run.sh: no CUDA GPU visible to torch here (torch.cuda.is_available() is False, or torch is" \
       "missing); run it on the GPU machine (see the header: $0 --help)" >&2
  exit 3
fi
status=0
rm -f "$out/gpu.txt"  # (an earlier version's file: nvidia-smi's line now heads info.txt)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1; python3 -m cute_kernels info; } \
  | tee "$out/info.txt"

if [[ ($what == tests || $what == all) && $jobs == 1 ]]; then
  rm -f "$out"/gpu-tests-* "$out"/gpu-tests.xml  # (an earlier sharded run's files)
  python3 -m pytest -q -p no:cacheprovider "${tests[@]}" --junitxml="$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.log" | tail -40
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
elif [[ $what == tests || $what == all ]]; then
  # the shards, then test_qknorm_tp_gpu.py alone (timing-sensitive), then any test out of GPU memory beside the
  # other shards again alone; one seed for all; gpu-tests.log sums up
  rm -f "$out/gpu-tests-shards.tar.gz"
  python3 scripts/pytest_shards.py "$out" --jobs "$jobs" --alone "test_qknorm_tp_gpu.py::" "${tests[@]}" || status=1
  # the shards' files (four per shard) in one archive beside the summary (session 64: 12 shards' 50 files were
  # more than the device tool brings back, and the summary was among those it left behind)
  shard_files=$(cd "$out" && ls -d gpu-tests-* 2>/dev/null)
  if [[ -n $shard_files ]]; then
    (cd "$out" && tar czf gpu-tests-shards.tar.gz $shard_files && rm -f $shard_files) || status=1
  fi
fi
if [[ $what == check || $what == all ]]; then
  python3 -m cute_kernels check "${kernel_args[@]}" --quiet 2>&1 | tee "$out/check.txt" | tail -60
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi
if [[ $what == bench || $what == all ]]; then
  python3 -m cute_kernels bench "${kernel_args[@]}" --json "$out/bench.json" 2>&1 | tee "$out/bench.log" | tail -80
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi
if [[ $what == notebooks || $what == all ]]; then
  # the notebooks' GPU cells (CI runs them on a CPU only): plain Python, no Jupyter needed
  # (one log for all of them, each notebook's output under a '== NAME exit RC' line)
  rm -f "$out/notebooks.log"
  for nb in notebooks/*.ipynb; do
    python3 scripts/run_notebook.py "$nb" > "$out/notebook.tmp" 2>&1
    rc=$?; echo "$nb exit $rc"; tail -3 "$out/notebook.tmp"
    { echo "== $nb exit $rc"; cat "$out/notebook.tmp"; } >> "$out/notebooks.log"
    [[ $rc == 0 ]] || status=1
  done
  rm -f "$out/notebook.tmp"
fi
if [[ $what == sanitize ]]; then
  # the small-launch scripts (every kernel and schedule at small shapes), each under memcheck, racecheck and
  # synccheck (shuffles or barriers some lanes miss)
  # (sanitize.txt: each run's exit status and last lines; the whole logs packed into sanitize-logs.tar.gz)
  rm -f "$out"/sanitize-*.log "$out/sanitize-logs.tar.gz" "$out/sanitize.txt"
  for script in "${sanitize_scripts[@]}"; do
    for tool in memcheck racecheck synccheck; do
      log="$out/sanitize-$tool-$(basename "$script" .py).log"
      compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 20 python3 "$script" > "$log" 2>&1
      rc=$?; { echo "$tool $script exit $rc"; tail -3 "$log"; } | tee -a "$out/sanitize.txt"
      [[ $rc == 0 ]] || status=1
    done
  done
  (cd "$out" && tar czf sanitize-logs.tar.gz sanitize-*.log && rm -f sanitize-*.log) || status=1
fi
exit $status
