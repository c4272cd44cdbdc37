-- fsdp_checkpoint_spec.lua: distributed checkpoints move between layouts:
-- FSDP x TP (2-D DTensors) -> TP -> a plain model on every rank (what one
-- process holds) -> FSDP x TP again, model and AdamW state, and the
-- reloaded FSDP model trains on exactly as the one that was saved.
-- loom.load reads the FSDP checkpoint as whole tensors (one process).
-- Meshes: {dp, tp} 2x2 on 4 ranks, 2x1 on 2, 1x1 on 1. Data only moves,
-- so values compare exactly; the step after reloading too (the same
-- computation on the same layout).
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local fsdp = require("loom.distributed.fsdp")
local H, sys = require("support.tp"), require("support.sys")
local ck = dist.checkpoint
local tr = loom.models.transformer

local ws = H.ws
local shape = ws == 4 and { 2, 2 } or { ws, 1 }
local mesh = dist.init_device_mesh("cpu", shape, { mesh_dim_names = { "dp", "tp" } })
local ntp = shape[2]
local cfg = { vocab_size = 8, dim = 16, n_layers = 2, n_heads = 4, max_seq_len = 16 }

local D = require("support.dist")
local ROOT = D.scratch_dir("fsdp-ckpt")
local on0 = D.on0
teardown(function() on0(function() sys.rmtree(ROOT) end) end)

-- the model in a layout: "fsdp" (TP on mesh["tp"], then fully_shard over
-- mesh["dp"]), "tp" (TP only), "one" (plain); seeds differ so that a load
-- has to change every value
local function build(kind, seed)
  loom.manual_seed(seed)
  local m = tr.new(cfg)
  if kind ~= "one" and ntp > 1 then
    tp.parallelize_module(m, mesh["tp"], tr.tp_plan({ sequence_parallel = true, loss_parallel = false, tp = ntp }, m))
  end
  if kind == "fsdp" then
    for _, b in m.layers:ipairs() do fsdp.fully_shard(b, { mesh = mesh["dp"] }) end
    fsdp.fully_shard(m, { mesh = mesh["dp"] })
  end
  return m, loom.optim.AdamW(m:parameters(), { lr = 1e-2 })
end

-- one step on this rank's rows of a batch both layouts see alike
local function step(m, opt, s)
  loom.manual_seed(500 + s)
  local ndp, dp = mesh:size("dp"), mesh:get_local_rank("dp")
  local x = loom.randint(1, cfg.vocab_size + 1, { 2 * ndp, 8 }):narrow(1, 2 * dp + 1, 2)
  opt:zero_grad()
  loom.F.cross_entropy(m(x), x):backward()
  opt:step()
end

local function state(m, opt) return { model = m:state_dict(), optim = ck.optim_state_dict(opt) } end

local function load(m, opt, dir)
  local sd = state(m, opt)
  ck.load(sd, dir)
  ck.load_optim_state_dict(opt, sd.optim)
end

-- every parameter and AdamW moment of (m, opt) equals those of (want, wopt)
local function same(bad, what, m, opt, want, wopt)
  local wp = want:named_parameters()
  for i, kv in ipairs(m:named_parameters()) do
    if kv[1] ~= wp[i][1] then bad[#bad + 1] = what .. ": parameter " .. i .. " is " .. kv[1] .. " vs " .. wp[i][1] end
    local p, q = kv[2], wp[i][2]
    H.close(bad, what .. " " .. kv[1], p, H.full(q), 0, 0)
    for _, k in ipairs { "exp_avg", "exp_avg_sq" } do
      local a, b = opt.state[i][k], wopt.state[i][k]
      if p.dist ~= nil then a = dist.from_local(a, p.device_mesh, p.placements, { shape = p:size() }) end
      if q.dist ~= nil then b = dist.from_local(b, q.device_mesh, q.placements, { shape = q:size() }) end
      H.close(bad, what .. " " .. k .. " of " .. kv[1], a, H.full(b), 0, 0)
      if opt.state[i].step ~= wopt.state[i].step then bad[#bad + 1] = what .. " step of " .. kv[1] end
    end
  end
end

describe("checkpoints of fully_shard x TP", function()
  it(string.format("move FSDP %dx%d -> TP %d -> one process -> FSDP, with the AdamW state, and training goes on alike",
                   shape[1], shape[2], ntp), function()
    local bad = {}
    local f, fopt = build("fsdp", 1)
    step(f, fopt, 1)
    step(f, fopt, 2)
    ck.save(state(f, fopt), ROOT .. "/fsdp")

    local t, topt = build("tp", 2)
    load(t, topt, ROOT .. "/fsdp")
    same(bad, "TP from FSDP", t, topt, f, fopt)
    ck.save(state(t, topt), ROOT .. "/tp")

    local o, oopt = build("one", 3)
    load(o, oopt, ROOT .. "/tp")
    same(bad, "one process from TP", o, oopt, f, fopt)
    ck.save(state(o, oopt), ROOT .. "/one")

    local g, gopt = build("fsdp", 4)
    load(g, gopt, ROOT .. "/one")
    same(bad, "FSDP from one process", g, gopt, f, fopt)
    -- the reloaded model gathers the loaded values (not those it was built with)
    step(f, fopt, 3)
    step(g, gopt, 3)
    same(bad, "a step after reloading", g, gopt, f, fopt)
    assert.same({}, bad)
  end)

  it("reads as whole tensors in one process (loom.load)", function()
    local f, fopt = build("fsdp", 6)
    step(f, fopt, 1)
    ck.save({ model = f:state_dict() }, ROOT .. "/whole")
    local whole = loom.load(ROOT .. "/whole")
    local bad = {}
    for _, kv in ipairs(f:named_parameters()) do
      local w = whole.model[kv[1]]
      if w == nil or w.dist ~= nil then bad[#bad + 1] = kv[1] .. " is not a whole tensor"
      else H.close(bad, kv[1], kv[2], w, 0, 0) end
    end
    assert.same({}, bad)
  end)
end)
