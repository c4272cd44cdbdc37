-- jit_workload_dist.lua: the distributed half of jit_workload.lua, on 2
-- ranks (scripts/loomrun -n 2): TP with sequence and loss parallelism, DP
-- replicate, a 2-stage pipeline (train and eval), context parallelism,
-- distribute_tensor and redistribute, dist.checkpoint; then drops it all
-- and prints, per rank, "held: PATH" for each tensor a compiled trace keeps
-- and "storages: START -> END". Every loop compiles at once (hotloop=1, set
-- before loom loads: loomrun starts plain luajit).
jit.opt.start("hotloop=1", "maxtrace=60000", "maxmcode=262144")
local root = debug.getinfo(1, "S").source:match("^@(.*)spec/support/jit_workload_dist%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. root .. "spec/?.lua;" .. package.path
local loom = require("loom")
local H = require("support.retention")
local dist = require("loom.distributed")
local tp = require("loom.parallel")
local pp = require("loom.distributed.pipelining")
local cp = require("loom.distributed.context_parallel")
local nn, F = loom.nn, loom.F
local rank = dist.rank()
local start = tonumber(loom.C.lm_storage_count())

local function work(dir)
  loom.manual_seed(0)
  local cfg = { vocab_size = 65, dim = 32, n_layers = 2, n_heads = 4, max_seq_len = 32 }
  local x, y = loom.randint(1, 66, { 2, 16 }), loom.randint(1, 66, { 2, 16 })

  -- TP + SP + loss parallel
  local tp_mesh = dist.init_device_mesh("cpu", { 2 }, { mesh_dim_names = { "tp" } })
  local m = loom.models.transformer.new(cfg)
  tp.parallelize_module(m, tp_mesh, loom.models.transformer.tp_plan({ sequence_parallel = true, loss_parallel = true }, m))
  local opt = loom.optim.AdamW(m:parameters(), { lr = 1e-3 })
  for _ = 1, 3 do
    opt:zero_grad()
    local loss = tp.loss_parallel(function() return F.cross_entropy(m(x), y, { label_smoothing = 0.1 }) end)
    loss:backward()
    nn.utils.clip_grad_norm_(m:parameters(), 1.0)
    opt:step()
  end
  dist.checkpoint.save({ model = m:state_dict(), optim = dist.checkpoint.optim_state_dict(opt) }, dir .. "/ck")
  dist.checkpoint.load({ model = m:state_dict() }, dir .. "/ck")
  local d = dist.distribute_tensor(loom.randn(8, 4), tp_mesh, { dist.Shard(1) })
  local _ = d:redistribute(tp_mesh, { dist.Replicate() }):full_tensor()

  -- DP replicate
  local mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
  tp.replicate(mlp, tp_mesh)
  local o2 = loom.optim.SGD(mlp:parameters(), { lr = 1e-2 })
  for _ = 1, 3 do o2:zero_grad() mlp(loom.randn(4, 8)):sum():backward() o2:step() end

  -- a 2-stage pipeline
  local pm = loom.models.transformer.new(cfg)
  local pipe = pp.pipeline(pm, { split_spec = { ["layers.2"] = pp.SplitPoint.BEGINNING } })
  local stage = pipe:build_stage(tp_mesh:get_local_rank("tp"), { group = tp_mesh, mesh_dim = "tp" })
  local sched = pp.ScheduleGPipe(stage, 2, function(out, t) return F.cross_entropy(out, t) end)
  local o3 = loom.optim.AdamW(stage.submod:parameters(), { lr = 1e-3 })
  for _ = 1, 2 do o3:zero_grad() sched:step(x, { target = y }) o3:step() end
  sched:eval(x, { target = y })

  -- context parallelism
  local cm = loom.models.transformer.new(cfg)
  cp.context_parallel(tp_mesh, { buffers = { x, y, { cm, "rope_cos" }, { cm, "rope_sin" } },
                                 buffer_seq_dims = { 2, 2, 1, 1 } },
    function(lx, ly) F.cross_entropy(cm(lx), ly):backward() end)
end

local ok, err = pcall(work, assert(arg[1], "usage: jit_workload_dist.lua DIR"))
if not ok then io.stderr:write("workload failed on rank ", rank, ": ", tostring(err), "\n") os.exit(2) end
local now = H.settled_storages()
for _, path in ipairs(H.held()) do print("held: " .. path) end
print(string.format("storages: %d -> %d", start, now))
