-- bench_generate.lua: tokens/s of greedy generation with the KV cache next
-- to the no-cache baseline (the whole sequence at every step), same model,
-- same prompt, same run, for the Llama transformer and GPT-2 at random
-- weights; the two paths' ids are compared too. Usage:
--   luajit scripts/bench_generate.lua [--dim 256 --layers 4 --heads 4 --vocab 4096
--                                      --prompt 32 --new 128 --threads 0 --json FILE]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_generate%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local loom = require("loom")
local bench = require("loom.train.bench")

local o = bench.args(arg, { dim = 256, layers = 4, heads = 4, vocab = 4096, prompt = 32, new = 128, threads = 0,
                            json = "" }, "bench_generate.lua")
if o.threads > 0 then loom.set_num_threads(o.threads) end
local len = o.prompt + o.new
local models = {
  { "llama", function() return loom.models.transformer.new({ vocab_size = o.vocab, dim = o.dim, n_layers = o.layers,
                                                              n_heads = o.heads, max_seq_len = len }) end },
  { "gpt2", function() return loom.models.gpt2.new({ vocab_size = o.vocab, n_embd = o.dim, n_layer = o.layers,
                                                      n_head = o.heads, n_positions = len }) end },
}
local prompt = {}
for i = 1, o.prompt do prompt[i] = (i * 37) % o.vocab + 1 end
local rows, results = {}, {}
for _, m in ipairs(models) do
  loom.manual_seed(1)
  local model = m[2]()
  model:generate(prompt, { max_new_tokens = 4 })   -- warm-up
  local t0 = bench.now()
  local a = model:generate(prompt, { max_new_tokens = o.new })
  local cached = bench.now() - t0
  t0 = bench.now()
  local b = model:generate(prompt, { max_new_tokens = o.new, cache = false })
  local full = bench.now() - t0
  local same = table.concat(a, ",") == table.concat(b, ",")
  rows[#rows + 1] = { m[1], string.format("%.1f", o.new / cached), string.format("%.1f", o.new / full),
                      string.format("%.2fx", full / cached), same and "yes" or "NO" }
  results[m[1]] = { cache_tok_s = o.new / cached, no_cache_tok_s = o.new / full, same_ids = same }
end
print(string.format("greedy generation, dim %d, %d layers, %d heads, vocab %d, prompt %d + %d new tokens, %d threads",
                    o.dim, o.layers, o.heads, o.vocab, o.prompt, o.new, loom.num_threads()))
bench.table({ "model", "KV cache tok/s", "no cache tok/s", "speed-up", "same ids" }, rows)
if o.json ~= "" then bench.write_json(o.json, results) end
