-- tp_styles_spec.lua: every parallel style's options (input_layouts,
-- output_layouts, use_local_output), SequenceParallel, PrepareModuleInput /
-- Output / InputOutput, PairwiseParallel, custom styles and tostring, each
-- against the unsharded module built on every rank from the same seed.
-- Runs on 1, 2 and 4 ranks. Tolerance: f32 rtol 1.3e-6 / atol 1e-5.
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local H = require("support.tp")
local nn, Shard, Replicate = loom.nn, dist.Shard, dist.Replicate
local mesh, ws, me = H.world_mesh(), H.ws, H.rank

local function linear_pair(i, o) return H.twins(7, nn.Linear, i, o) end

local function input(seed, ...)
  loom.manual_seed(seed)
  return loom.rand(...)
end

-- runs fn under comm_mode and asserts its collective counts: want's kinds
-- (kind -> count), and with exact no collective of any other kind; returns fn's results
local function collectives(want, exact, fn)
  local res = { dist.comm_mode(fn) }
  assert.same({}, H.check_counts({}, "collectives", res[1], want, exact))
  return unpack(res, 2)
end

-- the to_full of check_linear for an output that must be a plain (full) tensor
local function plain_output(y) assert.is_false(dist.is_dtensor(y)) return y end

-- asserts the parallel module's output (through to_full) and (with w) weight/bias
-- gradients against ref's; returns its output
local function check_linear(what, m, ref, x_par, x_full, to_full)
  local bad = {}
  local y, yr = m(x_par), ref(x_full)
  H.close(bad, what .. " output", to_full(y), yr)
  local wgt = input(99, unpack(yr:size()))
  ;(to_full(y) * wgt):sum():backward()
  ;(yr * wgt):sum():backward()
  H.compare_params(bad, what, m, ref, true)
  assert.same({}, bad)
  return y
end

describe("ColwiseParallel", function()
  it("default: replicated input, output the local column block (plain tensor)", function()
    local ref, m = linear_pair(8, 12)
    tp.parallelize_module(m, mesh, tp.ColwiseParallel{})
    local x = input(1, 4, 8)
    local gather = function(y)
      assert.is_false(dist.is_dtensor(y))
      return dist.DTensor.from_local(y, mesh, { Shard(-1) }, { shape = { 4, 12 } }):full_tensor()
    end
    check_linear("colwise default", m, ref, x, x, gather)
    assert.is_true(m.weight.placements[1] == Shard(1) and m.bias.placements[1] == Shard(1))
  end)

  it("output_layouts=Replicate(): the full output, gathered once", function()
    local ref, m = linear_pair(8, 12)
    tp.parallelize_module(m, mesh, tp.ColwiseParallel{ output_layouts = Replicate() })
    local x = input(2, 4, 8)
    collectives({ all_gather = 1 }, true, function() return m(x) end)
    check_linear("colwise replicate", m, ref, x, x, plain_output)
  end)

  it("use_local_output=false: a DTensor sharded on the last dim", function()
    local ref, m = linear_pair(8, 12)
    tp.parallelize_module(m, mesh, tp.ColwiseParallel{ use_local_output = false })
    local x = input(3, 2, 3, 8)
    local y = m(x)
    assert.is_true(dist.is_dtensor(y))
    assert.is_true(y.placements[1] == Shard(3))
    check_linear("colwise dtensor", m, ref, x, x, H.full)
  end)

  it("input_layouts=Shard(1): a batch-sharded input is gathered first", function()
    local ref, m = linear_pair(8, 12)
    tp.parallelize_module(m, mesh, tp.ColwiseParallel{ input_layouts = Shard(1), output_layouts = Replicate() })
    local x = input(4, 2 * ws, 8)
    local mine = H.chunk_of(x, 1, ws, me)
    collectives({ all_gather = 2 }, false, function() return m(mine) end)   -- the input, then the output
    check_linear("colwise Shard(1) input", m, ref, mine, x, function(y) return y end)
  end)

  it("on Embedding: shards the embedding dim", function()
    local ref, m = H.twins(8, nn.Embedding, 10, 8)
    tp.parallelize_module(m, mesh, tp.ColwiseParallel{ output_layouts = Replicate() })
    assert.is_true(m.weight.placements[1] == Shard(2))
    local ids = loom.tensor({ { 1, 10, 3 }, { 5, 5, 7 } }, { dtype = "i64" })
    check_linear("colwise embedding", m, ref, ids, ids, function(y) return y end)
  end)
end)

describe("RowwiseParallel", function()
  it("default: input sharded on the last dim, output replicated (one all_reduce), bias added once", function()
    local ref, m = linear_pair(12, 6)
    tp.parallelize_module(m, mesh, tp.RowwiseParallel{})
    assert.is_true(m.weight.placements[1] == Shard(2) and m.bias.placements[1] == Replicate())
    local x = input(5, 4, 12)
    local mine = H.chunk_of(x, 2, ws, me)
    collectives({ all_reduce = 1 }, true, function() return m(mine) end)
    check_linear("rowwise default", m, ref, mine, x, plain_output)
  end)

  it("output_layouts=Shard(1): reduce-scatter instead of all-reduce", function()
    local ref, m = linear_pair(12, 6)
    tp.parallelize_module(m, mesh, tp.RowwiseParallel{ output_layouts = Shard(1) })
    local x = input(6, 2 * ws, 12)
    local mine = H.chunk_of(x, 2, ws, me)
    local y = collectives({ reduce_scatter = 1, all_reduce = 0 }, false, function() return m(mine) end)
    assert.is_false(dist.is_dtensor(y))
    check_linear("rowwise Shard(1) output", m, ref, mine, x, function(t)
      return dist.DTensor.from_local(t, mesh, { Shard(1) }, { shape = { 2 * ws, 6 } }):full_tensor()
    end)
  end)

  it("input_layouts=Replicate(), use_local_output=false: full input sliced locally, a replicated DTensor out", function()
    local ref, m = linear_pair(12, 6)
    tp.parallelize_module(m, mesh, tp.RowwiseParallel{ input_layouts = Replicate(), use_local_output = false })
    local x = input(7, 3, 12)
    local y = m(x)
    assert.is_true(dist.is_dtensor(y) and y.placements[1] == Replicate())
    check_linear("rowwise replicated input", m, ref, x, x, H.full)
  end)

  it("on Embedding: vocab-parallel, out-of-shard ids masked, equal to the full lookup", function()
    local ref, m = H.twins(9, nn.Embedding, 10, 6)
    tp.parallelize_module(m, mesh, tp.RowwiseParallel{})
    assert.is_true(m.weight.placements[1] == Shard(1))
    -- every id of the vocabulary, each shard's ids, repeats
    local ids = loom.tensor({ { 1, 2, 3, 4, 5 }, { 6, 7, 8, 9, 10 }, { 10, 1, 10, 1, 4 } }, { dtype = "i64" })
    check_linear("rowwise embedding", m, ref, ids, ids, plain_output)
  end)
end)

describe("SequenceParallel", function()
  for _, kind in ipairs { "LayerNorm", "RMSNorm" } do
    it(kind .. ": sequence shards in and out, replicated weights with the full gradient", function()
      local ref, m = H.twins(10, nn[kind], 6)
      -- non-trivial affine parameters, the same on every rank
      loom.no_grad(function()
        for _, mod in ipairs { ref, m } do
          mod.weight:copy_(input(11, 6) + 0.5)
          if mod.bias then mod.bias:copy_(input(12, 6)) end
        end
      end)
      tp.parallelize_module(m, mesh, tp.SequenceParallel{})
      assert.is_true(m.weight.placements[1] == Replicate())
      local x = input(13, 2, 2 * ws, 6)
      local mine = H.chunk_of(x, 2, ws, me)
      local y = m(mine)
      assert.is_true(dist.is_dtensor(y) and y.placements[1] == Shard(2))
      check_linear(kind, m, ref, mine, x, H.full)
    end)
  end

  it("sequence_dim=1 and use_local_output=true: a plain local shard of dim 1", function()
    local ref, m = H.twins(10, nn.LayerNorm, 6)
    tp.parallelize_module(m, mesh, tp.SequenceParallel{ sequence_dim = 1, use_local_output = true })
    local x = input(14, 2 * ws, 3, 6)
    local y = m(H.chunk_of(x, 1, ws, me))
    assert.is_false(dist.is_dtensor(y))
    H.assert_close("local shard", y, H.chunk_of(ref(x):detach(), 1, ws, me))
  end)

  it("Dropout (eval mode): passes the sequence shard through", function()
    local m = nn.Dropout(0.5)
    tp.parallelize_module(m, mesh, tp.SequenceParallel{})
    m:eval()
    local x = input(15, 2, 2 * ws, 4)
    H.assert_close("dropout", m(H.chunk_of(x, 2, ws, me)), x, 0, 0)
  end)
end)

-- a module with two positional inputs and named ones in a trailing table
local Two = nn.Module:extend("TwoInputs")
function Two:__init() self.seen = {} end
-- (replicated DTensor inputs are read through their local copy)
local function plain(x) return dist.is_dtensor(x) and x.placements[1] == Replicate() and x:to_local() or x end
function Two:forward(a, b, kw)
  self.seen = { a = a, b = b, c = kw and kw.c }
  local out = plain(a) + plain(b)
  if kw and kw.c then out = out + plain(kw.c) end
  return out
end

describe("PrepareModuleInput / PrepareModuleOutput / PrepareModuleInputOutput", function()
  it("PrepareModuleInput: lays out positional inputs (nil entries left alone) and named ones", function()
    local m = Two()
    tp.parallelize_module(m, mesh, tp.PrepareModuleInput{
      input_layouts = { Shard(1), nil, n = 2 }, desired_input_layouts = { Replicate(), nil, n = 2 },
      input_kwarg_layouts = { c = Shard(1) }, desired_input_kwarg_layouts = { c = Replicate() } })
    local a, b, c = input(16, 2 * ws, 3), input(17, 2 * ws, 3), input(18, 2 * ws, 3)
    local out = m(H.chunk_of(a, 1, ws, me), b, { c = H.chunk_of(c, 1, ws, me) })
    assert.is_true(dist.is_dtensor(m.seen.a) and m.seen.a.placements[1] == Replicate())
    assert.is_false(dist.is_dtensor(m.seen.b))
    assert.is_true(dist.is_dtensor(m.seen.c) and m.seen.c.placements[1] == Replicate())
    H.assert_close("sum", out, a + b + c)
  end)

  it("PrepareModuleInput use_local_output=true hands plain tensors to forward", function()
    local m = Two()
    tp.parallelize_module(m, mesh, tp.PrepareModuleInput{ input_layouts = { Shard(1), Shard(1) },
      desired_input_layouts = { Replicate(), Replicate() }, use_local_output = true })
    local a, b = input(19, 2 * ws, 3), input(20, 2 * ws, 3)
    local out = m(H.chunk_of(a, 1, ws, me), H.chunk_of(b, 1, ws, me))
    assert.is_false(dist.is_dtensor(m.seen.a) or dist.is_dtensor(m.seen.b))
    H.assert_close("sum", out, a + b, 0, 0)
  end)

  it("PrepareModuleOutput: a local shard out becomes the full tensor (use_local_output default true)", function()
    local m = Two()
    tp.parallelize_module(m, mesh, tp.PrepareModuleOutput{ output_layouts = { Shard(1) },
      desired_output_layouts = { Replicate() } })
    local a, b = input(21, 2 * ws, 3), input(22, 2 * ws, 3)
    local out = m(H.chunk_of(a, 1, ws, me), H.chunk_of(b, 1, ws, me))
    assert.is_false(dist.is_dtensor(out))
    H.assert_close("gathered", out, a + b, 0, 0)
  end)

  it("PrepareModuleInputOutput: both, with use_local_output=false keeping a DTensor", function()
    local m = Two()
    tp.parallelize_module(m, mesh, tp.PrepareModuleInputOutput{
      input_layouts = { Replicate(), Replicate() }, desired_input_layouts = { Replicate(), Replicate() },
      output_layouts = { Replicate() }, desired_output_layouts = { Shard(1) }, use_local_output = false })
    local a, b = input(23, 2 * ws, 3), input(24, 2 * ws, 3)
    local out = m(a, b)
    assert.is_true(dist.is_dtensor(out) and out.placements[1] == Shard(1))
    H.assert_close("sharded out", out, a + b, 0, 0)
  end)
end)

local function MLP() return H.MLP(10, 16) end

describe("PairwiseParallel", function()
  it("Colwise on the first Linear, Rowwise on the second; replicated in and out", function()
    local ref, m = H.twins(5, MLP)
    tp.parallelize_module(m, mesh, tp.PairwiseParallel{})
    assert.is_true(m.net1.weight.placements[1] == Shard(1) and m.net2.weight.placements[1] == Shard(2))
    local x = input(25, 8, 10)
    collectives({ all_reduce = 1 }, false, function() return m(x) end)
    check_linear("pairwise", m, ref, x, x, plain_output)
  end)

  it("needs exactly two Linear children", function()
    local m = nn.Sequential(nn.Linear(4, 4))
    assert.error_matches(function() tp.parallelize_module(m, mesh, tp.PairwiseParallel{}) end,
                         "PairwiseParallel: the module must have exactly two Linear children, it has 1")
  end)
end)

describe("custom styles and tostring", function()
  it("ParallelStyle:extend makes a style whose apply gets the module, the mesh and the FQN", function()
    local Scale = tp.ParallelStyle:extend("ScaleOutput")
    function Scale:__init(o) self.factor = o.factor or 2 end
    local got = {}
    function Scale:apply(module, device_mesh, fqn)
      got.module, got.mesh, got.fqn = module, device_mesh, fqn
      local f = self.factor
      module:register_forward_hook(function(_, _, out) return out * f end)
      return module
    end
    local ref, m = H.twins(5, MLP)
    tp.parallelize_module(m, mesh, { net2 = Scale{ factor = 3 } })
    assert.equal(m.net2, got.module)
    assert.equal(mesh, got.mesh)
    assert.equal("net2", got.fqn)
    assert.equal("ScaleOutput(factor=3)", tostring(Scale{ factor = 3 }))
    local x = input(26, 2, 10)
    H.assert_close("scaled", m(x), ref(x) * 3)
    -- a style without apply says so
    local Bare = tp.ParallelStyle:extend("Bare")
    assert.error_matches(function() tp.parallelize_module(nn.Linear(2, 2), mesh, Bare{}) end,
                         "Bare: apply%(module, device_mesh%) is not implemented")
  end)

  it("tostring lists each style's settings", function()
    assert.equal("ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(dim=-1), use_local_output=true)",
                 tostring(tp.ColwiseParallel{}))
    assert.equal("ColwiseParallel(input_layouts=Shard(dim=2), output_layouts=Replicate(), use_local_output=false)",
                 tostring(tp.ColwiseParallel{ input_layouts = Shard(2), output_layouts = Replicate(), use_local_output = false }))
    assert.equal("RowwiseParallel(input_layouts=Shard(dim=-1) (Replicate() on Embedding), output_layouts=Replicate(), "
                 .. "use_local_output=true)", tostring(tp.RowwiseParallel{}))
    assert.equal("RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(dim=2), use_local_output=false)",
                 tostring(tp.RowwiseParallel{ input_layouts = Replicate(), output_layouts = Shard(2), use_local_output = false }))
    assert.equal("SequenceParallel(sequence_dim=2, use_local_output=false)", tostring(tp.SequenceParallel{}))
    assert.equal("PairwiseParallel()", tostring(tp.PairwiseParallel{}))
    assert.matches("PrepareModuleInput%(.*desired_input_layouts=%(Replicate%(%), nil%).*input_layouts=%(Shard%(dim=1%), nil%)",
                   tostring(tp.PrepareModuleInput{ input_layouts = { Shard(1), n = 2 }, desired_input_layouts = { Replicate(), n = 2 } }))
    assert.equal("PrepareModuleOutput(desired_output_layouts=(Replicate()), output_layouts=(Shard(dim=1)), use_local_output=true)",
                 tostring(tp.PrepareModuleOutput{ output_layouts = Shard(1), desired_output_layouts = Replicate() }))
    assert.matches("^PrepareModuleInputOutput%(PrepareModuleInput%(.*%), PrepareModuleOutput%(.*%)%)$",
                   tostring(tp.PrepareModuleInputOutput{ input_layouts = { Shard(1) }, desired_input_layouts = { Replicate() },
                                                         output_layouts = { Shard(1) }, desired_output_layouts = { Replicate() } }))
  end)
end)
