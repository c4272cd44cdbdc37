-- fuzz_files_spec.lua: every file reader (safetensors, index, loom.load,
-- checkpoint manifests, HF configs) fed mutated files by a seeded fuzzer
-- (spec/support/fuzz_files.lua), in a child luajit under a memory limit
-- (ulimit -v 3 GB) and a time budget (SECONDS per seed, killed at twice
-- that plus 30 s): each call must return or raise a Lua error, never crash,
-- hang or run out of memory. LOOM_FUZZ_SEEDS="3 4 5" and
-- LOOM_FUZZ_SECONDS=60 run more.
local fuzz = require("support.fuzz")

local seconds = tonumber(os.getenv("LOOM_FUZZ_SECONDS")) or 2

describe("every file reader on mutated files", function()
  for _, seed in ipairs(fuzz.seeds) do
    it(string.format("seed %d, %g s: only Lua errors or values, under ulimit -v 3 GB", seed, seconds), function()
      -- (under ASan, whose shadow memory needs terabytes of address space, without the limit)
      local limit = (os.getenv("LD_PRELOAD") or ""):find("asan") and "" or "ulimit -v 3000000; "
      local rc, out, last_case, tail = fuzz.run(string.format("%stimeout -s KILL %d ", limit, 2 * seconds + 30),
                                                "fuzz_files.lua", string.format("%d %g", seed, seconds), "reader", 2000)
      assert(rc == 0, string.format("exit %d in case %s:\n%s", rc, last_case, tail))
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
