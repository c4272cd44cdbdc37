-- hostile_files_spec.lua: safetensors files and indexes made by an attacker
-- or damaged by another process (issue 26). Cases that crashed or stalled
-- the reader before run in a child luajit: each must end in a Lua error
-- naming the file and the rule it broke, never a signal. Every rule of the
-- format is enforced as the reference implementation does.
local ffi = require("ffi")
local loom = require("loom")
local X = require("support.misuse")
local sys = require("support.sys")

local d = sys.tmpdir()
local function u64(n) return ffi.string(ffi.new("uint64_t[1]", n), 8) end
local function raw(name, header, data)
  local p = d .. "/" .. name
  sys.write(p, u64(#header) .. header .. (data or ""))
  return p
end
local errmsg, has = X.error_of, X.has
local function entry(name, dtype, shape, b, e)
  return string.format('"%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}', name, dtype, shape, b, e)
end

describe("hostile safetensors files in a child process", function()
  it("a file truncated by another process after it was opened: a Lua error, not SIGBUS", function()
    local p = d .. "/shrink.safetensors"
    X.check_child(string.format([[
      local st = require('loom.safetensors')
      loom.save_safetensors({ w = loom.ones(256, 1024) }, %q)
      local r = st.open(%q)
      os.execute('truncate -s 200 %s')
      r:read('w')]], p, p, p), { "shrink.safetensors", "tensor w", "shrank" }, 1)
  end)

  it("a header nested 100000 deep: refused at depth 64, no stack overflow", function()
    local deep = string.rep("[", 100000) .. string.rep("]", 100000)
    local h = '{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"junk":' .. deep .. "}}"
    local p = raw("deep.safetensors", h, "\0\0\0\0")
    X.check_child(string.format("loom.load_safetensors(%q)", p), { "deep.safetensors", "nests deeper than 64" }, 1)
  end)

  it("an index that names itself, or two that name each other, is refused", function()
    sys.write(d .. "/self.json", '{"weight_map":{"x":"self.json"}}')
    sys.write(d .. "/a.json", '{"weight_map":{"x":"b.json"}}')
    sys.write(d .. "/b.json", '{"weight_map":{"x":"a.json"}}')
    X.check_child(string.format("loom.load_safetensors(%q)", d .. "/self.json"), { "self.json", "an index names safetensors files only" }, 1)
    X.check_child(string.format("loom.load_safetensors(%q)", d .. "/a.json"), { "a.json", "b.json", "safetensors files only" }, 1)
  end)

  it("an index over 16 MB is refused by its size before it is parsed", function()
    sys.write(d .. "/big.json", '{"weight_map":{"x":"' .. string.rep("a", 17000000) .. '"}}')
    X.check_child(string.format("loom.load_safetensors(%q)", d .. "/big.json"), { "big.json", "over the limit of 16000000" }, 1)
  end)

  it("an index nested 100000 deep is refused by its depth", function()
    sys.write(d .. "/deep.json", '{"weight_map":' .. string.rep("[", 100000) .. string.rep("]", 100000) .. "}")
    X.check_child(string.format("loom.load_safetensors(%q)", d .. "/deep.json"), { "deep.json", "nests deeper than 64" }, 1)
  end)

  it("a FIFO planted where a file is read (safetensors, index, loom file, config, checkpoint shard) fails at once", function()
    os.execute("mkdir -p " .. sys.shq(d .. "/cfg"))
    for _, f in ipairs { "p.safetensors", "p.json", "p.loom", "cfg/config.json" } do os.execute("mkfifo " .. sys.shq(d .. "/" .. f)) end
    local calls = {
      { string.format("loom.load_safetensors(%q)", d .. "/p.safetensors"), "cannot seek" },
      { string.format("loom.load_safetensors(%q)", d .. "/p.json"), "is a named pipe, not a regular file" },
      { string.format("loom.load(%q)", d .. "/p.loom"), "is a named pipe, not a regular file" },
      { string.format("loom.models.hf.read_config(%q)", d .. "/cfg"), "is a named pipe, not a regular file" },
    }
    local ck = d .. "/fifock"   -- (made in a child: a checkpoint starts MPI, not for this process)
    assert.equal(0, (X.child(string.format("require('loom.distributed.checkpoint').save({ w = loom.ones(2) }, %q)", ck))))
    os.remove(ck .. "/rank00000.shards")
    os.execute("mkfifo " .. sys.shq(ck .. "/rank00000.shards"))
    calls[#calls + 1] = { string.format("require('loom.distributed.checkpoint').load({ w = loom.zeros(2) }, %q)", ck),
                          "rank00000.shards is a named pipe" }
    calls[#calls + 1] = { string.format("require('loom.distributed.checkpoint').verify(%q)", ck), "is a named pipe" }
    for _, c in ipairs(calls) do
      local rc, out = X.child(c[1], "timeout -s KILL 30")
      assert.equal(1, rc, out)   -- (137 had it stalled)
      has(out, "luajit: ", c[2])
    end
  end)

  it("200000 zero-size entries parse, all of them, with their names", function()
    local parts = {}
    for i = 1, 200000 do parts[i] = entry(string.format("t%06d", i), "F32", "0", 0, 0) end
    local p = raw("many.safetensors", "{" .. table.concat(parts, ",") .. "}")
    local r = require("loom.safetensors").open(p)
    assert.equal(200000, #r.names)
    assert.equal("t000001", r.names[1])
    assert.same({ 0 }, r.tensors.t199999.shape)
    r:close()
  end)
end)

describe("every rule of the safetensors format", function()
  local eight = string.rep("\0", 8)
  local cases = {
    { "a null inside a shape", "{" .. entry("x", "F32", "2,null", 0, 8) .. "}", "tensor x: shape[2] is null, not a size" },
    { "a negative dim", "{" .. entry("x", "F32", "-2", 0, 8) .. "}", "tensor x: shape[1] is -2, not a size" },
    { "a fractional dim", "{" .. entry("x", "F32", "2.0", 0, 8) .. "}", "tensor x: shape[1] is 2.0, not a size" },
    { "a dim in exponent form", "{" .. entry("x", "F32", "2e0", 0, 8) .. "}", "shape[1] is 2e0" },
    { "a dim past 2^53", "{" .. entry("x", "F32", "99999999999999999999", 0, 8) .. "}", "shape[1] is over 2^53" },
    { "a tensor named twice", "{" .. entry("x", "F32", "1", 0, 4) .. "," .. entry("x", "F32", "1", 4, 8) .. "}",
      "the tensor x appears twice" },
    { "a field named twice", '{"x":{"dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8]}}',
      "tensor x: the key shape appears twice" },
    { "__metadata__ twice", '{"__metadata__":{},"__metadata__":{},' .. entry("x", "F32", "2", 0, 8) .. "}",
      "__metadata__ appears twice" },
    { "a metadata key twice", '{"__metadata__":{"k":"a","k":"b"},' .. entry("x", "F32", "2", 0, 8) .. "}",
      "__metadata__[k] appears twice" },
    { "bytes owned by no tensor at the end", "{" .. entry("x", "F32", "1", 0, 4) .. "}",
      "bytes 4 to 8 of the data belong to no tensor" },
    { "a gap between tensors", "{" .. entry("x", "F32", "1", 0, 4) .. "," .. entry("y", "I8", "0", 8, 8) .. "}",
      "bytes 4 to 8 of the data belong to no tensor" },
    { "overlapping tensors", "{" .. entry("a", "F32", "2", 0, 8) .. "," .. entry("b", "F32", "1", 4, 8) .. "}",
      "tensors a and b overlap" },
    { "data_offsets of three", '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', "data_offsets holds more" },
    { "a header that is not UTF-8", '{"x\255":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "not UTF-8" },
    { "a lone surrogate escape", '{"x\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "lone surrogate" },
    { "a control byte in a name", '{"x\1":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "control byte" },
    { "a shape of 2^60 bytes", "{" .. entry("x", "F32", "1073741824,1073741824,1073741824", 0, 8) .. "}",
      "more than 2^53 bytes" },
  }
  for i, c in ipairs(cases) do
    it(c[1] .. " is refused (the reference refuses it)", function()
      local p = raw("rule" .. i .. ".safetensors", c[2], eight)
      has(errmsg(loom.load_safetensors, p), "rule" .. i .. ".safetensors", c[3])
    end)
  end

  it("BOOL bytes other than 0 and 1 are refused; 0 and 1 load", function()
    local p = raw("bool.safetensors", "{" .. entry("b", "BOOL", "3", 0, 3) .. "}", "\1\0\1")
    assert.same({ true, false, true }, loom.load_safetensors(p).b:totable())
    p = raw("bool2.safetensors", "{" .. entry("b", "BOOL", "3", 0, 3) .. "}", "\1\255\1")
    has(errmsg(loom.load_safetensors, p), "bool2.safetensors", "tensor b", "BOOL byte is 255, not 0 or 1")
  end)

  it("escaped names and unknown fields read as the reference reads them", function()
    local h = '{"a\\u00e9\\n":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":{"k":[1,2.5,null,true]}},'
        .. '"__metadata__":{"format":"pt"}}'
    local p = raw("escaped.safetensors", h, "\0\0\128\63")
    local t = loom.load_safetensors(p)
    assert.same({ 1 }, t["a\195\169\n"]:totable())
    local meta = require("loom.safetensors").metadata(p)
    assert.same({ format = "pt" }, meta)
  end)
end)
