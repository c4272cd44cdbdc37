-- train_log_spec.lua: examples/train.lua's output: the --log file is JSON
-- lines (dkjson reads every line) with exact numbers.
local json = require "dkjson"
local fs = require "loom.fs"

local function sh(cmd)
  local p = io.popen("( " .. cmd .. " ) 2>&1; echo \"@@rc=$?\"")
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("@@rc=(%d+)%s*$")), out:gsub("@@rc=%d+%s*$", "")
end

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  return d
end

local function lines(path)
  local out = {}
  for l in io.lines(path) do out[#out + 1] = l end
  return out
end

local TINY = "luajit examples/train.lua --dim 16 --layers 1 --heads 2 --seq 8 --batch 2 --sample 0"

describe("train.lua --log", function()
  it("writes JSON lines that dkjson reads, with numbers printed exactly", function()
    local dir = tmpdir()
    fs.mkdir_p(dir)
    local rc, out = sh(TINY .. " --steps 4 --eval-every 2 --eval-iters 1 --quiet --log " .. dir .. "/log.jsonl")
    assert.equal(0, rc, out)
    local ls = lines(dir .. "/log.jsonl")
    assert.equal(5, #ls)   -- the world layout, then one line per step
    local head = assert(json.decode(ls[1]))
    assert.same({ world = 1, tp = 1, dp = 1, sequence_parallel = false, loss_parallel = false, dtype = "f32" },
                { world = head.world, tp = head.tp, dp = head.dp, sequence_parallel = head.sequence_parallel,
                  loss_parallel = head.loss_parallel, dtype = head.dtype })
    for step = 1, 4 do
      local line = ls[step + 1]
      local e, _, err = json.decode(line)
      assert.is_nil(err, line)
      assert.equal(step, e.step)
      -- the printed loss is %.17g of the double: it reads back to the same double
      local text = line:match('"loss": ([^,}]+)')
      assert.equal(string.format("%.17g", e.loss), text)
      assert.equal(e.loss, tonumber(text))
      assert.is_true(e.loss > 1 and e.loss < 10, line)
      assert.equal(step % 2 == 0, e.val_loss ~= nil, line)
      assert.equal("number", type(e.tokens_per_s))
      -- keys in a fixed order: step, loss, val_loss, tokens_per_s
      assert.truthy(line:match('^{"step": %d+, "loss": [^,]+, ' .. (e.val_loss and '"val_loss": [^,]+, ' or "")
                               .. '"tokens_per_s": %d+}$'), line)
    end
    fs.rm_rf(dir)
  end)
end)
