-- hf_families_spec.lua: the model families people fine-tune, exact against
-- transformers. Each spec/fixtures/families/<name> folder is a tiny
-- checkpoint transformers 5 built from a config and saved, with what it
-- computed (scripts/make_family_fixtures.py, f32, eager attention): loom's
-- hf.from_pretrained must give the same logits and loss (relative 1e-5),
-- the same gradient of every parameter and the same parameters after one
-- AdamW step (in HF's layout, relative to each tensor's largest value,
-- 1e-5), the same greedy text with its KV cache, and save_pretrained must
-- write back the very tensors and the config fields transformers wrote.
local loom = require("loom")
local hf = loom.models.hf

local FIX = "spec/fixtures/families/"
local FAMILIES = { "llama3", "qwen2", "qwen3", "mistral", "phi3", "gemma", "olmo2", "mixtral", "qwen3_moe" }

local function same(a, b) return (a:to("f64") - b:to("f64")):abs():max():item() == 0 end

-- largest |a - b| over the largest |b| (b: the reference)
local function rel(a, b)
  local d = (a:to("f64") - b:to("f64")):abs():max():item()
  local m = b:to("f64"):abs():max():item()
  return d / math.max(m, 1e-30)
end

local function load(name)
  local ref = loom.load_safetensors(FIX .. name .. "/reference.safetensors")
  local model = hf.from_pretrained(FIX .. name)
  return model, ref
end

describe("Hugging Face model families against transformers", function()
  for _, name in ipairs(FAMILIES) do
    describe(name, function()
      it("logits, loss, every gradient and an AdamW step equal transformers' (1e-5)", function()
        local model, ref = load(name)
        local logits = model(ref.ids + 1)
        assert.is_true(rel(logits, ref.logits) <= 1e-5, string.format("logits: rel %.3e", rel(logits, ref.logits)))
        local loss = loom.F.cross_entropy(logits, ref.targets + 1)
        local aux = model:aux_loss()   -- (mixtures of experts: the router's load-balancing loss, as transformers adds it)
        if aux then loss = loss + aux end
        local lrel = math.abs(loss:item() - ref.loss:item()) / ref.loss:item()
        assert.is_true(lrel <= 1e-5, string.format("loss %.9g vs %.9g", loss:item(), ref.loss:item()))
        loss:backward()
        local grads, bad = hf.hf_grads(model), {}
        for hname, g in pairs(grads) do
          local want = ref["grad." .. hname]
          if want == nil then bad[#bad + 1] = hname .. ": not in transformers' model"
          elseif rel(g, want) > 1e-5 then bad[#bad + 1] = string.format("grad %s: rel %.3e", hname, rel(g, want)) end
        end
        loom.optim.AdamW(model:parameters(), { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-3, weight_decay = 0.1 }):step()
        local n = 0
        for hname, p in pairs(hf.hf_state_dict(model)) do
          n = n + 1
          local want = ref["step." .. hname]
          if rel(p, want) > 1e-5 then bad[#bad + 1] = string.format("step %s: rel %.3e", hname, rel(p, want)) end
        end
        assert.same({}, bad)
        local m = 0
        for k in pairs(ref) do if k:match("^grad%.") then m = m + 1 end end
        assert.equal(m, n, "loom's parameters in HF names against transformers'")
      end)

      it("greedy generation with the KV cache gives transformers' ids", function()
        local model, ref = load(name)
        local out = model:generate(ref.prompt:reshape(-1) + 1, { max_new_tokens = 8 })
        local want = {}
        for i, id in ipairs(ref.greedy:reshape(-1):totable()) do want[i] = id + 1 end
        assert.same(want, out)
      end)

      it("save_pretrained writes back transformers' tensors and config", function()
        local model = hf.from_pretrained(FIX .. name)
        local dir = os.tmpname()
        os.remove(dir)
        hf.save_pretrained(model, dir)
        local orig = loom.load_safetensors(FIX .. name .. "/model.safetensors")
        local saved = loom.load_safetensors(dir .. "/model.safetensors")
        for k, v in pairs(orig) do
          assert.is_not_nil(saved[k], k)
          assert.is_true(same(saved[k], v), k .. " differs")
        end
        for k in pairs(saved) do assert.is_not_nil(orig[k], "an extra tensor " .. k) end
        local json = require("dkjson")
        local function read(p) local f = assert(io.open(p)) local s = f:read("*a") f:close() return json.decode(s) end
        local a, b = read(FIX .. name .. "/config.json"), read(dir .. "/config.json")
        for _, k in ipairs { "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                             "num_key_value_heads", "intermediate_size", "rms_norm_eps", "tie_word_embeddings",
                             "hidden_act", "sliding_window", "bos_token_id", "eos_token_id", "pad_token_id" } do
          assert.same(a[k], b[k], k)
        end
        assert.same(a.rope_parameters.rope_theta, b.rope_parameters.rope_theta)
        assert.same(a.rope_parameters.rope_type, b.rope_parameters.rope_type)
        -- and loom reads its own folder back to the same model
        local again = hf.from_pretrained(dir)
        local ids = loom.tensor({ { 4, 5, 6, 7 } }, { dtype = "i64" })
        assert.is_true(same(again(ids), model(ids)))
        os.execute("rm -rf " .. dir)
      end)
    end)
  end
end)
