-- sys.lua: the specs' access to files and the shell (`local sys = require
-- "support.sys"`): the checkout's root, scratch directories and files, whole-file reads and writes, the
-- losses of a training log and of examples/train.lua runs, and commands (and Lua code in a fresh luajit) run
-- with their exit code, output and wall time.
local sys = {}

-- the checkout's root ("./" when the specs run from it): scripts and
-- examples are root .. "scripts/loomrun" and the like
sys.root = debug.getinfo(1, "S").source:match("^@(.-)spec/support/sys%.lua$") or "./"
if sys.root == "" then sys.root = "./" end

-- s quoted for the shell
function sys.shq(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- runs a shell command; returns its exit code, output (stdout + stderr)
-- and wall seconds
function sys.sh(cmd)
  local p = io.popen("s=$(date +%s%N); ( " .. cmd .. " ) 2>&1; echo \"@@rc=$? ns=$(( $(date +%s%N) - s ))\"")
  local out = p:read("*a")
  p:close()
  local rc, ns = out:match("@@rc=(%d+) ns=(%d+)%s*$")
  return tonumber(rc), (out:gsub("@@rc=.*$", "")), tonumber(ns) / 1e9
end

-- runs Lua code in a fresh luajit with this process's package.path (the
-- checkout's lua/ and spec/), env ("NAME=value ...", or nil) before the
-- command and no standard input; its exit code, output and wall seconds
function sys.luajit(code, env)
  local prelude = "package.path = " .. string.format("%q", package.path) .. "; "
  return sys.sh((env or "") .. " luajit -e " .. sys.shq(prelude .. code) .. " </dev/null")
end

-- the output of sys.sh(cmd), asserting its exit code (with the output in
-- the failure): want_rc, 0 by default, or any but 0 for "nonzero"
function sys.output(cmd, want_rc)
  local luassert = require("luassert")
  local rc, out = sys.sh(cmd)
  if want_rc == "nonzero" then luassert.are_not.equal(0, rc, out) else luassert.are.equal(want_rc or 0, rc, out) end
  return out
end

-- sys.sh(cmd) without an MPI singleton's PMIx/ORTE environment: a launcher
-- started from a process that already holds one (another spec of this run
-- may have initialised loom.distributed) must not inherit it
function sys.sh_clean(cmd)
  return sys.sh("unset $(env | grep -oE '^(PMIX_[A-Za-z0-9_]*|OMPI_MCA_(ess|pmix|orte_[A-Za-z0-9_]*)|"
                .. "OMPI_APP_CTX_NUM_PROCS)=' | tr -d = | tr '\\n' ' '); " .. cmd)
end

-- a new temporary file holding text, its name ending in suffix if given;
-- its path (remove it with os.remove)
function sys.tmpfile(text, suffix)
  local path = os.tmpname() .. (suffix or "")
  sys.write(path, text)
  return path
end

-- sys.sh(cmd) with text as its standard input
function sys.sh_input(cmd, text)
  local input = sys.tmpfile(text)
  local rc, out, secs = sys.sh(cmd .. " < " .. sys.shq(input))
  os.remove(input)
  return rc, out, secs
end

-- a fresh empty directory under /tmp (remove it with sys.rmtree)
function sys.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  local rc = sys.sh("mkdir -p " .. sys.shq(d))
  assert(rc == 0, "cannot make the scratch directory " .. d)
  return d
end

function sys.rmtree(d) os.execute("rm -rf " .. sys.shq(d)) end

-- whether a file or directory exists at p
function sys.exists(p) return (os.rename(p, p)) == true end

function sys.read(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- step -> the value of field `name` ("loss" when nil: "val_loss" is not
-- it) in a JSON-lines training log (examples/train.lua --log)
function sys.losses(path, name)
  local pattern = '"step": (%d+),.*"' .. (name or "loss") .. '": ([^,}]+)'
  local t = {}
  for line in io.lines(path) do
    local s, v = line:match(pattern)
    if s then t[tonumber(s)] = tonumber(v) end
  end
  return t
end

-- train(ranks, flags, log): the losses of examples/train.lua run with flags
-- and --log log, in one process (ranks 1) or on ranks ranks (loomrun); its
-- output goes to log .. ".out"
function sys.train(ranks, flags, log)
  local cmd = ranks == 1 and "luajit examples/train.lua" or
              ("scripts/loomrun -n " .. ranks .. " --quiet-others examples/train.lua")
  local ok = os.execute(string.format("%s %s --log %s > %s.out 2>&1", cmd, flags, log, log))
  assert(ok == 0 or ok == true, "training run failed: see " .. log .. ".out")
  return sys.losses(log)
end

-- same_losses(what, got, ref, rel, first): got's loss at each of ref's
-- steps (from step first, 1 by default: a resumed run logs the later ones)
-- within relative rel of ref's (what names the run in the message)
function sys.same_losses(what, got, ref, rel, first)
  for step = first or 1, #ref do
    assert(got[step], string.format("%s: no loss logged at step %d", what, step))
    local r = math.abs(got[step] - ref[step]) / math.abs(ref[step])
    assert(r <= rel, string.format("%s: step %d loss %.9g vs %.9g in the reference run (rel %.2e)", what, step,
                                   got[step], ref[step], r))
  end
end

-- fine_tunes(flags, want, dir, also): examples/train.lua with flags (an
-- --init-from among them, 3 or more steps) on one process and on 2 ranks,
-- logging into dir; each must exit 0 printing "initialised from" and each
-- string of the list also, log step 3, and log first the loaded model's
-- loss want (within 1e-5)
function sys.fine_tunes(flags, want, dir, also)
  local luassert = require("luassert")
  for _, run in ipairs { { "luajit", 1 }, { "scripts/loomrun -n 2 --quiet-others", 2 } } do
    local log = dir .. "/run" .. run[2] .. ".jsonl"
    local rc, out = sys.sh_clean(run[1] .. " examples/train.lua " .. flags .. " --log " .. log)
    luassert.equal(0, rc, out)
    for _, s in ipairs { "initialised from", unpack(also or {}) } do
      luassert.truthy(out:find(s, 1, true), "no «" .. s .. "» in the output:\n" .. out)
    end
    local l = sys.losses(log)
    luassert.is_not_nil(l[3], out)
    luassert.is_true(math.abs(l[1] - want) < 1e-5, string.format("%d rank(s): first loss %.7g, the loaded model's %.7g",
                                                                 run[2], l[1], want))
  end
end

-- matches_one_process(flags, steps, layouts): examples/train.lua with flags
-- (which set --steps steps) in one process must log every step and learn
-- (its last loss below its first); then with each { ranks, more flags } of
-- layouts it must log the same loss at every step (relative 1e-5), and
-- the same gradient norm where it logs one (relative 1e-5: Adam's update
-- hides gradients scaled by a constant; the norm does not)
function sys.matches_one_process(flags, steps, layouts)
  local luassert = require("luassert")
  local dir = sys.tmpdir()
  local ref = sys.train(1, flags, dir .. "/ref.json")
  local ref_norms = sys.losses(dir .. "/ref.json", "grad_norm")
  luassert.are.equal(steps, #ref)
  luassert.is_true(ref[steps] < ref[1], "it learned nothing")
  for i, layout in ipairs(layouts) do
    local log = dir .. "/run" .. i .. ".json"
    local got = sys.train(layout[1], flags .. " " .. layout[2], log)
    sys.same_losses(layout[2], got, ref, 1e-5)   -- the reference: one process
    if #ref_norms > 0 then sys.same_losses(layout[2] .. " (gradient norm)", sys.losses(log, "grad_norm"), ref_norms, 1e-5) end
  end
  sys.rmtree(dir)
end

function sys.write(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s)
  f:close()
end

return sys
