-- hostile_saves_spec.lua: saves write only what they name (issue 26).
-- loom.save and save_safetensors write a fresh temporary created
-- exclusively beside the target (a link planted there is never written
-- through); a checkpoint directory is saved into by one job at a time (a
-- lock), and a save refuses a directory holding files that are not loom's.
-- Two processes saving into one directory at once never lose the old
-- checkpoint: the directory always ends as one whole checkpoint.
local loom = require("loom")
local sys = require("support.sys")
local X = require("support.misuse")
local fs = require("loom.fs")

local errmsg, has = X.error_of, X.has
local pid = tonumber(sys.read("/proc/self/stat"):match("^(%d+)"))

describe("saves through planted links", function()
  local d = sys.tmpdir()
  local savers = {
    { "loom.save", function(p) loom.save({ v = 1 }, p) end, function(p) return loom.load(p).v == 1 end },
    { "save_safetensors", function(p) loom.save_safetensors({ x = loom.ones(3) }, p) end,
      function(p) return loom.load_safetensors(p).x:sum():item() == 3 end },
  }
  for _, s in ipairs(savers) do
    it(s[1] .. " never writes through a link planted at PATH.tmp or at names of the form it uses", function()
      local victim, path = d .. "/victim-" .. s[1], d .. "/out-" .. s[1]
      sys.write(victim, "precious")
      os.execute(string.format("ln -s %s %s", sys.shq(victim), sys.shq(path .. ".tmp")))
      for i = 1, 200 do
        os.execute(string.format("ln -s %s %s 2>/dev/null", sys.shq(victim), sys.shq(path .. ".tmp-" .. pid .. "-" .. i)))
      end
      s[2](path)
      assert.equal("precious", sys.read(victim))
      assert.equal("file", fs.mode(path))   -- a file of its own, not a link to the victim
      assert.is_true(s[3](path))
    end)
  end

  it("loom.save of a table that holds itself names the cycle (it ended in 'stack overflow'); shared tables are fine", function()
    local t = { a = {} }
    t.a.b = t
    has(errmsg(loom.save, t, d .. "/cycle.loom"), "obj.a.b holds itself (a cycle)")
    local shared = { 1, 2 }
    loom.save({ x = shared, y = shared }, d .. "/shared.loom")
    assert.same({ 1, 2 }, loom.load(d .. "/shared.loom").y)
  end)

  it("hf.save_pretrained never writes config.json through a link planted there", function()
    local victim, out = d .. "/victim-cfg", d .. "/pretrained"
    sys.write(victim, "precious")
    os.execute("mkdir -p " .. sys.shq(out))
    os.execute(string.format("ln -s %s %s", sys.shq(victim), sys.shq(out .. "/config.json")))
    local model = loom.models.hf.from_pretrained("spec/fixtures/hf_llama_gqa")
    loom.models.hf.save_pretrained(model, out)
    assert.equal("precious", sys.read(victim))
    assert.equal("file", fs.mode(out .. "/config.json"))
    assert.equal(16, select(2, loom.models.hf.read_config(out)).dim)
  end)

  it("a log (fs.open_log, train.lua's --log) is never opened through a link, on a FIFO or a directory", function()
    local victim, link, fifo = d .. "/victim3", d .. "/log-link.jsonl", d .. "/log-fifo"
    sys.write(victim, "precious")
    os.execute(string.format("ln -s %s %s && mkfifo %s", sys.shq(victim), sys.shq(link), sys.shq(fifo)))
    for _, c in ipairs { { link, "it is a link %(not followed%)" }, { fifo, "a FIFO with no reader" },
                         { d, "Is a directory" } } do
      local h, err = fs.open_log(c[1], false)
      assert.is_nil(h, c[1])
      assert.matches(c[2], err)
    end
    assert.equal("precious", sys.read(victim))
    local out = sys.output("luajit examples/train.lua --steps 1 --log " .. sys.shq(link) .. " 2>&1", 2)
    assert.matches("train.lua: error: %-%-log: cannot open .*log%-link.jsonl: it is a link %(not followed%)", out)
    assert.equal("precious", sys.read(victim))
  end)

  it("a log file is truncated, or appended to", function()
    local path = d .. "/plain.jsonl"
    sys.write(path, "old\n")
    local h = assert(fs.open_log(path, true))
    h:write("a", 1, "\n"):flush()
    h:close()
    assert.equal("old\na1\n", sys.read(path))
    h = assert(fs.open_log(path, false))
    h:write("new\n")
    h:close()
    assert.equal("new\n", sys.read(path))
  end)

  it("a link planted at PATH itself is replaced, not written through", function()
    local victim, path = d .. "/victim2", d .. "/linked.loom"
    sys.write(victim, "precious")
    os.execute(string.format("ln -s %s %s", sys.shq(victim), sys.shq(path)))
    loom.save({ v = 2 }, path)
    assert.equal("precious", sys.read(victim))
    assert.equal("file", fs.mode(path))
  end)
end)

-- checkpoint cases run in a child luajit: a checkpoint starts MPI, which
-- must not run in this process (a loomrun child of a later spec breaks)
local CHILD = [[
  local ckpt, fs = require('loom.distributed.checkpoint'), require('loom.fs')
  local function err_of(fn, ...) local ok, e = pcall(fn, ...) assert(not ok, 'expected an error') return tostring(e) end
  local function has(msg, ...)
    for _, s in ipairs { ... } do assert(msg:find(s, 1, true), 'expected <' .. s .. '> in: ' .. msg) end
  end
  local function load_w(dir, n) local sd = { w = loom.zeros(n) } ckpt.load(sd, dir) return sd.w:totable() end
]]
local function in_child(code, ...)
  local rc, out = X.child(CHILD .. string.format(code, ...) .. "\nprint('child ok')")
  assert(rc == 0 and out:find("child ok", 1, true), string.format("the child ended with exit %d:\n%s", rc, out))
  return out
end

describe("checkpoint directories", function()
  local d = sys.tmpdir()

  it("a save refuses a directory holding files that are not loom's, and leaves them and the checkpoint", function()
    local dir = d .. "/withlog"
    in_child([[
      ckpt.save({ w = loom.ones(4) }, %q)
      local f = assert(io.open(%q, 'w')) f:write('step 1\n') f:close()
      has(err_of(ckpt.save, { w = loom.zeros(4) }, %q), 'withlog', 'train.log', "not loom's", 'directory of its own')
      assert(load_w(%q, 4)[1] == 1)]], dir, dir .. "/train.log", dir, dir)
    assert.equal("step 1\n", sys.read(dir .. "/train.log"))
  end)

  it("one job at a time: a save while another holds DIR.lock is refused, naming the lock", function()
    local dir = d .. "/locked"
    in_child([[
      ckpt.save({ w = loom.ones(2) }, %q)
      local h = assert(fs.lock(%q))
      has(err_of(ckpt.save, { w = loom.zeros(2) }, %q), 'locked.lock', 'another job')
      assert(load_w(%q, 2)[1] == 1)
      fs.unlock(h)
      ckpt.save({ w = loom.full({ 2 }, 3) }, %q)
      assert(load_w(%q, 2)[2] == 3)]], dir, dir .. ".lock", dir, dir, dir, dir)
  end)

  it("two processes saving into one directory at once: the directory always ends as one whole checkpoint", function()
    local dir = d .. "/race"
    in_child("ckpt.save({ w = loom.zeros(64), id = 0 }, %q)", dir)
    local prelude = "package.path = " .. string.format("%q", package.path) .. "; loom = require('loom'); "
    local job = prelude .. [[
      local ckpt = require('loom.distributed.checkpoint')
      local id, dir, ok_n, busy = tonumber(arg[1]), arg[2], 0, 0
      math.randomseed(id)
      for i = 1, 25 do
        local ok, err = pcall(ckpt.save, { w = loom.full({ 64 }, id), id = id }, dir)
        if ok then ok_n = ok_n + 1
        elseif tostring(err):find('another job holds the lock', 1, true) then busy = busy + 1
        else io.stderr:write('unexpected: ', tostring(err), '\n') os.exit(2) end
        os.execute('sleep 0.0' .. math.random(1, 9))   -- (a pause of its own, so the jobs interleave)
      end
      print(string.format('job %d: %d saved, %d refused', id, ok_n, busy))]]
    sys.write(d .. "/job.lua", job)
    local cmd = string.format("luajit %s 1 %s & luajit %s 2 %s & wait", sys.shq(d .. "/job.lua"), sys.shq(dir),
                              sys.shq(d .. "/job.lua"), sys.shq(dir))
    local rc, out = sys.sh(cmd)
    assert.equal(0, rc, out)
    assert.is_nil(out:find("unexpected", 1, true), out)
    local saved = 0
    for n in out:gmatch("(%d+) saved") do saved = saved + tonumber(n) end
    assert.is_true(saved >= 25, out)   -- (at least one job's worth went through)
    local got = in_child([[
      assert(ckpt.verify(%q))
      local sd = { w = loom.zeros(64), id = -1 }
      ckpt.load(sd, %q)
      assert(sd.id == 1 or sd.id == 2, 'id ' .. tostring(sd.id))
      assert((sd.w - sd.id):abs():max():item() == 0, 'w is not all ' .. sd.id)
      print('id ' .. sd.id)]], dir, dir)
    assert.truthy(got:find("id [12]"), got)
    assert.is_false(sys.exists(dir .. ".tmp-ckpt"))
  end)
end)
