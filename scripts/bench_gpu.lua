-- bench_gpu.lua: loom on a GPU next to PyTorch on the same GPU, in the same
-- run: matmul (f32, TF32, bf16 at 1k/4k/8k), attention forward + backward
-- (bf16, causal, seq 1k and 4k) and training steps of the Llama-style model
-- (D128 L4 H4 seq64 b12; D768 L12 H12 seq256 b16, 85M) in f32 and bf16,
-- with tokens/s and MFU. The baseline is PyTorch (scripts/bench_gpu_torch.py
-- in a subprocess, when torch imports): torch.matmul is cuBLAS(Lt), the
-- library loom's own gemm calls, so the matmul ratio is loom's overhead and
-- algorithm choice; SDPA is PyTorch's flash attention. Prints a table; --json
-- writes every number. Without a GPU it says so and exits 0. Usage:
--   luajit scripts/bench_gpu.lua [--json out.json] [--quick] [--no-torch]
-- loom's times: wall clock between device synchronisations (a 4-byte read
-- back), over enough calls per sample to reach ~5 ms; medians of samples.
-- PyTorch's: CUDA events around each call, medians.
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_gpu%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local loom = require("loom")
local bench = require("loom.train.bench")
local argparse = require("argparse")
local json = require("dkjson")
local C, F = loom.C, loom.F

local p = argparse("bench_gpu.lua", "loom on a GPU next to PyTorch on the same GPU")
p:option("--json", "write the results here as JSON")
p:flag("--quick", "fewer sizes and repetitions (a smoke run)")
p:flag("--no-torch", "skip the PyTorch baseline"):target("no_torch")
p:option("--python", "the Python that has torch", "python3")
p:option("--peak", "peak TFLOP/s for MFU as f32,tf32,bf16 (default: from the GPU's name)")
p:option("--sizes", "matmul sizes", "1024,4096,8192")
p:option("--seqs", "attention sequence lengths (batch x seq = 8192 tokens)", "1024,4096")
p:option("--models", "training configs: small, 85m or both", "both")
local o = p:parse(arg)
local function numbers(s) local t = {} for v in s:gmatch("[^,]+") do t[#t + 1] = assert(tonumber(v), s) end return t end

local ok, why = loom.device_available("cuda")
if not ok then
  print("bench_gpu: no GPU here (" .. tostring(why) .. "); nothing measured")
  if o.json then
    local f = assert(io.open(o.json, "w"))
    f:write(json.encode({ gpu = false, reason = tostring(why) }, { indent = true }), "\n")
    f:close()
  end
  os.exit(0)
end

-- ---- what to measure (the PyTorch script gets the same lists) ----
local reps = o.quick and 5 or 20
local cfg = { matmul = {}, attention = {}, train = {} }
for _, n in ipairs(numbers(o.sizes)) do
  for _, dt in ipairs({ "f32", "tf32", "bf16" }) do cfg.matmul[#cfg.matmul + 1] = { n = n, dtype = dt, reps = reps } end
end
for _, seq in ipairs(numbers(o.seqs)) do
  cfg.attention[#cfg.attention + 1] = { batch = math.max(1, math.floor(8192 / seq)), heads = 16, seq = seq,
                                        head_dim = 128, dtype = "bf16", causal = true, reps = reps }
end
local models = { small = { name = "D128 L4 H4 seq64 b12", dim = 128, layers = 4, heads = 4, seq = 64, batch = 12 },
                 ["85m"] = { name = "D768 L12 H12 seq256 b16 (85M)", dim = 768, layers = 12, heads = 12, seq = 256,
                             batch = 16 } }
for _, key in ipairs(o.models == "both" and { "small", "85m" } or { o.models }) do
  local m = assert(models[key], "--models: small, 85m or both")
  for _, dt in ipairs({ "f32", "bf16" }) do
    local t = { vocab = 65, dtype = dt, steps = o.quick and 5 or 20 }
    for k, v in pairs(m) do t[k] = v end
    t.ffn_dim = loom.models.transformer.config({ dim = m.dim, n_heads = m.heads }).ffn_dim
    cfg.train[#cfg.train + 1] = t
  end
end

-- ---- timing ----
local probe = loom.zeros({ 1 }, { device = "cuda" })
local function sync() probe:to("cpu") end -- a read waits for the GPU's queue

-- median seconds per call of fn
local function time_gpu(fn, samples)
  for _ = 1, 3 do fn() end
  sync()
  local t0 = bench.now()
  fn()
  sync()
  local inner = math.max(1, math.min(100, math.ceil(5e-3 / math.max(bench.now() - t0, 1e-6))))
  local ts = {}
  for i = 1, samples do
    sync()
    t0 = bench.now()
    for _ = 1, inner do fn() end
    sync()
    ts[i] = (bench.now() - t0) / inner
    collectgarbage("step") -- let dropped tensors go back to the cache as a loop would
  end
  return bench.median(ts)
end

-- ---- the PyTorch baseline ----
local torch = { error = "not run (--no-torch)" }
if not o.no_torch then
  local cmd = string.format("%s %sscripts/bench_gpu_torch.py '%s' 2>&1", o.python, root, json.encode(cfg))
  local f = io.popen(cmd)
  local text = f:read("*a")
  f:close()
  local last = text:match("([^\n]*)\n?$") or ""
  torch = json.decode(last) or { error = "no JSON from bench_gpu_torch.py: " .. text:sub(-300) }
end
if torch.error then print("PyTorch baseline: " .. torch.error) end

-- ---- peaks for MFU (TFLOP/s, dense, from NVIDIA's datasheets) ----
local PEAKS = { { "H100 PCIe", { f32 = 51.2, tf32 = 378, bf16 = 756 } }, { "H100", { f32 = 66.9, tf32 = 494.7, bf16 = 989.4 } },
                { "H200", { f32 = 66.9, tf32 = 494.7, bf16 = 989.4 } }, { "A100", { f32 = 19.5, tf32 = 156, bf16 = 312 } } }
local gpu_name = torch.device
if not gpu_name then
  local f = io.popen("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null")
  gpu_name = f and (f:read("*l") or "") or ""
  if f then f:close() end
end
local peak
if o.peak then
  local a, b, c = o.peak:match("^([%d.]+),([%d.]+),([%d.]+)$")
  peak = { f32 = tonumber(a), tf32 = tonumber(b), bf16 = tonumber(c) }
else
  for _, e in ipairs(PEAKS) do if gpu_name:find(e[1], 1, true) then peak = e[2] break end end
end
print(("GPU: %s; MFU against %s"):format(gpu_name ~= "" and gpu_name or "unknown",
      peak and ("f32 %g, tf32 %g, bf16 %g TFLOP/s"):format(peak.f32, peak.tf32, peak.bf16) or "no known peak (--peak)"))

local function torch_ms(list, match)
  for _, r in ipairs(torch[list] or {}) do if match(r) then return r.ms end end
end
local results = { device = gpu_name, loom = { matmul = {}, attention = {}, train = {} }, torch = torch }

-- ---- matmul ----
local rows = {}
for _, m in ipairs(cfg.matmul) do
  loom.manual_seed(1)
  local dt = m.dtype == "bf16" and "bf16" or "f32"
  local pairs_ = {}
  for i = 1, m.n >= 4096 and 2 or 4 do
    pairs_[i] = { loom.randn({ m.n, m.n }, { device = "cuda" }):to(dt), loom.randn({ m.n, m.n }, { device = "cuda" }):to(dt) }
  end
  C.lm_set_float32_matmul_precision(m.dtype == "tf32" and C.LM_PRECISION_HIGH or C.LM_PRECISION_HIGHEST)
  local k = 0
  local s = time_gpu(function() k = k + 1 local ab = pairs_[k % #pairs_ + 1] return ab[1]:matmul(ab[2]) end, m.reps)
  C.lm_set_float32_matmul_precision(C.LM_PRECISION_HIGHEST)
  pairs_ = nil
  collectgarbage()
  local tf = 2 * m.n ^ 3 / s / 1e12
  local tms = torch_ms("matmul", function(r) return r.n == m.n and r.dtype == m.dtype end)
  rows[#rows + 1] = { ("%d %s"):format(m.n, m.dtype), s * 1e3, tf, tms or "-", tms and tms / (s * 1e3) or "-" }
  table.insert(results.loom.matmul, { n = m.n, dtype = m.dtype, ms = s * 1e3, tflops = tf })
end
print("\nmatmul (n x n @ n x n); vs torch: PyTorch's time over loom's (1 = as fast)")
bench.table({ "size dtype", "loom ms", "loom TFLOP/s", "torch ms", "vs torch" }, rows)

-- ---- attention ----
rows = {}
for _, a in ipairs(cfg.attention) do
  loom.manual_seed(2)
  local shape = { a.batch, a.heads, a.seq, a.head_dim }
  local q, k, v = loom.randn(shape, { device = "cuda" }):to(a.dtype), loom.randn(shape, { device = "cuda" }):to(a.dtype),
                  loom.randn(shape, { device = "cuda" }):to(a.dtype)
  for _, t in ipairs({ q, k, v }) do t.requires_grad = true end
  local g = loom.randn(shape, { device = "cuda" }):to(a.dtype)
  local s = time_gpu(function()
    q.grad, k.grad, v.grad = nil, nil, nil
    F.scaled_dot_product_attention(q, k, v, { is_causal = a.causal }):backward(g)
  end, a.reps)
  -- FlashAttention's count: forward 4 B H T^2 D, backward 2.5 times that; causal half
  local flops = 3.5 * 4 * a.batch * a.heads * a.seq ^ 2 * a.head_dim * (a.causal and 0.5 or 1)
  local tms = torch_ms("attention", function(r) return r.seq == a.seq and r.batch == a.batch end)
  rows[#rows + 1] = { ("b%d h%d seq%d d%d %s"):format(a.batch, a.heads, a.seq, a.head_dim, a.dtype), s * 1e3,
                      flops / s / 1e12, tms or "-", tms and tms / (s * 1e3) or "-" }
  table.insert(results.loom.attention, { seq = a.seq, batch = a.batch, ms = s * 1e3, tflops = flops / s / 1e12 })
end
print("\nattention forward + backward (causal); vs torch: SDPA's time over loom's")
bench.table({ "config", "loom ms", "loom TFLOP/s", "torch ms", "vs torch" }, rows)

-- ---- training steps ----
-- parameters and the rotary tables onto the GPU, in dtype (AdamW keeps
-- f32 masters of bf16 parameters)
local function to_gpu(model, dtype)
  for _, mm in ipairs(model:named_modules()) do
    local params = rawget(mm[2], "_parameters")
    for name, w in pairs(params) do
      local x = w:to({ device = "cuda", dtype = dtype }):detach()
      x.requires_grad = true
      params[name] = x
    end
  end
  model.rope_cos, model.rope_sin = model.rope_cos:to("cuda"), model.rope_sin:to("cuda")
end

rows = {}
for _, t in ipairs(cfg.train) do
  loom.manual_seed(0)
  local model = loom.models.transformer.new { vocab_size = t.vocab, dim = t.dim, n_layers = t.layers,
                                              n_heads = t.heads, max_seq_len = t.seq }
  to_gpu(model, t.dtype)
  local opt = loom.optim.AdamW(model:parameters(), { lr = 1e-3 })
  local x = loom.randint(1, t.vocab + 1, { t.batch, t.seq }):to("cuda")
  local y = loom.randint(1, t.vocab + 1, { t.batch, t.seq }):to("cuda")
  local s = time_gpu(function()
    local loss = F.cross_entropy(model(x), y)
    opt:zero_grad()
    loss:backward()
    opt:step()
  end, t.steps)
  local n, emb = 0, t.vocab * t.dim
  for _, w in ipairs(model:parameters()) do n = n + w:numel() end
  local tokens = t.batch * t.seq
  local flops = tokens * (6 * (n - emb) + 12 * t.layers * t.dim * t.seq) -- PaLM's count, embedding gather excluded
  local mfu = peak and peak[t.dtype] and flops / s / 1e12 / peak[t.dtype]
  local tms = torch_ms("train", function(r) return r.dim == t.dim and r.layers == t.layers and r.dtype == t.dtype end)
  rows[#rows + 1] = { t.name .. " " .. t.dtype, s * 1e3, tokens / s, mfu and 100 * mfu or "-", tms or "-",
                      tms and tokens / (tms * 1e-3) or "-" }
  table.insert(results.loom.train, { config = t.name, dtype = t.dtype, ms = s * 1e3, tokens_per_s = tokens / s,
                                     mfu = mfu, params = n })
  model, opt = nil, nil
  collectgarbage()
end
print("\ntraining step (forward, backward, AdamW), vocab 65; MFU: 6N + 12 L D T flops per token")
bench.table({ "config", "loom ms", "loom tok/s", "MFU %", "torch ms", "torch tok/s" }, rows)

if o.json then
  local f = assert(io.open(o.json, "w"))
  f:write(json.encode(results, { indent = true }), "\n")
  f:close()
  print("\nwrote " .. o.json)
end
