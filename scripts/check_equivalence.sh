#!/usr/bin/env bash
# check_equivalence.sh: trains the same small model for N steps (default 100)
# at TP=1, TP=2, TP=4, DP=2 x TP=2, FSDP=2 x TP=2 and the pipeline layouts
# (PP=2, PP=2 x TP=2, PP=2 x TP=2 + SP (+ async TP, + FSDP=2 on 8 ranks), DP=2 x PP=2 x TP=2 on 8 ranks, oversubscribed) and context-parallel ones
# (CP=2, CP=2 x TP=2, CP=2 x PP=2, CP=2 x DP=2, CP=2 x FSDP=2, CP=2 with FSDP
# over cp, CP=2 x FSDP=2 x TP=2 on 8 ranks, CP=2 x TP=2 + SP (+ async TP, ring)) and async TP with the same seed, and prints the
# largest relative difference of each layout's loss from TP=1's, over all
# steps; then a mixture of experts (--experts 4) at EP=2, EP=2 x TP=2 + SP,
# EP=2 x DP=2, EP=2 x FSDP=2, PP=2 x EP=2, CP=2 x EP=2, CP=2 x EP=2 with FSDP
# over ep x cp, its experts' hidden dim cut over tp (ETP: TP=2, EP=2 x TP=2 + SP,
# EP=2 x TP=2 x FSDP=2 on 8 ranks) against it in one process, likewise
# (EQ_ONLY=moe runs these alone).
# Tensor parallelism is right when these stay at float rounding
# (target <= 1e-5 in f32). Extra arguments go to examples/train.lua.
# Usage: scripts/check_equivalence.sh [steps] [train.lua flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-100}; shift || true
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
flags=(--steps "$steps" --dim 64 --layers 2 --heads 4 --seq 32 --batch 8 --eval-every 100000
       --sample 0 --quiet --lr 1e-3 --run-dir none "$@")   # no runs/ folder per row

run() { # name, ranks, flags...
  local name=$1 n=$2; shift 2
  if [ "$n" -eq 1 ]; then luajit examples/train.lua "${flags[@]}" "$@" --log "$dir/$name.json" >/dev/null
  else scripts/loomrun -n "$n" --quiet-others examples/train.lua "${flags[@]}" "$@" --log "$dir/$name.json" >/dev/null; fi
}

if [ "${EQ_ONLY:-}" != moe ]; then
run tp1 1
run tp2 2 --tp 2
run tp4 4 --tp 4
run dp2xtp2 4 --tp 2 --dp 2
run tp2_sp 2 --tp 2 --sequence-parallel
run fsdp2xtp2 4 --tp 2 --dp 2 --fsdp
run pp2 2 --pp 2
run pp2xtp2 4 --pp 2 --tp 2
run pp2xtp2_sp 4 --pp 2 --tp 2 --sequence-parallel
run pp2xtp2_sp_async 4 --pp 2 --tp 2 --sequence-parallel --async-tp
run fsdp2xpp2xtp2_sp 8 --pp 2 --dp 2 --tp 2 --fsdp --sequence-parallel --microbatches 4
run dp2xpp2xtp2 8 --pp 2 --dp 2 --tp 2
run fsdp2xpp2xtp2 8 --pp 2 --dp 2 --tp 2 --fsdp --microbatches 4
run cp2 2 --cp 2
run cp2xtp2 4 --cp 2 --tp 2
run cp2_ring 2 --cp 2 --cp-rotate alltoall
run cp2xpp2 4 --cp 2 --pp 2
run cp2xdp2 4 --cp 2 --dp 2
run cp2xfsdp2 4 --cp 2 --dp 2 --fsdp
run cp2_fsdp 2 --cp 2 --fsdp
run cp2xfsdp2xtp2 8 --cp 2 --dp 2 --tp 2 --fsdp
run cp2xtp2_sp 4 --cp 2 --tp 2 --sequence-parallel
run cp2xtp2_sp_async_ring 4 --cp 2 --tp 2 --sequence-parallel --async-tp --cp-rotate alltoall
run tp2_sp_async 2 --tp 2 --sequence-parallel --async-tp
fi

printf "%-22s %8s %22s %14s\n" layout steps "max rel. loss diff" "final loss"
# compare REF NAME...: each run's losses against REF's
compare() {
  local ref=$1; shift
  for name in "$@"; do
  LUA_PATH="spec/?.lua;;" luajit - "$dir/$ref.json" "$dir/$name.json" "$name" <<'LUA'
local losses = require("support.sys").losses
local ref, got = losses(arg[1]), losses(arg[2])
local worst, n, last = 0, 0, nil
for s, l in pairs(ref) do
  assert(got[s], "missing step " .. s .. " in " .. arg[2])
  worst = math.max(worst, math.abs(got[s] - l) / math.abs(l))
  n = math.max(n, s)
end
print(string.format("%-22s %8d %22.3e %14.6f", arg[3], n, worst, got[n]))
LUA
  done
}
if [ "${EQ_ONLY:-}" != moe ]; then
compare tp1 tp1 tp2 tp4 dp2xtp2 tp2_sp fsdp2xtp2 pp2 pp2xtp2 pp2xtp2_sp pp2xtp2_sp_async fsdp2xpp2xtp2_sp dp2xpp2xtp2 fsdp2xpp2xtp2 cp2 cp2xtp2 cp2_ring cp2xpp2 cp2xdp2 cp2xfsdp2 cp2_fsdp cp2xfsdp2xtp2 cp2xtp2_sp cp2xtp2_sp_async_ring tp2_sp_async
fi

# a mixture of experts (--experts 4 --top-k 2) with its experts sharded over
# ep ranks (expert parallelism), against the same model in one process
flags+=(--experts 4 --top-k 2)
run moe1 1
run ep2 2 --ep 2 --tp 1
run ep2xtp2_sp 4 --ep 2 --tp 2 --sequence-parallel
run ep2xdp2 4 --ep 2 --dp 2 --tp 1
run ep2xfsdp2 4 --ep 2 --dp 2 --tp 1 --fsdp
run pp2xep2 4 --ep 2 --pp 2 --tp 1
run cp2xep2 4 --ep 2 --cp 2 --tp 1
run cp2xep2_fsdp 4 --ep 2 --cp 2 --tp 1 --fsdp
run tp2_etp 2 --tp 2 --etp 2
run ep2xtp2_etp_sp 4 --ep 2 --tp 2 --etp 2 --sequence-parallel
run fsdp2xep2xtp2_etp 8 --ep 2 --dp 2 --tp 2 --etp 2 --fsdp
compare moe1 moe1 ep2 ep2xtp2_sp ep2xdp2 ep2xfsdp2 pp2xep2 cp2xep2 cp2xep2_fsdp tp2_etp ep2xtp2_etp_sp fsdp2xep2xtp2_etp
