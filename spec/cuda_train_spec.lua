-- cuda_train_spec.lua: examples/train.lua --device cuda --dtype bf16 for 20
-- small steps (head dim 64: the fused attention runs) against the same run
-- on the CPU: every step's loss within 2e-3 relative. Both runs are bf16
-- under autocast with f32 accumulation; what differs is the order of the
-- sums (cuBLAS against OpenBLAS, the fused kernels' reductions), which moved
-- the losses by at most 4e-4 on the emulated device. Then the same on 2
-- ranks, tensor parallel over 2 GPUs (NCCL), against the CPU, and a
-- mixture of experts at EP=2 and ETP=2, and PP, CP and async TP (f32,
-- 1e-4). The GPU runs
-- end with their sample (generation builds its ids on the model's device).
-- Skips, saying why, without a GPU (the emulated one counts:
-- scripts/test_emu.sh).
local G = require("support.cuda")
local sys = require("support.sys")

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
      local rc, out = sys.sh(ARGS .. " --device " .. dev .. " --log " .. log
                             .. (dev == "cuda" and " --sample 20" or ""))
      assert.equal(0, rc, out)
      if dev == "cuda" then assert.truthy(out:find("---- sample ----\n", 1, true), out) end
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

  -- the 2-GPU run keeps train.lua's defaults: --grad-clip 1 (clip_grad_norm_
  -- all-reduces the squared norm on the mesh's device) and loss parallel
  local ngpu = require("loom").cuda.device_count()
  if ngpu < 2 then
    print(("cuda_train_spec: %d GPU(s): the 2-GPU run is left out"):format(ngpu))
    it("leaves the 2-GPU run out: fewer than 2 GPUs", function() assert.is_true(ngpu < 2) end)
    return
  end
  it("trains 20 bf16 steps tensor parallel on 2 ranks and 2 GPUs, clipped and loss parallel, with the CPU's losses", function()
    local dir = sys.tmpdir()
    local extra = " --log " .. dir .. "/"
    local rc, out = sys.sh(ARGS .. " --device cpu" .. extra .. "cpu.jsonl")
    assert.equal(0, rc, out)
    rc, out = sys.sh(ARGS:gsub("^luajit", "scripts/loomrun -n 2 --quiet-others") .. " --device cuda --tp 2"
                     .. " --sample 20" .. extra .. "tp.jsonl")
    assert.equal(0, rc, out)
    assert.truthy(out:find("---- sample ----\n", 1, true), out)
    local want, got = sys.losses(dir .. "/cpu.jsonl"), sys.losses(dir .. "/tp.jsonl")
    sys.rmtree(dir)
    local worst = 0
    for step = 1, 20 do
      assert(want[step] and got[step], "step " .. step .. ": a loss is missing")
      local rel = math.abs(got[step] - want[step]) / math.abs(want[step])
      assert(rel <= TOL, ("step %d: tp loss %.6f, cpu %.6f: relative %.2g above %g"):format(step, got[step], want[step], rel, TOL))
      worst = math.max(worst, rel)
    end
    print(("\ncuda_train_spec: 20 bf16 steps on 2 ranks x 2 GPUs (tp 2), worst relative loss difference %.2g"):format(worst))
  end)

  -- base (train.lua's flags) in one process on the CPU, then at each of
  -- layouts on 2 ranks and 2 GPUs: f32, every step's loss within 1e-4 of
  -- the CPU's, and the sample at the end when the flags ask for one
  local function gpus_match_cpu(base, layouts)
    local dir = sys.tmpdir()
    local run = "examples/train.lua " .. base .. " --log " .. dir .. "/"
    local rc, out = sys.sh("luajit " .. run .. "cpu.jsonl --device cpu")
    assert.equal(0, rc, out)
    local want = sys.losses(dir .. "/cpu.jsonl")
    for _, flags in ipairs(layouts) do
      rc, out = sys.sh("scripts/loomrun -n 2 --quiet-others " .. run .. "gpu.jsonl --device cuda " .. flags)
      assert.equal(0, rc, out)
      if tonumber((base .. " " .. flags):match(".*%-%-sample (%d+)")) > 0 then
        assert.truthy(out:find("---- sample ----\n", 1, true), out)
      end
      sys.same_losses(flags .. " on cuda against the cpu", sys.losses(dir .. "/gpu.jsonl"), want, 1e-4)
    end
    sys.rmtree(dir)
  end

  -- the layouts whose activations move point to point (PP's stages, CP's
  -- ring, async TP's chunks; staged through host memory) or whose masks are
  -- built on the host (CP)
  it("trains at PP=2, CP=2 (gathered and ring), async TP on 2 GPUs with the CPU's losses, then samples", function()
    gpus_match_cpu("--dim 64 --layers 2 --heads 2 --seq 16 --batch 4 --steps 3 --eval-every 3 --eval-iters 1 "
                   .. "--sample 8 --quiet --run-dir none",
                   { "--pp 2 --tp 1", "--cp 2 --tp 1", "--cp 2 --tp 1 --cp-rotate alltoall",
                     "--tp 2 --sequence-parallel --async-tp" })
  end)

  -- a mixture of experts (grouped GEMMs, the all-to-all over NCCL, the
  -- experts' partial sums all-reduced)
  it("trains a mixture of experts on 2 GPUs with its experts over ep, and cut over tp (--etp), with the CPU's losses", function()
    gpus_match_cpu("--experts 4 --top-k 2 --dim 64 --layers 2 --heads 2 --seq 16 --batch 4 --steps 5 "
                   .. "--eval-every 1000 --eval-iters 1 --sample 0 --quiet --run-dir none",
                   { "--ep 2 --tp 1", "--tp 2 --etp 2 --sample 8" })
  end)
end)
