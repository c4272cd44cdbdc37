-- mesh_spec.lua: dist.init and ranks, DeviceMesh (row-major layout, slicing,
-- sizes, coordinates, groups, tostring, errors) and the ambient mesh. Runs
-- on every rank under loomrun (and on one rank under plain luajit).
local loom = require("loom")
local dist = require("loom.distributed")

local k, me = dist.world_size(), dist.rank()

-- the ranks of an n x m mesh laid row-major over the world, as tolist gives them
local function row_major(n, m)
  local rows = {}
  for i = 0, n - 1 do
    rows[i + 1] = {}
    for j = 0, m - 1 do rows[i + 1][j + 1] = i * m + j end
  end
  return rows
end

describe("dist runtime", function()
  it("is idempotent and agrees with the launcher", function()
    dist.init()
    dist.init()
    assert.is_true(dist.is_initialized())
    local env = os.getenv("OMPI_COMM_WORLD_RANK")
    if env then
      assert.equal(tonumber(env), me)
      assert.equal(tonumber(os.getenv("OMPI_COMM_WORLD_SIZE")), k)
    else
      assert.equal(0, me)
      assert.equal(1, k)
    end
    dist.barrier()
  end)

  it("gives each rank cores / local ranks threads (at least 1)", function()
    local n = tonumber(os.getenv("LOOM_NUM_THREADS"))
    if n then assert.equal(n, loom.num_threads()) end
    assert.is_true(loom.num_threads() >= 1)
  end)
end)

describe("DeviceMesh", function()
  local h = k % 2 == 0 and k / 2 or nil

  it("lays a 1-D mesh over the world", function()
    local m = dist.init_device_mesh("cpu", { k })
    assert.equal(1, m.ndim)
    assert.equal(k, m:size())
    assert.equal(k, m:size(1))
    assert.equal(me, m:get_local_rank())
    assert.same({ me }, m:get_coordinate())
    assert.equal(k, m:get_group():size())
    assert.equal(me, m:get_group(1):rank())
    local ranks = {}
    for q = 0, k - 1 do ranks[q + 1] = q end
    assert.same(ranks, m:tolist())
    assert.equal("DeviceMesh('cpu', [" .. table.concat(ranks, ", ") .. "])", tostring(m))
  end)

  if h then
    it("lays a 2-D mesh row-major, like PyTorch", function()
      local m = dist.init_device_mesh("cpu", { 2, h }, { mesh_dim_names = { "dp", "tp" } })
      local a, b = math.floor(me / h), me % h
      assert.equal(2, m.ndim)
      assert.same({ "dp", "tp" }, m.mesh_dim_names)
      assert.equal(k, m:size())
      assert.equal(2, m:size("dp"))
      assert.equal(h, m:size("tp"))
      assert.equal(h, m:size(2))
      assert.equal(h, m:size(-1))
      assert.same({ a, b }, m:get_coordinate())
      assert.equal(a, m:get_local_rank("dp"))
      assert.equal(b, m:get_local_rank(2))
      local rows = row_major(2, h)
      assert.same(rows, m:tolist())
      if k == 4 then
        assert.equal("DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))", tostring(m))
      end
      -- groups: tp is my row, dp my column
      local g = m:get_group("tp")
      assert.equal(h, g:size())
      assert.equal(b, g:rank())
      assert.same(rows[a + 1], g:ranks())
      assert.same({ b, h + b }, m:get_group("dp"):ranks())
      assert.same({ b, h + b }, m:get_group(1):ranks())
      assert.equal(2, #m:get_all_groups())
    end)

    it("slices sub-meshes by name", function()
      local m = dist.init_device_mesh("cpu", { 2, h }, { mesh_dim_names = { "dp", "tp" } })
      local a, b = math.floor(me / h), me % h
      local tp = m["tp"]
      assert.equal(1, tp.ndim)
      assert.same({ "tp" }, tp.mesh_dim_names)
      assert.equal(h, tp:size())
      assert.equal(b, tp:get_local_rank())
      local row = {}
      for y = 0, h - 1 do row[y + 1] = a * h + y end
      assert.same(row, tp:tolist())
      assert.equal(m:get_group("tp"), tp:get_group()) -- the same communicator
      local dp = m["dp"]
      assert.same({ b, h + b }, dp:tolist())
      assert.equal(a, dp:get_local_rank())
      local both = m[{ "dp", "tp" }]
      assert.same(m:tolist(), both:tolist())
      assert.same(m:get_coordinate(), both:get_coordinate())
      assert.is_true(both == m)
      -- slices reuse communicators: a collective on one reaches the row
      local x = loom.tensor({ me })
      assert.same({ a * h * h + (h - 1) * h / 2 }, dist.all_reduce(x, "sum", tp):totable())
      assert.same({ 2 * b + h }, dist.all_reduce(x, "sum", dp):totable())
    end)
  end

  it("flattens every dim of a mesh into one over the world (default name: the names joined)", function()
    local m = dist.init_device_mesh("cpu", { 1, k }, { mesh_dim_names = { "a", "b" } })
    local f = m[{ "a", "b" }]:_flatten()
    assert.same({ "a_b" }, f.mesh_dim_names)
    assert.equal(k, f:size())
    assert.equal(me, f:get_local_rank())
    assert.same({ k * (k - 1) / 2 }, dist.all_reduce(loom.tensor({ me }), "sum", f):totable())
    local unnamed = dist.init_device_mesh("cpu", { k })
    local ok, e = pcall(function() return unnamed:_flatten("x") end)
    assert.is_false(ok)
    assert.matches("has no mesh_dim_names", e)
  end)

  if k % 4 == 0 then
    it("flattens dims into one (_flatten, PyTorch's dp_shard_cp) and slices by the new name", function()
      local t = k / 4
      local m = dist.init_device_mesh("cpu", { 2, 2, t }, { mesh_dim_names = { "dp", "cp", "tp" } })
      local a, c, b = math.floor(me / (2 * t)), math.floor(me / t) % 2, me % t
      local f = m[{ "dp", "cp" }]:_flatten("dp_cp")
      assert.equal(1, f.ndim)
      assert.same({ "dp_cp" }, f.mesh_dim_names)
      assert.equal(4, f:size())
      assert.equal(2 * a + c, f:get_local_rank())
      assert.same({ b, t + b, 2 * t + b, 3 * t + b }, f:tolist())
      assert.same({ b, t + b, 2 * t + b, 3 * t + b }, f:get_group():ranks())
      assert.equal(2 * a + c, f:get_group():rank())
      assert.equal(m, f:root_mesh())
      -- a collective on it reaches the 4 ranks of my tp column
      assert.same({ 4 * b + 6 * t }, dist.all_reduce(loom.tensor({ me }), "sum", f):totable())
      -- the root slices by the new name, alone or beside another dim
      assert.equal(f:get_group(), m["dp_cp"]:get_group())
      local ft = m[{ "dp_cp", "tp" }]
      assert.same({ 4, t }, ft.shape)
      assert.same({ 2 * a + c, b }, ft:get_coordinate())
      assert.same(row_major(4, t), ft:tolist())
      assert.equal(m, ft:root_mesh())
      -- the same dims again: the same mesh (default name: the names joined)
      assert.is_true(rawequal(f, m[{ "dp", "cp" }]:_flatten()))
      local function err(fn)
        local ok, e = pcall(fn)
        assert.is_false(ok)
        return e
      end
      assert.matches("dims expected in the root mesh's order", err(function() return m[{ "cp", "dp" }]:_flatten("x") end))
      assert.matches('"dp_cp" names another flattening already', err(function() return m[{ "dp", "tp" }]:_flatten("dp_cp") end))
      assert.matches('"tp" names a dim of the mesh already', err(function() return m[{ "dp", "cp" }]:_flatten("tp") end))
      assert.matches("is flattened already", err(function() return m["dp_cp"]:_flatten("again") end))
      assert.matches('named twice', err(function() return m[{ "dp_cp", "cp" }] end))
      assert.matches("mesh_dim_name expected a string", err(function() return m[{ "dp", "cp" }]:_flatten(3) end))
    end)
  end

  it("rejects bad shapes, names and device types", function()
    local function err(f, ...)
      local ok, e = pcall(f, ...)
      assert.is_false(ok)
      return e
    end
    assert.matches("holds " .. (k + 1) .. " ranks, but the world has " .. k,
      err(dist.init_device_mesh, "cpu", { k + 1 }))
    assert.matches("mesh_shape%[1%] expected a positive integer, got 0",
      err(dist.init_device_mesh, "cpu", { 0, k }))
    assert.matches("mesh_shape expected a list", err(dist.init_device_mesh, "cpu", {}))
    assert.matches('mesh_dim_names has "x" twice',
      err(dist.init_device_mesh, "cpu", { k, 1 }, { mesh_dim_names = { "x", "x" } }))
    assert.matches("mesh_dim_names expected 2 names",
      err(dist.init_device_mesh, "cpu", { k, 1 }, { mesh_dim_names = { "x" } }))
    assert.matches('device_type expected "cpu" or "cuda", got "tpu"',
      err(dist.init_device_mesh, "tpu", { k }))
    if not loom.device_available("cuda") then
      assert.matches('device_type "cuda" is not available', err(dist.init_device_mesh, "cuda", { k }))
    end
    local named = dist.init_device_mesh("cpu", { k, 1 }, { mesh_dim_names = { "dp", "tp" } })
    assert.matches('mesh has no dim named "pp"', err(function() return named["pp"] end))
    assert.matches('mesh has no dim named "pp"', err(function() return named[{ "dp", "pp" }] end))
    assert.matches("mesh dim expected a name or an integer in %[1, 2%]", err(function() return named:size(3) end))
    assert.matches("this mesh is 2%-D, pass a mesh dim", err(function() return named:get_group() end))
    local unnamed = dist.init_device_mesh("cpu", { k })
    assert.matches("no mesh_dim_names", err(function() return unnamed["tp"] end))
  end)
end)

describe("ambient mesh", function()
  local m = dist.init_device_mesh("cpu", { k }, { mesh_dim_names = { "w" } })
  local m2 = dist.init_device_mesh("cpu", { k, 1 }, { mesh_dim_names = { "a", "b" } })

  it("is set inside use(), nests, and returns fn's results", function()
    assert.is_nil(dist.current_mesh())
    local r1, r2 = m:use(function(x)
      assert.equal(m, dist.current_mesh())
      m2:use(function() assert.equal(m2, dist.current_mesh()) end)
      assert.equal(m, dist.current_mesh())
      return x + 1, "two"
    end, 1)
    assert.equal(2, r1)
    assert.equal("two", r2)
    assert.is_nil(dist.current_mesh())
  end)

  it("is restored when fn raises", function()
    local ok, e = pcall(m.use, m, function() error("inner boom") end)
    assert.is_false(ok)
    assert.matches("inner boom", e)
    assert.is_nil(dist.current_mesh())
    ok = pcall(m.use, m, function() m2:use(function() error("x") end) end)
    assert.is_false(ok)
    assert.is_nil(dist.current_mesh())
  end)

  it("is the mesh collectives use when they are given none", function()
    local x = loom.tensor({ 1 })
    local y = m2["b"]:use(function() return dist.all_reduce(x, "sum") end)
    assert.same({ 1 }, y:totable()) -- the size-1 dim: only me
    local z = m:use(function() return dist.all_reduce(x, "sum") end)
    assert.same({ k }, z:totable())
    local ok, e = pcall(m2.use, m2, function() return dist.all_reduce(x, "sum") end)
    assert.is_false(ok)
    assert.matches("this mesh is 2%-D, pass a mesh dim", e)
  end)
end)
