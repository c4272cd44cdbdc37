-- hostile_generate_spec.lua: generate's misuse ends in a clear error or
-- the right answer (issue 34's held-out cases): a denormal temperature, an
-- eos id or prompt id outside the vocabulary and options generate does not
-- take are refused by name; NaN logits are an error, not an id; a failed
-- generate leaves the model in the mode it found it.
local loom = require("loom")

local function model()
  loom.manual_seed(3)
  return loom.models.transformer.new { vocab_size = 16, dim = 16, n_layers = 1, n_heads = 2, max_seq_len = 16 }
end

local function refused(opts, want, ids)
  local ok, err = pcall(require("loom.models.generate").generate, model(), ids or { 1, 2 }, opts)
  assert.is_false(ok)
  assert.matches(want, tostring(err), 1, true)
end

describe("generate's hostile input", function()
  it("refuses a denormal temperature, eos or prompt ids outside the vocabulary, unknown options", function()
    refused({ temperature = 1e-310, max_new_tokens = 2 }, "opts.temperature")
    refused({ eos_id = 17 }, "opts.eos_id")
    refused({ max_new_tokens = 2 }, "ids[2]", { 1, 99 })
    refused({ max_length = 10 }, "max_length")
    refused({ stop = "\n" }, "stop")
    refused({ do_sample = "yes" }, "opts.do_sample")
  end)

  it("NaN logits are an error; a failed generate leaves the model training", function()
    local m = model()
    loom.no_grad(function() m.output.weight:copy_(loom.full(m.output.weight:size(), 0 / 0)) end)
    m:train()
    local ok, err = pcall(m.generate, m, { 1, 2 }, { max_new_tokens = 3 })
    assert.is_false(ok)
    assert.matches("NaN", tostring(err), 1, true)
    assert.is_true(m.training)
  end)
end)
