-- fsdp_spec.lua: fully_shard (FSDP2 semantics) composed with tensor
-- parallelism on a {dp, tp} mesh: 5 AdamW steps with clip_grad_norm_ equal
-- one process fed the dp-times larger batch (the ground truth: the same
-- model, unsharded, on every rank), with reshard_after_forward on and off,
-- with and without sequence parallelism, with overlap on and off; an MLP
-- with biases and odd sizes (uneven dp pieces, a Colwise bias cut inside
-- its TP shard); parameters and optimizer state per rank about 1/(dp*tp)
-- of the model's; the collectives of a step, in order (prefetching).
-- Meshes: 2x2 on 4 ranks; 2x1 (FSDP only) and 1x2 (TP, dp of one) on 2
-- ranks; 1x1 on one.
-- Tolerance: f32 rtol 1.3e-6 / atol 1e-5, norms rtol 1e-5 (as tp_dp_spec).
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local fsdp = require("loom.distributed.fsdp")
local H = require("support.tp")
local nn, tr = loom.nn, loom.models.transformer

local ws = H.ws
local meshes = H.dp_tp_meshes()
local cfg = H.TINY_LLAMA

-- the Llama model, tensor-parallel on mesh["tp"] when tp > 1, then each
-- block and the root fully_shard on mesh["dp"]
local function sharded_llama(mesh, o)
  local ref, m = H.twins(3, tr.new, cfg)
  local ntp = mesh:size("tp")
  if ntp > 1 then
    tp.parallelize_module(m, mesh["tp"], tr.tp_plan({ sequence_parallel = o.sp, loss_parallel = true, tp = ntp }, m))
  end
  local opts = { mesh = mesh["dp"], reshard_after_forward = o.reshard, overlap = o.overlap }
  for _, block in m.layers:ipairs() do fsdp.fully_shard(block, opts) end
  fsdp.fully_shard(m, { mesh = mesh["dp"], overlap = o.overlap })
  return ref, m
end

local train, llama_batch, llama_loss = H.train_vs_one, H.llama_batch, H.llama_loss

local function bytes(t) return (t.dist ~= nil and t:to_local() or t):numel() * 4 end

describe("fully_shard x TP", function()
  local cases = {
    { reshard = true, sp = true },
    { reshard = true, sp = false },
    { reshard = false, sp = true },
    { reshard = true, sp = true, overlap = false },
  }
  for _, mm in ipairs(meshes) do
    for ci, c in ipairs(cases) do
      if ci == 1 or mm.shape[1] * mm.shape[2] == ws and (ws == 4 or ci <= 3) then
        local name = string.format("%dx%d mesh, reshard_after_forward=%s, sequence_parallel=%s%s: 5 steps with "
                                   .. "clip_grad_norm_ equal one process on the %dx batch", mm.shape[1], mm.shape[2],
                                   tostring(c.reshard), tostring(c.sp), c.overlap == false and ", no overlap" or "",
                                   mm.shape[1])
        it(name, function()
          local mesh, bad = mm.mesh, {}
          local ref, m = sharded_llama(mesh, c)
          local o1, o2 = train(bad, mesh, ref, m, 5, llama_batch, llama_loss)
          H.compare_params(bad, "after 5 steps", m, ref, false)
          -- the optimizer state, gathered, is the reference's
          local refp = ref:parameters()
          for i, p in ipairs(m:parameters()) do
            local s = o1.state[i]
            local full = dist.from_local(s.exp_avg_sq, p.device_mesh, p.placements, { shape = p:size() })
            H.close(bad, "exp_avg_sq " .. i, full, o2.state[i].exp_avg_sq)
            if table.concat(p:size(), "x") ~= table.concat(refp[i]:size(), "x") then bad[#bad + 1] = "order " .. i end
          end
          assert.same({}, bad)
        end)
      end
    end
  end

  it("keeps 1/(dp*tp) of the parameters and optimizer state on each rank (printed)", function()
    local mesh = meshes[1].mesh
    local ndp, ntp = mesh:size("dp"), mesh:size("tp")
    local ref, m = sharded_llama(mesh, { reshard = true, sp = true })
    local opt = loom.optim.AdamW(m:parameters(), { lr = 1e-3 })
    local x, y = llama_batch(1, ndp)
    opt:zero_grad()
    llama_loss(m, x:narrow(1, 1, 2), y:narrow(1, 1, 2), true)
    opt:step()
    local mem = fsdp.memory(m, opt)
    -- the bound: every tensor cut in dp*tp (rounded up), norms (replicated over tp) in dp
    local full, bound = 0, 0
    for _, kv in ipairs(ref:named_parameters()) do
      local p = kv[2]
      full = full + bytes(p)
      local split = p:dim() == 1 and ndp or ndp * ntp
      bound = bound + math.ceil(p:numel() / split) * 4 + 4 * p:size(1)
    end
    if H.rank == 0 then
      print(string.format("\n  fsdp %dx%d: per rank %d B parameters + %d B AdamW state = %d B; the full model: "
                          .. "%d B + %d B (%.3f of it)", ndp, ntp, mem.params, mem.optimizer, mem.total, full,
                          2 * full, mem.total / (3 * full)))
    end
    assert.is_true(mem.params <= bound, mem.params .. " > " .. bound)
    assert.equal(2 * mem.params, mem.optimizer)
    local total = dist.all_reduce(loom.tensor({ mem.params }, { dtype = "f64" }), "sum")
    assert.is_true(total:item() >= full)   -- every element is somewhere
  end)

  it("issues one all-gather per unit in forward, one per resharded block in backward (prefetched), "
     .. "and one reduce-scatter per unit", function()
    local mesh = meshes[1].mesh
    for _, overlap in ipairs { true, false } do
      local _, m = sharded_llama(mesh, { reshard = true, sp = false, overlap = overlap })
      local log, ag, rs = {}, dist.all_gather, dist.reduce_scatter
      dist.all_gather = function(...) log[#log + 1] = "AG" return ag(...) end
      dist.reduce_scatter = function(...) log[#log + 1] = "RS" return rs(...) end
      local ok, err = pcall(function()
        for _ = 1, 2 do
          log = {}
          local x = loom.randint(1, cfg.vocab_size + 1, { 2, 8 })
          tp.loss_parallel(function()
            local loss = loom.F.cross_entropy(m(x), x)
            log[#log + 1] = "|"
            loss:backward()
          end)
        end
      end)
      dist.all_gather, dist.reduce_scatter = ag, rs
      assert(ok, err)
      -- 3 units (the root and 2 blocks); backward: the root's pre-backward
      -- prefetches block 2, block 2's prefetches block 1 before block 2's
      -- gradients are reduced; without overlap each waits its turn
      local want = overlap and "AG AG AG | AG AG RS RS RS" or "AG AG AG | AG RS AG RS RS"
      assert.equal(want, table.concat(log, " "))
    end
  end)

  it("releases a block's gathered parameters after forward and gathers them again for backward", function()
    local mesh = meshes[1].mesh
    local after = {}
    for _, reshard in ipairs { false, true } do
      local _, m = sharded_llama(mesh, { reshard = reshard, sp = false })
      local x = loom.randint(1, cfg.vocab_size + 1, { 2, 8 })
      collectgarbage()
      collectgarbage("stop")   -- no tensor of before is freed while we count
      tp.loss_parallel(function()
        local b0 = loom.C.lm_allocated_bytes()
        local loss = loom.F.cross_entropy(m(x), x)
        after[reshard] = tonumber(loom.C.lm_allocated_bytes() - b0)
        collectgarbage("restart")
        loss:backward()
      end)
      -- the modules hold the sharded parameters again, with gradients
      for _, p in ipairs(m:parameters()) do assert.is_true(p.dist ~= nil and p.grad ~= nil) end
    end
    -- the two blocks' TP-local weights (norm weights, 64 B, are stored inline and stay)
    local block = 0
    local ntp = mesh:size("tp")
    for _, kv in ipairs(tr.new(cfg).layers[1]:named_parameters()) do
      if kv[2]:dim() == 2 then block = block + kv[2]:numel() * 4 / ntp end
    end
    assert.equal(2 * block, after[false] - after[true])
  end)

  it("accumulates gradients over two backward calls without zero_grad", function()
    local mesh, bad = meshes[1].mesh, {}
    local ndp, dp = mesh:size("dp"), mesh:get_local_rank("dp")
    local ref, m = sharded_llama(mesh, { reshard = true, sp = true })
    for k = 1, 2 do
      local x = llama_batch(k, ndp)
      loom.F.cross_entropy(ref(x), x):backward()
      llama_loss(m, x:narrow(1, 2 * dp + 1, 2), x:narrow(1, 2 * dp + 1, 2), true)
    end
    H.compare_params(bad, "after 2 backward calls", m, ref, true)
    assert.same({}, bad)
  end)

  it("evaluates under no_grad with the parameters gathered for the call only", function()
    local mesh = meshes[1].mesh
    local ref, m = sharded_llama(mesh, { reshard = true, sp = true })
    local x = loom.randint(1, cfg.vocab_size + 1, { 2, 8 })
    local want = loom.no_grad(function() return loom.F.cross_entropy(ref(x), x) end)
    local got = loom.no_grad(function() return tp.loss_parallel(function() return loom.F.cross_entropy(m(x), x) end) end)
    local bad = H.close({}, "eval loss", got:reshape(1), want:reshape(1))
    for _, p in ipairs(m:parameters()) do if p.dist == nil or p.grad ~= nil then bad[#bad + 1] = "params after eval" end end
    assert.same({}, bad)
  end)
end)

describe("fully_shard on the meta device", function()
  it("built on meta, parallelised and sharded, then to_empty and init_weights: the ordinary model's weights "
     .. "and gradients", function()
    local mesh, bad = meshes[1].mesh, {}
    local ntp = mesh:size("tp")
    local function build(meta)
      loom.manual_seed(7)
      local m = meta and loom.device("meta"):use(tr.new, cfg) or tr.new(cfg)
      if ntp > 1 then tp.parallelize_module(m, mesh["tp"], tr.tp_plan({ sequence_parallel = true, tp = ntp }, m)) end
      for _, b in m.layers:ipairs() do fsdp.fully_shard(b, { mesh = mesh["dp"] }) end
      fsdp.fully_shard(m, { mesh = mesh["dp"] })
      if meta then loom.manual_seed(7) m:to_empty("cpu") m:init_weights() end   -- draws from the seed again
      return m
    end
    local a, b = build(false), build(true)
    local x = loom.randint(1, cfg.vocab_size + 1, { 2, 8 })
    for _, m in ipairs { a, b } do loom.F.cross_entropy(m(x), x):backward() end
    local pb = b:named_parameters()
    for i, kv in ipairs(a:named_parameters()) do
      H.close(bad, kv[1], pb[i][2], H.full(kv[2]), 0, 0)
      H.close(bad, "grad " .. kv[1], pb[i][2].grad, H.full(kv[2].grad), 0, 0)
    end
    assert.same({}, bad)
  end)
end)

describe("fully_shard on an MLP with biases and odd sizes", function()
  local MLP = nn.Module:extend("FsdpMLP")
  function MLP:__init() self.net1 = nn.Linear(9, 6) self.net2 = nn.Linear(6, 5) end
  function MLP:forward(x) return self.net2(loom.F.relu(self.net1(x))) end

  it("uneven dp pieces and a Colwise bias cut inside its TP shard: 3 steps equal one process", function()
    local mesh, bad = meshes[1].mesh, {}
    local ref, m = H.twins(5, MLP)
    if mesh:size("tp") > 1 then
      tp.parallelize_module(m, mesh["tp"], { net1 = tp.ColwiseParallel{}, net2 = tp.RowwiseParallel{} })
    end
    fsdp.fully_shard(m.net1, { mesh = mesh["dp"] })
    fsdp.fully_shard(m, { mesh = mesh["dp"] })
    if mesh:size("tp") > 1 then
      -- the bias: tp then dp on its only dim, on the {tp, dp} mesh
      local b = m.net1.bias
      assert.same({ "tp", "dp" }, b.device_mesh.mesh_dim_names)
      assert.equal("Shard(dim=1) Shard(dim=1)", tostring(b.placements[1]) .. " " .. tostring(b.placements[2]))
      assert.equal("Shard(dim=2)", tostring(m.net1.weight.placements[1]))
    end
    local function batch(step, ndp)
      loom.manual_seed(40 + step)
      return loom.randn(3 * ndp, 9), loom.randn(3 * ndp, 5)
    end
    train(bad, mesh, ref, m, 3, batch, function(model, x, y)
      local l = (model(x) - y):pow(2):mean() * 20
      if model == m then l:backward() end
      return l
    end)
    H.compare_params(bad, "after 3 steps", m, ref, false)
    assert.same({}, bad)
  end)
end)
