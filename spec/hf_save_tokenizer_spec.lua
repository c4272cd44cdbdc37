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
