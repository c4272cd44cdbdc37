#!/usr/bin/env bash
# lint.sh: luacheck (Debian's lua-check) over every Lua file of the checkout
# with the settings of .luacheckrc: unused and shadowed variables, globals
# set or read by mistake, unreachable code. A deliberate exception is
# written on its line (-- luacheck: ignore CODE (why)). Prints each warning
# and "lint: N passed, N failed" (files).
# Usage: bash scripts/lint.sh   (after scripts/setup.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v luacheck >/dev/null; then
  echo "lint: luacheck is not installed (scripts/setup.sh installs lua-check)"
  echo "lint: 0 passed, 1 failed"
  exit 1
fi
files=$(git ls-files '*.lua' 2>/dev/null || find . -name '*.lua' -not -path './build*')
out=$(luacheck -q --no-color --codes --formatter plain $files)
rc=$?
[ -n "$out" ] && echo "$out"
total=$(wc -w <<<"$files")
bad=$( [ -n "$out" ] && cut -d: -f1 <<<"$out" | sort -u | wc -l || echo 0)
echo "lint: $((total - bad)) passed, $bad failed"
[ "$rc" -eq 0 ]
