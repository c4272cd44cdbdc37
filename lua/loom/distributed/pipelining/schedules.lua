-- schedules.lua: the pipeline schedules, as PyTorch names them. A schedule
-- is an ordered list of actions per stage ({"F", mb} forward, {"B", mb}
-- backward, mb 0-based); step() splits the batch into microbatches and
-- runs this rank's actions. Sends are asynchronous and every stage
-- receives in the order its neighbour sends, so no order of ranks can
-- deadlock.
--   GPipe            all forwards, then all backwards
--   1F1B             (num_stages - stage - 1) forwards, then one forward
--                    and one backward in turn, then the backwards left
--   Interleaved1F1B  v stages per rank (stage s on rank s % pp), in
--                    Megatron's order: forwards in groups of pp
--                    microbatches per local stage, a longer warm-up, then
--                    1F1B; the bubble shrinks by v. n_microbatches must be
--                    a multiple of pp
--   LoopedBFS        v stages per rank: each local stage's forwards, then
--                    the backwards in reverse (GPipe over virtual stages)
local loom = require("loom")
local T = require("loom.tensor")
local now = require("loom.posix").now

local describe = T.describe
local M = {}

-- the actions of stage s of S over n microbatches
function M.gpipe_actions(s, S, n)
  local a = {}
  for mb = 0, n - 1 do a[#a + 1] = { "F", mb } end
  for mb = 0, n - 1 do a[#a + 1] = { "B", mb } end
  return a
end

function M.one_f_one_b_actions(s, S, n)
  local a, warm = {}, math.min(S - s - 1, n)
  for mb = 0, warm - 1 do a[#a + 1] = { "F", mb } end
  local f, b = warm, 0
  while f < n do
    a[#a + 1] = { "F", f }
    a[#a + 1] = { "B", b }
    f, b = f + 1, b + 1
  end
  while b < n do a[#a + 1] = { "B", b } b = b + 1 end
  return a
end

-- Interleaved 1F1B on rank r of P with v local stages: {k, "F"|"B", mb},
-- k the local stage (0-based; stage k*P + r)
function M.interleaved_actions(r, P, v, n)
  local total = n * v
  local function fwd(i) return math.floor(i / P) % v, math.floor(i / (P * v)) * P + i % P end
  local function bwd(i) local k, mb = fwd(i) return v - 1 - k, mb end
  local warm = math.min((P - r - 1) * 2 + (v - 1) * P, total)
  local a, f, b = {}, 0, 0
  local function F() local k, mb = fwd(f) a[#a + 1] = { k, "F", mb } f = f + 1 end
  local function B() local k, mb = bwd(b) a[#a + 1] = { k, "B", mb } b = b + 1 end
  for _ = 1, warm do F() end
  while f < total do F() B() end
  while b < total do B() end
  return a
end

-- the fraction of a step a stage idles, ideally (equal stage times, a
-- backward twice a forward): (S - 1) / (n + S - 1) for GPipe and 1F1B
function M.bubble_fraction(S, n) return (S - 1) / (n + S - 1) end

local Schedule = {}
Schedule.__index = Schedule

local function new(kind, actions_of, stages, n_microbatches, loss_fn, opts)
  local f = kind
  if getmetatable(stages) == require("loom.distributed.pipelining.stage") then stages = { stages } end
  if type(stages) ~= "table" or #stages == 0 then
    error(f .. ": stage expected a PipelineStage (or a list of them), got " .. describe(stages), 3)
  end
  if type(n_microbatches) ~= "number" or n_microbatches < 1 or n_microbatches ~= math.floor(n_microbatches) then
    error(f .. ": n_microbatches expected an integer >= 1, got " .. describe(n_microbatches), 3)
  end
  if loss_fn ~= nil and type(loss_fn) ~= "function" then
    error(f .. ": loss_fn expected a function(output, target) -> loss, got " .. describe(loss_fn), 3)
  end
  opts = opts or {}
  table.sort(stages, function(a, b) return a.stage_index < b.stage_index end)
  -- the ranks of the pipeline must run one schedule over one cut of the
  -- model (else their sends and receives pair wrongly): checked once, here
  local st = stages[1]
  require("loom.distributed").agree("the pipeline's schedules",
                                    string.format("%s, %d microbatches, %d stages%s", kind, n_microbatches,
                                                  st.num_stages, st.split and ", cut at " .. st.split or ""),
                                    st.group, st.mesh_dim)
  return setmetatable({ kind = kind, stages = stages, n = n_microbatches, loss_fn = loss_fn,
                        actions_of = actions_of, scale_grads = opts.scale_grads ~= false }, Schedule)
end

function M.ScheduleGPipe(stage, n, loss_fn, opts)
  return new("ScheduleGPipe", M.gpipe_actions, stage, n, loss_fn, opts)
end
function M.Schedule1F1B(stage, n, loss_fn, opts)
  return new("Schedule1F1B", M.one_f_one_b_actions, stage, n, loss_fn, opts)
end
function M.ScheduleInterleaved1F1B(stages, n, loss_fn, opts)
  local s = new("ScheduleInterleaved1F1B", nil, stages, n, loss_fn, opts)
  local P = s.stages[1].size
  if n % P ~= 0 then
    error(string.format("ScheduleInterleaved1F1B: n_microbatches (%d) must be a multiple of the pipeline ranks (%d)", n, P), 2)
  end
  s.interleaved = true
  return s
end
function M.ScheduleLoopedBFS(stages, n, loss_fn, opts)
  return new("ScheduleLoopedBFS", nil, stages, n, loss_fn, opts)
end

-- microbatches of x along dim 1 (the batch), which they must divide
local function split(kind, what, x, n)
  if not T.is_tensor(x) then error(string.format("%s.step: %s expected a tensor, got %s", kind, what, describe(x)), 4) end
  local b = x:size(1)
  if b % n ~= 0 then
    error(string.format("%s.step: the batch of %s (%d rows) must divide by n_microbatches (%d)",
                        kind, what, b, n), 4)
  end
  local m, out = b / n, {}
  for i = 0, n - 1 do out[i] = x:narrow(1, i * m + 1, m) end
  return out
end

-- (stage, action) pairs of this rank, in order
function Schedule:_plan()
  local plan = {}
  if self.actions_of then
    local st = self.stages[1]
    for _, a in ipairs(self.actions_of(st.stage_index, st.num_stages, self.n)) do plan[#plan + 1] = { st, a } end
    return plan
  end
  if self.interleaved then
    local st = self.stages[1]
    for _, a in ipairs(M.interleaved_actions(st.rank, st.size, #self.stages, self.n)) do
      plan[#plan + 1] = { self.stages[a[1] + 1], { a[2], a[3] } }
    end
    return plan
  end
  for _, st in ipairs(self.stages) do
    for mb = 0, self.n - 1 do plan[#plan + 1] = { st, { "F", mb } } end
  end
  for i = #self.stages, 1, -1 do
    for mb = 0, self.n - 1 do plan[#plan + 1] = { self.stages[i], { "B", mb } } end
  end
  return plan
end

-- step(x, {target, losses}): x on the rank holding stage 0, target on the
-- rank holding the last stage (others may pass them too: they are checked); losses (a table) gets each microbatch's
-- loss as a number. Gradients accumulate into the stages' parameters
-- (each microbatch's loss divided by n_microbatches when scale_grads, so
-- a mean loss gives the full batch's gradients). Returns the last stage's
-- output (the microbatches' outputs concatenated, detached) on its rank.
function Schedule:step(x, opts)
  opts = opts or {}
  local first, last
  for _, st in ipairs(self.stages) do
    if st.is_first then first = st end
    if st.is_last then last = st end
    st.compute_s = 0
  end
  -- checked wherever given, so that every rank given the batch fails alike
  -- before any stage waits for another
  local xs = (first or x ~= nil) and split(self.kind, "x", x, self.n)
  local ys = opts.target ~= nil and split(self.kind, "target", opts.target, self.n)
  if last and not self.loss_fn then error(self.kind .. ": the last stage needs a loss_fn", 2) end
  if last and not ys then error(self.kind .. ".step: the last stage needs {target = ...}", 2) end
  local outs, losses = {}, {}
  local t0 = now()
  -- FSDP, when loaded, reduces gradients only in this rank's last backward
  local fsdp = package.loaded["loom.distributed.fsdp"]
  local plan, last_b = self:_plan(), 0
  for i, sa in ipairs(plan) do if sa[2][1] == "B" then last_b = i end end
  if fsdp then fsdp.set_requires_gradient_sync(false) end   -- gathered from the first forward to the last backward
  for i, sa in ipairs(plan) do
    if fsdp and sa[2][1] == "B" then fsdp.set_requires_gradient_sync(i == last_b) end
    local st, kind, mb = sa[1], sa[2][1], sa[2][2]
    if kind == "F" then
      local out = st:forward_one(mb, st.is_first and xs[mb] or nil)
      if st.is_last then
        local loss = self.loss_fn(out, ys[mb])
        losses[mb] = loss
        outs[mb + 1] = out:detach()
      end
    else
      local l = losses[mb]
      if st.is_last and self.scale_grads then l = l / self.n end
      st:backward_one(mb, st.is_last and l or nil)
      if st.is_last then losses[mb] = losses[mb]:item() end
    end
  end
  for _, st in ipairs(self.stages) do st:finish_sends() end
  for _, st in ipairs(self.stages) do st:sync_tied_grads() end
  self.last_step_s = now() - t0
  if last and type(opts.losses) == "table" then
    for mb = 0, self.n - 1 do opts.losses[#opts.losses + 1] = losses[mb] end
  end
  if last then return loom.cat(outs, 1) end
end

-- eval(x, {target}): forward only, without gradients (evaluation): the
-- mean of the microbatches' losses on the last stage's rank, else nil
-- (forward_all is a function of the module, not a closure over the
-- batch, which a compiled trace would keep: docs/architecture.md)
local function forward_all(self, x, target)
  local total, n, last = 0, 0, false
  local xs = x ~= nil and split(self.kind, "x", x, self.n)
  local ys = target ~= nil and split(self.kind, "target", target, self.n)
  for _, st in ipairs(self.stages) do
    for mb = 0, self.n - 1 do
      local out = st:forward_one(mb, st.is_first and xs[mb] or nil)
      st.inputs[mb], st.outputs[mb] = nil, nil
      if st.is_last then
        last = true
        total, n = total + self.loss_fn(out, ys[mb]):item(), n + 1
      end
    end
  end
  for _, st in ipairs(self.stages) do st:finish_sends() end
  return total, n, last
end

function Schedule:eval(x, opts)
  opts = opts or {}
  local total, n, last = loom.no_grad(forward_all, self, x, opts.target)
  if last then return total / n end
end

-- the seconds this rank computed in the last step, and the step's seconds
function Schedule:timing()
  local c = 0
  for _, st in ipairs(self.stages) do c = c + st.compute_s end
  return c, self.last_step_s
end

return M
