-- pipeline_checkpoint_spec.lua: dist.checkpoint across pipeline layouts.
-- Each stage saves only its layers (under the whole model's names) and the
-- AdamW state of its parameters (numbered as in the whole model:
-- checkpoint.param_index); save writes the union. Checked: a pp2 save
-- (pp2 on 2 ranks, pp2 x dp2 on 4) read in one process (loom.load of the
-- directory) equals the whole model's state and its optimizer's after the
-- same AdamW step; loaded at pp2 x tp2 (4 ranks) it equals them too; the
-- errors when ranks disagree name the rank. Data only moves and AdamW does
-- the same elementwise work per tensor, so comparisons are exact.
--   scripts/loomrun -n 2 --quiet-others scripts/run_specs.lua -o plainTerminal spec/dist/pipeline_checkpoint_spec.lua
--   scripts/loomrun -n 4 --quiet-others scripts/run_specs.lua -o plainTerminal spec/dist/pipeline_checkpoint_spec.lua
local loom = require("loom")
local dist = require("loom.distributed")
local pp = require("loom.distributed.pipelining")
local tp = require("loom.parallel")
local Tr = require("loom.models.transformer")
local H = require("support.dist")
local TH = require("support.tp")
local ck = dist.checkpoint

local ws, me = H.ws, H.rank
local V, B, S = 17, 4, 8
local ROOT = ws > 1 and H.scratch_dir("ppckpt-spec")
teardown(function() if ROOT then H.on0(function() require("support.sys").rmtree(ROOT) end) end end)

local function make() return Tr.new { vocab_size = V, dim = 16, n_layers = 3, n_heads = 2, max_seq_len = S } end
local function adamw(params) return loom.optim.AdamW(params, { lr = 0.01, weight_decay = 0.1 }) end

-- the whole model after one AdamW step on a batch's gradients, its
-- optimizer and the gradients by name
local function reference()
  loom.manual_seed(3)
  local ref = make()
  loom.manual_seed(11)
  local x, y = loom.randint(1, V + 1, { B, S }), loom.randint(1, V + 1, { B, S })
  loom.F.cross_entropy(ref(x):reshape(-1, V), y:reshape(-1)):backward()
  local grads = {}
  for _, kv in ipairs(ref:named_parameters()) do grads[kv[1]] = kv[2].grad:clone() end
  local opt = adamw(ref:parameters())
  opt:step()
  return ref, opt, grads
end

-- compares the state of a model and an optimizer (optim_state_dict form,
-- whole-model numbering) with the reference's; returns the mismatches
-- (in sorted order: full_tensor is a collective)
local function compare(bad, label, model_sd, optim_sd, ref, ref_opt, only)
  local rsd, names = ref:state_dict(), {}
  for name in pairs(rsd) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    if not only or only[name] then TH.close(bad, label .. " " .. name, model_sd[name], rsd[name], 0, 0) end
  end
  for n = 1, #ref_opt.params do
    local s = ref_opt.state[n]
    local got = optim_sd.state[n]
    if not only or got then
      if got == nil then bad[#bad + 1] = label .. ": no optimizer state " .. n
      else
        TH.close(bad, label .. " exp_avg " .. n, got.exp_avg, s.exp_avg, 0, 0)
        TH.close(bad, label .. " exp_avg_sq " .. n, got.exp_avg_sq, s.exp_avg_sq, 0, 0)
        if got.step ~= s.step then bad[#bad + 1] = label .. " step " .. n .. ": " .. tostring(got.step) end
      end
    end
  end
  return bad
end

if ws >= 2 then
  describe("dist.checkpoint of pipeline stages", function()
    local ref, ref_opt, grads = reference()
    local dir = ROOT and ROOT .. "/pp2"

    it("saves pp2 stages as one checkpoint that loom.load reads as the whole model", function()
      -- pp2 (x dp2 on 4 ranks: each stage's tensors held twice, written once)
      local mesh = dist.init_device_mesh("cpu", { 2, ws / 2 }, { mesh_dim_names = { "pp", "dp" } })
      loom.manual_seed(3)
      local st = pp.pipeline(make(), { num_stages = 2 }):build_stage(mesh:get_local_rank("pp"),
                                                                       { group = mesh, mesh_dim = "pp" })
      for _, kv in ipairs(st.submod:named_parameters()) do kv[2].grad = grads[kv[1]]:clone() end
      local opt = adamw(st.submod:parameters())
      opt:step()
      local index = ck.param_index(ref, st.submod)
      ck.save({ model = st.submod:state_dict(), optim = ck.optim_state_dict(opt, { param_index = index }), step = 1 }, dir)
      local bad = {}
      H.on0(function()
        local t = loom.load(dir)
        compare(bad, "one process", t.model, t.optim, ref, ref_opt)
        if t.step ~= 1 then bad[#bad + 1] = "step " .. tostring(t.step) end
      end)
      assert.same({}, bad)
    end)

    it("loads the pp2 save back into pp2 stages, each taking its own layers", function()
      local mesh = dist.init_device_mesh("cpu", { 2, ws / 2 }, { mesh_dim_names = { "pp", "dp" } })
      loom.manual_seed(99)   -- other weights, overwritten by the load
      local st = pp.pipeline(make(), { num_stages = 2 }):build_stage(mesh:get_local_rank("pp"),
                                                                       { group = mesh, mesh_dim = "pp" })
      local opt, index = adamw(st.submod:parameters()), ck.param_index(ref, st.submod)
      local sd = ck.load({ model = st.submod:state_dict(), optim = ck.optim_state_dict(opt, { param_index = index }) }, dir)
      ck.load_optim_state_dict(opt, sd.optim, { param_index = index })
      local mine = {}
      for _, kv in ipairs(st.submod:named_parameters()) do mine[kv[1]] = true end
      local bad = compare({}, "pp2", st.submod:state_dict(), ck.optim_state_dict(opt, { param_index = index }),
                          ref, ref_opt, mine)
      assert.same({}, bad)
      assert.is_true(next(mine) ~= nil)
    end)

    if ws == 4 then
      it("loads the pp2 save at pp2 x tp2, equal to the whole model", function()
        local mesh = dist.init_device_mesh("cpu", { 2, 2 }, { mesh_dim_names = { "pp", "tp" } })
        loom.manual_seed(99)
        local st = pp.pipeline(make(), { num_stages = 2 }):build_stage(mesh:get_local_rank("pp"),
                                                                         { group = mesh, mesh_dim = "pp" })
        local plan = {}
        for k, style in pairs(Tr.tp_plan({}, st.submod)) do
          if st.submod[k:match("^[^.]+")] then plan[k] = style end
        end
        tp.parallelize_module(st.submod, mesh["tp"], plan)
        local opt, index = adamw(st.submod:parameters()), ck.param_index(ref, st.submod)
        local sd = ck.load({ model = st.submod:state_dict(), optim = ck.optim_state_dict(opt, { param_index = index }) }, dir)
        ck.load_optim_state_dict(opt, sd.optim, { param_index = index })
        local mine, sharded = {}, 0
        for _, kv in ipairs(st.submod:named_parameters()) do
          mine[kv[1]] = true
          if dist.is_dtensor(kv[2]) then sharded = sharded + 1 end
        end
        local bad = compare({}, "pp2xtp2", st.submod:state_dict(), ck.optim_state_dict(opt, { param_index = index }),
                            ref, ref_opt, mine)
        assert.same({}, bad)
        assert.is_true(sharded > 0)
      end)
    end

    it("still names the rank when ranks disagree on a tensor or leave part of it out", function()
      local world = dist.init_device_mesh("cpu", { ws })
      local sd = { b = loom.zeros({ me == 1 and 3 or 2 }) }
      local err = H.err_of(function() ck.save(sd, ROOT .. "/bad1") end)
      assert.matches("b has another global size on rank 1 than on rank 0", err, 1, true)
      -- a tensor sharded over the world that the last rank leaves out
      local a = dist.from_local(loom.ones({ 2 }), world, { dist.Shard(1) })
      sd = me == ws - 1 and {} or { a = a }
      err = H.err_of(function() ck.save(sd, ROOT .. "/bad2") end)
      assert.matches("the blocks of a on the ranks that hold it (0", err, 1, true)
      assert.matches("not the " .. 2 * ws .. " of its global size", err, 1, true)
    end)
  end)
end

describe("checkpoint.param_index", function()
  it("numbers a stage's parameters as in the whole model, and refuses bad input", function()
    loom.manual_seed(3)
    local whole = make()
    local st = { submod = pp.pipeline(make(), { num_stages = 2 }):get_stage_module(1) }
    local index, names = ck.param_index(whole, st.submod), {}
    for i, kv in ipairs(whole:named_parameters()) do names[kv[1]] = i end
    for i, kv in ipairs(st.submod:named_parameters()) do assert.equal(names[kv[1]], index[i]) end
    assert.is_true(index[1] > 1)
    local opt = adamw(st.submod:parameters())
    assert.has_error(function() ck.optim_state_dict(opt, { param_index = { 1 } }) end)
    assert.has_error(function() ck.param_index(whole, 5) end)
  end)
end)
