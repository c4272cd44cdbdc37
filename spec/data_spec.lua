-- data_spec.lua: loom.data, the char-level tokenizer, the seeded batch
-- sampler and the 90/10 split, checked against the raw ids.
local loom = require("loom")
local data = loom.data

local errmsg = require("support.ref").errmsg

-- ids 1..n as an i64 tensor: a batch row starting at offset o is o+1, o+2, ...
local function ramp(n) return loom.arange(1, n + 1, 1, { dtype = "i64" }) end

describe("CharTokenizer", function()
  local text = "hello world\nhow low\n"
  it("has a sorted vocabulary with 1-based ids", function()
    local tok = data.CharTokenizer(text)
    assert.equal("\n dehlorw", tok.vocab)
    assert.equal(9, tok.vocab_size)
    assert.equal(1, tok.stoi["\n"])
    assert.equal(2, tok.stoi[" "])
    assert.equal(9, tok.stoi["w"])
    assert.equal("h", tok.itos[5])
  end)

  it("encodes to i64 ids and decodes back", function()
    local tok = data.CharTokenizer(text)
    local ids = tok:encode("hello")
    assert.equal("i64", ids.dtype)
    assert.same({ 5, 4, 6, 6, 7 }, ids:totable())
    assert.equal(text, tok:decode(tok:encode(text)))
    assert.equal("low", tok:decode({ 6, 7, 9 }))
    assert.equal("ow", tok:decode(loom.tensor({ { 7, 9 } }, { dtype = "i64" })))
    assert.same({}, tok:encode(""):totable())
  end)

  it("rebuilds from a saved vocabulary and rejects unknown characters", function()
    local tok = data.CharTokenizer(text)
    local again = data.tokenizer_from_vocab(tok.vocab)
    assert.same(tok:encode(text):totable(), again:encode(text):totable())
    local e = errmsg(tok.encode, tok, "hello!")
    assert.truthy(e:find('character "!" is not in the vocabulary', 1, true), e)
    assert.truthy(errmsg(data.CharTokenizer, 42):find("text expected a string", 1, true))
  end)

  it("tokenizes the bundled corpus (65 characters, as nanoGPT's)", function()
    local corpus = data.read_file("examples/data/tinyshakespeare.txt")
    local tok = data.CharTokenizer(corpus)
    assert.equal(65, tok.vocab_size)
    local head = corpus:sub(1, 200)
    assert.equal(head, tok:decode(tok:encode(head)))
    assert.truthy(errmsg(data.read_file, "no/such/file"):find("cannot open no/such/file", 1, true))
  end)
end)

describe("Sampler", function()
  it("y is x shifted by one, rows are windows of the raw ids", function()
    local n, T = 500, 8
    local s = data.Sampler(ramp(n), { batch = 6, seq = T, seed = 5 })
    for _ = 1, 4 do
      local x, y = s:next()
      assert.same({ 6, T }, x:size())
      assert.equal("i64", x.dtype)
      local xt, yt = x:totable(), y:totable()
      for r = 1, 6 do
        local off = xt[r][1] - 1            -- ramp: the first id is the offset + 1
        assert.is_true(off >= 0 and off + T + 1 <= n)
        for t = 1, T do
          assert.equal(off + t, xt[r][t])
          assert.equal(off + t + 1, yt[r][t])
        end
      end
    end
  end)

  it("on real text, y[t] is the id that follows x[t] in the corpus", function()
    local text = data.read_file("examples/data/tinyshakespeare.txt"):sub(1, 5000)
    local tok = data.CharTokenizer(text)
    local ids = tok:encode(text)
    local x, y = data.Sampler(ids, { batch = 4, seq = 16, seed = 1 }):next()
    local xt, yt = x:totable(), y:totable()
    for r = 1, 4 do
      local xs, ys = tok:decode(xt[r]), tok:decode(yt[r])
      local at = text:find(xs .. ys:sub(-1), 1, true)
      assert.is_not_nil(at, "row " .. r .. " is not a window of the text")
      assert.equal(xs:sub(2), ys:sub(1, -2))
    end
  end)

  it("is deterministic for a seed and differs across seeds", function()
    local ids = ramp(10000)
    local a = data.Sampler(ids, { batch = 4, seq = 8, seed = 11 })
    local b = data.Sampler(ids, { batch = 4, seq = 8, seed = 11 })
    local c = data.Sampler(ids, { batch = 4, seq = 8, seed = 12 })
    for _ = 1, 3 do
      local xa, xb, xc = a:next(), b:next(), c:next()
      assert.same(xa:totable(), xb:totable())
      assert.are_not.same(xa:totable(), xc:totable())
    end
    -- sampling never moves loom's RNG
    loom.manual_seed(3)
    local before = loom.get_rng_state()
    a:next()
    local after = loom.get_rng_state()
    assert.is_true(before.offset == after.offset)
  end)

  it("its state round trip reproduces the same batches", function()
    local ids = ramp(10000)
    local a = data.Sampler(ids, { batch = 3, seq = 5, seed = 7 })
    for _ = 1, 5 do a:next() end
    local st = a:state()
    assert.equal(15, st.counter)
    local path = os.tmpname()
    loom.save(st, path)
    local b = data.Sampler(ids, { batch = 3, seq = 5, seed = 99 })
    b:set_state(loom.load(path))
    os.remove(path)
    for _ = 1, 3 do
      local xa, ya = a:next()
      local xb, yb = b:next()
      assert.same(xa:totable(), xb:totable())
      assert.same(ya:totable(), yb:totable())
    end
  end)

  it("rank slices of a world batch partition the global batch", function()
    local ids = ramp(10000)
    local world, b = 3, 2
    local global = data.Sampler(ids, { batch = b * world, seq = 4, seed = 21 })
    local ranks = {}
    for r = 0, world - 1 do ranks[r] = data.Sampler(ids, { batch = b, seq = 4, seed = 21, rank = r, world = world }) end
    for _ = 1, 3 do
      local gx, gy = global:next()
      local rows_x, rows_y = {}, {}
      for r = 0, world - 1 do
        local x, y = ranks[r]:next()
        for _, row in ipairs(x:totable()) do rows_x[#rows_x + 1] = row end
        for _, row in ipairs(y:totable()) do rows_y[#rows_y + 1] = row end
      end
      assert.same(gx:totable(), rows_x)
      assert.same(gy:totable(), rows_y)
      assert.equal(global:state().counter, ranks[0]:state().counter)
    end
  end)

  it("checks its arguments", function()
    assert.truthy(errmsg(data.Sampler, ramp(10), { seq = 16 }):find("too few for sequences of 16", 1, true))
    assert.truthy(errmsg(data.Sampler, loom.zeros(100), {}):find("ids expected a contiguous 1-D i64 CPU tensor", 1, true))
    assert.truthy(errmsg(data.Sampler, ramp(100), { seq = 4, rank = 2, world = 2 }):find("rank expected an integer in [0, world)", 1, true))
    assert.truthy(errmsg(data.Sampler, ramp(100), { seq = 4, batch = 0 }):find("batch expected a positive integer", 1, true))
  end)
end)

describe("split", function()
  it("takes the first 90% for training and the rest for validation", function()
    local train, val = data.split(ramp(1000), 0.9)
    assert.equal(900, train:numel())
    assert.equal(100, val:numel())
    assert.equal(1, train:totable()[1])
    assert.equal(900, train:totable()[900])
    assert.equal(901, val:totable()[1])
    assert.equal(1000, val:totable()[100])
    local t2, v2 = data.split(ramp(1001))   -- 90% by default, rounded down
    assert.equal(900, t2:numel())
    assert.equal(101, v2:numel())
    -- a split is a valid sampler source
    local x = data.Sampler(val, { batch = 2, seq = 8, seed = 1 }):next()
    for _, row in ipairs(x:totable()) do assert.is_true(row[1] > 900) end
  end)
end)
