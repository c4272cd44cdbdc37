-- safetensors_spec.lua (multi-rank): Hugging Face checkpoints loaded into
-- tensor-parallel models, each rank reading only its shards, give the
-- logits of the unsharded model (and of numpy's HF forward); load with
-- DTensor layouts (1-D and 2-D meshes, uneven shards, a parallelised
-- model's placements); save of DTensors (collective, rank 0 writes, an
-- error raised on every rank). Runs on 1, 2 and 4 ranks:
--   scripts/loomrun -n 4 --quiet-others scripts/run_specs.lua spec/dist/safetensors_spec.lua
-- Tolerances: logits vs the unsharded model f32 rtol 1.3e-6 / atol 1e-5
-- (support/tp.lua); vs numpy 1e-4; loaded weights exactly.
-- Every rank collects its mismatches and asserts only after all
-- collectives ran, so a failure cannot hang.
local ffi = require("ffi")
local loom = require("loom")
local dist = require("loom.distributed")
local st = require("loom.safetensors")
local hf = loom.models.hf
local H = require("support.tp")
local S = require("support.dist")

local Shard, Replicate = dist.Shard, dist.Replicate
local ws, me = H.ws, H.rank
local FIX = "spec/fixtures/"
local world = H.world_mesh()
local m22 = ws == 4 and dist.init_device_mesh("cpu", { 2, 2 }, { mesh_dim_names = { "dp", "tp" } }) or nil

local ROOT = S.scratch_dir("st-spec")
local on0 = S.on0

local function bytes(t)
  local c = t:contiguous()
  return ffi.string(c:data_ptr(), c:numel() * ({ f32 = 4, f64 = 8, i32 = 4, i64 = 8 })[c.dtype])
end
local function same(bad, what, got, want)
  if table.concat(got:size(), "x") ~= table.concat(want:size(), "x") or bytes(got) ~= bytes(want) then
    bad[#bad + 1] = what .. " differs"
  end
end
local function no_bad(bad) assert.same({}, bad) end

-- logits of the fixture's reference ids
local function logits(model, dir)
  local ref = loom.load_safetensors(FIX .. dir .. "/reference.safetensors")
  local out = loom.no_grad(function() return model(ref.ids + 1) end)
  return out, ref.logits
end

describe("Hugging Face checkpoints under tensor parallelism", function()
  local cases = {
    { "hf_llama_tied", world, "Llama, tied, tp = " .. ws },
    { "hf_gpt2", world, "GPT-2, tp = " .. ws },
    -- 2 kv heads: tp 2, on the tp dim of a 2x2 mesh when there are 4 ranks
    { "hf_llama_gqa", m22 and m22["tp"] or world, "Llama GQA, tp = " .. math.min(ws, 2) },
  }
  if ws > 2 and not m22 then cases[3] = nil end
  for _, c in ipairs(cases) do
    it(c[3] .. ": shards loaded from the file give the unsharded logits", function()
      local dir, mesh = c[1], c[2]
      local ref = hf.from_pretrained(FIX .. dir)
      local par = hf.from_pretrained(FIX .. dir, { tp_mesh = mesh })
      local bad = {}
      if mesh:size() > 1 and not dist.is_dtensor(H.param(par, c[1] == "hf_gpt2" and "h.1.attn.q.weight"
                                                                  or "layers.1.attention.wq.weight")) then
        bad[#bad + 1] = "the model was not parallelised"
      end
      H.compare_params(bad, dir .. " weights", par, ref, false, 0, 0)
      local got, numpy = logits(par, dir)
      local want = logits(ref, dir)
      H.close(bad, dir .. " logits vs unsharded", got, want)
      H.close(bad, dir .. " logits vs numpy", got, numpy, 0, 1e-4)
      no_bad(bad)
    end)
  end

  it("each rank copies exactly the bytes of its own shards", function()
    local reader = st.open(FIX .. "hf_llama_tied/model.safetensors")
    local R = getmetatable(reader).__index
    reader:close()
    local _, cfg = hf.read_config(FIX .. "hf_llama_tied")
    local model = loom.models.transformer.new(cfg)
    require("loom.parallel").parallelize_module(model, world, loom.models.transformer.tp_plan({}, model),
                                                { src_data_rank = false })
    local copied, orig = 0, R.read
    R.read = function(...)
      local t = orig(...)
      copied = copied + t:numel() * 4
      return t
    end
    local ok, err = pcall(hf.load_weights, model, FIX .. "hf_llama_tied")
    R.read = orig
    assert.is_true(ok, tostring(err))
    local want, total = 0, 0
    for _, kv in ipairs(model:named_parameters()) do
      local p = kv[2]
      want = want + (dist.is_dtensor(p) and p:to_local() or p):numel() * 4
      total = total + p:numel() * 4
    end
    assert.equal(want, copied)
    if ws > 1 then assert.is_true(copied < total, copied .. " of " .. total .. " bytes") end
  end)

  it("save_pretrained of a sharded model writes the checkpoint's tensors", function()
    local par = hf.from_pretrained(FIX .. "hf_gpt2", { tp_mesh = world })
    hf.save_pretrained(par, ROOT .. "/gpt2")
    local want = loom.load_safetensors(FIX .. "hf_gpt2/model.safetensors")
    local got = loom.load_safetensors(ROOT .. "/gpt2/model.safetensors")
    local bad = {}
    for k, v in pairs(want) do
      if got[k] == nil then bad[#bad + 1] = "missing " .. k else same(bad, k, got[k], v) end
    end
    no_bad(bad)
  end)
end)

describe("load_safetensors with DTensor layouts", function()
  local path = ROOT .. "/grid.safetensors"
  local full = {
    a = loom.arange(0, 35):reshape(5, 7),                     -- uneven on 2 and 4 ranks
    b = loom.arange(0, 96, 1, { dtype = "i64" }):reshape(4, 6, 4),
    c = loom.arange(0, 8):reshape(8),
  }
  on0(function() st.save(full, path) end)   -- plain tensors: only the caller writes

  -- the block of chunk q of k on dim d, by torch.chunk
  local function chunk(t, d, k, q)
    local n, off = S.chunk(t:size(d), k, q)
    return t:narrow(d, off + 1, n)
  end

  it("Shard(1), Shard(2), Shard(-1) and Replicate on the world mesh", function()
    local bad = {}
    local r = world:get_local_rank(1)
    for _, case in ipairs { { "a", Shard(1), 1 }, { "a", Shard(2), 2 }, { "b", Shard(2), 2 }, { "b", Shard(-1), 3 },
                            { "c", Replicate() } } do
      local name, pl, d = case[1], case[2], case[3]
      local lay = { [name] = { mesh = world, placements = { pl } } }
      local t = loom.load_safetensors(path, { names = { name }, layout = lay })[name]
      if not dist.is_dtensor(t) then bad[#bad + 1] = name .. " is not a DTensor"
      else
        local want = d and chunk(full[name], d, ws, r) or full[name]
        same(bad, name .. " " .. tostring(pl) .. " local", t:to_local(), want:contiguous())
        same(bad, name .. " " .. tostring(pl) .. " full", t:full_tensor(), full[name])
      end
    end
    no_bad(bad)
  end)

  it("a 2-D mesh: Shard(1) x Shard(2), and placements given by a function", function()
    if not m22 then return end
    local bad = {}
    local c = m22:get_coordinate()
    local t = loom.load_safetensors(path, { mesh = m22, placements = function(name)
      if name == "c" then return nil end
      return { Shard(1), Shard(2) }
    end })
    assert.is_false(dist.is_dtensor(t.c))
    same(bad, "c", t.c, full.c)
    for _, name in ipairs { "a", "b" } do
      local want = chunk(chunk(full[name], 1, 2, c[1]), 2, 2, c[2])
      same(bad, name .. " local", t[name]:to_local(), want:contiguous())
      same(bad, name .. " full", t[name]:full_tensor(), full[name])
    end
    no_bad(bad)
  end)

  it("the layout of a parallelised model (opts.model), through load_state_dict", function()
    local tr = loom.models.transformer
    local cfg = { vocab_size = 12, dim = 16, n_layers = 1, n_heads = 4, max_seq_len = 8 }
    loom.manual_seed(7)
    local ref = tr.new(cfg)
    on0(function() st.save(ref:state_dict(), ROOT .. "/loom_model.safetensors") end)
    loom.manual_seed(8)
    local par = tr.new(cfg)
    require("loom.parallel").parallelize_module(par, world, tr.tp_plan({}, par), { src_data_rank = false })
    local sd = loom.load_safetensors(ROOT .. "/loom_model.safetensors", { model = par })
    local bad = {}
    if ws > 1 and not dist.is_dtensor(sd["layers.1.attention.wo.weight"]) then bad[#bad + 1] = "wo not a DTensor" end
    par:load_state_dict(sd)
    H.compare_params(bad, "params", par, ref, false, 0, 0)
    local ids = loom.tensor({ { 1, 5, 9, 12, 3 } }, { dtype = "i64" })
    H.close(bad, "logits", loom.no_grad(function() return par(ids) end), loom.no_grad(function() return ref(ids) end))
    no_bad(bad)
  end)
end)

describe("save_safetensors of DTensors", function()
  it("gathers them; rank 0 writes and every rank returns once the file is complete", function()
    local t = dist.distribute_tensor(loom.arange(0, 35):reshape(5, 7), world, { Shard(2) }, { src_data_rank = false })
    local p = ROOT .. "/dt.safetensors"
    st.save({ t = t, plain = loom.ones(2) }, p, { metadata = { ranks = tostring(ws) } })
    local back = loom.load_safetensors(p)   -- no barrier: save returned only after rank 0 wrote
    local bad = {}
    same(bad, "t", back.t, loom.arange(0, 35):reshape(5, 7))
    same(bad, "plain", back.plain, loom.ones(2))
    no_bad(bad)
    assert.same({ ranks = tostring(ws) }, (st.metadata(p)))
  end)

  it("a failed write raises on every rank", function()
    local t = dist.distribute_tensor(loom.ones(4, 4), world, { Shard(1) }, { src_data_rank = false })
    local ok, err = pcall(st.save, { t = t }, ROOT .. "/no/such/dir/x.safetensors")
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("cannot open for writing", 1, true), tostring(err))
    if me ~= 0 then assert.is_truthy(tostring(err):find("[on rank 0]", 1, true), tostring(err)) end
  end)
end)

-- the last spec in the file
describe("cleanup", function()
  it("removes the scratch directory", function()
    on0(function() os.execute("rm -rf '" .. ROOT .. "'") end)
    assert.is_nil((os.rename(ROOT, ROOT)))
  end)
end)
