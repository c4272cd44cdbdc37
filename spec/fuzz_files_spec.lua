-- fuzz_files_spec.lua: every file reader (safetensors, index, loom.load,
-- checkpoint manifests, HF configs) fed mutated files by a seeded fuzzer
-- (spec/support/fuzz_files.lua), in a child luajit under a memory limit
-- (ulimit -v 3 GB) and a time budget (SECONDS per seed, killed at twice
-- that plus 30 s): each call must return or raise a Lua error, never crash,
-- hang or run out of memory. LOOM_FUZZ_SEEDS="3 4 5" and
-- LOOM_FUZZ_SECONDS=60 run more.
local sys = require "support.sys"

local here = debug.getinfo(1, "S").source:match("^@(.-)fuzz_files_spec%.lua$") or "spec/"
local driver = here .. "support/fuzz_files.lua"
local seeds = {}
for s in (os.getenv("LOOM_FUZZ_SEEDS") or "1 2"):gmatch("%d+") do seeds[#seeds + 1] = tonumber(s) end
local seconds = tonumber(os.getenv("LOOM_FUZZ_SECONDS")) or 2

describe("every file reader on mutated files", function()
  for _, seed in ipairs(seeds) do
    it(string.format("seed %d, %g s: only Lua errors or values, under ulimit -v 3 GB", seed, seconds), function()
      -- (under ASan, whose shadow memory needs terabytes of address space, without the limit)
      local limit = (os.getenv("LD_PRELOAD") or ""):find("asan") and "" or "ulimit -v 3000000; "
      local cmd = string.format("%stimeout -s KILL %d luajit %s %d %g", limit, 2 * seconds + 30,
                                sys.shq(driver), seed, seconds)
      local rc, out = sys.sh(cmd)
      local last_case = nil
      for c in out:gmatch("case ([^\n]*)") do last_case = c end
      local tail = out:sub(-2000)
      assert(rc < 128, string.format("the reader died of signal %d in case %s:\n%s", rc - 128, tostring(last_case), tail))
      assert(rc == 0, string.format("exit %d in case %s:\n%s", rc, tostring(last_case), tail))
      local sum = out:match("fuzz%-files: [^\n]*")
      assert(sum, "no summary line:\n" .. tail)
      for _, reader in ipairs { "safetensors", "index", "load", "manifest", "config" } do
        local n = tonumber(sum:match(reader .. " (%d+)"))
        assert.is_true(n ~= nil and n >= 5, reader .. " ran too few cases: " .. sum)
      end
      local errors, returned = sum:match("(%d+) errors, (%d+) returned")
      assert.is_true(tonumber(errors) > 0 and tonumber(returned) > 0, sum)
    end)
  end
end)
