-- check_lua_layers.lua: the Lua package's layers (docs/architecture.md),
-- as scripts/check_layers.sh checks the C core's: every require("loom...")
-- in lua/loom/ (at the top of a file or inside a function) must name a
-- module of its own layer or of one below. The exceptions are listed
-- below, each with its reason. Prints a line per violation and ends with
-- "lua layers: N passed, N failed".
--   luajit scripts/check_lua_layers.lua [lua/]
local root = arg and arg[1] or "lua/"

-- the layers, lowest first: a module belongs to the layer of the longest
-- prefix of its name listed here
local LAYERS = {
  { "base", { "loom.posix", "loom.lib", "loom.checks", "loom.size", "loom.fs", "loom.gc_pacing" } },
  { "tensor", { "loom", "loom.tensor", "loom.tensor_create", "loom.tensor_ops", "loom.tensor_print", "loom.tensor_inplace",
                "loom.autograd_hooks", "loom.rope", "loom.serialize", "loom.safetensors_reader" } },
  { "nn", { "loom.nn", "loom.optim", "loom.amp", "loom.functional" } },
  { "distributed", { "loom.distributed", "loom.safetensors" } },
  { "parallel", { "loom.parallel" } },
  { "data", { "loom.data", "loom.text" } },
  { "models", { "loom.models" } },
  { "train", { "loom.train" } },
  { "programs", { "loom.repl", "loom.distributed.repl", "loom.distributed.runner", "loom.docstrings" } },
}

-- from -> {to = reason}: upward requires that are right, and why
local EXCEPTIONS = {
  ["loom"] = {
    ["loom.amp"] = "the facade's loom.autocast, loaded on first use",
    ["loom.safetensors"] = "the facade's loom.load_safetensors/save_safetensors, loaded on first use",
    ["loom.models.generate"] = "the facade's loom.generate, loaded on first use",
  },
  ["loom.functional"] = {
    ["loom.distributed"] = "F on a DTensor argument reads its placements (loaded only when one comes)",
  },
  ["loom.nn.utils"] = {
    ["loom.distributed"] = "clip_grad_norm_ over DTensor parameters sums the norm over their meshes",
  },
  ["loom.tensor_inplace"] = {
    ["loom.distributed"] = "an in-place op on a DTensor lays its result back out in the tensor's placements",
  },
  ["loom.tensor_print"] = {
    ["loom.distributed.dtensor"] = "printing a DTensor names its mesh and placements (loaded whenever a DTensor exists)",
  },
  ["loom.serialize"] = {
    ["loom.distributed.checkpoint.format"] = "loom.load of a dist.checkpoint directory (one file or many, alike)",
    ["loom.distributed.checkpoint.interop"] = "loom.load of a dist.checkpoint directory (one file or many, alike)",
  },
}

local index = {}
for i, layer in ipairs(LAYERS) do
  for _, prefix in ipairs(layer[2]) do index[prefix] = i end
end

-- the layer number of module name
local function layer_of(name)
  local best, len = nil, -1
  for prefix, i in pairs(index) do
    if (name == prefix or name:sub(1, #prefix + 1) == prefix .. ".") and #prefix > len then best, len = i, #prefix end
  end
  return best
end

-- the module name of a file under root: lua/loom/a/b.lua -> loom.a.b, .../init.lua -> its folder
local function module_of(path)
  local rel = path:sub(#root + 1):gsub("%.lua$", ""):gsub("/init$", "")
  return (rel:gsub("/", "."))
end

local function code_of(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  s = s:gsub("%-%-%[(=*)%[.-%]%1%]", "")   -- block comments
  return (s:gsub("%-%-[^\n]*", ""))         -- line comments
end

local files = {}
local p = io.popen("find " .. root .. "loom -name '*.lua' | sort")
for line in p:lines() do files[#files + 1] = line end
p:close()

local passed, failed = 0, 0
for _, path in ipairs(files) do
  local from = module_of(path)
  local lf = layer_of(from)
  if not lf then
    print(string.format("%s: module %s is in no layer (add it to scripts/check_lua_layers.lua)", path, from))
    failed = failed + 1
  else
    for to in code_of(path):gmatch('require%(%s*"(loom[%w_.]*)"%s*%)') do
      local lt = layer_of(to)
      local why = EXCEPTIONS[from] and EXCEPTIONS[from][to]
      if lt and lt > lf and not why then
        print(string.format("%s: %s (%s) requires %s (%s), a layer above", path, from, LAYERS[lf][1], to, LAYERS[lt][1]))
        failed = failed + 1
      else
        passed = passed + 1
      end
    end
  end
end
print(string.format("lua layers: %d passed, %d failed", passed, failed))
os.exit(failed == 0 and 0 or 1)
