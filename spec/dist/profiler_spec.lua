-- profiler_spec.lua (dist): loom.profiler on every rank: each writes its
-- own trace (the rank before the extension), valid Chrome trace JSON with
-- pid = rank, its all_reduce with its bytes and group and the split of its
-- time into waiting for the peers and moving data, the all_gather a
-- DTensor op runs inside it, the step marks; rank 0 draws
-- the timeline with one row per rank. Every rank runs every collective
-- before any assertion, so a failure never leaves a rank waiting.
local loom = require("loom")
local TJ = require("support.trace_json")
local dist = require("loom.distributed")
local H = require("support.dist")
local profiler = require("loom.profiler")

local find = TJ.find

describe("loom.profiler on every rank", function()
  it("writes a trace per rank with the collectives' bytes, groups and waits, and one timeline", function()
    local dir = H.scratch_dir("profiler")
    local mesh = dist.init_device_mesh("cpu", { H.ws })
    local x = loom.arange(H.ws * 6):view(H.ws * 2, 3):to("f32")
    local d = dist.distribute_tensor(x, mesh, { dist.Shard(1) }, { src_data_rank = nil })
    local t = loom.ones(1000)
    profiler.start { path = dir .. "/t.json", quiet = true }
    local sum = dist.all_reduce(t, "sum", mesh)
    profiler.step()
    local sm = d:softmax(1)   -- over the sharded dim: the op gathers it first
    local res = profiler.stop()
    local full = sm:full_tensor()
    local ok, j = TJ.read(dir .. "/t." .. H.rank .. ".json")
    local png = io.open(dir .. "/t.png", "rb")
    local png_head = png and png:read(8)
    if png then png:close() end
    H.on0(function() end)   -- every rank has read before rank 0 removes the folder
    H.on0(function() os.execute("rm -rf '" .. dir .. "'") end)

    assert.equal(H.ws, sum:max():item())
    assert.is_true((full - x:softmax(1)):abs():max():item() < 1e-6)
    assert.equal(dir .. "/t." .. H.rank .. ".json", res.trace)
    assert.is_true(ok, tostring(j))
    local ar = find(j, { name = "all_reduce", cat = "collective", ph = "X" })
    assert.equal(1, #ar)
    local a = ar[1].args
    assert.equal(4000, a.bytes)
    assert.equal(H.ws, a.group_size)
    assert.equal(H.rank, a.group_rank)
    assert.equal(H.rank, ar[1].pid)
    assert.equal(H.ws, #a.group)
    assert.is_true(a.peers_wait_ms >= 0 and a.transfer_ms >= 0, "no wait split")
    assert.is_true(math.abs(a.peers_wait_ms + a.transfer_ms - ar[1].dur / 1e3) < 1e-3)
    -- the all_gather of the softmax's input, inside the op
    local ag = find(j, { name = "all_gather", cat = "collective" })
    assert.equal(1, #ag)
    local host
    for _, e in ipairs(find(j, { cat = "op", ph = "X" })) do
      if e.ts <= ag[1].ts and ag[1].ts + ag[1].dur <= e.ts + e.dur + 1e-3 then host = e end
    end
    assert.is_table(host, "the all_gather ran in no op")
    assert.equal(1, #find(j, { name = "ProfilerStep#1", ph = "X" }))
    assert.equal(1, #find(j, { name = "ProfilerStep#2", ph = "X" }))
    if H.rank == 0 then
      assert.equal("\137PNG\r\n\26\n", png_head)
      assert.equal(dir .. "/t.png", res.png)
    end
  end)
end)
