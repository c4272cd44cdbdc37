-- checkpoint_format_spec.lua: one process's side of the checkpoint formats:
-- loom.load reads a dist.checkpoint directory, dist.checkpoint.load reads a
-- loom.save file, and examples/train.lua resumes a 1-process checkpoint on
-- 2 ranks (scripts/loomrun -n 2) and a 2-rank one in 1 process.
-- (spec/dist/checkpoint_format_spec.lua runs the same story on N ranks.)
local loom = require("loom")
local fs = require("loom.fs")
local json = require("dkjson")

local sys = require("support.sys")
local sh, tmpdir = sys.sh, sys.tmpdir
local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  return not ok and tostring(e) or nil
end

-- (MPI is never started in this process: a singleton's environment would
-- reach the mpirun of later specs. Distributed code runs in children.)
describe("checkpoint formats in one process", function()
  it("spec/dist/checkpoint_format_spec.lua passes as a world of one", function()
    local rc, out = sh("luajit scripts/run_specs.lua -o plainTerminal spec/dist/checkpoint_format_spec.lua")
    assert.equal(0, rc, out)
    local n = tonumber(out:match("(%d+) successes / 0 failures / 0 errors"))
    assert.is_true(n ~= nil and n >= 7, out)
  end)

  it("loom.load says when a directory is no checkpoint, or a path is missing", function()
    local root = tmpdir()
    local e1 = err_of(loom.load, root)
    assert.truthy(e1:find(root .. " is a directory, not a loom file nor a checkpoint (no manifest.loom)", 1, true), e1)
    local e2 = err_of(loom.load, root .. "/nope")
    assert.truthy(e2:find("cannot open " .. root .. "/nope: No such file or directory", 1, true), e2)
    assert.is_nil(e2:find(".old", 1, true))
    fs.rm_rf(root)
  end)
end)

-- the "loss" of each step of a train.lua log, as numbers
local function losses(path)
  local out = {}
  for line in io.lines(path) do
    local e = json.decode(line)
    if e.step then out[e.step] = e.loss end
  end
  return out
end

describe("train.lua resumes at another layout", function()
  local base = " examples/train.lua --steps 16 --dim 32 --layers 1 --heads 2 --seq 16 --batch 4 --eval-every 8 "
    .. "--eval-iters 2 --sample 0 --quiet"
  local one, two = "luajit" .. base, "scripts/loomrun -n 2 --quiet-others" .. base

  it("from 1 process to TP=2 and from TP=2 to 1 process, on the same losses", function()
    local root = tmpdir()
    local rc, out = sh(one .. " --log " .. root .. "/full.jsonl")
    assert.equal(0, rc, out)
    local full = losses(root .. "/full.jsonl")
    for _, run in ipairs { { one, two, "ck1" }, { two, one, "ck2" } } do
      local ckdir = root .. "/" .. run[3]
      rc, out = sh(run[1] .. " --stop-after 8 --save " .. ckdir)
      assert.equal(0, rc, out)
      rc, out = sh(run[2] .. " --resume " .. ckdir .. " --log " .. root .. "/" .. run[3] .. ".jsonl")
      assert.equal(0, rc, out)
      assert.truthy(out:find("resumed from " .. ckdir .. " at step 8", 1, true), out)
      local got = losses(root .. "/" .. run[3] .. ".jsonl")
      assert.is_nil(got[8])
      for step = 9, 16 do
        assert.is_not_nil(got[step], run[3] .. ": step " .. step)
        -- TP=2 sums in another order: equal to f32 rounding, not bit for bit
        assert.is_true(math.abs(got[step] - full[step]) <= 1e-5 * full[step],
                       string.format("%s step %d: %.9g vs %.9g", run[3], step, got[step], full[step]))
      end
    end
    -- the two kinds of checkpoint it wrote
    assert.is_true(fs.is_file(root .. "/ck1/checkpoint.loom"))
    assert.is_true(fs.is_file(root .. "/ck2/state/manifest.loom"))   -- DIR/state: the dist.checkpoint directory
    fs.rm_rf(root)
  end)
end)
