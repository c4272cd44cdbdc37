-- checkpoint.lua: a training run's checkpoints. One file (DIR/checkpoint.loom,
-- loom.save) in one process; per-rank shards and a manifest
-- (dist.checkpoint, DIR/state) in a distributed run; each reads the
-- other's, so a run resumes at any layout. Beside the state,
-- DIR/model_config.json holds what --resume reads first: the run's flags,
-- its step, and the model (family and whole config, an imported one too).
local loom = require("loom")
local json = require("dkjson")
local fs = require("loom.fs")
local L = require("loom.train.layout")
local run_dir = require("loom.train.run_dir")

local M = {}

-- the settings that make a checkpoint's model: --resume takes them
M.MODEL_FLAGS = { "model", "dim", "layers", "heads", "kv-heads", "seq" }
-- what else a resumed run takes from its checkpoint unless given again, so
-- that it goes on as the interrupted run would have (given ones may differ:
-- a new --lr for the rest of a run is fine)
M.TRAIN_FLAGS = { "data", "tokenizer", "batch", "dropout", "lr", "warmup", "weight-decay", "grad-clip", "seed",
                  "eval-every", "eval-iters", "dtype" }

-- settings(o, given) -> the checkpoint's settings (DIR/model_config.json)
-- or nil (an older checkpoint): its model settings, training settings and
-- --steps replace the defaults; a model flag given that differs is
-- refused in one line.
function M.settings(o, given)
  local path = o.resume .. "/model_config.json"
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read(65537) or ""
  f:close()
  local c = #text <= 65536 and json.decode(text) or nil
  if type(c) ~= "table" or type(c.flags) ~= "table" or type(c.step) ~= "number"
     or (c.model ~= nil and (type(c.model) ~= "table" or type(c.model.family) ~= "string"
                             or type(c.model.config) ~= "table")) then
    error("train.lua: --resume: " .. path .. " is not a train.lua model config", 0)
  end
  local diffs = {}
  for _, name in ipairs(M.MODEL_FLAGS) do
    local v = c.flags[name]
    if v ~= nil and type(v) == type(o[name]) and given[name] and o[name] ~= v then
      diffs[#diffs + 1] = string.format("--%s %s (the checkpoint's: %s)", name, tostring(o[name]), tostring(v))
    elseif v ~= nil and type(v) == type(o[name]) then
      o[name] = v
    end
  end
  if #diffs > 0 then
    error("train.lua: --resume " .. o.resume .. " has another model: " .. table.concat(diffs, ", ")
          .. "; leave these flags out to use the checkpoint's", 0)
  end
  if not given.steps and type(c.flags.steps) == "number" then o.steps = c.flags.steps end
  for _, name in ipairs(M.TRAIN_FLAGS) do
    local v = c.flags[name]
    if not given[name] and v ~= nil and type(v) == type(o[name]) then o[name] = v end
  end
  return c
end

-- a train.lua checkpoint DIR holds model_config.json and the state:
-- DIR/checkpoint.loom from one process, the dist.checkpoint directory
-- DIR/state from several (a bare dist.checkpoint directory is taken too)
local function state_path(dir)
  if fs.is_file(dir .. "/checkpoint.loom") then return dir .. "/checkpoint.loom" end
  if fs.is_dir(dir .. "/state") then return dir .. "/state" end
  return dir
end

local function dcp() return require("loom.distributed.checkpoint") end

-- load(run) -> the step the checkpoint o.resume was saved at: the model,
-- optimizer, sampler and RNG state put back (run: o, w, model, opt,
-- sampler, tok)
function M.load(run)
  local o, w, model, opt = run.o, run.w, run.model, run.opt
  local src = state_path(o.resume)
  local function check(e)
    if e.vocab ~= run.tok.vocab then error("train.lua: the checkpoint's vocabulary differs from this corpus", 0) end
  end
  local extra
  if w.world == 1 then
    extra = loom.load(src)
    check(extra)
    model:load_state_dict(extra.model)
    opt:load_state_dict(extra.optim)
  else
    extra = dcp().load({ model = model:state_dict(), optim = dcp().optim_state_dict(opt, L.optim_opts(model, w)) }, src)
    check(extra)
    dcp().load_optim_state_dict(opt, extra.optim, L.optim_opts(model, w))
  end
  run.sampler:set_state(extra.sampler)
  loom.set_rng_state(extra.rng)
  return extra.step
end

-- save(run, step): the checkpoint of step into o.save (collective)
function M.save(run, step)
  local o, w, model, opt = run.o, run.w, run.model, run.opt
  if o.save == "" then return end
  local sd = { sampler = run.sampler:state(), rng = loom.get_rng_state(), step = step, vocab = run.tok.vocab,
               config = run.cfg }
  fs.mkdir_p(o.save)
  if w.world == 1 then
    sd.model, sd.optim = model:state_dict(), opt:state_dict()
    loom.save(sd, o.save .. "/checkpoint.loom")
  else
    sd.model, sd.optim = model:state_dict(), dcp().optim_state_dict(opt, L.optim_opts(model, w))
    dcp().save(sd, o.save .. "/state")
  end
  if w.rank == 0 then   -- what --resume reads first: the run's settings and its model
    local flags = { steps = o.steps }
    for _, name in ipairs(M.MODEL_FLAGS) do flags[name] = o[name] end
    for _, name in ipairs(M.TRAIN_FLAGS) do flags[name] = o[name] end
    run_dir.write_json(o.save .. "/model_config.json",
                       { flags = flags, step = step, model = { family = run.family, config = run.cfg } })
  end
  run.say(string.format("saved the checkpoint of step %d in %s", step, o.save))
end

return M
