-- styles.lua: ColwiseParallel, RowwiseParallel, SequenceParallel and
-- PairwiseParallel, with PyTorch's defaults and semantics (dims are Lua's:
-- PyTorch Shard(0) is Shard(1) here, sequence_dim 1 is 2).
local dt = require("loom.distributed.dtensor")
local S = require("loom.parallel.parallel_style")

local Shard, Replicate = dt.Shard, dt.Replicate
local M = {}

local function kind(module) return module.__name end

local function distribute(style, mesh, placement)
  return function(_, p)
    return dt.distribute_tensor(p, mesh, { placement }, { src_data_rank = style._src_data_rank })
  end
end

-- input hook: the first input laid out as input_layout, moved to desired
local function input_hook(mesh, from, to)
  return function(_, args)
    args[1] = S.prepare(args[1], mesh, from, to, false)
    return args
  end
end

local function output_hook(mesh, to, use_local)
  return function(_, _, out) return S.prepare(out, mesh, nil, to, use_local) end
end

local function unsupported(style, module, fqn)
  error(string.format("%s: %s is a %s; it supports Linear and Embedding", style.__name,
                      fqn ~= "" and fqn or "the module", kind(module)), 4)
end

---------------------------------------------------------------------------
-- ColwiseParallel{input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=true}
-- Linear: weight (out, in) sharded on out (Shard(1)), bias too; Embedding:
-- the embedding dim (Shard(2)).
M.ColwiseParallel = S.ParallelStyle:extend("ColwiseParallel")
function M.ColwiseParallel:__init(o)
  self.input_layouts = S.layout("ColwiseParallel", "input_layouts", o.input_layouts, Replicate())
  self.output_layouts = S.layout("ColwiseParallel", "output_layouts", o.output_layouts, Shard(-1))
  self.use_local_output = o.use_local_output ~= false
  self.async_tp = o.async_tp == true or nil   -- nil: the repr stays PyTorch's
  if self.async_tp and not (self.input_layouts == Shard(2) and self.output_layouts == Shard(-1) and self.use_local_output) then
    error("ColwiseParallel: async_tp needs input_layouts=Shard(2) (sequence shards), output_layouts=Shard(-1) "
          .. "and use_local_output", 3)
  end
end
function M.ColwiseParallel:apply(module, mesh, fqn)
  local k = kind(module)
  if k ~= "Linear" and k ~= "Embedding" then unsupported(self, module, fqn or "") end
  S.shard_parameters(module, distribute(self, mesh, k == "Embedding" and Shard(2) or Shard(1)), self.__name)
  if self.async_tp then   -- the all-gather overlapped with the matmul (async_tp.lua)
    if k ~= "Linear" then unsupported(self, module, fqn or "") end
    module.forward = require("loom.parallel.async_tp").colwise_forward(mesh)
    rawset(module, "_async_tp", true)
    return module
  end
  module:register_forward_pre_hook(input_hook(mesh, self.input_layouts, Replicate()))
  module:register_forward_hook(output_hook(mesh, self.output_layouts, self.use_local_output))
  return module
end

---------------------------------------------------------------------------
-- RowwiseParallel{input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=true}
-- Linear: weight sharded on in (Shard(2)), bias replicated and added once;
-- Embedding: the vocabulary (Shard(1)), out-of-shard ids masked; input
-- Replicate. The product is Partial until the output layout reduces it.
M.RowwiseParallel = S.ParallelStyle:extend("RowwiseParallel")
function M.RowwiseParallel:__init(o)
  self.input_layouts = S.layout("RowwiseParallel", "input_layouts", o.input_layouts, nil)
  self.output_layouts = S.layout("RowwiseParallel", "output_layouts", o.output_layouts, Replicate())
  self.use_local_output = o.use_local_output ~= false
  self.async_tp = o.async_tp == true or nil   -- nil: the repr stays PyTorch's
  if self.async_tp and not (self.output_layouts == Shard(2) and self.use_local_output) then
    error("RowwiseParallel: async_tp needs output_layouts=Shard(2) (sequence shards) and use_local_output", 3)
  end
end
function M.RowwiseParallel:repr()
  return string.format("RowwiseParallel(input_layouts=%s, output_layouts=%s, use_local_output=%s)",
                       self.input_layouts and tostring(self.input_layouts) or "Shard(dim=-1) (Replicate() on Embedding)",
                       tostring(self.output_layouts), tostring(self.use_local_output))
end
function M.RowwiseParallel:apply(module, mesh, fqn)
  local k = kind(module)
  if k ~= "Linear" and k ~= "Embedding" then unsupported(self, module, fqn or "") end
  local linear = k == "Linear"
  S.shard_parameters(module, function(name, p)
    local pl = linear and (name == "bias" and Replicate() or Shard(2)) or Shard(1)
    return distribute(self, mesh, pl)(name, p)
  end, self.__name)
  if self.async_tp then   -- the reduce-scatter overlapped with the matmul (async_tp.lua)
    if not linear then unsupported(self, module, fqn or "") end
    module.forward = require("loom.parallel.async_tp").rowwise_forward(mesh)
    return module
  end
  local from = self.input_layouts or (linear and Shard(-1) or Replicate())
  module:register_forward_pre_hook(input_hook(mesh, from, linear and Shard(-1) or Replicate()))
  module:register_forward_hook(output_hook(mesh, self.output_layouts, self.use_local_output))
  return module
end

---------------------------------------------------------------------------
-- AsyncTPInput{consumers = {"wq", "wk", "wv"}} (loom's, not PyTorch's): on
-- a module whose first input is sequence shards (Shard(2)) and whose named
-- children are ColwiseParallel{input_layouts=Shard(2), async_tp=true}: the
-- input is gathered once, chunk by chunk over p2p, each chunk multiplied by
-- every child's weight as it arrives (async_tp.lua); the children return
-- those products, so the gather is not repeated per child.
M.AsyncTPInput = S.ParallelStyle:extend("AsyncTPInput")
function M.AsyncTPInput:__init(o)
  local c = o.consumers
  if type(c) ~= "table" or #c == 0 then
    error("AsyncTPInput: consumers expected a list of child names, got " .. (type(c) == "table" and "an empty table" or type(c)), 3)
  end
  for i, n in ipairs(c) do
    if type(n) ~= "string" then
      error(string.format("AsyncTPInput: consumers[%d] expected a child name (string), got %s", i, type(n)), 3)
    end
  end
  self.consumers = c
end
function M.AsyncTPInput:repr() return "AsyncTPInput(consumers={" .. table.concat(self.consumers, ", ") .. "})" end
function M.AsyncTPInput:apply(module, mesh, fqn)
  module:register_forward_pre_hook(require("loom.parallel.async_tp").shared_gather_hook(mesh, self.consumers, fqn or ""))
  return module
end

---------------------------------------------------------------------------
-- SequenceParallel{sequence_dim=2, use_local_output=false}: LayerNorm,
-- RMSNorm, Dropout run on sequence shards; their parameters are replicated
-- (from_local: they must already be equal on every rank, as their ones /
-- zeros initialisation makes them; a warning names one that is not).
M.SequenceParallel = S.ParallelStyle:extend("SequenceParallel")
function M.SequenceParallel:__init(o)
  local d = o.sequence_dim or 2
  if type(d) ~= "number" or d == 0 or d ~= math.floor(d) then
    error("SequenceParallel: sequence_dim expected a non-zero integer (1-based), got " .. tostring(d), 3)
  end
  self.sequence_dim = d
  self.use_local_output = o.use_local_output == true
end
local SP_OK = { LayerNorm = true, RMSNorm = true, Dropout = true }

local function fqn_of(prefix, name) return (prefix or "") ~= "" and prefix .. "." .. name or name end

-- the name of the first parameter of module whose values differ between
-- the ranks of mesh, or nil: the elementwise max and min over the ranks
-- (two all-reduces of all its parameters, once, at parallelize time)
local function differing_parameter(module, mesh)
  local named, flat = {}, {}
  for _, kv in ipairs(module:named_parameters()) do
    local p = kv[2]
    if p.is_meta or dt.is_dtensor(p) then return nil end
    named[#named + 1] = kv[1]
    flat[#flat + 1] = p:detach():reshape(-1):to("f64")
  end
  if #flat == 0 then return nil end
  local loom, D = require("loom"), require("loom.distributed")
  local all = loom.no_grad(loom.cat, flat, 1)
  local gap = D.all_reduce(all, "max", mesh) - D.all_reduce(all, "min", mesh)
  local start = 1
  for i, p in ipairs(flat) do
    local n = p:numel()
    if n > 0 and gap:narrow(1, start, n):abs():max():item() > 0 then return named[i] end
    start = start + n
  end
  return nil
end
function M.SequenceParallel:apply(module, mesh, fqn)
  if not SP_OK[kind(module)] then
    error(string.format("SequenceParallel: %s is a %s; it supports LayerNorm, RMSNorm and Dropout",
                        (fqn or "") ~= "" and fqn or "the module", kind(module)), 3)
  end
  local differs = differing_parameter(module, mesh)
  if differs and not M._warned_sp then
    M._warned_sp = true
    if require("loom").C.lm_dist_rank() == 0 then
      io.stderr:write(string.format("loom warning: SequenceParallel replicates parameters as they are (from_local), "
                                    .. "but %s differs between the ranks: initialise it alike on every rank "
                                    .. "(the same loom.manual_seed, or ones/zeros)\n", fqn_of(fqn, differs)))
    end
  end
  S.shard_parameters(module, function(_, p)
    local d = dt.from_local(p:detach(), mesh, { Replicate() })
    return d:requires_grad_(p.requires_grad)
  end, self.__name)
  local seq = Shard(self.sequence_dim)
  module:register_forward_pre_hook(function(_, args)
    local x = args[1]
    if dt.is_dtensor(x) then args[1] = S.prepare(x, mesh, nil, seq, false)
    elseif x ~= nil then args[1] = dt.from_local(x, mesh, { seq }) end
    return args
  end)
  module:register_forward_hook(output_hook(mesh, nil, self.use_local_output))
  return module
end

---------------------------------------------------------------------------
-- NoParallel{input_layout=Replicate(), output_layout=Replicate(),
-- use_local_output=true} (torchtitan's, not PyTorch's): the module runs
-- whole on every rank, its parameters replicated DTensors (their gradients
-- summed where its input was sharded); its input, laid out as
-- input_layout (a plain one taken as this rank's part), is made Replicate
-- first, and its output laid out as output_layout. E.g. a norm over a
-- whole projection whose columns the ranks hold (OLMo 2's q_norm):
-- NoParallel{input_layout = Shard(-1), output_layout = Shard(-1)}.
M.NoParallel = S.ParallelStyle:extend("NoParallel")
function M.NoParallel:__init(o)
  self.input_layout = S.layout("NoParallel", "input_layout", o.input_layout, Replicate())
  self.output_layout = S.layout("NoParallel", "output_layout", o.output_layout, Replicate())
  self.use_local_output = o.use_local_output ~= false
end
function M.NoParallel:apply(module, mesh)
  S.shard_parameters(module, function(_, p)
    local d = dt.from_local(p:detach(), mesh, { Replicate() })
    return d:requires_grad_(p.requires_grad)
  end, self.__name)
  module:register_forward_pre_hook(input_hook(mesh, self.input_layout, Replicate()))
  module:register_forward_hook(output_hook(mesh, self.output_layout, self.use_local_output))
  return module
end

---------------------------------------------------------------------------
-- PairwiseParallel (PyTorch's original API): on a two-layer MLP, the first
-- Linear Colwise and the second Rowwise; input and output replicated.
M.PairwiseParallel = S.ParallelStyle:extend("PairwiseParallel")
function M.PairwiseParallel:__init() end
function M.PairwiseParallel:apply(module, mesh, fqn)
  local linears = {}
  for _, kv in ipairs(module:named_children()) do
    if kind(kv[2]) == "Linear" then linears[#linears + 1] = kv[2] end
  end
  if #linears ~= 2 then
    error(string.format("PairwiseParallel: %s must have exactly two Linear children, it has %d",
                        (fqn or "") ~= "" and fqn or "the module", #linears), 3)
  end
  local col, row = M.ColwiseParallel{}, M.RowwiseParallel{}
  col._src_data_rank, row._src_data_rank = self._src_data_rank, self._src_data_rank
  col:apply(linears[1], mesh)
  row:apply(linears[2], mesh)
  return module
end

return M
