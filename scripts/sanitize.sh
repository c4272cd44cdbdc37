#!/usr/bin/env bash
# sanitize.sh: AddressSanitizer and UndefinedBehaviorSanitizer over libloom.
# Builds build-asan/ (cmake -DLOOM_SANITIZE=ON, plus float-cast-overflow,
# which -fsanitize=undefined leaves out in GCC), then runs test_core and a
# representative set of single-process specs against it. LuaJIT itself is
# not instrumented, so the ASan runtime is preloaded (LD_PRELOAD) and lib.lua
# loads the sanitized library (LOOM_LIBRARY). Leaks are valgrind's job
# (scripts/leakcheck.sh): detect_leaks=0. An ASan report ends its process
# (the spec file then fails); every UBSan report ("runtime error:") counts
# as a failure. Ends with "sanitize: N passed, N failed".
# Usage: bash scripts/sanitize.sh [spec files...]   (default: the set below)
set -uo pipefail
cd "$(dirname "$0")/.."

specs=("$@")
if [ ${#specs[@]} -eq 0 ]; then
  specs=(spec/core_smoke_spec.lua spec/tensor_spec.lua spec/autograd_spec.lua spec/inplace_spec.lua
         spec/pointwise_spec.lua spec/reduce_spec.lua spec/matmul_spec.lua spec/cpu_kernels_spec.lua
         spec/nn_ops_norm_spec.lua spec/nn_ops_loss_spec.lua spec/nn_ops_attention_spec.lua spec/bf16_attention_spec.lua
         spec/nn_spec.lua
         spec/optim_spec.lua spec/hooks_spec.lua spec/transformer_spec.lua spec/op_table_spec.lua
         spec/errors_spec.lua spec/serialize_spec.lua spec/safetensors_spec.lua spec/checkpoint_format_spec.lua
         spec/data_spec.lua spec/misuse_tensor_spec.lua spec/misuse_ops_spec.lua spec/misuse_nn_optim_spec.lua
         spec/fuzz_load_spec.lua spec/hostile_files_spec.lua
         spec/cpu_alloc_spec.lua spec/scalar_ops_spec.lua spec/amp_mixed_spec.lua spec/amp_kept_copy_spec.lua
         spec/low_binary_spec.lua)
fi

echo "sanitize: building build-asan (-DLOOM_SANITIZE=ON)"
cmake -S . -B build-asan -DLOOM_SANITIZE=ON -DLOOM_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_FLAGS="-fsanitize=float-cast-overflow" >/dev/null || { echo "sanitize: 0 passed, 1 failed"; exit 1; }
if ! cmake --build build-asan -j"$(nproc)" >build-asan/build.log 2>&1 || [ ! -f build-asan/libloom.so ]; then
  grep -E "error" build-asan/build.log | head -20
  echo "sanitize: 0 passed, 1 failed"
  exit 1
fi

libasan=$(gcc -print-file-name=libasan.so)
export LD_PRELOAD="$libasan" LOOM_LIBRARY="$PWD/build-asan/libloom.so"
# report and go on for UBSan; suppressions name known findings outside this
# script's reach (each with the file and line to fix, in the file)
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:suppressions=$PWD/scripts/ubsan.supp"
export OMP_WAIT_POLICY=PASSIVE

passed=0; failed=0
log=$(mktemp)

ub_reports() { grep -ac "runtime error:" "$1"; }

# test_core: the C tests, "N passed, N failed"
build-asan/test_core >"$log" 2>&1
rc=$?
line=$(grep -aoE '[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
ub=$(ub_reports "$log")
if [ -n "$line" ]; then
  p=$(grep -oE '^[0-9]+' <<<"$line"); f=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+')
  passed=$((passed + p)); failed=$((failed + f))
  [ $rc -ne 0 ] && [ "$f" -eq 0 ] && failed=$((failed + 1))   # it died after its summary
else
  failed=$((failed + 1))
fi
failed=$((failed + ub))
printf "  %-36s %s%s\n" test_core "${line:-no result (exit $rc)}" "$([ "$ub" -gt 0 ] && echo ", $ub UBSan reports")"
if [ $rc -ne 0 ] || [ "$ub" -gt 0 ]; then grep -aE -A12 "runtime error:|ERROR: AddressSanitizer" "$log" | head -40; fi

# each spec file in its own process: an ASan report ends only that one
for s in "${specs[@]}"; do
  start=$(date +%s)
  timeout 600 luajit scripts/run_specs.lua -o plainTerminal "$s" >"$log" 2>&1
  rc=$?
  sum=$(grep -aE '[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors?' "$log" | tail -1)
  ub=$(ub_reports "$log")
  asan=$(grep -ac "ERROR: AddressSanitizer" "$log")
  if [ -z "$sum" ]; then
    failed=$((failed + 1)); note="no busted summary (exit $rc)"
  else
    sp=$(grep -oE '[0-9]+ success' <<<"$sum" | grep -oE '[0-9]+')
    sf=$(grep -oE '[0-9]+ failure' <<<"$sum" | grep -oE '[0-9]+')
    se=$(grep -oE '[0-9]+ error' <<<"$sum" | grep -oE '[0-9]+')
    passed=$((passed + sp)); failed=$((failed + sf + se))
    note="$sp passed, $((sf + se)) failed"
  fi
  failed=$((failed + ub + asan))
  printf "  %-36s %s%s (%ds)\n" "$(basename "$s")" "$note" \
    "$([ $((ub + asan)) -gt 0 ] && echo ", $ub UBSan and $asan ASan reports")" $(( $(date +%s) - start ))
  if [ $((ub + asan)) -gt 0 ] || [ -z "$sum" ]; then
    grep -aE -B2 -A14 "runtime error:|ERROR: AddressSanitizer" "$log" | head -60
  fi
done
rm -f "$log"
echo "sanitize: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
