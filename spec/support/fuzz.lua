-- fuzz.lua: what the fuzz specs (fuzz_files_spec, fuzz_load_spec) share
-- (`local fuzz = require("support.fuzz")`): the seeds to run and a run of
-- their driver in a child luajit, whose death by a signal fails the spec
-- with the case it died in.
local sys = require("support.sys")

local fuzz = {}

-- the seeds: LOOM_FUZZ_SEEDS ("3 4 5" runs more), or 1 and 2
fuzz.seeds = {}
for s in (os.getenv("LOOM_FUZZ_SEEDS") or "1 2"):gmatch("%d+") do fuzz.seeds[#fuzz.seeds + 1] = tonumber(s) end

-- run(prefix, driver, args, what, keep): `prefix luajit spec/support/<driver>
-- args` (prefix: limits and a timeout); asserts that it did not die of a
-- signal, naming `what` died and the last "case ..." line it printed, with
-- its last `keep` bytes of output. Returns its exit code, output, that case
-- and that tail.
function fuzz.run(prefix, driver, args, what, keep)
  local rc, out = sys.sh(prefix .. "luajit " .. sys.shq(sys.root .. "spec/support/" .. driver) .. " " .. args)
  local last_case = nil
  for c in out:gmatch("case ([^\n]*)") do last_case = c end
  local tail = out:sub(-keep)
  assert(rc < 128, string.format("the %s died of signal %d in case %s:\n%s", what, rc - 128, tostring(last_case), tail))
  return rc, out, tostring(last_case), tail
end

return fuzz
