-- layout_agreement_spec.lua: ranks that disagree on a layout end in one
-- clear error on every rank, naming the rank and the difference, instead
-- of a silent wrong loss or a hang: a pipeline's schedule, microbatch
-- count or cut (checked when the schedule is made), context parallelism's
-- rotate method (checked at the first context_parallel call), any value
-- (dist.agree). Runs on 2 and 4 ranks.
local loom = require("loom")
local dist = require("loom.distributed")
local pp = require("loom.distributed.pipelining")
local cp = require("loom.distributed.context_parallel")
local H = require("support.tp")

local last = H.ws - 1

describe("ranks that disagree on a layout", function()
  it("dist.agree: equal values pass; a differing one is an error naming the rank and both values", function()
    dist.agree("a setting", "same")
    local ok, err = pcall(dist.agree, "a setting", H.rank == last and "theirs" or "ours")
    assert.is_false(ok)
    assert.matches('a setting differ between the ranks: rank 0 of the group has "ours", rank ' .. last
                   .. ' has "theirs"', err, 1, true)
  end)

  it("a pipeline schedule with another microbatch count or kind on one rank is refused on every rank", function()
    local mesh = dist.init_device_mesh("cpu", { H.ws }, { mesh_dim_names = { "pp" } })
    loom.manual_seed(1)
    local model = loom.nn.Sequential(loom.nn.Linear(4, 4), loom.nn.Linear(4, 4), loom.nn.Linear(4, 4), loom.nn.Linear(4, 4))
    local pipe = pp.pipeline(model, { num_stages = H.ws })
    local stage = pipe:build_stage(H.rank, { group = mesh, mesh_dim = "pp" })
    local loss = function(out, y) return (out - y):pow(2):mean() end
    local ok, err = pcall(pp.Schedule1F1B, stage, H.rank == last and 4 or 2, loss)
    assert.is_false(ok)
    assert.matches("rank " .. last .. ' has "Schedule1F1B, 4 microbatches', tostring(err), 1, true)
    local make = H.rank == last and pp.ScheduleGPipe or pp.Schedule1F1B
    ok, err = pcall(make, stage, 2, loss)
    assert.is_false(ok)
    assert.matches("ScheduleGPipe", tostring(err), 1, true)
    assert.is_not_nil(pp.Schedule1F1B(stage, 2, loss))   -- agreeing ranks go on
  end)

  it("context parallelism with another rotate method on one rank is refused on every rank", function()
    local mesh = dist.init_device_mesh("cpu", { H.ws }, { mesh_dim_names = { "cp" } })
    cp.set_rotate_method(H.rank == last and "alltoall" or "allgather")
    local x = loom.randn(1, 4 * H.ws)
    local ok, err = pcall(cp.context_parallel, mesh, { buffers = { x }, buffer_seq_dims = { 2 } }, function() end)
    cp.set_rotate_method("allgather")
    assert.is_false(ok)
    assert.matches("rotate methods differ", tostring(err), 1, true)
  end)
end)
