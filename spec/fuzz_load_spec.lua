-- fuzz_load_spec.lua: loom.load and dist.checkpoint.load on damaged and
-- forged files (spec/support/fuzz_load.lua, run in a child luajit so that
-- a crash shows as a signal with the seed and case that caused it). Each
-- run is bounded: ITERATIONS damaged files or SECONDS, whichever comes
-- first. LOOM_FUZZ_SEEDS="3 4 5" and LOOM_FUZZ_ITERATIONS=2000 run more.
local fuzz = require("support.fuzz")

local iterations = tonumber(os.getenv("LOOM_FUZZ_ITERATIONS")) or 300
local seconds = 20

describe("loading damaged files", function()
  for _, seed in ipairs(fuzz.seeds) do
    it(string.format("seed %d: %d damaged files, each a Lua error or the saved values, never a crash", seed, iterations),
       function()
      -- a hard kill past twice the budget: a hung loader fails the spec too
      local rc, out, _, tail = fuzz.run(string.format("timeout -s KILL %d ", seconds + 30), "fuzz_load.lua",
                                        string.format("%d %d %d", seed, iterations, seconds), "loader", 3000)
      local sum = out:match("fuzz: [^\n]*")
      assert(sum, "no summary line (exit " .. rc .. "):\n" .. tail)
      assert(rc == 0, sum .. "\n" .. tail)
      local n, raw, raw_err, forged = sum:match("(%d+) loads %((%d+) raw: %d+ equal, (%d+) errors; (%d+) forged")
      assert.is_true(tonumber(n) >= math.min(iterations, 100), sum)   -- (the time budget may stop it first)
      assert.is_true(tonumber(raw_err) > tonumber(raw) / 2, "most raw damage must be caught: " .. sum)
      assert.is_true(tonumber(forged) > 0, sum)
      assert.truthy(sum:find(", 0 wrong,", 1, true), sum)
    end)
  end
end)
