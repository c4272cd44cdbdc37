-- pipeline_spec.lua: pipeline parallelism (loom.distributed.pipelining)
-- against one process. A small Llama (loom.models.transformer) is built
-- alike on every rank from one seed; the reference runs the whole batch,
-- the pipeline runs its stage of it in microbatches. Compared: the loss,
-- every parameter's gradient and the parameters after an SGD step, on the
-- pp layouts the world allows (pp = world on 2 ranks, pp4 and pp2 x tp2 on
-- 4), for GPipe, 1F1B and the interleaved schedule, with uneven stages.
-- Tolerance: f32, rtol 1e-5 / atol 1e-6 (microbatches sum the batch's
-- gradients in another order than one batch does).
--   scripts/loomrun -n 2 --quiet-others scripts/run_specs.lua -o plainTerminal spec/dist/pipeline_spec.lua
local loom = require("loom")
local dist = require("loom.distributed")
local pp = require("loom.distributed.pipelining")
local tp = require("loom.parallel")
local H = require("support.tp")
local Tr = require("loom.models.transformer")
local F = loom.F

local ws = dist.world_size()
local RTOL, ATOL = 1e-5, 1e-6
local V, B, S = 17, 8, 8

local function make(n_layers)
  return Tr.new { vocab_size = V, dim = 16, n_layers = n_layers, n_heads = 2, max_seq_len = S }
end

local function loss_fn(out, y) return F.cross_entropy(out:reshape(-1, V), y:reshape(-1)) end

local function batch()
  loom.manual_seed(11)
  return loom.randint(1, V + 1, { B, S }), loom.randint(1, V + 1, { B, S })
end

-- the reference's loss and gradients (by FQN), then params after SGD
local function reference(ref, x, y)
  local loss = loss_fn(ref(x), y)
  loss:backward()
  local grads = {}
  for _, kv in ipairs(ref:named_parameters()) do grads[kv[1]] = kv[2].grad end
  return loss:item(), grads
end

-- runs one step of `sched` and compares with the reference on this rank
local function check(bad, label, ref, stage_mods, sched, is_last)
  local x, y = batch()
  local want_loss, grads = reference(ref, x, y)
  local losses = {}
  sched:step(x, { target = y, losses = losses })
  if is_last then
    local s = 0
    for _, l in ipairs(losses) do s = s + l end
    H.close_num(bad, label .. " loss", s / #losses, want_loss, RTOL)
  end
  local params = {}
  for _, m in ipairs(stage_mods) do
    for _, kv in ipairs(m:named_parameters()) do
      params[#params + 1] = kv[2]
      H.close(bad, label .. " grad " .. kv[1], kv[2].grad, grads[kv[1]], RTOL, ATOL)
    end
  end
  loom.optim.SGD(params, { lr = 0.5 }):step()
  loom.optim.SGD(ref:parameters(), { lr = 0.5 }):step()
  local refp = {}
  for _, kv in ipairs(ref:named_parameters()) do refp[kv[1]] = kv[2] end
  for _, m in ipairs(stage_mods) do
    for _, kv in ipairs(m:named_parameters()) do
      H.close(bad, label .. " after step " .. kv[1], kv[2], refp[kv[1]], RTOL, ATOL)
    end
  end
  return bad
end

describe("pipeline parallelism", function()
  it("cuts a transformer at FQN split points, keeping the FQNs, uneven stages allowed", function()
    local m = make(3)
    local pipe = pp.pipeline(m, { split_spec = { ["layers.3"] = pp.SplitPoint.BEGINNING } })
    assert.equal(2, pipe.num_stages)
    assert.same({ "tok_embeddings", "layers.1", "layers.2" }, pipe:stage_fqns(0))
    assert.same({ "layers.3", "norm", "output" }, pipe:stage_fqns(1))
    local even = pp.pipeline(m, { num_stages = 2 })
    assert.same({ "tok_embeddings", "layers.1", "layers.2" }, even:stage_fqns(0))
    local names = {}
    for _, kv in ipairs(pipe:get_stage_module(1):named_parameters()) do names[#names + 1] = kv[1] end
    assert.equal("layers.3.attention_norm.weight", names[1])
    local ok, err = pcall(pp.pipeline, m, { split_spec = { ["layers.9"] = pp.SplitPoint.BEGINNING } })
    assert.is_false(ok)
    assert.matches('split_spec names "layers.9", which is not a part of the model', err, 1, true)
  end)

  it("interleaved 1F1B runs every (stage, microbatch) forward and backward once, forward first", function()
    for _, c in ipairs { { 2, 2, 4 }, { 4, 2, 8 }, { 2, 3, 4 }, { 1, 3, 2 } } do
      local P, v, n = c[1], c[2], c[3]
      for r = 0, P - 1 do
        local seen = {}
        for _, a in ipairs(pp.interleaved_actions(r, P, v, n)) do
          local key = a[1] .. ":" .. a[3]
          if a[2] == "F" then assert.is_nil(seen[key]) seen[key] = "F"
          else assert.equal("F", seen[key]) seen[key] = "B" end
        end
        local count = 0
        for _, st in pairs(seen) do assert.equal("B", st) count = count + 1 end
        assert.equal(v * n, count)
      end
    end
  end)

  it("one process running every stage in turn equals the unsplit model (interleaved on 1 rank)", function()
    if ws ~= 1 then return end
    local ref, m = H.twins(3, make, 3)
    local pipe = pp.pipeline(m, { num_stages = 3 })
    local stages, mods = {}, {}
    for i = 0, 2 do stages[i + 1] = pipe:build_stage(i) mods[i + 1] = stages[i + 1].submod end
    local bad = check({}, "looped", ref, mods, pp.ScheduleInterleaved1F1B(stages, 2, loss_fn), true)
    assert.same({}, bad)
  end)

  if ws == 2 or ws == 4 then
    for _, kind in ipairs { "ScheduleGPipe", "Schedule1F1B" } do
      for _, n_mb in ipairs { 1, 2, 4 } do
        it(string.format("pp%d %s with %d microbatches equals one process (loss, grads, SGD step)", ws, kind, n_mb), function()
          local ref, m = H.twins(3, make, ws + 1)   -- one stage holds two layers
          local pipe = pp.pipeline(m, { num_stages = ws })
          local st = pipe:build_stage(dist.rank())
          local bad = check({}, kind, ref, { st.submod }, pp[kind](st, n_mb, loss_fn), st.is_last)
          assert.same({}, bad)
        end)
      end
    end

    for _, kind in ipairs { "ScheduleInterleaved1F1B", "ScheduleLoopedBFS" } do
      it(kind .. ": two stages per rank equal one process", function()
        local ref, m = H.twins(3, make, 2 * ws)
        local pipe = pp.pipeline(m, { num_stages = 2 * ws })
        local me = dist.rank()
        local stages = { pipe:build_stage(me), pipe:build_stage(me + ws) }
        local sched = pp[kind](stages, 4, loss_fn)
        local bad = check({}, kind, ref, { stages[1].submod, stages[2].submod }, sched, me == ws - 1)
        assert.same({}, bad)
      end)
    end

    it("fails clearly when microbatches do not divide the batch", function()
      local m = make(ws)
      local st = pp.pipeline(m, { num_stages = ws }):build_stage(dist.rank())
      local sched = pp.ScheduleGPipe(st, 3, loss_fn)
      local x, y = batch()
      -- every rank is given the batch, so every rank fails before any waits
      local ok, err = pcall(sched.step, sched, x, { target = y })
      assert.is_false(ok)
      assert.matches("ScheduleGPipe.step: the batch of x (8 rows) must divide by n_microbatches (3)", err, 1, true)
    end)
  end

  if ws == 4 then
    it("pp2 x tp2 on a (pp, tp) mesh equals one process", function()
      local mesh = dist.init_device_mesh("cpu", { 2, 2 }, { mesh_dim_names = { "pp", "tp" } })
      local ref, m = H.twins(3, make, 3)
      local pipe = pp.pipeline(m, { num_stages = 2 })
      local st = pipe:build_stage(mesh:get_local_rank("pp"), { group = mesh, mesh_dim = "pp" })
      local plan = Tr.tp_plan({}, m)
      -- this stage's part of the plan: the keys naming modules it holds
      local mine = {}
      for k, style in pairs(plan) do
        local top = k:match("^[^.]+")
        if st.submod[top] then mine[k] = style end
      end
      tp.parallelize_module(st.submod, mesh["tp"], mine)
      -- what predict.lua says tp rank 0 holds (torch.chunk's larger share of the 17-row vocabulary), to the element
      local held = 0
      for _, p in ipairs(st.submod:parameters()) do held = held + (dist.is_dtensor(p) and p:to_local() or p):numel() end
      local P = require("loom.train.predict")
      -- ref is the whole model (m's twin); its plan and this stage's parts
      local predicted = P.params(ref, Tr.tp_plan({}, ref), { pp = 2, tp = 2, dp = 1, cp = 1 }, false,
                                 pp.pipeline(ref, { num_stages = 2 }):stage_fqns(st.stage_index))
      local bad = check({}, "pp2xtp2", ref, { st.submod }, pp.Schedule1F1B(st, 2, loss_fn), st.is_last)
      assert.same({}, bad)
      if mesh:get_local_rank("tp") == 0 then assert.equal(predicted, held) end   -- after every collective
    end)

    -- both dp ranks get the same batch, so FSDP's averaged gradients are the
    -- batch's: what is checked is that microbatches accumulate before FSDP
    -- reduces (one reduce-scatter, in the last backward)
    for _, kind in ipairs { "ScheduleGPipe", "Schedule1F1B" } do
      it("pp2 x FSDP2 on a (pp, dp) mesh, " .. kind .. " with 4 microbatches, equals one process", function()
        local fsdp = require("loom.distributed.fsdp")
        local mesh = dist.init_device_mesh("cpu", { 2, 2 }, { mesh_dim_names = { "pp", "dp" } })
        local ref, m = H.twins(3, make, 4)
        local st = pp.pipeline(m, { num_stages = 2 }):build_stage(mesh:get_local_rank("pp"), { group = mesh, mesh_dim = "pp" })
        for _, block in st.submod.layers:ipairs() do fsdp.fully_shard(block, { mesh = mesh["dp"] }) end
        fsdp.fully_shard(st.submod, { mesh = mesh["dp"] })
        local bad = {}
        local cm = dist.comm_mode(function()
          check(bad, "pp2xfsdp2", ref, { st.submod }, pp[kind](st, 4, loss_fn), st.is_last)
        end)
        assert.same({}, bad)
        -- one reduce-scatter per unit (2 blocks and the stage's root), not one per microbatch
        assert.equal(3, cm.counts.reduce_scatter)
        -- p2p bytes per step as predict.lua says them (B 8, S 8, dim 16, f32; both dp ranks the whole batch)
        local P = require("loom.train.predict")
        assert.equal(P.p2p_bytes(16, { pp = 2, tp = 1, dp = 1, cp = 1 }, st.stage_index, B, S), cm.bytes.send)
      end)
    end
  end
end)
