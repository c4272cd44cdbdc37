-- gpu_smoke.lua: small CUDA cases for a short first run on a GPU
-- (scripts/gpu_first_run.sh), each against the same computation on the CPU,
-- sized to finish under compute-sanitizer in seconds:
--   --ops        every fused kernel (attention forward and backward in f32,
--                bf16 and f16, cross entropy, norms, rope, softmax), matmul,
--                and a bf16 training step of a small Llama (memcheck)
--   --attention  one small bf16 attention case, forward and backward
--                (racecheck, synccheck)
--   --nccl       NCCL in one process: all_reduce, broadcast, all_gather and
--                reduce_scatter on a 1-rank "cuda" mesh, and no CUDA error
--                left behind (a query's cudaErrorNotReady, issue 35)
--   --case K     only the K-th of the cases selected (exit 3 when there is
--                none): memcheck runs each case in a process of its own
--                and one host thread, since on an H200 one process running
--                them all ended (exit 6, no error reported) in its third
--                attention case, and the training step alone did so with
--                16 host threads but not with one (docs/devices.md)
-- It runs on the emulated device too (spec/gpu_first_run_spec.lua). Prints
-- "gpu_smoke: N passed, N failed"; exits 1 when one failed, 2 without a GPU.
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/gpu_smoke%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. root .. "spec/?.lua;" .. package.path
io.stdout:setvbuf("line") -- a crash under a sanitizer keeps what was printed
local loom = require("loom")
local G = require("support.cuda")
local F = loom.F

local want, only = {}, nil
for i, a in ipairs(arg) do
  if a == "--case" then only = tonumber(arg[i + 1])
  elseif arg[i - 1] ~= "--case" then want[a:gsub("^%-%-", "")] = true end
end
if not (want.ops or want.attention or want.nccl) or (want.case and not only) then
  io.stderr:write("usage: luajit scripts/gpu_smoke.lua [--ops] [--attention] [--nccl] [--case K]\n")
  os.exit(2)
end
if not G.ok then
  print("gpu_smoke: no GPU (" .. tostring(G.why) .. ")")
  os.exit(2)
end

local passed, failed, seen = 0, 0, 0
local function case(what, f)
  seen = seen + 1
  if only and seen ~= only then return end
  loom.manual_seed(5)
  local ok, err = pcall(f)
  if ok then passed = passed + 1 else failed = failed + 1 end
  print((ok and "ok   " or "FAIL ") .. what .. (ok and "" or ": " .. tostring(err)))
end

-- forward and the gradients of the inputs marked in which, CPU vs CUDA
local function fw_bw(tol, f, inputs, which)
  local w = function(out) loom.manual_seed(99) return loom.randn(out:size()) end
  local oc, gc = G.grads("cpu", f, inputs, which, w)
  local og, gg = G.grads("cuda", f, inputs, which, w)
  G.close(oc, og, tol, "forward")
  for i in pairs(which) do G.close(gc[i], gg[i], tol, "gradient of input " .. i) end
end

local function attention(dt, D, L, S, opts)
  local q, k, v = loom.randn({ 1, 2, L, D }):to(dt), loom.randn({ 1, 2, S, D }):to(dt), loom.randn({ 1, 2, S, D }):to(dt)
  local inputs = { q, k, v }
  if opts.mask then inputs[4] = loom.rand({ L, S }):lt(0.8) end
  local tol = dt == "f32" and 2e-5 or dt == "f16" and 5e-3 or 2e-2
  fw_bw(tol, function(a, b, c, m)
    return F.scaled_dot_product_attention(a, b, c, { is_causal = opts.causal, attn_mask = m })
  end, inputs, { true, true, true })
end

if want.attention then
  case("attention bf16, head dim 64, 64 x 64, causal: forward and backward", function()
    attention("bf16", 64, 64, 64, { causal = true })
  end)
end

if want.ops then
  for _, dt in ipairs({ "f32", "bf16", "f16" }) do
    case("attention " .. dt .. ", head dims 64 and 128, causal and masked", function()
      attention(dt, 64, 70, 100, { causal = true })
      attention(dt, 128, 40, 70, { mask = true })
    end)
  end
  case("attention bf16, head dim 256 (two blocks per row tile)", function() attention("bf16", 256, 40, 70, {}) end)
  case("cross entropy f32 and bf16, smoothed", function()
    for _, dt in ipairs({ "f32", "bf16" }) do
      local x, t = (loom.randn({ 8, 1000 }) * 3):to(dt), loom.randint(1, 1001, { 8 }, { dtype = "i64" })
      fw_bw(G.tol[dt], function(a, b) return F.cross_entropy(a, b, { label_smoothing = 0.1 }) end, { x, t }, { true })
    end
  end)
  case("layer norm, rms norm, softmax, rope", function()
    local x, w, b = loom.randn({ 64, 256 }), loom.randn({ 256 }), loom.randn({ 256 })
    fw_bw(5e-5, function(a, c, d) return F.layer_norm(a, { 256 }, c, d) end, { x, w, b }, { true, true, true })
    fw_bw(5e-5, function(a, c) return F.rms_norm(a, { 256 }, c) end, { x, w }, { true, true })
    fw_bw(2e-5, function(a) return a:log_softmax(-1) end, { x }, { true })
    local cos, sin = F.rope_tables(16, 64)
    fw_bw(G.tol.bf16, function(a, c, d) return F.apply_rotary_emb(a, c, d) end,
          { loom.randn({ 2, 16, 4, 64 }):to("bf16"), cos, sin }, { true })
  end)
  case("matmul f32, bf16 and a batched transpose", function()
    local a, b = loom.randn({ 96, 64 }), loom.randn({ 64, 80 })
    G.check(2e-5, function(x, y) return x:matmul(y) end, a, b)
    G.check(G.tol.bf16, function(x, y) return x:matmul(y) end, a:to("bf16"), b:to("bf16"))
    G.check(2e-5, function(x, y) return x:matmul(y:transpose(2, 3)) end, loom.randn({ 3, 8, 32 }), loom.randn({ 3, 16, 32 }))
  end)
  case("a bf16 training step of a small Llama: loss and a parameter after AdamW, against the CPU", function()
    local tr = loom.models.transformer
    local cfg = { vocab_size = 64, dim = 64, n_layers = 2, n_heads = 2, max_seq_len = 32 }
    local x = loom.randint(1, 65, { 2, 32 }, { dtype = "i64" })
    local y = loom.randint(1, 65, { 2, 32 }, { dtype = "i64" })
    local out = {}
    for _, dev in ipairs({ "cpu", "cuda" }) do
      loom.manual_seed(3)
      local model = loom.device(dev):use(tr.new, cfg)
      local opt = loom.optim.AdamW(model:parameters(), { lr = 1e-3 })
      local loss = loom.autocast("bf16", function() return F.cross_entropy(model(x:to(dev)), y:to(dev)) end)
      loss:backward()
      opt:step()
      out[dev] = { loss = loss:item(), p = model:parameters()[1]:to("cpu") }
    end
    assert(math.abs(out.cpu.loss - out.cuda.loss) <= 2e-2 * math.abs(out.cpu.loss),
           ("loss cpu %.5f, cuda %.5f"):format(out.cpu.loss, out.cuda.loss))
    G.device = "cpu"
    G.close(out.cpu.p, out.cuda.p, 1e-3, "the first parameter after one AdamW step")
    G.device = "cuda"
  end)
end

if want.nccl then
  case("NCCL in one process: all_reduce, broadcast, all_gather, reduce_scatter; no CUDA error left", function()
    local dist, ffi = require("loom.distributed"), require("ffi")
    ffi.cdef("int lm_smoke_peek(void) asm(\"cudaPeekAtLastError\");")
    local mesh = dist.init_device_mesh("cuda", { 1 })
    local x = loom.arange(1, 9, 1, { dtype = "f32" }):to("cuda")
    local r = dist.all_reduce(x * 2)
    assert(r:sum():item() == 72, "all_reduce: " .. r:sum():item())
    local b = dist.broadcast(x + 1, 0)
    assert(b:sum():item() == 44, "broadcast")
    assert(dist.all_gather(x):sum():item() == 36, "all_gather")
    assert(dist.reduce_scatter(x):sum():item() == 36, "reduce_scatter")
    local a = dist.all_reduce(x, "sum", nil, nil, { async_op = true }) -- waited for through its event
    assert(a:wait():sum():item() == 36, "an async all_reduce")
    assert((r + 1):sum():item() == 80, "a kernel after the waits")
    assert(loom.C.lm_smoke_peek() == 0, "a CUDA error left behind: " .. loom.C.lm_smoke_peek())
    assert(mesh ~= nil)
  end)
end

if only and passed + failed == 0 then
  print(("gpu_smoke: no case %d: %d selected"):format(only, seen))
  os.exit(3)
end
print(("gpu_smoke: %d passed, %d failed"):format(passed, failed))
os.exit(failed == 0 and 0 or 1)
