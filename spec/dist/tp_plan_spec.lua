-- tp_plan_spec.lua: parallelize_module's plan handling: fnmatch wildcard
-- keys, the root key "", unmatched-key and no-plan warnings, the ambient
-- mesh (mesh:use), a model parallelizing its own children in its
-- constructor, and src_data_rank 0 / 1 / false. Runs on 1, 2 and 4 ranks.
-- Tolerance: f32 rtol 1.3e-6 / atol 1e-5.
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local H = require("support.tp")
local nn, Shard, Replicate = loom.nn, dist.Shard, dist.Replicate
local mesh, ws, me = H.world_mesh(), H.ws, H.rank

local Attn = nn.Module:extend("Attn")
function Attn:__init() self.wq = nn.Linear(8, 8) self.wk = nn.Linear(8, 8) self.wo = nn.Linear(8, 8) end
function Attn:forward(x) return self.wo(self.wq(x) * self.wk(x)) end
local FF = nn.Module:extend("FF")
function FF:__init() self.net1 = nn.Linear(8, 16) self.net2 = nn.Linear(16, 8) end
function FF:forward(x) return self.net2(loom.F.relu(self.net1(x))) end
local Block = nn.Module:extend("Block")
function Block:__init() self.attention = Attn() self.feed_forward = FF() end
function Block:forward(x) local h = x + self.attention(x) return h + self.feed_forward(h) end
local Net = nn.Module:extend("Net")
function Net:__init(n)
  local l = {}
  for i = 1, n or 3 do l[i] = Block() end
  self.layers = nn.ModuleList(l)
end
function Net:forward(x) for _, b in self.layers:ipairs() do x = b(x) end return x end

local function net_pair(seed) return H.twins(seed, Net) end

local function is_dt(m, fqn) return dist.is_dtensor(H.param(m, fqn)) end

local function fwd_bwd(bad, what, m, ref)
  loom.manual_seed(77)
  local x = loom.rand(4, 8)
  local y, yr = m(x), ref(x)
  H.close(bad, what .. " forward", y, yr)
  H.full(y):pow(2):sum():backward()
  yr:pow(2):sum():backward()
  H.compare_params(bad, what, m, ref, true)
end

describe("parallelize_module plans", function()
  it("wildcards: *, ? and [1-2] match FQN atoms between the dots", function()
    local ref, m = net_pair(1)
    tp.parallelize_module(m, mesh, {
      ["layers.*.attention.wq"] = tp.ColwiseParallel{ output_layouts = Replicate() },
      ["layers.[1-2].attention.wk"] = tp.ColwiseParallel{ output_layouts = Replicate() },
      ["layers.?.feed_forward"] = tp.PairwiseParallel{},
    })
    for i = 1, 3 do
      assert.is_true(is_dt(m, "layers." .. i .. ".attention.wq.weight"), "wq of layer " .. i)
      assert.is_true(is_dt(m, "layers." .. i .. ".feed_forward.net1.weight"), "net1 of layer " .. i)
      assert.is_false(is_dt(m, "layers." .. i .. ".attention.wo.weight"), "wo of layer " .. i)
    end
    assert.is_true(is_dt(m, "layers.1.attention.wk.weight") and is_dt(m, "layers.2.attention.wk.weight"))
    assert.is_false(is_dt(m, "layers.3.attention.wk.weight"))
    local bad = {}
    fwd_bwd(bad, "wildcards", m, ref)
    assert.same({}, bad)
  end)

  it("the root key \"\" applies to the module itself; nested keys to submodules", function()
    local ref, m = H.twins(3, nn.Linear, 8, 6)
    tp.parallelize_module(m, mesh, { [""] = tp.ColwiseParallel{ output_layouts = Replicate() } })
    assert.is_true(m.weight.placements[1] == Shard(1))
    loom.manual_seed(4)
    local x = loom.rand(3, 8)
    local bad = {}
    H.close(bad, "root", m(x), ref(x))
    -- a nested key "layers.2" (a whole block) with a root PrepareModuleInput
    local ref2, m2 = net_pair(2)
    tp.parallelize_module(m2, mesh, {
      [""] = tp.PrepareModuleInput{ input_layouts = { Replicate() }, desired_input_layouts = { Replicate() },
                                    use_local_output = true },
      ["layers.2.feed_forward"] = tp.PairwiseParallel{} })
    assert.is_true(is_dt(m2, "layers.2.feed_forward.net2.weight"))
    assert.is_false(is_dt(m2, "layers.1.feed_forward.net2.weight"))
    fwd_bwd(bad, "nested", m2, ref2)
    assert.same({}, bad)
  end)

  it("a key that matches nothing warns naming it (rank 0), the rest still applies", function()
    local _, m = net_pair(1)
    local text, ret = H.capture_stderr(function()
      return tp.parallelize_module(m, mesh, { ["layers.*.attention.wq"] = tp.ColwiseParallel{},
                                              ["layers.*.mlp"] = tp.ColwiseParallel{} })
    end)
    assert.equal(m, ret)
    assert.is_true(is_dt(m, "layers.1.attention.wq.weight"))
    if me == 0 then
      assert.matches('the plan key "layers%.%*%.mlp" matches no submodule', text)
      assert.is_nil(text:find("attention.wq", 1, true))
    else
      assert.equal("", text)
    end
  end)

  it("no plan warns and returns the module unchanged", function()
    local m = nn.Linear(4, 4)
    local w = m.weight
    local text, ret = H.capture_stderr(function() return tp.parallelize_module(m, mesh) end)
    assert.equal(m, ret)
    assert.equal(w, m.weight)
    assert.is_false(dist.is_dtensor(m.weight))
    if me == 0 then assert.matches("no parallelize_plan given; the module is unchanged", text) end
  end)

  it("the ambient mesh: mesh:use(fn) lets parallelize_module omit the mesh", function()
    loom.manual_seed(5)
    local ref = nn.Linear(8, 8)
    loom.manual_seed(5)
    local a = nn.Linear(8, 8)
    loom.manual_seed(5)
    local b = nn.Linear(8, 8)
    mesh:use(function()
      tp.parallelize_module(a, nil, tp.ColwiseParallel{ output_layouts = Replicate() })
      tp.parallelize_module(b, { [""] = tp.ColwiseParallel{ output_layouts = Replicate() } })
    end)
    assert.is_true(a.weight.device_mesh == mesh and b.weight.device_mesh == mesh)
    local x = loom.rand(2, 8)
    local bad = {}
    H.close(bad, "nil mesh", a(x), ref(x))
    H.close(bad, "mesh omitted", b(x), ref(x))
    assert.same({}, bad)
    assert.is_nil(dist.current_mesh())
    assert.error_matches(function() tp.parallelize_module(nn.Linear(2, 2), nil, tp.ColwiseParallel{}) end,
                         "no device_mesh given and no ambient mesh")
  end)

  it("a model may parallelize its own children in its constructor (inside mesh:use)", function()
    local PMLP = nn.Module:extend("ParallelMLP")
    function PMLP:__init()
      self.net1 = nn.Linear(10, 16)
      self.net2 = nn.Linear(16, 10)
      tp.parallelize_module(self, nil, { net1 = tp.ColwiseParallel{}, net2 = tp.RowwiseParallel{} })
    end
    function PMLP:forward(x) return self.net2(loom.F.relu(self.net1(x))) end
    local MLP = nn.Module:extend("PlainMLP")
    function MLP:__init() self.net1 = nn.Linear(10, 16) self.net2 = nn.Linear(16, 10) end
    MLP.forward = PMLP.forward
    loom.manual_seed(6)
    local ref = MLP()
    loom.manual_seed(6)
    local m = mesh:use(function() return PMLP() end)
    assert.is_true(m.net1.weight.placements[1] == Shard(1) and m.net2.weight.placements[1] == Shard(2))
    local bad = {}
    loom.manual_seed(7)
    local x = loom.rand(8, 10)
    local y, yr = m(x), ref(x)
    H.close(bad, "forward", y, yr)
    y:sum():backward()
    yr:sum():backward()
    H.compare_params(bad, "ctor", m, ref, true)
    assert.same({}, bad)
  end)
end)

describe("src_data_rank", function()
  -- each rank initialises differently: seed 100 + rank
  local function linear_of(rank)
    loom.manual_seed(100 + rank)
    return nn.Linear(6, 2 * ws)
  end
  local function own_linear() return linear_of(me) end
  -- mismatches of the parallel linear m's weight and bias against want's (exact)
  local function holds(m, want, bias_what)
    local bad = H.close({}, "weight", m.weight, want.weight, 0, 0)
    return H.close(bad, bias_what, m.bias, want.bias, 0, 0)
  end

  it("0 (the default): every rank gets its shard of rank 0's values", function()
    local m = own_linear()
    tp.parallelize_module(m, mesh, tp.ColwiseParallel{})
    assert.same({}, holds(m, linear_of(0), "bias"))
  end)

  it("1: rank 1's values (on one rank: an error, there is no rank 1)", function()
    local m = own_linear()
    if ws == 1 then
      assert.has_error(function() tp.parallelize_module(m, mesh, tp.ColwiseParallel{}, { src_data_rank = 1 }) end)
      return
    end
    tp.parallelize_module(m, mesh, tp.RowwiseParallel{}, { src_data_rank = 1 })
    assert.same({}, holds(m, linear_of(1), "bias (replicated)"))
  end)

  it("false (PyTorch's None): no communication, each rank keeps its own slice", function()
    local m = own_linear()
    local mine = linear_of(me)
    local cm = dist.comm_mode(function()
      tp.parallelize_module(m, mesh, { [""] = tp.ColwiseParallel{} }, { src_data_rank = false })
    end)
    assert.equal(0, cm:get_total_counts())
    local bad = {}
    H.close(bad, "local weight", m.weight:to_local(), H.chunk_of(mine.weight:detach(), 1, ws, me), 0, 0)
    H.close(bad, "local bias", m.bias:to_local(), H.chunk_of(mine.bias:detach(), 1, ws, me), 0, 0)
    assert.same({}, bad)
    -- and with the same seed everywhere, the model still equals the unsharded one
    local ref, m2 = H.twins(8, nn.Linear, 6, 4)
    tp.parallelize_module(m2, mesh, tp.ColwiseParallel{ output_layouts = Replicate() }, { src_data_rank = false })
    local x = loom.rand(3, 6)
    H.close(bad, "same seed", m2(x), ref(x))
    assert.same({}, bad)
  end)

  it("is handed to every style of a plan (SequenceParallel keeps local values)", function()
    local m = nn.Sequential(nn.Linear(4, 2 * ws), nn.Linear(2 * ws, 4))
    loom.no_grad(function()
      m[1].weight:copy_(loom.full({ 2 * ws, 4 }, me + 1))
      m[2].weight:copy_(loom.full({ 4, 2 * ws }, me + 1))
    end)
    tp.parallelize_module(m, mesh, { ["1"] = tp.ColwiseParallel{}, ["2"] = tp.RowwiseParallel{} }, { src_data_rank = 0 })
    local bad = {}
    H.close(bad, "net 1 from rank 0", m[1].weight, loom.full({ 2 * ws, 4 }, 1), 0, 0)
    H.close(bad, "net 2 from rank 0", m[2].weight, loom.full({ 4, 2 * ws }, 1), 0, 0)
    assert.same({}, bad)
  end)
end)
