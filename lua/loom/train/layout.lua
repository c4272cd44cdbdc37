-- layout.lua: the parallel layout of a training run, shared by
-- examples/train.lua and the benchmarks: the (pp, dp, cp, tp) mesh from the
-- degrees asked for, the line that says it, the model laid out on it
-- through its recipe (loom.models.recipe: the TP plan, FSDP units,
-- pipeline parts, context-parallel buffers), and what pipeline
-- parallelism changes in a step (the stage this rank holds, its schedule,
-- the loss and the gradient norm summed over stages).
local loom = require("loom")
local recipe_of = require("loom.models.recipe").of

local M = {}

-- degrees {pp, cp, ep, dp, tp} (0: what the world leaves) -> the layout;
-- errors name the flags. mesh is ("pp", "dp", "cp", "tp") in that order, so
-- that with pp = cp = 1 every rank has the (dp, tp) coordinate it had before;
-- with expert parallelism ("pp", "dp", "ep", "cp", "tp"): the ep ranks are
-- data-parallel too (w.data = dp x ep ranks route their own tokens), the
-- experts sharded over ep.
function M.world(o, dist, device)
  local world = dist.world_size()
  local pp, cp, ep, tp, dp = o.pp or 1, o.cp or 1, o.ep or 1, o.tp or 0, o.dp or 0
  if pp == 0 then pp = 1 end
  if cp == 0 then cp = 1 end
  if ep == 0 then ep = 1 end
  for _, f in ipairs { { "pp", pp }, { "cp", cp }, { "ep", ep } } do
    if f[2] < 1 or f[2] % 1 ~= 0 or world % f[2] ~= 0 then
      error(string.format("layout: --%s %s must divide the world size %d", f[1], tostring(f[2]), world), 0)
    end
  end
  if world % (pp * cp * ep) ~= 0 then
    error(string.format("layout: --pp %d x --cp %d x --ep %d must divide the world size %d", pp, cp, ep, world), 0)
  end
  local rest = world / (pp * cp * ep)
  if tp == 0 and dp == 0 then tp, dp = rest, 1
  elseif tp == 0 then tp = rest / dp
  elseif dp == 0 then dp = rest / tp end
  if pp * cp * ep * tp * dp ~= world or tp < 1 or dp < 1 or tp % 1 ~= 0 or dp % 1 ~= 0 then
    error(string.format("layout: --pp %s x --cp %s x --ep %s x --tp %s x --dp %s must equal the world size %d",
                        tostring(o.pp), tostring(o.cp), tostring(ep), tostring(o.tp), tostring(o.dp), world), 0)
  end
  if cp > 1 then require("loom.distributed.context_parallel").set_rotate_method(o["cp-rotate"] or "allgather") end
  local shape, names = { pp, dp, cp, tp }, { "pp", "dp", "cp", "tp" }
  if ep > 1 then shape, names = { pp, dp, ep, cp, tp }, { "pp", "dp", "ep", "cp", "tp" } end
  local mesh = dist.init_device_mesh(device, shape, { mesh_dim_names = names })
  local w = { world = world, pp = pp, cp = cp, tp = tp, dp = dp, ep = ep, etp = o.etp or 1, mesh = mesh, rank = dist.rank(),
              device = device, pp_rank = mesh:get_local_rank("pp"), dp_rank = mesh:get_local_rank("dp") }
  -- the data-parallel ranks: dp x ep, each with its share of the batch
  w.data = dp * ep
  w.data_rank = w.dp_rank * ep + (ep > 1 and mesh:get_local_rank("ep") or 0)
  w.grad_mesh = M.grad_mesh(w)
  w.data_mesh = M.flat(w, { "dp", "ep" }, "dp_ep")   -- what a loss is averaged over
  w.expert_mesh = M.flat(w, { "dp", "cp" }, "dp_cp_experts")   -- what experts' gradients are averaged over
  w.seq_shards = (o["sequence-parallel"] and tp > 1) and tp or 1   -- what sequence parallelism cuts
  return w
end

-- the 1-D mesh gradients are averaged (replicate) or sharded (FSDP) over:
-- cp ranks are data-parallel for the parameters (each holds a share of the
-- sequence's tokens), so dp x cp flattened into "dp_cp" when both are > 1
-- (torchtitan's dp_shard_cp); nil when dp = cp = 1. Collective (every rank
-- calls it once, from world()).
function M.grad_mesh(w)
  return M.flat(w, { "dp", "ep", "cp" }, "dp_cp")
end

-- flat(w, dims, name): the 1-D mesh of those of dims with more than one
-- rank (flattened under name when several), nil when none has (collective)
function M.flat(w, dims, name)
  local big = {}
  for _, d in ipairs(dims) do if (w[d] or 1) > 1 then big[#big + 1] = d end end
  if #big == 0 then return nil end
  if #big == 1 then return w.mesh[big[1]] end
  return w.mesh[big]:_flatten(name)
end

-- the number of ranks FSDP shards over (1: no FSDP): dp x ep x cp (the
-- experts over dp x cp: ep cuts them already)
function M.fsdp_degree(w, o)
  return (o.fsdp and w.grad_mesh) and w.dp * w.ep * w.cp or 1
end

-- "world 8 = pp 2 x dp 2 x cp 1 x tp 2 (FSDP), 4 microbatches (1F1B)"
function M.describe(w, o)
  local s = string.format("world %d = pp %d x dp %d x cp %d x tp %d", w.world, w.pp, w.dp, w.cp, w.tp)
  if w.ep > 1 then s = string.format("world %d = pp %d x dp %d x ep %d x cp %d x tp %d", w.world, w.pp, w.dp, w.ep, w.cp, w.tp) end
  if M.fsdp_degree(w, o) > 1 then
    local over = {}
    for _, d in ipairs { "dp", "ep", "cp" } do if w[d] > 1 then over[#over + 1] = d end end
    s = s .. (#over > 1 and " (FSDP over " .. table.concat(over, " x ") .. ")" or " (FSDP)")
  end
  if o["async-tp"] then s = s .. ", async TP" end
  if w.cp > 1 then s = s .. ", cp " .. (o["cp-rotate"] or "allgather") end
  if w.pp > 1 then
    local mb = w.microbatches or ((o.microbatches or 0) > 0 and o.microbatches or w.pp)
    s = s .. string.format(", %d microbatches (%s)", mb, w.schedule_name or o.schedule or "1F1B")
  end
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

-- with pp > 1: model cut into w.pp stages (its layers as even as they go);
-- returns this rank's stage module and sets w.stage (a PipelineStage).
-- Call before tensor or data parallelism, which then apply to the stage.
function M.split(model, w, o)
  if w.pp == 1 then return model end
  local pipelining = require("loom.distributed.pipelining")
  w.whole_names = {}   -- the whole model's parameters, for checkpoints (optim_opts)
  for i, kv in ipairs(model:named_parameters()) do w.whole_names[i] = kv[1] end
  w.tied = recipe_of(model).tied(model)
  local pipe = pipelining.pipeline(model, { num_stages = w.pp })
  w.stage_of = {}   -- the stage holding each parameter of the whole model, for whole_model
  for _, name in ipairs(w.whole_names) do w.stage_of[name] = pipe:stage_of(name) end
  w.stage = pipe:build_stage(w.pp_rank, { group = w.mesh, mesh_dim = "pp" })
  w.stage.submod.seq_shards = w.seq_shards   -- a stage's hidden states in: 1/tp of the sequence with SP
  w.microbatches = o.microbatches or w.pp
  w.schedule_name = o.schedule or "1F1B"
  return w.stage.submod
end

-- the FQNs of the parts stage 0 holds (nil without pp), for predictions
function M.first_stage_parts(model, w)
  if w.pp == 1 then return nil end
  return require("loom.distributed.pipelining").pipeline(model, { num_stages = w.pp }):stage_fqns(0)
end

-- the opts of dist.checkpoint.optim_state_dict / load_optim_state_dict:
-- with pp > 1 a stage's optimizer state is numbered as in the whole model,
-- so that a checkpoint resumes at any layout (a weight tied across stages,
-- the copy on the last stage, numbered as the one it copies: the two are
-- equal, and one is written)
function M.optim_opts(model, w)
  if w.pp == 1 then return nil end
  local aliases = {}
  for _, pair in ipairs(w.tied) do aliases[pair[1]] = pair[2] end
  return { param_index = require("loom.distributed.checkpoint").param_index(w.whole_names, model, aliases) }
end

local function copy_into(dst, src) dst:copy_(src) end

-- whole_model(module, w, family, cfg): the whole model, unsharded, on
-- every rank (collective): with pp > 1 each stage's weights gathered over
-- tp and dp by its ranks, then broadcast over pp; else module itself when
-- nothing cuts it, or its unsharded copy. For what runs the whole model
-- on one rank: the end-of-run sample.
function M.whole_model(module, w, family, cfg)
  if w.pp == 1 then return module end
  local dist = require("loom.distributed")
  local twin = loom.device(w.device):use(loom.models.family(family).new, cfg)
  local mine = {}
  for _, kv in ipairs(module:named_parameters()) do mine[kv[1]] = kv[2] end
  for _, kv in ipairs(twin:named_parameters()) do
    local owner, full = w.stage_of[kv[1]], kv[2]:detach()
    if owner == w.pp_rank then
      local p = mine[kv[1]]
      full = p.dist ~= nil and p:full_tensor() or p:detach()
    end
    loom.no_grad(copy_into, kv[2], dist.broadcast(full:contiguous(), owner, w.mesh, "pp"))
  end
  return twin
end

-- the parameters of the stage this rank holds, less the copies of
-- weights tied across stages (held by another stage too): what a norm or
-- a count over the pp ranks must see once
function M.own_parameters(model, w)
  if w.pp == 1 or #(w.stage.ties or {}) == 0 then return model:parameters() end
  local skip = {}
  for _, tie in ipairs(w.stage.ties) do if tie.peer < w.stage.stage_index then skip[tie.fqn] = true end end
  local out = {}
  for _, kv in ipairs(model:named_parameters()) do if not skip[kv[1]] then out[#out + 1] = kv[2] end end
  return out
end

-- the schedule of the stage, with loss_fn(out, y) computed on the last stage
function M.schedule(w, loss_fn)
  local pipelining = require("loom.distributed.pipelining")
  local make = w.schedule_name == "gpipe" and pipelining.ScheduleGPipe or pipelining.Schedule1F1B
  return make(w.stage, w.microbatches, loss_fn)
end

-- with --ep: each mixture of experts' experts (the recipe's
-- expert_modules) sharded over the ep ranks (loom.parallel.expert), and
-- with --etp each expert's hidden dim over the tp ranks too (the (ep, tp)
-- mesh; --etp alone: the TP plan cut them); the gradients they get hold
-- every ep rank's tokens
function M.expert_parallel(whole, module, w, o)
  local etp = (o.etp or 1) > 1
  if w.ep == 1 and not etp then return end
  local mods = require("loom.models.recipe").of(whole).expert_modules(whole)
  if #mods == 0 then
    error(string.format("layout: --%s shards a mixture of experts' experts, and this model has none",
                        w.ep > 1 and "ep" or "etp"), 0)
  end
  if w.ep == 1 then return end
  local held = {}
  for _, kv in ipairs(module:named_modules()) do held[kv[2]] = true end
  local E = require("loom.parallel.expert")
  local style, mesh = E.ExpertParallel(), w.mesh["ep"]
  if etp then style, mesh = E.ExpertTensorParallel(), w.mesh[{ "ep", "tp" }] end
  w.experts, w.expert_modules = {}, {}
  for _, m in ipairs(mods) do
    if held[m] then
      require("loom.parallel").parallelize_module(m, mesh, style, { src_data_rank = false })
      w.expert_modules[#w.expert_modules + 1] = m
      for _, p in ipairs(m:parameters()) do w.experts[#w.experts + 1] = p end
    end
  end
end

-- after backward, with --ep: the experts' gradients (each the sum of every
-- ep rank's tokens' share) as the data-parallel mean: averaged over the
-- other data ranks (dp x cp; with FSDP its reduce-scatter over dp x cp
-- has), divided by ep
local function scale_experts(w, dist, fsdp)
  for _, p in ipairs(w.experts) do
    local g = p.grad
    if g ~= nil then
      local lg = g.dist ~= nil and g:to_local() or g
      if w.expert_mesh and not fsdp then lg:copy_(dist.all_reduce(lg, "avg", w.expert_mesh, 1)) end
      lg:copy_(lg * (1 / w.ep))
    end
  end
end
function M.expert_grads(w, dist, o)
  if w.ep == 1 then return end
  loom.no_grad(scale_experts, w, dist, o.fsdp)
end

-- without --fsdp: gradients averaged over dp x ep x cp (w.grad_mesh) as
-- data parallelism does (each cp rank's loss is its share of the
-- sequence's tokens), the experts' apart (expert_grads)
function M.replicate(model, w, o)
  if w.grad_mesh and not o.fsdp then
    require("loom.parallel").replicate(model, w.grad_mesh, { ignored_params = w.experts })
  end
end

-- units(whole, module): the FSDP units (the whole model's recipe's: its
-- blocks) that module (the model, or this rank's stage) holds, kept in
-- w.fsdp_units for fully_shard
function M.note_fsdp_units(whole, module, w)
  local held = {}
  for _, kv in ipairs(module:named_modules()) do held[kv[2]] = true end
  w.fsdp_units = {}
  for _, unit in ipairs(recipe_of(whole).fsdp_units(whole)) do
    if held[unit] then w.fsdp_units[#w.fsdp_units + 1] = unit end
  end
end

-- with --fsdp: each FSDP unit this rank holds (note_fsdp_units), then the
-- root (the model or the stage), sharded over dp x cp (w.grad_mesh)
function M.fully_shard(module, w, o)
  if not o.fsdp or not w.grad_mesh then return end
  local fsdp = require("loom.distributed.fsdp")
  local opts = { mesh = w.grad_mesh, reshard_after_forward = not o["no-reshard"] }
  -- (with --ep: each mixture's experts first, over dp x cp (w.expert_mesh):
  -- ep cuts them already; then the blocks over dp x ep x cp leave them to
  -- that unit)
  local em = w.expert_mesh
  for _, m in ipairs(w.expert_modules or {}) do
    if em then fsdp.fully_shard(m, { mesh = em, reshard_after_forward = opts.reshard_after_forward }) end
  end
  if em and #(w.expert_modules or {}) > 0 then
    -- FSDP put parameters of its own (over (dp x cp, ep)) in the experts'
    -- place: theirs are the gradients expert_grads scales
    w.experts = {}
    for _, m in ipairs(w.expert_modules) do
      for _, p in ipairs(m:parameters()) do w.experts[#w.experts + 1] = p end
    end
  end
  opts.ignored_params = not em and w.experts or nil   -- (no dp or cp to shard the experts over: EP alone cuts them)
  for _, unit in ipairs(w.fsdp_units) do fsdp.fully_shard(unit, opts) end
  fsdp.fully_shard(module, { mesh = w.grad_mesh, ignored_params = opts.ignored_params })
end

-- f(x, y) with x and y sharded on the sequence and attention
-- context-parallel when cp > 1 (the buffers the model's recipe names, its
-- rotary tables or position ids, sharded alike). recipe: the model's;
-- module: the model or this rank's stage.
function M.with_cp(w, recipe, module, x, y, f)
  if w.cp == 1 then return f(x, y) end
  local cp = require("loom.distributed.context_parallel")
  local bufs, dims = recipe.cp_buffers(module)
  table.insert(bufs, 1, y) table.insert(dims, 1, 2)
  table.insert(bufs, 1, x) table.insert(dims, 1, 2)
  return cp.context_parallel(w.mesh["cp"], { buffers = bufs, buffer_seq_dims = dims }, f)
end

-- host tensor t on the layout's device: a collective on the mesh runs
-- there (NCCL takes no host memory)
function M.on_device(w, t)
  return w.device ~= "cpu" and t:to(w.device) or t
end

-- a loss (f64 tensor) averaged over the cp ranks' shares
function M.cp_avg(w, dist, v)
  if w.cp == 1 then return v end
  return dist.all_reduce(v, "avg", w.mesh, "cp")
end

-- the batch's loss from the last stage on every rank (sum over pp of the
-- last stage's loss and the others' zeros)
function M.pp_sum(w, dist, loss)
  local v = M.on_device(w, loom.tensor({ loss or 0 }, { dtype = "f64" }))
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
-- stage's gradients summed over pp, a weight tied across stages counted
-- once (PyTorch's coef = max / (norm + 1e-6))
function M.clip_grad_norm_(model, max_norm, w, dist, opts)
  local U = loom.nn.utils
  if w.pp == 1 then return U.clip_grad_norm_(model:parameters(), max_norm, opts) end
  local sq = dist.all_reduce(M.on_device(w, loom.tensor({ U.grad_norm_squared(M.own_parameters(model, w)) },
                                                        { dtype = "f64" })), "sum", w.mesh, "pp")
  local norm = math.sqrt(sq:item())
  U.clip_grads_with_norm_(model:parameters(), max_norm, norm)
  return norm
end

-- the number of parameters of the whole model (stages summed over pp, a
-- weight tied across stages counted once)
function M.count_params(model, w, dist)
  local n = 0
  for _, p in ipairs(M.own_parameters(model, w)) do n = n + p:numel() end
  if w.pp == 1 then return n end
  return M.pp_sum(w, dist, n)
end

return M
