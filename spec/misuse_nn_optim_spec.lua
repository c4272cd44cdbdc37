-- misuse_nn_optim_spec.lua: bad calls of loom.nn (layers, the Module API,
-- gradient clipping) and loom.optim (optimizers, their hyperparameters
-- and parameter lists, state_dicts, schedules), each a Lua error naming
-- the argument and what was expected.
local loom = require("loom")
local X = require("support.misuse")
local nn, optim = loom.nn, loom.optim
local sched = optim.lr_scheduler

local leaf = function() return loom.ones(2, { requires_grad = true }) end
local lin = function() return nn.Linear(2, 2) end

local layers = {
  title = "layers",
  { "Linear with 0 inputs", function() return nn.Linear(0, 3) end, "Linear", "in_features", "positive integer" },
  { "Linear with fractional outputs", function() return nn.Linear(2, 2.5) end, "Linear", "out_features", "2.5" },
  { "Linear with a string bias flag", function() return nn.Linear(2, 3, { bias = "no" }) end, "Linear", "bias", "boolean" },
  { "Linear with a misspelt option", function() return nn.Linear(2, 3, { biass = false }) end, "Linear", "options", "biass" },
  { "Linear with an integer dtype", function() return nn.Linear(2, 3, { dtype = "i32" }) end, "Linear", "dtype", "floating-point" },
  { "Linear on an input of the wrong width", function() return nn.Linear(2, 3)(loom.ones(2, 4)) end, "matmul", "columns" },
  { "Linear on a string", function() return nn.Linear(2, 3)("x") end, "linear", "input", "tensor" },
  { "Embedding of 0 rows", function() return nn.Embedding(0, 3) end, "Embedding", "num_embeddings", "positive integer" },
  { "Embedding of NaN columns", function() return nn.Embedding(3, 0 / 0) end, "Embedding", "embedding_dim", "nan" },
  { "Embedding with an integer dtype", function() return nn.Embedding(3, 3, { dtype = "i64" }) end, "Embedding", "dtype", "floating-point" },
  { "Embedding with a misspelt option", function() return nn.Embedding(3, 3, { padding_idx = 1 }) end, "Embedding", "options", "padding_idx" },
  { "Embedding of an id past the vocabulary", function() return nn.Embedding(3, 3)(loom.tensor({ 4 }, { dtype = "i64" })) end, "embedding", "4", "[1, 3]" },
  { "Embedding of float ids", function() return nn.Embedding(3, 3)(loom.tensor({ 1 })) end, "embedding", "input", "integer" },
  { "LayerNorm over size 0", function() return nn.LayerNorm(0) end, "LayerNorm", "normalized_shape", "positive" },
  { "LayerNorm over nothing", function() return nn.LayerNorm({}) end, "LayerNorm", "normalized_shape", "non-empty" },
  { "LayerNorm with a negative eps", function() return nn.LayerNorm(4, { eps = -1 }) end, "LayerNorm", "eps", ">= 0" },
  { "LayerNorm with a misspelt option", function() return nn.LayerNorm(4, { epsilon = 1e-5 }) end, "LayerNorm", "options", "epsilon" },
  { "LayerNorm with a string affine flag", function() return nn.LayerNorm(4, { elementwise_affine = "yes" }) end, "LayerNorm", "elementwise_affine", "boolean" },
  { "LayerNorm on an input of the wrong width", function() return nn.LayerNorm(4)(loom.ones(2, 3)) end, "layer_norm", "normalized_shape", "{3}" },
  { "RMSNorm with a NaN eps", function() return nn.RMSNorm(4, { eps = 0 / 0 }) end, "RMSNorm", "eps", "nan" },
  { "RMSNorm over a string", function() return nn.RMSNorm("4") end, "RMSNorm", "normalized_shape", '"4"' },
  { "RMSNorm with a bias option", function() return nn.RMSNorm(4, { bias = false }) end, "RMSNorm", "options", "bias" },
  { "RMSNorm on an input of the wrong width", function() return nn.RMSNorm(4)(loom.ones(2, 3)) end, "rms_norm", "normalized_shape", "{4}" },
  { "Dropout with p = 2", function() return nn.Dropout(2) end, "Dropout", "p", "[0, 1]" },
  { "Dropout with p = NaN", function() return nn.Dropout(0 / 0) end, "Dropout", "p", "nan" },
  { "GELU with an unknown approximation", function() return nn.GELU({ approximate = "fast" }) end, "GELU", "approximate", '"fast"' },
  { "GELU with an unknown string", function() return nn.GELU("erf") end, "GELU", "approximate", '"erf"' },
  { "Sequential of a number", function() return nn.Sequential(nn.ReLU(), 3) end, "Sequential", "module #2", "nn.Module" },
  { "ModuleList with a string inside", function() return nn.ModuleList({ nn.ReLU(), "x" }) end, "ModuleList", "module", "nn.Module" },
  { "ModuleList of a string", function() return nn.ModuleList("x") end, "ModuleList", "modules", "list" },
  { "Parameter of a number", function() return nn.Parameter(3) end, "Parameter", "data", "tensor" },
}

local modules = {
  title = "the Module API",
  { "register_parameter of a number", function() nn.ReLU():register_parameter("w", 3) end, "register_parameter", "param", "tensor" },
  { "register_buffer of a table", function() nn.ReLU():register_buffer("b", {}) end, "register_buffer", "tensor" },
  { "register_module of a table", function() nn.ReLU():register_module("m", {}) end, "register_module", "module" },
  { "a forward hook that is a number", function() nn.ReLU():register_forward_hook(3) end, "hook", "fn", "function" },
  { "a forward pre-hook that is a string", function() nn.ReLU():register_forward_pre_hook("f") end, "hook", "fn", "function" },
  { "get_submodule of a missing path", function() nn.ReLU():get_submodule("a.b") end, "get_submodule", "no submodule", '"a"' },
  { "load_state_dict of a number", function() lin():load_state_dict(3) end, "load_state_dict", "state_dict", "table" },
  { "load_state_dict with a wrong size", function() lin():load_state_dict({ weight = loom.ones(3, 3), bias = loom.ones(2) }) end, "load_state_dict", "weight", "expected size 2x2, got 3x3" },
  { "load_state_dict missing a key", function() lin():load_state_dict({ weight = loom.ones(2, 2) }) end, "load_state_dict", "missing keys: bias" },
  { "load_state_dict with an extra key", function() lin():load_state_dict({ weight = loom.ones(2, 2), bias = loom.ones(2), extra = loom.ones(1) }) end, "load_state_dict", "unexpected keys: extra" },
  { "load_state_dict with a string value", function() lin():load_state_dict({ weight = "w", bias = loom.ones(2) }) end, "load_state_dict", "weight (not a tensor)" },
  { "a module without forward", function() nn.Module:extend("NoForward")()(loom.ones(1)) end, "NoForward", "forward is not implemented" },
  { "train with a string mode", function() lin():train("yes") end, "train", "mode", "boolean" },
  { "clip_grad_norm_ with a negative max_norm", function() nn.utils.clip_grad_norm_({ leaf() }, -1) end, "clip_grad_norm_", "max_norm", "positive" },
  { "clip_grad_norm_ with a NaN max_norm", function() nn.utils.clip_grad_norm_({ leaf() }, 0 / 0) end, "clip_grad_norm_", "max_norm", "nan" },
  { "clip_grad_norm_ of a string", function() nn.utils.clip_grad_norm_("x", 1) end, "clip_grad_norm_", "parameters", "table" },
  { "clip_grad_norm_ of a list with a number", function() nn.utils.clip_grad_norm_({ 3 }, 1) end, "clip_grad_norm_", "parameters[1]", "tensor" },
}

local p = leaf
local optimizers = {
  title = "optimizers and schedules",
  { "SGD with a negative lr", function() optim.SGD({ p() }, { lr = -0.1 }) end, "SGD", "lr", ">= 0" },
  { "SGD with a NaN lr", function() optim.SGD({ p() }, { lr = 0 / 0 }) end, "SGD", "lr", "nan" },
  { "SGD with an infinite lr", function() optim.SGD({ p() }, { lr = math.huge }) end, "SGD", "lr", "finite" },
  { "SGD with a string lr", function() optim.SGD({ p() }, { lr = "x" }) end, "SGD", "lr", "number" },
  { "SGD with a negative momentum", function() optim.SGD({ p() }, { momentum = -0.9 }) end, "SGD", "momentum", ">= 0" },
  { "SGD with a negative weight_decay", function() optim.SGD({ p() }, { weight_decay = -1 }) end, "SGD", "weight_decay", ">= 0" },
  { "SGD with a negative dampening", function() optim.SGD({ p() }, { dampening = -1 }) end, "SGD", "dampening", ">= 0" },
  { "SGD with a number nesterov", function() optim.SGD({ p() }, { nesterov = 1 }) end, "SGD", "nesterov", "boolean" },
  { "SGD nesterov without momentum", function() optim.SGD({ p() }, { nesterov = true }) end, "SGD", "nesterov", "momentum > 0" },
  { "SGD with a misspelt option", function() optim.SGD({ p() }, { mommentum = 0.9 }) end, "SGD", "unknown option", "mommentum" },
  { "SGD with string options", function() optim.SGD({ p() }, "lr") end, "SGD", "options", "table" },
  { "SGD of one tensor, not a list", function() optim.SGD(p()) end, "SGD", "params", "non-empty table" },
  { "SGD of no parameters", function() optim.SGD({}) end, "SGD", "params", "non-empty" },
  { "SGD of a list with a number", function() optim.SGD({ p(), 3 }) end, "SGD", "params[2]", "tensor" },
  { "SGD with a parameter twice", function() local w = p() optim.SGD({ w, w }) end, "SGD", "params", "each parameter once", "params[1] and params[2]" },
  { "SGD with a tied parameter listed twice", function()
      local m = nn.Linear(2, 2)
      local ps = m:parameters()
      ps[#ps + 1] = m.weight
      optim.SGD(ps)
    end, "SGD", "each parameter once" },
  { "SGD of a non-leaf", function() optim.SGD({ p() * 2 }) end, "SGD", "params[1]", "leaf" },
  { "AdamW with one beta", function() optim.AdamW({ p() }, { betas = { 0.9 } }) end, "AdamW", "betas", "two numbers" },
  { "AdamW with beta1 = 1", function() optim.AdamW({ p() }, { betas = { 1, 0.999 } }) end, "AdamW", "betas", "[0, 1)", "beta1 = 1" },
  { "AdamW with a negative beta2", function() optim.AdamW({ p() }, { betas = { 0.9, -0.1 } }) end, "AdamW", "betas", "beta2 = -0.1" },
  { "AdamW with a NaN beta2", function() optim.AdamW({ p() }, { betas = { 0.9, 0 / 0 } }) end, "AdamW", "betas", "nan" },
  { "AdamW with a number for betas", function() optim.AdamW({ p() }, { betas = 0.9 }) end, "AdamW", "betas", "table" },
  { "AdamW with a negative eps", function() optim.AdamW({ p() }, { eps = -1e-8 }) end, "AdamW", "eps", ">= 0" },
  { "AdamW with a NaN eps", function() optim.AdamW({ p() }, { eps = 0 / 0 }) end, "AdamW", "eps", "nan" },
  { "AdamW with a negative weight_decay", function() optim.AdamW({ p() }, { weight_decay = -0.01 }) end, "AdamW", "weight_decay", ">= 0" },
  { "AdamW with a negative lr", function() optim.AdamW({ p() }, { lr = -1 }) end, "AdamW", "lr", ">= 0" },
  { "AdamW with beta1 past 1 by name", function() optim.AdamW({ p() }, { beta1 = 1.5 }) end, "AdamW", "betas", "beta1 = 1.5" },
  { "AdamW with an unknown option", function() optim.AdamW({ p() }, { amsgrad = true }) end, "AdamW", "unknown option", "amsgrad" },
  { "AdamW with number options", function() optim.AdamW({ p() }, 3) end, "AdamW", "options", "table" },
  { "AdamW with a parameter twice", function() local w = p() optim.AdamW({ w, p(), w }) end, "AdamW", "params[1] and params[3]" },
  { "set_lr to a negative number", function() optim.SGD({ p() }):set_lr(-1) end, "set_lr", "lr", ">= 0" },
  { "set_lr to a string", function() optim.SGD({ p() }):set_lr("x") end, "set_lr", "lr", "number" },
  { "load_state_dict of a number", function() optim.SGD({ p() }):load_state_dict(3) end, "load_state_dict", "state_dict" },
  { "load_state_dict with a negative lr", function() optim.SGD({ p() }):load_state_dict({ state = {}, options = { lr = -1 } }) end, "load_state_dict", "lr", ">= 0" },
  { "load_state_dict with an unknown option", function() optim.SGD({ p() }):load_state_dict({ state = {}, options = { foo = 1 } }) end, "load_state_dict", "no option", '"foo"' },
  { "load_state_dict with state for parameter 5 of 1", function() optim.SGD({ p() }):load_state_dict({ state = { [5] = {} } }) end, "load_state_dict", "state", "parameters 1 to 1" },
  { "load_state_dict with a string lr", function() optim.SGD({ p() }):load_state_dict({ state = {}, options = { lr = "x" } }) end, "load_state_dict", "options.lr", "number" },
  { "load_state_dict with beta1 = 1", function() optim.AdamW({ p() }):load_state_dict({ state = {}, options = { beta1 = 1 } }) end, "load_state_dict", "betas", "beta1 = 1" },
  { "cosine_lr with a negative lr", function() sched.cosine_lr(1, { lr = -1, total = 10 }) end, "cosine_lr", "lr", ">= 0" },
  { "cosine_lr with a fractional total", function() sched.cosine_lr(1, { lr = 1, total = 10.5 }) end, "cosine_lr", "total", "integer" },
  { "cosine_lr without total", function() sched.cosine_lr(1, { lr = 1 }) end, "cosine_lr", "total", "nil" },
  { "cosine_lr at a string step", function() sched.cosine_lr("x", { lr = 1, total = 3 }) end, "cosine_lr", "step", "number" },
  { "cosine_lr with a negative warmup", function() sched.cosine_lr(1, { lr = 1, total = 3, warmup = -1 }) end, "cosine_lr", "warmup", ">= 0" },
  { "cosine_lr with a negative min_lr", function() sched.cosine_lr(1, { lr = 1, total = 3, min_lr = -1 }) end, "cosine_lr", "min_lr", ">= 0" },
  { "CosineWithWarmup of a table", function() sched.CosineWithWarmup({}, { total = 3 }) end, "CosineWithWarmup", "optimizer" },
  { "CosineWithWarmup without total", function() sched.CosineWithWarmup(optim.SGD({ p() }), { warmup = 2 }) end, "CosineWithWarmup", "total" },
}

describe("nn and optim misuse", function()
  X.groups(describe, it, { layers, modules, optimizers }, 90)
end)

describe("what misuse once got through", function()
  it("SGD keeps nesterov = false when it is not given (a false default survives)", function()
    assert.is_false(optim.SGD({ leaf() }).defaults.nesterov)
    local o = optim.SGD({ leaf() }, { lr = 0.1, momentum = 0.9 })
    o:load_state_dict(optim.SGD({ leaf() }, { lr = 0.2 }):state_dict())   -- options of the same kind load
    assert.equal(0.2, o:get_lr())
  end)

  it("a parameter updated once per step, not once per listing", function()
    local w = loom.ones(1, { requires_grad = true })
    local o = optim.SGD({ w }, { lr = 0.5 })
    w.grad = loom.ones(1)
    o:step()
    assert.equal(0.5, w:item())
    assert.has_error(function() optim.SGD({ w, w }, { lr = 0.5 }) end)
  end)
end)
