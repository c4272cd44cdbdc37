-- train_user_errors_spec.lua: a user's mistakes that train.lua finds late
-- (a missing corpus, a checkpoint folder that is not one, a model the
-- layout cannot cut, microbatches that do not divide) end in one line,
-- exit 2, printed once under loomrun, no traceback unless LOOM_DEBUG=1,
-- and leave no run folder behind; --config reads the config.json a run
-- writes; one setting in two spellings is refused; two runs started in the
-- same second get two folders; a --run-dir holding a run is not
-- overwritten; Ctrl-C ends a run after its step, with its checkpoint and
-- the command that resumes it.
local sys = require("support.sys")

local function in_dir(dir, cmd)
  return sys.sh_clean("cd " .. sys.shq(dir) .. " && " .. cmd)
end

local function runs_in(dir)
  local p = io.popen("ls " .. sys.shq(dir .. "/runs") .. " 2>/dev/null")
  local n = 0
  for _ in p:lines() do n = n + 1 end
  p:close()
  return n
end

describe("train.lua's late user errors", function()
  local root = sys.root == "./" and io.popen("pwd"):read("*l") .. "/" or sys.root
  local train = "luajit " .. root .. "examples/train.lua --steps 2 --sample 0 --quiet "
  local loomrun = root .. "scripts/loomrun -n 2 " .. root .. "examples/train.lua --steps 2 --sample 0 --quiet "

  it("are one line, exit 2, once for all ranks, no traceback, no run folder left", function()
    local dir = sys.tmpdir()
    for _, case in ipairs {
      { train .. "--data nofile.txt", "train.lua: error: --data: data: cannot open nofile.txt: No such file or directory" },
      { train .. "--init-from /nonexistent", "train.lua: error: --init-from: hf.read_config: /nonexistent/config.json: cannot open" },
      { loomrun .. "--pp 2 --microbatches 5", "train.lua: error: --microbatches 5 must divide the batch of each data-parallel rank, 12" },
      { root .. "scripts/loomrun -n 3 " .. root .. "examples/train.lua --steps 2", "tp_plan: n_heads (4) must divide by the tensor-parallel degree (3) (ranks 0,1,2)" },
      { loomrun .. "--tp 2 --async-tp", "train.lua: error: --async-tp needs --sequence-parallel" },
    } do
      local rc, out = in_dir(dir, case[1])
      assert.equal(2, rc, case[1] .. "\n" .. out)
      assert.matches(case[2], out, 1, true)
      assert.is_nil(out:find("traceback", 1, true), out)
      local _, n = out:gsub("train%.lua: error:", "")
      assert.equal(1, n, "printed once: " .. out)
      assert.equal(0, runs_in(dir), case[1] .. ": a run folder was left")
    end
    local rc, out = in_dir(dir, "LOOM_DEBUG=1 " .. train .. "--data nofile.txt")
    assert.equal(2, rc, out)
    assert.matches("stack traceback", out, 1, true)
    sys.rmtree(dir)
  end)

  it("--config reads the config.json a run writes (its flags, not its paths); two spellings of one flag are refused", function()
    local dir = sys.tmpdir()
    local rc, out = in_dir(dir, train .. "--dim 32 --layers 1 --heads 2 --seq 16 --batch 4")
    assert.equal(0, rc, out)
    local first = io.popen("ls " .. sys.shq(dir .. "/runs")):read("*l")
    rc, out = in_dir(dir, train .. "--config runs/" .. first .. "/config.json --steps 3")
    assert.equal(0, rc, out)
    assert.matches("model: 1 layers, dim 32, 2 heads", out, 1, true)
    assert.matches("3 steps of 4x16 tokens", out, 1, true)
    assert.equal(2, runs_in(dir), "the second run writes a folder of its own")
    sys.write(dir .. "/two.lua", 'return { ["weight-decay"] = 0.1, weight_decay = 0.2 }')
    rc, out = in_dir(dir, train .. "--config two.lua")
    assert.equal(2, rc, out)
    assert.matches("weight-decay is given twice", out, 1, true)
    sys.rmtree(dir)
  end)

  it("two runs started in the same second get two folders; a --run-dir holding a run is refused", function()
    local dir = sys.tmpdir()
    local cmd = train .. "--dim 16 --layers 1 --heads 2 --seq 8 --batch 2"
    local rc, out = in_dir(dir, "(" .. cmd .. " > a.out 2>&1 & " .. cmd .. " > b.out 2>&1; wait)")
    assert.equal(0, rc, out)
    assert.equal(2, runs_in(dir))
    rc, out = in_dir(dir, cmd .. " --run-dir runs/" .. io.popen("ls " .. sys.shq(dir .. "/runs")):read("*l"))
    assert.equal(2, rc, out)
    assert.matches("holds another run", out, 1, true)
    sys.rmtree(dir)
  end)

  it("Ctrl-C ends a run after its step: its checkpoint, 'interrupted at step N; resume with ...', exit 130", function()
    local dir = sys.tmpdir()
    local cmd = string.format("%s --steps 100000 --dim 32 --layers 1 --heads 2 --seq 16 --batch 4 --run-dir none "
                              .. "--save ck --print-every 1 > out.txt 2>&1 & pid=$!; "
                              .. "for i in $(seq 200); do grep -q 'step 3/' out.txt 2>/dev/null && break; sleep 0.1; done; "
                              .. "kill -INT $pid; wait $pid; echo rc=$?", train)
    local _, out = in_dir(dir, cmd)
    local text = sys.read(dir .. "/out.txt")
    assert.matches("rc=130", out, 1, true)
    local step = tonumber(text:match("interrupted at step (%d+); resume with: luajit examples/train.lua %-%-resume ck"))
    assert.is_number(step, text)
    assert.matches("saved the checkpoint of step " .. step, text, 1, true)
    local rc, out2 = in_dir(dir, train .. "--resume ck --steps " .. (step + 1) .. " --run-dir none")
    assert.equal(0, rc, out2)
    assert.matches("resumed from ck at step " .. step, out2, 1, true)
    sys.rmtree(dir)
  end)
end)
