-- misuse_dist_spec.lua: bad calls of loom.distributed (meshes, placements,
-- DTensor factories, from_local, distribute_tensor, redistribution,
-- collectives, checkpoints) and loom.parallel (styles, loss_parallel's
-- class ids, the vocabulary-parallel embedding's ids), each a Lua error
-- naming the argument and what was expected, raised alike on every rank
-- (no collective starts before the check), so the job goes on. Runs on 1,
-- 2 and 4 ranks. Misuse that could crash a process (wrong handles given
-- to collective ops) runs in child processes in misuse_ops_spec.lua: a
-- child of an mpirun rank would join its job.
local loom = require("loom")
local dist = require("loom.distributed")
local tp = require("loom.parallel")
local X = require("support.misuse")
local H = require("support.tp")
local nn, F = loom.nn, loom.F
local Shard, Replicate, Partial = dist.Shard, dist.Replicate, dist.Partial
local ws = H.ws
local mesh = H.world_mesh()
local R = { Replicate() }
local long = function(t) return loom.tensor(t, { dtype = "i64" }) end
local dt = function() return dist.distribute_tensor(loom.ones(4, 2 * ws), mesh, { Shard(2) }) end

local meshes = {
  title = "meshes",
  { "a gpu mesh", function() dist.init_device_mesh("gpu", { ws }) end, "init_device_mesh", "device_type", '"gpu"' },
  { "a mesh of too many ranks", function() dist.init_device_mesh("cpu", { ws + 1 }) end, "init_device_mesh", "mesh_shape", "the world has " .. ws },
  { "a mesh dim of 0", function() dist.init_device_mesh("cpu", { 0 }) end, "init_device_mesh", "mesh_shape[1]", "positive integer" },
  { "a fractional mesh dim", function() dist.init_device_mesh("cpu", { 1.5 }) end, "init_device_mesh", "mesh_shape[1]", "1.5" },
  { "a string mesh shape", function() dist.init_device_mesh("cpu", "x") end, "init_device_mesh", "mesh_shape", "positive integers" },
  { "two names for a 1-D mesh", function() dist.init_device_mesh("cpu", { ws }, { mesh_dim_names = { "a", "b" } }) end, "init_device_mesh", "mesh_dim_names", "1 names" },
  { "a name twice", function() dist.init_device_mesh("cpu", { ws, 1 }, { mesh_dim_names = { "a", "a" } }) end, "init_device_mesh", "mesh_dim_names", '"a" twice' },
  { "a number as a dim name", function() dist.init_device_mesh("cpu", { ws }, { mesh_dim_names = { 1 } }) end, "init_device_mesh", "mesh_dim_names[1]", "string" },
  { "a dim named like a field", function() dist.init_device_mesh("cpu", { ws }, { mesh_dim_names = { "size" } }) end, "init_device_mesh", '"size"', "field" },
  { "string options", function() dist.init_device_mesh("cpu", { ws }, "tp") end, "init_device_mesh", "options", "table" },
  { "slicing by a missing name", function() return mesh["dp"] end, "no dim named", '"dp"' },
  { "slicing an unnamed mesh", function() return dist.init_device_mesh("cpu", { ws })["tp"] end, "mesh_dim_names", "cannot be sliced" },
  { "size of mesh dim 2 of 1", function() mesh:size(2) end, "DeviceMesh:size", "mesh dim", "got 2" },
  { "size of mesh dim 0", function() mesh:size(0) end, "DeviceMesh:size", "mesh dim", "got 0" },
  { "size of a fractional mesh dim", function() mesh:size(1.5) end, "DeviceMesh:size", "mesh dim", "1.5" },
  { "the local rank on a missing dim", function() mesh:get_local_rank("x") end, "get_local_rank", '"x"' },
  { "use with a number", function() mesh:use(3) end, "DeviceMesh:use", "function" },
}

local placements = {
  title = "placements",
  { "Shard(0)", function() Shard(0) end, "Shard", "dim", "non-zero integer" },
  { "Shard(1.5)", function() Shard(1.5) end, "Shard", "dim", "1.5" },
  { "Shard of a string", function() Shard("x") end, "Shard", "dim", '"x"' },
  { "Partial(\"prod\")", function() Partial("prod") end, "Partial", "reduce_op", '"prod"' },
  { "two placements on a 1-D mesh", function() dist.distribute_tensor(loom.ones(2), mesh, { R[1], R[1] }) end, "distribute_tensor", "placements", "1 placements" },
  { "a string among the placements", function() dist.distribute_tensor(loom.ones(2), mesh, { "S" }) end, "distribute_tensor", "placements[1]", "Shard(d)" },
  { "Shard(3) of a 2-D tensor", function() dist.distribute_tensor(loom.ones(2, 2), mesh, { Shard(3) }) end, "distribute_tensor", "placements[1]", "2 dims" },
  { "Shard(-3) of a 2-D tensor", function() dist.distribute_tensor(loom.ones(2, 2), mesh, { Shard(-3) }) end, "distribute_tensor", "placements[1]", "Shard(dim=-3)" },
}

local factories = {
  title = "factories, from_local, distribute_tensor",
  { "dist.zeros with a negative size", function() dist.zeros({ -1 }, mesh, R) end, "zeros", "size", "non-negative" },
  { "dist.ones with a NaN size", function() dist.ones({ 0 / 0 }, mesh, R) end, "ones", "size", "nan" },
  { "dist.empty with a fractional size", function() dist.empty({ 2.5 }, mesh, R) end, "empty", "size", "2.5" },
  { "dist.zeros with an infinite size", function() dist.zeros(math.huge, mesh, R) end, "zeros", "size", "inf" },
  { "dist.zeros with a string size", function() dist.zeros("4", mesh, R) end, "zeros", "size", "table" },
  { "dist.rand with an integer dtype", function() dist.rand({ 2 }, mesh, R, { dtype = "i64" }) end, "rand", "dtype", "floating-point" },
  { "dist.randn with an integer dtype", function() dist.randn({ 2 }, mesh, R, { dtype = "i32" }) end, "randn", "dtype", "floating-point" },
  { "dist.full past i32", function() dist.full({ 2 }, 2 ^ 40, mesh, R, { dtype = "i32" }) end, "full", "value", "fits i32" },
  { "dist.full with a string value", function() dist.full({ 2 }, "x", mesh, R) end, "full", "value", "number" },
  { "dist.empty with a misspelt option", function() dist.empty({ 2 }, mesh, R, { dtyp = "f64" }) end, "empty", "options", "dtyp" },
  { "dist.zeros with a string mesh", function() dist.zeros({ 2 }, "mesh", R) end, "device_mesh", "DeviceMesh" },
  { "dist.zeros without a mesh", function() dist.zeros({ 2 }, nil, R) end, "zeros", "no device_mesh" },
  { "dist.ones sharded past its dims", function() dist.ones({ 2 }, mesh, { Shard(2) }) end, "ones", "placements[1]" },
  { "from_local of a number", function() dist.DTensor.from_local(3, mesh, R) end, "from_local", "local_tensor", "tensor" },
  { "from_local with a shape of the wrong length", function() dist.DTensor.from_local(loom.ones(2), mesh, R, { shape = { 2, 2 } }) end, "from_local", "shape", "1 sizes" },
  { "from_local with a negative shape", function() dist.DTensor.from_local(loom.ones(2), mesh, R, { shape = { -2 } }) end, "from_local", "size", "non-negative" },
  { "from_local with a misspelt option", function() dist.DTensor.from_local(loom.ones(2), mesh, R, { runcheck = true }) end, "from_local", "options", "runcheck" },
  { "distribute_tensor to Partial", function() dist.distribute_tensor(loom.ones(2), mesh, { Partial() }) end, "distribute_tensor", "Partial" },
  { "distribute_tensor of a DTensor", function() dist.distribute_tensor(dt(), mesh, R) end, "distribute_tensor", "already a DTensor" },
  { "distribute_tensor from rank ws", function() dist.distribute_tensor(loom.ones(2), mesh, R, { src_data_rank = ws }) end, "distribute_tensor", "src_data_rank", "got " .. ws },
  { "distribute_tensor from rank 0.5", function() dist.distribute_tensor(loom.ones(2), mesh, R, { src_data_rank = 0.5 }) end, "distribute_tensor", "src_data_rank", "0.5" },
  { "distribute_tensor with a misspelt option", function() dist.distribute_tensor(loom.ones(2), mesh, R, { src_rank = 0 }) end, "distribute_tensor", "options", "src_rank" },
  { "distribute_tensor of a number", function() dist.distribute_tensor(3, mesh, R) end, "distribute_tensor", "tensor" },
}

local dtensors = {
  title = "DTensors and collectives",
  { "a DTensor's size(0)", function() dt():size(0) end, "size", "dim", "got 0" },
  { "a DTensor's size(3)", function() dt():size(3) end, "size", "dim", "got 3" },
  { "redistribute with two placements", function() dt():redistribute(mesh, { R[1], R[1] }) end, "redistribute", "placements" },
  { "redistribute to another mesh", function() dt():redistribute(dist.init_device_mesh("cpu", { ws }), R) end, "redistribute", "another mesh" },
  { "redistribute to Shard(3) of 2 dims", function() dt():redistribute(mesh, { Shard(3) }) end, "redistribute", "placements[1]" },
  { "to_local of a plain tensor", function() loom.ones(2):to_local() end, "to_local", "DTensor" },
  { "full_tensor of a plain tensor", function() loom.ones(2):full_tensor() end, "full_tensor", "DTensor" },
  { "visualize_sharding of a 3-D DTensor", function() dist.visualize_sharding(dist.distribute_tensor(loom.ones(2, 2, 2), mesh, R)) end, "visualize_sharding", "3 dims" },
  { "all_reduce with op \"prod\"", function() dist.all_reduce(loom.ones(2), "prod", mesh, 1) end, "all_reduce", "op", '"prod"' },
  { "all_reduce of a number", function() dist.all_reduce(3, "sum", mesh, 1) end, "all_reduce", "tensor" },
  { "all_reduce over a string mesh", function() dist.all_reduce(loom.ones(2), "sum", "tp") end, "all_reduce", "mesh", "DeviceMesh" },
  { "all_reduce with number options", function() dist.all_reduce(loom.ones(2), "sum", mesh, 1, 3) end, "all_reduce", "options", "table" },
  { "all_gather over dim 0", function() dist.all_gather(loom.ones(2), 0, mesh, 1) end, "all_gather", "gather_dim" },
  { "all_gather with a negative full_size", function() dist.all_gather(loom.ones(2), 1, mesh, 1, { full_size = -1 }) end, "all_gather", "full_size", ">= 0" },
  { "reduce_scatter over a fractional dim", function() dist.reduce_scatter(loom.ones(2), "sum", 1.5, mesh, 1) end, "reduce_scatter", "scatter_dim" },
  { "all_to_all split over dim 0", function() dist.all_to_all(loom.ones(2), 0, 1, mesh, 1) end, "all_to_all", "split_dim" },
  { "broadcast from a string rank", function() dist.broadcast(loom.ones(2), "0", mesh, 1) end, "broadcast", "src", "integer" },
  { "broadcast from a fractional rank", function() dist.broadcast(loom.ones(2), 0.5, mesh, 1) end, "broadcast", "src" },
  { "a collective on mesh dim 2 of 1", function() dist.all_reduce(loom.ones(2), "sum", mesh, 2) end, "get_group", "mesh dim" },
}

-- a vocabulary-parallel (Rowwise) embedding of 4 * ws ids and a colwise head
local function vp_embedding()
  loom.manual_seed(7)
  local e = nn.Embedding(4 * ws, 3)
  tp.parallelize_module(e, mesh, tp.RowwiseParallel{ input_layouts = Replicate() })
  return e
end
local function sharded_logits()   -- (2, 4 * ws) logits sharded on the class dim
  return dist.distribute_tensor(loom.ones(2, 4 * ws), mesh, { Shard(2) })
end
local function ce(target, opts)
  return tp.loss_parallel(function() return F.cross_entropy(sharded_logits(), target, opts) end)
end
local V = 4 * ws

local parallel = {
  title = "tensor parallel: styles, loss_parallel, vocabulary-parallel ids",
  { "loss_parallel of a number", function() tp.loss_parallel(3) end, "loss_parallel", "fn", "function" },
  { "loss_parallel with class 0", function() ce(long({ 1, 0 })) end, "loss_parallel", "class 0", "[1, " .. V .. "]" },
  { "loss_parallel with a class past the vocabulary", function() ce(long({ V + 1, 1 })) end, "loss_parallel", "holds class " .. (V + 1), "outside [1, " .. V .. "]" },
  { "loss_parallel with a negative class", function() ce(long({ 1, -5 })) end, "loss_parallel", "class -5", "ignore_index" },
  { "loss_parallel with float targets", function() ce(loom.ones(2)) end, "loss_parallel", "class ids" },
  { "loss_parallel with too many targets", function() ce(long({ 1, 2, 3 })) end, "loss_parallel", "3 targets for 2 rows" },
  { "loss_parallel with NaN label_smoothing", function() ce(long({ 1, 2 }), { label_smoothing = 0 / 0 }) end, "loss_parallel", "label_smoothing", "[0, 1]" },
  { "loss_parallel with an unknown reduction", function() ce(long({ 1, 2 }), { reduction = "avg" }) end, "loss_parallel", "reduction", '"avg"' },
  { "loss_parallel with a fractional ignore_index", function() ce(long({ 1, 2 }), { ignore_index = 1.5 }) end, "loss_parallel", "ignore_index", "integer" },
  { "loss_parallel with a misspelt option", function() ce(long({ 1, 2 }), { label_smooth = 0.1 }) end, "loss_parallel", "options", "label_smooth" },
  { "loss_parallel of logits sharded on rows", function()
      tp.loss_parallel(function()
        return F.cross_entropy(dist.distribute_tensor(loom.ones(2 * ws, 4), mesh, { Shard(1) }), long({ 1 }))
      end)
    end, "loss_parallel", "Shard(-1)" },
  { "a vocabulary-parallel embedding of id 0", function() vp_embedding()(long({ 1, 0 })) end, "embedding", "0" },
  { "a vocabulary-parallel embedding of an id past the vocabulary", function() vp_embedding()(long({ V + 1 })) end, "embedding", tostring(V + 1) },
  { "ColwiseParallel with a string layout", function() tp.ColwiseParallel{ input_layouts = "R" } end, "ColwiseParallel", "input_layouts" },
  { "SequenceParallel over dim 0", function() tp.SequenceParallel{ sequence_dim = 0 } end, "SequenceParallel", "sequence_dim" },
  { "parallelize_module with a number plan", function() tp.parallelize_module(nn.Linear(2, 2), mesh, 42) end, "parallelize_plan" },
}

local function tmp_dir() return os.tmpname() .. ".ckpt" end
local checkpoints = {
  title = "checkpoints",
  { "checkpoint.save of a number", function() dist.checkpoint.save(3, tmp_dir()) end, "checkpoint.save", "state_dict", "table" },
  { "checkpoint.save to a number", function() dist.checkpoint.save({}, 3) end, "checkpoint.save", "dir", "directory name" },
  { "checkpoint.save to \"\"", function() dist.checkpoint.save({}, "") end, "checkpoint.save", "dir" },
  { "checkpoint.save of a function", function() dist.checkpoint.save({ f = print }, tmp_dir()) end, "checkpoint.save", "cannot checkpoint a function" },
  { "checkpoint.load into a number", function() dist.checkpoint.load(3, "/nonexistent") end, "checkpoint.load", "state_dict", "table" },
  { "checkpoint.load from a missing directory", function() dist.checkpoint.load({ w = loom.ones(2) }, "/nonexistent/ckpt") end, "checkpoint.load", "does not exist" },
  { "checkpoint.verify of a number", function() dist.checkpoint.verify(3) end, "checkpoint.verify", "dir", "directory name" },
}

describe("distributed misuse", function()
  X.groups(describe, it, { meshes, placements, factories, dtensors, parallel, checkpoints }, 90)

  it("every rank goes on after the errors: a collective still agrees", function()
    local s = dist.all_reduce(loom.tensor({ H.rank + 1 }), "sum", mesh, 1):item()
    assert.equal(ws * (ws + 1) / 2, s)
    local ok = ce(long({ 1, V }))   -- ids at both ends of the vocabulary are fine
    assert.is_true(ok:item() > 0)
    assert.same({ 1, 3 }, vp_embedding()(long({ V })):size())
  end)
end)
