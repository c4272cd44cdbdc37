-- layers.lua: the standard layers (PyTorch's names, shapes and default
-- initialisations), each a small Module over loom.F.
local loom = require("loom")
local T = require("loom.tensor")
local TC = require("loom.tensor_create")
local Module = require("loom.nn.module")

local F = loom.F
local init = require("loom.nn.weights")
local M = {}

-- nn.Parameter(t): t as a trainable leaf
function M.Parameter(t)
  T.check_tensor(t, "Parameter", "data")
  return t:detach():requires_grad_(true)
end

-- The checks below run in __init, called by Module.new: their errors
-- name the line that made the layer (level 4 from the check).
local LV = 4

local function positive_int(fname, name, v)
  if not T.is_int(v) or v < 1 then
    T.argerror(fname, name, "a positive integer", T.describe(v), LV)
  end
end

-- eps: a finite number >= 0 (nil: the default)
local function check_eps(fname, eps)
  if eps ~= nil and (type(eps) ~= "number" or not (eps >= 0 and eps < math.huge)) then
    T.argerror(fname, "eps", "a finite number >= 0", T.describe(eps), LV)
  end
  return eps
end

local function check_flag(fname, name, v)
  if v ~= nil and type(v) ~= "boolean" then T.argerror(fname, name, "a boolean", T.describe(v), LV) end
end

local function float_dtype(fname, dtype)
  TC.check_float_dtype(fname, dtype, LV)
end

-- a parameter of the given size, dtype and device, filled by the layer's
-- reset_parameters (construction and init_weights draw alike)
local function param(size, opts)
  return M.Parameter(loom.empty(size, { dtype = opts.dtype, device = opts.device }))
end

-- the init_std option of Linear and Embedding: nil or a number >= 0
local function init_std_arg(fname, v)
  if v ~= nil and (type(v) ~= "number" or not (v >= 0) or v == math.huge) then
    T.argerror(fname, "init_std", "a number >= 0", T.describe(v), LV)
  end
  return v
end

-- Linear(in, out, {bias=true, dtype, device, weight, init_std}): y = x W^T
-- + b with W (out, in), initialised as PyTorch does: U(-1/sqrt(in),
-- 1/sqrt(in)) for W and b; with init_std (loom's), W ~ N(0, init_std^2)
-- and b = 0, as GPT-2 and Hugging Face's _init_weights do. opts.weight
-- shares another module's parameter (tied weights), which that module
-- initialises.
M.Linear = Module:extend("Linear")
function M.Linear:__init(in_features, out_features, opts)
  positive_int("Linear", "in_features", in_features)
  positive_int("Linear", "out_features", out_features)
  opts = T.check_opts("Linear", opts, { bias = true, dtype = true, device = true, weight = true, init_std = true }, LV - 1)
  check_flag("Linear", "bias", opts.bias)
  self.init_std = init_std_arg("Linear", opts.init_std)
  float_dtype("Linear", opts.dtype)
  self.in_features, self.out_features = in_features, out_features
  if opts.weight ~= nil then
    T.check_tensor(opts.weight, "Linear", "weight")
    if opts.weight:size(1) ~= out_features or opts.weight:size(2) ~= in_features then
      T.argerror("Linear", "weight", string.format("a tensor of size %dx%d", out_features, in_features),
                 table.concat(opts.weight:size(), "x"))
    end
    self.weight, self.tied = opts.weight, true
  else
    self.weight = param({ out_features, in_features }, opts)
  end
  if opts.bias ~= false then self.bias = param({ out_features }, opts) end
  self:reset_parameters()
end
function M.Linear:reset_parameters()
  if self.init_std then
    if not self.tied then init.normal_(self.weight, 0, self.init_std) end
    if self.bias ~= nil then init.zeros_(self.bias) end
    return
  end
  local bound = 1 / math.sqrt(self.in_features)
  if not self.tied then init.uniform_(self.weight, -bound, bound) end
  if self.bias ~= nil then init.uniform_(self.bias, -bound, bound) end
end
function M.Linear:forward(x) return F.linear(x, self.weight, self.bias) end
function M.Linear:extra_repr()
  return string.format("in_features=%d, out_features=%d, bias=%s", self.in_features,
                       self.out_features, tostring(self.bias ~= nil))
end


-- Embedding(n, dim, {dtype, device, init_std = 1}): weight (n, dim) ~
-- N(0, init_std^2); ids are 1-based
M.Embedding = Module:extend("Embedding")
function M.Embedding:__init(n, dim, opts)
  positive_int("Embedding", "num_embeddings", n)
  positive_int("Embedding", "embedding_dim", dim)
  opts = T.check_opts("Embedding", opts, { dtype = true, device = true, init_std = true }, LV - 1)
  float_dtype("Embedding", opts.dtype)
  self.num_embeddings, self.embedding_dim = n, dim
  self.init_std = init_std_arg("Embedding", opts.init_std)
  self.weight = param({ n, dim }, opts)
  self:reset_parameters()
end
function M.Embedding:reset_parameters() init.normal_(self.weight, 0, self.init_std or 1) end
function M.Embedding:forward(ids) return F.embedding(ids, self.weight) end
function M.Embedding:extra_repr() return self.num_embeddings .. ", " .. self.embedding_dim end

local function norm_shape(fname, shape)
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" or T.is_tensor(shape) or #shape == 0 then
    T.argerror(fname, "normalized_shape", "a size or a non-empty table of sizes", T.describe(shape), LV)
  end
  for _, v in ipairs(shape) do
    if not T.is_int(v) or v < 1 then
      T.argerror(fname, "normalized_shape", "positive integers", T.describe(v), LV)
    end
  end
  return shape
end

-- LayerNorm(shape, {eps=1e-5, elementwise_affine=true, bias=true})
M.LayerNorm = Module:extend("LayerNorm")
function M.LayerNorm:__init(shape, opts)
  opts = T.check_opts("LayerNorm", opts, { eps = true, elementwise_affine = true, bias = true, dtype = true, device = true }, LV - 1)
  self.normalized_shape = norm_shape("LayerNorm", shape)
  self.eps = check_eps("LayerNorm", opts.eps) or 1e-5
  check_flag("LayerNorm", "elementwise_affine", opts.elementwise_affine)
  check_flag("LayerNorm", "bias", opts.bias)
  float_dtype("LayerNorm", opts.dtype)
  if opts.elementwise_affine ~= false then
    self.weight = param(self.normalized_shape, opts)
    if opts.bias ~= false then self.bias = param(self.normalized_shape, opts) end
  end
  self:reset_parameters()
end
function M.LayerNorm:reset_parameters()
  if self.weight ~= nil then init.ones_(self.weight) end
  if self.bias ~= nil then init.zeros_(self.bias) end
end
function M.LayerNorm:forward(x) return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps) end
function M.LayerNorm:extra_repr() return "(" .. table.concat(self.normalized_shape, ", ") .. "), eps=" .. self.eps end

-- RMSNorm(shape, {eps=1e-6, offset=0}): x / rms(x) * weight (Llama's);
-- with offset (loom's) x / rms(x) * (offset + weight), the weight starting
-- at zeros: Gemma's RMSNorm is offset = 1
M.RMSNorm = Module:extend("RMSNorm")
function M.RMSNorm:__init(shape, opts)
  opts = T.check_opts("RMSNorm", opts, { eps = true, elementwise_affine = true, dtype = true, device = true, offset = true },
                      LV - 1)
  self.normalized_shape = norm_shape("RMSNorm", shape)
  self.eps = check_eps("RMSNorm", opts.eps) or 1e-6
  check_flag("RMSNorm", "elementwise_affine", opts.elementwise_affine)
  if opts.offset ~= nil and (type(opts.offset) ~= "number" or opts.offset ~= opts.offset) then
    T.argerror("RMSNorm", "offset", "a number", T.describe(opts.offset), LV - 1)
  end
  self.offset = opts.offset ~= 0 and opts.offset or nil
  float_dtype("RMSNorm", opts.dtype)
  if opts.elementwise_affine ~= false then self.weight = param(self.normalized_shape, opts) end
  self:reset_parameters()
end
function M.RMSNorm:reset_parameters()
  if self.weight ~= nil then init.constant_(self.weight, self.offset and 0 or 1) end
end
function M.RMSNorm:forward(x)
  local w = self.weight
  if self.offset and w ~= nil then w = w + self.offset end
  return F.rms_norm(x, self.normalized_shape, w, self.eps)
end
function M.RMSNorm:extra_repr() return "(" .. table.concat(self.normalized_shape, ", ") .. "), eps=" .. self.eps end

M.Dropout = Module:extend("Dropout")
function M.Dropout:__init(p)
  p = p or 0.5
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then T.argerror("Dropout", "p", "a probability in [0, 1]", T.describe(p), LV - 1) end
  self.p = p
end
function M.Dropout:forward(x) return F.dropout(x, self.p, self.training) end
function M.Dropout:extra_repr() return "p=" .. self.p end

-- activations as modules
for name, fn in pairs { ReLU = "relu", SiLU = "silu", Tanh = "tanh", Sigmoid = "sigmoid", Mish = "mish" } do
  M[name] = Module:extend(name)
  M[name].forward = function(_, x) return F[fn](x) end
end
M.Hardtanh = Module:extend("Hardtanh")
function M.Hardtanh:__init(min_val, max_val) self.min_val, self.max_val = min_val or -1, max_val or 1 end
function M.Hardtanh:forward(x) return F.hardtanh(x, self.min_val, self.max_val) end
function M.Hardtanh:extra_repr() return ("min_val=%g, max_val=%g"):format(self.min_val, self.max_val) end
M.Softplus = Module:extend("Softplus")
function M.Softplus:__init(beta, threshold) self.beta, self.threshold = beta or 1, threshold or 20 end
function M.Softplus:forward(x) return F.softplus(x, self.beta, self.threshold) end
function M.Softplus:extra_repr() return ("beta=%g, threshold=%g"):format(self.beta, self.threshold) end
M.ReLU6 = Module:extend("ReLU6")
function M.ReLU6:forward(x) return F.relu6(x) end
M.GELU = Module:extend("GELU")
function M.GELU:__init(opts)
  if type(opts) == "string" then opts = { approximate = opts } end
  opts = T.check_opts("GELU", opts, { approximate = true }, LV - 1)
  local a = opts.approximate or "none"
  if a ~= "none" and a ~= "tanh" then T.argerror("GELU", "approximate", "\"none\" or \"tanh\"", T.describe(a), LV - 1) end
  self.approximate = a
end
function M.GELU:forward(x) return F.gelu(x, { approximate = self.approximate }) end

-- Sequential(m1, m2, ...): children named 1, 2, ...
M.Sequential = Module:extend("Sequential")
function M.Sequential:__init(...)
  for i = 1, select("#", ...) do
    local m = select(i, ...)
    if not Module.is_module(m) then T.argerror("Sequential", "module #" .. i, "an nn.Module", T.describe(m), LV - 1) end
    self:register_module(tostring(i), m)
  end
end
function M.Sequential:forward(x)
  for _, kv in ipairs(self:named_children()) do x = kv[2](x) end
  return x
end
-- LuaJIT (Lua 5.1) ignores __len on tables: s:len() is the child count
function M.Sequential:len() return #self:named_children() end
M.Sequential.__len = M.Sequential.len

-- ModuleList({m1, m2, ...}): children named 1, 2, ...; list[i] indexes
M.ModuleList = Module:extend("ModuleList")
function M.ModuleList:__init(list)
  if list ~= nil and (type(list) ~= "table" or Module.is_module(list)) then
    T.argerror("ModuleList", "modules", "a list of modules", T.describe(list), LV - 1)
  end
  for _, m in ipairs(list or {}) do self:append(m) end
end
function M.ModuleList:append(m)
  if not Module.is_module(m) then T.argerror("ModuleList", "module", "an nn.Module", T.describe(m), 2) end
  self:register_module(tostring(#self:named_children() + 1), m)
  return self
end
function M.ModuleList:len() return #self:named_children() end
M.ModuleList.__len = M.ModuleList.len
function M.ModuleList:at(i) return rawget(self, "_modules")[tostring(i)] end
function M.ModuleList:ipairs()
  local children, i = self:named_children(), 0
  return function()
    i = i + 1
    if children[i] then return i, children[i][2] end
  end
end

return M
