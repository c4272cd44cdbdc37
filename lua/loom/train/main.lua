-- main.lua: the training program behind examples/train.lua: a model of any
-- family (loom.models, through its recipe) trained on a corpus at any
-- layout (pp x dp x cp x tp, FSDP, SP, async TP), with evaluation, a log,
-- checkpoints that resume at any layout, a loss plot and a sample.
local loom = require("loom")
local data = require("loom.data")
local L = require("loom.train.layout")
local flags_of = require("loom.train.flags")
local run_dir = require("loom.train.run_dir")
local ckpt = require("loom.train.checkpoint")
local M_model = require("loom.train.model")

local M = {}

-- the loss of a batch on this layout, with backward when asked: through
-- the pipeline's schedule, or the model; under bf16 autocast when asked.
-- (Functions of the run, not closures over the model, which a compiled
-- trace would keep: docs/architecture.md.)
local function forward_loss(run, x, y, backward)
  if run.pp_sched then return L.pipeline_loss(run.pp_sched, x, y, backward, run.w, run.dist) end
  local loss = loom.F.cross_entropy(run.model(x), y)
  -- a mixture of experts' load-balancing loss, as transformers adds it (of
  -- this rank's tokens under data or context parallelism, as its Trainer)
  local aux = run.model.aux_loss and run.model:aux_loss()
  if aux then loss = loss + aux end
  return loss
end
local function loss_of(run, x, y, backward)
  local loss
  if run.o.dtype == "bf16" then loss = loom.autocast("bf16", forward_loss, run, x, y, backward)
  else loss = forward_loss(run, x, y, backward) end
  if backward and not run.pp_sched then loss:backward() end
  return loss
end
-- (loss_parallel keeps the logits sharded on the vocabulary)
local function shard_loss(run, x, y, backward)
  if run.o.lp then return require("loom.parallel").loss_parallel(loss_of, run, x, y, backward) end
  return loss_of(run, x, y, backward)
end

-- the loss of a batch x, y, averaged over the dp (and cp) ranks
local function step_loss(run, x, y, backward)
  local w, dist = run.w, run.dist
  if w.device ~= "cpu" then x, y = x:to(w.device), y:to(w.device) end
  local loss
  if w.cp == 1 then loss = shard_loss(run, x, y, backward)
  else   -- x and y cut on the sequence, with the buffers the recipe names
    loss = L.with_cp(w, w.recipe, run.model, x, y, function(cx, cy) return shard_loss(run, cx, cy, backward) end)
  end
  local v = L.cp_avg(w, dist, loss:detach():to("f64"):reshape(1))
  if w.data_mesh then v = dist.all_reduce(v, "avg", w.data_mesh, 1) end
  return v:item()
end

-- the validation loss: --eval-iters batches of the validation ids
local function eval_batches(run, vs)
  local total = 0
  for _ = 1, run.o["eval-iters"] do
    local x, y = vs:next()
    total = total + step_loss(run, x, y, false)
  end
  return total / run.o["eval-iters"]
end
local function val_loss(run)
  local o, w = run.o, run.w
  local vs = data.Sampler(run.val_ids, { batch = o.batch / w.data, seq = o.seq, seed = 7, rank = w.data_rank,
                                         world = w.data })
  run.model:eval()
  local v = loom.no_grad(eval_batches, run, vs)
  run.model:train()
  return v
end

-- the model, its optimizer, the data and the checkpoint to go on from,
-- as the flags say. What the library finds wrong with the user's input (a
-- missing file, a config, a layout the model does not fit) is the user's
-- error: one line naming the flag (loom.train.cli.user).
local function setup(o, given, root, resumed)
  local cli = require("loom.train.cli")
  local dist = require("loom.distributed")
  local w = flags_of.layout(o, dist)
  local run = { o = o, w = w, dist = dist, root = root, given = given, resumed = resumed }
  o.lp = w.tp > 1 and o["loss-parallel"] and not o["no-loss-parallel"]
  run.say = w.rank == 0 and print or function() end
  local init = o["init-from"] ~= "" and o.resume == "" and o["init-from"] or nil
  if init and o.tokenizer == "" then   -- the checkpoint's own tokenizer, when its folder has one
    local tj = (init:match("%.[%w]+$") and (init:match("^(.*)/[^/]*$") or ".") or init:gsub("/+$", "")) .. "/tokenizer.json"
    if require("loom.fs").is_file(tj) then o.tokenizer = tj run.say("tokenizer: " .. tj .. " (the checkpoint's)") end
  end
  run.tok, run.train_ids, run.val_ids = cli.user("train.lua", o.tokenizer ~= "" and "--data/--tokenizer" or "--data",
                                                 require("loom.train.corpus").corpus, o.data, o.tokenizer)
  local vocab = run.tok.vocab_size
  local nval = run.val_ids:numel()
  if o["eval-every"] > 0 and nval <= o.seq + 1 then   -- found now, not at the first evaluation
    error(string.format("train.lua: --data: the validation split holds %d tokens, too few for one sequence of --seq %d "
                        .. "(a longer text, a val.bin, or --eval-every 0)", nval, o.seq), 0)
  end
  if run.resumed and run.resumed.model then
    run.family, run.cfg = run.resumed.model.family, run.resumed.model.config
  elseif init then
    run.family, run.cfg = cli.user("train.lua", "--init-from", M_model.from_hf, init, o, vocab)
    if given["aux-loss-coef"] and run.cfg.moe then run.cfg.moe.aux_loss_coef = o["aux-loss-coef"] end
  else
    run.family, run.cfg = M_model.from_flags(o, vocab)
  end
  if w.pp > 1 and run.cfg.moe and (run.cfg.moe.aux_loss_coef or 0) > 0 then
    error("train.lua: --pp: the experts' load-balancing loss spans every layer's router, which a pipeline cuts; "
          .. "train this model without --pp or with its config's output_router_logits false", 0)
  end
  run.model, run.pred = cli.user("train.lua", "the model at this layout (" .. L.describe(w, o) .. ")",
                                 M_model.build, o, run.family, run.cfg, w)
  if init then
    cli.user("train.lua", "--init-from", loom.models.hf.load_weights, run.model, init)
    run.say("initialised from " .. init)
  end
  L.fully_shard(run.model, w, o)   -- FSDP over dp x cp, once weights are in
  run.nparams = L.count_params(run.model, w, dist)
  run.opt = loom.optim.AdamW(run.model:parameters(), { lr = o.lr, betas = { 0.9, 0.95 },
                                                       weight_decay = o["weight-decay"] })
  run.sampler = data.Sampler(run.train_ids, { batch = o.batch / w.data, seq = o.seq, seed = o.seed,
                                              rank = w.data_rank, world = w.data })
  run.pp_sched = w.pp > 1 and L.schedule(w, function(out, yy) return loom.F.cross_entropy(out, yy) end)
  run.start_step = 0
  if o.resume ~= "" then
    run.start_step = cli.user("train.lua", "--resume", ckpt.load, run)
    run.say(string.format("resumed from %s at step %d", o.resume, run.start_step))
  end
  run.dir = run_dir.run_folder(o, w, dist)   -- the run can start: its folder now
  if run.dir and w.rank == 0 then
    local flags = {}
    for k, v in pairs(o) do if k ~= "lp" then flags[k] = v end end
    run_dir.write_json(run.dir .. "/config.json", { flags = flags, family = run.family, model = run.cfg,
                                                     parameters = run.nparams, world = w.world, tp = w.tp, dp = w.dp,
                                                     device = w.device })
  end
  return run
end

-- the log (rank 0, when asked): its first line says the layout
local function open_log(run)
  local o, w = run.o, run.w
  if w.rank ~= 0 or o.log == "" then return nil end
  local fs = require("loom.fs")
  local folder = o.log:match("^(.*[^/])/+[^/]+$")
  if folder then fs.mkdir_p(folder) end
  local log, err = fs.open_log(o.log, run.start_step > 0)
  if not log then error("train.lua: --log: " .. tostring(err), 0) end
  if run.start_step == 0 then
    log:write(run_dir.json_line({ world = w.world, tp = w.tp, dp = w.dp, sequence_parallel = o["sequence-parallel"],
                                  loss_parallel = o.lp, dtype = o.dtype, device = w.device,
                                  threads_per_rank = loom.num_threads() },
                                { "world", "tp", "dp", "sequence_parallel", "loss_parallel", "dtype", "device",
                                  "threads_per_rank" }), "\n")
  end
  return log
end

-- progress: on a terminal, a live line rewritten with \r and kept at each
-- eval; otherwise (a pipe, a file, under loomrun) whole lines at each
-- eval, every --print-every steps and at the last step
local function progress(run, step, line, eval)
  local o = run.o
  if run.w.rank ~= 0 then return end
  local due = o["progress-every-s"] > 0 and run_dir.now() - run.printed >= o["progress-every-s"]
  if run.live then
    io.write("\r", line, "   ", eval and "\n" or "")
    run.live_open = not eval
  elseif eval or step == run.last_step or (o["print-every"] > 0 and step % o["print-every"] == 0) or due then
    io.write(line, "\n")
    run.printed = run_dir.now()
  end
  io.flush()
end

-- one optimizer step: the loss (a NaN stops or skips it, on every rank
-- alike), clipping, the update
local function train_step(run, step)
  local o, w = run.o, run.w
  run.opt:set_lr(loom.optim.lr_scheduler.cosine_lr(step, run.lr_sched))
  local x, y = run.sampler:next()
  run.opt:zero_grad()
  local loss = step_loss(run, x, y, true)
  L.expert_grads(w, run.dist, o)   -- (with --ep: the experts' gradients as the data-parallel mean)
  local finite = loss == loss and math.abs(loss) ~= math.huge
  if not finite and not o["skip-nonfinite"] then
    error(string.format("train.lua: the loss is %s at step %d; lower --lr (now %g) or raise --warmup, keep "
                        .. "--grad-clip on, or pass --skip-nonfinite to skip such steps", loss, step, o.lr), 0)
  end
  if finite then
    if o["grad-clip"] > 0 then -- the norm as a tensor: on a GPU the step waits for nothing (until it is logged)
      run.grad_norm = L.clip_grad_norm_(run.model, o["grad-clip"], w, run.dist, { tensor = true })
    end
    run.opt:step()
  else
    run.say(string.format("step %d: loss %s, optimizer step skipped (--skip-nonfinite)", step, loss))
  end
  return loss
end

-- the router's load of the last step (a mixture of experts): the tokens
-- each expert took, summed over the layers this rank holds and over the
-- data-parallel ranks, and their balance (the busiest expert over the
-- mean); nil for a dense model
local function router_load(run)
  local layers = {}
  for _, kv in ipairs(run.model:named_modules()) do
    if kv[2].__name == "MoE" and kv[2].tokens_per_expert then layers[#layers + 1] = kv[2] end
  end
  if #layers == 0 then return nil end
  local E = layers[1].num_experts
  local counts = {}
  for e = 1, E do counts[e] = 0 end
  for _, l in ipairs(layers) do for e = 1, E do counts[e] = counts[e] + l.tokens_per_expert[e] end end
  local t = loom.tensor(counts, { dtype = "f64" })
  if run.w.data_mesh then t = run.dist.all_reduce(L.on_device(run.w, t), "sum", run.w.data_mesh, 1) end
  counts = t:totable()
  local total, most = 0, 0
  for _, c in ipairs(counts) do total, most = total + c, math.max(most, c) end
  local parts = {}
  for e, c in ipairs(counts) do parts[e] = string.format("%d", c) end
  return string.format("router: tokens per expert %s (busiest / mean %.2f)", table.concat(parts, " "),
                       most / math.max(total / E, 1e-9)), most / math.max(total / E, 1e-9)
end

-- Ctrl-C: a flag (core/tensor/interrupt.c, not armed: ops go on) read after
-- each step; every rank stops after the same step (the flags' max over
-- the world), with its checkpoint
local function interrupted(run)
  local C = loom.C
  local v = C.lm_interrupt_pending()
  if run.w.world > 1 then v = run.dist.all_reduce(loom.tensor({ v }, { dtype = "i64" }), "max"):item() end
  return v == 1
end

-- the line an interrupted run ends with: where it stopped and how to go on
local function resume_hint(run, step)
  local o, w = run.o, run.w
  if o.save == "" then return string.format("interrupted at step %d (no checkpoint: pass --save DIR to keep one)", step) end
  local launch = w.world > 1 and string.format("scripts/loomrun -n %d examples/train.lua", w.world)
                 or "luajit examples/train.lua"
  return string.format("interrupted at step %d; resume with: %s --resume %s", step, launch, o.save)
end

-- the sample at the end: every rank runs the whole model (its stages
-- gathered with pp > 1; generate gathers what sequence parallelism cuts),
-- rank 0 prints
local function sample(run)
  local o, tok = run.o, run.tok
  if o.sample == 0 then return end
  local start = tok.stoi and (tok.stoi["\n"] or 1) or tok:encode("\n", { add_special_tokens = false })[1]
  local model = L.whole_model(run.model, run.w, run.family, run.cfg)
  -- (with the KV cache while the sample fits the model's positions, else
  -- each token from the last window of them)
  local limit = model.config.max_seq_len or model.config.n_positions
  local out = model:generate({ start }, { max_new_tokens = o.sample, temperature = 0.8, seed = o.seed,
                                          cache = 1 + o.sample <= limit })
  run.say("---- sample ----\n" .. tok:decode(out) .. "\n----------------")
end

-- main(argv, root) -> {loss, val_loss}: the run examples/train.lua makes
-- (root: the checkout, for the default corpus)
function M.main(argv, root)
  local cli = require("loom.train.cli")
  local FLAGS = flags_of.flags(root)
  local o, given = cli.parse("train.lua", FLAGS, argv, "Trains a decoder model (Llama-style or GPT-2) on a text file.")
  if o.version then loom.show_config() return end
  if o.config ~= "" then cli.apply_config("train.lua", FLAGS, o, given, o.config) end
  local resumed = o.resume ~= "" and ckpt.settings(o, given)
  flags_of.check_ranges(o, FLAGS)
  if resumed and resumed.step >= o.steps then
    if require("loom.distributed").rank() == 0 then
      print(string.format("the run in %s finished: step %d of %d; nothing to train (pass --steps N > %d to go on)",
                          o.resume, resumed.step, o.steps, resumed.step))
    end
    return
  end
  local run = setup(o, given, root, resumed)
  return M.train(run)
end

-- train(run): the steps, evaluations, saves, the log, the plot, the sample
function M.train(run)
  local o, w = run.o, run.w
  local log = open_log(run)
  run.say(string.format("model: %s, %d parameters; %d steps of %dx%d tokens; %s%s%s, %s",
                        M_model.describe(run.family, run.cfg), run.nparams, o.steps, o.batch, o.seq, L.describe(w, o),
                        o["sequence-parallel"] and w.tp > 1 and ", sequence parallel" or "",
                        o.lp and ", loss parallel" or "", o.dtype .. " on " .. w.device))
  local P = require("loom.train.predict")
  run.say(P.before(run.pred))
  run.last_step = o["stop-after"] > 0 and math.min(o["stop-after"], o.steps) or o.steps
  run.live, run.live_open, run.printed = w.rank == 0 and not o.quiet and run_dir.own_terminal(), false, run_dir.now()
  run.lr_sched = { lr = o.lr, warmup = o.warmup, total = o.steps, min_lr = o.lr / 10 }
  local t0, tokens, last_loss, last_val = run_dir.now(), 0, nil, nil
  loom.C.lm_interrupt_install()   -- (not armed: ops go on; the flag is read after each step)
  local profile = require("loom.profiler").for_steps(o["profile-steps"], (run.dir or ".") .. "/trace.json")
  for step = run.start_step + 1, run.last_step do
    profile(step)   -- --profile-steps A:B: starts at A, marks each step, stops after B
    if step == run.start_step + 1 and w.ep > 1 then   -- (the first step's all-to-all bytes, for the prediction)
      local cm
      cm, last_loss = run.dist.comm_mode(train_step, run, step)
      run.a2a_bytes = cm.bytes.all_to_all
    else
      last_loss = train_step(run, step)
    end
    tokens = tokens + o.batch * o.seq
    if step == run.start_step + 1 then
      run.say(M_model.memory_line(run.model, run.opt, run.nparams))
      run.say(P.after(run.pred, run.model, run.opt, w.sent_bytes, run.a2a_bytes))
    end
    local elapsed = run_dir.now() - t0
    local tps = tokens / elapsed
    local norm = run.grad_norm
    run.grad_norm = nil
    if type(norm) ~= "number" and norm ~= nil then norm = norm:item() end
    local entry = { step = step, loss = last_loss, grad_norm = norm, tokens_per_s = math.floor(tps) }
    if o["eval-every"] > 0 and (step % o["eval-every"] == 0 or step == o.steps) then
      local line, balance = router_load(run)   -- (of the last training step, before evaluation routes others)
      if line then run.say(line) entry.router_balance = balance end
      last_val = val_loss(run)
      entry.val_loss = last_val
      ckpt.save(run, step)
    elseif step == run.last_step then ckpt.save(run, step) end
    if log then log:write(run_dir.json_line(entry, { "step", "loss", "val_loss", "router_balance", "grad_norm", "tokens_per_s" }), "\n") log:flush() end
    local eta = (o.steps - step) * elapsed / (step - run.start_step)
    local line = string.format("step %d/%d | loss %.4f%s | %.0f tok/s | ETA %s", step, o.steps, last_loss,
      last_val and string.format(" | val %.4f", last_val) or "", tps, run_dir.fmt_time(eta))
    progress(run, step, line, entry.val_loss ~= nil)
    if step < run.last_step and interrupted(run) then
      profile()
      if entry.val_loss == nil then ckpt.save(run, step) end
      if log then log:close() end
      if run.live_open then io.write("\n") end
      run.say(resume_hint(run, step))
      io.stdout:flush()
      os.exit(130)
    end
  end
  profile()
  if log then log:close() end
  if run.live_open then io.write("\n") end
  local wall = run_dir.now() - t0
  run.say(string.format("done: %d steps in %s, %.0f tokens/s, final loss %.4f, val loss %s", run.last_step - run.start_step,
                        run_dir.fmt_time(wall), tokens / math.max(wall, 1e-9), last_loss or 0 / 0,
                        last_val and string.format("%.4f", last_val) or "n/a"))
  if w.rank == 0 and o.log ~= "" then
    run_dir.plot(o.log, string.format("train.lua: %s, seq %d, batch %d, lr %g; %s, %s",
                                      M_model.describe(run.family, run.cfg), o.seq, o.batch, o.lr, L.describe(w, o),
                                      o.dtype))
  end
  sample(run)
  return { loss = last_loss, val_loss = last_val }
end

return M
