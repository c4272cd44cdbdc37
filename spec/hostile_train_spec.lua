-- hostile_train_spec.lua: examples/train.lua on a loss that becomes NaN or
-- inf, and on eval counts that cannot give a validation loss (issue 26):
-- it stops naming the step with a hint (exit 1) unless --skip-nonfinite
-- tells it to skip such steps; --eval-iters 0 is refused.
local sys = require("support.sys")

local base = "luajit examples/train.lua --steps 6 --layers 1 --dim 32 --heads 4 --seq 16 --batch 4 --sample 0 "
  .. "--quiet --eval-every 3"

describe("train.lua on a non-finite loss", function()
  it("stops at the first NaN loss, naming the step and the fix (it ran on and exited 0 with 'final loss nan')", function()
    local rc, out = sys.sh(base .. " --lr 1e30")
    assert.equal(2, rc, out)   -- train.lua's one-line errors exit 2
    assert.truthy(out:find("train.lua: error: the loss is nan at step 2", 1, true), out)
    assert.truthy(out:find("--skip-nonfinite", 1, true), out)
    assert.is_nil(out:find("done:", 1, true), out)
  end)

  it("--skip-nonfinite skips those steps, says so, and finishes", function()
    local rc, out = sys.sh(base .. " --lr 1e30 --skip-nonfinite")
    assert.equal(0, rc, out)
    assert.truthy(out:find("step 2: loss nan, optimizer step skipped (--skip-nonfinite)", 1, true), out)
    assert.truthy(out:find("done: 6 steps", 1, true), out)
  end)

  it("a finite run is untouched by the check", function()
    local rc, out = sys.sh(base)
    assert.equal(0, rc, out)
    assert.is_nil(out:find("skipped", 1, true), out)
  end)

  it("--eval-iters 0 or 1.5 is refused before training (it reported 'val nan')", function()
    for _, v in ipairs { "0", "1.5" } do
      local rc, out = sys.sh(base .. " --eval-iters " .. v)
      assert.equal(2, rc, out)   -- train.lua's one-line errors exit 2
      assert.truthy(out:find("--eval-iters expects an integer >= 1, got " .. v, 1, true), out)
    end
  end)
end)
