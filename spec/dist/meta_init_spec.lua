-- meta_init_spec.lua: a model built on the meta device, parallelised, then
-- materialised (to_empty + init_weights) holds exactly the slices of the
-- model built the ordinary way, at any TP degree, and only its shards'
-- memory. Runs on 1, 2 and 4 ranks.
local loom = require("loom")
local tp = require("loom.parallel")
local H = require("support.tp")
local tr = loom.models.transformer

local CFG = { vocab_size = 64, dim = 64, n_layers = 2, n_heads = 4, max_seq_len = 16 }

local function sorted_keys(t)
  local k = {}
  for name in pairs(t) do k[#k + 1] = name end
  table.sort(k)   -- the same order on every rank: full_tensor is collective
  return k
end

describe("a model built on meta and materialised on this rank's shards", function()
  local mesh = H.world_mesh()

  it("equals the ordinary model, weights bit for bit and logits within f32 rounding", function()
    loom.manual_seed(11)
    local ref = tr.new(CFG)
    loom.manual_seed(11)
    local m = loom.device("meta"):use(tr.new, CFG)
    tp.parallelize_module(m, mesh, tr.tp_plan({}, m))
    m:to_empty("cpu")
    loom.manual_seed(11)
    m:init_weights()
    local sm, sr = m:state_dict(), ref:state_dict()
    local worst = 0
    for _, k in ipairs(sorted_keys(sm)) do
      local v = sm[k]
      if v.dist ~= nil then v = v:full_tensor() end
      worst = math.max(worst, (v - sr[k]):abs():max():item())
    end
    assert.are.equal(0, worst)
    local ids = loom.randint(1, 65, { 2, 8 })
    H.close(m(ids), ref(ids))
  end)

  it("allocates only its shards", function()
    collectgarbage() collectgarbage()
    local before = tonumber(loom.C.lm_allocated_bytes())
    local m = loom.device("meta"):use(tr.new, CFG)
    tp.parallelize_module(m, mesh, tr.tp_plan({}, m))
    m:to_empty("cpu")
    local held, full = tonumber(loom.C.lm_allocated_bytes()) - before, 0
    for _, p in ipairs(m:parameters()) do full = full + p:numel() * 4 end
    local norms = 4 * CFG.dim * (2 * CFG.n_layers + 1)   -- the RMSNorm weights stay whole
    local rope = 2 * 4 * CFG.max_seq_len * CFG.dim / CFG.n_heads / 2
    assert.are.equal((full - norms) / H.ws + norms + rope, held)
  end)
end)
