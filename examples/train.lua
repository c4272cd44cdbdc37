-- train.lua: trains the Llama-style transformer on a character-level corpus
-- (tinyshakespeare by default). `luajit examples/train.lua --help` lists
-- the flags.
local root = debug.getinfo(1, "S").source:match("^@(.*)examples/train%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local loom = require "loom"
local data = require "loom.data"
local transformer = loom.models.transformer

local FLAGS = {
  { "data", root .. "examples/data/tinyshakespeare.txt", "text file to train on" },
  { "steps", 600, "optimizer steps" },
  { "batch", 12, "sequences per step" },
  { "seq", 64, "characters per sequence" },
  { "dim", 128, "model width" },
  { "layers", 4, "transformer blocks" },
  { "heads", 4, "attention heads" },
  { "kv-heads", 0, "key/value heads (0: as many as heads)" },
  { "dropout", 0, "dropout probability" },
  { "lr", 3e-3, "peak learning rate (AdamW, cosine decay, warmup)" },
  { "warmup", 50, "warmup steps" },
  { "weight-decay", 0.1, "AdamW weight decay" },
  { "grad-clip", 1, "clip the gradient norm to this (0: off)" },
  { "seed", 1337, "seed of the model's init and the batch sampler" },
  { "eval-every", 100, "evaluate the validation loss every N steps" },
  { "eval-iters", 10, "batches per validation estimate" },
  { "log", "", "write one JSON object per line (step, loss, val_loss, tokens_per_s)" },
  { "save", "", "save a checkpoint into this directory at the end (and at each eval)" },
  { "resume", "", "resume from the checkpoint in this directory" },
  { "stop-after", 0, "stop after this step, as if interrupted, saving a checkpoint (0: run all steps)" },
  { "sample", 200, "characters to generate at the end (0: none)" },
  { "quiet", false, "no live progress line" },
}

local function parse_args(argv)
  local opts, known = {}, {}
  for _, f in ipairs(FLAGS) do opts[f[1]] = f[2] known[f[1]] = f end
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--help" or a == "-h" then
      print("usage: luajit examples/train.lua [flags]")
      for _, f in ipairs(FLAGS) do print(string.format("  --%-14s %s (default %s)", f[1], f[3], tostring(f[2]))) end
      os.exit(0)
    end
    local name, value = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    local f = name and known[name]
    if not f then error("train.lua: unknown argument " .. a .. " (see --help)", 0) end
    if type(f[2]) == "boolean" then opts[name] = true
    else
      if not value then i = i + 1 value = argv[i] end
      if value == nil then error("train.lua: --" .. name .. " needs a value", 0) end
      if type(f[2]) == "number" then
        opts[name] = tonumber(value)
        if not opts[name] then error("train.lua: --" .. name .. " expects a number, got " .. value, 0) end
      else opts[name] = value end
    end
    i = i + 1
  end
  return opts
end

local function json_line(t)
  local parts = {}
  for _, k in ipairs(t.__order) do
    local v = t[k]
    if type(v) == "string" then v = string.format("%q", v)
    elseif type(v) == "number" then v = string.format("%.17g", v) end   -- exact: resumed runs compare bit for bit
    if v ~= nil then parts[#parts + 1] = string.format("%q: %s", k, tostring(v)) end
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

local function fmt_time(s)
  if s >= 60 then return string.format("%dm%02ds", math.floor(s / 60), math.floor(s % 60)) end
  return string.format("%.1fs", s)
end

local function now()
  local ffi = require "ffi"
  pcall(ffi.cdef, "typedef struct { long tv_sec; long tv_nsec; } loom_timespec; int clock_gettime(int, loom_timespec *);")
  local ts = ffi.new("loom_timespec")
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local function main(argv)
  local o = parse_args(argv)
  local text = data.read_file(o.data)
  local tok = data.CharTokenizer(text)
  local ids = tok:encode(text)
  local train_ids, val_ids = data.split(ids, 0.9)

  loom.manual_seed(o.seed)
  local cfg = { vocab_size = tok.vocab_size, dim = o.dim, n_layers = o.layers, n_heads = o.heads,
                n_kv_heads = o["kv-heads"] > 0 and o["kv-heads"] or nil, max_seq_len = o.seq,
                dropout = o.dropout }
  local model = transformer.new(cfg)
  local nparams = 0
  for _, p in ipairs(model:parameters()) do nparams = nparams + p:numel() end
  local opt = loom.optim.AdamW(model:parameters(), { lr = o.lr, betas = { 0.9, 0.95 },
                                                     weight_decay = o["weight-decay"] })
  local sampler = data.Sampler(train_ids, { batch = o.batch, seq = o.seq, seed = o.seed })
  local start_step = 0

  if o.resume ~= "" then
    local ck = loom.load(o.resume .. "/checkpoint.loom")
    if ck.vocab ~= tok.vocab then error("train.lua: the checkpoint's vocabulary differs from this corpus", 0) end
    model:load_state_dict(ck.model)
    opt:load_state_dict(ck.optim)
    sampler:set_state(ck.sampler)
    loom.set_rng_state(ck.rng)
    start_step = ck.step
    print(string.format("resumed from %s at step %d", o.resume, start_step))
  end

  local function save(step)
    if o.save == "" then return end
    os.execute("mkdir -p '" .. o.save .. "'")
    loom.save({ model = model:state_dict(), optim = opt:state_dict(), sampler = sampler:state(),
                rng = loom.get_rng_state(), step = step, vocab = tok.vocab, config = cfg },
              o.save .. "/checkpoint.loom")
  end

  local function val_loss()
    local vs = data.Sampler(val_ids, { batch = o.batch, seq = o.seq, seed = 7 })
    model:eval()
    local total = 0
    loom.no_grad(function()
      for _ = 1, o["eval-iters"] do
        local x, y = vs:next()
        total = total + loom.F.cross_entropy(model(x), y):item()
      end
    end)
    model:train()
    return total / o["eval-iters"]
  end

  local log = o.log ~= "" and assert(io.open(o.log, start_step > 0 and "a" or "w")) or nil
  print(string.format("model: %d layers, dim %d, %d heads, %d parameters; %d steps of %dx%d tokens",
                      o.layers, o.dim, o.heads, nparams, o.steps, o.batch, o.seq))
  local sched = { lr = o.lr, warmup = o.warmup, total = o.steps, min_lr = o.lr / 10 }
  local t0, tokens, last_loss, last_val = now(), 0, nil, nil
  local last_step = o["stop-after"] > 0 and math.min(o["stop-after"], o.steps) or o.steps
  for step = start_step + 1, last_step do
    opt:set_lr(loom.optim.lr_scheduler.cosine_lr(step, sched))
    local x, y = sampler:next()
    local loss = loom.F.cross_entropy(model(x), y)
    opt:zero_grad()
    loss:backward()
    if o["grad-clip"] > 0 then loom.nn.utils.clip_grad_norm_(model:parameters(), o["grad-clip"]) end
    opt:step()
    last_loss = loss:item()
    tokens = tokens + o.batch * o.seq
    local elapsed = now() - t0
    local tps = tokens / elapsed
    local entry = { __order = { "step", "loss", "val_loss", "tokens_per_s" }, step = step,
                    loss = last_loss, tokens_per_s = math.floor(tps) }
    if step % o["eval-every"] == 0 or step == o.steps then
      last_val = val_loss()
      entry.val_loss = last_val
      save(step)
    elseif step == last_step then save(step) end
    if log then log:write(json_line(entry), "\n") log:flush() end
    local eta = (o.steps - step) * elapsed / (step - start_step)
    local line = string.format("step %d/%d | loss %.4f%s | %.0f tok/s | ETA %s", step, o.steps, last_loss,
      last_val and string.format(" | val %.4f", last_val) or "", tps, fmt_time(eta))
    if not o.quiet then io.write("\r", line, "   ") io.flush() end
    if entry.val_loss then io.write(o.quiet and "" or "\n", o.quiet and line .. "\n" or "") end
  end
  if log then log:close() end
  local wall = now() - t0
  print(string.format("\ndone: %d steps in %s, %.0f tokens/s, final loss %.4f, val loss %s", last_step - start_step,
                      fmt_time(wall), tokens / math.max(wall, 1e-9), last_loss or 0 / 0,
                      last_val and string.format("%.4f", last_val) or "n/a"))
  if o.sample > 0 then
    loom.manual_seed(o.seed)
    local out = transformer.generate(model, loom.tensor({ { tok.stoi["\n"] or 1 } }, { dtype = "i64" }), o.sample,
                                     { temperature = 0.8 })
    print("---- sample ----\n" .. tok:decode(out) .. "\n----------------")
  end
  return { loss = last_loss, val_loss = last_val }
end

main(arg or {})
