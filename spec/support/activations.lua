-- activations.lua: the ops of loom.ops() that a function of loom.F with the
-- same name runs from one tensor alone, with its defaults (F.relu,
-- F.softplus, ...): the activations. The CUDA parity spec and the DTensor
-- spec check each of them through F, so a new activation needs no line in
-- either. Returns {name = op} (op: loom.ops()'s entry).
local loom = require "loom"

return function()
  local acts, x = {}, loom.randn(2, 3)
  for _, o in ipairs(loom.ops()) do
    local f = loom.F[o.name]
    if f and o.nin == 1 and o.nout == 1 and pcall(f, x) then acts[o.name] = o end
  end
  return acts
end
