-- generate.lua: text generation for loom's decoders (the Llama transformer
-- and GPT-2), with a KV cache: the prompt runs once (prefill), then each
-- new token runs alone against the cached keys and values of every layer.
-- Under tensor parallelism each rank caches the heads it holds (the k and v
-- projections are column-sharded), and all ranks pick the same token (the
-- logits are replicated and the draws come from the seed).
--
-- Greedy (argmax, the first maximum, as transformers' generate with
-- do_sample=False) unless a sampling option is given; sampling applies
-- temperature, then top_k, then top_p (transformers' order) and draws from
-- its own Philox stream (seed, step), so loom's RNG is left alone and the
-- same seed gives the same text.
local ffi = require("ffi")
local loom = require("loom")
local T = require("loom.tensor")
local C = require("loom.lib").C

local M = {}

local ctr, key, rnd = ffi.new("uint32_t[4]"), ffi.new("uint32_t[2]"), ffi.new("uint32_t[4]")
local function uniform(seed, counter)   -- in [0, 1), 53 bits
  ctr[0], ctr[1], ctr[2], ctr[3] = counter % 2 ^ 32, 0, 0x67656e, 0   -- a stream apart from loom.data's
  key[0], key[1] = seed % 2 ^ 32, math.floor(seed / 2 ^ 32) % 2 ^ 32
  C.lm_philox4x32(ctr, key, rnd)
  return (rnd[0] * 2 ^ 21 + math.floor(rnd[1] / 2 ^ 11)) / 2 ^ 53
end

-- the options generate takes; any other (max_length, stop, ...) is an
-- error naming it, not ignored
local OPTS = { max_new_tokens = true, temperature = true, top_k = true, top_p = true, seed = true, do_sample = true,
               eos_id = true, cache = true }

-- the smallest temperature that samples (below it 1/t overflows the
-- scaled logits; 0 is greedy)
local MIN_TEMPERATURE = 1e-3

local function check_opts(o, vocab)
  T.check_opts("generate", o, OPTS, 3)
  local function num(k, ok, want)
    local v = o[k]
    if v ~= nil and (type(v) ~= "number" or not ok(v)) then T.argerror("generate", "opts." .. k, want, T.describe(v)) end
  end
  local int = function(v) return v % 1 == 0 end
  num("max_new_tokens", function(v) return v >= 0 and int(v) end, "a non-negative integer")
  num("temperature", function(v) return v == 0 or (v >= MIN_TEMPERATURE and v < math.huge) end,
      "0 (greedy) or a number in [" .. MIN_TEMPERATURE .. ", inf)")
  num("top_k", function(v) return v >= 1 and int(v) end, "a positive integer")
  num("top_p", function(v) return v > 0 and v <= 1 end, "a number in (0, 1]")
  num("seed", function(v) return v >= 0 and int(v) and v < 2 ^ 53 end, "a non-negative integer")
  num("eos_id", function(v) return v >= 1 and int(v) and (not vocab or v <= vocab) end,
      "a 1-based token id" .. (vocab and " in [1, " .. vocab .. "]" or ""))
  for _, k in ipairs { "do_sample", "cache" } do
    if o[k] ~= nil and type(o[k]) ~= "boolean" then T.argerror("generate", "opts." .. k, "a boolean", T.describe(o[k])) end
  end
end

-- choose(p, n, o, step) -> a 1-based id from the n f64 logits at p
local function choose(p, n, o, step)
  local best = 0
  for i = 1, n - 1 do if p[i] > p[best] or p[best] ~= p[best] then best = i end end
  if p[best] ~= p[best] or p[best] == -math.huge then
    error(string.format("generate: the model's logits at new token %d are %s: nothing to choose from", step,
                        p[best] ~= p[best] and "NaN" or "all -inf"), 0)
  end
  for i = 0, n - 1 do
    if p[i] ~= p[i] then error(string.format("generate: the model's logits at new token %d hold a NaN", step), 0) end
  end
  if not o.sample then return best + 1 end
  local inv_t = 1 / o.temperature
  local idx = {}   -- the candidates, best first when top_k or top_p cuts them
  for i = 1, n do idx[i] = i - 1 end
  if o.top_k or o.top_p then
    table.sort(idx, function(a, b) if p[a] ~= p[b] then return p[a] > p[b] end return a < b end)
    if o.top_k and o.top_k < n then for i = n, o.top_k + 1, -1 do idx[i] = nil end end
  end
  local w, total = {}, 0
  for i, id in ipairs(idx) do
    w[i] = math.exp((p[id] - p[best]) * inv_t)
    total = total + w[i]
  end
  if o.top_p and o.top_p < 1 then   -- the fewest best tokens whose probability reaches top_p
    local acc, keep = 0, #idx
    for i = 1, #idx do
      acc = acc + w[i] / total
      if acc >= o.top_p then keep = i break end
    end
    for i = #idx, keep + 1, -1 do total = total - w[i] idx[i], w[i] = nil, nil end
  end
  local u, acc = uniform(o.seed, step) * total, 0
  for i = 1, #idx do
    acc = acc + w[i]
    if u < acc then return idx[i] + 1 end
  end
  return idx[#idx] + 1
end

-- pick(logits (vocab) f32/f64 tensor, o, step) -> a 1-based id
local anchor   -- luacheck: ignore 231 (keeps the f64 logits alive while choose reads them through a raw pointer)
local function pick(logits, o, step)
  local v = logits:to("f64"):contiguous()
  anchor = v
  local id = choose(ffi.cast("double *", C.lm_data(v)), v:numel(), o, step)
  anchor = nil   -- held no longer than that: not by this module, nor by a trace that calls pick
  return id
end

-- the prompt as a Lua table of 1-based ids within the vocabulary
local function ids_of(ids, vocab)
  local out
  if type(ids) == "table" and ids.dtype == nil then
    if #ids == 0 then T.argerror("generate", "ids", "at least one id", "an empty table") end
    out = { unpack(ids) }
  elseif T.is_tensor(ids) and (ids:dim() == 1 or (ids:dim() == 2 and ids:size(1) == 1)) and ids:numel() > 0 then
    out = ids:reshape(-1):totable()
  else
    T.argerror("generate", "ids", "a table of ids or a (T) or (1, T) tensor", T.describe(ids))
  end
  for i, v in ipairs(out) do
    if type(v) ~= "number" or v < 1 or v % 1 ~= 0 or (vocab and v > vocab) then
      T.argerror("generate", "ids[" .. i .. "]", "a 1-based id" .. (vocab and " in [1, " .. vocab .. "]" or ""),
                 T.describe(v))
    end
  end
  return out
end

local function last_logits(model, ctx, cache, device)
  local x = loom.tensor({ ctx }, { dtype = "i64" })
  if device ~= "cpu" then x = x:to(device) end
  local logits = model(x, cache)
  local last = logits:narrow(2, logits:size(2), 1):reshape(-1)
  if last.dist ~= nil then last = last:full_tensor() end   -- vocabulary-sharded logits (loss parallel)
  return last:to("cpu")
end

-- the ranks a tensor-parallel model's draws must agree over: the mesh of
-- its first sharded parameter and the dim its weights are cut on ("tp",
-- or the only one); nil for a plain model. One rank's draw rules there
-- (rank 0 of the dim), so ranks seeded differently still return one text.
local function draw_group(model)
  for _, p in ipairs(model:parameters()) do
    if p.dist ~= nil then
      local mesh = p.device_mesh
      if mesh.ndim == 1 then return mesh, 1 end
      for d, name in ipairs(mesh.mesh_dim_names or {}) do if name == "tp" then return mesh, d end end
      return nil
    end
  end
end

local function agree(id, mesh, dim)
  if not mesh or mesh:size(dim) == 1 then return id end
  local dist = require("loom.distributed")
  -- the id travels on the mesh's device (NCCL takes no host tensors)
  return dist.broadcast(loom.tensor({ id }, { dtype = "i64", device = mesh.device_type }), 0, mesh, dim):item()
end

-- appends up to n ids to out, with a KV cache unless window (the
-- model's length: each step runs the last window ids) is given
local function extend(model, out, n, window, device, o, eos_id)
  local cache = not window and { pos = 0 } or nil
  local ctx = out
  local mesh, dim = draw_group(model)
  for step = 1, n do
    if window then ctx = { unpack(out, math.max(1, #out - window + 1)) } end
    local id = agree(pick(last_logits(model, ctx, cache, device), o, step), mesh, dim)
    out[#out + 1] = id
    ctx = { id }
    if eos_id and id == eos_id then break end
  end
end

-- whether tensor parallelism cuts the model's activations along the
-- sequence (SequenceParallel norms; async TP): one token at a time cannot
-- be cut so
local function sequence_sharded(model)
  for _, kv in ipairs(model:named_modules()) do
    if rawget(kv[2], "_tp_style") == "SequenceParallel" then return true end
  end
  return false
end

-- copies each parameter of model, whole (DTensors gathered), into twin's
local function copy_whole(twin, model)
  local src = {}
  for _, kv in ipairs(model:named_parameters()) do src[kv[1]] = kv[2] end
  for _, kv in ipairs(twin:named_parameters()) do
    local p = src[kv[1]]
    if p.dist ~= nil then p = p:full_tensor() end
    kv[2]:copy_(p)
  end
end

-- unsharded(model): a copy of model without any parallelism, on the
-- device of its parameters (collective: every rank gathers every weight)
function M.unsharded(model)
  local p1 = model:parameters()[1]
  local device = p1.dist ~= nil and p1:to_local().device or p1.device
  local Class = getmetatable(model)
  local twin = loom.device(device):use(Class, model.config)
  loom.no_grad(copy_whole, twin, model)
  return twin
end

-- generate(model, ids, {max_new_tokens = 20, temperature, top_k, top_p,
-- seed, do_sample, eos_id, cache = true}) -> a Lua table: the prompt's ids
-- then the new ones (1-based). cache = false runs the whole sequence at
-- each step (the baseline, and a window of the model's length). A model
-- whose activations sequence parallelism cuts generates through an
-- unsharded copy of it (collective; every rank gets the same ids).
function M.generate(model, ids, opts)
  opts = opts or {}
  if type(opts) ~= "table" then T.argerror("generate", "opts", "a table", T.describe(opts)) end
  local vocab = model.config and model.config.vocab_size
  check_opts(opts, vocab)
  local out = ids_of(ids, vocab)
  if sequence_sharded(model) then model = M.unsharded(model) end
  local o = { temperature = opts.temperature or 1, top_k = opts.top_k, top_p = opts.top_p, seed = opts.seed or 0 }
  o.sample = opts.do_sample
  if o.sample == nil then
    o.sample = opts.temperature ~= nil or opts.top_k ~= nil or opts.top_p ~= nil or opts.seed ~= nil
  end
  if o.temperature == 0 then o.sample = false end
  local n = opts.max_new_tokens or 20
  local limit = model.config.max_seq_len or model.config.n_positions
  local use_cache = opts.cache ~= false
  if use_cache and #out + n > limit then
    error(string.format("generate: %d prompt ids + %d new tokens exceed the model's %d positions", #out, n, limit), 2)
  end
  local p1 = model:parameters()[1]
  local device = p1.dist ~= nil and p1:to_local().device or p1.device
  local was_training = model.training
  model:eval()
  local ok, err = pcall(loom.no_grad, extend, model, out, n, not use_cache and limit or nil, device, o, opts.eos_id)
  model:train(was_training)   -- (a failed generate leaves the model as it found it)
  if not ok then error(err, 0) end
  return out
end

-- text(model, tokenizer, prompt, opts) -> the generated text (after the
-- prompt), and all the ids
function M.text(model, tok, prompt, opts)
  if type(prompt) ~= "string" then T.argerror("loom.generate", "prompt", "a string", T.describe(prompt)) end
  local ids = tok:encode(prompt)
  local out = M.generate(model, ids, opts)
  return tok:decode({ unpack(out, #ids + 1) }), out
end

return M
