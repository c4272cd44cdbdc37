-- context_parallel_spec.lua: context parallelism
-- (loom.distributed.context_parallel) against one process, with both
-- rotate methods (allgather, and alltoall: the p2p ring): causal and full
-- attention with load-balanced sequence shards (forward and the gradients
-- of q, k, v, in f64) and a small Llama's loss, gradients and SGD step
-- (f32), on cp = world (2 or 4 ranks) and cp2 x tp2 on 4.
-- Tolerances: f64 rtol 1e-10; f32 rtol 1e-5 / atol 1e-6.
--   scripts/loomrun -n 2 --quiet-others scripts/run_specs.lua -o plainTerminal spec/dist/context_parallel_spec.lua
local loom = require("loom")
local dist = require("loom.distributed")
local cp = require("loom.distributed.context_parallel")
local tp = require("loom.parallel")
local H = require("support.tp")
local Tr = require("loom.models.transformer")
local F = loom.F

local ws = dist.world_size()
local V, B, S = 17, 2, 16

-- a small Llama (parallelize(m) first, when given) under context_parallel
-- on mesh's "cp" dim against one process: the loss and the gradients,
-- averaged over cp, equal the reference's; returns the differences
local function llama_vs_one_process(mesh, parallelize)
  local cfg = { vocab_size = V, dim = 16, n_layers = 2, n_heads = 2, max_seq_len = S }
  local ref, m = H.twins(3, Tr.new, cfg)
  if parallelize then parallelize(m) end
  loom.manual_seed(9)
  local x, y = loom.randint(1, V + 1, { B, S }), loom.randint(1, V + 1, { B, S })
  local rl = F.cross_entropy(ref(x), y)
  rl:backward()
  local part = cp.context_parallel(mesh["cp"], { buffers = { x, y, { m, "rope_cos" }, { m, "rope_sin" } },
                                                 buffer_seq_dims = { 2, 2, 1, 1 } },
    function(lx, ly)
      local l = F.cross_entropy(m(lx), ly)
      l:backward()
      return l:item()
    end)
  local bad = {}
  if m.rope_cos:size(1) ~= S then bad[1] = "rope_cos not restored to max_seq_len rows" end
  H.close_num(bad, "loss", dist.all_reduce(loom.tensor({ part }, { dtype = "f64" }), "avg", mesh, "cp"):item(),
              rl:item(), 1e-5)
  local refp = {}
  for _, kv in ipairs(ref:named_parameters()) do refp[kv[1]] = kv[2] end
  for _, kv in ipairs(m:named_parameters()) do
    local g = kv[2].grad
    g = dist.is_dtensor(g) and g:full_tensor() or g
    H.close(bad, "grad " .. kv[1], dist.all_reduce(g, "avg", mesh, "cp"), refp[kv[1]].grad, 1e-5, 1e-6)
  end
  return bad
end

describe("context parallelism", function()
  it("shards a sequence load-balanced (rank i holds chunks i and 2cp-1-i) and puts it back", function()
    local t = loom.arange(8):view(1, 8)
    assert.same({ { 0, 1, 6, 7 } }, cp.shard_seq(t, 2, 2, 0):totable())
    assert.same({ { 2, 3, 4, 5 } }, cp.shard_seq(t, 2, 2, 1):totable())
    assert.same({ 2, 3, 4, 5 }, cp.positions(8, 2, 1))
    local g = loom.cat({ cp.shard_seq(t, 2, 2, 0), cp.shard_seq(t, 2, 2, 1) }, 2)
    assert.same(t:totable(), cp.unshard_seq(g, 2, 2):totable())
    local ok, err = pcall(cp.shard_seq, loom.zeros(1, 6), 2, 2, 0)
    assert.is_false(ok)
    assert.matches("the sequence length (6) must divide by 2 x cp (4)", err, 1, true)
  end)

  if ws >= 2 then
    local mesh = dist.init_device_mesh("cpu", { ws }, { mesh_dim_names = { "cp" } })

    for _, case in ipairs { { true, "allgather" }, { false, "allgather" }, { true, "alltoall" }, { false, "alltoall" } } do
      local causal, method = case[1], case[2]
      it(string.format("attention (is_causal=%s, rotate %s): forward and q/k/v gradients equal one process (f64)",
                       tostring(causal), method), function()
        cp.set_rotate_method(method)
        loom.manual_seed(5)
        local q, k, v = loom.randn(B, 2, S, 4):to("f64"), loom.randn(B, 2, S, 4):to("f64"), loom.randn(B, 2, S, 4):to("f64")
        local w = loom.randn(B, 2, S, 4):to("f64")
        for _, t in ipairs { q, k, v } do t:requires_grad_(true) end
        local ref = F.scaled_dot_product_attention(q, k, v, { is_causal = causal })
        local want = (ref * w):sum():item()
        ;(ref * w):sum():backward()
        local gq, gk, gv = q.grad, k.grad, v.grad
        for _, t in ipairs { q, k, v } do t:zero_grad() end
        local part = cp.context_parallel(mesh, { buffers = { q, k, v, w }, buffer_seq_dims = { 3, 3, 3, 3 } },
          function(lq, lk, lv, lw)
            local l = (F.scaled_dot_product_attention(lq, lk, lv, { is_causal = causal }) * lw):sum()
            l:backward()
            return l:item()
          end)
        local got = dist.all_reduce(loom.tensor({ part }, { dtype = "f64" }), "sum"):item()
        local bad = H.close_num({}, "loss", got, want, 1e-10)
        H.close(bad, "dq", dist.all_reduce(q.grad, "sum"), gq, 1e-10, 1e-12)
        H.close(bad, "dk", dist.all_reduce(k.grad, "sum"), gk, 1e-10, 1e-12)
        H.close(bad, "dv", dist.all_reduce(v.grad, "sum"), gv, 1e-10, 1e-12)
        cp.set_rotate_method("allgather")
        assert.same({}, bad)
      end)
    end

    for _, method in ipairs { "allgather", "alltoall" } do
    it("a Llama under context_parallel (rotate " .. method .. "): the loss and gradients (averaged over cp) equal one process", function()
      cp.set_rotate_method(method)
      local bad = llama_vs_one_process(mesh)
      cp.set_rotate_method("allgather")
      assert.same({}, bad)
    end)
    end

    it("the ring (alltoall) moves keys and values by p2p only: 2 (cp - 1) sends and receives per rank", function()
      cp.set_rotate_method("alltoall")
      loom.manual_seed(5)
      local q = loom.randn(1, 1, S, 4)
      local cm = dist.comm_mode(function()
        cp.context_parallel(mesh, { buffers = { q }, buffer_seq_dims = { 3 } }, function(lq)
          return loom.no_grad(function() return F.scaled_dot_product_attention(lq, lq, lq, { is_causal = true }) end)
        end)
      end)
      cp.set_rotate_method("allgather")
      assert.same({ send = 2 * (ws - 1), recv = 2 * (ws - 1) }, cm:get_comm_counts())
    end)
  end

  if ws == 4 then
    it("cp2 x tp2 on a (cp, tp) mesh: the loss and gradients equal one process", function()
      local mesh = dist.init_device_mesh("cpu", { 2, 2 }, { mesh_dim_names = { "cp", "tp" } })
      assert.same({}, llama_vs_one_process(mesh, function(m)
        tp.parallelize_module(m, mesh["tp"], Tr.tp_plan({ tp = 2 }, m))
      end))
    end)
  end
end)
