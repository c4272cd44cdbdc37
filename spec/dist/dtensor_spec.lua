-- dtensor_spec.lua: placements, shard layout, making DTensors
-- (distribute_tensor, from_local, factories), to_local / full_tensor, and
-- mixing plain tensors with DTensors. Runs on 1, 2 and 4 ranks:
--   luajit scripts/run_specs.lua spec/dist
--   scripts/loomrun -n 4 --quiet-others scripts/run_specs.lua spec/dist
-- References are full tensors drawn on every rank with the same seed; data
-- only moves, so comparisons are exact (tolerance 0) unless stated.
local loom = require("loom")
local dist = require("loom.distributed")
local H = require("support.dist")

local Shard, Replicate, Partial = dist.Shard, dist.Replicate, dist.Partial
local ws, me = H.ws, H.rank
local meshes = H.meshes()
local world = meshes[1].mesh

describe("placements", function()
  it("compare by kind, dim and reduce op", function()
    assert.is_true(Shard(1) == Shard(1))
    assert.is_false(Shard(1) == Shard(2))
    assert.is_true(Replicate() == Replicate())
    assert.is_false(Replicate() == Shard(1))
    assert.is_true(Partial() == Partial("sum"))
    assert.is_false(Partial("sum") == Partial("avg"))
    assert.is_false(Partial() == Replicate())
    assert.is_true(Shard(1):is_shard() and Shard(2):is_shard(2) and not Shard(2):is_shard(1))
    assert.is_true(Replicate():is_replicate() and Partial("max"):is_partial())
  end)

  it("print like PyTorch's", function()
    assert.equal("Shard(dim=1)", tostring(Shard(1)))
    assert.equal("Shard(dim=-1)", tostring(Shard(-1)))
    assert.equal("Replicate()", tostring(Replicate()))
    assert.equal("Partial(sum)", tostring(Partial()))
    assert.equal("Partial(avg)", tostring(Partial("avg")))
    assert.equal("Partial(max)", tostring(Partial("max")))
    assert.equal("Partial(min)", tostring(Partial("min")))
  end)

  it("reject bad dims and reduce ops", function()
    assert.error_matches(function() Shard(0) end, "Shard")
    assert.error_matches(function() Shard(1.5) end, "Shard")
    assert.error_matches(function() Partial("prod") end, "Partial")
  end)

  it("normalise negative Shard dims against the tensor", function()
    local x = H.randn(1, 4, 6, 2)
    local a = dist.distribute_tensor(x, world, { Shard(-1) })
    local b = dist.distribute_tensor(x, world, { Shard(-2) })
    local bad = {}
    if not (a.placements[1] == Shard(3)) then bad[#bad + 1] = "Shard(-1) of 3-D is " .. tostring(a.placements[1]) end
    if not (b.placements[1] == Shard(2)) then bad[#bad + 1] = "Shard(-2) of 3-D is " .. tostring(b.placements[1]) end
    H.check_dt(bad, "Shard(-1)", a, x, 0, { Shard(3) })
    H.check_dt(bad, "Shard(-2)", b, x, 0, { Shard(2) })
    assert.same({}, bad)
    assert.error_matches(function() dist.distribute_tensor(x, world, { Shard(4) }) end, "Shard")
    assert.error_matches(function() dist.distribute_tensor(x, world, { Shard(-4) }) end, "Shard")
  end)
end)

describe("shard layout", function()
  it("follows torch.chunk (n=6, k=4 gives 2, 2, 2, 0)", function()
    local want = { 2, 2, 2, 0 }
    for i = 1, 4 do assert.equal(want[i], dist.chunk_size(6, 4, i)) end
    assert.same({ 0, 2, 4, 6 }, { dist.chunk_offset(6, 4, 1), dist.chunk_offset(6, 4, 2),
                                  dist.chunk_offset(6, 4, 3), dist.chunk_offset(6, 4, 4) })
    -- 5 in 4: chunks of 2 -> 2, 2, 1, 0
    assert.same({ 2, 2, 1, 0 }, { dist.chunk_size(5, 4, 1), dist.chunk_size(5, 4, 2), dist.chunk_size(5, 4, 3),
                                  dist.chunk_size(5, 4, 4) })
  end)

  local sizes = { ws * 3, ws * 3 + 1, ws * 3 + 2 }
  if ws > 1 then sizes[#sizes + 1] = ws - 1 end
  if ws == 4 then sizes[#sizes + 1] = 6 end
  for _, m in ipairs(meshes) do
    it("local sizes and offsets on the " .. m.name .. " for sizes " .. table.concat(sizes, ", "), function()
      local bad = {}
      local specs = m.mesh.ndim == 1 and { "S1", "S2" } or { "S1 S1", "S1 S2", "S2 R", "R S1" }
      for _, n in ipairs(sizes) do
        for _, s in ipairs(specs) do
          local x = H.randn(n, n, 3)
          local d = dist.distribute_tensor(x, m.mesh, H.pl(s))
          H.check_dt(bad, string.format("%d x 3 as %s", n, s), d, x, 0)
          -- the local size of Shard(1) on a 1-D mesh is exactly torch.chunk's
          if s == "S1" then
            local want = H.chunk(n, ws, me)
            if d:to_local():size(1) ~= want then
              bad[#bad + 1] = string.format("%d rows: this rank holds %d, want %d", n, d:to_local():size(1), want)
            end
          end
        end
      end
      assert.same({}, bad)
    end)
  end

  it("visualize_sharding shows which ranks hold which rows", function()
    local n = ws * 3 + 1
    local d = dist.distribute_tensor(H.randn(3, n, 2), world, { Shard(1) })
    local text = dist.visualize_sharding(d, { quiet = true })
    local lines = { string.format("2-D of size %dx2, placements (Shard(dim=1)):", n) }
    for q = 0, ws - 1 do
      local s, o = H.chunk(n, ws, q)
      lines[#lines + 1] = string.format("  [%s, 1:2]  ranks %d", s == 0 and "empty" or (o + 1) .. ":" .. (o + s), q)
    end
    assert.equal(table.concat(lines, "\n"), text)
    local r = dist.distribute_tensor(H.randn(3, 5), world, { Replicate() })
    local ranks = {}
    for q = 0, ws - 1 do ranks[#ranks + 1] = q end
    assert.equal("1-D of size 5, placements (Replicate()):\n  [1:5]  ranks " .. table.concat(ranks, ", "),
                 dist.visualize_sharding(r, { quiet = true }))
  end)

  it("prints its global size as a loom.Size, and visualize_sharding prints once and returns nothing", function()
    local d = dist.distribute_tensor(loom.ones(8, 6), world, { Shard(1) })
    assert.equal("loom.Size{8, 6}", tostring(d:size()))
    assert.is_true(d:size() == loom.Size{ 8, 6 })
    assert.equal(8, d:size()[1])
    assert.equal(0, select("#", dist.visualize_sharding(d)))   -- a REPL has nothing to echo a second time
  end)

  if ws == 4 then
    it("visualize_sharding on a 2x2 mesh", function()
      local d = dist.distribute_tensor(H.randn(3, 4, 6), meshes[2].mesh, { Shard(1), Shard(2) })
      assert.equal(table.concat({ "2-D of size 4x6, placements (Shard(dim=1), Shard(dim=2)):",
                                  "  [1:2, 1:3]  ranks 0", "  [1:2, 4:6]  ranks 1",
                                  "  [3:4, 1:3]  ranks 2", "  [3:4, 4:6]  ranks 3" }, "\n"),
                   dist.visualize_sharding(d, { quiet = true }))
    end)
  end
end)

describe("distribute_tensor", function()
  -- every rank's data differs: rank q holds base + 100 * q
  local function mine(q) return H.randn(7, ws * 2 + 1, 3) + 100 * q end

  for _, src in ipairs { 0, 1 } do
    if src < ws then
      it("takes src_data_rank " .. src .. "'s data (a broadcast, then local slices)", function()
        local bad = {}
        for _, m in ipairs(meshes) do
          local ref = mine(m.mesh.ndim == 1 and src or (src * 2 + src)) -- rank with coordinate src on every dim
          for _, s in ipairs(m.mesh.ndim == 1 and { "S1", "R", "S2" } or { "S1 S2", "R S1", "S2 R" }) do
            local cm, d = dist.comm_mode(dist.distribute_tensor, mine(me), m.mesh, H.pl(s), { src_data_rank = src })
            H.check_dt(bad, m.name .. " " .. s, d, ref, 0)
            if cm:get_total_counts() ~= cm.counts.broadcast then bad[#bad + 1] = s .. ": " .. tostring(cm) end
          end
        end
        assert.same({}, bad)
      end)
    end
  end

  it("with src_data_rank = false slices each rank's own data with no communication", function()
    local bad = {}
    for _, m in ipairs(meshes) do
      for _, s in ipairs(m.mesh.ndim == 1 and { "S1", "R", "S2" } or { "S1 S2", "R S1" }) do
        local cm, d = dist.comm_mode(dist.distribute_tensor, mine(me), m.mesh, H.pl(s), { src_data_rank = false })
        if cm:get_total_counts() ~= 0 then bad[#bad + 1] = s .. ": " .. tostring(cm) end
        H.check(bad, m.name .. " " .. s .. " local", d:to_local(), H.slice(mine(me), m.mesh, H.pl(s)), 0)
      end
    end
    assert.same({}, bad)
  end)

  it("makes a leaf with the tensor's requires_grad", function()
    local x = H.randn(2, ws * 2, 3):requires_grad_(true)
    local d = dist.distribute_tensor(x, world, { Shard(1) })
    assert.is_true(d.requires_grad)
    assert.is_true(d.is_leaf)
    local e = dist.distribute_tensor(H.randn(2, 3), world, { Replicate() })
    assert.is_false(e.requires_grad)
  end)

  it("rejects Partial, DTensors and wrong placement counts", function()
    local x = H.randn(2, 4, 3)
    assert.error_matches(function() dist.distribute_tensor(x, world, { Partial() }) end, "Partial")
    local d = dist.distribute_tensor(x, world, { Replicate() })
    assert.error_matches(function() dist.distribute_tensor(d, world, { Replicate() }) end, "already a DTensor")
    assert.error_matches(function() dist.distribute_tensor(x, world, { Replicate(), Replicate() }) end, "placements")
  end)
end)

describe("from_local, to_local, full_tensor", function()
  it("from_local with even shards infers the global size", function()
    local full = H.randn(3, ws * 2, 5)
    local d = dist.DTensor.from_local(H.slice(full, world, { Shard(1) }), world, { Shard(1) })
    local bad = {}
    H.check_dt(bad, "from_local", d, full, 0, { Shard(1) })
    assert.same({}, bad)
  end)

  it("from_local with shape for uneven shards, and run_check", function()
    local bad = {}
    for _, n in ipairs { ws * 3 + 1, ws * 3 + 2 } do
      local full = H.randn(4, 3, n)
      local d = dist.DTensor.from_local(H.slice(full, world, { Shard(2) }), world, { Shard(2) },
                                        { shape = { 3, n }, run_check = true })
      H.check_dt(bad, "uneven " .. n, d, full, 0, { Shard(2) })
      local cm2 = dist.comm_mode(dist.DTensor.from_local, H.slice(full, world, { Shard(2) }), world, { Shard(2) },
                                 { shape = { 3, n } })
      if cm2:get_total_counts() ~= 0 then bad[#bad + 1] = "run_check=false communicated: " .. tostring(cm2) end
    end
    assert.same({}, bad)
  end)

  if ws > 1 then
    it("run_check finds ranks that disagree on the global shape", function()
      -- without shape=, rank q's 1 + q rows mean a global size of ws * (1 + q)
      local loc = H.randn(1, 1 + me, 3)
      local ok, err = pcall(dist.DTensor.from_local, loc, world, { Shard(1) }, { run_check = true })
      assert.is_false(ok)
      assert.matches("run_check", err)
      -- and without run_check nobody looks
      assert.is_true(pcall(dist.DTensor.from_local, loc, world, { Shard(1) }))
    end)

    it("from_local with a shape that does not fit the shard errors", function()
      local full = H.randn(4, 3, ws * 3 + 1)
      local loc = H.slice(full, world, { Shard(2) })
      assert.error_matches(function()
        dist.DTensor.from_local(loc, world, { Shard(2) }, { shape = { 3, ws * 3 + 5 } })
      end, "from_local")
    end)
  end

  it("to_local and full_tensor are differentiable", function()
    local full = H.randn(5, ws * 2 + 1, 3)
    local x = full:clone():requires_grad_(true)
    local loc = H.slice(full, world, { Shard(1) }):requires_grad_(true)
    local d = dist.DTensor.from_local(loc, world, { Shard(1) }, { shape = full:size() })
    local w = H.randn(6, ws * 2 + 1, 3)
    local bad = {}
    ;(d:full_tensor() * w):sum():backward()
    ;(x * w):sum():backward()
    H.check(bad, "grad through from_local + full_tensor", loc.grad, H.slice(x.grad, world, { Shard(1) }), 0)
    -- to_local: the shard's gradient flows back to the leaf DTensor
    local e = dist.distribute_tensor(full, world, { Shard(1) }):requires_grad_(true)
    local wl = H.slice(w, world, { Shard(1) })
    ;(e:to_local() * wl):sum():backward()
    H.check_dt(bad, "grad through to_local", e.grad, w, 0, { Shard(1) })
    assert.same({}, bad)
  end)

  it("from_local of Partial terms sums them; its gradient is replicated", function()
    local bad = {}
    local terms, total = {}, nil
    for q = 0, ws - 1 do
      terms[q] = H.randn(10 + q, 3, 4)
      total = total and total + terms[q] or terms[q]:clone()
    end
    local loc = terms[me]:clone():requires_grad_(true)
    local d = dist.DTensor.from_local(loc, world, { Partial() })
    H.check_dt(bad, "Partial", d, total, 1e-5, { Partial() })
    local w = H.randn(7, 3, 4)
    ;(d:full_tensor() * w):sum():backward()
    H.check(bad, "grad of a Partial term", loc.grad, w, 0)
    assert.same({}, bad)
  end)

  it("size, numel, dim and tostring are global", function()
    local d = dist.distribute_tensor(H.randn(1, ws * 2 + 1, 3), world, { Shard(1) })
    assert.same({ ws * 2 + 1, 3 }, d:size())
    assert.equal(ws * 2 + 1, d:size(1))
    assert.equal(3, d:size(-1))
    assert.equal((ws * 2 + 1) * 3, d:numel())
    assert.equal(2, d:dim())
    assert.is_true(dist.is_dtensor(d))
    assert.is_false(dist.is_dtensor(d:to_local()))
    assert.is_false(dist.is_dtensor(loom.zeros(2)))
    assert.is_true(d.device_mesh == world)
    local s = tostring(d)
    assert.truthy(s:find("Shard(dim=1)", 1, true))
    assert.truthy(s:find(string.format("size=%dx3", ws * 2 + 1), 1, true))
    assert.truthy(s:find("DeviceMesh", 1, true))
  end)
end)

describe("factories", function()
  local function n_of(size) local n = 1 for _, s in ipairs(size) do n = n * s end return n end

  for _, m in ipairs(meshes) do
    it("zeros/ones/full/empty allocate only the shard on the " .. m.name, function()
      local bad = {}
      local size = { ws * 3 + 1, 5 }
      for _, s in ipairs(m.mesh.ndim == 1 and { "S1", "R", "S2" } or { "S1 S2", "R S1", "S1 S1" }) do
        local pl = H.pl(s)
        local cm, z = dist.comm_mode(dist.zeros, size, m.mesh, pl)
        if cm:get_total_counts() ~= 0 then bad[#bad + 1] = "zeros communicated: " .. tostring(cm) end
        H.check_dt(bad, "zeros " .. s, z, loom.zeros(size), 0, pl)
        H.check_dt(bad, "ones " .. s, dist.ones(size, m.mesh, pl), loom.ones(size), 0, pl)
        H.check_dt(bad, "full " .. s, dist.full(size, 2.5, m.mesh, pl), loom.full(size, 2.5), 0, pl)
        local e = dist.empty(size, m.mesh, pl)
        local want = H.slice(loom.zeros(size), m.mesh, pl):size()
        if table.concat(e:to_local():size(), ",") ~= table.concat(want, ",") then
          bad[#bad + 1] = "empty " .. s .. ": local size " .. table.concat(e:to_local():size(), "x")
        end
      end
      assert.same({}, bad)
    end)

    it("rand/randn shards are slices of the full draw (rank 0's RNG state); the generator advances by the global numel on the " .. m.name,
       function()
      local bad = {}
      for _, size in ipairs { { ws * 3 + 2, 3 }, { 3, ws * 2, 2 } } do
        for _, s in ipairs(m.mesh.ndim == 1 and { "S1", "R", "S2" } or { "S1 S2", "R S1", "S2 R" }) do
          for _, f in ipairs { "rand", "randn" } do
            local pl = H.pl(s)
            loom.manual_seed(77)
            local full = loom[f](size)
            local after_full = loom.get_rng_state()
            local next_full = loom.rand(3)
            loom.manual_seed(77)
            local cm, d = dist.comm_mode(dist[f], size, m.mesh, pl)
            local st = loom.get_rng_state()
            local next_d = loom.rand(3)
            -- one 16-byte broadcast: rank 0's RNG state (PyTorch syncs it too), nothing else
            if ws > 1 and tostring(cm) ~= "CommMode{broadcast: 1 (16 bytes)}" or ws == 1 and cm:get_total_counts() ~= 0 then
              bad[#bad + 1] = f .. " communicated: " .. tostring(cm)
            end
            H.check(bad, f .. " " .. s .. " local", d:to_local(), H.slice(full, m.mesh, pl), 0)
            if st.offset ~= after_full.offset then
              bad[#bad + 1] = string.format("%s %s: rng offset %s, want %s (numel %d)", f, s, tostring(st.offset),
                                            tostring(after_full.offset), n_of(size))
            end
            H.check(bad, f .. " " .. s .. " next draw", next_d, next_full, 0)
            -- replicas agree, shards differ: the same on every rank
            local offs = dist.all_gather(loom.tensor({ tonumber(st.offset) }, { dtype = "f64" }), 1, world)
            if H.maxdiff(offs, loom.full({ ws }, tonumber(st.offset), { dtype = "f64" })) ~= 0 then
              bad[#bad + 1] = f .. " " .. s .. ": rng state differs across ranks"
            end
          end
        end
      end
      assert.same({}, bad)
    end)
  end

  it("requires_grad makes a leaf whose gradient has its placements", function()
    local d = dist.ones({ ws * 2, 3 }, world, { Shard(1) }, { requires_grad = true })
    assert.is_true(d.requires_grad)
    local w = H.randn(5, ws * 2, 3)
    ;(d:full_tensor() * w):sum():backward()
    local bad = {}
    H.check_dt(bad, "grad", d.grad, w, 0, { Shard(1) })
    assert.same({}, bad)
  end)
end)

describe("mixing plain tensors and DTensors", function()
  it("is an error that says so", function()
    local d = dist.distribute_tensor(H.randn(1, 4, 3), world, { Replicate() })
    local p = H.randn(2, 4, 3)
    assert.error_matches(function() return d + p end, "plain tensor")
    assert.error_matches(function() return p * d end, "plain tensor")
    assert.error_matches(function() return d:matmul(H.randn(2, 3, 2)) end, "plain tensor")
  end)

  it("0-dim tensors and numbers join as replicated", function()
    local full = H.randn(1, ws * 2, 3)
    local d = dist.distribute_tensor(full, world, { Shard(1) })
    local bad = {}
    H.check_dt(bad, "d * 2 + 1", d * 2 + 1, full * 2 + 1, 1e-6, { Shard(1) })
    H.check_dt(bad, "d * 0-dim", d * loom.tensor(3), full * 3, 1e-6, { Shard(1) })
    assert.same({}, bad)
  end)

  it("implicit_replication treats plain tensors as replicated", function()
    local bad = {}
    for _, n in ipairs { ws * 2, ws * 2 + 1 } do
      local a, b = H.randn(1, n, 3), H.randn(2, n, 3)
      local bias = H.randn(3, 3)
      local xa = dist.distribute_tensor(a, world, { Shard(1) }):requires_grad_(true)
      local pb = b:clone():requires_grad_(true)
      local y = dist.implicit_replication(function() return xa * pb + bias end)
      H.check_dt(bad, "implicit " .. n, y, a * b + bias, 1e-5, { Shard(1) })
      local w = H.randn(4, n, 3)
      ;(y:full_tensor() * w):sum():backward()
      H.check_dt(bad, "grad of the DTensor " .. n, xa.grad, b * w, 1e-5, { Shard(1) })
      -- the plain input's gradient is the full one on every rank
      H.check(bad, "grad of the plain tensor " .. n, pb.grad, a * w, 1e-5)
    end
    -- and the error is back outside
    local ok = pcall(function() return dist.distribute_tensor(H.randn(1, 4, 3), world, { Replicate() }) + H.randn(2, 4, 3) end)
    if ok then bad[#bad + 1] = "no error after implicit_replication" end
    assert.same({}, bad)
  end)
end)
