-- misuse.lua: the misuse specs' harness (`local X = require("support.misuse")`).
-- A case is { "what it does", fn, pattern, ... }: fn must raise a Lua error
-- whose message holds every pattern (plain text, any case), so the message
-- names the argument and what was expected. A case with `child = "code"`
-- instead of fn runs the code in a fresh luajit (loom, ffi and dist loaded)
-- because it could crash the process: the child must end with a Lua error
-- holding the patterns, never with a signal.
local sys = require("support.sys")

local X = {}

-- the error fn(...) raises, as a string (fails the spec if it returns)
function X.error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected an error, but the call returned")
  return tostring(err)
end

-- has(msg, ...): msg holds each string (plain text, case as given)
function X.has(msg, ...)
  for _, s in ipairs { ... } do assert(msg:find(s, 1, true), "expected «" .. s .. "» in: " .. msg) end
end

local function check_patterns(err, pats, from)
  local low = err:lower()
  for i = from, #pats do
    local p = pats[i]
    assert(low:find(p:lower(), 1, true), string.format("the message %q lacks %q", err, p))
  end
end

-- runs code in a fresh luajit with loom and ffi loaded; returns the exit
-- code and the output
function X.child(code, env)
  local rc, out = sys.luajit("loom = require('loom'); ffi = require('ffi'); " .. code, env)
  return rc, out
end

function X.check_child(code, pats, from)
  local rc, out = X.child(code)
  assert(rc < 128, string.format("the child died of signal %d (exit %d):\n%s", rc - 128, rc, out))
  assert(rc == 1 and out:find("luajit: ", 1, true),
         string.format("expected a Lua error (exit 1), got exit %d:\n%s", rc, out))
  check_patterns(out, pats, from)
end

-- registers one `it` per case (busted's `it`, passed in: a support module
-- does not see the spec's environment); returns how many
function X.run(it, cases)
  for _, c in ipairs(cases) do
    it(c[1], function()
      if c.child then X.check_child(c.child, c, 2)
      else check_patterns(X.error_of(c[2]), c, 3) end
    end)
  end
  return #cases
end

-- registers a describe per list of cases (titled by its `title` field) with
-- X.run's `it`s, then an `it` that fails when they hold fewer than `least`
-- cases in all (a list cut short by a bad edit)
function X.groups(describe, it, lists, least)
  local n = 0
  for _, cases in ipairs(lists) do
    describe(cases.title, function() n = n + X.run(it, cases) end)
  end
  it("counts its cases (at least " .. least .. " here)", function()
    assert(n >= least, "only " .. n .. " cases")
  end)
end

-- after a run of errors, tensors and autograd still work (a small matmul,
-- its gradient by hand) and grad mode was not left off
function X.still_works()
  local loom = require("loom")
  local x = loom.tensor({ { 1, 2 }, { 3, 4 } }, { requires_grad = true })
  local y = (x:matmul(x) + 1):sum()
  assert(y:item() == 4 * 1 + 7 + 10 + 15 + 22, "sum of x @ x + 1: " .. y:item())
  y:backward()
  local g = x.grad:totable()
  assert(g[1][1] == 7 and g[1][2] == 11 and g[2][1] == 9 and g[2][2] == 13, "gradient of x @ x")
  assert(loom.is_grad_enabled(), "grad mode left off")
end

return X
