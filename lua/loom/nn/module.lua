-- module.lua: nn.Module, Torch7's module protocol with PyTorch's registry:
-- assigning a module or a parameter to a field registers it under that name,
-- so named_parameters() yields FQNs like "layers.1.attention.wq.weight".
local loom = require("loom")
local T = require("loom.tensor")

local Module = { __name = "Module" }

-- Instances keep registered children in ordered tables; every other field
-- is a plain Lua field.
-- Children are named by strings: m[1] finds the child "1" (Sequential,
-- ModuleList).
local function index(self, k)
  local p = rawget(self, "_parameters")
  if p then
    local v = p[k]
    if v ~= nil then return v end
    v = rawget(self, "_buffers")[k]
    if v ~= nil then return v end
    v = rawget(self, "_modules")[type(k) == "number" and tostring(k) or k]
    if v ~= nil then return v end
  end
  return getmetatable(self)[k]
end

local function is_module(v) return type(v) == "table" and rawget(v, "_modules") ~= nil end
Module.is_module = is_module

-- A tensor that requires grad and is a leaf is a parameter (nn.Parameter
-- makes one); frozen parameters stay registered once registered.
local function is_param(v) return T.is_tensor(v) and v.requires_grad and v.is_leaf end

local function register(self, kind, name, v)
  local t = rawget(self, kind)
  if t[name] == nil then table.insert(rawget(self, "_order")[kind], name) end
  t[name] = v
end

local function newindex(self, k, v)
  if type(k) == "number" and is_module(v) then k = tostring(k) end
  local params, mods, bufs = rawget(self, "_parameters"), rawget(self, "_modules"), rawget(self, "_buffers")
  if params[k] ~= nil and (v == nil or T.is_tensor(v)) then params[k] = v return end
  if bufs[k] ~= nil and (v == nil or T.is_tensor(v)) then bufs[k] = v return end
  if mods[k] ~= nil and (v == nil or is_module(v)) then mods[k] = v return end
  if is_module(v) then register(self, "_modules", k, v)
  elseif is_param(v) then register(self, "_parameters", k, v)
  else rawset(self, k, v) end
end

local function call(self, ...)
  local args = { n = select("#", ...), ... }
  local pre, post = rawget(self, "_pre_hooks"), rawget(self, "_hooks")
  -- copies, so that a hook may remove itself while they run
  for _, hook in ipairs(#pre > 0 and { unpack(pre) } or pre) do
    local r = hook[1](self, args)
    if r ~= nil then args = type(r) == "table" and not T.is_tensor(r) and r or { n = 1, r } end
    args.n = args.n or #args
  end
  local out = self:forward(unpack(args, 1, args.n))
  for _, hook in ipairs(#post > 0 and { unpack(post) } or post) do
    local r = hook[1](self, args, out)
    if r ~= nil then out = r end
  end
  return out
end

-- nn.Module:extend("Name") makes a class; Class(...) makes an instance and
-- runs its __init(...).
function Module:extend(name)
  local cls = setmetatable({ __name = name or "Module", super = self }, { __index = self,
    __call = function(c, ...) return c.new(c, ...) end })
  cls.__index, cls.__newindex, cls.__call = index, newindex, call
  cls.__tostring = function(m) return m:repr() end
  return cls
end

function Module.new(cls, ...)
  local self = setmetatable({ _parameters = {}, _modules = {}, _buffers = {},
    _order = { _parameters = {}, _modules = {}, _buffers = {} },
    _pre_hooks = {}, _hooks = {}, training = true }, cls)
  if cls.__init then cls.__init(self, ...) end
  return self
end

function Module:forward()
  error(self.__name .. ": forward is not implemented", 2)
end

function Module:register_parameter(name, t)
  if t ~= nil and not T.is_tensor(t) then T.argerror("register_parameter", "param", "a tensor or nil", T.describe(t)) end
  register(self, "_parameters", name, t)
end

-- register_buffer(name, t, {persistent=true}): state that is no parameter;
-- a non-persistent buffer (a table computed from the config, say) moves
-- with the module but stays out of state_dict().
function Module:register_buffer(name, t, opts)
  if t ~= nil and not T.is_tensor(t) then T.argerror("register_buffer", "tensor", "a tensor or nil", T.describe(t)) end
  register(self, "_buffers", name, t)
  local np = rawget(self, "_non_persistent")
  if opts and opts.persistent == false then
    if not np then np = {} rawset(self, "_non_persistent", np) end
    np[name] = true
  elseif np then np[name] = nil end
end

function Module:register_module(name, m)
  if not is_module(m) then T.argerror("register_module", "module", "a module", T.describe(m)) end
  register(self, "_modules", name, m)
end

-- registration-ordered pairs of one kind
local function ordered(self, kind)
  local out = {}
  for _, name in ipairs(rawget(self, "_order")[kind]) do
    local v = rawget(self, kind)[name]
    if v ~= nil then out[#out + 1] = { name, v } end
  end
  return out
end

-- named_modules(): { {fqn, module}, ... } in depth-first order, self first as "".
function Module:named_modules(prefix, out)
  prefix, out = prefix or "", out or {}
  out[#out + 1] = { prefix, self }
  for _, kv in ipairs(ordered(self, "_modules")) do
    kv[2]:named_modules(prefix == "" and kv[1] or prefix .. "." .. kv[1], out)
  end
  return out
end

function Module:named_children() return ordered(self, "_modules") end

-- keep_duplicates: a tensor registered under several names (tied
-- weights) is listed under each; otherwise once, under its first name.
local function named(self, kind, keep_duplicates)
  local out, seen = {}, {}
  for _, mm in ipairs(self:named_modules()) do
    for _, kv in ipairs(ordered(mm[2], kind)) do
      local addr = T.address(kv[2])
      if keep_duplicates or not seen[addr] then
        seen[addr] = true
        out[#out + 1] = { mm[1] == "" and kv[1] or mm[1] .. "." .. kv[1], kv[2] }
      end
    end
  end
  return out
end

-- named_parameters(): { {fqn, tensor}, ... } in registration order
function Module:named_parameters() return named(self, "_parameters") end
function Module:named_buffers() return named(self, "_buffers") end

function Module:parameters()
  local out = {}
  for _, kv in ipairs(self:named_parameters()) do out[#out + 1] = kv[2] end
  return out
end

function Module:get_submodule(fqn)
  if fqn == "" then return self end
  local m = self
  for part in fqn:gmatch("[^.]+") do
    local child = rawget(m, "_modules")[part]
    if not child then
      error(string.format("get_submodule: %s has no submodule %q (in %q)", m.__name, part, fqn), 2)
    end
    m = child
  end
  return m
end

-- state_dict(): FQN -> tensor (parameters and buffers, sharing storage).
-- As in PyTorch, a tied parameter appears under each of its names.
function Module:state_dict()
  local sd = {}
  for _, kv in ipairs(named(self, "_parameters", true)) do sd[kv[1]] = kv[2]:detach() end
  for _, kv in ipairs(self:named_persistent_buffers()) do sd[kv[1]] = kv[2]:detach() end
  return sd
end

-- the buffers state_dict() holds: not those registered persistent=false
function Module:named_persistent_buffers()
  local out = {}
  for _, mm in ipairs(self:named_modules()) do
    local np = rawget(mm[2], "_non_persistent") or {}
    for _, kv in ipairs(ordered(mm[2], "_buffers")) do
      if not np[kv[1]] then out[#out + 1] = { mm[1] == "" and kv[1] or mm[1] .. "." .. kv[1], kv[2] } end
    end
  end
  return out
end

-- own[k]:copy_(sd[k]) for the keys of both (not a closure over them, which a
-- compiled trace would keep: docs/architecture.md)
local function copy_into(own, sd)
  for k, t in pairs(own) do if sd[k] ~= nil then t:copy_(sd[k]) end end
end

-- load_state_dict(sd, {strict=true}): copies values in place; strict mode
-- names every missing and unexpected key, and shape mismatches are errors.
function Module:load_state_dict(sd, opts)
  local strict = not (opts and opts.strict == false)
  if type(sd) ~= "table" then T.argerror("load_state_dict", "state_dict", "a table", T.describe(sd)) end
  local own, missing, unexpected, bad = {}, {}, {}, {}
  for _, kv in ipairs(named(self, "_parameters", true)) do own[kv[1]] = kv[2] end
  for _, kv in ipairs(self:named_persistent_buffers()) do own[kv[1]] = kv[2] end
  for k, t in pairs(own) do
    local v = sd[k]
    if v == nil then missing[#missing + 1] = k
    elseif not T.is_tensor(v) then bad[#bad + 1] = k .. " (not a tensor)"
    elseif table.concat(v:size(), "x") ~= table.concat(t:size(), "x") then
      bad[#bad + 1] = string.format("%s (expected size %s, got %s)", k, table.concat(t:size(), "x"),
                                    table.concat(v:size(), "x"))
    end
  end
  for k in pairs(sd) do if own[k] == nil then unexpected[#unexpected + 1] = k end end
  table.sort(missing) table.sort(unexpected) table.sort(bad)
  local problems = {}
  if #bad > 0 then problems[#problems + 1] = "size mismatch for " .. table.concat(bad, ", ") end
  if strict and #missing > 0 then problems[#problems + 1] = "missing keys: " .. table.concat(missing, ", ") end
  if strict and #unexpected > 0 then problems[#problems + 1] = "unexpected keys: " .. table.concat(unexpected, ", ") end
  if #problems > 0 then error("load_state_dict: " .. table.concat(problems, "; "), 2) end
  loom.no_grad(copy_into, own, sd)
  return { missing_keys = missing, unexpected_keys = unexpected }
end

function Module:train(mode)
  if mode ~= nil and type(mode) ~= "boolean" then T.argerror("train", "mode", "a boolean", T.describe(mode)) end
  if mode == nil then mode = true end
  for _, mm in ipairs(self:named_modules()) do rawset(mm[2], "training", mode) end
  return self
end

function Module:eval() return self:train(false) end

function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p.grad = nil end
end

-- hooks: pre(module, args) may return new args; post(module, args, out)
-- may return a new output. Each returns a handle with :remove().
local function add_hook(list, fn)
  if type(fn) ~= "function" then T.argerror("register hook", "fn", "a function", T.describe(fn), 3) end
  local entry = { fn }   -- removal finds this registration, not any equal fn
  list[#list + 1] = entry
  return { remove = function()
    for i, e in ipairs(list) do if e == entry then table.remove(list, i) return end end
  end }
end
function Module:register_forward_pre_hook(fn) return add_hook(rawget(self, "_pre_hooks"), fn) end
function Module:register_forward_hook(fn) return add_hook(rawget(self, "_hooks"), fn) end

function Module:extra_repr() return "" end

-- The module tree, as PyTorch prints it.
function Module:repr()
  local children = ordered(self, "_modules")
  local head = self.__name .. "(" .. self:extra_repr()
  if #children == 0 then return head .. ")" end
  local lines = { head }
  for _, kv in ipairs(children) do
    local s = kv[2]:repr():gsub("\n", "\n  ")
    lines[#lines + 1] = "  (" .. kv[1] .. "): " .. s
  end
  return table.concat(lines, "\n") .. "\n)"
end

function Module:apply(fn)
  for _, mm in ipairs(self:named_modules()) do fn(mm[2]) end
  return self
end

return Module
