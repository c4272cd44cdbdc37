-- train_log_spec.lua: examples/train.lua's output: the --log file is JSON
-- lines (dkjson reads every line) with exact numbers, made with its folder;
-- progress is whole lines without a terminal, a live \r line with one.
local json = require("dkjson")
local fs = require("loom.fs")

local sys = require("support.sys")
local sh = sys.sh
-- a path whose folder does not exist yet: train.lua --log makes it
local function tmpdir() return sys.tmpdir() .. "/run" end

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
      -- the gradients' norm before clipping (--grad-clip 1, the default)
      assert.is_true(e.grad_norm > 0 and e.grad_norm < 1e3, line)
      -- keys in a fixed order: step, loss, val_loss, grad_norm, tokens_per_s
      assert.truthy(line:match('^{"step": %d+, "loss": [^,]+, ' .. (e.val_loss and '"val_loss": [^,]+, ' or "")
                               .. '"grad_norm": [^,]+, "tokens_per_s": %d+}$'), line)
    end
    fs.rm_rf(dir)
  end)

  it("creates the log's missing folders", function()
    local dir = tmpdir()
    local log = dir .. "/a/b/c/log.jsonl"
    local rc, out = sh(TINY .. " --steps 2 --eval-every 2 --eval-iters 1 --quiet --log " .. log)
    assert.equal(0, rc, out)
    assert.equal(3, #lines(log))
    -- a folder that cannot be made is an error naming it
    local f = io.open(dir .. "/file", "w")
    f:close()
    rc, out = sh(TINY .. " --steps 1 --quiet --log " .. dir .. "/file/log.jsonl")
    assert.is_not.equal(0, rc)
    assert.truthy(out:find("cannot create the directory " .. dir .. "/file", 1, true), out)
    fs.rm_rf(dir)
  end)
end)

describe("train.lua progress", function()
  local run = TINY .. " --steps 8 --eval-every 4 --eval-iters 1"

  it("without a terminal: whole lines at each eval, every --print-every steps and at the last step", function()
    local rc, out = sh(run .. " | cat")
    assert.equal(0, rc, out)
    assert.is_nil(out:find("\r", 1, true), out)
    local steps = {}
    for step in out:gmatch("\nstep (%d+)/8 |") do steps[#steps + 1] = tonumber(step) end
    assert.same({ 4, 8 }, steps)
    rc, out = sh(run .. " --print-every 3 --stop-after 7 | cat")
    assert.equal(0, rc, out)
    assert.is_nil(out:find("\r", 1, true), out)
    steps = {}
    for step in out:gmatch("\nstep (%d+)/8 |") do steps[#steps + 1] = tonumber(step) end
    assert.same({ 3, 4, 6, 7 }, steps)
    assert.truthy(out:find("\ndone: 7 steps", 1, true), out)
    -- under loomrun a rank's stdout is a pty that mpirun forwards line by line
    rc, out = sh("scripts/loomrun -n 2 --quiet-others" .. run:gsub("^luajit", "") .. " | cat")
    assert.equal(0, rc, out)
    assert.is_nil(out:find("\r", 1, true), out)
    steps = {}
    for step in out:gmatch("step (%d+)/8 |") do steps[#steps + 1] = tonumber(step) end
    assert.same({ 4, 8 }, steps)
  end)

  it("on a terminal: a live line rewritten with \\r at every step", function()
    if sh("command -v script") ~= 0 then error("the test needs util-linux's script(1)") end
    local rc, out = sh("script -qec '" .. run .. "' /dev/null")
    assert.equal(0, rc, out)
    for step = 1, 8 do
      assert.truthy(out:find("\rstep " .. step .. "/8 |", 1, true), "step " .. step .. ": " .. out)
    end
    assert.truthy(out:find("\ndone: 8 steps", 1, true), out)
  end)
end)
