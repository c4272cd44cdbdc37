-- stage.lua: PipelineStage, one stage of a pipeline on this rank: its
-- module, its place in the pipeline and the p2p traffic of a microbatch
-- (activations to the next stage, their gradients back to the previous).
-- The schedules (schedules.lua) call forward_one and backward_one.
local loom = require("loom")
local dist = require("loom.distributed")
local T = require("loom.tensor")

local describe = T.describe
local now = require("loom.posix").now
local BWD_TAG = 16384   -- gradients travel on tags above the activations'

-- the tag of microbatch mb's activation leaving stage s (its gradient: + BWD_TAG)
local function tag_of(s, mb) return (s * 1024 + mb) % BWD_TAG end

local Stage = {}
Stage.__index = Stage

local function int_arg(f, name, v, lo, hi)
  if type(v) ~= "number" or v ~= math.floor(v) or v < lo or (hi and v > hi) then
    error(string.format("%s: %s expected an integer in [%d, %s], got %s", f, name, lo,
                        hi and tostring(hi) or "inf", describe(v)), 3)
  end
end

-- PipelineStage(module, stage_index, num_stages, {group = mesh, mesh_dim = "pp"}):
-- stage_index is 0-based as in PyTorch; stage i lives on rank i % size of
-- the group (the pp dim of a mesh, or the world when group is nil).
function Stage.new(module, stage_index, num_stages, opts)
  local f = "PipelineStage"
  if type(module) ~= "table" or type(module.forward) ~= "function" then
    error(f .. ": module expected an nn.Module, got " .. describe(module), 2)
  end
  int_arg(f, "num_stages", num_stages, 1)
  int_arg(f, "stage_index", stage_index, 0, num_stages - 1)
  opts = opts or {}
  if type(opts) ~= "table" then error(f .. ": options expected a table, got " .. describe(opts), 2) end
  local group, dim = opts.group, opts.mesh_dim
  local size, rank
  if group == nil then
    size, rank = dist.world_size(), dist.rank()
  else
    size, rank = group:size(dim), group:get_local_rank(dim)
  end
  if num_stages % size ~= 0 then
    error(string.format("%s: num_stages (%d) must be a multiple of the pipeline group's size (%d)",
                        f, num_stages, size), 2)
  end
  if stage_index % size ~= rank then
    error(string.format("%s: stage %d belongs on pipeline rank %d, but this is rank %d",
                        f, stage_index, stage_index % size, rank), 2)
  end
  return setmetatable({ submod = module, stage_index = stage_index, num_stages = num_stages,
                        is_first = stage_index == 0, is_last = stage_index == num_stages - 1,
                        group = group, mesh_dim = dim, size = size, rank = rank,
                        inputs = {}, outputs = {}, sends = {}, compute_s = 0 }, Stage)
end

-- the rank of the stage `s` in the pipeline group
function Stage:rank_of(s) return s % self.size end

-- between two stages on this rank (interleaved, or all stages in one
-- process) tensors go through a mailbox by tag instead of p2p
local mailbox = {}

local function send(self, t, to_stage, tag)
  local peer = self:rank_of(to_stage)
  if peer == self.rank then mailbox[tag] = t:clone() return end
  self.sends[#self.sends + 1] = dist.isend(t, peer, self.group, self.mesh_dim, { tag = tag })
end
local function recv(self, from_stage, tag)
  local peer = self:rank_of(from_stage)
  if peer == self.rank then
    local t = mailbox[tag]
    if t == nil then error("PipelineStage: stage " .. self.stage_index .. " waits for a tensor its own rank has not produced yet (schedule order)", 3) end
    mailbox[tag] = nil
    return t
  end
  return dist.recv(nil, peer, self.group, self.mesh_dim, { tag = tag })
end

local function plain(self, out)
  if not T.is_tensor(out) or dist.is_dtensor(out) then
    error(string.format("PipelineStage: stage %d's module must return one plain tensor (a DTensor's "
                        .. "local shard: use_local_output), got %s", self.stage_index,
                        dist.is_dtensor(out) and "a DTensor" or describe(out)), 4)
  end
  return out
end

-- Runs microbatch mb (0-based) forward. The first stage takes x; the others
-- receive their input. Returns the output (on the last stage: for the loss).
function Stage:forward_one(mb, x)
  local t0 = now()
  local input = x
  if not self.is_first then
    input = recv(self, self.stage_index - 1, tag_of(self.stage_index - 1, mb))
    t0 = now()
    input:requires_grad_(true)
  end
  local out = self.submod(input)
  if not self.is_last then plain(self, out) end   -- the last stage's goes to the loss as it is
  self.inputs[mb], self.outputs[mb] = input, out
  self.compute_s = self.compute_s + (now() - t0)
  if not self.is_last then send(self, out:detach(), self.stage_index + 1, tag_of(self.stage_index, mb)) end
  return out
end

-- Runs microbatch mb backward: from the loss on the last stage, else from
-- the gradient the next stage sends; sends the input's gradient back.
function Stage:backward_one(mb, loss)
  local out, input = self.outputs[mb], self.inputs[mb]
  local grad
  if not self.is_last then grad = recv(self, self.stage_index + 1, BWD_TAG + tag_of(self.stage_index, mb)) end
  local t0 = now()
  if self.is_last then loss:backward() else out:backward(grad) end
  self.compute_s = self.compute_s + (now() - t0)
  if not self.is_first then
    local g = input.grad or loom.zeros(input:size(), { dtype = input.dtype })
    send(self, g, self.stage_index - 1, BWD_TAG + tag_of(self.stage_index - 1, mb))
  end
  self.inputs[mb], self.outputs[mb] = nil, nil
end

-- waits for the sends still in flight (at the end of a step)
function Stage:finish_sends()
  for i, w in ipairs(self.sends) do w:wait() self.sends[i] = nil end
end

-- A weight tied across stages (a head tied to the embedding, as
-- Megatron's embedding group): the stages holding its two uses each have
-- a copy, equal at the start; after a step's backwards their gradients
-- are summed, so both copies take the same optimizer step. Copies on one
-- rank are one tensor, and autograd has summed them already.
local TIE_TAG = 32000
local function add_into(g, other) g:copy_(g + other) end
function Stage:sync_tied_grads()
  for k, tie in ipairs(self.ties or {}) do
    local peer = self:rank_of(tie.peer)
    if peer ~= self.rank then
      local owner, name = tie.fqn:match("^(.*)%.([^.]+)$")
      local g = self.submod:get_submodule(owner)[name].grad
      if g == nil then
        error(string.format("PipelineStage: stage %d's tied weight %s has no gradient after the step's backwards",
                            self.stage_index, tie.fqn), 3)
      end
      g = dist.is_dtensor(g) and g:to_local() or g
      local w = dist.isend(g:contiguous(), peer, self.group, self.mesh_dim, { tag = TIE_TAG + k })
      local other = dist.recv(nil, peer, self.group, self.mesh_dim, { tag = TIE_TAG + k })
      w:wait()
      loom.no_grad(add_into, g, other)
    end
  end
end

return Stage
