-- jit_workload.lua: what a user does in one process (train small models
-- with AdamW, SGD, clipping and bf16 autocast; print; generate; tokenize;
-- save and load in every format; convert and build on meta; TP + FSDP on a
-- one-rank mesh), then drops it all and prints every tensor still alive:
-- "held: PATH" for each one a compiled trace keeps (support/retention.lua)
-- and "storages: START -> END" after full collections. Run by
-- spec/jit_retention_spec.lua under luajit -Ohotloop=1, so that every loop
-- compiles at once and a trace sees the first closures of each function.
local loom = require("loom")
local H = require("support.retention")
local nn, F = loom.nn, loom.F
local start = tonumber(loom.C.lm_storage_count())

local function train(model, opt, steps, vocab, amp)
  for _ = 1, steps do
    local ids = loom.randint(1, vocab, { 2, 9 }):to("i64")
    local function loss_of()
      local logits = model(ids:narrow(2, 1, 8))
      return F.cross_entropy(logits:reshape(16, -1):float(), ids:narrow(2, 2, 8):reshape(16))
    end
    local loss = amp and loom.autocast("bf16", loss_of) or loss_of()
    opt:zero_grad()
    loss:backward()
    nn.utils.clip_grad_norm_(model:parameters(), 0.5)
    opt:step()
  end
end

local function work(dir)
  loom.manual_seed(1)
  local tok = loom.data.Tokenizer.from_file("spec/fixtures/tokenizers/llama3.json")
  local V = tok:get_vocab_size()
  local cfg = { vocab_size = V, dim = 32, n_layers = 2, n_heads = 4, max_seq_len = 32 }
  local model = loom.models.transformer.new(cfg)
  train(model, loom.optim.AdamW(model:parameters(), { lr = 1e-3 }), 3, V, true)
  train(model, loom.optim.SGD(model:parameters(), { lr = 1e-2, momentum = 0.9 }), 3, V, false)
  local _ = tostring(loom.randn(12, 12)) .. tostring(loom.randn(30, 30):gt(0))
  loom.generate(model, tok, "Hello world", { max_new_tokens = 4 })
  loom.generate(model, tok, "Hello world", { max_new_tokens = 4, temperature = 0.8, top_k = 8, top_p = 0.9, seed = 1 })
  tok:encode_batch({ "Hello world", "a" }, { pad_id = 1 })

  loom.save(model:state_dict(), dir .. "/m.t7")
  model:load_state_dict(loom.load(dir .. "/m.t7"))
  loom.save_safetensors(model:state_dict(), dir .. "/m.safetensors")
  model:load_state_dict(loom.load_safetensors(dir .. "/m.safetensors"))
  local hf = loom.models.hf
  for _, name in ipairs { "hf_llama_gqa", "hf_gpt2" } do
    local m = hf.from_pretrained("spec/fixtures/" .. name)
    m:generate({ 5, 9, 2 }, { max_new_tokens = 3 })
    hf.save_pretrained(m, dir .. "/" .. name)
    hf.load_weights(m, dir .. "/" .. name)
    m:bfloat16(); m:float(); m:to({ dtype = "f64" })
  end
  local meta = loom.device("meta"):use(loom.models.transformer.new, cfg)
  meta:to_empty("cpu")
  meta:init_weights()

  local dist, tp = require("loom.distributed"), require("loom.parallel")
  local fsdp = require("loom.distributed.fsdp")
  local mesh = dist.init_device_mesh("cpu", { 1, 1 }, { mesh_dim_names = { "dp", "tp" } })
  local pm = loom.models.transformer.new(cfg)
  tp.parallelize_module(pm, mesh["tp"], loom.models.transformer.tp_plan({ sequence_parallel = true }, pm))
  for _, block in pm.layers:ipairs() do fsdp.fully_shard(block, { mesh = mesh["dp"] }) end
  fsdp.fully_shard(pm, { mesh = mesh["dp"] })
  train(pm, loom.optim.AdamW(pm:parameters(), { lr = 1e-3 }), 3, V, false)
  dist.checkpoint.save(pm:state_dict(), dir .. "/dcp")
  dist.checkpoint.load(pm:state_dict(), dir .. "/dcp")
end

local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir " .. dir) == 0)
local ok, err = pcall(work, dir)
os.execute("rm -rf " .. dir)
if not ok then io.stderr:write("workload failed: ", tostring(err), "\n") os.exit(2) end
local now = H.settled_storages()
for _, path in ipairs(H.held()) do print("held: " .. path) end
print(string.format("storages: %d -> %d", start, now))
