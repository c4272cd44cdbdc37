-- activations.lua: what the specs of activations share
-- (`local A = require("support.activations")`).
local loom = require("loom")
local R = require("support.ref")

local A = {}

-- the ops of loom.ops() that a function of loom.F with the same name runs
-- from one tensor alone, with its defaults (F.relu, F.softplus, ...): the
-- activations. The CUDA parity spec and the DTensor spec check each of them
-- through F, so a new activation needs no line in either. {name = op}
-- (op: loom.ops()'s entry).
function A.ops()
  local acts, x = {}, loom.randn(2, 3)
  for _, o in ipairs(loom.ops()) do
    local f = loom.F[o.name]
    if f and o.nin == 1 and o.nout == 1 and pcall(f, x) then acts[o.name] = o end
  end
  return acts
end

-- the module act after a Linear(4, 3) trains like composed(z) after a copy
-- of that Linear: forward, weight gradient and an SGD step in f64 (1e-12);
-- inputs are randn * scale
function A.assert_trains_like(act, composed, scale)
  loom.manual_seed(3)
  local lin, ref = loom.nn.Linear(4, 3):double(), loom.nn.Linear(4, 3):double()
  ref:load_state_dict(lin:state_dict())
  local x = loom.randn({ 5, 4 }, { dtype = "f64" }) * scale
  local y, yr = act(lin(x)), composed(ref(x))
  R.assert_close(y:totable(), yr:detach():totable(), 1e-12, 1e-12)
  y:sum():backward()
  yr:sum():backward()
  R.assert_close(lin.weight.grad:totable(), ref.weight.grad:totable(), 1e-12, 1e-12)
  loom.optim.SGD(lin:parameters(), { lr = 0.1 }):step()
  loom.optim.SGD(ref:parameters(), { lr = 0.1 }):step()
  R.assert_close(lin.weight:totable(), ref.weight:totable(), 1e-12, 1e-12)
end

return A
