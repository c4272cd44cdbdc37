-- fuzz_load_spec.lua: loom.load and dist.checkpoint.load on damaged and
-- forged files (spec/support/fuzz_load.lua, run in a child luajit so that
-- a crash shows as a signal with the seed and case that caused it). Each
-- run is bounded: ITERATIONS damaged files or SECONDS, whichever comes
-- first. LOOM_FUZZ_SEEDS="3 4 5" and LOOM_FUZZ_ITERATIONS=2000 run more.
local sys = require "support.sys"

local here = debug.getinfo(1, "S").source:match("^@(.-)fuzz_load_spec%.lua$") or "spec/"
local driver = here .. "support/fuzz_load.lua"
local seeds = {}
for s in (os.getenv("LOOM_FUZZ_SEEDS") or "1 2"):gmatch("%d+") do seeds[#seeds + 1] = tonumber(s) end
local iterations = tonumber(os.getenv("LOOM_FUZZ_ITERATIONS")) or 300
local seconds = 20

describe("loading damaged files", function()
  for _, seed in ipairs(seeds) do
    it(string.format("seed %d: %d damaged files, each a Lua error or the saved values, never a crash", seed, iterations),
       function()
      -- a hard kill past twice the budget: a hung loader fails the spec too
      local cmd = string.format("timeout -s KILL %d luajit %s %d %d %d", seconds + 30, sys.shq(driver), seed,
                                iterations, seconds)
      local rc, out = sys.sh(cmd)
      local last_case = nil
      for c in out:gmatch("case ([^\n]*)") do last_case = c end
      local tail = out:sub(-3000)
      assert(rc < 128, string.format("the loader died of signal %d in case %s:\n%s", rc - 128, tostring(last_case), tail))
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
