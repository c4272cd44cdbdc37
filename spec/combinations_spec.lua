-- combinations_spec.lua: examples/train.lua as a user runs it, at every
-- layout and with every end-of-run action, torchtitan-style: a table of
-- flag sets, each run to its last line (a tiny model, 2 steps, with
-- evaluation, a checkpoint saved, the log and its loss plot, a sample) and
-- required to exit 0 with no traceback, its sample the same text as one
-- process's; then runs that resume at another layout, a fine-tune that
-- resumes from its own checkpoint with --resume alone, and flags whose
-- values are checked where they are parsed.
local sys = require("support.sys")

local BASE = "--steps 2 --dim 32 --layers 2 --heads 4 --seq 16 --batch 8 --eval-every 2 --eval-iters 1 --sample 12 --quiet"

-- {ranks, flags}: every layout, their 2-D and 3-D compositions on 4
-- ranks, bf16, GPT-2 (another family through the same recipes) and a
-- mixture of experts at its layouts
local MATRIX = {
  { 1, "" }, { 2, "--tp 2" }, { 2, "--tp 2 --sequence-parallel" }, { 2, "--tp 2 --sequence-parallel --async-tp" },
  { 2, "--dp 2 --tp 1" }, { 2, "--dp 2 --tp 1 --fsdp" }, { 2, "--pp 2" }, { 2, "--pp 2 --schedule gpipe" },
  { 2, "--cp 2" }, { 2, "--cp 2 --cp-rotate alltoall" },
  { 4, "--dp 2 --tp 2" }, { 4, "--dp 2 --tp 2 --fsdp --sequence-parallel" },
  { 4, "--pp 2 --tp 2 --sequence-parallel --async-tp" }, { 4, "--pp 2 --dp 2 --tp 1 --fsdp --microbatches 4" },
  { 4, "--cp 2 --tp 2 --sequence-parallel" }, { 4, "--cp 2 --pp 2" }, { 4, "--cp 2 --dp 2 --fsdp" },
  { 1, "--dtype bf16" }, { 2, "--tp 2 --sequence-parallel --dtype bf16" },
  { 2, "--model gpt2 --tp 2 --sequence-parallel" }, { 2, "--model gpt2 --pp 2" },
  -- a mixture of experts: alone, over ep, its experts cut over tp (--etp),
  -- with FSDP, PP and CP
  { 1, "--experts 4" }, { 2, "--experts 4 --ep 2 --tp 1" }, { 2, "--experts 4 --tp 2 --etp 2 --sequence-parallel" },
  { 4, "--experts 4 --ep 2 --tp 2 --etp 2 --fsdp" }, { 4, "--experts 4 --ep 2 --pp 2 --tp 1" },
  { 4, "--experts 4 --ep 2 --cp 2 --tp 1 --fsdp" },
}

-- the text between the sample's markers
local function sample_of(out)
  return out:match("%-%-%-%- sample %-%-%-%-\n(.-)\n%-%-%-%-")
end

local function run(n, flags, dir)
  local launch = n == 1 and "luajit" or ("scripts/loomrun -n " .. n .. " --quiet-others")
  return sys.sh_clean(string.format("%s examples/train.lua %s --run-dir %s %s", launch, BASE, dir, flags))
end

describe("train.lua at every layout, to its last line", function()
  it("each row exits 0 with no traceback after eval, save, log, plot and a sample (the same text as one process)", function()
    local root = sys.tmpdir()
    local samples, bad = {}, {}
    for i, row in ipairs(MATRIX) do
      local dir = root .. "/run" .. i
      local rc, out = run(row[1], row[2], dir)
      local what = row[1] .. " ranks " .. row[2]
      if rc ~= 0 then bad[#bad + 1] = what .. ": exit " .. rc .. "\n" .. out
      elseif out:find("traceback", 1, true) then bad[#bad + 1] = what .. ": a traceback\n" .. out
      else
        for _, s in ipairs { "val ", "saved the checkpoint of step 2", "loss curve:", "---- sample ----" } do
          if not out:find(s, 1, true) then bad[#bad + 1] = what .. ": no «" .. s .. "»\n" .. out end
        end
        if not sys.exists(dir .. "/checkpoints/model_config.json") then bad[#bad + 1] = what .. ": no checkpoint" end
        local family = row[2]:match("%-%-model (%w+)") or "llama"
        local dtype = row[2]:match("%-%-dtype (%w+)") or "f32"
        local key = family .. " " .. dtype .. (row[2]:find("--experts", 1, true) and " moe" or "")
        samples[key] = samples[key] or sample_of(out)
        if sample_of(out) ~= samples[key] then
          bad[#bad + 1] = string.format("%s: sample %q, one process's %q", what, tostring(sample_of(out)), samples[key])
        end
      end
    end
    sys.rmtree(root)
    assert.same({}, bad)
  end)

  it("a checkpoint saved at TP=2 + SP resumes at PP=2 and at CP=2 x DP=2, then samples", function()
    local root = sys.tmpdir()
    local rc, out = run(2, "--steps 4 --stop-after 2 --tp 2 --sequence-parallel", root .. "/a")
    assert.equal(0, rc, out)
    for i, row in ipairs { { 2, "--pp 2" }, { 4, "--cp 2 --dp 2" } } do
      rc, out = sys.sh_clean(string.format("scripts/loomrun -n %d --quiet-others examples/train.lua --resume "
                                           .. "%s/a/checkpoints --quiet --sample 12 --run-dir none --save %s/b%d %s",
                                           row[1], root, root, i, row[2]))
      assert.equal(0, rc, out)
      assert.matches("resumed from " .. root .. "/a/checkpoints at step 2", out, 1, true)
      assert.matches("---- sample ----", out, 1, true)
    end
    sys.rmtree(root)
  end)

  it("a mixture of experts saved with its experts cut over ep x tp resumes in one process and at EP=2", function()
    local root = sys.tmpdir()
    local moe = "--experts 4 --steps 4 --dim 32 --layers 2 --heads 4 --seq 16 --batch 8 --eval-every 100 --eval-iters 1 "
                .. "--sample 0 --quiet"
    local ref = sys.train(1, moe .. " --run-dir none", root .. "/ref.json")
    sys.train(4, moe .. " --stop-after 2 --ep 2 --tp 2 --etp 2 --sequence-parallel --run-dir " .. root .. "/a", root .. "/a.json")
    for i, row in ipairs { { 1, "" }, { 2, "--ep 2 --tp 1" } } do
      local got = sys.train(row[1], string.format("--resume %s/a/checkpoints --quiet --sample 12 --run-dir none %s",
                                                  root, row[2]), root .. "/b" .. i .. ".json")
      assert.matches("---- sample ----", sys.read(root .. "/b" .. i .. ".json.out"), 1, true)
      sys.same_losses("resumed at " .. row[1] .. " ranks " .. row[2], got, ref, 1e-5, 3)
    end
    sys.rmtree(root)
  end)

  it("a fine-tune (--init-from) resumes from its checkpoint with --resume alone, at another layout", function()
    local root = sys.tmpdir()
    local init = "--init-from spec/fixtures/families/qwen2 --seq 16 --batch 8 --lr 1e-2 --warmup 0 --eval-every 2 "
                 .. "--eval-iters 1 --sample 0 --quiet --run-dir none"
    local ref = sys.train(1, init .. " --steps 4", root .. "/ref.json")
    sys.train(1, init .. " --steps 4 --stop-after 2 --save " .. root .. "/ck", root .. "/first.json")
    local got = sys.train(2, "--resume " .. root .. "/ck --quiet --sample 0 --run-dir none --tp 2", root .. "/two.json")
    sys.same_losses("the fine-tune resumed at --tp 2", got, ref, 1e-5, 3)
    sys.rmtree(root)
  end)

  it("--eval-every 0 means no evaluation; bad words of a flag are one line naming it, exit 2", function()
    local root = sys.tmpdir()
    local rc, out = run(1, "--eval-every 0", root .. "/a")
    assert.equal(0, rc, out)
    assert.is_nil(out:find("| val ", 1, true), out)
    assert.matches("val loss n/a", out, 1, true)
    for _, case in ipairs { { "--cp-rotate p2p", "--cp-rotate expects allgather or alltoall, got p2p" },
                            { "--schedule zb", "--schedule expects 1F1B or gpipe, got zb" },
                            { "--model bert", "--model expects llama or gpt2, got bert" },
                            { "--dtype f16", "--dtype expects f32 or bf16, got f16" } } do
      rc, out = run(1, case[1], root .. "/b")
      assert.equal(2, rc, out)
      assert.matches("train.lua: error: " .. case[2], out, 1, true)
      assert.is_nil(out:find("traceback", 1, true), out)
    end
    sys.rmtree(root)
  end)
end)
