#!/usr/bin/env bash
# test.sh: sets up (scripts/setup.sh), then runs every test: the C tests
# (ctest), the layering checks (C and Lua), luacheck (scripts/lint.sh), the single-process busted specs, the leak check under valgrind
# (scripts/leakcheck.sh), ASan/UBSan (scripts/sanitize.sh), the multi-rank specs on 2 and 4 ranks, the CUDA
# backend on the emulated device (scripts/test_emu.sh), and the
# multi-node rehearsal in network namespaces (scripts/test_netns.sh). Ends
# with one "N passed, N failed" line; exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1

passed=0; failed=0
log=$(mktemp)

source scripts/count_busted.sh   # count_busted: the last busted summary in $log into passed/failed

# a suite that ends with a plain line: adds its last "<what>: N passed, N failed"
count_line() {
  local l
  l=$(grep -aoE "$1: [0-9]+ passed, [0-9]+ failed" "$log" | tail -1)
  if [ -z "$l" ]; then failed=$((failed + 1)); return; fi
  passed=$((passed + $(grep -oE '[0-9]+ passed' <<<"$l" | grep -oE '[0-9]+')))
  failed=$((failed + $(grep -oE '[0-9]+ failed' <<<"$l" | grep -oE '[0-9]+')))
}

suite() { # name, command...
  local name=$1; shift
  echo "== $name"
  "$@" >"$log" 2>&1
  local rc=$?
  tail -n 40 "$log" | grep -avE '^\s*$' | tail -n 25
  echo "   (exit $rc)"
  return $rc
}

# C tests
if suite "C tests (ctest)" ctest --test-dir build --output-on-failure --timeout 120; then :; fi
c_pass=$(grep -oE '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1)
if [ -n "$c_pass" ]; then
  total=$(grep -oE 'out of [0-9]+' <<<"$c_pass" | grep -oE '[0-9]+')
  cf=$(grep -oE '[0-9]+ tests failed' <<<"$c_pass" | grep -oE '[0-9]+')
  passed=$((passed + total - cf)); failed=$((failed + cf))
else
  failed=$((failed + 1))
fi

# layering: no #include in core/ or kernels/ points up a layer
suite "layers (scripts/check_layers.sh)" bash scripts/check_layers.sh
count_line layers

# the Lua package's layers: no require points up a layer (docs/architecture.md)
suite "lua layers (scripts/check_lua_layers.lua)" luajit scripts/check_lua_layers.lua
count_line "lua layers"

# luacheck over every Lua file (.luacheckrc)
suite "lint (scripts/lint.sh)" bash scripts/lint.sh
count_line lint

# the CUDA kernels' registers, spills, shared memory and launch bounds for
# sm_80/sm_90 (skips, saying why, where nvcc is absent)
suite "CUDA resources (scripts/check_cuda_resources.sh)" timeout 1200 bash scripts/check_cuda_resources.sh --quiet
count_line "cuda resources"

export OMP_WAIT_POLICY=PASSIVE
single=$(ls spec/*_spec.lua 2>/dev/null)
suite "specs, 1 process" timeout 1200 luajit scripts/run_specs.lua -o plainTerminal $single
count_busted

# leaks and memory errors under valgrind: test_core, a Lua workload, errors_spec
suite "leak check (valgrind)" bash scripts/leakcheck.sh
count_line leakcheck

# ASan and UBSan: build-asan/, test_core and a set of single-process specs
suite "sanitizers (scripts/sanitize.sh)" timeout 900 bash scripts/sanitize.sh
count_line sanitize

if [ -d spec/dist ] && [ -x scripts/loomrun ]; then
  for n in 2 4; do
    suite "specs, $n ranks" timeout 1200 scripts/loomrun -n "$n" --quiet-others \
      scripts/run_specs.lua -o plainTerminal spec/dist
    rc=$?
    count_busted
    [ $rc -ne 0 ] && ! grep -qE '[1-9][0-9]* (failure|error)' <(grep -aE 'success' "$log" | tail -1) \
      && failed=$((failed + 1))
  done
fi

# the CUDA backend on the emulated device (build-emu/; skips, saying why, without CUDA headers)
suite "emulated CUDA device (scripts/test_emu.sh)" timeout 1500 bash scripts/test_emu.sh
grep -q "^emulated: skipped" "$log" || count_line emulated

# multi-node rehearsal in network namespaces (skips, saying why, without root)
suite "multi-node rehearsal (scripts/test_netns.sh)" timeout 600 bash scripts/test_netns.sh
count_line "netns rehearsal"

rm -f "$log"
echo "loom tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
