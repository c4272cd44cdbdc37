#!/usr/bin/env bash
# test_netns.sh: the multi-node rehearsal on one machine (scripts/netns-cluster).
# On 2 "nodes" joined by a virtual switch: ranks run on both nodes; the main
# job (examples/train.lua, small) gives the one-node losses bit for bit; a
# cable pulled mid-run ends the job within 30 s, naming the lost rank, and the
# job resumes from its last checkpoint on the same loss curve; hostfiles
# naming unreachable hosts fail fast, naming them. Skips (exit 0, saying why)
# where network namespaces cannot be made. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export LOOM_NETNS_PREFIX=lt$$ LOOM_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
cluster=scripts/netns-cluster
passed=0 failed=0
ok() { echo "  ok: $*"; passed=$((passed + 1)); }
bad() { echo "  FAILED: $*"; failed=$((failed + 1)); }
check() { if [ "$1" = 1 ]; then ok "$2"; else bad "$2"; fi; } # check COND(0/1) WHAT
finish() { echo "netns rehearsal: $passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM # (through the EXIT trap: the cluster comes down)

echo "== loomrun-explain reads mpirun's and ssh's words (no namespaces needed)"
# a job map as mpirun --display-map prints it, two ranks per node
printf ' Data for node: %s\tNum slots: 2\tMax slots: 0\tNum procs: 2\n \tProcess OMPI jobid: [9,1] App: 0 Process rank: %d Bound: N/A\n \tProcess OMPI jobid: [9,1] App: 0 Process rank: %d Bound: N/A\n' \
  a 0 1 b 2 3 >"$tmp/map"
explain() { printf '%s\n' "$1" >"$tmp/err"; : >"$tmp/out"; scripts/loomrun-explain "$tmp" hosts 2>&1; }
out=$(explain '  Remote daemon: [[9,0],2] on node b')
check "$(grep -q 'lost contact with node b (ranks 2, 3)' <<<"$out" && echo 1)" "a lost daemon: names its node and ranks ($out)"
out=$(explain 'ssh: connect to host c port 22: Connection timed out')
check "$(grep -q 'cannot start ranks on host c (from hosts)' <<<"$out" && echo 1)" "ssh could not connect: names the host"
out=$(explain 'ssh: Could not resolve hostname d: Name or service not known')
check "$(grep -q 'cannot start ranks on host d ' <<<"$out" && echo 1)" "ssh could not resolve: names the host"

why=$($cluster check 2>&1)
case $?:$why in
  0:*) ;;
  1:"netns-cluster: "*) # namespaces cannot be made here: say why, count nothing more
    echo "netns rehearsal: the rehearsal in namespaces is skipped: ${why#netns-cluster: }"
    finish ;;
  *) bad "netns-cluster check: $why"; finish ;;
esac

# Jobs run in a session of their own, in the background, so that an
# interrupt is handled at once and ends the whole job (its process group).
bg=""
start() { setsid "$@" & bg=$!; }
finished() { wait "$bg"; local rc=$?; bg=""; return $rc; }
job() { start "$@"; finished; }
cleanup() {
  [ -n "$bg" ] && kill -TERM -- "-$bg" 2>/dev/null
  $cluster down >/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
# the JSON lines that must agree: all but the speed
losses() { sed -E 's/, "tokens_per_s": [0-9]+//' "$1"; }

CFG=(--steps 200 --layers 2 --dim 64 --heads 4 --batch 8 --seq 32 --warmup 5 --eval-every 20
     --eval-iters 2 --sample 0 --quiet)

$cluster up 2 || { bad "netns-cluster up 2"; finish; }

echo "== ranks on two nodes"
cat >"$tmp/where.lua" <<'EOF'
local dist, loom = require "loom.distributed", require "loom"
local s = dist.all_reduce(loom.tensor({ dist.rank() + 1 }), "sum"):item()
print(string.format("rank %d of %d on %s sum %d", dist.rank(), dist.world_size(), io.popen("hostname"):read("*l"), s))
EOF
job timeout 60 $cluster run -n 2 "$tmp/where.lua" >"$tmp/where.out" 2>&1; rc=$?
out=$(cat "$tmp/where.out")
echo "$out" | sed 's/^/    /'
check "$([ $rc -eq 0 ] && grep -q 'rank 0 of 2 on node0 sum 3' <<<"$out" && grep -q 'rank 1 of 2 on node1 sum 3' <<<"$out" && echo 1)" \
  "rank 0 runs on node0, rank 1 on node1, and an all_reduce between them adds up"

echo "== the main job: one node vs two nodes"
job timeout 300 scripts/loomrun -n 2 --quiet-others examples/train.lua "${CFG[@]}" --log "$tmp/one.jsonl" >"$tmp/one.out" 2>&1
check "$([ $? -eq 0 ] && echo 1)" "one node: loomrun -n 2 examples/train.lua ends with 0"
job timeout 300 $cluster run -n 2 --quiet-others examples/train.lua "${CFG[@]}" --log "$tmp/multi.jsonl" >"$tmp/multi.out" 2>&1
check "$([ $? -eq 0 ] && echo 1)" "two nodes: netns-cluster run -n 2 examples/train.lua ends with 0"
one=$(grep -aoE 'final loss [0-9.]+, val loss [0-9.]+' "$tmp/one.out")
multi=$(grep -aoE 'final loss [0-9.]+, val loss [0-9.]+' "$tmp/multi.out")
echo "    one node:  $one"
echo "    two nodes: $multi"
check "$([ -n "$one" ] && [ "$one" = "$multi" ] && echo 1)" "the final losses agree"
check "$([ "$(wc -l <"$tmp/one.jsonl")" -eq 201 ] && cmp -s <(losses "$tmp/one.jsonl") <(losses "$tmp/multi.jsonl") && echo 1)" \
  "the --log JSON lines (losses of all 200 steps, val losses) agree bit for bit"

echo "== a cable pulled mid-run"
start timeout 300 $cluster run -n 2 --quiet-others examples/train.lua "${CFG[@]}" --log "$tmp/drill.jsonl" \
  --save "$tmp/ckpt" >"$tmp/drill.out" 2>&1
for _ in $(seq 1200); do # up to 120 s for the checkpoint of step 40
  grep -q '"step": 40,' "$tmp/drill.jsonl" 2>/dev/null && break
  kill -0 $bg 2>/dev/null || break
  sleep 0.1
done
if grep -q '"step": 40,' "$tmp/drill.jsonl" 2>/dev/null && kill -0 $bg 2>/dev/null; then
  $cluster link node1 down
  t0=$(now)
  for _ in $(seq 600); do kill -0 $bg 2>/dev/null || break; sleep 0.1; done # up to 60 s
  t1=$(now)
  if kill -0 $bg 2>/dev/null; then bad "the job still runs 60 s after node1's cable was pulled"; kill -TERM -- "-$bg"
  else
    finished; rc=$?
    echo "    the job ended $(secs "$t0" "$t1") s after the cable was pulled, exit $rc"
    msg=$(grep -a '^loomrun: lost contact' "$tmp/drill.out")
    echo "    $msg"
    check "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print (b - a <= 30) }')" "the job ends within 30 s"
    check "$([ $rc -ne 0 ] && echo 1)" "and exits non-zero"
    check "$(grep -q 'node node1 (rank 1)' <<<"$msg" && echo 1)" "with a message naming node1 and rank 1"
  fi
  bg=""
  left=""
  for _ in $(seq 150); do left=$(ip netns pids "$LOOM_NETNS_PREFIX-n1"); [ -z "$left" ] && break; sleep 0.1; done
  check "$([ -z "$left" ] && echo 1)" "nothing is left running on node1 (its daemon gave up too)"
  $cluster link node1 up
  job timeout 300 $cluster run -n 2 --quiet-others examples/train.lua "${CFG[@]}" --log "$tmp/drill.jsonl" \
    --resume "$tmp/ckpt" >"$tmp/resume.out" 2>&1
  rc=$?
  grep -a 'resumed\|final loss' "$tmp/resume.out" | sed 's/^/    /'
  check "$([ $rc -eq 0 ] && grep -q 'resumed from .* at step 40' "$tmp/resume.out" && echo 1)" \
    "after the cable is back, the job resumes from the checkpoint of step 40 and ends with 0"
  # every step the drill logged (before the cut, and again after resuming)
  # has the uninterrupted run's losses
  ref=$(losses "$tmp/multi.jsonl")
  bad_lines=$(losses "$tmp/drill.jsonl" | while IFS= read -r l; do grep -qxF "$l" <<<"$ref" || echo "$l"; done)
  check "$([ -z "$bad_lines" ] && grep -q '"step": 200,' "$tmp/drill.jsonl" && echo 1)" \
    "the interrupted and resumed run has the uninterrupted run's losses at every step"
else
  bad "the drill's job did not reach step 40 while running ($(tail -c 300 "$tmp/drill.out"))"
fi

echo "== hostfiles naming unreachable hosts"
$cluster link node1 down
t0=$(now)
job timeout 60 $cluster run -n 2 "$tmp/where.lua" >"$tmp/cut.out" 2>&1; rc=$?
out=$(cat "$tmp/cut.out")
t1=$(now)
$cluster link node1 up
msg=$(grep -a '^loomrun:' <<<"$out")
echo "    node1's cable out: exit $rc after $(secs "$t0" "$t1") s: $msg"
check "$([ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'node node1 .*cannot reach mpirun on node0' <<<"$msg" && echo 1)" \
  "a node whose cable is out: the job does not start, and the error names it, without hanging"
printf 'node0 slots=1\nnode7 slots=1\n' >"$tmp/hosts"
t0=$(now)
job timeout 60 $cluster run -n 2 --hostfile "$tmp/hosts" "$tmp/where.lua" >"$tmp/node7.out" 2>&1; rc=$?
out=$(cat "$tmp/node7.out")
t1=$(now)
msg=$(grep -a '^loomrun:' <<<"$out")
echo "    node7: exit $rc after $(secs "$t0" "$t1") s: $msg"
check "$([ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'cannot start ranks on host node7' <<<"$msg" && echo 1)" \
  "a host that does not exist: the error names it, without hanging"
out=$(scripts/loomrun -n 2 --hostfile "$tmp/no-such-hostfile" "$tmp/where.lua" 2>&1); rc=$?
check "$([ $rc -eq 2 ] && grep -q "cannot read hostfile '$tmp/no-such-hostfile'" <<<"$out" && echo 1)" \
  "a hostfile that cannot be read: loomrun names it and exits 2"

finish
