#!/usr/bin/env bash
# bench_curves.sh: loom's cost curves from one command. Runs
# scripts/bench_curves.lua for each point (model sizes 0.8M, 10M, 97M, 350M on one
# rank; the 10M model with TP and FSDP on 2 and 4 ranks, more ranks than
# cores oversubscribed), collects the JSON lines, prints markdown tables and
# draws docs/img/curves_size.png, curves_degree.png, curves_memory.png and
# curves_comm.png with gnuplot. Each point runs alone, in turn.
# Usage: bash scripts/bench_curves.sh [--quick | --plot-only]
#   --quick: no 97M and 350M points; --plot-only: tables and plots from the last run's
#   JSON lines ($LOOM_CURVES_OUT, default /tmp/loom_curves.jsonl)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${LOOM_CURVES_OUT:-/tmp/loom_curves.jsonl}
if [ "${1:-}" != "--plot-only" ]; then
  : >"$out"
  sizes=(0.8M 10M 97M 350M)
  [ "${1:-}" = "--quick" ] && sizes=(0.8M 10M)
  for s in "${sizes[@]}"; do
    steps=3; case $s in 97M|350M) steps=2 ;; esac
    luajit scripts/bench_curves.lua --size "$s" --steps $steps --out "$out" >/dev/null
  done
  for n in 2 4; do
    scripts/loomrun -n $n --quiet-others scripts/bench_curves.lua --size 10M --tp $n --out "$out" >/dev/null
    scripts/loomrun -n $n --quiet-others scripts/bench_curves.lua --size 10M --fsdp --out "$out" >/dev/null
  done
fi

# the JSON lines into gnuplot's data files and markdown tables
dat=$(mktemp -d)
luajit - "$out" "$dat" <<'LUA'
local json = require "dkjson"
local recs = {}
for line in io.lines(arg[1]) do recs[#recs + 1] = json.decode(line) end
local function w(name, lines) local f = assert(io.open(arg[2] .. "/" .. name, "w")) f:write(table.concat(lines, "\n"), "\n") f:close() end
local size, tp, fsdp, mem, comm = {}, {}, {}, {}, {}
print("CPU: " .. recs[1].cpu .. " (check `uptime`: figures are only as good as the machine is idle)\n")
print("| size | params | layout | ranks | step ms | tokens/s | PyTorch eager step ms | PyTorch tokens/s | live MiB/rank | peak MiB/rank | comm MB/step/rank measured | predicted |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for _, r in ipairs(recs) do
  local pt = r.torch_step_ms and string.format("%.1f | %.0f", r.torch_step_ms, r.torch_tokens_per_s) or "n/a | n/a"
  print(string.format("| %s | %.2fM | %s | %d | %.1f | %.0f | %s | %.0f | %.0f | %.2f | %.2f |", r.size, r.params / 1e6, r.layout,
                      r.ranks, r.step_ms, r.tokens_per_s, pt, r.live_bytes / 2^20, r.peak_bytes / 2^20, r.comm_bytes / 1e6,
                      r.predicted_comm_bytes / 1e6))
  if r.layout == "plain" then
    size[#size + 1] = string.format("%g %g %g %s", r.params, r.step_ms, r.tokens_per_s, r.torch_tokens_per_s or "NaN")
  end
  if r.size == "10M" then
    local line = string.format("%d %g %g", r.ranks, r.step_ms, r.tokens_per_s)
    if r.layout ~= "fsdp" then tp[#tp + 1] = line end
    if r.layout ~= "tp" then fsdp[#fsdp + 1] = line end
    local label = r.layout == "plain" and "1 rank" or string.format("%s %d", r.layout:upper(), r.ranks)
    mem[#mem + 1] = string.format("%d \"%s\" %g %g", #mem, label, r.live_bytes / 2^20, r.peak_bytes / 2^20)
    if r.layout ~= "plain" then
      comm[#comm + 1] = string.format("%d \"%s\" %g %g", #comm, label, r.comm_bytes / 1e6, r.predicted_comm_bytes / 1e6)
    end
  end
end
table.sort(tp) table.sort(fsdp)
w("size.dat", size) w("tp.dat", tp) w("fsdp.dat", fsdp) w("mem.dat", mem) w("comm.dat", comm)
LUA
mkdir -p docs/img
gnuplot <<GP
set terminal pngcairo size 720,440 font "sans,10"
set grid
set key top left
set output "docs/img/curves_size.png"
set title "Step time and tokens/s against model size (1 rank, f32)"
set logscale x
set xlabel "parameters"
set ylabel "step ms"; set y2label "tokens/s"; set y2tics; set logscale y; set logscale y2
plot "$dat/size.dat" using 1:2 with linespoints title "loom step ms", "" using 1:3 axes x1y2 with linespoints title "loom tokens/s", \
     "" using 1:4 axes x1y2 with linespoints title "PyTorch eager tokens/s"
unset logscale; unset y2tics; unset y2label
set output "docs/img/curves_degree.png"
set title "10M model: step time against degree (ranks beyond 2 share 2 cores)"
set xlabel "ranks"; set ylabel "step ms"; set xtics 1
plot "$dat/tp.dat" using 1:2 with linespoints title "TP", "$dat/fsdp.dat" using 1:2 with linespoints title "FSDP"
set output "docs/img/curves_memory.png"
set title "10M model: CPU allocator bytes per rank against layout"
set xlabel "layout"
set style data histograms; set style histogram clustered; set style fill solid 0.6
set ylabel "MiB per rank"; set yrange [0:*]
plot "$dat/mem.dat" using 3:xtic(2) title "live after a step", "" using 4 title "peak (unsharded model built first)"
set output "docs/img/curves_comm.png"
set title "10M model: bytes into collectives per step per rank"
set ylabel "MB per step"
plot "$dat/comm.dat" using 3:xtic(2) title "measured (dist.comm_mode)", "" using 4 title "predicted"
GP
rm -rf "$dat"
echo "bench_curves: docs/img/curves_{size,degree,memory,comm}.png from $out"
