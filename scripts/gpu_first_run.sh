#!/usr/bin/env bash
# gpu_first_run.sh: the checks to run, in order, the first time loom meets a
# GPU (nothing in loom has been measured on hardware since the last H100
# session; see docs/devices.md). Each step runs to the end even when an
# earlier one failed (except the build), its output goes into one report
# file, and a summary is printed. The CUDA specs run with LOOM_EXPECT_GPU=1,
# so a backend that cannot load fails them instead of skipping.
# Usage: scripts/gpu_first_run.sh [--dry-run] [--report FILE] [--build DIR]
#   --dry-run  list the steps and exit 0 (what runs on a machine without a GPU)
# Exit: 0 when every step passed (or was skipped, saying why), 1 when one
# failed, 2 when there is no GPU here.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dry=0
report="gpu_first_run-$(date -u +%Y%m%dT%H%M%SZ).md"
build=build-gpu
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --report) report=$2; shift ;;
    --build) build=$2; shift ;;
    -h|--help) sed -n 2,13p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_first_run: unknown argument $1 (see --help)"; exit 2 ;;
  esac
  shift
done

lib="$root/$build/libloom.so"
specs="luajit scripts/run_specs.lua -o plainTerminal"
fused="spec/cuda_fused_spec.lua"
# name | command: the steps, in the order a person should look at them
steps=(
  "build with -DLOOM_CUDA=ON|cmake -S . -B $build -DLOOM_CUDA=ON -DCMAKE_BUILD_TYPE=Release && cmake --build $build -j\"\$(nproc)\""
  "linked libraries (ldd: cudart, cublas, cublasLt, nccl, nothing missing)|ldd $lib | tee /dev/stderr | grep -q 'not found' && exit 1; for l in cudart cublas cublasLt nccl; do ldd $lib | grep -q \"lib\$l\" || { echo \"lib\$l is not linked\"; exit 1; }; done"
  "loom.show_config() sees cuda:0|luajit -e 'local s = require(\"loom\").show_config(); assert(s:find(\"cuda:0\"), \"show_config lists no cuda:0\")'"
  "static resources of the kernels (scripts/check_cuda_resources.sh)|bash scripts/check_cuda_resources.sh --quiet"
  "emulated CUDA device (scripts/test_emu.sh)|if [ -x scripts/test_emu.sh ] || [ -f scripts/test_emu.sh ]; then bash scripts/test_emu.sh; else echo 'SKIP: scripts/test_emu.sh is not in this tree'; fi"
  "CUDA specs (fail, never skip, with LOOM_EXPECT_GPU=1)|$specs spec/cuda_spec.lua spec/cuda_skip_spec.lua spec/module_to_spec.lua spec/cuda_streams_spec.lua"
  "compute-sanitizer memcheck over spec/cuda_spec.lua|compute-sanitizer --tool memcheck --error-exitcode 99 $specs spec/cuda_spec.lua"
  "compute-sanitizer racecheck over the fused specs|compute-sanitizer --tool racecheck --error-exitcode 99 $specs $fused"
  "compute-sanitizer synccheck over the fused specs|compute-sanitizer --tool synccheck --error-exitcode 99 $specs $fused"
  "compute-sanitizer initcheck over the fused specs|compute-sanitizer --tool initcheck --error-exitcode 99 $specs $fused"
  "op parity, every op against the CPU (spec/cuda_parity_spec.lua)|$specs spec/cuda_parity_spec.lua"
  "fused kernels against the CPU (spec/cuda_fused_spec.lua)|$specs $fused"
  "20 steps of bf16 training, GPU against CPU (loss within 2e-2 each step)|d=\$(mktemp -d) && for dev in cpu cuda; do luajit examples/train.lua --device \$dev --dtype bf16 --steps 20 --eval-every 1000 --sample 0 --quiet --log \$d/\$dev.jsonl || exit 1; done && CPU_LOG=\$d/cpu.jsonl GPU_LOG=\$d/cuda.jsonl luajit -e 'package.path = \"spec/?.lua;\" .. package.path; local sys = require \"support.sys\"; local a, b = sys.losses(os.getenv(\"CPU_LOG\")), sys.losses(os.getenv(\"GPU_LOG\")); assert(#a == 20 and #b == 20, \"expected 20 logged steps\"); local worst = 0; for i = 1, 20 do worst = math.max(worst, math.abs(a[i] - b[i]) / a[i]) end; print((\"worst relative loss gap %.4f (cpu %.4f, cuda %.4f at step 20)\"):format(worst, a[20], b[20])); assert(worst < 2e-2)'"
  "tensor parallelism on 2 GPUs over NCCL (spec/dist/cuda_tp_spec.lua)|n=\$(nvidia-smi -L | wc -l); if [ \"\$n\" -lt 2 ]; then echo \"SKIP: \$n GPU(s), TP needs 2\"; else scripts/loomrun -n 2 --quiet-others scripts/run_specs.lua -o plainTerminal spec/dist/cuda_tp_spec.lua; fi"
  "benchmarks against PyTorch on this GPU (scripts/bench_gpu.lua --quick)|if [ -f scripts/bench_gpu.lua ]; then luajit scripts/bench_gpu.lua --quick; else echo 'SKIP: no scripts/bench_gpu.lua'; fi"
)

if [ "$dry" -eq 1 ]; then
  echo "gpu_first_run: --dry-run: the steps, in order (report: $report, build: $build):"
  i=0
  for s in "${steps[@]}"; do i=$((i + 1)); printf "  %2d. %s\n" "$i" "${s%%|*}"; done
  exit 0
fi

gpus=$(nvidia-smi -L 2>/dev/null || true)
[ -n "$gpus" ] || gpus=$(ls /proc/driver/nvidia/gpus 2>/dev/null || true)
if [ -z "$gpus" ]; then
  echo "gpu_first_run: no GPU here (nvidia-smi lists none, /proc/driver/nvidia/gpus is empty): nothing to run." \
       "scripts/gpu_first_run.sh --dry-run lists the steps."
  exit 2
fi

export LOOM_EXPECT_GPU=1 LOOM_LIBRARY="$lib"
{
  echo "# loom: first run on a GPU"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), host $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "- GPUs: $(echo "$gpus" | tr '\n' ';')"
  echo "- driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "- CPU: $(lscpu 2>/dev/null | grep 'Model name' | sed 's/.*: *//')"
  echo
} >"$report"

results=()
fails=0
i=0
for s in "${steps[@]}"; do
  i=$((i + 1))
  name=${s%%|*}
  cmd=${s#*|}
  echo "[$i/${#steps[@]}] $name"
  out=$(mktemp)
  t0=$(date +%s)
  bash -c "$cmd" >"$out" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ] && grep -q '^SKIP:' "$out"; then status=SKIP
  elif [ $rc -eq 0 ]; then status=PASS
  else status=FAIL; fails=$((fails + 1)); fi
  results+=("$(printf '%-4s %4ss  %2d. %s' "$status" "$secs" "$i" "$name")")
  {
    echo "## $i. $name: $status (exit $rc, ${secs}s)"
    echo
    echo '```'
    echo "\$ $cmd"
    tail -n 80 "$out"
    echo '```'
    echo
  } >>"$report"
  rm -f "$out"
  if [ $i -eq 1 ] && [ $rc -ne 0 ]; then
    echo "gpu_first_run: the build failed; the other steps need it (see $report)"
    break
  fi
done

{ echo "## Summary"; echo; printf '    %s\n' "${results[@]}"; } >>"$report"
echo
echo "gpu_first_run: summary ($report):"
printf '  %s\n' "${results[@]}"
echo "gpu_first_run: $fails step(s) failed"
[ $fails -eq 0 ]
