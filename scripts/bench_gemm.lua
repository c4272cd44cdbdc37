-- bench_gemm.lua: the GEMM rates a bf16 step runs at. loom's matmul in f32,
-- in bf16 on the fast path (oneDNN's bf16 kernels, where the CPU has bf16
-- dot products) and in bf16 on the plain path (widened to f32, sgemm:
-- lm_cpu_set_bf16_gemm(0)), next to PyTorch's matmul in f32 and bf16 in the
-- same run (scripts/bench_torch_train.py --gemm, run before and after loom:
-- the best of both). Shapes: 1024^3, and the Linear layers of the 97M
-- Llama step (D768, ffn 2048, vocab 8192, 1024 tokens) in the three cases a
-- training step runs: forward y = x W^T, dgrad dX = dY W, wgrad
-- dW = dY^T X. The last row sums one step's Linear GEMMs (12 layers).
-- Each figure is the best of --reps calls, the three loom paths taking
-- turns shape by shape, and the best of --rounds rounds, each round PyTorch
-- then loom (on a shared machine the best of a few rounds is the least
-- disturbed figure of each side). Usage:
--   LOOM_BENCH_PYTHON=/opt/hfenv/bin/python luajit scripts/bench_gemm.lua [--reps 5] [--rounds 3]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_gemm%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local loom = require("loom")
local bench = require("loom.train.bench")
local ffi = require("ffi")
local C = loom.C

local o = bench.args(arg, { reps = 5, rounds = 3, tokens = 1024 }, "bench_gemm.lua")
local T = o.tokens

-- { name, M, K, N, A transposed, B transposed, times in one 97M step }
local shapes = { { "1024^3", 1024, 1024, 1024, false, false, 0 } }
for _, w in ipairs { { "wq/wk/wv/wo", 768, 768, 48 }, { "w1/w3", 2048, 768, 24 }, { "w2", 768, 2048, 12 },
                     { "output", 8192, 768, 1 } } do
  local out, inp, n = w[2], w[3], w[4]
  shapes[#shapes + 1] = { "fwd " .. w[1], T, inp, out, false, true, n }    -- x (T, in) @ W^T
  shapes[#shapes + 1] = { "dgrad " .. w[1], T, out, inp, false, false, n } -- dY (T, out) @ W (out, in)
  shapes[#shapes + 1] = { "wgrad " .. w[1], out, T, inp, true, false, n }  -- dY^T (out, T) @ X (T, in)
end

-- PyTorch's rates on the same shapes, or nil and why
local function torch_rates()
  local py = os.getenv("LOOM_BENCH_PYTHON") or "python3"
  if os.execute(py .. " -c 'import torch' >/dev/null 2>&1") ~= 0 then
    return nil, "not importable, set LOOM_BENCH_PYTHON to a Python with torch"
  end
  local spec = {}
  for i, s in ipairs(shapes) do
    spec[i] = string.format("%d,%d,%d,%d,%d", s[2], s[3], s[4], s[5] and 1 or 0, s[6] and 1 or 0)
  end
  local f = io.popen(string.format("OMP_WAIT_POLICY=PASSIVE %s %sscripts/bench_torch_train.py --gemm '%s' --reps %d " ..
                                   "--threads %d", py, root, table.concat(spec, ";"), o.reps, loom.num_threads()))
  local out = f:read("*a")
  f:close()
  local ok, r = pcall(require("dkjson").decode, out:match("{.*}") or "")
  if not (ok and type(r) == "table" and r.gemm) then return nil, "torch from " .. py .. " failed" end
  return r, "torch " .. r.torch .. " from " .. py
end

-- an operand (rows, cols) in dtype, as a transposed view when tr
local function operand(rows, cols, tr, dtype)
  if tr then return loom.randn(cols, rows):to(dtype):t() end
  return loom.randn(rows, cols):to(dtype)
end

local PATHS = { { "f32", "f32", 1 }, { "bf16 fast", "bf16", 1 }, { "bf16 plain", "bf16", 0 } }
local function loom_rates()
  local rates = {}
  for i, s in ipairs(shapes) do
    local M, K, N = s[2], s[3], s[4]
    local ops = {}
    for p, path in ipairs(PATHS) do
      ops[p] = { operand(M, K, s[5], path[2]), operand(K, N, s[6], path[2]) }
    end
    local best = { math.huge, math.huge, math.huge }
    for _ = 1, o.reps + 1 do   -- the paths take turns; the first round warms up
      for p, path in ipairs(PATHS) do
        local old = C.lm_cpu_set_bf16_gemm(path[3])
        local t0 = bench.now()
        local _ = ops[p][1]:matmul(ops[p][2])
        best[p] = math.min(best[p], bench.now() - t0)
        C.lm_cpu_set_bf16_gemm(old)
      end
    end
    rates[i] = {}
    for p = 1, #PATHS do rates[i][p] = 2 * M * N * K / best[p] / 1e9 end
  end
  return rates
end

-- the best of the rounds, cell by cell
local lr, pt, why = nil, { gemm = { f32 = {}, bf16 = {} } }, nil
for _ = 1, o.rounds do
  local r, w = torch_rates()
  why = why or w
  if r then
    for _, dt in ipairs { "f32", "bf16" } do
      for i, v in ipairs(r.gemm[dt]) do pt.gemm[dt][i] = math.max(pt.gemm[dt][i] or 0, v) end
    end
  end
  local l = loom_rates()
  lr = lr or l
  for i = 1, #l do for p = 1, #PATHS do lr[i][p] = math.max(lr[i][p], l[i][p]) end end
end
local function torch_rate(dt, i) return pt.gemm[dt][i] end

print(string.format("GEMM rates, GFLOP/s (best of %d calls in each of %d rounds), %d threads; loom's bf16 GEMM: %s",
                    o.reps, o.rounds, loom.num_threads(),
                    ffi.string(C.lm_blas_info()):match("bf16 GEMM: (.*)$")))
print("PyTorch: " .. why .. "\n")
local rows, step = {}, { 0, 0, 0, 0, 0 }
local flops_step = 0
for i, s in ipairs(shapes) do
  local M, K, N = s[2], s[3], s[4]
  local tf, tb = torch_rate("f32", i), torch_rate("bf16", i)
  rows[#rows + 1] = { s[1], string.format("%dx%dx%d", M, K, N), lr[i][1], lr[i][2], lr[i][3], tf or "n/a", tb or "n/a",
                      tb and string.format("%.2fx", lr[i][2] / tb) or "n/a" }
  if s[7] > 0 then
    local fl = 2 * M * N * K * s[7]
    flops_step = flops_step + fl
    for p = 1, 3 do step[p] = step[p] + fl / lr[i][p] / 1e9 end
    step[4] = tf and step[4] + fl / tf / 1e9 or nil
    step[5] = tb and step[5] + fl / tb / 1e9 or nil
  end
end
local function ms(v) return v and string.format("%.0f ms", v * 1e3) or "n/a" end
rows[#rows + 1] = { "97M step, all", string.format("%.0f GFLOP", flops_step / 1e9), ms(step[1]), ms(step[2]), ms(step[3]),
                    ms(step[4]), ms(step[5]), step[5] and string.format("%.2fx", step[5] / step[2]) or "n/a" }
bench.table({ "shape", "MxKxN", "loom f32", "loom bf16", "loom bf16 plain", "PyTorch f32", "PyTorch bf16",
              "loom bf16 / PyTorch bf16" }, rows)
