-- flags.lua: examples/train.lua's flags, what each value may be, and the
-- checks of a whole set of them against the world it runs in (each one
-- line naming the flag, raised as "train.lua: ..." errors).
local loom = require("loom")
local L = require("loom.train.layout")

local M = {}

-- flags(root) -> {name, default, help} of every flag (root: the checkout,
-- where the default corpus is)
function M.flags(root)
  return {
    { "data", root .. "examples/data/tinyshakespeare.txt", "text file to train on, or a token file (.bin, nanoGPT's "
                                                            .. "train.bin; val.bin beside it is the validation set)" },
    { "tokenizer", "", "tokenizer.json (Hugging Face): tokenizes a text --data, reads a .bin one (needed for .bin)" },
    { "steps", 600, "optimizer steps" },
    { "batch", 12, "sequences per step" },
    { "seq", 64, "characters per sequence" },
    { "model", "llama", "the model family built from --dim, --layers, --heads: llama or gpt2 (with --init-from, "
                        .. "the checkpoint's config.json says)" },
    { "dim", 128, "model width" },
    { "layers", 4, "transformer blocks" },
    { "heads", 4, "attention heads" },
    { "kv-heads", 0, "key/value heads (0: as many as heads)" },
    { "experts", 0, "a mixture of experts in every layer with this many experts (0: a dense feed-forward; --model llama)" },
    { "top-k", 2, "with --experts: the experts each token goes to" },
    { "aux-loss-coef", 0, "with --experts: the coefficient of the router's load-balancing loss (transformers' "
                          .. "router_aux_loss_coef; 0: none); given with --init-from, it replaces the checkpoint's" },
    { "dropout", 0, "dropout probability" },
    { "lr", 3e-3, "peak learning rate (AdamW, cosine decay, warmup)" },
    { "warmup", 50, "warmup steps" },
    { "weight-decay", 0.1, "AdamW weight decay" },
    { "grad-clip", 1, "clip the gradient norm to this (0: off)" },
    { "seed", 1337, "seed of the model's init and the batch sampler" },
    { "eval-every", 100, "evaluate the validation loss every N steps (0: never)" },
    { "eval-iters", 10, "batches per validation estimate" },
    { "skip-nonfinite", false, "skip the optimizer step when the loss is NaN or inf (default: stop with an error)" },
    { "log", "", "write one JSON object per line (step, loss, val_loss, tokens_per_s)" },
    { "save", "", "save a checkpoint into this directory at the end (and at each eval)" },
    { "resume", "", "resume from the checkpoint in this directory (its model and training settings and --steps "
                   .. "come with it, unless given)" },
    { "run-dir", "auto", "the run's folder: config.json, log.jsonl, the loss plot, checkpoints/ "
                         .. "(auto: runs/<UTC date-time>; none: no folder)" },
    { "config", "", "a Lua file returning a table of flag values, or a run's config.json; flags given here "
                    .. "override it" },
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
    { "async-tp", false, "with --sequence-parallel: the gathers before the column-wise projections (one per module: "
                       .. "wq/wk/wv, w1/w3) and the reduce-scatters after the row-wise ones (wo, w2) in chunks "
                       .. "overlapped with the matmuls" },
    { "cp", 1, "context-parallel degree: the sequence sharded over cp ranks (load-balanced causal attention)" },
    { "ep", 1, "expert-parallel degree: a mixture of experts' experts sharded over ep data-parallel ranks, tokens "
               .. "carried to them by all-to-all; pp * dp * ep * cp * tp = world size" },
    { "etp", 1, "expert tensor-parallel degree: 1 (each tp rank runs the experts whole) or --tp (each expert's hidden "
                .. "dim cut over the tp ranks, as torchtitan's ETP)" },
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
    { "profile-steps", "", "trace steps A:B (Chrome trace JSON, a summary, a timeline PNG) into LOOM_PROFILE's "
                           .. "trace:FILE, else trace.json in the run's folder (docs/profiling.md)" },
    { "init-from", "", "start from a Hugging Face checkpoint (DIR or .safetensors; its config.json sets the model: "
                       .. "llama or gpt2)" },
  }
end

-- what each number may be: {least, most (nil: no bound), integer}
M.RANGES = {
  steps = { 1, nil, true }, batch = { 1, nil, true }, seq = { 1, nil, true }, dim = { 1, nil, true },
  layers = { 1, nil, true }, heads = { 1, nil, true }, ["kv-heads"] = { 0, nil, true }, dropout = { 0, 0.99 },
  lr = { 0 }, warmup = { 0, nil, true }, ["weight-decay"] = { 0 }, ["grad-clip"] = { 0 }, seed = { 0, nil, true },
  ["eval-every"] = { 0, nil, true }, ["eval-iters"] = { 1, nil, true }, ["stop-after"] = { 0, nil, true },
  sample = { 0, nil, true }, ["print-every"] = { 0, nil, true }, tp = { 0, nil, true }, dp = { 0, nil, true },
  ep = { 1, nil, true }, etp = { 1, nil, true }, experts = { 0, nil, true }, ["top-k"] = { 1, nil, true }, ["aux-loss-coef"] = { 0 },
  ["progress-every-s"] = { 0 },
}

-- refuses numbers out of range, naming the flag, the range and the value
-- what each word may be (case as given here; any case accepted)
M.CHOICES = { model = { "llama", "gpt2" }, ["cp-rotate"] = { "allgather", "alltoall" }, schedule = { "1F1B", "gpipe" },
              dtype = { "f32", "bf16" }, device = { "cpu", "cuda", "auto" } }

-- refuses a word not among its flag's choices, naming the flag, the
-- choices and the word; returns the choice as spelled above
local function choice(name, v)
  for _, c in ipairs(M.CHOICES[name]) do
    if type(v) == "string" and v:lower() == c:lower() then return c end
  end
  local cs = M.CHOICES[name]
  error(string.format("train.lua: --%s expects %s or %s, got %s", name, table.concat(cs, ", ", 1, #cs - 1), cs[#cs],
                      tostring(v)), 0)
end

function M.check_ranges(o, flags)
  for name in pairs(M.CHOICES) do o[name] = choice(name, o[name]) end
  for _, f in ipairs(flags) do
    local r, v = M.RANGES[f[1]], o[f[1]]
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

-- tp and dp from the flags and the world (the ranks left by pp x cp), or an
-- error that says what to do
local function degrees(o, world, ranks)
  local tp, dp = o.tp, o.dp
  local asked = math.max(tp, 1) * math.max(dp, 1) * math.max(o.pp, 1) * math.max(o.cp, 1) * math.max(o.ep, 1)
  if ranks == 1 and asked > 1 then
    local parts = {}
    for _, k in ipairs { "pp", "cp", "ep", "tp", "dp" } do
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
  if o.fsdp and dp == 1 and o.cp <= 1 and o.ep <= 1 then
    error("train.lua: --fsdp shards over data-parallel (or context-parallel) ranks and --dp is 1: launch more ranks "
          .. "(scripts/loomrun -n 2 examples/train.lua --fsdp --tp 1) or leave --fsdp out", 0)
  end
  if o["no-reshard"] and not o.fsdp then error("train.lua: --no-reshard applies with --fsdp only", 0) end
  if o["sequence-parallel"] and tp == 1 then
    error("train.lua: --sequence-parallel needs --tp > 1 (launch with scripts/loomrun -n 2)", 0)
  end
  if o["async-tp"] and not o["sequence-parallel"] then
    error("train.lua: --async-tp needs --sequence-parallel (and --tp > 1)", 0)
  end
  if o.etp > 1 and o.etp ~= tp then
    error(string.format("train.lua: --etp %d must be 1 (the experts whole on each tp rank) or the --tp degree, %d",
                        o.etp, tp), 0)
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

-- layout(o, dist) -> w: the layout of the flags (loom.train.layout.world)
function M.layout(o, dist)
  local world = dist.world_size()
  local pc = math.max(o.pp, 1) * math.max(o.cp, 1) * math.max(o.ep, 1)
  if world % pc == 0 or world == 1 then check_applies(o, degrees(o, world == 1 and 1 or world / pc, world)) end   -- else L.world says why
  if dist.world_size() > 1 then   -- (ranks launched with other flags would pair their collectives wrongly)
    local names = {}
    for k in pairs(o) do names[#names + 1] = k end
    table.sort(names)
    for _, k in ipairs(names) do
      require("loom.train.cli").user("train.lua", "the ranks' flags", dist.agree, "--" .. k, tostring(o[k]))
    end
  end
  local w = require("loom.train.cli").user("train.lua", nil, L.world, o, dist, pick_device(o))
  if o.batch % w.data ~= 0 then
    error(string.format("train.lua: --batch %d must divide by the data-parallel ranks, %d (--dp %d x --ep %d)", o.batch,
                        w.data, w.dp, w.ep), 0)
  end
  local mb = o.microbatches > 0 and o.microbatches or w.pp
  if w.pp > 1 and (o.batch / w.data) % mb ~= 0 then
    error(string.format("train.lua: --microbatches %d must divide the batch of each data-parallel rank, %d "
                        .. "(--batch %d / --dp %d)", mb, o.batch / w.data, o.batch, w.data), 0)
  end
  return w
end

return M
