#!/usr/bin/env bash
# check_layers.sh: fails when an #include in core/ or kernels/ points up a
# layer. The layers, bottom to top: the base headers (loom.h, op_list.h,
# backend.h, philox.h: what backends see); tensor/; ops/; autograd/; dist/. Backends (core/cpu/,
# kernels/) see only the bottom headers. Prints one line per violation and
# ends with "layers: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

rank() { # the layer of a core path (relative to core/), or "" for the base headers
  case $1 in
    tensor/*) echo 1 ;; ops/*) echo 2 ;; autograd/*) echo 3 ;; dist/*) echo 4 ;;
    cpu/*) echo 0 ;; *) echo "" ;;
  esac
}

passed=0 failed=0
for f in $(git ls-files 'core/*.[ch]' 'kernels/*.cu' 'kernels/*.cuh' 2>/dev/null); do
  dir=$(dirname "$f")
  while IFS= read -r inc; do
    target=$(realpath -m --relative-to=core "$dir/$inc")
    case $f in
      kernels/*) # the CUDA backend: its own files and the base headers only
        [[ $target == ../kernels/* || $target == backend.h || $target == loom.h || $target == philox.h ||
           $target == op_list.h ]] && ok=1 || ok=0 ;;
      core/cpu/*) # the CPU backend likewise
        [[ $target == cpu/* || $target == backend.h || $target == loom.h || $target == philox.h ||
           $target == op_list.h ]] && ok=1 || ok=0 ;;
      *)
        mine=$(rank "${f#core/}") theirs=$(rank "$target")
        if [ -z "$theirs" ]; then ok=1            # base headers: everyone may
        elif [ "$theirs" = 0 ]; then ok=0          # no layer includes a backend's files
        elif [ -z "$mine" ]; then ok=0             # base headers include no layer
        else [ "$theirs" -le "$mine" ] && ok=1 || ok=0; fi ;;
    esac
    if [ $ok = 1 ]; then passed=$((passed + 1)); else
      failed=$((failed + 1)); echo "layers: $f includes \"$inc\", which points up or across a layer"
    fi
  done < <(grep -oE '^#include "[^"]+"' "$f" | sed -E 's/#include "(.*)"/\1/')
done
echo "layers: $passed passed, $failed failed"
[ $failed -eq 0 ]
