-- pp_cp_equivalence_spec.lua: examples/train.lua with pipeline or
-- context parallelism logs the same loss at every step as one process
-- (relative 1e-5 in f32): PP=2 (1F1B), PP=2 x TP=2 (GPipe, 4
-- microbatches), CP=2, CP=2 x TP=2 (the p2p ring), CP=2 x DP=2 and CP=2 x
-- FSDP=2 (gradients averaged / sharded over the flattened dp x cp mesh),
-- PP=2 x TP=2 and CP=2 x TP=2 with sequence parallelism (stages take
-- sequence shards) and async TP (TP=2, sequence parallel), the cheap rows of
-- scripts/check_equivalence.sh (which runs 100 steps and the 8-rank
-- DP=2 x PP=2 x TP=2); and a PP=2 checkpoint resumed at one process and at
-- PP=2 x TP=2 continuing on the uninterrupted run's losses (relative 1e-5).
local sys = require("support.sys")

local flags = "--steps 20 --dim 32 --layers 3 --heads 4 --seq 16 --batch 8 --eval-every 10 --sample 0 --quiet --run-dir none"

describe("pipeline-parallel training", function()
  it("logs the same losses as one process at PP=2, PP=2 x TP=2 (uneven stages: 3 layers), CP=2, CP=2 x TP=2, CP=2 x DP=2, CP=2 x FSDP=2, PP=2 x TP=2 + SP, CP=2 x TP=2 + SP and async TP", function()
    sys.matches_one_process(flags, 20, { { 2, "--pp 2" }, { 4, "--pp 2 --tp 2 --schedule gpipe --microbatches 4" },
                                         { 2, "--cp 2" }, { 4, "--cp 2 --tp 2 --cp-rotate alltoall" },
                                         { 4, "--cp 2 --dp 2" }, { 4, "--cp 2 --dp 2 --fsdp" },
                                         { 4, "--pp 2 --tp 2 --sequence-parallel" },
                                         { 4, "--cp 2 --tp 2 --sequence-parallel" },
                                         { 2, "--tp 2 --sequence-parallel --async-tp" } })
  end)

  it("--pp 2 --save, then --resume at one process and at PP=2 x TP=2 continues on the uninterrupted run's losses", function()
    local dir = sys.tmpdir()
    local small = "--steps 8 --dim 32 --layers 3 --heads 4 --seq 16 --batch 8 --eval-every 4 --sample 0 --quiet --run-dir none"
    local ref = sys.train(2, small .. " --pp 2", dir .. "/ref.json")
    local first = sys.train(2, small .. " --pp 2 --stop-after 4 --save " .. dir .. "/ck", dir .. "/first.json")
    assert.is_true(sys.exists(dir .. "/ck/state/manifest.loom"), "no checkpoint was written")
    local resumed = {
      { 1, sys.train(1, small .. " --resume " .. dir .. "/ck", dir .. "/one.json") },
      { 4, sys.train(4, small .. " --pp 2 --tp 2 --resume " .. dir .. "/ck", dir .. "/pptp.json") } }
    local out = sys.read(dir .. "/pptp.json.out")
    assert.matches("resumed from " .. dir .. "/ck at step 4", out, 1, true)
    assert.matches("world 4 = pp 2 x dp 1 x cp 1 x tp 2", out, 1, true)
    for step = 1, 8 do assert.is_number(ref[step], "step " .. step .. " missing from the uninterrupted run") end
    for step = 1, 4 do assert.equal(ref[step], first[step], "step " .. step) end
    assert.is_nil(first[5])
    for _, r in ipairs(resumed) do
      assert.is_nil(r[2][4], "the resumed run on " .. r[1] .. " ranks logged step 4")
      for step = 5, 8 do
        local got = r[2][step]
        assert.is_number(got, "step " .. step .. " missing from the run resumed on " .. r[1] .. " ranks")
        local rel = math.abs(got - ref[step]) / math.abs(ref[step])
        assert(rel <= 1e-5, string.format("resumed on %d ranks: step %d loss %.9g vs %.9g (rel %.2e)", r[1], step,
                                          got, ref[step], rel))
      end
    end
    sys.rmtree(dir)
  end)
end)
