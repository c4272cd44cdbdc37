-- hostile_configs_spec.lua: Hugging Face config.json files as transformers
-- 4.x and 5.x write them, and absurd or unsupported ones (issue 26). A 5.x
-- config (rope_parameters = {rope_theta, rope_type}) gives the same model
-- as its 4.x form; kinds of RoPE loom lacks are refused by name; every
-- numeric field is range-checked with a message naming it and its value;
-- the config is compared with the weights file before a model is built.
local loom = require("loom")
local hf = loom.models.hf
local json = require("dkjson")
local sys = require("support.sys")
local X = require("support.misuse")

local FIX = "spec/fixtures/hf_llama_gqa/"
local base = json.decode(sys.read(FIX .. "config.json"))

-- a checkpoint directory with the fixture's weights and config c
local function checkpoint(c)
  local d = sys.tmpdir()
  os.execute(string.format("cp %s %s", sys.shq(FIX .. "model.safetensors"), sys.shq(d .. "/")))
  sys.write(d .. "/config.json", type(c) == "string" and c or json.encode(c))
  return d
end
local function with(edit)
  local c = json.decode(sys.read(FIX .. "config.json"))
  edit(c)
  return c
end
local errmsg, has = X.error_of, X.has
local function logits(model)
  local ref = loom.load_safetensors(FIX .. "reference.safetensors")
  return loom.no_grad(function() return model(ref.ids + 1) end)
end

describe("HF configs of transformers 4.x and 5.x", function()
  it("rope_parameters (5.x) gives the same config and the same logits as rope_theta (4.x)", function()
    local five = with(function(c) c.rope_theta = nil c.rope_parameters = { rope_theta = 1000, rope_type = "default" } end)
    local a4, c4 = hf.read_config(FIX)
    local a5, c5 = hf.read_config(checkpoint(five))
    assert.equal(a4, a5)
    assert.same(c4, c5)
    local m4, m5 = hf.from_pretrained(FIX), hf.from_pretrained(checkpoint(five))
    assert.equal(0, (logits(m4) - logits(m5)):abs():max():item())
  end)

  it("rope_parameters' theta is used: 500000 there gives other logits than 1000", function()
    local d = checkpoint(with(function(c) c.rope_theta = nil c.rope_parameters = { rope_theta = 500000, rope_type = "default" } end))
    assert.equal(500000, select(2, hf.read_config(d)).rope_theta)
    local diff = (logits(hf.from_pretrained(FIX)) - logits(hf.from_pretrained(d))):abs():max():item()
    assert.is_true(diff > 1e-3, "max logit difference " .. diff)
  end)

  local refused = {
    { "rope_parameters of rope_type yarn", function(c) c.rope_parameters = { rope_theta = 1000, rope_type = "yarn", factor = 8 } end,
      "rope_parameters: rope_type yarn is not supported" },
    { "llama3 scaling without its factors", function(c) c.rope_parameters = { rope_theta = 1000, rope_type = "llama3", factor = 8 } end,
      "low_freq_factor is missing" },
    { "a partial rotary factor", function(c) c.partial_rotary_factor = 0.5 end, "partial_rotary_factor 0.5 is not supported" },
    { "attention logit softcapping", function(c) c.attn_logit_softcapping = 50 end, "attn_logit_softcapping is 50: not supported" },
    { "a sliding window on a llama", function(c) c.sliding_window = 8 end, "sliding_window is not supported for model_type llama" },
    { "a layer pattern", function(c) c.layer_types = { "full_attention", "sliding_attention" } end,
      "layer_types[2] is sliding_attention: a layer pattern loom lacks" },
    { "rope_scaling of type linear (4.x's old key)", function(c) c.rope_scaling = { type = "linear", factor = 2 } end,
      "rope_scaling: rope_type linear is not supported" },
    { "rope_scaling of rope_type yarn", function(c) c.rope_scaling = { rope_type = "yarn", factor = 4 } end,
      "rope_scaling: rope_type yarn is not supported" },
    { "rope_theta and rope_parameters that disagree", function(c) c.rope_parameters = { rope_theta = 5 } end,
      "rope_theta 1000 and rope_parameters.rope_theta 5 disagree" },
    { "vocab_size 1e300", function(c) c.vocab_size = 1e300 end, "vocab_size is 1e+300, outside [1, 2147483647]" },
    { "hidden_size 16.5", function(c) c.hidden_size = 16.5 end, "hidden_size is 16.5, not an integer" },
    { "num_hidden_layers 1e9", function(c) c.num_hidden_layers = 1e9 end, "num_hidden_layers is 1000000000, outside [1, 10000]" },
    { "num_attention_heads 0", function(c) c.num_attention_heads = 0 end, "num_attention_heads is 0, outside" },
    { "a string for a size", function(c) c.intermediate_size = "24" end, "intermediate_size is 24, not a number" },
    { "a negative rms_norm_eps", function(c) c.rms_norm_eps = -1 end, "rms_norm_eps is -1, outside (0, 1]" },
    { "a rope_theta of 0", function(c) c.rope_theta = 0 end, "rope_theta is 0, outside" },
    { "heads that do not divide hidden_size", function(c) c.num_attention_heads = 3 end,
      "hidden_size 16 is not a multiple of num_attention_heads 3" },
    { "kv heads that do not divide heads", function(c) c.num_key_value_heads = 3 end,
      "num_attention_heads 4 is not a multiple of num_key_value_heads 3" },
    { "a missing vocab_size", function(c) c.vocab_size = nil end, "vocab_size is missing" },
  }
  for _, r in ipairs(refused) do
    it(r[1] .. " is refused, naming the field", function()
      local d = checkpoint(with(r[2]))
      has(errmsg(hf.read_config, d), "config.json", r[3])
      has(errmsg(hf.from_pretrained, d), "config.json", r[3])
    end)
  end

  it("GPT-2 configs: absurd fields named, n_layer checked against the weights", function()
    local g = json.decode(sys.read("spec/fixtures/hf_gpt2/config.json"))
    local function gpt2(edit)
      local c = json.decode(json.encode(g))
      edit(c)
      local d = sys.tmpdir()
      os.execute(string.format("cp %s %s", sys.shq("spec/fixtures/hf_gpt2/model.safetensors"), sys.shq(d .. "/")))
      sys.write(d .. "/config.json", json.encode(c))
      return d
    end
    has(errmsg(hf.read_config, gpt2(function(c) c.n_embd = 1e300 end)), "n_embd is 1e+300, outside")
    has(errmsg(hf.read_config, gpt2(function(c) c.n_head = 2.5 end)), "n_head is 2.5, not an integer")
    has(errmsg(hf.read_config, gpt2(function(c) c.layer_norm_epsilon = "x" end)), "layer_norm_epsilon is x, not a number")
    has(errmsg(hf.from_pretrained, gpt2(function(c) c.n_layer = c.n_layer + 1 end)), "n_layer " .. (g.n_layer + 1),
        "holds " .. g.n_layer .. " layers")
    assert.equal("gpt2", select(2, hf.from_pretrained(gpt2(function() end))))
  end)

  it("num_hidden_layers 1e9 ends in a Lua error at once, in a child under a 2 GB memory limit", function()
    local d = checkpoint(with(function(c) c.num_hidden_layers = 1e9 end))
    -- (under ASan, whose shadow memory needs terabytes of address space, without the limit)
    local limit = (os.getenv("LD_PRELOAD") or ""):find("asan") and "" or "ulimit -v 2000000;"
    local rc, out = X.child(string.format("loom.models.hf.from_pretrained(%q)", d), limit)
    assert.equal(1, rc, out)
    has(out, "luajit: ", "num_hidden_layers is 1000000000")
  end)

  it("a config that disagrees with the weights file is refused before a model is built", function()
    local d = checkpoint(with(function(c) c.num_hidden_layers = 3 end))
    has(errmsg(hf.from_pretrained, d), "num_hidden_layers 3", "model.safetensors holds 2 layers")
    d = checkpoint(with(function(c) c.vocab_size = 64 end))
    has(errmsg(hf.from_pretrained, d), "vocab_size x hidden size 64x16", "an embedding of 32x16")
  end)

  it("a config nested 100000 deep, or of 20 MB, is refused by its depth or size", function()
    local d = checkpoint('{"model_type":"llama","x":' .. string.rep("[", 100000) .. string.rep("]", 100000) .. "}")
    has(errmsg(hf.read_config, d), "config.json", "nests deeper than 64")
    d = checkpoint('{"model_type":"llama","x":"' .. string.rep("a", 20000000) .. '"}')
    has(errmsg(hf.read_config, d), "config.json", "over the limit")
  end)
end)

assert(base.rope_theta == 1000, "the fixture's theta changed: this spec assumes 1000")
