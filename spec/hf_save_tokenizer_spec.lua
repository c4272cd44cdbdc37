-- hf_save_tokenizer_spec.lua: hf.save_pretrained(model, dir, {tokenizer =
-- tok}) writes what transformers' pipeline needs to use the folder as it
-- is: the tokenizer.json the tokenizer was read from (the same bytes),
-- tokenizer_config.json (a fast tokenizer, its bos/eos tokens),
-- generation_config.json and config.json with the bos/eos ids. (Checked
-- once with transformers 5.24's pipeline("text-generation") on such a
-- folder: the same greedy text as loom.generate; the suite checks the
-- files and that loom reads the folder back to the same text.)
local loom = require("loom")
local sys = require("support.sys")
local json = require("dkjson")

-- s with each byte that is not part of a valid UTF-8 character replaced
-- by U+FFFD (as Python's decode(errors="replace") does for lone bytes)
local function replace_invalid(s)
  local out, i = {}, 1
  while i <= #s do
    local c = s:byte(i)
    local n = c < 0x80 and 1 or c >= 0xC2 and c < 0xE0 and 2 or c >= 0xE0 and c < 0xF0 and 3 or c >= 0xF0 and c < 0xF5 and 4 or 0
    local ok = n > 0 and i + n - 1 <= #s
    for k = 1, n - 1 do
      local b = ok and s:byte(i + k)
      if not b or b < 0x80 or b > 0xBF then ok = false end
    end
    out[#out + 1] = ok and s:sub(i, i + n - 1) or "\239\191\189"
    i = i + (ok and n or 1)
  end
  return table.concat(out)
end

describe("a folder hf.save_pretrained wrote, in transformers' pipeline", function()
  -- spec/fixtures/pipeline/expected.json: what transformers' pipeline did
  -- with such a folder (scripts/make_pipeline_fixture.py: the folder made by
  -- spec/support/pipeline_model.lua, loaded by pipeline("text-generation",
  -- model=DIR) as it is). loom writes the same bytes today, and its greedy
  -- continuation is the pipeline's.
  it("is the bytes the pipeline loaded, and loom continues the prompt as the pipeline did", function()
    local want = json.decode(sys.read("spec/fixtures/pipeline/expected.json"))
    local P = require("support.pipeline_model")
    local dir = sys.tmpdir()
    local m, tok = P.save(dir)
    for name, sha in pairs(want.files) do
      local rc, out = sys.sh("sha256sum " .. sys.shq(dir .. "/" .. name))
      assert.equal(0, rc, out)
      assert.equal(sha, out:match("^(%x+)"), name .. " differs from the file transformers loaded")
    end
    local text, ids = loom.generate(m, tok, want.prompt, { max_new_tokens = want.max_new_tokens })
    local got_prompt, got_new = {}, {}
    for i, id in ipairs(ids) do
      if i <= #want.prompt_ids then got_prompt[i] = id - 1 else got_new[#got_new + 1] = id - 1 end
    end
    assert.same(want.prompt_ids, got_prompt)      -- 0-based, as HF numbers them
    assert.same(want.generated_ids, got_new)
    assert.equal(want.pipeline_text, replace_invalid(text))
    sys.rmtree(dir)
  end)
end)

describe("hf.save_pretrained with a tokenizer", function()
  it("writes tokenizer.json, tokenizer_config.json and generation_config.json a pipeline reads", function()
    local tok = loom.data.Tokenizer.from_file("spec/fixtures/tokenizers/qwen2.json")
    loom.manual_seed(1)
    local m = loom.models.transformer.new { vocab_size = tok:get_vocab_size(), dim = 32, n_layers = 1, n_heads = 4,
                                            n_kv_heads = 2, max_seq_len = 64, qkv_bias = true, model_type = "qwen2",
                                            tie_embeddings = true, bos_token_id = 5, eos_token_id = 7 }
    local dir = sys.tmpdir()
    loom.models.hf.save_pretrained(m, dir, { tokenizer = tok })
    assert.equal(sys.read("spec/fixtures/tokenizers/qwen2.json"), sys.read(dir .. "/tokenizer.json"))
    local tc = json.decode(sys.read(dir .. "/tokenizer_config.json"))
    assert.equal("PreTrainedTokenizerFast", tc.tokenizer_class)
    assert.equal(tok.tokens[6], tc.bos_token)
    assert.equal(tok.tokens[8], tc.eos_token)
    local gc = json.decode(sys.read(dir .. "/generation_config.json"))
    assert.same({ 5, 7 }, { gc.bos_token_id, gc.eos_token_id })
    local cfg = json.decode(sys.read(dir .. "/config.json"))
    assert.same({ "qwen2", 5, 7 }, { cfg.model_type, cfg.bos_token_id, cfg.eos_token_id })
    local again, tok2 = loom.models.hf.from_pretrained(dir), loom.data.Tokenizer.from_file(dir)
    assert.equal(loom.generate(m, tok, "Hello world", { max_new_tokens = 6 }),
                 loom.generate(again, tok2, "Hello world", { max_new_tokens = 6 }))
    local ok, err = pcall(loom.models.hf.save_pretrained, m, dir, { tokenizer = 3 })
    assert.is_false(ok)
    assert.matches("opts.tokenizer", tostring(err), 1, true)
    sys.rmtree(dir)
  end)
end)
