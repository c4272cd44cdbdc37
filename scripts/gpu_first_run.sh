#!/usr/bin/env bash
# gpu_first_run.sh: the checks to run, fastest and most telling first, the
# first time loom meets a GPU, sized for a lease of about 15 minutes of
# device time (docs/devices.md). Nothing is built on the GPU machine: build
# here, then carry build/ and .gpu/ there:
#   cmake -S . -B build -DLOOM_CUDA=ON -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2
#   ../shared/tools/gpu-bundle          # .gpu/: LuaJIT, OpenBLAS, OpenMPI, busted
#   scripts/gpu_first_run.sh --check    # everything it needs is here, and what to carry
# and on the GPU machine, from the project root: scripts/gpu_first_run.sh
# (what travels: .gpu/, build/libloom.so, build/kernels/cuda/test_cuda_fragments
# and the checkout; the rest of build/ is objects the run does not need)
# Every step has a timeout (the whole fits in 10 minutes), runs even when an
# earlier one failed, and writes one line to the report file (then the tail
# of each failed step's output); a summary is printed. The CUDA specs run
# with LOOM_EXPECT_GPU=1, so a backend that cannot load fails, never skips.
# Usage: scripts/gpu_first_run.sh [--dry-run] [--check] [--report FILE] [--build DIR]
#   --dry-run  list the steps with their timeouts, then "total: N s"; exit 0
#   --check    check that what the run needs was built here; exit 0 or 1
# Exit: 0 when every step passed (or was skipped, saying why), 1 when one
# failed, 2 when there is no GPU here or the build is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mode=run
report="gpu_first_run-$(date -u +%Y%m%dT%H%M%SZ).txt"
build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) mode=dry ;;
    --check) mode=check ;;
    --report) report=$2; shift ;;
    --build) build=$2; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_first_run: unknown argument $1 (see --help)"; exit 2 ;;
  esac
  shift
done

lib="$root/$build/libloom.so"
frag="$root/$build/kernels/cuda/test_cuda_fragments"
specs="luajit scripts/run_specs.lua -o plainTerminal"
san="compute-sanitizer --error-exitcode 99 --print-limit 20"
# seconds | name | command: in the order a person should read them
steps=(
  "10|libraries (ldd: cudart, cublas, cublasLt, nccl; nothing missing)|ldd $lib | grep -q 'not found' && { ldd $lib; exit 1; }; for l in cudart cublas cublasLt nccl; do ldd $lib | grep -q \"lib\$l\" || { echo \"lib\$l is not linked\"; exit 1; }; done; nvidia-smi -L"
  "20|mma.sync and ldmatrix fragments of the tile products ($build/kernels/cuda/test_cuda_fragments)|$frag"
  "15|loom.show_config() sees cuda:0|luajit -e 'local s = require(\"loom\").show_config(); assert(s:find(\"cuda:0\"), \"show_config lists no cuda:0\")'"
  "55|CUDA specs (spec/cuda_spec.lua, cuda_skip, module_to, cuda_streams, device_check, amp_kept_copy)|$specs spec/cuda_spec.lua spec/cuda_skip_spec.lua spec/module_to_spec.lua spec/cuda_streams_spec.lua spec/device_check_spec.lua spec/amp_kept_copy_spec.lua"
  "45|op parity, every op against the CPU (spec/cuda_parity_spec.lua)|$specs spec/cuda_parity_spec.lua"
  "75|fused kernels against the CPU, f32, bf16, f16 (spec/cuda_fused_spec.lua)|$specs spec/cuda_fused_spec.lua"
  "60|train.lua, 20 bf16 steps on the GPU against the CPU (loss within 2e-2 each step)|d=\$(mktemp -d) && for dev in cpu cuda; do luajit examples/train.lua --device \$dev --dtype bf16 --steps 20 --eval-every 1000 --sample 0 --quiet --log \$d/\$dev.jsonl || exit 1; done && CPU_LOG=\$d/cpu.jsonl GPU_LOG=\$d/cuda.jsonl luajit -e 'package.path = \"spec/?.lua;\" .. package.path; local sys = require \"support.sys\"; local a, b = sys.losses(os.getenv(\"CPU_LOG\")), sys.losses(os.getenv(\"GPU_LOG\")); assert(#a == 20 and #b == 20, \"expected 20 logged steps\"); local worst = 0; for i = 1, 20 do worst = math.max(worst, math.abs(a[i] - b[i]) / a[i]) end; print((\"worst relative loss gap %.4f (cpu %.4f, cuda %.4f at step 20)\"):format(worst, a[20], b[20])); assert(worst < 2e-2)'"
  "20|NCCL in one process: collectives on a 1-rank mesh, no CUDA error left (scripts/gpu_smoke.lua --nccl)|luajit scripts/gpu_smoke.lua --nccl"
  "45|tensor parallelism on 2 GPUs over NCCL (spec/dist/cuda_tp_spec.lua)|n=\$(nvidia-smi -L | wc -l); if [ \"\$n\" -lt 2 ]; then echo \"SKIP: \$n GPU, TP needs 2\"; else scripts/loomrun -n 2 --quiet-others scripts/run_specs.lua -o plainTerminal spec/dist/cuda_tp_spec.lua; fi"
  "60|compute-sanitizer memcheck, every kernel on reduced shapes, one process per case, one host thread (scripts/gpu_smoke.lua --ops --case K)|n=\$(luajit scripts/gpu_smoke.lua --ops --case 0 | sed -n 's/.*: \\([0-9]*\\) selected/\\1/p'); [ -n \"\$n\" ] || exit 1; for k in \$(seq \$n); do LOOM_NUM_THREADS=1 $san --tool memcheck luajit scripts/gpu_smoke.lua --ops --case \$k || exit; done; echo \"memcheck: \$n cases, each in its own process, one host thread: clean\""
  "40|compute-sanitizer racecheck, one small attention case|$san --tool racecheck luajit scripts/gpu_smoke.lua --attention"
  "30|compute-sanitizer synccheck, one small attention case|$san --tool synccheck luajit scripts/gpu_smoke.lua --attention"
  "120|benchmarks: GEMM against cuBLAS (torch.matmul), attention against PyTorch SDPA, a train step against PyTorch eager|luajit scripts/bench_gpu.lua --quick --sizes 4096,8192 --seqs 1024 --models small"
)
total=0
for s in "${steps[@]}"; do total=$((total + ${s%%|*})); done

if [ "$mode" = dry ]; then
  echo "gpu_first_run: --dry-run: the steps, in order, each with its timeout (report: $report, build: $build):"
  i=0
  for s in "${steps[@]}"; do
    i=$((i + 1)); rest=${s#*|}
    printf "  %2d. %4s s  %s\n" "$i" "${s%%|*}" "${rest%%|*}"
  done
  echo "total: $total s"
  exit 0
fi

# what the run needs, built here beforehand
missing=()
[ -f "$lib" ] || missing+=("$build/libloom.so (cmake -S . -B $build -DLOOM_CUDA=ON && cmake --build $build)")
[ -f "$lib" ] && ! grep -qa cublasLtMatmul "$lib" && missing+=("a CUDA backend in $build/libloom.so (configure with -DLOOM_CUDA=ON)")
[ -x "$frag" ] || missing+=("$build/kernels/cuda/test_cuda_fragments (the same build)")
if [ "$mode" = check ]; then
  [ -f .gpu/env.sh ] || missing+=(".gpu/ (../shared/tools/gpu-bundle: the GPU machine has no LuaJIT, OpenBLAS, OpenMPI)")
  # gpu-bundle leaves out oneDNN, which a build made where libdnnl-dev is
  # installed links (the first H200 run found libdnnl.so.2 "not found")
  if ldd "$lib" 2>/dev/null | grep -q libdnnl && ! ls .gpu/debs/libdnnl2_*.deb >/dev/null 2>&1; then
    missing+=("oneDNN in .gpu/debs (libloom.so links it): (cd .gpu/debs && apt-get download libdnnl2 ocl-icd-libopencl1)")
  fi
  if [ ${#missing[@]} -gt 0 ]; then printf 'gpu_first_run: missing: %s\n' "${missing[@]}"; exit 1; fi
  carry=(".gpu" "$build/libloom.so" "$build/kernels/cuda/test_cuda_fragments")
  echo "gpu_first_run: ready; carry to the GPU machine, beside the checkout: ${carry[*]} ($(du -csh "${carry[@]}" | tail -1 | cut -f1))"
  exit 0
fi
# env.sh unpacks .gpu/debs only into a fresh /opt/loom-rt: a deb added since
# (oneDNN) is unpacked here, on a machine kept warm between runs
fresh=1
[ -d /opt/loom-rt ] && fresh=0
[ -f .gpu/env.sh ] && source .gpu/env.sh
if [ -d /opt/loom-rt ]; then
  for f in .gpu/debs/*.deb; do
    mark="/opt/loom-rt/.unpacked.${f##*/}"
    [ -e "$f" ] && [ ! -e "$mark" ] && { [ $fresh = 1 ] || dpkg -x "$f" /opt/loom-rt; } && touch "$mark"
  done
fi
# loom's own modules, for the steps that run luajit -e
export LUA_PATH="$root/lua/?.lua;$root/lua/?/init.lua;${LUA_PATH:-;;}"
if [ ${#missing[@]} -gt 0 ]; then
  printf 'gpu_first_run: missing: %s\n' "${missing[@]}"
  echo "gpu_first_run: build them before the lease (see --help); nothing is built here"
  exit 2
fi
gpus=$(nvidia-smi -L 2>/dev/null || true)
if [ -z "$gpus" ]; then
  echo "gpu_first_run: no GPU here (nvidia-smi lists none): nothing to run; --dry-run lists the steps."
  exit 2
fi

export LOOM_EXPECT_GPU=1 LOOM_LIBRARY="$lib"
{
  echo "loom: first run on a GPU: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), host $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "GPUs: $(echo "$gpus" | tr '\n' ';') driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "CPU: $(lscpu 2>/dev/null | grep 'Model name' | sed 's/.*: *//')"
} >"$report"

results=()
details=$(mktemp)
fails=0
i=0
start=$(date +%s)
for s in "${steps[@]}"; do
  i=$((i + 1))
  limit=${s%%|*}; rest=${s#*|}; name=${rest%%|*}; cmd=${rest#*|}
  echo "[$i/${#steps[@]}] $name (at most $limit s)"
  out=$(mktemp)
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" bash -c "$cmd" >"$out" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=TIMEOUT; fails=$((fails + 1))
  elif [ $rc -eq 0 ] && grep -q '^SKIP:' "$out"; then status=SKIP
  elif [ $rc -eq 0 ]; then status=PASS
  else status=FAIL; fails=$((fails + 1)); fi
  line=$(printf '%-7s %4ss of %4ss  %2d. %s' "$status" "$secs" "$limit" "$i" "$name")
  results+=("$line")
  echo "$line" >>"$report"
  echo "  $line"
  # every step's last lines (the figures of the benchmarks, the errors of a failure)
  { echo; echo "== $i. $name: $status (exit $rc)"; tail -n "$([ "$status" = PASS ] && echo 12 || echo 60)" "$out"; } >>"$details"
  rm -f "$out"
done
{ echo; echo "total: $(( $(date +%s) - start )) s of at most $total s"; cat "$details"; } >>"$report"
rm -f "$details"
echo
echo "gpu_first_run: summary ($report):"
printf '  %s\n' "${results[@]}"
echo "gpu_first_run: $fails step(s) failed"
[ $fails -eq 0 ]
