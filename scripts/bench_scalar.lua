-- bench_scalar.lua: the cost of a call with a Lua number as an operand
-- (x + 1, x * 0.5, x - 2, x / 4, x:pow(2)) next to x + y on tensors of the
-- same small size, and next to the 0-dim tensor path those calls took
-- before (op2n, still used for integer tensors and DTensors), all in the
-- same run: rounds interleaved, the best round of each (microseconds per call).
-- Usage: luajit scripts/bench_scalar.lua [--numel 16] [--calls 200000] [--rounds 7]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_scalar%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local loom = require("loom")
local T = require("loom.tensor")
local bench = require("loom.train.bench")
local C = require("loom.lib").C

local o = bench.args(arg, { numel = 16, calls = 200000, rounds = 7 }, "bench_scalar.lua")
local x, y = loom.randn(o.numel), loom.randn(o.numel)
local n = o.calls
local op2n = T.op2n

-- each body a loop of its own, so each compiles to its own trace
local cases = {
  { "x + y (baseline)", function() local r for _ = 1, n do r = x + y end return r end },
  { "x + 1", function() local r for _ = 1, n do r = x + 1 end return r end },
  { "x * 0.5", function() local r for _ = 1, n do r = x * 0.5 end return r end },
  { "x - 2", function() local r for _ = 1, n do r = x - 2 end return r end },
  { "x / 4", function() local r for _ = 1, n do r = x / 4 end return r end },
  { "2 - x", function() local r for _ = 1, n do r = 2 - x end return r end },
  { "x:pow(2)", function() local r for _ = 1, n do r = x:pow(2) end return r end },
  { "x + 1 as before (0-dim tensor)", function() local r for _ = 1, n do r = op2n(C.LM_OP_ADD, x, 1, false) end return r end },
}
local best = {}
for _ = 1, o.rounds do
  for k, c in ipairs(cases) do
    collectgarbage()
    local t0 = bench.now()
    c[2]()
    best[k] = math.min(best[k] or math.huge, (bench.now() - t0) / n)
  end
end
print(string.format("loom bench_scalar: %d-element f32 tensors, %d calls a round, best of %d rounds, %d threads",
                    o.numel, n, o.rounds, loom.num_threads()))
local rows = {}
for k, c in ipairs(cases) do
  rows[k] = { c[1], best[k] * 1e6, (best[k] - best[1]) * 1e6 }
end
bench.table({ "call", "us/call", "us over x + y" }, rows)
