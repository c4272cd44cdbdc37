-- cuda_train_spec.lua: examples/train.lua --device cuda --dtype bf16 for 20
-- small steps (head dim 64: the fused attention runs) against the same run
-- on the CPU: every step's loss within 2e-3 relative. Both runs are bf16
-- under autocast with f32 accumulation; what differs is the order of the
-- sums (cuBLAS against OpenBLAS, the fused kernels' reductions), which moved
-- the losses by at most 2e-4 on the emulated device. Skips, saying why,
-- without a GPU (the emulated one counts: scripts/test_emu.sh).
local G = require "support.cuda"
local sys = require "support.sys"

if G.skip(describe, it, "cuda training") then return end

local ARGS = "luajit examples/train.lua --dim 128 --layers 2 --heads 2 --seq 32 --batch 2 --steps 20 "
             .. "--warmup 5 --eval-every 1000 --eval-iters 1 --sample 0 --quiet --dtype bf16"
local TOL = 2e-3

describe("examples/train.lua on cuda", function()
  it("trains 20 bf16 steps with the CPU's losses", function()
    local dir = sys.tmpdir()
    local losses = {}
    for _, dev in ipairs({ "cpu", "cuda" }) do
      local log = dir .. "/" .. dev .. ".jsonl"
      local rc, out = sys.sh(ARGS .. " --device " .. dev .. " --log " .. log)
      assert.equal(0, rc, out)
      losses[dev] = sys.losses(log)
    end
    sys.rmtree(dir)
    local worst = 0
    for step = 1, 20 do
      local want, got = losses.cpu[step], losses.cuda[step]
      assert(want and got, "step " .. step .. ": a loss is missing")
      local rel = math.abs(got - want) / math.abs(want)
      assert(rel <= TOL, ("step %d: cuda loss %.6f, cpu %.6f: relative %.2g above %g"):format(step, got, want, rel, TOL))
      worst = math.max(worst, rel)
    end
    assert.is_true(losses.cuda[20] < losses.cuda[1] - 0.5, "the loss went down")
    print(("\ncuda_train_spec: 20 bf16 steps, worst relative loss difference %.2g (tolerance %g)"):format(worst, TOL))
  end)
end)
