-- interop.lua: loom.save's single file and dist.checkpoint's directory read
-- each other. loom.load(DIR) reads a checkpoint directory as one whole
-- state with full, plain tensors (PyTorch's dcp_to_torch_save, in memory);
-- dist.checkpoint.load(state_dict, FILE) loads each rank's block from the
-- full tensors of a file that loom.save wrote (as DCP's
-- BroadcastingTorchSaveReader does). Neither needs the world size or mesh
-- of the run that wrote it.
local TC = require("loom.tensor_create")
local serialize = require("loom.serialize")
local format = require("loom.distributed.checkpoint.format")
local plan = require("loom.distributed.checkpoint.plan")
local state = require("loom.distributed.checkpoint.state")

local M = {}

local function zeros(n)
  local z = {}
  for d = 1, n do z[d] = 0 end
  return z
end

-- each saved tensor whole, from its shards, into out at its path (not a
-- closure over out, which a compiled trace would keep: docs/architecture.md)
local function read_whole(tensors, read, out)
  for _, te in ipairs(tensors) do
    local whole, at0 = TC.empty(te.shape, { dtype = te.dtype }), zeros(#te.shape)
    for _, sh in ipairs(te.shards) do
      local lo, len = plan.overlap(sh.offset, sh.size, at0, te.shape)
      if lo then plan.copy(read(sh, te), sh.offset, whole, at0, lo, len) end
    end
    state.set_path(out, te.path, whole)
  end
end

-- read_dir(dir, fname) -> the state_dict saved in the checkpoint dir, its
-- tensors whole and plain (every shard read, checksums checked)
function M.read_dir(dir, fname)
  local m = format.read_manifest(dir, fname)
  local out = m.values or {}
  local read, close = format.reader(dir, m, fname)
  local ok, err = pcall(read_whole, m.tensors, read, out)
  close()
  if not ok then error(err, 0) end
  return out
end

-- read_file(path, fname) -> saved, values, read: the tensors of the
-- state_dict in a loom.save file as saved tensors of one shard each (by
-- path key, as dist.checkpoint.load wants them), the other values, and
-- the function that gives a shard's tensor
function M.read_file(path, fname)
  local ok, obj = pcall(serialize.load, path)
  if not ok then error(fname .. ": " .. tostring(obj):gsub("^load: ", ""), 0) end
  if type(obj) ~= "table" then
    error(string.format("%s: %s holds a %s, not a state_dict (a table)", fname, path, type(obj)), 0)
  end
  local tensors, values = state.flatten(obj, fname)
  local saved = {}
  for _, e in ipairs(tensors) do
    local size = e.t:size()
    saved[e.key] = { name = e.name, shape = size, dtype = e.t.dtype,
                     shards = { { offset = zeros(#size), size = size, tensor = e.t } } }
  end
  return saved, values, function(sh) return sh.tensor end
end

return M
