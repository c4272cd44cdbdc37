-- equivalence_spec.lua: the property that proves tensor parallelism right:
-- with the same seed, examples/train.lua at TP=1, TP=2 and TP=4 logs the
-- same loss at every step up to float rounding (relative 1e-5 in f32).
local sys = require("support.sys")

local flags = "--steps 20 --dim 32 --layers 2 --heads 4 --seq 16 --batch 4 --eval-every 1000 --sample 0 --quiet"
local function run(ranks, extra, log) return sys.train(ranks, flags .. " " .. extra, log) end

describe("tensor-parallel training", function()
  it("logs the same losses at TP=1, TP=2 and TP=4 (and with sequence parallel)", function()
    sys.matches_one_process(flags, 20, { { 2, "--tp 2" }, { 4, "--tp 4" }, { 2, "--tp 2 --sequence-parallel" } })
  end)

  it("resumes from a distributed checkpoint bit-identically at TP=2, and correctly at TP=4", function()
    local dir = sys.tmpdir()
    local whole = run(2, "--tp 2", dir .. "/whole.json")
    run(2, "--tp 2 --stop-after 10 --save " .. dir .. "/ck", dir .. "/first.json")
    local resumed = run(2, "--tp 2 --resume " .. dir .. "/ck", dir .. "/first.json")
    local other = run(4, "--tp 4 --resume " .. dir .. "/ck", dir .. "/tp4.json")
    for step = 11, 20 do
      assert.are.equal(whole[step], resumed[step])   -- the logged numbers print 17 digits
      assert(math.abs(other[step] - whole[step]) <= 1e-5 * math.abs(whole[step]),
             string.format("TP=4 after resume: step %d loss %.9g vs %.9g", step, other[step], whole[step]))
    end
    assert.is_nil(other[5])   -- the TP=4 run really started from the checkpoint
    sys.rmtree(dir)
  end)

  it("trains in bf16 (f32 master weights) with the same losses at TP=1 and TP=2, up to bf16 rounding", function()
    local dir = sys.tmpdir()
    local a = run(1, "--dtype bf16", dir .. "/bf1.json")
    local b = run(2, "--dtype bf16 --tp 2", dir .. "/bf2.json")
    assert.is_true(a[20] < a[1] - 0.1)   -- it learns in bf16
    for step = 1, 20 do
      assert(math.abs(a[step] - b[step]) <= 2e-2 * math.abs(a[step]),
             string.format("bf16 step %d: TP=2 loss %.6g vs TP=1 %.6g", step, b[step], a[step]))
    end
    sys.rmtree(dir)
  end)
end)
