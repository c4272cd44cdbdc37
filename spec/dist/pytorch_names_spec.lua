-- pytorch_names_spec.lua: torch.distributed's names in loom.distributed
-- (get_rank, get_world_size, init_process_group, ...), and the plan error
-- that says nn.Sequential's children are named from "1".
local loom = require "loom"
local dist = require "loom.distributed"
local tp = require "loom.parallel"

local ws = tonumber(os.getenv("OMPI_COMM_WORLD_SIZE") or "1")
local rank = tonumber(os.getenv("OMPI_COMM_WORLD_RANK") or "0")

describe("PyTorch's names in loom.distributed", function()
  it("get_rank and get_world_size, of the world and of a group", function()
    dist.init_process_group("gloo")
    assert.is_true(dist.is_available())
    assert.is_true(dist.is_initialized())
    assert.equal(rank, dist.get_rank())
    assert.equal(ws, dist.get_world_size())
    assert.equal(dist.rank(), dist.get_rank())
    local g = dist.world_group()
    assert.equal(rank, dist.get_rank(g))
    assert.equal(ws, dist.get_world_size(g))
    local ok, err = pcall(dist.get_rank, "world")
    assert.is_false(ok)
    assert.truthy(err:find("get_rank: argument 'group' expected a dist.Group or nil, got", 1, true)
                  or err:find("group", 1, true), err)
    dist.destroy_process_group()
  end)

  it("a plan with number keys says that nn.Sequential's children are named from \"1\"", function()
    local mesh = dist.init_device_mesh("cpu", { ws })
    local m = loom.nn.Sequential(loom.nn.Linear(4, 4 * ws), loom.nn.ReLU())
    local ok, err = pcall(tp.parallelize_module, m, mesh, { tp.ColwiseParallel{} })
    assert.is_false(ok)
    assert.truthy(err:find('nn.Sequential\'s children are named "1", "2", ... (1-based)', 1, true), err)
    tp.parallelize_module(m, mesh, { ["1"] = tp.ColwiseParallel{} })
    assert.equal("Shard(dim=1)", tostring(m[1].weight.placements[1]))
  end)
end)
