-- p2p_spec.lua: point-to-point send/recv (core/comm/p2p.c) on every rank:
-- a ring over the world in each dtype, blocking and async, along a mesh
-- dim, counts in comm_mode, and the errors (shape mismatch named, bad peer,
-- bad tag, non-contiguous receiver). Values are exact (bytes move as they are).
--   scripts/loomrun -n 2 --quiet-others scripts/run_specs.lua -o plainTerminal spec/dist/p2p_spec.lua
local loom = require("loom")
local dist = require("loom.distributed")

local me, n = dist.rank(), dist.world_size()

-- a tensor only rank r makes: r*100 + 1..numel
local function of_rank(r, shape, dtype)
  return (loom.arange(6):view(shape) + (r * 100 + 1)):to(dtype)
end

describe("p2p send/recv", function()
  if n >= 2 then
    for _, dt in ipairs { "f32", "f64", "bf16", "i64", "i32" } do
      it("passes a " .. dt .. " tensor around the ring (async) exactly", function()
        local nxt, prv = (me + 1) % n, (me - 1) % n
        local out = loom.zeros({ 2, 3 }, { dtype = dt })
        local r = dist.irecv(out, prv, nil, nil, { tag = 3 })
        local s = dist.isend(of_rank(me, { 2, 3 }, dt), nxt, nil, nil, { tag = 3 })
        assert.is_nil(s:wait())
        local got = r:wait()
        assert.equal(out, got)
        assert.same(of_rank(prv, { 2, 3 }, dt):to("f64"):totable(), got:to("f64"):totable())
      end)
    end

    it("blocking send and recv between ranks 0 and 1, and a reply", function()
      local got
      if me == 0 then
        dist.send(loom.tensor({ 1.5, -2, 3 }), 1)
        got = dist.recv(loom.zeros(3), 1, nil, nil, { tag = 1 })
        assert.same({ 3, -4, 6 }, got:totable())
      elseif me == 1 then
        local x = dist.recv(loom.zeros(3), 0)
        dist.send(x * 2, 0, nil, nil, { tag = 1 })
      end
    end)

    it("sends a non-contiguous tensor as its values", function()
      local nxt, prv = (me + 1) % n, (me - 1) % n
      local out = loom.zeros(3, 2)
      local r = dist.irecv(out, prv)
      dist.isend(of_rank(me, { 2, 3 }, "f32"):t(), nxt):wait()
      r:wait()
      assert.same(of_rank(prv, { 2, 3 }, "f32"):t():totable(), out:totable())
    end)

    it("recv with no tensor makes one of the sender's dtype and shape", function()
      local prv = (me - 1) % n
      local r = dist.irecv(nil, prv, nil, nil, { tag = 7 })
      dist.isend(of_rank(me, { 3, 1, 2 }, "f64"), (me + 1) % n, nil, nil, { tag = 7 }):wait()
      local got = r:wait()
      assert.equal("f64", got.dtype)
      assert.same({ 3, 1, 2 }, got:size())
      assert.same(of_rank(prv, { 3, 1, 2 }, "f64"):totable(), got:totable())
    end)

    it("sendrecv moves one step of a ring", function()
      local got = dist.sendrecv(of_rank(me, { 6 }, "f32"), (me + 1) % n, (me - 1) % n)
      assert.same(of_rank((me - 1) % n, { 6 }, "f32"):totable(), got:totable())
    end)

    it("is counted in comm_mode as send and recv with their bytes", function()
      local cm = dist.comm_mode(function()
        dist.sendrecv(loom.zeros(4), (me + 1) % n, (me - 1) % n)
      end)
      assert.same({ send = 1, recv = 1 }, cm:get_comm_counts())
      assert.equal(16, cm.bytes.send)
      assert.equal(16, cm.bytes.recv)
    end)

    it("refuses a second receive from one peer on one tag while the first is in flight", function()
      local prv = (me - 1) % n
      local r = dist.irecv(nil, prv, nil, nil, { tag = 12 })
      local ok, err = pcall(dist.irecv, nil, prv, nil, nil, { tag = 12 })
      assert.is_false(ok)
      assert.matches("recv: a receive from rank " .. prv .. " with tag 12 is still in flight", err, 1, true)
      dist.isend(loom.ones(2), (me + 1) % n, nil, nil, { tag = 12 }):wait()
      assert.same({ 1, 1 }, r:wait():totable())
      -- done: the tag is free again
      r = dist.irecv(nil, prv, nil, nil, { tag = 12 })
      dist.isend(loom.zeros(1), (me + 1) % n, nil, nil, { tag = 12 }):wait()
      assert.same({ 0 }, r:wait():totable())
    end)

    it("fails naming both shapes when the receiver's tensor does not match", function()
      local ok, err = true, nil
      if me == 0 then dist.send(loom.zeros(2, 3), 1, nil, nil, { tag = 901 })
      elseif me == 1 then ok, err = pcall(dist.recv, loom.zeros(3, 2), 0, nil, nil, { tag = 901 }) end
      if me == 1 then
        assert.is_false(ok)
        assert.matches("rank 0 sent a f32 [2, 3] tensor (tag 901), but the receiving tensor is f32 [3, 2]",
                       err, 1, true)
      end
      dist.barrier()
    end)
  end

  if n == 4 then
    it("moves along a mesh dim, peers being coordinates on it", function()
      local mesh = dist.init_device_mesh("cpu", { 2, 2 }, { mesh_dim_names = { "pp", "tp" } })
      local c = mesh:get_local_rank("pp")
      local out = loom.zeros(2, 3)
      local r = dist.irecv(out, 1 - c, mesh, "pp", { tag = 5 })
      dist.isend(of_rank(me, { 2, 3 }, "f32"), 1 - c, mesh, "pp", { tag = 5 }):wait()
      r:wait()
      -- the pp peer of world rank me differs from it by 2 on a row-major 2x2 mesh
      assert.same(of_rank((me + 2) % 4, { 2, 3 }, "f32"):totable(), out:totable())
    end)
  end

  it("rejects a bad peer, a bad tag and a non-contiguous receiver with the argument named", function()
    local ok, err = pcall(dist.send, loom.zeros(2), me)
    assert.is_false(ok)
    assert.matches("send: expected a peer rank in [0, " .. n .. ") other than this rank", err, 1, true)
    ok, err = pcall(dist.recv, loom.zeros(2), n + 3)
    assert.is_false(ok)
    assert.matches("recv: expected a peer rank", err, 1, true)
    if n >= 2 then
      ok, err = pcall(dist.send, loom.zeros(2), (me + 1) % n, nil, nil, { tag = 40000 })
      assert.is_false(ok)
      assert.matches("expected a tag in [0, 32767], got 40000", err, 1, true)
      ok, err = pcall(dist.recv, loom.zeros(2, 3):t(), (me + 1) % n)
      assert.is_false(ok)
      assert.matches("the receiving tensor must be contiguous", err, 1, true)
    end
    ok, err = pcall(dist.send, "x", 0)
    assert.is_false(ok)
    assert.matches("send: tensor expected a tensor, got \"x\"", err, 1, true)
    ok, err = pcall(dist.recv, loom.zeros(2), 0.5)
    assert.is_false(ok)
    assert.matches("recv: src expected a rank (an integer), got 0.5", err, 1, true)
  end)
end)
