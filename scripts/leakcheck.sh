#!/usr/bin/env bash
# leakcheck.sh: runs the C core test (test_core), a Lua workload
# (scripts/leak_workload.lua: tensors, ops, backward, errors, GC) and the
# misuse spec (spec/errors_spec.lua) under valgrind's memcheck, and fails on
# any memcheck error, definite leaks included. Known noise from other
# libraries is in scripts/valgrind.supp.
# valgrind 3.19 cannot decode AVX-512, so this uses its own build of libloom
# without -march=native (and without CUDA) in build/leakcheck/.
# Usage: bash scripts/leakcheck.sh   (after scripts/setup.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "leakcheck: valgrind is not installed (scripts/setup.sh)"; exit 1; }

dir=build/leakcheck
cmake -S . -B "$dir" -DLOOM_NATIVE=OFF -DLOOM_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
cmake --build "$dir" -j"$(nproc)" --target loom test_core 2>&1 | grep -E "warning|error|Error"
test -f "$dir/libloom.so" || { echo "leakcheck: the build failed"; exit 1; }

export OMP_WAIT_POLICY=PASSIVE LOOM_LIBRARY="$dir/libloom.so"
vg=(valgrind -q --keep-debuginfo=yes --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite
    --suppressions=scripts/valgrind.supp --num-callers=40 --error-exitcode=99)

passed=0; failed=0
check() { # name, command...
  local name=$1; shift
  local log rc
  log=$(mktemp)
  "${vg[@]}" "$@" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1)); echo "ok      $name"
  else
    failed=$((failed + 1)); echo "FAILED  $name (exit $rc)"
    grep -E '^==[0-9]+==' "$log" | head -n 80
    grep -vE '^==[0-9]+==' "$log" | tail -n 20
  fi
  rm -f "$log"
}

check "test_core" "$dir/test_core"
check "scripts/leak_workload.lua" luajit scripts/leak_workload.lua 2
check "spec/errors_spec.lua" luajit scripts/run_specs.lua -o plainTerminal spec/errors_spec.lua

echo "leakcheck: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
