#!/usr/bin/env bash
# check_layers.sh: fails when the core's layers point up or in a circle.
# The layers, bottom to top: the base headers (loom.h, op_list.h, backend.h,
# unary.h, philox.h: what backends see); tensor/; comm/ (transport) and text/ (BPE); ops/; autograd/;
# dtensor/; entry/ (lm_op_call). The backends (kernels/cpu/, kernels/cuda/)
# see only the base headers, kernels/unary_math.h (the unary math they
# share) and kernels/grouped_gemm.h (the grouped GEMM as a loop of their
# gemm); kernels/emu/ runs kernels/cuda/ on the CPU.
# Two checks:
#  1. every #include points to the file's own layer or one below;
#  2. in the built objects (build/, or $1), a function a file calls is
#     defined in its own layer or one below, and no two files call each
#     other (reading a table is not a call: only function symbols count).
# Prints one line per violation and ends with "layers: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
objdir=${1:-build}

rank() { # the layer of a path relative to the root; "" for the base headers
  case $1 in
    core/tensor/*) echo 1 ;; core/comm/*) echo 2 ;; core/text/*) echo 2 ;; core/ops/*) echo 3 ;;
    core/autograd/*) echo 4 ;; core/dtensor/*) echo 5 ;; core/entry/*) echo 6 ;;
    kernels/*) echo 0 ;; core/*.h) echo "" ;; *) echo "?" ;;
  esac
}
base() { [[ $1 == core/backend.h || $1 == core/loom.h || $1 == core/philox.h || $1 == core/op_list.h ||
            $1 == core/unary.h ]]; }

passed=0 failed=0
fail() { failed=$((failed + 1)); echo "layers: $*"; }

# 1. includes
for f in $(git ls-files 'core/*.[ch]' 'kernels/*.[ch]' 'kernels/*.cu' 'kernels/*.cuh' 'kernels/*.cpp' 2>/dev/null); do
  dir=$(dirname "$f")
  while IFS= read -r inc; do
    target=$(realpath -m --relative-to=. "$dir/$inc")
    case $f in
      kernels/emu/*) [[ $target == kernels/emu/* || $target == kernels/cuda/* ||
                        $target == kernels/unary_math.h ]] || base "$target" ;;
      kernels/*) [[ $(dirname "$target") == "$dir" || $target == kernels/unary_math.h ||
                    $target == kernels/grouped_gemm.h ]] || base "$target" ;;
      *) mine=$(rank "$f") theirs=$(rank "$target")
         if [ -z "$theirs" ]; then true                     # base headers: everyone may
         elif [ -z "$mine" ] || [ "$theirs" = 0 ] || [ "$theirs" = "?" ]; then false
         else [ "$theirs" -le "$mine" ]; fi ;;
    esac && passed=$((passed + 1)) || fail "$f includes \"$inc\", which points up or across a layer"
  done < <(grep -oE '^#include "[^"]+"' "$f" | sed -E 's/#include "(.*)"/\1/')
done

# 2. calls between the built objects (function symbols only)
objs=$(find "$objdir/CMakeFiles/loom.dir" -name '*.o' 2>/dev/null | sort)
if [ -z "$objs" ]; then
  fail "no objects under $objdir/CMakeFiles/loom.dir: build first (scripts/setup.sh)"
else
  edges=$(for o in $objs; do
            src=${o#"$objdir"/CMakeFiles/loom.dir/}; src=${src%.o}
            nm "$o" | awk -v s="$src" '$2 == "T" { print "D", $3, s } NF == 2 && $1 == "U" { print "U", $2, s }'
          done | awk '$1 == "D" { def[$2] = $3; next } { use[NR] = $3 " " $2 }
                      END { for (k in use) { split(use[k], p, " "); d = def[p[2]];
                                             if (d != "" && d != p[1]) print p[1], d, p[2] } }' | sort -u)
  while read -r from to sym; do
    [ -z "$from" ] && continue
    a=$(rank "$from") b=$(rank "$to")
    if [ "$b" != 0 ] && [ "$a" != 0 ] && [ "$b" -gt "$a" ]; then
      fail "$from calls $sym of $to, a layer above"
    elif [ "$a" = 0 ] && [ "$b" != 0 ] && [ "$b" -gt 1 ]; then
      fail "$from (a backend) calls $sym of $to, above the tensor layer"
    elif [ "$a" != 0 ] && [ "$b" = 0 ]; then
      fail "$from calls $sym of the backend $to (backends are reached through their table)"
    else passed=$((passed + 1)); fi
  done <<<"$edges"
  pairs=$(awk '{ print $1, $2 }' <<<"$edges" | sort -u)
  while read -r from to; do
    [ -n "$from" ] && [[ $from < $to ]] && grep -qx "$to $from" <<<"$pairs" &&
      fail "$from and $to call each other (a circle)"
  done <<<"$pairs"
fi

echo "layers: $passed passed, $failed failed"
[ $failed -eq 0 ]
