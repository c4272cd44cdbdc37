#!/usr/bin/env bash
# check_cuda_resources.sh: the static resource check of the CUDA kernels
# (kernels/cuda/*.cu) for sm_80 and sm_90, from ptxas -v and the PTX (the
# toolkit has no cuobjdump here; ptxas reports the same counts). Per kernel:
#   - __launch_bounds__ is stated (.maxntid in the PTX): every kernel has one,
#     so ptxas fits its registers to the block size it is launched with;
#   - registers x threads fit the 65536 registers of an SM;
#   - no spills in the forward attention kernels (other spills are listed);
#   - static shared memory within the 48 KiB a block gets without opting in
#     (the attention kernels' dynamic shared memory is static_assert'ed
#     against sm_80's opt-in limit in their sources; f32 tiles of head
#     dims above 128 against sm_90's, sm_80 refusing them at the launch).
# Prints a table; exits 1 on a violation, 0 when all fit, and 0 with a
# printed reason when there is no nvcc (the CUDA toolkit is not installed).
# Usage: scripts/check_cuda_resources.sh [--quiet] [file.cu...] (quiet:
# violations and the summary only; files: a subset of kernels/cuda/*.cu)
set -euo pipefail
cd "$(dirname "$0")/.."
quiet=0
[ "${1:-}" = "--quiet" ] && quiet=1 && shift
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(kernels/cuda/*.cu)

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$NVCC" ]; then
  echo "check_cuda_resources: skipped: no nvcc (the CUDA toolkit is not installed; set NVCC to its path)"
  echo "cuda resources: 0 passed, 0 failed"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# one device-only compile per (arch, file), kept PTX and ptxas's report
export NVCC work
for arch in 80 90; do for f in "${files[@]}"; do echo "$arch $f"; done; done |
  xargs -P "$(nproc)" -n 2 sh -c '
    d="$work/sm$0_$(basename "$1" .cu)"; mkdir -p "$d"
    "$NVCC" -std=c++17 -O3 -cubin -arch=sm_$0 -Xptxas -v -keep -keep-dir "$d" "$1" -o "$d/k.cubin" \
      >"$d/ptxas.log" 2>&1 || { cat "$d/ptxas.log"; echo "check_cuda_resources: $1 does not compile for sm_$0"; exit 255; }'

demangle() { if command -v c++filt >/dev/null; then c++filt; else cat; fi; }

# one line per (arch, kernel): arch threads regs smem spill_st spill_ld name
for d in "$work"/sm*; do
  arch=${d##*/sm}; arch=${arch%%_*}
  awk -v arch="$arch" '
    FNR == NR {                                   # the PTX: .entry then .maxntid
      if ($1 == ".entry" || ($1 == ".visible" && $2 == ".entry")) {
        name = ($1 == ".entry") ? $2 : $3; sub(/\(.*/, "", name); cur = name; nt[cur] = 0
      } else if ($1 == ".maxntid" && cur != "") {
        gsub(/,/, " "); nt[cur] = $2 * ($3 ? $3 : 1) * ($4 ? $4 : 1)
      }
      next
    }
    /Compiling entry function/ { k = $0; sub(/.*function .\047?/, "", k); sub(/\047 for.*/, "", k); entry = k; next }
    /Function properties for/ { fn = $NF; next }
    /spill stores/ && fn == entry { st = $5; ld = $9; next }
    /Used [0-9]+ registers/ && entry != "" {
      regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
      sm = 0; if (match($0, /[0-9]+ bytes smem/)) { sm = substr($0, RSTART, RLENGTH); sub(/ .*/, "", sm) }
      printf "%s %d %d %d %d %d %s\n", arch, nt[entry], regs, sm, st + 0, ld + 0, entry
      entry = ""; st = 0; ld = 0
    }' "$d"/*.ptx "$d/ptxas.log"
done | sort -u >"$work/rows"

[ -s "$work/rows" ] || { echo "check_cuda_resources: no kernels found in the ptxas reports"; exit 1; }
bad=0
printf "%-6s %-7s %-5s %-8s %-7s %-11s %-6s %s\n" arch threads regs regsxthr smem spill_st/ld status kernel
while read -r arch thr regs sm st ld name; do
  why=ok
  pretty=$(echo "$name" | demangle | cut -c1-90)
  if [ "$thr" -eq 0 ]; then why="no __launch_bounds__"
  elif [ $((regs * thr)) -gt 65536 ]; then why="registers x threads > 65536"
  elif [ "$sm" -gt 49152 ]; then why="static smem > 48 KiB"
  elif [ $((st + ld)) -gt 0 ] && [[ "$name" == *attn_fwd* ]]; then why="spills in forward attention"
  fi
  [ "$why" = ok ] || bad=$((bad + 1))
  if [ "$why" != ok ] || [ "$quiet" -eq 0 ]; then
    printf "%-6s %-7s %-5s %-8s %-7s %-11s %-6s %s\n" "sm_$arch" "$thr" "$regs" $((regs * thr)) "$sm" \
      "$st/$ld" "$why" "$pretty"
  fi
done <"$work/rows"
n=$(wc -l <"$work/rows")
spills=$(awk '$5 + $6 > 0' "$work/rows" | wc -l)
echo "check_cuda_resources: $n kernel builds (sm_80, sm_90), $bad violation(s), $spills with spills" \
     "(allowed outside forward attention; listed above)"
echo "cuda resources: $((n - bad)) passed, $bad failed"
[ "$bad" -eq 0 ]
