-- train.lua: trains the Llama-style transformer on a character-level corpus
-- (tinyshakespeare by default). `luajit examples/train.lua --help` lists
-- the flags.
local root = debug.getinfo(1, "S").source:match("^@(.*)examples/train%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local loom = require("loom")
local data = require("loom.data")
local transformer = loom.models.transformer

local FLAGS = {
  { "data", root .. "examples/data/tinyshakespeare.txt", "text file to train on, or a token file (.bin, nanoGPT's "
                                                          .. "train.bin; val.bin beside it is the validation set)" },
  { "tokenizer", "", "tokenizer.json (Hugging Face): tokenizes a text --data, reads a .bin one (needed for .bin)" },
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
  { "skip-nonfinite", false, "skip the optimizer step when the loss is NaN or inf (default: stop with an error)" },
  { "log", "", "write one JSON object per line (step, loss, val_loss, tokens_per_s)" },
  { "save", "", "save a checkpoint into this directory at the end (and at each eval)" },
  { "resume", "", "resume from the checkpoint in this directory (its model and training settings and --steps "
                 .. "come with it, unless given)" },
  { "run-dir", "auto", "the run's folder: config.json, log.jsonl, the loss plot, checkpoints/ "
                       .. "(auto: runs/<UTC date-time>; none: no folder)" },
  { "config", "", "a Lua file returning a table of flag values; flags given here override it" },
  { "stop-after", 0, "stop after this step, as if interrupted, saving a checkpoint (0: run all steps)" },
  { "sample", 200, "characters to generate at the end (0: none)" },
  { "quiet", false, "no live progress line (only whole lines, as without a terminal)" },
  { "print-every", 0, "without a terminal, a progress line every N steps too (0: at each eval only)" },
  { "progress-every-s", 10, "without a terminal (a pipe, loomrun), a progress line at least every this many "
                            .. "seconds too (0: off)" },
  { "tp", 0, "tensor-parallel degree (0: the world size over --dp)" },
  { "dp", 0, "data-parallel degree (0: the world size over --tp); tp * dp = world size" },
  { "fsdp", false, "shard parameters, gradients and AdamW state over dp (x cp) (fully_shard on each block, then the root) "
                   .. "instead of replicating them" },
  { "pp", 1, "pipeline-parallel degree: the layers cut into pp stages (loom.distributed.pipelining); "
               .. "pp * dp * tp = world size" },
  { "async-tp", false, "with --sequence-parallel: the gathers before wq/wk/wv and w1/w3 (one per module) and the reduce-scatters after wo and w2 in chunks overlapped with the matmuls" },
  { "cp", 1, "context-parallel degree: the sequence sharded over cp ranks (load-balanced causal attention)" },
  { "cp-rotate", "allgather", "with --cp: how keys and values reach every rank: allgather or alltoall (a p2p ring)" },
  { "microbatches", 0, "with --pp: microbatches per step (0: pp); they must divide the batch over dp" },
  { "schedule", "1F1B", "with --pp: 1F1B or gpipe" },
  { "no-reshard", false, "with --fsdp: keep each block's gathered parameters from forward to backward" },
  { "sequence-parallel", false, "shard norms and residuals on the sequence (with --tp > 1)" },
  { "loss-parallel", true, "cross entropy on vocabulary-sharded logits (with --tp > 1)" },
  { "no-loss-parallel", false, "gather the logits instead" },
  { "dtype", "f32", "f32 or bf16 (bf16: mixed precision: GEMMs in bf16 under autocast, parameters, "
                    .. "gradients and AdamW in f32)" },
  { "device", "auto", "cpu, cuda or auto (auto: the GPUs when there are some, one per rank)" },
  { "version", false, "print loom's build, BLAS and devices (loom.show_config) and exit" },
  { "init-from", "", "start from a Hugging Face Llama checkpoint (DIR or .safetensors; its config sets the model)" },
  { "profile-steps", "", "trace steps A:B (Chrome trace JSON, a summary, a timeline PNG) into LOOM_PROFILE's "
                         .. "trace:FILE, else trace.json in the run's folder (docs/profiling.md)" },
}

-- what each number may be: {least, most (nil: no bound), integer}
local RANGES = {
  steps = { 1, nil, true }, batch = { 1, nil, true }, seq = { 1, nil, true }, dim = { 1, nil, true },
  layers = { 1, nil, true }, heads = { 1, nil, true }, ["kv-heads"] = { 0, nil, true }, dropout = { 0, 0.99 },
  lr = { 0 }, warmup = { 0, nil, true }, ["weight-decay"] = { 0 }, ["grad-clip"] = { 0 }, seed = { 0, nil, true },
  ["eval-every"] = { 1, nil, true }, ["eval-iters"] = { 1, nil, true }, ["stop-after"] = { 0, nil, true },
  sample = { 0, nil, true }, ["print-every"] = { 0, nil, true }, tp = { 0, nil, true }, dp = { 0, nil, true },
  ["progress-every-s"] = { 0 },
}

-- refuses numbers out of range, naming the flag, the range and the value
local function check_ranges(o)
  for _, f in ipairs(FLAGS) do
    local r, v = RANGES[f[1]], o[f[1]]
    if r and (v < r[1] or (r[2] and v > r[2]) or (r[3] and v % 1 ~= 0) or v ~= v) then
      local want = (r[3] and "an integer " or "a number ") .. (r[2] and string.format("in [%g, %g]", r[1], r[2])
                                                              or string.format(">= %g", r[1]))
      error(string.format("train.lua: --%s expects %s, got %s", f[1], want, tostring(v)), 0)
    end
  end
  if o.lr == 0 then error("train.lua: --lr expects a learning rate > 0, got 0", 0) end
  if o["kv-heads"] > 0 and o.heads % o["kv-heads"] ~= 0 then
    error(string.format("train.lua: --kv-heads %d must divide --heads %d", o["kv-heads"], o.heads), 0)
  end
  if o.dim % o.heads ~= 0 then error(string.format("train.lua: --heads %d must divide --dim %d", o.heads, o.dim), 0) end
end

local json = require("dkjson")

-- one JSON object per line, keys in the given order; numbers with %.17g
-- (dkjson's %.14g is not exact, and resumed runs are compared bit for bit)
local function json_line(t, order)
  local parts = {}
  for _, k in ipairs(order) do
    local v = t[k]
    if v ~= nil then
      local finite = type(v) == "number" and v == v and math.abs(v) ~= math.huge
      parts[#parts + 1] = json.encode(k) .. ": " .. (finite and string.format("%.17g", v) or json.encode(v))
    end
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

local function fmt_time(s)
  if s >= 60 then return string.format("%dm%02ds", math.floor(s / 60), math.floor(s % 60)) end
  return string.format("%.1fs", s)
end

-- stdout is a terminal of this process's own: under an MPI launcher it is
-- a pty that mpirun forwards line by line, so no live \r line there
local function own_terminal()
  local ffi = require("ffi")
  pcall(ffi.cdef, "int isatty(int fd);")
  return ffi.C.isatty(1) == 1 and not (os.getenv("OMPI_COMM_WORLD_SIZE") or os.getenv("PMI_SIZE"))
end

local function now()
  local ffi = require("ffi")
  pcall(ffi.cdef, "typedef struct { long tv_sec; long tv_nsec; } loom_timespec; int clock_gettime(int, loom_timespec *);")
  local ts = ffi.new("loom_timespec")
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- The world: pp x dp x cp x tp ranks on a {pp, dp, cp, tp} mesh (loom.parallel.layout).
local L = require("loom.parallel.layout")

-- tp and dp from the flags and the world (the ranks left by pp x cp), or an
-- error that says what to do
local function degrees(o, world, ranks)
  local tp, dp = o.tp, o.dp
  local asked = math.max(tp, 1) * math.max(dp, 1) * math.max(o.pp, 1) * math.max(o.cp, 1)
  if ranks == 1 and asked > 1 then
    local parts = {}
    for _, k in ipairs { "pp", "cp", "tp", "dp" } do
      if k == "tp" or k == "dp" or o[k] > 1 then parts[#parts + 1] = string.format("--%s %d", k, math.max(o[k], 1)) end
    end
    error(string.format("train.lua: %s needs %d ranks and this is one process: launch with "
                        .. "scripts/loomrun -n %d examples/train.lua ...", table.concat(parts, " x "), asked, asked), 0)
  end
  if tp > 0 and world % tp ~= 0 then
    error(string.format("train.lua: --tp must divide the world size %d, got --tp %d (or launch with scripts/loomrun -n %d)",
                        world, tp, tp * math.max(dp, 1)), 0)
  end
  if dp > 0 and world % dp ~= 0 then
    error(string.format("train.lua: --dp must divide the world size %d, got --dp %d", world, dp), 0)
  end
  if tp == 0 and dp == 0 then tp, dp = world, 1
  elseif tp == 0 then tp = world / dp
  elseif dp == 0 then dp = world / tp end
  if tp * dp ~= world then
    error(string.format("train.lua: --tp %d x --dp %d must equal the world size %d (launch with scripts/loomrun -n %d)",
                        tp, dp, world, tp * dp), 0)
  end
  return tp, dp
end

-- flags that cannot apply at this layout are errors, not silently ignored
local function check_applies(o, tp, dp)
  if o.fsdp and dp == 1 and o.cp <= 1 then
    error("train.lua: --fsdp shards over data-parallel (or context-parallel) ranks and --dp is 1: launch more ranks "
          .. "(scripts/loomrun -n 2 examples/train.lua --fsdp --tp 1) or leave --fsdp out", 0)
  end
  if o["no-reshard"] and not o.fsdp then error("train.lua: --no-reshard applies with --fsdp only", 0) end
  if o["sequence-parallel"] and tp == 1 then
    error("train.lua: --sequence-parallel needs --tp > 1 (launch with scripts/loomrun -n 2)", 0)
  end
end

-- the device: cpu, cuda (refused with the reason when there is none) or auto
local function pick_device(o)
  local device = o.device
  if device == "auto" then device = loom.cuda.is_available() and "cuda" or "cpu" end
  if device ~= "cpu" and device ~= "cuda" then
    error("train.lua: --device expects cpu, cuda or auto, got " .. tostring(o.device), 0)
  end
  if device == "cuda" then
    local ok, why = loom.device_available("cuda")
    if not ok then error("train.lua: --device cuda: " .. why .. " (use --device cpu)", 0) end
  end
  return device
end

local function layout(o, dist)
  local world = dist.world_size()
  local pc = math.max(o.pp, 1) * math.max(o.cp, 1)
  if world % pc == 0 then check_applies(o, degrees(o, world / pc, world)) end   -- else L.world says why
  local w = L.world(o, dist, pick_device(o))
  if o.batch % w.dp ~= 0 then error(string.format("train.lua: --batch %d must divide by --dp %d", o.batch, w.dp), 0) end
  return w
end

-- the model on its device (f32: with --dtype bf16 autocast runs its GEMMs
-- in bf16), tensor- and data-parallel as laid out
local function build_model(o, cfg, w)
  local tp = require("loom.parallel")
  loom.manual_seed(o.seed)   -- the same full weights on every rank, at any layout
  local model = loom.device(w.device):use(transformer.new, cfg)
  model = L.split(model, w, { microbatches = o.microbatches > 0 and o.microbatches or nil, schedule = o.schedule })
  if w.tp > 1 then
    tp.parallelize_module(model, w.mesh["tp"], L.plan_for(L.async_tp(transformer.tp_plan(
      { sequence_parallel = o["sequence-parallel"], loss_parallel = o.lp, tp = w.tp }, model), o, w), model), { src_data_rank = false })
  end
  L.replicate(model, w, o)   -- gradients averaged over dp x cp (not with --fsdp)
  return model
end

-- FSDP over dp x cp (after any weights are loaded): each block, then the root
local function shard_model(o, model, w) L.fully_shard(model, w, o) end

-- the run's folder, runs/<UTC date-time> (rank 0's clock, a suffix when
-- taken: the same name on every rank); --log and --save default into it
local function run_folder(o, w, dist)
  if o["run-dir"] == "none" then return nil end
  local dir, fs = o["run-dir"], require("loom.fs")
  local resumed_run = o.resume:match("^(.+)/checkpoints/*$")
  if dir == "auto" and resumed_run and fs.is_file(resumed_run .. "/config.json") then
    dir = resumed_run   -- a resumed run goes on in its folder
  elseif dir == "auto" then
    local t, k = os.time(), 1
    local function name() return "runs/" .. os.date("!%Y%m%d-%H%M%S", t) .. (k > 1 and "-" .. k or "") end
    if w.rank == 0 then while fs.exists(name()) do k = k + 1 end end
    if w.world > 1 then
      local v = dist.broadcast(loom.tensor({ t, k }, { dtype = "i64" }), 0):totable()
      t, k = v[1], v[2]
    end
    dir = name()
  end
  if o.log == "" then o.log = dir .. "/log.jsonl" end
  if o.save == "" then o.save = dir .. "/checkpoints" end
  if w.rank == 0 then fs.mkdir_p(dir) end
  return dir
end

local function write_json(path, t)
  local f = io.open(path, "w")
  if not f then error("train.lua: cannot write " .. path, 0) end
  f:write(json.encode(t, { indent = true }), "\n")
  f:close()
end

-- the settings that make a checkpoint's model: --resume takes them
local MODEL_FLAGS = { "dim", "layers", "heads", "kv-heads", "seq" }
-- what else a resumed run takes from its checkpoint unless given again, so
-- that it goes on as the interrupted run would have (given ones may differ:
-- a new --lr for the rest of a run is fine)
local TRAIN_FLAGS = { "data", "tokenizer", "batch", "dropout", "lr", "warmup", "weight-decay", "grad-clip", "seed",
                      "eval-every", "eval-iters", "dtype" }

-- --resume: the checkpoint's model settings (DIR/model_config.json), its
-- training settings and --steps replace the defaults; a model flag given
-- that differs is refused in one line. Returns the checkpoint's settings,
-- or nil (an older one).
local function resume_settings(o, given)
  local path = o.resume .. "/model_config.json"
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read(65537) or ""
  f:close()
  local c = #text <= 65536 and json.decode(text) or nil
  if type(c) ~= "table" or type(c.flags) ~= "table" or type(c.step) ~= "number" then
    error("train.lua: --resume: " .. path .. " is not a train.lua model config", 0)
  end
  local diffs = {}
  for _, name in ipairs(MODEL_FLAGS) do
    local v = c.flags[name]
    if type(v) == "number" and given[name] and o[name] ~= v then
      diffs[#diffs + 1] = string.format("--%s %s (the checkpoint's: %s)", name, tostring(o[name]), tostring(v))
    elseif type(v) == "number" then
      o[name] = v
    end
  end
  if #diffs > 0 then
    error("train.lua: --resume " .. o.resume .. " has another model: " .. table.concat(diffs, ", ")
          .. "; leave these flags out to use the checkpoint's", 0)
  end
  if not given.steps and type(c.flags.steps) == "number" then o.steps = c.flags.steps end
  for _, name in ipairs(TRAIN_FLAGS) do
    local v = c.flags[name]
    if not given[name] and v ~= nil and type(v) == type(o[name]) then o[name] = v end
  end
  return c
end

-- parameters and AdamW state held by this rank, next to the whole model's
local function memory_line(model, opt, nparams)
  local mem = require("loom.distributed.fsdp").memory(model, opt)
  local full = nparams * 4
  return string.format("memory per rank: parameters %.2f MB + AdamW state %.2f MB = %.3f of the model's %.2f MB "
                       .. "(+ %.2f MB state)", mem.params / 2^20, mem.optimizer / 2^20, mem.total / (3 * full),
                       full / 2^20, 2 * full / 2^20)
end

-- the loss curve as a PNG next to the log, through gnuplot when it is there
local function plot(log_path, title)
  if os.execute("command -v gnuplot >/dev/null 2>&1") ~= 0 then
    print("gnuplot is not installed: skipping the loss plot (apt-get install gnuplot-nox)")
    return
  end
  local png = log_path:gsub("%.[^./]*$", "") .. ".png"
  local csv = os.tmpname()
  local f = assert(io.open(csv, "w"))
  for line in io.lines(log_path) do
    local e = json.decode(line)
    if type(e) == "table" and e.step and e.loss then
      f:write(string.format("%d %.17g %s\n", e.step, e.loss, e.val_loss and string.format("%.17g", e.val_loss) or "NaN"))
    end
  end
  f:close()
  local script = string.format([[set terminal png size 800,480; set output '%s'; set title '%s' noenhanced;
set xlabel 'step'; set ylabel 'loss';
set datafile missing 'NaN'; plot '%s' using 1:2 with lines title 'train', '' using 1:3 with linespoints title 'val']],
    png, (title or ""):gsub("['\"\\]", ""), csv)
  local ok = os.execute("gnuplot -e \"" .. script:gsub("\n", " ") .. "\" 2>/dev/null")
  os.remove(csv)
  print(ok == 0 and "loss curve: " .. png or "gnuplot failed: no plot")
end

local function main(argv)
  local cli = require("loom.cli")
  local o, given = cli.parse("train.lua", FLAGS, argv, "Trains a Llama-style transformer on a text file.")
  if o.version then loom.show_config() return end
  if o.config ~= "" then cli.apply_config("train.lua", FLAGS, o, given, o.config) end
  local resumed = o.resume ~= "" and resume_settings(o, given)
  if o.dtype ~= "f32" and o.dtype ~= "bf16" then error("train.lua: --dtype expects f32 or bf16, got " .. o.dtype, 0) end
  check_ranges(o)
  local dist = require("loom.distributed")
  local w = layout(o, dist)
  if resumed and resumed.step >= o.steps then
    if w.rank == 0 then
      print(string.format("the run in %s finished: step %d of %d; nothing to train (pass --steps N > %d to go on)",
                          o.resume, resumed.step, o.steps, resumed.step))
    end
    return
  end
  local run = run_folder(o, w, dist)
  o.lp = w.tp > 1 and o["loss-parallel"] and not o["no-loss-parallel"]
  local main_rank = w.rank == 0
  local say = main_rank and print or function() end
  local tok, train_ids, val_ids = data.corpus(o.data, o.tokenizer)

  local cfg = { vocab_size = tok.vocab_size, dim = o.dim, n_layers = o.layers, n_heads = o.heads,
                n_kv_heads = o["kv-heads"] > 0 and o["kv-heads"] or nil, max_seq_len = o.seq,
                dropout = o.dropout }
  local hf = o["init-from"] ~= "" and loom.models.hf
  if hf then cfg = hf.train_config(o["init-from"], cfg, tok.vocab_size) end
  if hf then o.dim, o.layers, o.heads = cfg.dim, cfg.n_layers, cfg.n_heads end
  local model = build_model(o, cfg, w)
  if hf then hf.load_weights(model, o["init-from"]) say("initialised from " .. o["init-from"]) end
  shard_model(o, model, w)
  local nparams = L.count_params(model, w, dist)
  local opt = loom.optim.AdamW(model:parameters(), { lr = o.lr, betas = { 0.9, 0.95 },
                                                     weight_decay = o["weight-decay"] })
  if run and w.rank == 0 then
    write_json(run .. "/config.json", { flags = o, model = cfg, parameters = nparams, world = w.world, tp = w.tp,
                                        dp = w.dp, device = w.device })
  end
  local local_batch = o.batch / w.dp
  local sampler = data.Sampler(train_ids, { batch = local_batch, seq = o.seq, seed = o.seed,
                                            rank = w.dp_rank, world = w.dp })
  local start_step = 0

  -- the loss of a batch on this layout (loss_parallel keeps logits sharded),
  -- with backward when asked; returns the loss averaged over dp ranks
  local tpmod = require("loom.parallel")
  local pp_sched = w.pp > 1 and L.schedule(w, function(out, yy) return loom.F.cross_entropy(out, yy) end)
  local function step_loss(x, y, backward)
    if w.device ~= "cpu" then x, y = x:to(w.device), y:to(w.device) end
    local function forward() return loom.F.cross_entropy(model(x), y) end
    if pp_sched then forward = function() return L.pipeline_loss(pp_sched, x, y, backward, w, dist) end end
    local function loss_of()
      local loss = o.dtype == "bf16" and loom.autocast("bf16", forward) or forward()
      if backward and not pp_sched then loss:backward() end
      return loss
    end
    local loss = L.with_cp(w, model, x, y, function(cx, cy)
      x, y = cx, cy
      return o.lp and tpmod.loss_parallel(loss_of) or loss_of()
    end)
    local v = L.cp_avg(w, dist, loss:detach():to("f64"):reshape(1))
    if w.dp > 1 then v = dist.all_reduce(v, "avg", w.mesh, "dp") end
    return v:item()
  end

  -- checkpoints: one file (DIR/checkpoint.loom, loom.save) in one process;
  -- per-rank shards and a manifest (dist.checkpoint) in a distributed run.
  -- Each reads the other's, so a run resumes at any layout.
  local function ckpt() return require("loom.distributed.checkpoint") end
  -- a train.lua checkpoint DIR holds model_config.json (what --resume reads
  -- first) and the state: DIR/checkpoint.loom from one process, the
  -- dist.checkpoint directory DIR/state from several (a bare dist.checkpoint
  -- directory is taken too); either resumes at any layout
  local function state_path(dir)
    local fs = require("loom.fs")
    if fs.is_file(dir .. "/checkpoint.loom") then return dir .. "/checkpoint.loom" end
    if fs.is_dir(dir .. "/state") then return dir .. "/state" end
    return dir
  end
  local function extras(step)
    return { sampler = sampler:state(), rng = loom.get_rng_state(), step = step, vocab = tok.vocab, config = cfg }
  end
  if o.resume ~= "" then
    local extra
    local function check(e)
      if e.vocab ~= tok.vocab then error("train.lua: the checkpoint's vocabulary differs from this corpus", 0) end
    end
    local src = state_path(o.resume)
    if w.world == 1 then
      extra = loom.load(src)
      check(extra)
      model:load_state_dict(extra.model)
      opt:load_state_dict(extra.optim)
    else
      extra = ckpt().load({ model = model:state_dict(), optim = ckpt().optim_state_dict(opt, L.optim_opts(model, w)) }, src)
      check(extra)
      ckpt().load_optim_state_dict(opt, extra.optim, L.optim_opts(model, w))
    end
    sampler:set_state(extra.sampler)
    loom.set_rng_state(extra.rng)
    start_step = extra.step
    say(string.format("resumed from %s at step %d", o.resume, start_step))
  end
  local function save(step)
    if o.save == "" then return end
    local sd = extras(step)
    if w.world == 1 then
      require("loom.fs").mkdir_p(o.save)
      sd.model, sd.optim = model:state_dict(), opt:state_dict()
      loom.save(sd, o.save .. "/checkpoint.loom")
    else
      sd.model, sd.optim = model:state_dict(), ckpt().optim_state_dict(opt, L.optim_opts(model, w))
      require("loom.fs").mkdir_p(o.save)
      ckpt().save(sd, o.save .. "/state")
    end
    if main_rank then   -- what --resume reads first: the model's settings
      local flags = { steps = o.steps }
      for _, name in ipairs(MODEL_FLAGS) do flags[name] = o[name] end
      for _, name in ipairs(TRAIN_FLAGS) do flags[name] = o[name] end
      write_json(o.save .. "/model_config.json", { flags = flags, step = step })
    end
    say(string.format("saved the checkpoint of step %d in %s", step, o.save))
  end

  local function val_loss()
    local vs = data.Sampler(val_ids, { batch = local_batch, seq = o.seq, seed = 7, rank = w.dp_rank, world = w.dp })
    model:eval()
    local total = 0
    loom.no_grad(function()
      for _ = 1, o["eval-iters"] do
        local x, y = vs:next()
        total = total + step_loss(x, y, false)
      end
    end)
    model:train()
    return total / o["eval-iters"]
  end

  local log
  if main_rank and o.log ~= "" then
    local folder = o.log:match("^(.*[^/])/+[^/]+$")
    if folder then require("loom.fs").mkdir_p(folder) end
    local err
    log, err = require("loom.fs").open_log(o.log, start_step > 0)
    if not log then error("train.lua: --log: " .. tostring(err), 0) end
  end
  if log and start_step == 0 then
    log:write(json_line({ world = w.world, tp = w.tp, dp = w.dp, sequence_parallel = o["sequence-parallel"],
                          loss_parallel = o.lp, dtype = o.dtype, device = w.device, threads_per_rank = loom.num_threads() },
                        { "world", "tp", "dp", "sequence_parallel", "loss_parallel", "dtype", "device",
                          "threads_per_rank" }), "\n")
  end
  say(string.format("model: %d layers, dim %d, %d heads, %d parameters; %d steps of %dx%d tokens; "
                    .. "%s%s%s, %s", o.layers, o.dim, o.heads, nparams, o.steps, o.batch,
                    o.seq, L.describe(w, o),
                    o["sequence-parallel"] and w.tp > 1 and ", sequence parallel" or "",
                    o.lp and ", loss parallel" or "", o.dtype .. " on " .. w.device))
  say(require("loom.parallel.predict").before(cfg, w, o))
  -- progress: on a terminal, a live line rewritten with \r and kept at each
  -- eval; otherwise (a pipe, a file, under loomrun) whole lines at each
  -- eval, every --print-every steps and at the last step
  local last_step = o["stop-after"] > 0 and math.min(o["stop-after"], o.steps) or o.steps
  local live, live_open = main_rank and not o.quiet and own_terminal(), false
  local printed = now()
  local function progress(step, line, eval)
    if not main_rank then return end
    local due = o["progress-every-s"] > 0 and now() - printed >= o["progress-every-s"]
    if live then
      io.write("\r", line, "   ", eval and "\n" or "")
      live_open = not eval
    elseif eval or step == last_step or (o["print-every"] > 0 and step % o["print-every"] == 0) or due then
      io.write(line, "\n")
      printed = now()
    end
    io.flush()
  end
  local sched = { lr = o.lr, warmup = o.warmup, total = o.steps, min_lr = o.lr / 10 }
  local t0, tokens, last_loss, last_val = now(), 0, nil, nil
  local profile = require("loom.profiler").for_steps(o["profile-steps"], (run or ".") .. "/trace.json")
  for step = start_step + 1, last_step do
    profile(step)   -- --profile-steps A:B: starts at A, marks each step, stops after B
    opt:set_lr(loom.optim.lr_scheduler.cosine_lr(step, sched))
    local x, y = sampler:next()
    opt:zero_grad()
    last_loss = step_loss(x, y, true)
    -- (every rank has the same loss: a NaN stops or skips on all of them)
    local finite = last_loss == last_loss and math.abs(last_loss) ~= math.huge
    if not finite and not o["skip-nonfinite"] then
      error(string.format("train.lua: the loss is %s at step %d; lower --lr (now %g) or raise --warmup, keep "
                          .. "--grad-clip on, or pass --skip-nonfinite to skip such steps", last_loss, step, o.lr), 0)
    end
    if finite then
      if o["grad-clip"] > 0 then -- the norm as a tensor: on a GPU the step waits for nothing
        L.clip_grad_norm_(model:parameters(), o["grad-clip"], w, dist, { tensor = true })
      end
      opt:step()
    else
      say(string.format("step %d: loss %s, optimizer step skipped (--skip-nonfinite)", step, last_loss))
    end
    tokens = tokens + o.batch * o.seq
    if step == start_step + 1 then say(memory_line(model, opt, nparams)) say(require("loom.parallel.predict").after(cfg, w, o, model, opt, w.sent_bytes)) end
    local elapsed = now() - t0
    local tps = tokens / elapsed
    local entry = { step = step, loss = last_loss, tokens_per_s = math.floor(tps) }
    if step % o["eval-every"] == 0 or step == o.steps then
      last_val = val_loss()
      entry.val_loss = last_val
      save(step)
    elseif step == last_step then save(step) end
    if log then log:write(json_line(entry, { "step", "loss", "val_loss", "tokens_per_s" }), "\n") log:flush() end
    local eta = (o.steps - step) * elapsed / (step - start_step)
    local line = string.format("step %d/%d | loss %.4f%s | %.0f tok/s | ETA %s", step, o.steps, last_loss,
      last_val and string.format(" | val %.4f", last_val) or "", tps, fmt_time(eta))
    progress(step, line, entry.val_loss ~= nil)
  end
  profile()
  if log then log:close() end
  if live_open then io.write("\n") end
  local wall = now() - t0
  say(string.format("done: %d steps in %s, %.0f tokens/s, final loss %.4f, val loss %s", last_step - start_step,
                    fmt_time(wall), tokens / math.max(wall, 1e-9), last_loss or 0 / 0,
                    last_val and string.format("%.4f", last_val) or "n/a"))
  if main_rank and o.log ~= "" then
    plot(o.log, string.format("train.lua: %d layers, dim %d, %d heads, seq %d, batch %d, lr %g; %s, %s",
                              o.layers, o.dim, o.heads, o.seq, o.batch, o.lr, L.describe(w, o), o.dtype))
  end
  if o.sample > 0 and w.pp == 1 then   -- every rank runs the model; rank 0 prints
    loom.manual_seed(o.seed)
    local start = tok.stoi and (tok.stoi["\n"] or 1) or tok:encode("\n", { add_special_tokens = false })[1]
    local out = transformer.generate(model, loom.tensor({ { start } }, { dtype = "i64" }), o.sample,
                                     { temperature = 0.8 })
    say("---- sample ----\n" .. tok:decode(out) .. "\n----------------")
  end
  return { loss = last_loss, val_loss = last_val }
end

require("loom.cli").run("train.lua", main, arg or {})
