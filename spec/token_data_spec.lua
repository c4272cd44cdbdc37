-- token_data_spec.lua: token files (nanoGPT's train.bin layout) through a
-- memory map: ids as written, batches as slices of the file (+1), each DP
-- rank its own rows of the global batch, reproducible from the seed, a
-- sparse 1 GiB file sampled without reading it; scripts/text_to_bin.lua
-- against the tokenizer; examples/train.lua fine-tuning an HF checkpoint on
-- a .bin corpus (--data --tokenizer --init-from).
local loom = require("loom")
local ffi = require("ffi")
local data = loom.data
local sys = require("support.sys")
local errmsg = require("support.ref").errmsg
local tmpdir, read, write = sys.tmpdir, sys.read, sys.write

local TOK = "spec/fixtures/tokenizers/gpt2.json"

local function write_ids(path, ids, ctype)
  local buf = ffi.new(ctype .. "[?]", #ids)
  for i, v in ipairs(ids) do buf[i - 1] = v end
  write(path, ffi.string(buf, ffi.sizeof(buf)))
end

describe("TokenFile", function()
  it("reads uint16 and uint32 ids through the map, 1-based", function()
    local d = tmpdir()
    local ids = {}
    for i = 1, 1000 do ids[i] = (i * 7919) % 65536 end
    write_ids(d .. "/a.bin", ids, "uint16_t")
    local f = data.TokenFile(d .. "/a.bin")
    assert.equal(1000, f:numel())
    for i = 1, 1000, 37 do assert.equal(ids[i] + 1, f:get(i)) end
    for i = 1, 1000 do ids[i] = ids[i] * 70000 % 2 ^ 32 end
    write_ids(d .. "/b.bin", ids, "uint32_t")
    local g = data.TokenFile(d .. "/b.bin", { dtype = "uint32" })
    assert.equal(ids[999] + 1, g:get(999))
    local tr, va = g:split(0.9)
    assert.equal(900, tr:numel())
    assert.equal(ids[901] + 1, va:get(1))
  end)

  it("gives batches that are slices of the file; DP ranks split the global batch; the seed reproduces them", function()
    local d = tmpdir()
    local ids = {}
    for i = 1, 5000 do ids[i] = i - 1 end   -- token i holds id i (1-based): a row starting at o is o, o+1, ...
    write_ids(d .. "/r.bin", ids, "uint16_t")
    local f = data.TokenFile(d .. "/r.bin")
    local x, y = data.Sampler(f, { batch = 4, seq = 16, seed = 5 }):next()
    for _, row in ipairs(x:totable()) do
      for j = 2, 16 do assert.equal(row[1] + j - 1, row[j]) end
    end
    for r, row in ipairs(y:totable()) do assert.equal(x:totable()[r][1] + 1, row[1]) end
    -- the global batch of 4 on one rank is ranks 0 and 1's batches of 2
    local g = x:totable()
    for rank = 0, 1 do
      local s = data.Sampler(f, { batch = 2, seq = 16, seed = 5, rank = rank, world = 2 })
      local xr = s:next():totable()
      assert.same({ g[2 * rank + 1], g[2 * rank + 2] }, xr)
    end
    -- the same seed draws the same batches, and a resumed sampler the next ones
    local a, b = data.Sampler(f, { batch = 2, seq = 8, seed = 9 }), data.Sampler(f, { batch = 2, seq = 8, seed = 9 })
    a:next()
    local want = a:next():totable()
    b:set_state({ counter = 2, seed = 9 })
    assert.same(want, b:next():totable())
    -- and they are the rows an i64 tensor of the same ids gives
    local t = loom.arange(1, 5001, 1, { dtype = "i64" })
    assert.same(x:totable(), data.Sampler(t, { batch = 4, seq = 16, seed = 5 }):next():totable())
  end)

  it("samples a sparse 1 GiB file without reading it", function()
    local d = tmpdir()
    local f = assert(io.open(d .. "/big.bin", "wb"))
    f:seek("set", 2 ^ 30 - 2)
    f:write("\1\0")
    f:close()
    local tf = data.TokenFile(d .. "/big.bin")
    assert.equal(2 ^ 29, tf:numel())
    assert.equal(2, tf:get(2 ^ 29))
    local x = data.Sampler(tf, { batch = 8, seq = 64, seed = 1 }):next()
    assert.same({ 8, 64 }, x:size())
    assert.equal(8 * 64, x:sum():item())   -- the holes read as id 0 (loom's 1)
  end)

  it("refuses truncated, empty and missing files and bad arguments", function()
    local d = tmpdir()
    write(d .. "/odd.bin", "\1\0\2")
    assert.truthy(errmsg(data.TokenFile, d .. "/odd.bin"):find("not a whole number of uint16 ids", 1, true))
    assert.truthy(errmsg(data.TokenFile, d .. "/odd.bin", { dtype = "uint32" }):find("uint32", 1, true))
    write(d .. "/empty.bin", "")
    assert.truthy(errmsg(data.TokenFile, d .. "/empty.bin"):find("is empty", 1, true))
    assert.truthy(errmsg(data.TokenFile, d .. "/none.bin"):find("cannot open", 1, true))
    assert.truthy(errmsg(data.TokenFile, d .. "/odd.bin", { dtype = "int8" }):find('dtype', 1, true))
    write(d .. "/tiny.bin", "\1\0\2\0")
    assert.truthy(errmsg(data.Sampler, data.TokenFile(d .. "/tiny.bin"), { seq = 8 }):find("too few", 1, true))
  end)
end)

-- a scratch directory holding in.txt, the first n bytes of the Shakespeare corpus; and that text
local function corpus_dir(n)
  local d, text = tmpdir(), read("examples/data/tinyshakespeare.txt"):sub(1, n)
  write(d .. "/in.txt", text)
  return d, text
end

describe("scripts/text_to_bin.lua", function()
  it("writes train.bin and val.bin that decode back to the text", function()
    local d, text = corpus_dir(30000)
    local rc, out = sys.sh("luajit scripts/text_to_bin.lua --tokenizer " .. TOK .. " --input " .. d .. "/in.txt --out "
                           .. d .. " --chunk 5000")
    assert.equal(0, rc, out)
    local tok = data.Tokenizer.from_file(TOK)
    local parts = {}
    for _, name in ipairs { "train", "val" } do
      local f = data.TokenFile(d .. "/" .. name .. ".bin")
      local ids = {}
      for i = 1, f:numel() do ids[i] = f:get(i) end
      parts[#parts + 1] = tok:decode(ids)
    end
    assert.equal(text, table.concat(parts))
    local val_bytes = #parts[2]
    assert.is_true(val_bytes > 0.05 * #text and val_bytes < 0.15 * #text, "val holds " .. val_bytes .. " bytes")
  end)
end)

describe("loom.train.corpus (train.lua's --data and --tokenizer)", function()
  it("tokenizes a text file with a tokenizer.json into i64 ids, split 90/10", function()
    local d, text = corpus_dir(5000)
    local tok, train, val = require("loom.train.corpus").corpus(d .. "/in.txt", TOK)
    local ids = tok:encode(text, { add_special_tokens = false })
    assert.equal("i64", train.dtype)
    assert.equal(#ids, train:numel() + val:numel())
    assert.same({ unpack(ids, 1, 20) }, train:narrow(1, 1, 20):totable())
  end)
end)

describe("examples/train.lua on a .bin corpus", function()
  it("fine-tunes an HF checkpoint from --init-from: the first loss is the loaded model's", function()
    local d = corpus_dir(20000)
    local rc, out = sys.sh("luajit scripts/text_to_bin.lua --tokenizer " .. TOK .. " --input " .. d .. "/in.txt --out " .. d)
    assert.equal(0, rc, out)
    -- a tiny Llama over the tokenizer's 704 ids, saved in the HF layout
    loom.manual_seed(3)
    local hf = loom.models.hf
    local model = loom.models.transformer.new({ vocab_size = 704, dim = 32, n_layers = 1, n_heads = 2, max_seq_len = 64 })
    hf.save_pretrained(model, d .. "/ckpt")
    local tok, train = require("loom.train.corpus").corpus(d .. "/train.bin", TOK)
    local x, y = data.Sampler(train, { batch = 2, seq = 16, seed = 1337 }):next()
    local loaded = hf.from_pretrained(d .. "/ckpt", { config = { max_seq_len = 16 } })
    local want = loom.no_grad(function() return loom.F.cross_entropy(loaded(x), y):item() end)
    sys.fine_tunes("--data " .. d .. "/train.bin --tokenizer " .. TOK .. " --init-from " .. d .. "/ckpt"
                   .. " --steps 3 --batch 2 --seq 16 --eval-every 3 --eval-iters 1 --sample 5 --quiet", want, d,
                   { "---- sample ----" })   -- 2 ranks: TP 2
    assert.equal(704, tok.vocab_size)
    rc, out = sys.sh("luajit examples/train.lua --data " .. d .. "/train.bin --steps 1 --quiet")
    assert.is_not.equal(0, rc)
    assert.truthy(out:find("pass the tokenizer", 1, true), out)
  end)
end)
