-- cli_spec.lua: the helpers that stand on Debian's Lua libraries: flags
-- (loom.cli over lua-argparse, as train.lua and the benchmarks use them),
-- file work (loom.fs over lua-filesystem), JSON (dkjson through
-- loom.bench.write_json) and FQN patterns (libc's fnmatch).
local cli = require("loom.train.cli")
local fs = require("loom.fs")
local bench = require("loom.train.bench")
local tp = require("loom.parallel")
local json = require("dkjson")

local FLAGS = {
  { "steps", 600, "optimizer steps" },
  { "log", "", "log file" },
  { "dtype", "f32", "f32 or bf16" },
  { "quiet", false, "no progress" },
  { "loss-parallel", true, "loss parallel" },
}

local function parse(...) return cli.parse("prog", FLAGS, { ... }) end
local err_of = require("support.misuse").error_of

local sys = require("support.sys")
local sh, tmpdir = sys.sh, sys.tmpdir

-- cmd --help succeeds and lists `listed`; cmd --bogus 1 fails saying `refusal`
local function flags_checked(cmd, listed, refusal)
  local rc, out = sh(cmd .. " --help")
  assert.equal(0, rc, out)
  assert.truthy(out:find(listed, 1, true), out)
  rc, out = sh(cmd .. " --bogus 1")
  assert.is_not.equal(0, rc)
  assert.truthy(out:find(refusal, 1, true), out)
end

describe("loom.cli", function()
  it("gives every flag its default when absent", function()
    local o = parse()
    assert.same({ steps = 600, log = "", dtype = "f32", quiet = false, ["loss-parallel"] = true }, o)
  end)

  it("converts numbers, takes strings, sets boolean flags, accepts --name=value", function()
    local o = parse("--steps", "20", "--log=out/x.jsonl", "--quiet", "--dtype", "bf16", "--steps=1e3")
    assert.equal(1000, o.steps)   -- the last one wins
    assert.equal("out/x.jsonl", o.log)
    assert.equal("bf16", o.dtype)
    assert.is_true(o.quiet)
    assert.equal("number", type(parse("--steps", "7").steps))
  end)

  it("names an unknown flag, a flag without its value and a bad number", function()
    local e = err_of(parse, "--nope", "3")
    assert.truthy(e:find("prog: unknown argument --nope (see --help)", 1, true), e)
    e = err_of(parse, "--step", "3")
    assert.truthy(e:find("unknown argument --step", 1, true), e)
    assert.truthy(e:find("--steps", 1, true), e)   -- the tip names the likely flag
    e = err_of(parse, "--steps")
    assert.truthy(e:find("--steps", 1, true) and e:find("argument", 1, true), e)
    e = err_of(parse, "--steps", "many")
    assert.truthy(e:find("--steps expects a number, got 'many'", 1, true), e)
    e = err_of(parse, "stray")
    assert.truthy(e:find("prog: ", 1, true), e)
  end)

  it("bench scripts: defaults as flags, --help lists them, unknown flags are errors", function()
    local o = bench.args({ "--dim", "64" }, { dim = 128, json = "" }, "b")
    assert.same({ dim = 64, json = "" }, o)
    flags_checked("luajit scripts/bench_train.lua", "--layers", "bench_train.lua: unknown argument --bogus")
    local rc, out = sh("luajit scripts/bench_ops.lua --sizes")
    assert.is_not.equal(0, rc)
    assert.truthy(out:find("--sizes", 1, true), out)
  end)

  it("bench_ops runs every kernel row (a smoke run at 64k elements)", function()
    local rc, out = sh("luajit scripts/bench_ops.lua --sections kernels --knumel 65536")
    assert.equal(0, rc, out)
    for _, k in ipairs { "add", "silu'", "gelu'", "gelu fwd+bwd", "softmax", "rms_norm", "f16->f32", "copy" } do
      assert.truthy(out:find("\n" .. k .. " ", 1, true), k .. " missing from:\n" .. out)
    end
  end)

  it("bench_torch_train.py answers --help without torch and lists --tp", function()
    flags_checked("python3 scripts/bench_torch_train.py", "--tp TP", "unrecognized arguments: --bogus")
  end)

  it("bench_train under TP 2 prints loom's row with n/a for PyTorch when torch is not importable", function()
    local d = tmpdir()
    local rc, out = sh("LOOM_BENCH_PYTHON=/bin/false scripts/loomrun -n 2 --quiet-others scripts/bench_train.lua "
                       .. "--tp 2 --steps 2 --dim 32 --layers 1 --seq 16 --batch 2 --json " .. d .. "/tp.json")
    assert.equal(0, rc, out)
    assert.truthy(out:find("tp  loom step ms  loom tokens/s  PyTorch step ms  PyTorch tokens/s  loom speed-up", 1, true), out)
    assert.truthy(out:find("\n2 +[%d.]+ +[%d.]+ +n/a +n/a +n/a\n"), out)
    assert.truthy(out:find("not importable, set LOOM_BENCH_PYTHON", 1, true), out)
    local r = json.decode(sys.read(d .. "/tp.json"))
    assert.equal(2, r.tp)
    local want = 2 * 16 / (r.step_ms / 1e3)   -- the global batch's tokens (the JSON keeps ~14 digits)
    assert.is_true(math.abs(r.tokens_per_s - want) < 1e-9 * want, r.tokens_per_s .. " vs " .. want)
    assert.is_nil(r.torch_step_ms)
    sys.rmtree(d)
  end)
end)

describe("loom.fs", function()
  it("makes nested directories, lists them and removes a tree without following links", function()
    local root = tmpdir()
    local outside = tmpdir()
    fs.mkdir_p(outside)
    local keep = io.open(outside .. "/keep.txt", "w")
    keep:write("x")
    keep:close()
    fs.mkdir_p(root .. "/a/b/c/")
    fs.mkdir_p(root .. "/a/b/c")   -- again: nothing to do
    assert.is_true(fs.is_dir(root .. "/a/b/c"))
    local f = io.open(root .. "/a/file.txt", "w")
    f:write("hello")
    f:close()
    assert.equal(0, (sh("ln -s '" .. outside .. "' '" .. root .. "/a/link'")))
    assert.same({ "b", "file.txt", "link" }, fs.list(root .. "/a"))
    assert.equal("link", fs.mode(root .. "/a/link"))
    fs.rm_rf(root)
    assert.is_false(fs.exists(root))
    assert.is_true(fs.is_file(outside .. "/keep.txt"))   -- the link's target is untouched
    fs.rm_rf(root)   -- a missing path is no error
    fs.rm_rf(outside)
    assert.is_false(fs.exists(outside))
  end)

  it("errors name the path", function()
    local root = tmpdir()
    fs.mkdir_p(root)
    local f = io.open(root .. "/plain", "w")
    f:close()
    local e = err_of(fs.mkdir_p, root .. "/plain/sub")
    assert.truthy(e:find("cannot create the directory " .. root .. "/plain/sub: " .. root
                         .. "/plain exists and is not a directory", 1, true), e)
    e = err_of(fs.mkdir_p, "/proc/loom-spec-no-such-dir")
    assert.truthy(e:find("cannot create the directory /proc/loom-spec-no-such-dir: ", 1, true), e)
    e = err_of(fs.list, root .. "/missing")
    assert.truthy(e:find("cannot list the directory " .. root .. "/missing", 1, true), e)
    e = err_of(fs.rename, root .. "/missing", root .. "/other")
    assert.truthy(e:find("cannot rename " .. root .. "/missing to " .. root .. "/other", 1, true), e)
    fs.rm_rf(root)
  end)
end)

describe("JSON through dkjson", function()
  it("bench.write_json writes what dkjson reads back; NaN becomes null", function()
    local path = os.tmpname()
    local report = { threads = 2, matmul = { { n = 256, gflops = 12.5 }, { n = 512, gflops = 30.25 } },
                     name = "quote \" and newline \n", bad = 0 / 0, overhead_us = { add = 1.5 } }
    bench.write_json(path, report)
    local f = io.open(path)
    local text = f:read("*a")
    f:close()
    os.remove(path)
    local back, _, err = json.decode(text)
    assert.is_nil(err)
    assert.equal(2, back.threads)
    assert.equal(30.25, back.matmul[2].gflops)
    assert.equal("quote \" and newline \n", back.name)
    assert.is_nil(back.bad)
    assert.truthy(text:find('"bad":null', 1, true), text)
    assert.equal(1.5, back.overhead_us.add)
  end)
end)

describe("FQN patterns (libc fnmatch)", function()
  it("matches the patterns of parallelize_module plans", function()
    for _, c in ipairs {   -- name, pattern, whether it matches (and why, where it is not plain)
      { "wq", "w?", true }, { "wq", "w", false }, { "12", "*", true }, { "", "*", true },
      { "2", "[1-2]", true }, { "3", "[1-2]", false }, { "3", "[!1-2]", true },
      { "2", "[1-3]", true }, { "4", "[1-3]", false }, { "4", "[!1-3]", true },
      { "attention", "att*on", true }, { "attention", "att*x", false }, { "w-1", "w-1", true },
      { "a.b", "a?b", true, "no FNM_PERIOD: ? matches a dot" },
      { "a.b", "a.b", true }, { "axb", "a.b", false, "a dot is literal, not Lua's any-char" },
      { "[x", "[x", true, "an unclosed bracket is literal" },
      { "a\\b", "a\\b", true, "a backslash is literal (Python's fnmatch)" }, { "ab", "a\\b", false },
      { "w%", "w%", true, "no Lua pattern characters leak through" }, { "wx", "w%", false },
    } do
      assert.equal(c[3], tp.fnmatch(c[1], c[2]), string.format("fnmatch(%q, %q) %s", c[1], c[2], c[4] or ""))
    end
  end)

  it("names a bad argument", function()
    local e = err_of(tp.fnmatch, nil, "*")
    assert.truthy(e:find("fnmatch", 1, true) and e:find("name", 1, true), e)
    e = err_of(tp.fnmatch, "x", 3)
    assert.truthy(e:find("pattern", 1, true), e)
  end)
end)
