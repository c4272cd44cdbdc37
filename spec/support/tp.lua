-- tp.lua: shared by the tensor-parallel specs (`local H = require
-- "support.tp"`). The ground truth is the unsharded model, built on every
-- rank from the same seed; the parallel model is built from the same seed
-- and parallelized. It also gives the torch.chunk math, comm-count and
-- world-size helpers of support/dist.lua (H.chunk_of, H.check_counts, H.ws).
-- Tolerances: f32 rtol 1.3e-6 / atol 1e-5 (PyTorch's defaults for float32
-- in assert_close, with atol loosened for sums over ranks); f64 rtol 1e-12 /
-- atol 1e-12.
local loom = require("loom")
local dist = require("loom.distributed")
local D = require("support.dist")

local H = {}
H.ws, H.rank = D.ws, D.rank
H.chunk_of, H.check_counts = D.chunk_of, D.check_counts
H.RTOL, H.ATOL = 1.3e-6, 1e-5
H.RTOL64, H.ATOL64 = 1e-12, 1e-12

-- a 1-D mesh over the whole world
function H.world_mesh() return dist.init_device_mesh("cpu", { H.ws }, { mesh_dim_names = { "tp" } }) end

-- two objects made alike from the same seed: the reference and the one to
-- parallelize (make(...) builds one, e.g. a module)
function H.twins(seed, make, ...)
  loom.manual_seed(seed)
  local ref = make(...)
  loom.manual_seed(seed)
  return ref, make(...)
end

-- MLP(d, h): Linear(d, h)-ReLU-Linear(h, d) as net1, relu, net2, the MLP of
-- PyTorch's tensor-parallel tests
H.MLP = loom.nn.Module:extend("TPTestMLP")
function H.MLP:__init(d, h)
  self.net1 = loom.nn.Linear(d, h)
  self.relu = loom.nn.ReLU()
  self.net2 = loom.nn.Linear(h, d)
end
function H.MLP:forward(x) return self.net2(self.relu(self.net1(x))) end

-- a plain tensor: DTensors are gathered (collective: every rank calls it)
function H.full(x)
  if x == nil then return nil end
  if dist.is_dtensor(x) then return x:full_tensor() end
  return x
end

-- got (tensor or DTensor) close to want (plain): |got - want| <= atol + rtol |want|
-- elementwise; appends a message to bad otherwise. Collective when got is a DTensor.
function H.close(bad, what, got, want, rtol, atol)
  rtol, atol = rtol or H.RTOL, atol or H.ATOL
  if got == nil or want == nil then
    if got ~= want then bad[#bad + 1] = what .. ": one side is nil" end
    return bad
  end
  got = H.full(got)
  if table.concat(got:size(), ",") ~= table.concat(want:size(), ",") then
    bad[#bad + 1] = string.format("%s: size %s, want %s", what, D.sizes(got), D.sizes(want))
    return bad
  end
  if want:numel() == 0 then return bad end
  local g, w = got:detach():to("f64"), want:detach():to("f64")
  local excess = ((g - w):abs() - w:abs() * rtol):max():item()
  if not (excess <= atol) then
    bad[#bad + 1] = string.format("%s: max (|diff| - rtol |want|) = %g > atol %g (max |diff| %g)", what, excess, atol,
                                  (g - w):abs():max():item())
  end
  return bad
end

-- asserts H.close: got close to want, else fails with its message
function H.assert_close(what, got, want, rtol, atol)
  require("luassert").same({}, H.close({}, what, got, want, rtol, atol))
end

-- scalar a close to b: |a - b| <= rtol |b| + 1e-9; appends a message to bad otherwise
function H.close_num(bad, what, a, b, rtol)
  if not (math.abs(a - b) <= rtol * math.abs(b) + 1e-9) then
    bad[#bad + 1] = string.format("%s: %.10g vs %.10g", what, a, b)
  end
  return bad
end

-- the ("dp", "tp") meshes a world can make: 2x2 on 4 ranks, 2x1 and 1x2 on
-- 2, ws x 1 otherwise; each {shape = {dp, tp}, mesh = DeviceMesh}
function H.dp_tp_meshes()
  local ws = H.ws
  local shapes = ws == 4 and { { 2, 2 } } or ws == 2 and { { 2, 1 }, { 1, 2 } } or { { ws, 1 } }
  local meshes = {}
  for i, s in ipairs(shapes) do
    meshes[i] = { shape = s, mesh = dist.init_device_mesh("cpu", s, { mesh_dim_names = { "dp", "tp" } }) }
  end
  return meshes
end

-- a Llama small enough for every layout above
H.TINY_LLAMA = { vocab_size = 8, dim = 16, n_layers = 2, n_heads = 4, max_seq_len = 16 }

-- train_vs_one(bad, mesh, ref, m, n, batch, make_loss) -> the optimizers of
-- m and ref: n steps of AdamW with clipping on both, m (parallel over
-- mesh's "dp" dim) fed this dp rank's rows of the reference's batch; the
-- loss averaged over dp and the grad norm must equal the reference's
function H.train_vs_one(bad, mesh, ref, m, n, batch, make_loss)
  local ndp, dp = mesh:size("dp"), mesh:get_local_rank("dp")
  local o1 = loom.optim.AdamW(m:parameters(), { lr = 1e-2 })
  local o2 = loom.optim.AdamW(ref:parameters(), { lr = 1e-2 })
  for step = 1, n do
    local x, y = batch(step, ndp)
    o2:zero_grad()
    local lossr = make_loss(ref, x, y, false)
    lossr:backward()
    local nr = loom.nn.utils.clip_grad_norm_(ref:parameters(), 0.5)
    o2:step()
    o1:zero_grad()
    local rows = x:size(1) / ndp
    local loss = make_loss(m, x:narrow(1, dp * rows + 1, rows), y:narrow(1, dp * rows + 1, rows), true)
    local lavg = dist.all_reduce(loss:detach():reshape(1), "avg", mesh, "dp")
    local nm = loom.nn.utils.clip_grad_norm_(m:parameters(), 0.5)
    o1:step()
    H.close(bad, "loss at step " .. step, lavg:reshape(1), lossr:detach():reshape(1))
    H.close_num(bad, "grad norm at step " .. step, nm, nr, 1e-5)
    if step == 1 and not (nr > 0.5) then bad[#bad + 1] = "the norm should exceed max_norm so that clipping acts" end
  end
  return o1, o2
end

-- ids and targets of step (2 rows per dp rank) for H.TINY_LLAMA
function H.llama_batch(step, ndp)
  loom.manual_seed(100 + step)
  local v = H.TINY_LLAMA.vocab_size
  return loom.randint(1, v + 1, { 2 * ndp, 8 }), loom.randint(1, v + 1, { 2 * ndp, 8 })
end

-- the cross-entropy of model on x, y; parallel: under loss_parallel (the
-- logits sharded on the vocabulary), its backward already done
function H.llama_loss(model, x, y, parallel)
  if not parallel then return loom.F.cross_entropy(model(x), y) end
  return require("loom.parallel").loss_parallel(function()
    local l = loom.F.cross_entropy(model(x), y)
    l:backward()
    return l
  end)
end

-- the parameter at fqn ("a.b.weight") of module m
function H.param(m, fqn)
  local path, leaf = fqn:match("^(.*)%.([^.]+)$")
  if not path then return m[fqn] end
  return m:get_submodule(path)[leaf]
end

-- every parameter of the parallel model m against ref's (values, and
-- gradients with grads=true); collective.
function H.compare_params(bad, what, m, ref, grads, rtol, atol)
  for _, kv in ipairs(ref:named_parameters()) do
    local p = H.param(m, kv[1])
    if grads then
      if (p.grad == nil) ~= (kv[2].grad == nil) then
        bad[#bad + 1] = string.format("%s %s: grad is %s, want %s", what, kv[1], tostring(p.grad ~= nil),
                                      tostring(kv[2].grad ~= nil))
      elseif p.grad ~= nil then
        H.close(bad, what .. " grad " .. kv[1], p.grad, kv[2].grad, rtol, atol)
      end
    else
      H.close(bad, what .. " " .. kv[1], p, kv[2], rtol, atol)
    end
  end
  return bad
end

-- one step of optimizer Opt (loom.optim.SGD, AdamW) with opts on the
-- parallel model m and on ref, then every parameter compared; collective
function H.step_both(bad, Opt, opts, m, ref)
  Opt(m:parameters(), opts):step()
  Opt(ref:parameters(), opts):step()
  return H.compare_params(bad, "after step", m, ref, false)
end

-- captures what fn writes to io.stderr (on this rank); returns text, fn's results
function H.capture_stderr(fn)
  local real = io.stderr
  local buf = {}
  local fake = setmetatable({}, { __index = function(_, k)
    if k == "write" then return function(self, ...) for _, s in ipairs { ... } do buf[#buf + 1] = tostring(s) end return self end end
    local v = real[k]
    if type(v) == "function" then return function(_, ...) return v(real, ...) end end
    return v
  end })
  io.stderr = fake   -- luacheck: ignore 122 (captured while fn runs)
  local res = { pcall(fn) }
  io.stderr = real   -- luacheck: ignore 122
  if not res[1] then error(res[2], 0) end
  return table.concat(buf), unpack(res, 2)
end

return H
