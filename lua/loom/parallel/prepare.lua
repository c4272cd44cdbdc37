-- prepare.lua: PrepareModuleInput, PrepareModuleOutput and
-- PrepareModuleInputOutput: lay out a module's inputs or outputs without
-- sharding its parameters. Named inputs arrive in a trailing table argument.
local T = require("loom.tensor")
local S = require("loom.parallel.parallel_style")

local M = {}

-- the positional layouts of `what` ("input" or "output") in o and their
-- desired ones: two lists of one length, or both nil (an error if required)
local function layout_pair(style, what, o, required)
  local a_name, b_name = what .. "_layouts", "desired_" .. what .. "_layouts"
  local a, b = S.layouts(style, a_name, o[a_name], 5), S.layouts(style, b_name, o[b_name], 5)
  if required and not a then error(style .. ": " .. a_name .. " is required", 4) end
  if (a == nil) ~= (b == nil) then
    error(string.format("%s: %s and %s must be given together", style, a_name, b_name), 4)
  end
  if a and a.n ~= b.n then
    error(string.format("%s: %s has %d entries but %s has %d", style, a_name, a.n, b_name, b.n), 4)
  end
  return a, b
end

-- list[i] laid out from from[i] to to[i], for each i with a from layout
local function prepare_each(list, mesh, from, to, use_local)
  for i = 1, from.n do
    if from[i] ~= nil then list[i] = S.prepare(list[i], mesh, from[i], to[i], use_local) end
  end
end

-- named layouts: { name = placement }
local function named(style, name, v)
  if v == nil then return nil end
  if type(v) ~= "table" then T.argerror(style, name, "a table of name = placement", T.describe(v), 4) end
  return v
end

local function input_hook(self, mesh)
  return function(_, args)
    local n = args.n or #args
    local kwargs = n > 0 and type(args[n]) == "table" and not T.is_tensor(args[n]) and args[n] or nil
    local npos = kwargs and n - 1 or n
    if self.input_layouts then
      if npos < self.input_layouts.n then
        error(string.format("PrepareModuleInput: the module got %d inputs, input_layouts has %d", npos,
                            self.input_layouts.n), 3)
      end
      prepare_each(args, mesh, self.input_layouts, self.desired_input_layouts, self.use_local_output)
    end
    if self.input_kwarg_layouts and kwargs then
      for k, from in pairs(self.input_kwarg_layouts) do
        kwargs[k] = S.prepare(kwargs[k], mesh, from, self.desired_input_kwarg_layouts[k], self.use_local_output)
      end
    end
    return args
  end
end

local function output_hook(self, mesh)
  return function(_, _, out)
    local single = T.is_tensor(out)
    local outs = single and { out } or out
    if type(outs) ~= "table" then return out end
    if #outs ~= self.output_layouts.n then
      error(string.format("PrepareModuleOutput: the module returned %d outputs, output_layouts has %d", #outs,
                          self.output_layouts.n), 3)
    end
    prepare_each(outs, mesh, self.output_layouts, self.desired_output_layouts, self.use_local_output)
    return single and outs[1] or outs
  end
end

-- a style class whose apply registers hook(style, mesh) on the module
-- through its method `register` (a forward pre-hook or a forward hook)
local function hook_style(name, register, hook)
  local cls = S.ParallelStyle:extend(name)
  function cls:apply(module, mesh)
    module[register](module, hook(self, mesh))
    return module
  end
  return cls
end

-- PrepareModuleInput{input_layouts, desired_input_layouts, input_kwarg_layouts,
-- desired_input_kwarg_layouts, use_local_output=false}
M.PrepareModuleInput = hook_style("PrepareModuleInput", "register_forward_pre_hook", input_hook)
function M.PrepareModuleInput:__init(o)
  local n = "PrepareModuleInput"
  self.input_layouts, self.desired_input_layouts = layout_pair(n, "input", o)
  self.input_kwarg_layouts = named(n, "input_kwarg_layouts", o.input_kwarg_layouts)
  self.desired_input_kwarg_layouts = named(n, "desired_input_kwarg_layouts", o.desired_input_kwarg_layouts) or {}
  self.use_local_output = o.use_local_output == true
end

-- PrepareModuleOutput{output_layouts, desired_output_layouts, use_local_output=true}
M.PrepareModuleOutput = hook_style("PrepareModuleOutput", "register_forward_hook", output_hook)
function M.PrepareModuleOutput:__init(o)
  local n = "PrepareModuleOutput"
  self.output_layouts, self.desired_output_layouts = layout_pair(n, "output", o, true)
  self.use_local_output = o.use_local_output ~= false
end

-- PrepareModuleInputOutput{...both sets...; use_local_input=false, use_local_output=true}
M.PrepareModuleInputOutput = S.ParallelStyle:extend("PrepareModuleInputOutput")
function M.PrepareModuleInputOutput:__init(o)
  self._input = M.PrepareModuleInput{ input_layouts = o.input_layouts, desired_input_layouts = o.desired_input_layouts,
    input_kwarg_layouts = o.input_kwarg_layouts, desired_input_kwarg_layouts = o.desired_input_kwarg_layouts,
    use_local_output = o.use_local_input }
  self._output = M.PrepareModuleOutput{ output_layouts = o.output_layouts,
    desired_output_layouts = o.desired_output_layouts, use_local_output = o.use_local_output }
end
function M.PrepareModuleInputOutput:apply(module, mesh)
  self._input:apply(module, mesh)
  self._output:apply(module, mesh)
  return module
end
function M.PrepareModuleInputOutput:repr()
  return "PrepareModuleInputOutput(" .. self._input:repr() .. ", " .. self._output:repr() .. ")"
end

return M
