#!/usr/bin/env bash
# test_emu.sh: the CUDA backend on the emulated device (docs/devices.md, "The
# emulated device"): builds build-emu/ with -DLOOM_CUDA=EMULATE (every
# kernels/cuda/*.cu on the CPU, against an emulated, asynchronous CUDA
# runtime, cuBLAS(Lt) and NCCL), then runs the kernels' C tests (the fused
# kernels against f64 references, kernels with planted defects, the tile
# fragments) and the CUDA specs through LOOM_LIBRARY=build-emu/libloom.so: 1
# process with 2 emulated GPUs; the kernel specs again under two more
# schedule seeds (LOOM_EMU_SEED=2 with loose warps, LOOM_EMU_SEED=3); the
# fallbacks of a GPU with 99 KiB of shared memory (LOOM_EMU_ARCH=sm_86); the
# grouped GEMM's per-group fallback (LOOM_EMU_NO_GROUPED_GEMM=1);
# tensor parallelism on 2 ranks owning one emulated GPU each. Cases that
# fail on a known defect of the CUDA code are left out, each with its reason
# printed. Ends with "emulated: N passed, N failed"; skips, saying why, only
# when the CUDA headers are absent. Emulated is never measured speed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
inc=${LOOM_CUDA_INCLUDE:-/usr/local/cuda/include}
for h in cuda_runtime.h cublasLt.h nccl.h; do
  if [ ! -f "$inc/$h" ]; then
    echo "emulated: skipped: no CUDA headers ($inc/$h is absent; set LOOM_CUDA_INCLUDE to a CUDA toolkit's include/)"
    exit 0
  fi
done

start=$(date +%s)
cmake -S . -B build-emu -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=EMULATE -DLOOM_CUDA_INCLUDE="$inc" >/dev/null || {
  echo "emulated: 0 passed, 1 failed (cmake -DLOOM_CUDA=EMULATE failed)"; exit 1; }
if ! out=$(cmake --build build-emu -j"$(nproc)" 2>&1); then
  grep -E "error:|Error [0-9]" <<<"$out" | head -20
  echo "emulated: 0 passed, 1 failed (the emulated build failed)"; exit 1
fi
echo "build-emu/: built in $(( $(date +%s) - start )) s"

export LOOM_LIBRARY=$root/build-emu/libloom.so LOOM_EMU_DEVICES=2 OMP_WAIT_POLICY=PASSIVE
passed=0; failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

source scripts/count_busted.sh   # count_busted: the last busted summary in $log into passed/failed
show_busted() { count_busted && [ -n "$busted_line" ] && echo "   $busted_line"; }
run() { # what, command...
  local what=$1; shift
  local t0; t0=$(date +%s)
  echo "== $what"
  "$@" >"$log" 2>&1
  grep -aE '^(Failure|Error) ->' -A2 "$log" | head -30
  grep -aE '^\s*(cuda_train_spec|cuda_emu_spec):' "$log"
  echo "   ($(( $(date +%s) - t0 )) s)"
}

# Known defects of the CUDA code the emulated device found (kept out until
# fixed; each printed): a busted --filter-out pattern, and why. None now:
# the five gpuemu found are fixed and run (issue 22).
skips=(
)
filters=()
for ((i = 0; i < ${#skips[@]}; i += 2)); do
  echo "left out: \"${skips[i]}\": ${skips[i + 1]}"
  filters+=("--filter-out=${skips[i]}")
done

# the schedules the kernels run under: LOOM_EMU_SEED, and loose warps (a
# shuffle, mma or ldmatrix orders no memory) with the second
seeds=("LOOM_EMU_SEED=1" "LOOM_EMU_SEED=2 LOOM_EMU_LOOSE_WARPS=1" "LOOM_EMU_SEED=3")
for s in "${seeds[@]}"; do
  run "kernels against f64 references, kernels with planted defects, tile fragments ($s)" \
    env $s bash -c './build-emu/kernels/emu/test_cuda_emu; ./build-emu/kernels/emu/test_emu_defects; ./build-emu/kernels/emu/test_emu_fragments'
  for t in test_cuda_emu test_emu_defects test_fragments; do
    l=$(grep -aoE "$t: [0-9]+ passed, [0-9]+ failed" "$log" | tail -1)
    [ -n "$l" ] || { failed=$((failed + 1)); echo "   $t: no result"; tail -5 "$log"; continue; }
    echo "   $l"
    passed=$((passed + $(grep -oE '[0-9]+ passed' <<<"$l" | grep -oE '[0-9]+')))
    failed=$((failed + $(grep -oE '[0-9]+ failed' <<<"$l" | grep -oE '[0-9]+')))
  done
done

run "CUDA specs, 1 process, 2 emulated GPUs (${seeds[0]})" timeout 1200 luajit scripts/run_specs.lua -o plainTerminal "${filters[@]}" \
  spec/cuda_spec.lua spec/cuda_parity_spec.lua spec/cuda_fused_spec.lua spec/module_to_spec.lua \
  spec/devices_spec.lua spec/device_check_spec.lua spec/cuda_emu_spec.lua spec/cuda_emu_defects_spec.lua \
  spec/cuda_train_spec.lua spec/gpu_first_run_spec.lua spec/cuda_grouped_mm_spec.lua spec/amp_kept_copy_spec.lua
show_busted

run "the MoE grouped GEMM as one GEMM per group: a cuBLAS before 12.5 (LOOM_EMU_NO_GROUPED_GEMM=1)" \
  env LOOM_EMU_NO_GROUPED_GEMM=1 timeout 600 luajit scripts/run_specs.lua -o plainTerminal "${filters[@]}" \
  spec/cuda_grouped_mm_spec.lua
show_busted

for s in "${seeds[@]:1}"; do
  run "kernel specs, schedule $s" env $s timeout 900 luajit scripts/run_specs.lua -o plainTerminal "${filters[@]}" \
    spec/cuda_parity_spec.lua spec/cuda_fused_spec.lua
  show_busted
done

run "a GPU with 99 KiB of shared memory per block (LOOM_EMU_ARCH=sm_86): the attention fallbacks" \
  env LOOM_EMU_ARCH=sm_86 timeout 600 luajit scripts/run_specs.lua -o plainTerminal "${filters[@]}" \
  spec/cuda_smem_spec.lua
show_busted
run "the same device: the fused spec's f32 attention of head dim 128 (composed there)" \
  env LOOM_EMU_ARCH=sm_86 timeout 600 luajit scripts/run_specs.lua -o plainTerminal "${filters[@]}" \
  --filter="attention f32, head dim 128" spec/cuda_fused_spec.lua
show_busted

run "tensor parallelism, 2 ranks, an emulated GPU each" timeout 600 scripts/loomrun -n 2 --quiet-others \
  scripts/run_specs.lua -o plainTerminal "${filters[@]}" spec/dist/cuda_tp_spec.lua
show_busted

echo "test_emu.sh: $(( $(date +%s) - start )) s in all (emulated: never a measure of speed)"
echo "emulated: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
