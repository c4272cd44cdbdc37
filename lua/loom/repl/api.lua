-- api.lua: the public API as help() sees it: each table of it, the module
-- that holds it and the prefix its docstrings are keyed by in
-- lua/loom/docstrings.lua ("nn." for loom.nn, "Tensor:" for the methods
-- of tensors). help finds an object's name here and lists the topics from
-- it; spec/docstrings_spec.lua checks that every function and class in
-- these tables has a docstring, so a new public function without one
-- fails the suite.
local M = {}

-- {prefix, module (a package.loaded name), field (a path in it, or nil),
-- topic (the docstring of the table itself), skip (names that are not
-- API: helpers a class shares with its subclasses)}
M.PLACES = {
  { "loom.", "loom", nil, "loom" },
  { "Tensor:", "loom.tensor", "Tensor", "Tensor" },
  { "loom.cuda.", "loom", "cuda", "loom.cuda" },
  { "F.", "loom.functional", nil, "F" },
  { "nn.", "loom.nn", nil, "nn" },
  { "nn.init.", "loom.nn", "init", "nn.init" },
  { "nn.utils.", "loom.nn", "utils", "nn.utils" },
  { "nn.Module:", "loom.nn", "Module", "nn.Module", { new = true, is_module = true } },
  { "optim.", "loom.optim", nil, "optim" },
  { "optim.lr_scheduler.", "loom.optim", "lr_scheduler", "optim.lr_scheduler" },
  { "Optimizer:", "loom.optim.optimizer", nil, "Optimizer", { new = true, check_live = true, check_value = true } },
  { "amp.", "loom.amp", nil, "amp" },
  { "dist.", "loom.distributed", nil, "dist" },
  { "dist.DTensor.", "loom.distributed", "DTensor", "dist.DTensor" },
  { "DeviceMesh:", "loom.distributed.mesh", "DeviceMesh.methods", "dist.DeviceMesh" },
  { "Group:", "loom.distributed.mesh", "Group", "dist.Group" },
  { "Work:", "loom.distributed", "Work", "dist.Work" },
  { "CommMode:", "loom.distributed", "CommMode", "dist.CommMode" },
  { "dist.checkpoint.", "loom.distributed.checkpoint", nil, "dist.checkpoint" },
  { "fsdp.", "loom.distributed.fsdp", nil, "fsdp" },
  { "pp.", "loom.distributed.pipelining", nil, "pp" },
  { "cp.", "loom.distributed.context_parallel", nil, "cp" },
  { "tp.", "loom.parallel", nil, "tp" },
  { "models.", "loom.models", nil, "models" },
  { "hf.", "loom.models.hf", nil, "hf" },
  { "transformer.", "loom.models.transformer", nil, "transformer" },
  { "gpt2.", "loom.models.gpt2", nil, "gpt2" },
  { "data.", "loom.data", nil, "data" },
  { "Tokenizer.", "loom.text.tokenizer", nil, "data.Tokenizer", { Tokenizer = true } },
  { "Tokenizer:", "loom.text.tokenizer", "Tokenizer", "data.Tokenizer" },
  { "TokenFile:", "loom.text.token_file", "TokenFile", "data.TokenFile", { open = true } },
}

-- the names a user may write for a prefix: "loom.nn.Linear" is nn.Linear
M.ALIASES = {
  ["loom.nn."] = "nn.", ["loom.F."] = "F.", ["loom.functional."] = "F.", ["loom.optim."] = "optim.",
  ["loom.amp."] = "amp.", ["loom.distributed."] = "dist.", ["distributed."] = "dist.",
  ["loom.parallel."] = "tp.", ["loom.models.hf."] = "hf.", ["models.hf."] = "hf.",
  ["loom.models.transformer."] = "transformer.", ["models.transformer."] = "transformer.",
  ["loom.models.gpt2."] = "gpt2.", ["models.gpt2."] = "gpt2.", ["loom.models."] = "models.",
  ["loom.data.Tokenizer."] = "Tokenizer.", ["data.Tokenizer."] = "Tokenizer.", ["loom.data."] = "data.",
  ["loom.distributed.checkpoint."] = "dist.checkpoint.", ["loom.distributed.fsdp."] = "fsdp.",
  ["loom.distributed.pipelining."] = "pp.", ["pipelining."] = "pp.",
  ["loom.distributed.context_parallel."] = "cp.", ["context_parallel."] = "cp.",
  ["loom.Tensor."] = "Tensor:", ["loom.Tensor:"] = "Tensor:", ["Tensor."] = "Tensor:",
  ["nn.Module."] = "nn.Module:", ["dist.DeviceMesh:"] = "DeviceMesh:", ["mesh:"] = "DeviceMesh:",
  ["opt:"] = "Optimizer:", ["tok:"] = "Tokenizer:", ["model:"] = "nn.Module:", ["m:"] = "nn.Module:",
}

-- the prefixes of methods, in the order x:name is looked up
M.METHODS = { "Tensor:", "nn.Module:", "Optimizer:", "DeviceMesh:", "Tokenizer:", "TokenFile:", "Work:", "Group:",
              "CommMode:" }

-- the table of a place, or nil when its module is not loaded (load: require it)
function M.table_of(place, load)
  local t = package.loaded[place[2]]
  if t == nil and load then t = require(place[2]) end
  if type(t) ~= "table" then return nil end
  for part in (place[3] or ""):gmatch("[^.]+") do
    if type(t) ~= "table" then return nil end
    t = rawget(t, part) or t[part]
  end
  return type(t) == "table" and t or nil
end

-- the API names of a place's table: every function or table under a name
-- that does not start with "_", but the place's skip list and the tables
-- that are places of their own (loom.nn in loom); sorted
function M.names(place, t)
  local sub = {}
  for _, p in ipairs(M.PLACES) do
    local pt = M.table_of(p)
    if pt and pt ~= t then sub[pt] = true end
  end
  local out = {}
  for k, v in pairs(t) do
    if type(k) == "string" and not k:match("^_") and not (place[5] and place[5][k])
       and (type(v) == "function" or (type(v) == "table" and not sub[v])) then
      out[#out + 1] = k
    end
  end
  table.sort(out)
  return out
end

return M
