-- gpu_first_run_spec.lua: scripts/gpu_first_run.sh fits a short lease of
-- a GPU: its dry run lists every step with a timeout and ends with their
-- total, under 10 minutes; the fast, telling checks come first (the tile
-- fragments, then the specs) and the slow ones last (sanitizers, then the
-- benchmarks); nothing is built on the GPU machine. On the emulated device
-- the small cases its sanitizer and NCCL steps run (scripts/gpu_smoke.lua)
-- pass too. Runs on every machine.
local loom = require("loom")
local sys = require("support.sys")

describe("scripts/gpu_first_run.sh", function()
  local rc, out = sys.sh("bash scripts/gpu_first_run.sh --dry-run")
  local steps, sum = {}, 0
  for n, secs, name in out:gmatch("\n%s*(%d+)%.%s+(%d+) s%s+([^\n]+)") do
    steps[#steps + 1] = { n = tonumber(n), secs = tonumber(secs), name = name }
    sum = sum + tonumber(secs)
  end
  local function index(pattern)
    for i, s in ipairs(steps) do if s.name:find(pattern) then return i end end
    error("no step matches " .. pattern .. " in:\n" .. out)
  end

  it("lists every step with its timeout in a dry run, and a total under 600 s", function()
    assert.equal(0, rc, out)
    assert.is_true(#steps >= 10, out)
    for i, s in ipairs(steps) do
      assert.equal(i, s.n)
      assert.is_true(s.secs > 0, s.name)
    end
    local total = tonumber(out:match("\ntotal: (%d+) s\n?$"))
    assert.equal(sum, total, "the total is the sum of the timeouts:\n" .. out)
    assert.is_true(total < 600, "the whole run must fit in 10 minutes: " .. total .. " s")
  end)

  it("runs the fragment test first, then the specs, the sanitizers, and the benchmarks last", function()
    local frag, specs, fused, train = index("fragments"), index("CUDA specs"), index("fused kernels"), index("train%.lua")
    local nccl, tp, memcheck = index("NCCL in one process"), index("tensor parallelism on 2 GPUs"), index("memcheck")
    local racecheck, synccheck, bench = index("racecheck"), index("synccheck"), index("benchmarks")
    assert.is_true(frag <= 2, "the fragment smoke test comes first")
    assert.is_true(frag < specs and specs < fused and fused < memcheck, out)
    assert.is_true(train < memcheck and nccl < memcheck and tp < memcheck, out)
    assert.is_true(memcheck < racecheck and memcheck < synccheck, out)
    assert.equal(#steps, bench, "the benchmarks come last")
    for _, what in ipairs({ "cuBLAS", "SDPA", "PyTorch eager" }) do
      assert.truthy(steps[bench].name:find(what, 1, true), "the benchmarks compare with " .. what)
    end
  end)

  it("builds nothing on the GPU machine, and times every step", function()
    local src = sys.read("scripts/gpu_first_run.sh")
    local list = src:match("\nsteps=%((.-)\n%)\n")
    assert.truthy(list, "the steps array")
    assert.is_falsy(list:find("cmake", 1, true), "a step builds")
    assert.truthy(src:find('timeout --kill-after=5 "$limit"', 1, true), "each step runs under its timeout")
  end)

  it("says what is missing when the build is not there", function()
    local crc, cout = sys.sh("bash scripts/gpu_first_run.sh --check --build no-such-build")
    assert.equal(1, crc, cout)
    assert.truthy(cout:find("missing: no-such-build/libloom.so", 1, true), cout)
  end)

  if loom.cuda.emu_counters and loom.cuda.emu_counters() then
    it("has small cases that pass on the emulated device (scripts/gpu_smoke.lua)", function()
      local src, sout = sys.sh("luajit scripts/gpu_smoke.lua --ops --attention --nccl")
      assert.equal(0, src, sout)
      assert.truthy(sout:find("gpu_smoke: 10 passed, 0 failed", 1, true), sout)
    end)
    it("runs one case alone with --case K (memcheck's one process per case)", function()
      local code, text = sys.sh("luajit scripts/gpu_smoke.lua --ops --case 0")
      assert.equal(3, code, text)
      assert.truthy(text:find("no case 0: 8 selected", 1, true), text)
      code, text = sys.sh("luajit scripts/gpu_smoke.lua --ops --case 5")
      assert.equal(0, code, text)
      assert.truthy(text:find("ok   cross entropy f32 and bf16, smoothed\ngpu_smoke: 1 passed, 0 failed", 1, true), text)
    end)
  end
end)
