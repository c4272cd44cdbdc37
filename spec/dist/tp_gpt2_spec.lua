-- tp_gpt2_spec.lua: GPT-2 under its TP plan (loom.models.gpt2.tp_plan)
-- against the same model in one process: loss, every gradient and an SGD
-- step (rtol 1e-5; not AdamW: k's bias has a zero gradient up to rounding,
-- whose sign AdamW turns into a full step), and the backward's
-- all-reduces: q, k and v read one input and sum their gradients before
-- one all-reduce.
local loom = require("loom")
local dist = require("loom.distributed")
local tp = require("loom.parallel")
local H = require("support.tp")
local gpt2 = require("loom.models.gpt2")

local mesh = H.world_mesh()
local CFG = { vocab_size = 16, n_positions = 16, n_embd = 32, n_layer = 2, n_head = 4 }

describe("TP GPT-2", function()
  it("forward, backward and an SGD step equal the unsharded model; one all-reduce per block input in backward", function()
    local ref, m = H.twins(5, gpt2.new, CFG)
    tp.parallelize_module(m, mesh, gpt2.tp_plan({ tp = H.ws }, m))
    loom.manual_seed(6)
    local ids, tgt = loom.randint(1, 17, { 2, 8 }), loom.randint(1, 17, { 2, 8 })
    local bad = {}
    local loss, lossr = loom.F.cross_entropy(m(ids), tgt), loom.F.cross_entropy(ref(ids), tgt)
    H.close(bad, "loss", loss, lossr, 1e-5, 1e-6)
    local bw = dist.comm_mode(function() loss:backward() end)
    lossr:backward()
    H.compare_params(bad, "backward", m, ref, true, 1e-5, 1e-6)
    loom.optim.SGD(m:parameters(), { lr = 0.1 }):step()
    loom.optim.SGD(ref:parameters(), { lr = 0.1 }):step()
    H.compare_params(bad, "after SGD", m, ref, false, 1e-5, 1e-6)
    -- per layer: the attention's input (q, k, v share it; 3 when each
    -- reduced its own) and c_fc's; then lm_head's input
    assert.equal(2 * CFG.n_layer + 1, bw.counts.all_reduce, tostring(bw))
    assert.same({}, bad)
  end)
end)
