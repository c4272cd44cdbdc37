-- pipeline_model.lua: the folder hf_save_tokenizer_spec and
-- scripts/make_pipeline_fixture.py both make: a 1-layer Qwen2-style model
-- with the Qwen2 tokenizer fixture, its weights from integer arithmetic
-- (the same bytes on every x86 CPU: no libm, no RNG), saved with
-- hf.save_pretrained{tokenizer}. As a script: luajit pipeline_model.lua DIR.
local loom = require("loom")

local M = {}

M.PROMPT, M.NEW_TOKENS = "Hello world", 8

-- the model and its tokenizer
function M.build()
  local tok = loom.data.Tokenizer.from_file("spec/fixtures/tokenizers/qwen2.json")
  local m = loom.models.transformer.new { vocab_size = tok:get_vocab_size(), dim = 32, n_layers = 1, n_heads = 4,
                                          n_kv_heads = 2, max_seq_len = 64, qkv_bias = true, model_type = "qwen2",
                                          tie_embeddings = true, bos_token_id = 5, eos_token_id = 7 }
  loom.no_grad(function()
    for k, kv in ipairs(m:named_parameters()) do
      local p = kv[2]
      local n = p:numel()
      -- ((i * 7919 + k * 104729) mod 97 - 48) / 64: exact in f32
      local v = {}
      for i = 0, n - 1 do v[i + 1] = ((i * 7919 + k * 104729) % 97 - 48) / 64 end
      p:copy_(loom.tensor(v):reshape(p:size()))
    end
  end)
  return m, tok
end

function M.save(dir)
  local m, tok = M.build()
  loom.models.hf.save_pretrained(m, dir, { tokenizer = tok })
  return m, tok
end

if arg and arg[0] and arg[0]:match("pipeline_model%.lua$") then M.save(assert(arg[1], "usage: pipeline_model.lua DIR")) end

return M
