-- checkpoint_spec.lua: dist.checkpoint save/load: round trips of plain
-- tensors, DTensors and values, deduplication, resharding across meshes
-- and degrees, optimizer state, atomicity and the errors on bad files.
-- Runs on 1, 2 and 4 ranks:
--   luajit scripts/run_specs.lua spec/dist
--   scripts/loomrun -n 4 --quiet-others scripts/run_specs.lua spec/dist
-- References are full tensors drawn on every rank with the same seed; data
-- only moves, so comparisons are exact. Every rank collects its mismatches
-- and asserts only after all collectives ran, so a failure cannot hang.
local ffi = require("ffi")
local loom, dist = require("loom"), require("loom.distributed")
local H, sys = require("support.dist"), require("support.sys")
local ck = dist.checkpoint

local Shard, Replicate, Partial = dist.Shard, dist.Replicate, dist.Partial
local ws, me = H.ws, H.rank
local meshes = H.meshes()
local world = meshes[1].mesh
local m22 = meshes[2] and meshes[2].mesh   -- 2x2 {"dp", "tp"} on 4 ranks

local ROOT = H.scratch_dir("ckpt-spec")
local on0 = H.on0
local shq, exists, read, write = sys.shq, sys.exists, sys.read, sys.write
local function dir_of(name) return ROOT .. "/" .. name end
local err_of, has = H.err_of, H.has
local function full(x) return dist.is_dtensor(x) and x:full_tensor() or x end
local function zeros_like_layout(shape, dtype, mesh, pl)
  local z = loom.zeros(shape, { dtype = dtype })
  if mesh == nil then return z end
  return dist.distribute_tensor(z, mesh, pl)
end
local function last_file() return string.format("rank%05d.shards", ws - 1) end

teardown(function() on0(function() sys.rmtree(ROOT) end) end)

describe("dist.checkpoint round trip", function()
  it("brings back plain tensors and the non-tensor values of nested tables", function()
    local a, c = H.randn(1, 3, 5), loom.arange(6):to("i64"):view(2, 3)
    local s = H.randn(2, {})
    local sd = { a = a, nested = { c = c, s = s, deeper = { n = 2.5 } }, step = 10, name = "run",
                 flag = true, big = ffi.new("int64_t", 2 ^ 40 + 3), list = { 4, 5, 6 } }
    ck.save(sd, dir_of("plain"))
    local back = { a = loom.zeros(3, 5), nested = { c = loom.zeros({ 2, 3 }, { dtype = "i64" }), s = loom.zeros({}) } }
    local ret = ck.load(back, dir_of("plain"))
    local bad = {}
    H.check(bad, "a", back.a, a)
    H.check(bad, "nested.c", back.nested.c, c)
    H.check(bad, "nested.s", back.nested.s, s)
    assert.same({}, bad)
    assert.equal(back, ret)
    assert.equal(10, back.step)
    assert.equal("run", back.name)
    assert.is_true(back.flag)
    assert.is_true(back.big == ffi.new("int64_t", 2 ^ 40 + 3))
    assert.same({ 4, 5, 6 }, back.list)
    assert.equal(2.5, back.nested.deeper.n)
  end)

  it("brings back DTensors with Shard and Replicate, uneven shards and several dtypes", function()
    local bad = {}
    for _, m in ipairs(meshes) do
      local cases
      if m.mesh.ndim == 1 then
        cases = { { { 7, 3 }, "f32", "S1" }, { { 3, 5 }, "f32", "S-1", "S2" }, { { 4, 4 }, "f32", "R" },
                  { { 5, 2 }, "bf16", "S1" }, { { 9 }, "f64", "S1" }, { { 1, 6 }, "f32", "S1" } }
      else
        cases = { { { 7, 5 }, "f32", "S1 S2" }, { { 6, 3 }, "f32", "R S1" }, { { 9, 2 }, "f32", "S1 S1" },
                  { { 3, 3 }, "bf16", "S2 R" } }
      end
      local sd, want, back = {}, {}, {}
      for i, cse in ipairs(cases) do
        local f = H.randn(10 + i, cse[1]):to(cse[2])
        want[i] = f
        sd["t" .. i] = dist.distribute_tensor(f, m.mesh, H.pl(cse[3]))
        back["t" .. i] = zeros_like_layout(cse[1], cse[2], m.mesh, H.pl(cse[3]))
      end
      local dir = dir_of("dt-" .. m.mesh.ndim)
      ck.save(sd, dir)
      ck.load(back, dir)
      for i, cse in ipairs(cases) do
        H.check_dt(bad, m.name .. " " .. cse[3] .. " " .. cse[2], back["t" .. i], want[i], 0, H.pl(cse[4] or cse[3]))
      end
    end
    assert.same({}, bad)
  end)

  it("writes replicated data once, and the same bytes every time", function()
    local f1, f2 = H.randn(21, 7, 3), H.randn(22, 4, 4)
    local sd = { s = dist.distribute_tensor(f1, world, { Shard(1) }),
                 r = dist.distribute_tensor(f2, world, { Replicate() }), p = H.randn(23, 2, 2) }
    ck.save(sd, dir_of("dedup-a"))
    ck.save(sd, dir_of("dedup-b"))
    local m = loom.load(dir_of("dedup-a") .. "/manifest.loom")
    local by = {}
    for _, t in ipairs(m.tensors) do by[t.name] = t end
    -- one copy of each replicated tensor (by rank 0), one shard per non-empty block
    assert.equal(1, #by.r.shards)
    assert.equal(1, by.r.shards[1].file)
    assert.equal(1, #by.p.shards)
    assert.equal(math.min(ws, 4), #by.s.shards)   -- 7 rows: chunks of ceil(7/ws), all non-empty up to 4
    assert.same({ "Shard(dim=1)" }, by.s.placements)
    assert.same({ ws }, by.s.mesh_shape)
    assert.same({ 7, 3 }, by.s.shape)
    assert.equal("f32", by.s.dtype)
    local total = 0
    for _, fe in ipairs(m.files) do total = total + fe.size end
    assert.equal((7 * 3 + 4 * 4 + 2 * 2) * 4, total)
    assert.equal(ws, #m.files)
    -- deterministic: every rank's file and the manifest are byte-identical across saves
    local mine = string.format("/rank%05d.shards", me)
    assert.is_true(read(dir_of("dedup-a") .. mine) == read(dir_of("dedup-b") .. mine))
    assert.is_true(read(dir_of("dedup-a") .. "/manifest.loom") == read(dir_of("dedup-b") .. "/manifest.loom"))
    assert.is_true(ck.verify(dir_of("dedup-a")))
  end)

  it("reduces Partial DTensors before saving them", function()
    local p = dist.from_local(loom.full({ 2, 3 }, me + 1), world, { Partial() })
    ck.save({ p = p }, dir_of("partial"))
    local back = { p = loom.zeros(2, 3) }
    ck.load(back, dir_of("partial"))
    local bad = H.check({}, "Partial(sum)", back.p, loom.full({ 2, 3 }, ws * (ws + 1) / 2))
    assert.same({}, bad)
    assert.error_matches(function() ck.load({ p = dist.from_local(loom.zeros(2, 3), world, { Partial() }) },
                                            dir_of("partial")) end, "Partial")
  end)
end)

describe("dist.checkpoint's exchanges between ranks", function()
  -- the save plan and manifest read every rank's records through what
  -- gather_i64 returns; it read them through a bare pointer into a tensor
  -- the collector could free (a use after free under ASan, in
  -- combinations_spec): the records must survive collections and the
  -- allocations that would reuse the freed memory
  it("keep every rank's records alive while they are read", function()
    local ranks = require("loom.distributed.checkpoint.ranks")
    local t, p = ranks.i64s(3)
    for k = 0, 2 do p[k] = 1000 * me + k + 7 end
    local all = ranks.gather_i64(t)
    collectgarbage("collect")
    collectgarbage("collect")
    local litter = {}
    for k = 1, 64 do litter[k] = loom.full({ 3 * ws }, -1, { dtype = "i64" }) end
    local bad = {}
    for r = 0, ws - 1 do
      for k = 0, 2 do
        if all[3 * r + k] ~= 1000 * r + k + 7 then bad[#bad + 1] = string.format("rank %d record %d", r, k) end
      end
    end
    assert.same({}, bad)
    assert.same(ranks.gather_strings("rank " .. me .. string.rep("!", me)), (function()
      local want = {}
      for r = 0, ws - 1 do want[r + 1] = "rank " .. r .. string.rep("!", r) end
      return want
    end)())
    local _ = litter
  end)
end)

describe("dist.checkpoint resharding", function()
  it("loads a save from the world mesh at every smaller degree and as plain tensors", function()
    local A, B = H.randn(31, 11, 6), H.randn(32, 5, 9)
    ck.save({ A = dist.distribute_tensor(A, world, { Shard(1) }), B = dist.distribute_tensor(B, world, { Shard(2) }) },
            dir_of("reshard"))
    local targets = {
      { "plain (degree 1)", nil, "R", "R" },
      { "world mesh, Replicate", world, "R", "R" },
      { "world mesh, shard dims swapped", world, "S2", "S1" },
    }
    if m22 then
      targets[#targets + 1] = { "tp sub-mesh of 2", m22["tp"], "S1", "S2" }
      targets[#targets + 1] = { "dp sub-mesh of 2", m22["dp"], "S2", "S1" }
      targets[#targets + 1] = { "2x2 mesh", m22, "S2 S1", "R S1" }
    end
    local bad = {}
    for _, tg in ipairs(targets) do
      local back = { A = zeros_like_layout({ 11, 6 }, "f32", tg[2], H.pl(tg[3])),
                     B = zeros_like_layout({ 5, 9 }, "f32", tg[2], H.pl(tg[4])) }
      ck.load(back, dir_of("reshard"))
      if tg[2] then
        H.check_dt(bad, tg[1] .. ": A", back.A, A, 0, H.pl(tg[3]))
        H.check_dt(bad, tg[1] .. ": B", back.B, B, 0, H.pl(tg[4]))
      else
        H.check(bad, tg[1] .. ": A", back.A, A)
        H.check(bad, tg[1] .. ": B", back.B, B)
      end
    end
    assert.same({}, bad)
  end)

  it("saves a tensor of a sub-mesh once and loads it onto the world mesh", function()
    local mesh = m22 and m22["tp"] or world
    local A = H.randn(41, 5, 4)
    ck.save({ A = dist.distribute_tensor(A, mesh, { Shard(1) }) }, dir_of("submesh"))
    local back = { A = zeros_like_layout({ 5, 4 }, "f32", world, { Shard(2) }) }
    ck.load(back, dir_of("submesh"))
    local bad = H.check_dt({}, "A", back.A, A, 0, { Shard(2) })
    assert.same({}, bad)
    local m = loom.load(dir_of("submesh") .. "/manifest.loom")
    -- the dp replicas of the tp shards are not written twice
    assert.equal(mesh:size(), #m.tensors[1].shards)
    assert.same({ mesh:size() }, m.tensors[1].mesh_shape)
  end)
end)

describe("dist.checkpoint optimizer state", function()
  -- loss of (w, b): every element gets a different gradient
  local K = H.randn(51, 6, 4)
  local function loss_grad(w, b)
    local kw = dist.is_dtensor(w) and dist.distribute_tensor(K, w.device_mesh, w.placements) or K
    local l = (w * w * kw):sum() + (b * b * b):sum()
    l:backward()
  end
  local function steps(w, b, opt, n)
    for _ = 1, n do
      opt:zero_grad()
      loss_grad(w, b)
      opt:step()
    end
  end
  local W0, B0 = H.randn(52, 6, 4), H.randn(53, 6)

  it("resumes AdamW from a TP save at degree 1, at another sharding and on a sub-mesh", function()
    -- reference: 4 plain steps
    local rw, rb = W0:clone():requires_grad_(true), B0:clone():requires_grad_(true)
    local ropt = loom.optim.AdamW({ rw, rb }, { lr = 0.05, weight_decay = 0.1 })
    steps(rw, rb, ropt, 3)
    local ref3 = { exp_avg = ropt.state[1].exp_avg:clone(), exp_avg_sq = ropt.state[1].exp_avg_sq:clone() }
    steps(rw, rb, ropt, 1)
    -- TP: 3 steps with w sharded by rows (uneven on 4 ranks), then a save
    local w = dist.distribute_tensor(W0:clone(), world, { Shard(1) }):requires_grad_(true)
    local b = dist.distribute_tensor(B0:clone(), world, { Replicate() }):requires_grad_(true)
    local opt = loom.optim.AdamW({ w, b }, { lr = 0.05, weight_decay = 0.1 })
    steps(w, b, opt, 3)
    ck.save({ model = { w = w, b = b }, optim = ck.optim_state_dict(opt), step = 3 }, dir_of("adamw"))
    local targets = { { "plain", nil, nil }, { "world Shard(2)", world, { Shard(2) } } }
    if m22 then targets[#targets + 1] = { "tp sub-mesh Shard(1)", m22["tp"], { Shard(1) } } end
    local bad = {}
    for _, tg in ipairs(targets) do
      local w2 = zeros_like_layout({ 6, 4 }, "f32", tg[2], tg[3]):requires_grad_(true)
      local b2 = zeros_like_layout({ 6 }, "f32", tg[2], tg[2] and { Replicate() }):requires_grad_(true)
      local opt2 = loom.optim.AdamW({ w2, b2 }, { lr = 0.5 })
      local sd = { model = { w = w2, b = b2 }, optim = ck.optim_state_dict(opt2) }
      ck.load(sd, dir_of("adamw"))
      ck.load_optim_state_dict(opt2, sd.optim)
      if sd.step ~= 3 then bad[#bad + 1] = tg[1] .. ": step " .. tostring(sd.step) end
      if opt2.state[1].step ~= 3 then bad[#bad + 1] = tg[1] .. ": AdamW step " .. tostring(opt2.state[1].step) end
      if opt2.defaults.lr ~= 0.05 or opt2.defaults.weight_decay ~= 0.1 then bad[#bad + 1] = tg[1] .. ": options" end
      for _, k in ipairs { "exp_avg", "exp_avg_sq" } do
        local got = opt2.state[1][k]
        if tg[2] then got = dist.from_local(got, tg[2], tg[3], { shape = { 6, 4 } }):full_tensor() end
        H.check(bad, tg[1] .. ": " .. k, got, ref3[k])
      end
      steps(w2, b2, opt2, 1)
      H.check(bad, tg[1] .. ": w after a 4th step", full(w2:detach()), rw:detach(), 1e-6)
      H.check(bad, tg[1] .. ": b after a 4th step", full(b2:detach()), rb:detach(), 1e-6)
    end
    assert.same({}, bad)
  end)

  it("wraps the state of DTensor parameters as DTensors, bf16 master weights included", function()
    local p = dist.distribute_tensor(H.randn(61, 5, 2):to("bf16"), world, { Shard(1) })
    local opt = loom.optim.AdamW({ p })
    local sd = ck.optim_state_dict(opt)
    local s = sd.state[1]
    assert.equal(0, s.step)
    for _, k in ipairs { "exp_avg", "exp_avg_sq", "master" } do
      assert.is_true(dist.is_dtensor(s[k]), k)
      assert.same({ 5, 2 }, s[k]:size())
      assert.is_true(s[k].placements[1] == Shard(1))
      assert.equal("f32", s[k].dtype)
    end
    local bad = H.check({}, "master", s.master:full_tensor(), H.randn(61, 5, 2):to("bf16"):to("f32"))
    assert.same({}, bad)
  end)
end)

describe("dist.checkpoint atomicity", function()
  local function sd_of(v)
    return { w = dist.distribute_tensor(loom.full({ 6, 2 }, v), world, { Shard(1) }), version = v }
  end
  local function load_version(dir)
    local back = { w = dist.distribute_tensor(loom.zeros(6, 2), world, { Shard(1) }) }
    ck.load(back, dir)
    return back.version, back.w:full_tensor()
  end

  it("keeps the previous checkpoint when a save fails before the rename, on one rank or all", function()
    local dir = dir_of("atomic")
    ck.save(sd_of(1), dir)
    local results = {}
    for _, stage in ipairs { "write", "rename" } do
      ck._hook = function(s)
        if s == stage and me == ws - 1 then error("injected crash at " .. s, 0) end
      end
      local e = err_of(ck.save, sd_of(2), dir)
      ck._hook = nil
      results[#results + 1] = { stage, e, load_version(dir) }
    end
    -- a failure on every rank at the same point
    ck._hook = function(s) if s == "rename" then error("all ranks crash", 0) end end
    local e_all = err_of(ck.save, sd_of(3), dir)
    ck._hook = nil
    local v_all, w_all = load_version(dir)
    for _, r in ipairs(results) do
      assert.is_true(has(r[2], "injected crash at " .. r[1]), tostring(r[2]))
      assert.equal(1, r[3])
      assert.same({}, H.check({}, "w", r[4], loom.full({ 6, 2 }, 1)))
    end
    assert.is_true(has(e_all, "all ranks crash"), tostring(e_all))
    assert.equal(1, v_all)
    assert.same({}, H.check({}, "w", w_all, loom.full({ 6, 2 }, 1)))
    -- a save that completes replaces it and leaves nothing behind
    ck.save(sd_of(4), dir)
    local v4, w4 = load_version(dir)
    assert.equal(4, v4)
    assert.same({}, H.check({}, "w", w4, loom.full({ 6, 2 }, 4)))
    assert.is_false(exists(dir .. ".old"))
    assert.is_false(exists(dir .. ".tmp-ckpt"))
  end)

  it("replaces an empty directory but refuses one that is not a checkpoint", function()
    local empty, other = dir_of("was-empty"), dir_of("not-a-checkpoint")
    on0(function()
      os.execute("mkdir -p " .. shq(empty) .. " " .. shq(other))
      write(other .. "/precious.txt", "keep me")
    end)
    ck.save(sd_of(5), empty)
    assert.equal(5, (load_version(empty)))
    local e = err_of(ck.save, sd_of(5), other)
    assert.is_true(has(e, other, "is not a loom checkpoint"), tostring(e))
    assert.equal("keep me", read(other .. "/precious.txt"))
  end)
end)

describe("dist.checkpoint errors", function()
  local W = H.randn(71, 8, 3)
  local function fresh(name)
    local dir = dir_of(name)
    ck.save({ w = dist.distribute_tensor(W, world, { Shard(1) }), step = 1 }, dir)
    return dir
  end
  local function load_plain(dir, sd) return err_of(ck.load, sd or { w = loom.zeros(8, 3) }, dir) end

  -- s with its i-th byte changed (the middle one by default)
  local function flip(s, i)
    i = i or math.floor(#s / 2) + 1
    return s:sub(1, i - 1) .. string.char((s:byte(i) + 1) % 256) .. s:sub(i + 1)
  end
  -- a fresh checkpoint whose file rank 0 then rewrites as damage(its bytes), or removes (damage gives nil)
  local function damaged(name, file, damage)
    local dir = fresh(name)
    on0(function()
      local p = dir .. "/" .. file
      local s = damage(read(p))
      if s then write(p, s) else os.remove(p) end
    end)
    return dir
  end

  for _, c in ipairs {   -- what befell the last shard file, the checkpoint's name, the damage, what the error says
    { "a shard file is missing", "missing", function() return nil end, "cannot open" },
    { "a shard file is truncated", "truncated", function(s) return s:sub(1, math.floor(#s / 2)) end, "truncated" },
    { "a shard's bytes are corrupt", "corrupt", flip, "corrupt" },
  } do
    it("names the tensor and the file when " .. c[1], function()
      local dir = damaged(c[2], last_file(), c[3])
      local e = load_plain(dir)
      assert.is_true(has(e, "tensor w", dir .. "/" .. last_file(), c[4]), tostring(e))
    end)
  end

  it("verify names a shard file whose bytes are corrupt; a corrupt manifest fails the load", function()
    local dir = damaged("corrupt-verify", last_file(), flip)
    local v = err_of(ck.verify, dir)
    assert.is_true(has(v, dir .. "/" .. last_file(), "checksum"), tostring(v))
    -- the manifest itself is checksummed too
    local dir2 = damaged("corrupt-manifest", "manifest.loom", function(s) return flip(s, 41) end)
    local e2 = load_plain(dir2)
    assert.is_true(has(e2, dir2 .. "/manifest.loom", "corrupt"), tostring(e2))
  end)

  it("says when the directory is not a checkpoint", function()
    local e = load_plain(dir_of("nothing-here"))
    assert.is_true(has(e, dir_of("nothing-here"), "is not a checkpoint", "manifest.loom"), tostring(e))
  end)

  it("rejects a state_dict whose sizes, dtypes or paths do not match the manifest", function()
    local dir = fresh("mismatch")
    local man = dir .. "/manifest.loom"
    local e1 = load_plain(dir, { w = loom.zeros(8, 4) })
    assert.is_true(has(e1, "tensor w", "8x4", "8x3", man), tostring(e1))
    local e2 = load_plain(dir, { w = dist.distribute_tensor(loom.zeros(4, 3), world, { Shard(1) }) })
    assert.is_true(has(e2, "tensor w", "4x3", "8x3"), tostring(e2))
    local e3 = load_plain(dir, { w = loom.zeros({ 8, 3 }, { dtype = "f64" }) })
    assert.is_true(has(e3, "tensor w", "f64", "f32", man), tostring(e3))
    local e4 = load_plain(dir, { w = loom.zeros(8, 3), extra = { v = loom.zeros(2) } })
    assert.is_true(has(e4, "tensor extra.v is not in the checkpoint", man), tostring(e4))
    -- strict = false leaves what the checkpoint lacks as it was
    local sd = { w = loom.zeros(8, 3), extra = { v = loom.full({ 2 }, 7) } }
    ck.load(sd, dir, { strict = false })
    local bad = H.check({}, "w", sd.w, W)
    H.check(bad, "extra.v", sd.extra.v, loom.full({ 2 }, 7))
    assert.same({}, bad)
    assert.equal(1, sd.step)
  end)

  it("rejects values it cannot save, on every rank, before writing anything", function()
    local e = err_of(ck.save, { w = loom.zeros(2), f = { g = print } }, dir_of("bad-value"))
    assert.is_true(has(e, "f.g", "cannot checkpoint a function"), tostring(e))
    assert.is_false(exists(dir_of("bad-value")))
    assert.is_false(exists(dir_of("bad-value") .. ".tmp-ckpt"))
  end)
end)
