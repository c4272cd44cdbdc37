-- sys.lua: the specs' access to files and the shell (`local sys = require
-- "support.sys"`): scratch directories, whole-file reads and writes, the
-- losses of a training log, and commands run with their exit code, output
-- and wall time.
local sys = {}

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

-- step -> loss of a JSON-lines training log (examples/train.lua --log)
function sys.losses(path)
  local t = {}
  for line in io.lines(path) do
    local s, l = line:match('"step": (%d+), "loss": ([^,}]+)')
    if s then t[tonumber(s)] = tonumber(l) end
  end
  return t
end

function sys.write(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s)
  f:close()
end

return sys
