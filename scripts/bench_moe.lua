-- bench_moe.lua: the mixture-of-experts layer and its grouped GEMM, each
-- beside a baseline measured in the same run.
--  1. nn.MoE forward and forward + backward (of sum(out * r)) against
--     PyTorch eager running transformers' MixtralSparseMoeBlock on the same
--     config and threads (scripts/bench_moe_torch.py: its experts as a loop
--     over experts, "eager", and as torch's grouped GEMM, "grouped_mm"),
--     when a Python with torch and transformers is at hand
--     (LOOM_BENCH_PYTHON, else python3). PyTorch runs between two rounds
--     of loom's, so both see the same neighbours; each figure is the best
--     round's median.
--  2. loom.grouped_mm's rate on the layer's shapes (its tokens sorted by
--     expert, the group sizes of a real routing) against the BLAS called
--     directly on the same buffers: one cblas_sgemm per group, and one
--     cblas_sgemm over all rows against a single weight (the same FLOPs
--     in one call with one weight packed once: a reference, not a target).
-- Each figure is the best median of several rounds; the grouped GEMM's
-- three variants are interleaved round by round.
-- Usage:
--   LOOM_BENCH_PYTHON=/opt/hfenv/bin/python luajit scripts/bench_moe.lua [--dim 512] [--hidden 1024]
--     [--experts 8] [--top-k 2] [--tokens 2048] [--iters 5] [--rounds 3] [--json out.json]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_moe%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local ffi = require("ffi")
local loom = require("loom")
local nn = require("loom.nn")
local bench = require("loom.train.bench")

local o = bench.args(arg, { dim = 512, hidden = 1024, experts = 8, ["top-k"] = 2, tokens = 2048, iters = 5,
                            rounds = 3, json = "" }, "bench_moe.lua")
local D, H, E, K, N = o.dim, o.hidden, o.experts, o["top-k"], o.tokens

-- the best of `rounds` medians of `iters` calls (after two warm-ups)
local function best(fn)
  local b = math.huge
  for _ = 1, o.rounds do b = math.min(b, bench.time(fn, o.iters)) end
  return b
end

---------------------------------------------------------------------------
-- 1. the layer

loom.manual_seed(0)
local moe = nn.MoE { dim = D, hidden = H, experts = E, top_k = K }
local x = loom.randn(1, N, D):requires_grad_()
local r = loom.randn(1, N, D)
local function fwd() return loom.no_grad(moe.forward, moe, x) end
local function fwd_bwd()
  moe:zero_grad()
  x:zero_grad()
  local loss = (moe(x) * r):sum()
  loss:backward()
end

local function torch_python()
  local py = os.getenv("LOOM_BENCH_PYTHON") or "python3"
  return py, os.execute(py .. " -c 'import torch, transformers' >/dev/null 2>&1") == 0
end

local function torch_run()
  local py, has = torch_python()
  if not has then return nil, py .. " has no torch and transformers (set LOOM_BENCH_PYTHON)" end
  local cmd = string.format("OMP_WAIT_POLICY=PASSIVE %s %sscripts/bench_moe_torch.py --dim %d --hidden %d "
                            .. "--experts %d --top-k %d --tokens %d --iters %d --rounds %d --threads %d 2>/dev/null",
                            py, root, D, H, E, K, N, o.iters, o.rounds, loom.num_threads())
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  local ok, res = pcall(require("dkjson").decode, out:match("{.*}") or "")
  if not ok or type(res) ~= "table" then return nil, "bench_moe_torch.py printed no result" end
  return res
end

local lf, lfb = best(fwd), best(fwd_bwd)
local torch, why = torch_run()
lf, lfb = math.min(lf, best(fwd)), math.min(lfb, best(fwd_bwd))

print(string.format("MoE layer: dim %d, hidden %d, %d experts, top-%d, %d tokens, f32, %d threads; "
                    .. "tokens per expert {%s}", D, H, E, K, N, loom.num_threads(),
                    table.concat(moe.tokens_per_expert, ", ")))
local rows = { { "loom nn.MoE (grouped GEMMs)", lf * 1e3, lfb * 1e3, 1, 1 } }
local result = { config = { dim = D, hidden = H, experts = E, top_k = K, tokens = N, threads = loom.num_threads() },
                 loom = { fwd_ms = lf * 1e3, fwd_bwd_ms = lfb * 1e3 } }
if torch then
  result.torch = torch
  for _, impl in ipairs { "eager", "grouped_mm" } do
    local t = torch[impl]
    local what = string.format("PyTorch %s, transformers' MixtralSparseMoeBlock, experts %q", torch.torch, impl)
    if t and t.fwd_ms then
      rows[#rows + 1] = { what, t.fwd_ms, t.fwd_bwd_ms, t.fwd_ms / (lf * 1e3), t.fwd_bwd_ms / (lfb * 1e3) }
    elseif t then
      rows[#rows + 1] = { what .. ": " .. tostring(t.error), "-", "-", "-", "-" }
    end
  end
else
  print("(no PyTorch baseline: " .. why .. ")")
end
bench.table({ "what", "forward ms", "fwd+bwd ms", "fwd vs loom", "fwd+bwd vs loom" }, rows)

---------------------------------------------------------------------------
-- 2. the grouped GEMM against the BLAS on the same shapes

local blas = ffi.load("openblas")
pcall(ffi.cdef, [[
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc);
]])
local ROW, NOTRANS, TRANS = 101, 111, 112

local sizes, rows_total = {}, 0
for e = 1, E do sizes[e] = moe.tokens_per_expert[e] rows_total = rows_total + sizes[e] end
local sz = loom.tensor(sizes, { dtype = "i64" })
local gemm_rows = {}
result.grouped_gemm = {}
-- a: (rows, k) sorted rows; w: (E, m, k) as nn.Linear's weights, read transposed
for _, shape in ipairs { { "gate/up projection", D, H }, { "down projection", H, D } } do
  local what, kk, mm = shape[1], shape[2], shape[3]
  local a, w = loom.randn(rows_total, kk), loom.randn(E, mm, kk)
  local c = loom.empty(rows_total, mm)
  local pa, pw, pc = ffi.cast("float *", a:data_ptr()), ffi.cast("float *", w:data_ptr()), ffi.cast("float *", c:data_ptr())
  local function grouped() return loom.grouped_mm(a, w, sz, { trans_w = true }) end
  local function per_group()
    local row = 0
    for e = 1, E do
      local n = sizes[e]
      if n > 0 then
        blas.cblas_sgemm(ROW, NOTRANS, TRANS, n, mm, kk, 1, pa + row * kk, kk, pw + (e - 1) * mm * kk, kk, 0,
                         pc + row * mm, mm)
      end
      row = row + n
    end
  end
  local function one_call() blas.cblas_sgemm(ROW, NOTRANS, TRANS, rows_total, mm, kk, 1, pa, kk, pw, kk, 0, pc, mm) end
  local tg, tp, t1 = math.huge, math.huge, math.huge
  for _ = 1, 3 * o.rounds do   -- interleaved call by call: all three see the same neighbours
    tg, tp, t1 = math.min(tg, bench.time(grouped, o.iters)), math.min(tp, bench.time(per_group, o.iters)),
                 math.min(t1, bench.time(one_call, o.iters))
  end
  local flops = 2 * rows_total * kk * mm
  local label = string.format("%s (%d x %d -> %d)", what, rows_total, kk, mm)
  gemm_rows[#gemm_rows + 1] = { "loom.grouped_mm, " .. label, tg * 1e3, flops / tg / 1e9, tp / tg }
  gemm_rows[#gemm_rows + 1] = { "  cblas_sgemm per group, same buffers", tp * 1e3, flops / tp / 1e9, 1 }
  gemm_rows[#gemm_rows + 1] = { "  one cblas_sgemm over all rows (one weight)", t1 * 1e3, flops / t1 / 1e9, tp / t1 }
  result.grouped_gemm[#result.grouped_gemm + 1] = { what = label, grouped_ms = tg * 1e3, per_group_blas_ms = tp * 1e3,
                                                    one_blas_ms = t1 * 1e3, gflops = flops / tg / 1e9 }
end
print()
print(string.format("Grouped GEMM, f32, %d rows in %d groups {%s}, weights (E, M, K) read transposed",
                    rows_total, E, table.concat(sizes, ", ")))
bench.table({ "what", "ms", "GFLOP/s", "vs BLAS per group" }, gemm_rows)
print("\nCPU: " .. (io.popen("lscpu | sed -n 's/^Model name: *//p'"):read("*l") or "?")
      .. "; load average " .. (io.open("/proc/loadavg") and io.open("/proc/loadavg"):read("*l") or "?"))
if o.json ~= "" then bench.write_json(o.json, result) end
