#!/usr/bin/env bash
# Runs everything GPU-side on a GPU machine, from the source tree (no install, no network):
#   scripts/gpu_run.sh OUTDIR [tests|check|bench|sanitize|notebooks|all] [--kernel NAME]
# (all = tests, check, bench and notebooks; sanitize runs on its own)
# On the project's H200 through the device tool:
#   bash ../shared/device/stage.sh --peers         # once per checkout: the DSL kit (+ benchmark peers)
#   run: carry [".devkit"], command "source .devkit/prelude.sh && CUTE_KERNELS_COMMIT=<sha> bash scripts/gpu_run.sh $OUT all"
#   (the device copy has no .git: pass the commit so the records carry it)
# Writes into OUTDIR: pytest logs and junit XML, check.txt, bench.json (records with date, GPU, commit),
# sanitizer logs. Copy bench.json into bench/results/ to back a claim in the README.
set -uo pipefail
out=${1:?usage: gpu_run.sh OUTDIR [tests|check|bench|sanitize|notebooks|all] [--kernel NAME]}
what=${2:-all}
case $what in
  tests|check|bench|sanitize|notebooks|all) ;;
  *) echo "gpu_run.sh: unknown mode '$what' (tests, check, bench, sanitize, notebooks or all; all leaves out" \
          "sanitize)" >&2; exit 2 ;;
esac
shift $(( $# >= 2 ? 2 : 1 ))
kernel_args=("$@")
tests=(tests/gpu)
if [[ ${1:-} == --kernel && -n ${2:-} ]]; then tests=(tests/gpu/test_${2}_gpu.py); fi
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export CUTE_DSL_ARCH=${CUTE_DSL_ARCH:-sm_90a}
export PYTHONUNBUFFERED=1
cd "$root"
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
python3 -m cute_kernels info | tee "$out/info.txt"

if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -q -p no:cacheprovider "${tests[@]}" --junitxml="$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.log" | tail -40
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
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
  for nb in notebooks/*.ipynb; do
    python3 scripts/run_notebook.py "$nb" > "$out/$(basename "$nb" .ipynb).log" 2>&1
    rc=$?; echo "$nb exit $rc"; tail -3 "$out/$(basename "$nb" .ipynb).log"
    [[ $rc == 0 ]] || status=1
  done
fi
if [[ $what == sanitize ]]; then
  # small shapes only: CUTE_KERNELS_SMALL=1 lets GPU tests shrink themselves
  for tool in memcheck racecheck; do
    CUTE_KERNELS_SMALL=1 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 20 \
      python3 -m pytest -q -p no:cacheprovider -x "${tests[@]}" > "$out/sanitize-$tool.log" 2>&1
    rc=$?; echo "$tool exit $rc"; tail -5 "$out/sanitize-$tool.log"
    [[ $rc == 0 ]] || status=1
  done
fi
exit $status
