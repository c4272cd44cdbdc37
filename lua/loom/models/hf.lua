-- hf.lua: Hugging Face checkpoints (config.json + model.safetensors) in and
-- out of loom's models: the Llama-style families (llama, mistral, qwen2,
-- qwen3, phi3, gemma, olmo2: loom.models.hf_llama, onto
-- loom.models.transformer) and GPT2LMHeadModel (onto loom.models.gpt2),
-- with the conversions between the layouts:
--   * q_proj/k_proj: HF permutes the rows of each head for its
--     rotate_half RoPE (row r*hd/2 + i of a head holds Meta's row 2i + r);
--     loom's rope pairs interleaved rows as Meta's code does, so loading
--     un-permutes each head and saving permutes it back.
--   * GPT-2 Conv1D weights are stored (in, out): they are transposed, and
--     the fused c_attn (in, 3*out) is split into loom's q, k and v.
-- Loading reads, on each rank, only the block of each tensor that the
-- rank's (possibly sharded) parameter holds (see loom.safetensors).
local json = require("dkjson")
local loom = require("loom")
local T = require("loom.tensor")
local st = require("loom.safetensors")

local M = {}

local sizes = require("loom.size").Size.show
local function copy(t) local o = {} for i, v in ipairs(t) do o[i] = v end return o end

---------------------------------------------------------------------------
-- name maps: loom FQN -> {hf = name, shape = the HF tensor's full shape,
-- transpose, slice = {dim, start} (HF coordinates), heads = head_dim}

-- prefix: "transformer." (GPT2LMHeadModel) or "" (GPT2Model, the original upload)
local function gpt2_map(c, prefix)
  local m, d, f = {}, c.n_embd, c.n_inner
  local function put(fqn, hf, shape, opts)
    opts = opts or {}
    m[fqn] = { hf = prefix .. hf, shape = shape, transpose = opts.t, slice = opts.slice }
  end
  put("wte.weight", "wte.weight", { c.vocab_size, d })
  put("lm_head.weight", "wte.weight", { c.vocab_size, d })   -- tied: listed only if the tie was broken
  m["lm_head.weight"].tied = true
  put("wpe.weight", "wpe.weight", { c.n_positions, d })
  put("ln_f.weight", "ln_f.weight", { d })
  put("ln_f.bias", "ln_f.bias", { d })
  for i = 1, c.n_layer do
    local l, h = "h." .. i .. ".", "h." .. (i - 1) .. "."
    for _, ln in ipairs { "ln_1", "ln_2" } do
      put(l .. ln .. ".weight", h .. ln .. ".weight", { d })
      put(l .. ln .. ".bias", h .. ln .. ".bias", { d })
    end
    for k, name in ipairs { "q", "k", "v" } do
      put(l .. "attn." .. name .. ".weight", h .. "attn.c_attn.weight", { d, 3 * d },
          { t = true, slice = { 2, (k - 1) * d } })
      put(l .. "attn." .. name .. ".bias", h .. "attn.c_attn.bias", { 3 * d }, { slice = { 1, (k - 1) * d } })
    end
    put(l .. "attn.c_proj.weight", h .. "attn.c_proj.weight", { d, d }, { t = true })
    put(l .. "attn.c_proj.bias", h .. "attn.c_proj.bias", { d })
    put(l .. "mlp.c_fc.weight", h .. "mlp.c_fc.weight", { d, f }, { t = true })
    put(l .. "mlp.c_fc.bias", h .. "mlp.c_fc.bias", { f })
    put(l .. "mlp.c_proj.weight", h .. "mlp.c_proj.weight", { f, d }, { t = true })
    put(l .. "mlp.c_proj.bias", h .. "mlp.c_proj.bias", { d })
  end
  -- the causal-mask buffers of older uploads, and the tied head
  local pat = "^" .. prefix:gsub("%.", "%%.") .. "h%.%d+%.attn%."
  return m, { pat .. "bias$", pat .. "masked_bias$", "^lm_head%.weight$" }
end

-- arch of a loom model: "llama" (loom.models.transformer) or "gpt2"
local function arch_of(model, fname)
  if type(model) ~= "table" or type(model.named_parameters) ~= "function" or type(model.config) ~= "table" then
    T.argerror(fname, "model", "a loom.models.transformer or loom.models.gpt2 model", T.describe(model), 3)
  end
  if model.config.n_embd then return "gpt2" end
  if model.config.n_layers then return "llama" end
  T.argerror(fname, "model", "a loom.models.transformer or loom.models.gpt2 model", "a model of another kind", 3)
end

-- name_map(model, [names of the file]) -> map, patterns of ignorable names
function M.name_map(model, file_names)
  local arch = arch_of(model, "hf.name_map")
  if arch == "llama" then return require("loom.models.hf_llama").name_map(model.config, file_names) end
  local prefix = "transformer."
  if file_names and file_names["wte.weight"] and not file_names["transformer.wte.weight"] then prefix = "" end
  return gpt2_map(model.config, prefix)
end

---------------------------------------------------------------------------
-- layouts: HF rows of a head -> Meta's interleaved pairs, and back

-- x: (heads * hd, cols) in HF's order -> Meta's (loom's); a vector
-- (heads * hd) (a bias, a norm's weight) alike
local function unpermute(x, hd)
  local rows, cols = x:size(1), x:dim() == 2 and x:size(2) or 1
  return x:reshape(rows / hd, 2, hd / 2, cols):transpose(2, 3):reshape(x:size())
end
-- x: Meta's order -> HF's
local function permute(x, hd)
  local rows, cols = x:size(1), x:dim() == 2 and x:size(2) or 1
  return x:reshape(rows / hd, hd / 2, 2, cols):transpose(2, 3):reshape(x:size())
end
M.permute, M.unpermute = permute, unpermute

-- the block (0-based offset, size) of a parameter this rank holds
local function block_of(p, fname, name)
  if p.dist ~= nil then return st.block(p.device_mesh, p.placements, p:size(), fname, name) end
  local off = {}
  for d = 1, p:dim() do off[d] = 0 end
  return off, p:size()
end

local read_block, expert_entries

-- an experts' weight (experts, rows, cols) stacked from one HF tensor per
-- expert (e.experts: their names, in expert order): the block's experts,
-- each expert's rows and cols as the block asks
local function read_experts(r, e, off, size, fname)
  local parts = {}
  for j = 1, size[1] do
    local one = { hf = e.experts[off[1] + j], transpose = e.transpose }
    parts[j] = read_block(r, one, { off[2], off[3] }, { size[2], size[3] }, fname):unsqueeze(1)
  end
  if #parts == 0 then return loom.empty(size) end
  return #parts == 1 and parts[1] or loom.cat(parts, 1)
end

-- reads the block of a loom parameter from the file through map entry e
function read_block(r, e, off, size, fname)
  if e.experts then return read_experts(r, e, off, size, fname) end
  local hoff, hsize = copy(off), copy(size)
  if e.transpose then hoff[1], hoff[2], hsize[1], hsize[2] = off[2], off[1], size[2], size[1] end
  if e.slice then hoff[e.slice[1]] = hoff[e.slice[1]] + e.slice[2] end
  local lo = hoff[1]
  if e.heads then   -- whole heads, un-permuted, then the rows asked for
    local hd = e.heads
    local hi = math.ceil((hoff[1] + hsize[1]) / hd) * hd
    hoff[1] = math.floor(lo / hd) * hd
    hsize[1] = hi - hoff[1]
  end
  local x = r:read(e.hf, hoff, hsize, fname)
  if e.heads and hsize[1] > 0 then
    x = unpermute(x, e.heads)
    if hsize[1] ~= size[1] then x = x:narrow(1, lo - hoff[1] + 1, size[1]) end
  end
  if e.transpose then x = x:t() end
  return x:contiguous()
end

---------------------------------------------------------------------------
-- load

local function problems_of(r, model, map, ignore, strict)
  local missing, bad, used, unmapped = {}, {}, {}, {}
  -- (a tensor the whole model's map reads is expected, whichever pipeline
  -- stage the model is: another stage reads it)
  for _, e in pairs(map) do
    for _, n in ipairs(e.experts or { e.hf }) do used[n] = true end
  end
  local function check(e, fqn)
    local te = r.tensors[e.hf]
    if te == nil then missing[#missing + 1] = string.format("%s (for %s)", e.hf, fqn)
    elseif sizes(te.shape) ~= sizes(e.shape) then
      bad[#bad + 1] = string.format("%s has shape %s, the model needs %s (for %s)", e.hf, sizes(te.shape),
                                    sizes(e.shape), fqn)
    else
      r:loom_dtype(e.hf, "hf.load_weights")
    end
  end
  for _, kv in ipairs(model:named_parameters()) do
    local fqn, e = kv[1], map[kv[1]]
    if e == nil then unmapped[#unmapped + 1] = fqn
    elseif e.experts then for _, one in ipairs(expert_entries(e)) do check(one, fqn) end
    else check(e, fqn) end
  end
  local extra = {}
  if strict then
    for _, n in ipairs(r.names) do
      local skip = used[n]
      for _, pat in ipairs(ignore) do skip = skip or n:match(pat) end
      if not skip then extra[#extra + 1] = n end
    end
  end
  local out = {}
  local function add(what, list, limit)
    if #list == 0 then return end
    table.sort(list)
    local shown = { unpack(list, 1, math.min(#list, limit or 8)) }
    if #list > #shown then shown[#shown + 1] = "... (" .. #list .. " in all)" end
    out[#out + 1] = what .. table.concat(shown, ", ")
  end
  add("the name map has no entry for the model's parameter ", unmapped)
  add("missing tensor ", missing)
  add("mis-shaped tensor ", bad)
  add("unexpected tensor ", extra)
  return out
end

-- each parameter's block of the tensor map names, read from r
local function copy_blocks(r, model, map)
  for _, kv in ipairs(model:named_parameters()) do
    local fqn, p = kv[1], kv[2]
    local off, size = block_of(p, "hf.load_weights", fqn)
    local x = read_block(r, map[fqn], off, size, "hf.load_weights")
    local dst = p.dist ~= nil and p:to_local() or p
    if dst.device ~= "cpu" then x = x:to(dst.device) end
    dst:copy_(x)
  end
end

-- the checkpoint file (open as r) into the model, or an error naming the
-- problems. (Functions of the module, not closures over the model, which a
-- compiled trace would keep: docs/architecture.md.)
local function load_from(r, model, file, strict)
  local present = {}
  for _, n in ipairs(r.names) do present[n] = true end
  local map, ignore = M.name_map(model, present)
  local problems = problems_of(r, model, map, ignore, strict)
  if #problems > 0 then
    error(string.format("hf.load_weights: %s: %s", file, table.concat(problems, "; ")), 0)
  end
  loom.no_grad(copy_blocks, r, model, map)
end

-- load_weights(model, path, {strict = true}): copies the checkpoint at path
-- (a .safetensors file or a directory holding model.safetensors) into the
-- model's parameters in place; a sharded parameter (after
-- parallelize_module) reads only its own block. Every parameter must be
-- in the file with the shape the model's config implies; with strict, a
-- tensor of the file that the map does not use is an error too. Errors
-- name the tensors and the file. Returns the model.
function M.load_weights(model, path, opts)
  local fname = "hf.load_weights"
  arch_of(model, fname)
  if type(path) ~= "string" then T.argerror(fname, "path", "a .safetensors file or a directory", T.describe(path)) end
  opts = opts or {}
  local file = M.weights_path(path)
  local r = st.open(file, fname)
  local ok, err = pcall(load_from, r, model, file, opts.strict ~= false)
  r:close()
  if not ok then error(err, 2) end
  return model
end

---------------------------------------------------------------------------
-- configs

local function is_file(path) return path:match("%.safetensors$") or path:match("%.json$") end
local function readable(p)
  local f = io.open(p, "rb")
  if f then f:close() end
  return f ~= nil
end

-- the weights of path: path itself (a .safetensors file or an index
-- .json), or DIR/model.safetensors, or DIR/model.safetensors.index.json
-- (a checkpoint split over several files)
function M.weights_path(path)
  if is_file(path) then return path end
  local dir = path:gsub("/+$", "")
  if not readable(dir .. "/model.safetensors") and readable(dir .. "/model.safetensors.index.json") then
    return dir .. "/model.safetensors.index.json"
  end
  return dir .. "/model.safetensors"
end

local function config_path(path)
  if is_file(path) then return (path:match("^(.*)/[^/]*$") or ".") .. "/config.json" end
  return (path:gsub("/+$", "")) .. "/config.json"
end

-- read_config(path) -> arch ("llama" | "gpt2"), loom config. path is the
-- checkpoint's directory or its .safetensors file (config.json beside it).
-- The file is checked as hostile input (loom.models.hf_config).
function M.read_config(path)
  if type(path) ~= "string" then T.argerror("hf.read_config", "path", "a directory or file name", T.describe(path)) end
  return require("loom.models.hf_config").read(config_path(path))
end

-- from_pretrained(path, {config = overrides, dtype, tp_mesh, plan = tp_plan
-- options}) -> model, arch: builds the model of the config, parallelises it
-- on tp_mesh (a 1-D mesh) when given, then loads the weights, each rank
-- reading its shards.
function M.from_pretrained(path, opts)
  opts = opts or {}
  local arch, cfg = M.read_config(path)
  for k, v in pairs(opts.config or {}) do cfg[k] = v end
  local file = M.weights_path(path)
  local r = st.open(file, "hf.from_pretrained")   -- the header only: checked before anything is built
  local ok, err = pcall(require("loom.models.hf_config").check_weights, arch, cfg, r, file, config_path(path))
  r:close()
  if not ok then error(err, 2) end
  local mod = arch == "llama" and require("loom.models.transformer") or require("loom.models.gpt2")
  local model = mod.new(cfg)
  if opts.dtype and opts.dtype ~= "f32" then   -- one converted tensor per tensor: ties are kept
    local done = {}
    model:apply(function(m)
      for name, p in pairs(rawget(m, "_parameters")) do
        local key = tostring(require("ffi").cast("void *", p))
        done[key] = done[key] or loom.nn.Parameter(p:to(opts.dtype))
        m[name] = done[key]
      end
    end)
  end
  if opts.tp_mesh and opts.tp_mesh:size() > 1 then
    local plan_opts = {}
    for k, v in pairs(opts.plan or {}) do plan_opts[k] = v end
    plan_opts.tp = opts.tp_mesh:size()
    require("loom.parallel").parallelize_module(model, opts.tp_mesh, mod.tp_plan(plan_opts, model),
                                                { src_data_rank = false })
  end
  return M.load_weights(model, path), arch
end

---------------------------------------------------------------------------
-- save

-- expert_entries(e): a stacked entry's one entry per expert
function expert_entries(e)
  local out = {}
  for j, name in ipairs(e.experts) do out[j] = { hf = name, shape = e.shape, transpose = e.transpose } end
  return out
end

-- HF name -> the parts of the model's tensors that make it, in HF's layout:
-- each parameter, or its gradient when `grads` (not a closure over the
-- model, which a compiled trace would keep)
local function hf_parts(model, map, grads)
  local groups = {}
  for _, kv in ipairs(model:named_parameters()) do
    local e, p = map[kv[1]], kv[2]
    if e == nil then error("hf.hf_state_dict: the name map has no entry for " .. kv[1], 0) end
    if e.tied then goto continue end   -- HF's tied checkpoints hold the embedding only
    local x = grads and p.grad or p:detach()
    if x == nil then error("hf.hf_grads: " .. kv[1] .. " has no gradient", 0) end
    if e.experts then   -- one HF tensor per expert
      if x.dist ~= nil then x = x:full_tensor() end
      for j, name in ipairs(e.experts) do
        local one = x:select(1, j)
        if e.transpose then one = one:t() end
        groups[name] = { { x = one:contiguous() } }
      end
      goto continue
    end
    if x.dist ~= nil then x = x:full_tensor() end
    if e.heads then x = permute(x, e.heads) end
    if e.transpose then x = x:t() end
    groups[e.hf] = groups[e.hf] or {}
    table.insert(groups[e.hf], { x = x:contiguous(), slice = e.slice })
    ::continue::
  end
  return groups
end

-- hf_state_dict(model) -> HF name -> full tensor (DTensors gathered: a
-- collective when the model is sharded; every rank gets every tensor).
-- hf_grads(model): the parameters' gradients alike, as transformers' model
-- would hold them.
function M.hf_state_dict(model, grads)
  local groups = loom.no_grad(hf_parts, model, M.name_map(model), grads)
  local out = {}
  for name, parts in pairs(groups) do
    if #parts == 1 and not parts[1].slice then out[name] = parts[1].x
    else
      table.sort(parts, function(a, b) return a.slice[2] < b.slice[2] end)
      local xs = {}
      for i, part in ipairs(parts) do xs[i] = part.x end
      out[name] = loom.cat(xs, parts[1].slice[1])
    end
  end
  return out
end

function M.hf_grads(model) return M.hf_state_dict(model, true) end

local function hf_config(model)
  local c = model.config
  if arch_of(model, "hf.save_pretrained") == "llama" then return require("loom.models.hf_llama").write(c) end
  return { architectures = { "GPT2LMHeadModel" }, model_type = "gpt2", vocab_size = c.vocab_size,
           n_positions = c.n_positions, n_embd = c.n_embd, n_layer = c.n_layer, n_head = c.n_head,
           n_inner = c.n_inner, layer_norm_epsilon = c.layer_norm_epsilon, activation_function = "gelu_new",
           tie_word_embeddings = true }
end

-- a JSON file written as the weights are: a fresh temporary renamed over
-- it, never through a link
-- every string key of t and the tables in it, sorted: the files' key
-- order (the same bytes for the same model every time)
local function all_keys(t, set, list)
  for k, v in pairs(t) do
    if type(k) == "string" and not set[k] then set[k] = true list[#list + 1] = k end
    if type(v) == "table" then all_keys(v, set, list) end
  end
  return list
end

local function write_json(dir, name, t)
  local fs = require("loom.fs")
  local order = all_keys(t, {}, {})
  table.sort(order)
  local text = json.encode(t, { indent = true, keyorder = order }) .. "\n"
  local ok, err = fs.write_atomic(dir .. "/" .. name, function(put) put(text) end)
  if not ok then error("hf.save_pretrained: cannot write " .. dir .. "/" .. name .. ": " .. err, 0) end
end

-- what transformers' pipeline needs beside the weights to use the folder:
-- the tokenizer.json the tokenizer was read from, tokenizer_config.json
-- (a fast tokenizer, its special tokens), generation_config.json (bos,
-- eos, pad ids); ids are HF's (0-based), taken from the model's config
local function tokenizer_files(dir, tok, c)
  local src = io.open(tok.source or "", "rb")
  if not src then error("hf.save_pretrained: the tokenizer was not read from a tokenizer.json (Tokenizer.from_file)", 0) end
  local text = src:read("*a")
  src:close()
  local fs = require("loom.fs")
  local ok, err = fs.write_atomic(dir .. "/tokenizer.json", function(put) put(text) end)
  if not ok then error("hf.save_pretrained: cannot write " .. dir .. "/tokenizer.json: " .. err, 0) end
  local function token(id) return id and tok.tokens[id + 1] or nil end
  write_json(dir, "tokenizer_config.json", {
    tokenizer_class = "PreTrainedTokenizerFast", bos_token = token(c.bos_token_id), eos_token = token(c.eos_token_id),
    pad_token = token(c.pad_token_id), model_max_length = c.max_seq_len or c.n_positions })
  write_json(dir, "generation_config.json", { bos_token_id = c.bos_token_id, eos_token_id = c.eos_token_id,
                                              pad_token_id = c.pad_token_id })
end

-- the files of save_pretrained, on rank 0 (a function of its own: a
-- closure over the state dict would stay alive in a compiled trace)
local function write_pretrained(dir, tensors, cfg, tok, model_config)
  require("loom.fs").mkdir_p(dir)
  st.save(tensors, dir .. "/model.safetensors", { metadata = { format = "pt" } })
  write_json(dir, "config.json", cfg)
  if tok then tokenizer_files(dir, tok, model_config) end
end

-- save_pretrained(model, dir, {tokenizer = tok}): dir/model.safetensors
-- and dir/config.json in the Hugging Face layout; with a tokenizer (read
-- by Tokenizer.from_file), its tokenizer.json, tokenizer_config.json and
-- generation_config.json too, so that transformers' pipeline loads the
-- folder as it is. Collective when the model is sharded (every rank
-- calls it; rank 0 writes).
function M.save_pretrained(model, dir, opts)
  if type(dir) ~= "string" or dir == "" then T.argerror("hf.save_pretrained", "dir", "a directory", T.describe(dir)) end
  opts = T.check_opts("hf.save_pretrained", opts, { tokenizer = true })
  local tok = opts.tokenizer
  if tok ~= nil and (type(tok) ~= "table" or type(tok.encode) ~= "function" or type(tok.tokens) ~= "table") then
    T.argerror("hf.save_pretrained", "opts.tokenizer", "a loom.data.Tokenizer", T.describe(tok))
  end
  st._on_rank0(write_pretrained, dir, M.hf_state_dict(model), hf_config(model), tok, model.config)
end

return M
