-- train_runs_spec.lua: examples/train.lua's runs, as torchtitan's: a folder
-- runs/<time>/ by default (config.json, the log, the loss plot,
-- checkpoints/), a line for each save, --resume taking the checkpoint's
-- model settings (and refusing others in one line), a finished run said
-- so, --config files under the flags, progress lines under loomrun.
local sys = require("support.sys")
local json = require("dkjson")

local root = (debug.getinfo(1, "S").source:match("^@(.*)spec/train_runs_spec%.lua$") or "./")
if root == "" then root = "./" end
root = io.popen("cd " .. root .. " && pwd"):read("*l") .. "/"
local TINY = " --steps 4 --eval-every 2 --eval-iters 1 --dim 32 --layers 1 --heads 2 --seq 16 --batch 4 --sample 0"

describe("train.lua's runs", function()
  local dir
  before_each(function() dir = sys.tmpdir() end)
  after_each(function() sys.rmtree(dir) end)
  local function train(args) return sys.sh("cd " .. dir .. " && luajit " .. root .. "examples/train.lua " .. args) end

  it("write runs/<time>/ by default, with config.json, the log, checkpoints and a line per save", function()
    local rc, out = train(TINY)
    assert.equal(0, rc, out)
    local runs = io.popen("ls " .. dir .. "/runs"):read("*a")
    local name = runs:match("^(%d%d%d%d%d%d%d%d%-%d%d%d%d%d%d)\n$")
    assert.is_not_nil(name, runs)
    local run = dir .. "/runs/" .. name
    local cfg = json.decode(sys.read(run .. "/config.json"))
    assert.equal(32, cfg.flags.dim)
    assert.equal(32, cfg.model.dim)
    assert.equal(1, cfg.world)
    local n = 0
    for _ in io.lines(run .. "/log.jsonl") do n = n + 1 end
    assert.equal(5, n)   -- the header and 4 steps
    assert.is_true(require("loom.fs").is_file(run .. "/checkpoints/checkpoint.loom"))
    assert.truthy(out:find("saved the checkpoint of step 2 in runs/" .. name .. "/checkpoints\n", 1, true), out)
    assert.truthy(out:find("saved the checkpoint of step 4 in runs/" .. name .. "/checkpoints\n", 1, true), out)
    if sys.sh("command -v gnuplot") == 0 then assert.truthy(out:find("loss curve: runs/" .. name .. "/log.png", 1, true), out) end
    -- a second run in the same second gets a folder of its own
    rc, out = train(TINY .. " --steps 2 --run-dir none")
    assert.equal(0, rc, out)
    assert.is_nil(out:find("saved", 1, true), out)
  end)

  it("--resume takes the checkpoint's model, refuses another in one line, says when the run finished", function()
    local rc, out = train(TINY .. " --stop-after 2 --run-dir r1")
    assert.equal(0, rc, out)
    rc, out = train("--resume r1/checkpoints --dim 64 --layers 2 --sample 0")
    assert.equal(2, rc, out)
    assert.equal("train.lua: error: --resume r1/checkpoints has another model: --dim 64 (the checkpoint's: 32), "
                 .. "--layers 2 (the checkpoint's: 1); leave these flags out to use the checkpoint's\n", out)
    rc, out = train("--resume r1/checkpoints --sample 0 --eval-iters 1 --batch 4")   -- dim, layers, steps from it
    assert.equal(0, rc, out)
    assert.truthy(out:find("resumed from r1/checkpoints at step 2", 1, true), out)
    assert.truthy(out:find("model: 1 layers, dim 32, 2 heads", 1, true), out)
    assert.truthy(out:find("step 4/4", 1, true), out)
    rc, out = train("--resume r1/checkpoints --sample 0")
    assert.equal(0, rc, out)
    assert.equal("the run in r1/checkpoints finished: step 4 of 4; nothing to train (pass --steps N > 4 to go on)\n", out)
  end)

  it("--resume takes the training settings too: the resumed run has the uninterrupted run's losses", function()
    local flags = " --steps 6 --eval-every 3 --eval-iters 1 --dim 32 --layers 1 --heads 2 --seq 16 --sample 0"
                  .. " --run-dir none --batch 6 --lr 1e-2 --warmup 2 --seed 7 --grad-clip 0.5"
    local rc, out = train(flags .. " --log full.jsonl")
    assert.equal(0, rc, out)
    rc, out = train(flags .. " --stop-after 3 --save ck")
    assert.equal(0, rc, out)
    rc, out = train("--resume ck --run-dir none --sample 0 --log resumed.jsonl")   -- nothing repeated
    assert.equal(0, rc, out)
    local function losses(f)
      local t = {}
      for line in io.lines(dir .. "/" .. f) do
        local e = json.decode(line)
        if e.loss then t[e.step] = e.loss end
      end
      return t
    end
    local full, resumed = losses("full.jsonl"), losses("resumed.jsonl")
    for step = 4, 6 do
      assert.is_not_nil(resumed[step], "step " .. step)
      assert.equal(full[step], resumed[step], "step " .. step)   -- one process, same order: bit for bit
    end
  end)

  it("--config FILE sets flags, the command line overrides it, unknown names are refused", function()
    sys.write(dir .. "/c.lua", 'return { steps = 3, dim = 32, layers = 1, heads = 2, seq = 16, batch = 4, '
                               .. 'eval_every = 3, ["eval-iters"] = 1, sample = 0 }\n')
    local rc, out = train("--config c.lua --steps 2 --run-dir none")
    assert.equal(0, rc, out)
    assert.truthy(out:find("model: 1 layers, dim 32, 2 heads", 1, true), out)
    assert.truthy(out:find("done: 2 steps", 1, true), out)
    sys.write(dir .. "/bad.lua", "return { stepz = 3 }\n")
    rc, out = train("--config bad.lua")
    assert.equal(2, rc, out)
    assert.equal("train.lua: error: --config: bad.lua: no flag --stepz (see --help)\n", out)
    sys.write(dir .. "/loop.lua", "while true do end\n")
    rc, out = train("--config loop.lua")
    assert.equal(2, rc, out)
    assert.truthy(out:find("runs too long", 1, true), out)
  end)

  it("prints progress lines under loomrun between evals", function()
    local rc, out = sys.sh("cd " .. dir .. " && " .. root .. "scripts/loomrun -n 2 --quiet-others --timeout 120 "
                           .. root .. "examples/train.lua" .. TINY .. " --steps 6 --eval-every 6 --run-dir none "
                           .. "--progress-every-s 0.000001")
    assert.equal(0, rc, out)
    local steps = {}
    for step in out:gmatch("step (%d+)/6 |") do steps[#steps + 1] = tonumber(step) end
    assert.same({ 1, 2, 3, 4, 5, 6 }, steps)
  end)
end)
