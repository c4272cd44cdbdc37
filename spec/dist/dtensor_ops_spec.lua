-- dtensor_ops_spec.lua: ops on DTensors. Each case runs the op on full
-- plain tensors and on DTensors cut from them (every rank draws the same
-- full tensors from the same seed); the DTensor result, gathered, must equal
-- the full one, its placements those the rule promises, and every input's
-- gradient (a DTensor with the input's placements) the full gradient.
-- Each case runs on the 1-D mesh and, on 4 ranks, on the 2x2 mesh along
-- dp, along tp and along both. Tolerance 1e-4 absolute on values of order
-- 1-10 in f32 (sharded sums and matmuls add in another order).
-- LOOM_SPEC_TRACE=1 prints each case to stderr as it starts (to find a hang).
local loom = require("loom")
local dist = require("loom.distributed")
local F = loom.F
local H = require("support.dist")

local ws = H.ws
local meshes = H.meshes()
local n = ws * 2 + 1 -- an uneven size
local e = ws * 2     -- an even size

local function randn(seed, ...) return H.randn(seed, ...) end

-- one placement word per input (1-D): "S1", "R", "P" ... -> placements on
-- the mesh: on 2x2, {"R", p} along tp, {p, "R"} along dp, {p, p} along both
local function variants(mesh)
  if mesh.ndim == 1 then return { { name = "", map = function(p) return p end } } end
  return {
    { name = " along tp", map = function(p) return "R " .. p end },
    { name = " along dp", map = function(p) return p .. " R" end },
    { name = " along both", map = function(p) return p .. " " .. p end },
  }
end

-- case: {name, f, args = {{full, "S1"}, ...} (placement nil: a plain
-- argument), out = "S1" (per mesh dim), comm = {...} (1-D mesh only),
-- tol, nograd, both = false to skip the "along both" variant}
local function run_cases(cases)
  for _, m in ipairs(meshes) do
    describe("on the " .. m.name, function()
      for _, c in ipairs(cases) do
        it(c[1], function()
          local bad = {}
          for _, v in ipairs(variants(m.mesh)) do
            if not (c.both == false and v.name == " along both") then
              if os.getenv("LOOM_SPEC_TRACE") then io.stderr:write(H.rank, " ", m.name, ": ", c[1], v.name, "\n") end
              local args = {}
              for i, a in ipairs(c.args) do
                args[i] = { full = a[1], pl = a[2] and H.pl(v.map(a[2])) or nil, grad = a.grad }
              end
              local ok, err = pcall(H.op_case, bad, c[1] .. v.name, m.mesh, c[2], args, {
                tol = c.tol, nograd = c.nograd, out_pl = c.out and H.pl(v.map(c.out)) or nil,
                comm = m.mesh.ndim == 1 and c.comm or nil,
              })
              if not ok then bad[#bad + 1] = c[1] .. v.name .. ": " .. tostring(err) end
            end
          end
          assert.same({}, bad)
        end)
      end
    end)
  end
end

-- every activation (support/activations.lua: a function of loom.F that is
-- one op), with its defaults: a new one is checked here without a line
local function activation_cases()
  local cases, names = {}, {}
  for name in pairs(require("support.activations").ops()) do names[#names + 1] = name end
  table.sort(names)
  for i, name in ipairs(names) do
    cases[i] = { "F." .. name .. " of a shard stays sharded, and of a Partial sum is made whole first",
                 function(x, p) return F[name](x) + F[name](p) end,
                 args = { { randn(40 + i, n, 3), "S1" }, { randn(60 + i, n, 3), "P" } }, out = "S1",
                 comm = { all_gather = 0 } }
  end
  return cases
end

describe("activations on DTensors", function() run_cases(activation_cases()) end)

describe("pointwise ops on DTensors", function()
  run_cases {
    { "exp and tanh of a shard stay sharded", function(x) return x:exp() + x:tanh() end,
      args = { { randn(1, n, 3), "S1" } }, out = "S1", comm = { all_gather = 0, all_reduce = 0 } },
    { "relu, sigmoid and silu of Shard(2)", function(x) return x:relu() * x:sigmoid() + x:silu() end,
      args = { { randn(2, 3, n), "S2" } }, out = "S2" },
    { "hardtanh of a shard stays sharded, and of a Partial sum is made whole first",
      function(x, p) return x:hardtanh(-0.5, 0.8) + p:hardtanh() end,
      args = { { randn(13, n, 3), "S1" }, { randn(14, n, 3), "P" } }, out = "S1", comm = { all_gather = 0 } },
    { "a shard plus a shard", function(a, b) return a + b * b end,
      args = { { randn(3, n, 4), "S1" }, { randn(4, n, 4), "S1" } }, out = "S1", comm = { all_to_all = 0 } },
    { "a shard times a broadcast row (Replicate)", function(a, b) return a * b end,
      args = { { randn(5, n, 4), "S1" }, { randn(6, 4), "R" } }, out = "S1", comm = { all_gather = 0 } },
    { "a Shard(2) times a bias sharded alike (broadcasting)", function(a, b) return a * b - b end,
      args = { { randn(7, 3, n), "S2" }, { randn(8, n), "S1" } }, out = "S2", comm = { all_gather = 0 } },
    { "Replicate plus a shard slices the replicated one locally", function(a, b) return a + b end,
      args = { { randn(9, n, 3), "R" }, { randn(10, n, 3), "S1" } }, out = "S1",
      comm = { all_gather = 0, all_to_all = 0, all_reduce = 0 } },
    { "Shard(1) plus Shard(2) moves the second", function(a, b) return a + b end,
      args = { { randn(11, n, n), "S1" }, { randn(12, n, n), "S2" } }, out = "S1" },
    { "numbers and 0-dim tensors with a shard", function(a) return (a * 2 + 1) / loom.tensor(4) - 3 end,
      args = { { randn(13, n, 3), "S1" } }, out = "S1" },
    { "Partial + Partial stays Partial", function(a, b) return a + b end,
      args = { { randn(14, n, 3), "P" }, { randn(15, n, 3), "P" } }, out = "P", comm = { all_reduce = 0 } },
    { "Partial - Partial and -Partial stay Partial", function(a, b) return -(a - b) end,
      args = { { randn(16, n, 3), "P" }, { randn(17, n, 3), "P" } }, out = "P", comm = { all_reduce = 0 } },
    { "Partial * Replicate stays Partial", function(a, b) return a * b end,
      args = { { randn(18, n, 3), "P" }, { randn(19, n, 3), "R" } }, out = "P", comm = { all_reduce = 0 } },
    { "Replicate * Partial and Partial / Replicate stay Partial", function(a, b) return b * a + a / (b * b + 1) end,
      args = { { randn(20, n, 3), "P" }, { randn(21, n, 3), "R" } }, out = "P", comm = { all_reduce = 0 } },
    { "Partial * a number stays Partial", function(a) return a * 3 end,
      args = { { randn(22, n, 3), "P" } }, out = "P", comm = { all_reduce = 0 } },
    { "Partial + Replicate adds the replicated term once", function(a, b) return a + b end,
      args = { { randn(23, n, 3), "P" }, { randn(24, n, 3), "R" } }, out = "P", comm = { all_reduce = 0 } },
    { "Replicate - Partial adds the replicated term once", function(a, b) return b - a end,
      args = { { randn(25, n, 3), "P" }, { randn(26, n, 3), "R" } }, out = "P", comm = { all_reduce = 0 } },
    { "Partial + a number adds it once", function(a) return a + 1.5 end,
      args = { { randn(27, n, 3), "P" } } },
    { "Partial * Partial reduces first", function(a, b) return a * b end,
      args = { { randn(28, n, 3), "P" }, { randn(29, n, 3), "P" } }, out = "R", comm = { all_reduce = 2 } },
    { "exp(Partial) reduces first", function(a) return a:exp() end,
      args = { { randn(30, n, 3), "P" } }, out = "R", comm = { all_reduce = 1 } },
    { "Partial + Shard reduces the Partial to the shard", function(a, b) return a + b end,
      args = { { randn(31, n, 3), "P" }, { randn(32, n, 3), "S1" } } },
  }
end)

describe("matmul on DTensors", function()
  run_cases {
    { "Shard(-1) x Shard(1) gives Partial with no communication", function(a, b) return a:matmul(b) end,
      args = { { randn(40, 5, n), "S-1" }, { randn(41, n, 3), "S1" } }, out = "P",
      comm = { all_gather = 0, all_reduce = 0 } },
    { "Replicate x Shard(2) gives Shard(-1)", function(a, b) return a:matmul(b) end,
      args = { { randn(42, 5, 4), "R" }, { randn(43, 4, n), "S2" } }, out = "S2", comm = { all_gather = 0 } },
    { "Shard(1) x Replicate gives Shard(1)", function(a, b) return a:matmul(b) end,
      args = { { randn(44, n, 4), "S1" }, { randn(45, 4, 3), "R" } }, out = "S1", comm = { all_gather = 0 } },
    { "Shard(-1) x Replicate slices the weight and gives Partial", function(a, b) return a:matmul(b) end,
      args = { { randn(46, 5, n), "S2" }, { randn(47, n, 3), "R" } }, out = "P", comm = { all_gather = 0 } },
    { "Partial x Replicate stays Partial", function(a, b) return a:matmul(b) end,
      args = { { randn(48, 5, 4), "P" }, { randn(49, 4, 3), "R" } }, out = "P", comm = { all_reduce = 0 } },
    { "batch dims: (b, m, k) Shard(1) x (b, k, n) Shard(1)", function(a, b) return a:matmul(b) end,
      args = { { randn(50, n, 3, 4), "S1" }, { randn(51, n, 4, 2), "S1" } }, out = "S1", comm = { all_gather = 0 } },
    { "batch dims: (b, m, k) Shard(1) x (k, n) Replicate", function(a, b) return a:matmul(b) end,
      args = { { randn(52, n, 3, 4), "S1" }, { randn(53, 4, 2), "R" } }, out = "S1", comm = { all_gather = 0 } },
    { "(b, t, k) Shard(2) (sequence) x (k, n) Replicate", function(a, b) return a:matmul(b) end,
      args = { { randn(54, 2, n, 4), "S2" }, { randn(55, 4, 3), "R" } }, out = "S2" },
    { "Shard(1) x Shard(2): the output's rows and columns both sharded is not one placement", function(a, b)
        return a:matmul(b) end,
      args = { { randn(56, n, 4), "S1" }, { randn(57, 4, n), "S2" } }, both = false },
    { "a linear layer: x Shard(-1) @ w:t() (w Shard(2)) + b", function(x, w, b) return F.linear(x, w, b) end,
      args = { { randn(58, 3, n), "S2" }, { randn(59, 4, n), "S2" }, { randn(60, 4), "R" } }, out = "P" },
  }
end)

describe("reductions on DTensors", function()
  run_cases {
    { "sum over a sharded dim gives Partial", function(x) return x:sum(1) end,
      args = { { randn(70, n, 3), "S1" } }, out = "P", comm = { all_reduce = 0 } },
    { "sum over another dim stays sharded", function(x) return x:sum(2) end,
      args = { { randn(71, n, 3), "S1" } }, out = "S1", comm = { all_reduce = 0 } },
    { "sum over a dim before the shard shifts it", function(x) return x:sum(1) end,
      args = { { randn(72, 3, n, 2), "S2" } }, out = "S1" },
    { "sum with keepdim keeps the shard dim", function(x) return x:sum(2, true) end,
      args = { { randn(73, n, 3), "S1" } }, out = "S1" },
    { "sum of all elements gives Partial", function(x) return x:sum() end,
      args = { { randn(74, n, 3), "S1" } }, out = "P" },
    { "sum of a Partial stays Partial", function(x) return x:sum(1) end,
      args = { { randn(75, n, 3), "P" } }, out = "P", comm = { all_reduce = 0 } },
    { "mean over a sharded dim (even)", function(x) return x:mean(1) end,
      args = { { randn(76, e, 3), "S1" } } },
    { "mean over a sharded dim (uneven)", function(x) return x:mean(1) end,
      args = { { randn(77, n, 3), "S1" } } },
    { "mean over another dim stays sharded", function(x) return x:mean(2) end,
      args = { { randn(78, n, 3), "S1" } }, out = "S1" },
    { "mean of all elements", function(x) return x:mean() end, args = { { randn(79, n, 3), "S1" } } },
    { "max over a sharded dim", function(x) return (x:max(1)) end,
      args = { { randn(80, n, 3), "S1" } }, out = "R", nograd = true },
  }
end)

describe("softmax and norms on DTensors", function()
  local d = 6
  run_cases {
    { "softmax over a sharded dim redistributes", function(x) return x:softmax(2) end,
      args = { { randn(90, 3, n), "S2" } }, out = "R" },
    { "softmax over another dim stays sharded", function(x) return x:softmax(2) end,
      args = { { randn(91, n, 5), "S1" } }, out = "S1", comm = { all_gather = 0 } },
    { "log_softmax over a sharded dim redistributes", function(x) return x:log_softmax(-1) end,
      args = { { randn(92, 3, n), "S2" } }, out = "R" },
    { "log_softmax over another dim stays sharded", function(x) return x:log_softmax(-1) end,
      args = { { randn(93, n, 5), "S1" } }, out = "S1" },
    { "layer_norm over a sharded dim redistributes", function(x, w, b) return F.layer_norm(x, d, w, b) end,
      args = { { randn(94, 2, 3, d), "S3" }, { randn(95, d), "R" }, { randn(96, d), "R" } }, out = "R" },
    { "sequence-sharded layer_norm stays sharded; weight and bias gradients are whole",
      function(x, w, b) return F.layer_norm(x, d, w, b) end,
      args = { { randn(97, 2, n, d), "S2" }, { randn(98, d), "R" }, { randn(99, d), "R" } }, out = "S2",
      comm = { all_gather = 0 } },
    { "rms_norm over a sharded dim redistributes", function(x, w) return F.rms_norm(x, d, w) end,
      args = { { randn(100, 2, 3, d), "S3" }, { randn(101, d), "R" } }, out = "R" },
    { "sequence-sharded rms_norm; the weight gradient is whole", function(x, w) return F.rms_norm(x, d, w) end,
      args = { { randn(102, 2, n, d), "S2" }, { randn(103, d), "R" } }, out = "S2", comm = { all_gather = 0 } },
  }
end)

describe("shape ops on DTensors", function()
  run_cases {
    { "view keeps a shard when the sharded dim is untouched", function(x) return x:view(e, 12) end,
      args = { { randn(110, e, 3, 4), "S1" } }, out = "S1", comm = { all_gather = 0 } },
    { "reshape keeps a shard that splits evenly", function(x) return x:reshape(3, e, 2) end,
      args = { { randn(111, 3, e * 2), "S2" } }, out = "S2", comm = { all_gather = 0 } },
    { "reshape gathers a shard merged into a later dim", function(x) return x:reshape(3, n * 4) end,
      args = { { randn(112, 3, n, 4), "S3" } }, out = "R" },
    { "view gathers an uneven shard it merges", function(x) return x:view(n * 3) end,
      args = { { randn(113, n, 3), "S1" } }, out = ws > 1 and "R" or nil },
    { "transpose moves the shard dim", function(x) return x:transpose(1, 2) end,
      args = { { randn(114, n, 3), "S1" } }, out = "S2", comm = { all_gather = 0, all_to_all = 0 } },
    { "t() of a Shard(2) gives Shard(1)", function(x) return x:t():contiguous() end,
      args = { { randn(115, 3, n), "S2" } }, out = "S1", comm = { all_gather = 0 } },
    { "transpose keeps a Partial", function(x) return x:transpose(1, 2) end,
      args = { { randn(116, n, 3), "P" } }, out = "P", comm = { all_reduce = 0 } },
    { "cat of shards on another dim stays sharded", function(a, b) return loom.cat({ a, b }, 2) end,
      args = { { randn(117, n, 3), "S1" }, { randn(118, n, 2), "S1" } }, out = "S1", comm = { all_gather = 0 } },
    { "cat on the sharded dim gathers", function(a, b) return loom.cat({ a, b }, 1) end,
      args = { { randn(119, n, 3), "S1" }, { randn(120, 2, 3), "S1" } }, out = "R" },
    { "narrow on another dim stays sharded", function(x) return x:narrow(2, 2, 3) end,
      args = { { randn(121, n, 5), "S1" } }, out = "S1", comm = { all_gather = 0 } },
    { "narrow on the sharded dim gathers", function(x) return x:narrow(1, 2, n - 2) end,
      args = { { randn(122, n, 5), "S1" } }, out = "R" },
    { "unsqueeze and squeeze move the shard dim", function(x) return x:unsqueeze(1):mul(2):squeeze(1) end,
      args = { { randn(123, 3, n), "S2" } }, out = "S2", comm = { all_gather = 0 } },
  }
end)

describe("nn ops on DTensors", function()
  local V, D = ws * 3 + 1, 5
  local ids = loom.tensor({ { 1, V, 2, ws + 1 }, { V - 1, 3, 1, V } }, { dtype = "i64" })
  run_cases {
    { "embedding with a vocab-sharded weight gives Partial", function(w, i) return F.embedding(i, w) end,
      args = { { randn(130, V, D), "S1" }, { ids, "R" } }, out = "P", comm = { all_gather = 0, all_reduce = 0 },
      both = false },
    { "embedding with the vocabulary sharded on both mesh dims gathers one of them", function(w, i)
        return F.embedding(i, w) end,
      args = { { randn(140, V, D), "S1" }, { ids, "R" } } },
    { "embedding with an embedding-dim-sharded weight shards the output's last dim",
      function(w, i) return F.embedding(i, w) end,
      args = { { randn(131, V, D), "S2" }, { ids, "R" } }, out = "S3", comm = { all_gather = 0 } },
    { "embedding with replicated weight and batch-sharded ids", function(w, i) return F.embedding(i, w) end,
      args = { { randn(132, V, D), "R" }, { ids, "S1" } }, out = "S1", both = false },
    { "scaled_dot_product_attention with heads sharded", function(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, { is_causal = true }) end,
      args = { { randn(133, 2, n, 4, 3), "S2" }, { randn(134, 2, n, 4, 3), "S2" }, { randn(135, 2, n, 4, 3), "S2" } },
      out = "S2", comm = { all_gather = 0 } },
    { "cross_entropy of replicated logits", function(x, t) return F.cross_entropy(x, t) end,
      args = { { randn(136, n, 5), "R" }, { loom.tensor({ 1, 2, 3, 4, 5, 1, 2, 3, 4 }, { dtype = "i64" }):narrow(1, 1, n), "R" } },
      out = "R" },
    { "cross_entropy (sum) of row-sharded logits gives Partial", function(x, t)
        return F.cross_entropy(x, t, { reduction = "sum" }) end,
      args = { { randn(137, n, 5), "S1" }, { loom.tensor({ 5, 4, 3, 2, 1, 5, 4, 3, 2 }, { dtype = "i64" }):narrow(1, 1, n), "S1" } },
      out = "P", both = false },
    { "cross_entropy (mean) of row-sharded logits", function(x, t) return F.cross_entropy(x, t) end,
      args = { { randn(138, n, 5), "S1" }, { loom.tensor({ 2, 2, 3, 1, 5, 4, 4, 3, 1 }, { dtype = "i64" }):narrow(1, 1, n), "S1" } },
      both = false },
    { "cross_entropy (none) of row-sharded logits stays sharded", function(x, t)
        return F.cross_entropy(x, t, { reduction = "none" }) end,
      args = { { randn(139, n, 5), "S1" }, { loom.tensor({ 3, 1, 3, 1, 5, 2, 4, 2, 1 }, { dtype = "i64" }):narrow(1, 1, n), "S1" } },
      out = "S1", both = false },
  }
end)

describe("the op harness", function()
  local mesh = meshes[1].mesh
  it("reports a wrong value, placement, gradient and communication count", function()
    local x = { { full = randn(150, n, 3), pl = H.pl("S1") } }
    local wrong_value = H.op_case({}, "v", mesh, function(t) return dist.is_dtensor(t) and t * 1.01 or t end, x)
    local wrong_pl = H.op_case({}, "p", mesh, function(t) return t:exp() end, x, { out_pl = H.pl("R") })
    local wrong_comm = H.op_case({}, "c", mesh, function(t) return t:exp() end, x, { comm = { all_gather = 1 } })
    local wrong_grad_only = H.op_case({}, "g2", mesh, function(t)
      if not dist.is_dtensor(t) then return t * 2 end
      return t + (t:detach() * 1) -- same value, half the gradient
    end, x)
    assert.is_true(#wrong_value > 0)
    assert.is_true(#wrong_pl > 0)
    assert.is_true(#wrong_comm > 0)
    assert.is_true(#wrong_grad_only > 0)
  end)
end)
