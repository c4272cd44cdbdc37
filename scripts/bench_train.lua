-- bench_train.lua: time of one training step of the Llama-style model
-- (forward, backward, AdamW), split by op, with the time in GEMM (the
-- matmul op) next to the total; with --dtype f32,bf16 the same config in
-- each dtype in the same run (bf16: mixed precision, autocast). Usage:
--   luajit scripts/bench_train.lua [--layers 4 --dim 128 --heads 4 --seq 64 --batch 12 --steps 20 --dtype f32]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_train%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local loom = require "loom"
local bench = require "loom.bench"
local C = loom.C

local o = bench.args(arg, { layers = 4, dim = 128, heads = 4, seq = 64, batch = 12, steps = 20, vocab = 65,
                            dtype = "f32" }, "bench_train.lua")

-- one config in one dtype: phase times and the op profile
local function measure(dtype)
  loom.manual_seed(0)
  local model = loom.models.transformer.new { vocab_size = o.vocab, dim = o.dim, n_layers = o.layers,
                                              n_heads = o.heads, max_seq_len = o.seq }
  local opt = loom.optim.AdamW(model:parameters(), { lr = 1e-3 })
  local x = loom.randint(1, o.vocab + 1, { o.batch, o.seq })
  local y = loom.randint(1, o.vocab + 1, { o.batch, o.seq })
  local function forward() return loom.F.cross_entropy(model(x), y) end
  local phases = { forward = {}, backward = {}, optimizer = {}, step = {} }
  local function step(record)
    local t0 = bench.now()
    local loss = dtype == "f32" and forward() or loom.autocast(dtype, forward)
    local t1 = bench.now()
    opt:zero_grad()
    loss:backward()
    local t2 = bench.now()
    opt:step()
    local t3 = bench.now()
    if record then
      table.insert(phases.forward, t1 - t0) table.insert(phases.backward, t2 - t1)
      table.insert(phases.optimizer, t3 - t2) table.insert(phases.step, t3 - t0)
    end
  end
  for _ = 1, 3 do step(false) end
  C.lm_profile_reset()
  C.lm_profile_enable(1)
  for _ = 1, o.steps do step(true) end
  C.lm_profile_enable(0)
  local total, ops = 0, {}
  for id = 0, C.lm_op_count() - 1 do
    local s = C.lm_profile_seconds(id)
    if s > 0 then
      total = total + s
      ops[#ops + 1] = { require("ffi").string(C.lm_op_name(id)), s / o.steps * 1e3, tonumber(C.lm_profile_calls(id)) / o.steps }
    end
  end
  table.sort(ops, function(a, b) return a[2] > b[2] end)
  for _, r in ipairs(ops) do r[4] = 100 * r[2] / (total / o.steps * 1e3) end
  return phases, ops
end

-- PyTorch eager on the same config, when a Python with torch is at hand
-- (LOOM_BENCH_PYTHON, else python3): a baseline only, never a dependency
local py = os.getenv("LOOM_BENCH_PYTHON") or "python3"
local has_torch = os.execute(py .. " -c 'import torch' >/dev/null 2>&1") == 0
local function torch_step(dtype)
  if not has_torch then return nil end
  local cmd = string.format("OMP_WAIT_POLICY=PASSIVE %s %sscripts/bench_torch_train.py --layers %d --dim %d --heads %d "
                            .. "--seq %d --batch %d --steps %d --vocab %d --threads %d --dtype %s", py, root, o.layers,
                            o.dim, o.heads, o.seq, o.batch, o.steps, o.vocab, loom.num_threads(), dtype)
  local f = io.popen(cmd)
  local out = f:read("*a")
  f:close()
  local ok, r = pcall(require("dkjson").decode, out:match("{.*}") or "")
  return ok and type(r) == "table" and r or nil
end

print(string.format("training step: %d layers, dim %d, %d heads, batch %dx%d, %d threads, %d steps timed",
                    o.layers, o.dim, o.heads, o.batch, o.seq, loom.num_threads(), o.steps))
local summary = {}
for dtype in o.dtype:gmatch("[^,]+") do
  local phases, ops = measure(dtype)
  print(string.format("\n-- %s%s", dtype, dtype == "f32" and "" or " (mixed precision: autocast, f32 parameters)"))
  local rows = {}
  for _, name in ipairs { "forward", "backward", "optimizer", "step" } do
    rows[#rows + 1] = { name, bench.median(phases[name]) * 1e3, bench.min(phases[name]) * 1e3 }
  end
  bench.table({ "phase", "median ms", "min ms" }, rows)
  print()
  bench.table({ "op (exclusive)", "ms/step", "calls/step", "% of op time" }, { unpack(ops, 1, 12) })
  local gemm, step_ms = 0, bench.median(phases.step) * 1e3
  for _, r in ipairs(ops) do if r[1] == "matmul" then gemm = r[2] end end
  print(string.format("\nGEMM (matmul op) %.1f ms of %.1f ms per step (%.0f%%); %.0f tokens/s",
                      gemm, step_ms, 100 * gemm / step_ms, o.batch * o.seq / (step_ms / 1e3)))
  local pt = torch_step(dtype)
  summary[#summary + 1] = { dtype, step_ms, o.batch * o.seq / (step_ms / 1e3), pt and pt.step_ms or "n/a",
                            pt and pt.tokens_per_s or "n/a",
                            pt and string.format("%.2fx", pt.step_ms / step_ms) or "n/a" }
end
print(string.format("\nsame config, same run (PyTorch eager: %s):", has_torch and "torch from " .. py or
                    "not importable, set LOOM_BENCH_PYTHON to a Python with torch"))
bench.table({ "dtype", "loom step ms", "loom tokens/s", "PyTorch step ms", "PyTorch tokens/s", "loom speed-up" },
            summary)
