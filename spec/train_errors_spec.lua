-- train_errors_spec.lua: examples/train.lua refuses bad input in one line
-- ("train.lua: error: ...", exit status 2, no traceback) that says what to
-- do; under loomrun the line comes once, naming the ranks, with no MPI banner.
local sys = require("support.sys")
local sh = sys.sh

local root = sys.root
local train = "luajit " .. root .. "examples/train.lua --sample 0 "

local function refused(args, expect)
  local rc, out = sh(train .. args)
  assert.equal(2, rc, args .. ": " .. out)
  assert.equal("train.lua: error: " .. expect .. "\n", out, args)
end

describe("train.lua's refusals", function()
  it("checks numbers, negative ones included, in either spelling", function()
    refused("--steps -1", "--steps expects an integer >= 1, got -1")
    refused("--steps=-1", "--steps expects an integer >= 1, got -1")
    refused("--steps 0", "--steps expects an integer >= 1, got 0")
    refused("--batch 2.5", "--batch expects an integer >= 1, got 2.5")
    refused("--dropout 2", "--dropout expects a number in [0, 0.99], got 2")
    refused("--lr 0", "--lr expects a learning rate > 0, got 0")
    refused("--heads 3", "--heads 3 must divide --dim 128")
    refused("--steps x", "--steps expects a number, got 'x' (see --help)")
    refused("--nope 3", "unknown argument --nope (see --help)")
  end)

  it("says how to launch what one process cannot run, and refuses flags that cannot apply", function()
    refused("--tp 2", "--tp 2 x --dp 1 needs 2 ranks and this is one process: launch with "
                      .. "scripts/loomrun -n 2 examples/train.lua ...")
    refused("--fsdp", "--fsdp shards over data-parallel (or context-parallel) ranks and --dp is 1: launch more ranks "
                      .. "(scripts/loomrun -n 2 examples/train.lua --fsdp --tp 1) or leave --fsdp out")
    refused("--no-reshard", "--no-reshard applies with --fsdp only")
    refused("--sequence-parallel", "--sequence-parallel needs --tp > 1 (launch with scripts/loomrun -n 2)")
    refused("--device tpu", "--device expects cpu, cuda or auto, got tpu")
  end)

  it("gives the reason when --device cuda has no GPU", function()
    local loom = require("loom")
    local ok, why = loom.device_available("cuda")
    if ok then return end   -- a machine with a GPU: nothing to refuse
    refused("--device cuda", "--device cuda: " .. why .. " (use --device cpu)")
  end)

  it("under loomrun, prints the error once with its ranks, no banner, exit 2", function()
    local rc, out = sh(root .. "scripts/loomrun -n 2 --timeout 60 " .. root .. "examples/train.lua --tp 3 --sample 0")
    assert.equal(2, rc, out)
    assert.equal("train.lua: error: --tp must divide the world size 2, got --tp 3 (or launch with scripts/loomrun -n 3)"
                 .. " (ranks 0,1)\n", out)
  end)
end)
