-- generate_spec.lua: model:generate with a KV cache on the Llama and GPT-2
-- models loaded from the tiny HF checkpoints: greedy continuations equal to
-- the reference (scripts/make_generate_fixtures.py: argmax of an
-- independent numpy forward of HF's models, each step's margin >= 1e-3, so
-- f32 cannot flip it; the same ids as transformers' generate(do_sample=False),
-- scripts/check_generate_transformers.py), with and without the cache; the cached step's
-- logits equal the full forward's (f32, atol 2e-5); sampling reproducible
-- from its seed, inside top_k / top_p, leaving loom's RNG alone; the text
-- helper loom.generate with a tokenizer.
local loom = require("loom")
local cjson = require("cjson")
local hf = loom.models.hf
local sys = require("support.sys")
local errmsg = require("support.ref").errmsg

local FIX = "spec/fixtures/"
local function plus1(t) local o = {} for i, v in ipairs(t) do o[i] = v + 1 end return o end
local function cases(name) return cjson.decode(sys.read(FIX .. name .. "/generate.json")).cases end

-- the logits of the last position from a full forward of ids (no cache)
local function full_last(model, ids)
  return loom.no_grad(function()
    local l = model(loom.tensor({ ids }, { dtype = "i64" }))
    return l:narrow(2, #ids, 1):reshape(-1)
  end)
end

for _, name in ipairs { "hf_llama_gqa", "hf_llama_tied", "hf_gpt2" } do
  describe("generate " .. name, function()
    local model = hf.from_pretrained(FIX .. name)

    it("greedy output equals the reference, with and without the cache", function()
      local cs = cases(name)
      assert.equal(3, #cs)
      for _, c in ipairs(cs) do
        local prompt, want = plus1(c.prompt), plus1(c.greedy)
        assert.same(want, model:generate(prompt, { max_new_tokens = #want - #prompt }))
        assert.same(want, model:generate(prompt, { max_new_tokens = #want - #prompt, cache = false }))
      end
    end)

    it("the cached steps' logits equal the full forward's", function()
      local ids = plus1(cases(name)[1].greedy)
      local cache = { pos = 0 }
      loom.no_grad(function()
        model(loom.tensor({ { unpack(ids, 1, 3) } }, { dtype = "i64" }), cache)
        for t = 4, 10 do
          local step = model(loom.tensor({ { ids[t] } }, { dtype = "i64" }), cache):reshape(-1)
          local want = full_last(model, { unpack(ids, 1, t) })
          local err = (step - want):abs():max():item()
          assert.is_true(err < 2e-5, string.format("step %d: max error %.3g", t, err))
        end
      end)
      assert.equal(10, cache.pos)
    end)

    it("samples reproducibly from the seed, within top_k and top_p, leaving loom's RNG alone", function()
      local prompt = { 3, 5 }
      loom.manual_seed(11)
      local before = loom.rand(4):totable()
      loom.manual_seed(11)
      local a = model:generate(prompt, { max_new_tokens = 12, temperature = 0.9, seed = 7 })
      local after = loom.rand(4):totable()
      assert.same(before, after)
      assert.same(a, model:generate(prompt, { max_new_tokens = 12, temperature = 0.9, seed = 7 }))
      assert.are_not.same(a, model:generate(prompt, { max_new_tokens = 12, temperature = 0.9, seed = 8 }))
      -- top_k = 1 and a tiny top_p are greedy
      local greedy = model:generate(prompt, { max_new_tokens = 8 })
      assert.same(greedy, model:generate(prompt, { max_new_tokens = 8, top_k = 1, seed = 3 }))
      assert.same(greedy, model:generate(prompt, { max_new_tokens = 8, top_p = 1e-9, seed = 3 }))
      -- each top_k = 3 draw is among the 3 best logits of its context
      local s = model:generate(prompt, { max_new_tokens = 10, top_k = 3, temperature = 2, seed = 5 })
      for t = #prompt + 1, #s do
        local l = full_last(model, { unpack(s, 1, t - 1) })
        local better = (l:gt(l:narrow(1, s[t], 1))):sum():item()
        assert.is_true(better < 3, string.format("token %d: %d logits beat it", t, better))
      end
    end)

    it("refuses bad options and a sequence past the model's positions", function()
      assert.truthy(errmsg(model.generate, model, { 1 }, { top_p = 1.5 }):find("opts.top_p", 1, true))
      assert.truthy(errmsg(model.generate, model, { 1 }, { max_new_tokens = -1 }):find("max_new_tokens", 1, true))
      assert.truthy(errmsg(model.generate, model, {}, {}):find("ids", 1, true))
      assert.truthy(errmsg(model.generate, model, { 0 }, {}):find("ids[1]", 1, true))
      assert.truthy(errmsg(model.generate, model, { 1 }, { max_new_tokens = 1000 }):find("exceed the model's", 1, true))
    end)
  end)
end

describe("loom.generate", function()
  it("continues a prompt from text to text through a tokenizer", function()
    local tok = loom.data.Tokenizer.from_file(FIX .. "tokenizers/llama3.json")
    loom.manual_seed(2)
    local model = loom.models.transformer.new({ vocab_size = tok.vocab_size, dim = 32, n_layers = 1, n_heads = 2,
                                                max_seq_len = 64 })
    local text, ids = loom.generate(model, tok, "Hello world", { max_new_tokens = 6 })
    local prompt = tok:encode("Hello world")
    assert.same(prompt, { unpack(ids, 1, #prompt) })
    assert.equal(#prompt + 6, #ids)
    assert.equal(tok:decode({ unpack(ids, #prompt + 1) }), text)
    assert.same(ids, model:generate(prompt, { max_new_tokens = 6 }))
    local stop = model:generate(prompt, { max_new_tokens = 6, eos_id = ids[#prompt + 1] })
    assert.equal(#prompt + 1, #stop)
  end)
end)
