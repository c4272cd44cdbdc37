-- bench_fused.lua: the fused kernels against the composed forms they
-- replace, at a training-sized shape (a Llama block: batch x seq rows of
-- dim, heads, ffn width, vocabulary). Each case runs the same Lua code twice
-- on the same seeded inputs: here, with the CPU's fused kernels, and in a
-- child process started with LOOM_CPU_FUSED=0, where the ops take their
-- composed forms (one case at a time, alternating). Next to each fused
-- time: the GB/s of the bytes the fused kernel must move and a one-thread
-- memcpy of as many bytes. AdamW compares one _adamw_multi_ call with one
-- _adamw_ call per parameter. Last, scripts/bench_train.lua's step time
-- with and without the fused kernels. Usage:
--   luajit scripts/bench_fused.lua [--batch 8 --seq 256 --dim 512 --heads 8 --vocab 8192
--                                   --reps 7 --only NAME --train 1 --json FILE]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_fused%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local ffi = require("ffi")
local loom = require("loom")
local bench = require("loom.train.bench")
local F = loom.F

local o = bench.args(arg, { batch = 8, seq = 256, dim = 512, heads = 8, vocab = 8192, reps = 7,
                            only = "", train = 1, json = "", child = 0 })
local FUSED = os.getenv("LOOM_CPU_FUSED") ~= "0"
local rows, hd = o.batch * o.seq, o.dim / o.heads
local ffn = 32 * math.ceil(math.floor(8 * o.dim / 3) / 32)

local function randn(seed, shape, grad)
  loom.manual_seed(seed)
  local t = loom.randn(shape)
  return grad and t:requires_grad_(true) or t
end

-- median seconds of fn over reps runs, setup() (untimed) before each
local function timed(setup, fn)
  local ts = {}
  for r = 0, o.reps do
    local s = setup and setup()
    local t0 = bench.now()
    fn(s)
    if r > 0 then ts[r] = bench.now() - t0 end   -- run 0 warms up
  end
  return bench.median(ts)
end

-- forward and backward of f(inputs) timed apart. A case lists the bytes
-- its fused forward and backward kernels read and write (nil: the forward
-- runs the same kernel either way, and is not shown).
local function fwbw(make, f)
  return function()
    local ins, g = make()
    local fw = timed(nil, function() f(unpack(ins)) end)
    local bw = timed(function()   -- a fresh graph, and no gradient to add to
      for _, x in ipairs(ins) do if x.requires_grad then x.grad = nil end end
      return f(unpack(ins))
    end, function(y) y:backward(g) end)
    return fw, bw
  end
end

local B, H, L, D = o.batch, o.heads, o.seq, o.dim
local cases = {
  { "silu (unary_grad)", nil, 4 * rows * ffn * 4, fwbw(function()
      return { randn(1, { rows, ffn }, true) }, randn(2, { rows, ffn }) end, function(x) return x:silu() end) },
  { "swiglu", 4 * rows * ffn * 3, 4 * rows * ffn * 5, fwbw(function()
      return { randn(3, { rows, ffn }, true), randn(4, { rows, ffn }, true) }, randn(5, { rows, ffn }) end, F.swiglu) },
  { "softmax (softmax_bwd)", nil, 4 * B * H * L * L * 3, fwbw(function()
      return { randn(6, { B * H * L, L }, true) }, randn(7, { B * H * L, L }) end, function(x) return x:softmax(-1) end) },
  { "rms_norm (norm_bwd)", nil, 4 * rows * D * 3, fwbw(function()
      return { randn(8, { rows, D }, true), randn(9, { D }, true) }, randn(10, { rows, D }) end,
      function(x, w) return F.rms_norm(x, { D }, w, 1e-5) end) },
  { "layer_norm (norm_bwd)", nil, 4 * rows * D * 3, fwbw(function()
      return { randn(11, { rows, D }, true), randn(12, { D }, true), randn(13, { D }, true) }, randn(14, { rows, D }) end,
      function(x, w, b) return F.layer_norm(x, { D }, w, b, 1e-5) end) },
  { "rope", 4 * rows * D * 2, 4 * rows * D * 2, fwbw(function()
      local cos, sin = F.rope_tables(L, hd)
      return { randn(15, { B, L, H, hd }, true), cos, sin }, randn(16, { B, L, H, hd }) end, F.apply_rotary_emb) },
  { "sdpa causal (attention)", 4 * B * H * L * hd * 4, 4 * B * H * L * hd * 8, fwbw(function()
      local s = { B, H, L, hd }
      return { randn(17, s, true), randn(18, s, true), randn(19, s, true) }, randn(20, s) end,
      function(q, k, v) return F.scaled_dot_product_attention(q, k, v, { is_causal = true }) end) },
  { "cross_entropy", 4 * rows * o.vocab, 4 * rows * o.vocab * 2, fwbw(function()
      loom.manual_seed(21)
      return { randn(22, { rows, o.vocab }, true), loom.randint(1, o.vocab + 1, { rows }) } end,
      function(x, t) return F.cross_entropy(x, t) end) },
}

-- AdamW over a Llama-like parameter list of 4 layers (7 matrices, 2 norms each)
local function adamw_case()
  local shapes = { { o.vocab, D }, { D }, { o.vocab, D } }
  for _ = 1, 4 do
    for _, s in ipairs { { D, D }, { D, D }, { D, D }, { D, D }, { ffn, D }, { D, ffn }, { ffn, D }, { D }, { D } } do
      shapes[#shapes + 1] = s
    end
  end
  local list, n = {}, 0
  for i, s in ipairs(shapes) do
    for k = 1, 4 do list[#list + 1] = randn(100 * i + k, s) end
    n = n + list[#list]:numel()
  end
  local h = { 1e-3, 0.9, 0.999, 1e-8, 1e-2, 0.1, 0.001 }
  local multi = timed(nil, function() loom.op("_adamw_multi_", list, nil, h) end)
  local each = timed(nil, function()
    for k = 1, #list, 4 do loom.op("_adamw_", { list[k], list[k + 1], list[k + 2], list[k + 3] }, nil, h) end
  end)
  return multi, each, 4 * n * 7, #shapes
end

-- one-thread memcpy of `bytes` (half read, half written), best of 5
local function memcpy_s(bytes)
  local half = math.floor(bytes / 2)
  local src, dst = ffi.new("uint8_t[?]", half), ffi.new("uint8_t[?]", half)
  ffi.fill(src, half, 1)
  return bench.best(function() ffi.copy(dst, src, half) end, 5)
end

-- a child's result lines: "case<TAB>fw<TAB>bw"
if o.child == 1 then
  for _, c in ipairs(cases) do
    if c[1] == o.only then
      local fw, bw = c[4]()
      print(string.format("@@%s\t%.9g\t%.9g", c[1], fw, bw))
    end
  end
  os.exit(0)
end

local function composed(name)
  local cmd = string.format("LOOM_CPU_FUSED=0 luajit %sscripts/bench_fused.lua --child 1 --only '%s' --batch %d "
                            .. "--seq %d --dim %d --heads %d --vocab %d --reps %d 2>&1", root, name, o.batch,
                            o.seq, o.dim, o.heads, o.vocab, o.reps)
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  local fw, bw = out:match("@@[^\t]*\t([%d.e+-]+)\t([%d.e+-]+)")
  if not fw then error("composed run of " .. name .. " failed:\n" .. out) end
  return tonumber(fw), tonumber(bw)
end

assert(FUSED, "bench_fused.lua: run it without LOOM_CPU_FUSED=0 (it starts the composed runs itself)")
local cpu = io.popen("lscpu 2>/dev/null | sed -n 's/^Model name: *//p'"):read("*l") or "?"
print(string.format("bench_fused: %s, %d threads; batch %d x seq %d, dim %d, %d heads (head dim %d), ffn %d, vocab %d; median of %d",
                    cpu, loom.num_threads(), B, L, D, H, hd, ffn, o.vocab, o.reps))
local report = { threads = loom.num_threads(), cpu = cpu, cases = {} }
local out = {}
for _, c in ipairs(cases) do
  if o.only == "" or o.only == c[1] then
    local ffw, fbw = c[4]()
    collectgarbage()
    local cfw, cbw = composed(c[1])
    local mbw = memcpy_s(c[3])
    if c[2] then
      local mfw = memcpy_s(c[2])
      out[#out + 1] = { c[1] .. " fw", cfw * 1e3, ffw * 1e3, cfw / ffw, c[2] / ffw / 1e9, c[2] / mfw / 1e9 }
    end
    out[#out + 1] = { c[1] .. " bw", cbw * 1e3, fbw * 1e3, cbw / fbw, c[3] / fbw / 1e9, c[3] / mbw / 1e9 }
    report.cases[c[1]] = { composed_fw_ms = cfw * 1e3, fused_fw_ms = ffw * 1e3, composed_bw_ms = cbw * 1e3,
                           fused_bw_ms = fbw * 1e3, fw_bytes = c[2], bw_bytes = c[3], memcpy_bw_gbs = c[3] / mbw / 1e9 }
  end
end
if o.only == "" or o.only == "adamw" then
  local multi, each, bytes, np = adamw_case()
  out[#out + 1] = { string.format("adamw, %d params", np), each * 1e3, multi * 1e3, each / multi, bytes / multi / 1e9,
                    bytes / memcpy_s(bytes) / 1e9 }
  report.cases.adamw = { per_param_ms = each * 1e3, multi_ms = multi * 1e3, bytes = bytes }
end
print("\n(fw: the op's forward; bw: its backward alone; GB/s: bytes the fused kernel moves / fused time)")
bench.table({ "case", "composed ms", "fused ms", "speedup", "fused GB/s", "memcpy GB/s" }, out)

-- the training step, as bench_train.lua measures it, with and without the fused kernels
if o.train == 1 and o.only == "" then
  local function step(env)
    local p = io.popen(env .. " luajit " .. root .. "scripts/bench_train.lua 2>&1")
    local s = p:read("*a")
    p:close()
    return tonumber(s:match("\nstep%s+([%d.]+)")), s:match("training step:[^\n]*")
  end
  local tc, what = step("LOOM_CPU_FUSED=0")
  local tf = step("LOOM_CPU_FUSED=1")
  print("\n" .. (what or "bench_train.lua"))
  bench.table({ "bench_train.lua step", "median ms" }, { { "composed (LOOM_CPU_FUSED=0)", tc }, { "fused", tf } })
  report.train = { composed_ms = tc, fused_ms = tf }
end

if o.json ~= "" then
  local fh = assert(io.open(o.json, "w"))
  fh:write(bench.json(report), "\n")
  fh:close()
  print("wrote " .. o.json)
end
