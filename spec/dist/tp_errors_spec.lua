-- tp_errors_spec.lua: the user errors of parallelize_module, the styles,
-- PrepareModuleInput/Output and tp_plan, each with the message that names
-- what went wrong. No collective runs before an error is raised, so every
-- rank raises alike. Runs on 1, 2 and 4 ranks.
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local H = require("support.tp")
local nn, tr = loom.nn, loom.models.transformer
local Shard, Replicate = dist.Shard, dist.Replicate
local mesh, ws = H.world_mesh(), H.ws

local Net = nn.Module:extend("ErrNet")
function Net:__init() self.norm = nn.LayerNorm(4) self.proj = nn.Linear(4, 4) self.act = nn.ReLU() end
function Net:forward(x) return self.proj(self.norm(x)) end

describe("parallelize_module errors", function()
  it("a 2-D mesh: says to pass mesh[\"tp\"]", function()
    local m2 = dist.init_device_mesh("cpu", { ws, 1 }, { mesh_dim_names = { "dp", "tp" } })
    assert.error_matches(function() tp.parallelize_module(nn.Linear(4, 4), m2, tp.ColwiseParallel{}) end,
                         'expected a 1%-D device mesh, got a 2%-D one; pass the tensor%-parallel sub%-mesh, e%.g%. mesh%["tp"%]')
    -- the 1-D sub-mesh works
    local m = nn.Linear(4, 4)
    tp.parallelize_module(m, m2["tp"], tp.ColwiseParallel{})
    assert.is_true(dist.is_dtensor(m.weight))
  end)

  it("an unsupported module names the style, the FQN and the type", function()
    assert.error_matches(function() tp.parallelize_module(Net(), mesh, { norm = tp.ColwiseParallel{} }) end,
                         "ColwiseParallel: norm is a LayerNorm")
    assert.error_matches(function() tp.parallelize_module(Net(), mesh, { act = tp.RowwiseParallel{} }) end,
                         "RowwiseParallel: act is a ReLU")
    assert.error_matches(function() tp.parallelize_module(Net(), mesh, { proj = tp.SequenceParallel{} }) end,
                         "SequenceParallel: proj is a Linear")
    assert.error_matches(function() tp.parallelize_module(nn.ReLU(), mesh, tp.ColwiseParallel{}) end,
                         "ColwiseParallel: the module is a ReLU")
  end)

  it("parallelizing the same submodule twice", function()
    local m = Net()
    tp.parallelize_module(m, mesh, { proj = tp.ColwiseParallel{} })
    assert.error_matches(function() tp.parallelize_module(m, mesh, { proj = tp.RowwiseParallel{} }) end,
                         "proj %(Linear%) is already parallelized by ColwiseParallel")
    -- twice through one plan (two keys matching the same module)
    assert.error_matches(function()
      tp.parallelize_module(Net(), mesh, { proj = tp.ColwiseParallel{}, ["p*"] = tp.ColwiseParallel{} })
    end, "already parallelized")
  end)

  it("a plan of the wrong type, a non-style value, a non-string key, a non-module", function()
    assert.error_matches(function() tp.parallelize_module(Net(), mesh, "colwise") end, "parallelize_plan")
    assert.error_matches(function() tp.parallelize_module(Net(), mesh, 42) end, "parallelize_plan")
    assert.error_matches(function() tp.parallelize_module(Net(), mesh, { proj = "colwise" }) end,
                         "parallelize_plan%[proj%].*ParallelStyle")
    assert.error_matches(function() tp.parallelize_module(Net(), mesh, { [1] = tp.ColwiseParallel{} }) end,
                         "string keys")
    assert.error_matches(function() tp.parallelize_module({}, mesh, tp.ColwiseParallel{}) end, "nn.Module")
    assert.error_matches(function() tp.parallelize_module(Net(), mesh, tp.ColwiseParallel{}, { src_data_rank = ws }) end,
                         "src_data_rank")
  end)

  it("bad style options", function()
    assert.error_matches(function() tp.ColwiseParallel{ input_layouts = "replicate" } end, "input_layouts")
    assert.error_matches(function() tp.RowwiseParallel{ output_layouts = 3 } end, "output_layouts")
    assert.error_matches(function() tp.SequenceParallel{ sequence_dim = 0 } end, "sequence_dim")
    assert.error_matches(function() tp.PrepareModuleInput{ input_layouts = { Shard(1) } } end,
                         "input_layouts and desired_input_layouts must be given together")
    assert.error_matches(function() tp.PrepareModuleOutput{} end, "output_layouts is required")
  end)

  it("PrepareModuleInput / Output length mismatches name both lengths", function()
    assert.error_matches(function()
      tp.PrepareModuleInput{ input_layouts = { Shard(1), Shard(1) }, desired_input_layouts = { Replicate() } }
    end, "PrepareModuleInput: input_layouts has 2 entries but desired_input_layouts has 1")
    assert.error_matches(function()
      tp.PrepareModuleOutput{ output_layouts = { Shard(1) }, desired_output_layouts = { Replicate(), Replicate(), Replicate() } }
    end, "PrepareModuleOutput: output_layouts has 1 entries but desired_output_layouts has 3")
    -- at call time: fewer inputs than layouts
    local m = nn.Linear(4, 4)
    tp.parallelize_module(m, mesh, tp.PrepareModuleInput{ input_layouts = { Replicate(), Replicate() },
                                                         desired_input_layouts = { Replicate(), Replicate() } })
    assert.error_matches(function() m(loom.rand(2, 4)) end, "PrepareModuleInput: the module got 1 inputs, input_layouts has 2")
    local m2 = nn.Linear(4, 4)
    tp.parallelize_module(m2, mesh, tp.PrepareModuleOutput{ output_layouts = { Replicate(), Replicate() },
                                                           desired_output_layouts = { Replicate(), Replicate() } })
    assert.error_matches(function() m2(loom.rand(2, 4)) end,
                         "PrepareModuleOutput: the module returned 1 outputs, output_layouts has 2")
  end)

  it("tp_plan: n_heads not divisible by the TP degree", function()
    loom.manual_seed(1)
    local m = tr.new { vocab_size = 8, dim = 24, n_layers = 1, n_heads = 3, max_seq_len = 8 }
    assert.error_matches(function() tr.tp_plan({ tp = 2 }, m) end,
                         "tp_plan: n_heads %(3%) must divide by the tensor%-parallel degree %(2%)")
    assert.has_no.errors(function() tr.tp_plan({ tp = 3 }, m) end)
  end)
end)
