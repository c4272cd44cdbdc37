-- layout.lua: the parallel layout of a training run, shared by
-- examples/train.lua and the benchmarks: the (pp, dp, cp, tp) mesh from the
-- degrees asked for, the line that says it, and what pipeline parallelism
-- changes in a step (the stage this rank holds, its schedule, the loss and
-- the gradient norm summed over stages).
local loom = require("loom")

local M = {}

-- degrees {pp, cp, dp, tp} (0: what the world leaves) -> the layout;
-- errors name the flags. mesh is ("pp", "dp", "cp", "tp") in that order, so
-- that with pp = cp = 1 every rank has the (dp, tp) coordinate it had before.
function M.world(o, dist, device)
  local world = dist.world_size()
  local pp, cp, tp, dp = o.pp or 1, o.cp or 1, o.tp or 0, o.dp or 0
  if pp == 0 then pp = 1 end
  if cp == 0 then cp = 1 end
  for _, f in ipairs { { "pp", pp }, { "cp", cp } } do
    if f[2] < 1 or f[2] % 1 ~= 0 or world % f[2] ~= 0 then
      error(string.format("layout: --%s %s must divide the world size %d", f[1], tostring(f[2]), world), 0)
    end
  end
  if world % (pp * cp) ~= 0 then
    error(string.format("layout: --pp %d x --cp %d must divide the world size %d", pp, cp, world), 0)
  end
  local rest = world / (pp * cp)
  if tp == 0 and dp == 0 then tp, dp = rest, 1
  elseif tp == 0 then tp = rest / dp
  elseif dp == 0 then dp = rest / tp end
  if pp * cp * tp * dp ~= world or tp < 1 or dp < 1 or tp % 1 ~= 0 or dp % 1 ~= 0 then
    error(string.format("layout: --pp %s x --cp %s x --tp %s x --dp %s must equal the world size %d", tostring(o.pp),
                        tostring(o.cp), tostring(o.tp), tostring(o.dp), world), 0)
  end
  if cp > 1 then require("loom.distributed.context_parallel").set_rotate_method(o["cp-rotate"] or "allgather") end
  local mesh = dist.init_device_mesh(device, { pp, dp, cp, tp }, { mesh_dim_names = { "pp", "dp", "cp", "tp" } })
  local w = { world = world, pp = pp, cp = cp, tp = tp, dp = dp, mesh = mesh, rank = dist.rank(), device = device,
              pp_rank = mesh:get_local_rank("pp"), dp_rank = mesh:get_local_rank("dp") }
  w.grad_mesh = M.grad_mesh(w)
  w.seq_shards = (o["sequence-parallel"] and tp > 1) and tp or 1   -- what sequence parallelism cuts
  return w
end

-- the 1-D mesh gradients are averaged (replicate) or sharded (FSDP) over:
-- cp ranks are data-parallel for the parameters (each holds a share of the
-- sequence's tokens), so dp x cp flattened into "dp_cp" when both are > 1
-- (torchtitan's dp_shard_cp); nil when dp = cp = 1. Collective (every rank
-- calls it once, from world()).
function M.grad_mesh(w)
  if w.dp > 1 and w.cp > 1 then return w.mesh[{ "dp", "cp" }]:_flatten("dp_cp") end
  if w.dp > 1 then return w.mesh["dp"] end
  if w.cp > 1 then return w.mesh["cp"] end
  return nil
end

-- the number of ranks FSDP shards over (1: no FSDP)
function M.fsdp_degree(w, o)
  return (o.fsdp and w.grad_mesh) and w.dp * w.cp or 1
end

-- "world 8 = pp 2 x dp 2 x cp 1 x tp 2 (FSDP), 4 microbatches (1F1B)"
function M.describe(w, o)
  local s = string.format("world %d = pp %d x dp %d x cp %d x tp %d", w.world, w.pp, w.dp, w.cp, w.tp)
  if M.fsdp_degree(w, o) > 1 then s = s .. (w.cp > 1 and " (FSDP over dp x cp)" or " (FSDP)") end
  if o["async-tp"] then s = s .. ", async TP" end
  if w.cp > 1 then s = s .. ", cp " .. (o["cp-rotate"] or "allgather") end
  if w.pp > 1 then s = s .. string.format(", %d microbatches (%s)", w.microbatches, w.schedule_name) end
  return s
end

-- the plan's entries that name modules `module` holds (a stage holds some)
function M.plan_for(plan, module)
  local mine = {}
  for k, style in pairs(plan) do
    if module[k:match("^[^.]+")] then mine[k] = style end
  end
  return mine
end

-- --async-tp: the plan's row-wise projections back to the sequence (wo,
-- w2) reduce-scatter in chunks overlapped with their matmul; on the
-- column-wise side the attention's and the feed-forward's input is
-- gathered once in chunks, each chunk multiplied by wq, wk and wv (w1 and
-- w3) as it arrives (AsyncTPInput). It needs --sequence-parallel.
function M.async_tp(plan, o, w)
  if not o["async-tp"] then return plan end
  if not o["sequence-parallel"] or w.tp == 1 then
    error("layout: --async-tp needs --sequence-parallel and --tp > 1", 0)
  end
  local tp, dt = require("loom.parallel"), require("loom.distributed.dtensor")
  for _, k in ipairs { "layers.*.attention.wo", "layers.*.feed_forward.w2" } do
    plan[k] = tp.RowwiseParallel { output_layouts = dt.Shard(2), async_tp = true }
  end
  local shared = { attention = { "wq", "wk", "wv" }, feed_forward = { "w1", "w3" } }
  for parent, consumers in pairs(shared) do
    plan["layers.*." .. parent] = tp.AsyncTPInput { consumers = consumers }
    for _, c in ipairs(consumers) do
      plan["layers.*." .. parent .. "." .. c] = tp.ColwiseParallel { input_layouts = dt.Shard(2), async_tp = true }
    end
  end
  return plan
end

-- with pp > 1: model cut into w.pp stages (its layers as even as they go);
-- returns this rank's stage module and sets w.stage (a PipelineStage).
-- Call before tensor or data parallelism, which then apply to the stage.
function M.split(model, w, o)
  if w.pp == 1 then return model end
  local pipelining = require("loom.distributed.pipelining")
  w.whole_names = {}   -- the whole model's parameters, for checkpoints (optim_opts)
  for i, kv in ipairs(model:named_parameters()) do w.whole_names[i] = kv[1] end
  local pipe = pipelining.pipeline(model, { num_stages = w.pp })
  w.stage = pipe:build_stage(w.pp_rank, { group = w.mesh, mesh_dim = "pp" })
  w.stage.submod.seq_shards = w.seq_shards   -- a stage's hidden states in: 1/tp of the sequence with SP
  w.microbatches = o.microbatches or w.pp
  w.schedule_name = o.schedule or "1F1B"
  return w.stage.submod
end

-- the opts of dist.checkpoint.optim_state_dict / load_optim_state_dict:
-- with pp > 1 a stage's optimizer state is numbered as in the whole model,
-- so that a checkpoint resumes at any layout
function M.optim_opts(model, w)
  if w.pp == 1 then return nil end
  return { param_index = require("loom.distributed.checkpoint").param_index(w.whole_names, model) }
end

-- the schedule of the stage, with loss_fn(out, y) computed on the last stage
function M.schedule(w, loss_fn)
  local pipelining = require("loom.distributed.pipelining")
  local make = w.schedule_name == "gpipe" and pipelining.ScheduleGPipe or pipelining.Schedule1F1B
  return make(w.stage, w.microbatches, loss_fn)
end

-- without --fsdp: gradients averaged over dp x cp (w.grad_mesh) as data
-- parallelism does (each cp rank's loss is its share of the sequence's tokens)
function M.replicate(model, w, o)
  if w.grad_mesh and not o.fsdp then require("loom.parallel").replicate(model, w.grad_mesh) end
end

-- with --fsdp: each block, then the root, sharded over dp x cp (w.grad_mesh)
function M.fully_shard(model, w, o)
  if not o.fsdp or not w.grad_mesh then return end
  local fsdp = require("loom.distributed.fsdp")
  local opts = { mesh = w.grad_mesh, reshard_after_forward = not o["no-reshard"] }
  for _, block in model.layers:ipairs() do fsdp.fully_shard(block, opts) end
  fsdp.fully_shard(model, { mesh = w.grad_mesh })
end

-- f(x, y) with x and y sharded on the sequence and attention
-- context-parallel when cp > 1 (the model's rotary tables sharded alike)
function M.with_cp(w, model, x, y, f)
  if w.cp == 1 then return f(x, y) end
  local cp = require("loom.distributed.context_parallel")
  return cp.context_parallel(w.mesh["cp"], { buffers = { x, y, { model, "rope_cos" }, { model, "rope_sin" } },
                                             buffer_seq_dims = { 2, 2, 1, 1 } }, f)
end

-- a loss (f64 tensor) averaged over the cp ranks' shares
function M.cp_avg(w, dist, v)
  if w.cp == 1 then return v end
  return dist.all_reduce(v, "avg", w.mesh, "cp")
end

-- the batch's loss from the last stage on every rank (sum over pp of the
-- last stage's loss and the others' zeros)
function M.pp_sum(w, dist, loss)
  local v = loom.tensor({ loss or 0 }, { dtype = "f64" })
  return dist.all_reduce(v, "sum", w.mesh, "pp"):item()
end

-- one step's loss through the pipeline (backward too when asked), the
-- last stage's mean over microbatches, on every rank (an f64 tensor)
function M.pipeline_loss(sched, x, y, backward, w, dist)
  local v
  if backward then
    local losses = {}
    -- the first step's p2p bytes, for the prediction check (predict.lua)
    local cm = dist.comm_mode(function() sched:step(x, { target = y, losses = losses }) end)
    w.sent_bytes = w.sent_bytes or cm.bytes.send
    if #losses > 0 then
      v = 0
      for _, l in ipairs(losses) do v = v + l end
      v = v / #losses
    end
  else
    v = sched:eval(x, { target = y })
  end
  return loom.tensor({ M.pp_sum(w, dist, v) }, { dtype = "f64" })
end

-- clip_grad_norm_ over the whole model: the squared norms of every
-- stage's gradients summed over pp (PyTorch's coef = max / (norm + 1e-6))
function M.clip_grad_norm_(params, max_norm, w, dist, opts)
  local U = loom.nn.utils
  if w.pp == 1 then return U.clip_grad_norm_(params, max_norm, opts) end
  local sq = dist.all_reduce(loom.tensor({ U.grad_norm_squared(params) }, { dtype = "f64" }), "sum", w.mesh, "pp")
  local norm = math.sqrt(sq:item())
  U.clip_grads_with_norm_(params, max_norm, norm)
  return norm
end

-- the number of parameters of the whole model (stages summed over pp)
function M.count_params(model, w, dist)
  local n = 0
  for _, p in ipairs(model:parameters()) do n = n + p:numel() end
  if w.pp == 1 then return n end
  return M.pp_sum(w, dist, n)
end

return M
