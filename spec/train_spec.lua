-- train_spec.lua: training end to end. A tiny transformer learns the
-- bundled corpus (the loss falls well below its start), and
-- examples/train.lua resumed from a checkpoint logs bit-identical losses
-- to an uninterrupted run.
local loom = require("loom")
local data = loom.data
local tr = loom.models.transformer
local sys = require("support.sys")
local sh = sys.sh

local CORPUS = "examples/data/tinyshakespeare.txt"

-- the "loss" field of each JSON line, as printed (a string), by step; the
-- first line of a fresh log describes the world layout
local function losses(path)
  local out = {}
  for line in io.lines(path) do
    if line:find('"world"', 1, true) then goto continue end
    local step = tonumber(line:match('"step": (%d+)'))
    local loss = line:match('"loss": ([^,}]+)')
    assert(step and loss, "bad log line: " .. line)
    out[step] = loss
    ::continue::
  end
  return out
end

describe("training", function()
  it("a tiny transformer's loss falls well below its start in 50 AdamW steps", function()
    local text = data.read_file(CORPUS)
    local tok = data.CharTokenizer(text)
    local train_ids = data.split(tok:encode(text), 0.9)
    loom.manual_seed(1337)
    local model = tr.new({ vocab_size = tok.vocab_size, dim = 32, n_layers = 1, n_heads = 2, max_seq_len = 32 })
    local opt = loom.optim.AdamW(model:parameters(), { lr = 1e-2, betas = { 0.9, 0.95 }, weight_decay = 0.01 })
    local sampler = data.Sampler(train_ids, { batch = 16, seq = 32, seed = 1337 })
    local first, recent = nil, {}
    for step = 1, 50 do
      local x, y = sampler:next()
      local loss = loom.F.cross_entropy(model(x), y)
      opt:zero_grad()
      loss:backward()
      loom.nn.utils.clip_grad_norm_(model:parameters(), 1)
      opt:step()
      local v = loss:item()
      assert.is_true(v == v, "loss is NaN at step " .. step)
      first = first or v
      if step > 45 then recent[#recent + 1] = v end
    end
    local last = 0
    for _, v in ipairs(recent) do last = last + v / #recent end
    -- starts near log(65) = 4.17 (uniform over the vocabulary)
    assert.is_true(math.abs(first - math.log(65)) < 0.5, "initial loss " .. first)
    assert.is_true(last < 0.8 * first, string.format("loss %.4f -> %.4f", first, last))
    if os.getenv("LOOM_SPEC_VERBOSE") then print(string.format("\nloss %.4f -> %.4f", first, last)) end
  end)

  it("examples/train.lua resumed from a checkpoint logs bit-identical losses", function()
    local dir = sys.tmpdir()
    local base = "luajit examples/train.lua --steps 20 --dim 32 --layers 1 --heads 2 --seq 16 --batch 4 "
      .. "--eval-every 10 --sample 0 --quiet"
    local rc, out = sh(base .. " --log " .. dir .. "/full.jsonl")
    assert.equal(0, rc, out)
    rc, out = sh(base .. " --stop-after 10 --save " .. dir .. "/ck --log " .. dir .. "/first.jsonl")
    assert.equal(0, rc, out)
    local f = io.open(dir .. "/ck/checkpoint.loom", "rb")
    assert.is_not_nil(f, "no checkpoint was written")
    f:close()
    -- the checkpoint holds the model, optimizer, sampler, RNG, step and vocabulary
    local ck = loom.load(dir .. "/ck/checkpoint.loom")
    assert.equal(10, ck.step)
    assert.equal(65, #ck.vocab)
    assert.is_not_nil(ck.model["layers.1.attention.wq.weight"])
    assert.equal(10, ck.optim.state[1].step)
    assert.equal(10 * 4, ck.sampler.counter)
    rc, out = sh(base .. " --resume " .. dir .. "/ck --log " .. dir .. "/resumed.jsonl")
    assert.equal(0, rc, out)
    assert.truthy(out:find("resumed from " .. dir .. "/ck at step 10", 1, true), out)
    local full, first, resumed = losses(dir .. "/full.jsonl"), losses(dir .. "/first.jsonl"),
                                 losses(dir .. "/resumed.jsonl")
    for step = 1, 10 do
      assert.equal(full[step], first[step], "step " .. step)
      assert.is_nil(resumed[step])
    end
    for step = 11, 20 do
      assert.is_not_nil(resumed[step], "step " .. step .. " missing from the resumed log")
      -- printed with %.17g: equal strings are equal doubles
      assert.equal(full[step], resumed[step], "step " .. step)
    end
    assert.is_nil(first[11])
    -- the losses are full precision, and they moved
    assert.truthy(full[20]:match("%d%.%d%d%d%d%d%d%d%d%d%d"), full[20])
    assert.are_not.equal(full[11], full[20])
    sys.rmtree(dir)
  end)

  it("train.lua rejects unknown flags and a checkpoint of another corpus", function()
    local rc, out = sh("luajit examples/train.lua --nope 3")
    assert.is_not.equal(0, rc)
    assert.truthy(out:find("unknown argument --nope", 1, true), out)
    rc, out = sh("luajit examples/train.lua --help")
    assert.equal(0, rc)
    assert.truthy(out:find("--stop-after", 1, true))
    -- a checkpoint from another corpus (another vocabulary) is refused
    local dir = sys.tmpdir()
    sys.write(dir .. "/abc.txt", string.rep("abcab cba\n", 200))
    local small = " --dim 16 --layers 1 --heads 2 --seq 8 --batch 2 --sample 0 --quiet"
    rc, out = sh("luajit examples/train.lua --steps 2 --stop-after 1 --save " .. dir .. "/ck" .. small)
    assert.equal(0, rc, out)
    rc, out = sh("luajit examples/train.lua --steps 2 --resume " .. dir .. "/ck --data " .. dir .. "/abc.txt" .. small)
    assert.is_not.equal(0, rc)
    assert.truthy(out:find("vocabulary differs", 1, true), out)
    sys.rmtree(dir)
  end)
end)
