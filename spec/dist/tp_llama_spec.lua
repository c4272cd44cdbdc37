-- tp_llama_spec.lua: the small Llama of PyTorch's tensor-parallel tests
-- (2 layers, vocab 8, dim 16, 4 heads, max_seq_len 16, dropout 0) under
-- loom.models.transformer.tp_plan, with and without sequence parallel and
-- loss parallel, with tied embeddings and with frozen parameters: forward,
-- backward and an AdamW step equal the unsharded model built on every rank
-- from the same seed. Runs on 1, 2 and 4 ranks (TP degree = world size;
-- 4 heads divide by each).
-- Tolerance: f32 rtol 1.3e-6 / atol 1e-5 (support/tp.lua).
--
-- Tied embeddings: PyTorch's Transformer test leaves a tied output
-- projection to be re-tied by hand after parallelize_module. In loom,
-- tp_plan shards the embedding Rowwise (vocab-parallel, weight Shard(1))
-- and the output Colwise (weight Shard(1)): both place the (vocab, dim)
-- weight alike, and parallelize_module distributes a tied parameter once,
-- so the plan needs no variant and the model keeps one tied parameter.
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local H = require("support.tp")
local tr, Shard, Replicate = loom.models.transformer, dist.Shard, dist.Replicate
local mesh, ws = H.world_mesh(), H.ws

local function cfg(extra)
  local c = { vocab_size = 8, dim = 16, n_layers = 2, n_heads = 4, max_seq_len = 16, dropout = 0 }
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

local FROZEN = { "tok_embeddings.weight", "layers.1.attention.wq.weight", "layers.1.attention_norm.weight",
                 "layers.2.feed_forward.w2.weight" }

-- builds the pair, parallelizes, runs forward + backward + AdamW + forward;
-- returns the list of mismatches, the forward's comm_mode, the models and
-- the backward's comm_mode
local function run(o)
  local ref, m = H.twins(3, function() return tr.new(cfg(o.cfg)) end)
  if o.frozen then
    for _, fqn in ipairs(FROZEN) do
      H.param(ref, fqn):requires_grad_(false)
      H.param(m, fqn):requires_grad_(false)
    end
  end
  local plan = tr.tp_plan({ sequence_parallel = o.sp, loss_parallel = o.lp, tp = ws }, m)
  tp.parallelize_module(m, mesh, plan)
  local bad = {}
  H.compare_params(bad, "initial", m, ref, false, 0, 0)
  loom.manual_seed(9)
  local ids = loom.randint(1, 9, { 2, 8 })
  local tgt = loom.randint(1, 9, { 2, 8 })
  local cm, logits = dist.comm_mode(function() return m(ids) end)
  local ref_logits = ref(ids)
  if o.lp then
    if not (dist.is_dtensor(logits) and logits.placements[1] == Shard(3)) then
      bad[#bad + 1] = "loss_parallel plan: logits should be a DTensor sharded on the vocabulary"
    end
  elseif dist.is_dtensor(logits) then
    bad[#bad + 1] = "logits are a DTensor without loss_parallel"
  end
  H.close(bad, "logits", logits, ref_logits)
  local lossr = loom.F.cross_entropy(ref_logits, tgt)
  local loss, bw
  if o.lp then
    bw, loss = dist.comm_mode(function()
      return tp.loss_parallel(function()
        local l = loom.F.cross_entropy(logits, tgt)
        l:backward()
        return l
      end)
    end)
  else
    loss = loom.F.cross_entropy(logits, tgt)
    bw = dist.comm_mode(function() loss:backward() end)
  end
  lossr:backward()
  H.close(bad, "loss", loss, lossr)
  H.compare_params(bad, "backward", m, ref, true)
  local o1, o2 = loom.optim.AdamW(m:parameters(), { lr = 1e-2 }), loom.optim.AdamW(ref:parameters(), { lr = 1e-2 })
  o1:step()
  o2:step()
  H.compare_params(bad, "after AdamW", m, ref, false)
  loom.no_grad(function() H.close(bad, "logits after the step", m(ids), ref(ids)) end)
  return bad, cm, m, ref, bw
end

-- expected collectives of the forward (any TP degree)
local function want_counts(sp, lp)
  if sp then   -- embedding reduce-scatter; per layer two all-gathers and two reduce-scatters; the output's all-gather
    return { all_reduce = 0, reduce_scatter = 5, all_gather = 4 + 1 + (lp and 0 or 1) }
  end          -- embedding all-reduce; per layer wo and w2 all-reduce; the logits gathered unless loss_parallel
  return { all_reduce = 5, reduce_scatter = 0, all_gather = lp and 0 or 1 }
end

-- expected all-reduces of the backward (2 layers): per layer one of the
-- attention's input gradient and one of the feed-forward's (their
-- column-wise Linears sum theirs first: Megatron's count; one per Linear
-- made it 5), one of the output head's input; with SP also the norms'
-- weights (2 a layer and the last norm); loss_parallel's cross entropy,
-- computed inside, adds 3 (max, sum of exps, target logits over the shards)
local function want_bw_all_reduce(sp, lp)
  return 2 * 2 + 1 + (sp and 2 * 2 + 1 or 0) + (lp and 3 or 0)
end

describe("TP Llama (PyTorch's test_transformer_training)", function()
  for _, sp in ipairs { false, true } do
    for _, lp in ipairs { false, true } do
      local name = string.format("sequence_parallel=%s loss_parallel=%s", tostring(sp), tostring(lp))
      it(name .. ": forward, backward and AdamW equal the unsharded model", function()
        local bad, cm, _, _, bw = run { sp = sp, lp = lp }
        -- a mesh of one rank counts its (trivial) collectives too
        H.check_counts(bad, "forward", cm, want_counts(sp, lp))
        H.check_counts(bad, "backward", bw, { all_reduce = want_bw_all_reduce(sp, lp) })
        assert.same({}, bad)
      end)
    end
  end

  it("parameters are placed as the plan says", function()
    loom.manual_seed(3)
    local m = tr.new(cfg())
    tp.parallelize_module(m, mesh, tr.tp_plan({ sequence_parallel = true, loss_parallel = true }, m))
    local want = { ["tok_embeddings.weight"] = Shard(1), ["layers.1.attention.wq.weight"] = Shard(1),
                   ["layers.2.attention.wo.weight"] = Shard(2), ["layers.1.feed_forward.w1.weight"] = Shard(1),
                   ["layers.1.feed_forward.w2.weight"] = Shard(2), ["layers.2.feed_forward.w3.weight"] = Shard(1),
                   ["layers.1.attention_norm.weight"] = Replicate(), ["norm.weight"] = Replicate(),
                   ["output.weight"] = Shard(1) }
    local bad = {}
    for fqn, pl in pairs(want) do
      local p = H.param(m, fqn)
      if not (dist.is_dtensor(p) and p.placements[1] == pl) then
        bad[#bad + 1] = fqn .. " is " .. (dist.is_dtensor(p) and tostring(p.placements[1]) or "plain")
      end
    end
    assert.same({}, bad)
  end)

  for _, sp in ipairs { false, true } do
    it("tied embeddings (sequence_parallel=" .. tostring(sp) .. "): one shared parameter, same training step", function()
      local bad, _, m, ref = run { sp = sp, lp = true, cfg = { tie_embeddings = true } }
      assert.is_true(ref.output.weight == ref.tok_embeddings.weight)
      assert.is_true(m.output.weight == m.tok_embeddings.weight, "the tie is broken")
      assert.equal(#ref:parameters(), #m:parameters())
      assert.same({}, bad)
    end)
  end

  it("tied parameters placed differently by two styles are an error", function()
    loom.manual_seed(3)
    local m = tr.new(cfg { tie_embeddings = true })
    -- Colwise on the embedding shards the embedding dim (Shard(2)); Colwise
    -- on the output shards the vocabulary (Shard(1))
    assert.error_matches(function()
      tp.parallelize_module(m, mesh, { tok_embeddings = tp.ColwiseParallel{}, output = tp.ColwiseParallel{} })
    end, "tied")
  end)

  for _, sp in ipairs { false, true } do
    it("frozen parameters (sequence_parallel=" .. tostring(sp) .. "): no gradient, untouched by AdamW, the rest equal", function()
      local bad, _, m = run { sp = sp, lp = false, frozen = true }
      for _, fqn in ipairs(FROZEN) do
        local p = H.param(m, fqn)
        if p.requires_grad then bad[#bad + 1] = fqn .. " requires grad after parallelize" end
        if p.grad ~= nil then bad[#bad + 1] = fqn .. " has a gradient" end
      end
      -- frozen ones kept their initial values (ref's are untouched too)
      loom.manual_seed(3)
      local init = tr.new(cfg())
      for _, fqn in ipairs(FROZEN) do H.close(bad, "frozen " .. fqn, H.param(m, fqn), H.param(init, fqn), 0, 0) end
      assert.same({}, bad)
    end)
  end

  it("tp_plan checks n_heads and n_kv_heads against the TP degree", function()
    loom.manual_seed(3)
    local m = tr.new(cfg { n_heads = 4, n_kv_heads = 2, dim = 16 })
    assert.error_matches(function() tr.tp_plan({ tp = 3 }, m) end, "n_heads %(4%) must divide by the tensor%-parallel degree %(3%)")
    assert.error_matches(function() tr.tp_plan({ tp = 4 }, m) end, "n_kv_heads %(2%) must divide by the tensor%-parallel degree %(4%)")
    assert.has_no.errors(function() tr.tp_plan({ tp = 2 }, m) end)
  end)
end)
