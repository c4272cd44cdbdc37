-- demo.lua: a first look at loom in one process: tensors, broadcasting,
-- matmul through OpenBLAS, the counter-based RNG and autograd.
-- Run from anywhere: luajit examples/demo.lua
local root = debug.getinfo(1, "S").source:match("^@(.*)examples/demo%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local loom = require("loom")

loom.manual_seed(0)
local x = loom.tensor { { 1, 2, 3 }, { 4, 5, 6 } }
print("x =") print(x)
print("x + 10 * row bias =") print(x + loom.tensor { 10, 20, 30 })
print("x @ x:t() =") print(x:matmul(x:t()))

-- least squares by gradient descent: learn w so that a @ w fits b
local a = loom.randn(64, 3)
local w_true = loom.tensor { { 2 }, { -1 }, { 0.5 } }
local b = a:matmul(w_true)
local w = loom.zeros({ 3, 1 }, { requires_grad = true })
for step = 1, 200 do
  local loss = ((a:matmul(w) - b) ^ 2):mean()
  loss:backward()
  loom.no_grad(function() w = (w - w.grad * 0.1):detach():requires_grad_() end)
  if step % 50 == 0 then print(string.format("step %3d  loss %.6f", step, loss:item())) end
end
print("learned w (true: 2, -1, 0.5) =") print(w:detach())
