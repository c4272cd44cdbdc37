-- amp_spec.lua: mixed precision. Training the small Llama with autocast in
-- bf16 (f32 parameters, gradients and AdamW) tracks the f32 loss curve:
-- over 200 steps every loss is within 5% of the f32 run's and the final
-- one within 3%; a GradScaler skips steps whose gradients overflow; and
-- train.lua --dtype bf16 resumes from its own checkpoint exactly.
local loom = require("loom")
local sys = require("support.sys")
local tr = loom.models.transformer

local function train(dtype, steps)
  loom.manual_seed(3)
  local m = tr.new { vocab_size = 32, dim = 32, n_layers = 2, n_heads = 4, max_seq_len = 16 }
  local opt = loom.optim.AdamW(m:parameters(), { lr = 3e-3 })
  loom.manual_seed(4)
  local x = loom.randint(1, 33, { 4, 16 })
  local y = x:narrow(2, 2, 15):contiguous()   -- a learnable task: the next token
  x = x:narrow(2, 1, 15):contiguous()
  local losses = {}
  for s = 1, steps do
    local function f() return loom.F.cross_entropy(m(x), y) end
    local loss = dtype == "f32" and f() or loom.autocast(dtype, f)
    opt:zero_grad()
    loss:backward()
    opt:step()
    losses[s] = loss:item()
  end
  return losses, m
end

describe("mixed precision", function()
  it("in bf16 tracks the f32 loss curve over 200 steps", function()
    local f32 = train("f32", 200)
    local bf16, m = train("bf16", 200)
    assert.are.equal("f32", m.layers[1].attention.wq.weight.dtype)
    local worst = 0
    for s = 1, 200 do worst = math.max(worst, math.abs(bf16[s] - f32[s]) / f32[s]) end
    print(string.format("  bf16 vs f32: worst relative loss gap %.4f, final %.4f vs %.4f", worst, bf16[200], f32[200]))
    assert.is_true(worst < 0.05, "worst gap " .. worst)
    assert.is_true(math.abs(bf16[200] - f32[200]) / f32[200] < 0.03)
    assert.is_true(f32[200] < 0.6 * f32[1], "it learns")
  end)
end)

describe("GradScaler", function()
  it("scales the loss, unscales the gradients, and skips a step that overflowed", function()
    local p = loom.tensor({ 1, 2 }, { requires_grad = true })
    local opt = loom.optim.SGD({ p }, { lr = 0.5 })
    local sc = loom.amp.GradScaler { init_scale = 8, growth_interval = 2 }
    sc:scale((p * p):sum()):backward()
    assert.are.same({ 16, 32 }, p.grad:totable())
    sc:step(opt)
    sc:update()
    assert.are.same({ 0, 0 }, p:totable())   -- p - 0.5 * 2p
    opt:zero_grad()
    sc:scale((p * math.huge):sum()):backward()
    sc:step(opt)
    sc:update()
    assert.are.same({ 0, 0 }, p:totable())   -- skipped
    assert.are.equal(4, sc:get_scale())
    for _ = 1, 2 do opt:zero_grad() sc:scale((p * 1):sum()):backward() sc:step(opt) sc:update() end
    assert.are.equal(8, sc:get_scale())      -- grew after growth_interval good steps
    assert.has_error(function() loom.amp.GradScaler { backoff_factor = 2 } end)
  end)
end)

describe("train.lua with --dtype bf16", function()
  it("resumes from its checkpoint exactly as if it had not stopped", function()
    local dir = sys.tmpdir()
    local base = "luajit examples/train.lua --steps 6 --layers 1 --dim 32 --heads 4 --seq 16 --batch 4 "
                 .. "--eval-every 3 --sample 0 --dtype bf16 --device auto "
    local rc, out = sys.sh(base .. "--log " .. dir .. "/a.jsonl")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("bf16 on cpu", 1, true), out)
    rc, out = sys.sh(base .. "--stop-after 3 --save " .. dir .. "/ck --log " .. dir .. "/b.jsonl")
    assert.are.equal(0, rc, out)
    rc, out = sys.sh(base .. "--resume " .. dir .. "/ck --log " .. dir .. "/b.jsonl")
    assert.are.equal(0, rc, out)
    local function losses(p)
      local l = {}
      for line in io.lines(p) do
        local v = line:match('"loss": ([%d.e+-]+)')
        if v then l[#l + 1] = v end
      end
      return l
    end
    assert.are.same(losses(dir .. "/a.jsonl"), losses(dir .. "/b.jsonl"))
    sys.rmtree(dir)
  end)
end)
