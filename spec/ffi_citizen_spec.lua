-- ffi_citizen_spec.lua: loom inside someone else's program. A script that
-- declares the common libc functions (and FILE, and readline's) through
-- ffi.cdef with types of its own, before or after require("loom"), then
-- trains, saves, loads, writes safetensors and tokenizes: loom declares
-- libc under its own names (loom_open asm("open"), lua/loom/posix.lua), so
-- neither side breaks the other. Each script runs in a child process.
local sys = require("support.sys")

-- declarations as a user's program might write them: other types, other
-- signatures, the same names loom calls
local FOREIGN = [[
local ffi = require("ffi")
ffi.cdef [=[
  struct my_ts { long long s; long long ns; };
  struct FILE { int mine; };
  typedef struct FILE FILE;
  int clock_gettime(int clock, struct my_ts *ts);
  int open(const char *path, int flags);
  long read(int fd, char *buf, unsigned long n);
  long write(int fd, const char *buf, unsigned long n);
  int close(int fd);
  int getpid(void);
  int isatty(int fd);
  int setenv(const char *k, const char *v, int o);
  char *strerror(int e);
  void *malloc(unsigned long n);
  void free(void *p);
  int fflush(FILE *f);
  int fnmatch(const char *p, const char *s, int f);
  char *readline(const char *prompt);
]=]
local ts = ffi.new("struct my_ts")
assert(ffi.C.clock_gettime(1, ts) == 0)
]]

-- what loom does inside that program: a collection (the collector's clock),
-- a few training steps, save and load, safetensors, a tokenizer, a plan
-- matched by fnmatch, the REPL's line reader module
local WORK = [[
local loom = require("loom")
collectgarbage()
loom.manual_seed(1)
local model = loom.models.transformer.new { vocab_size = 16, dim = 16, n_layers = 1, n_heads = 2, max_seq_len = 8 }
local opt = loom.optim.AdamW(model:parameters(), { lr = 1e-2 })
for _ = 1, 3 do
  local x = loom.randint(1, 17, { 2, 8 })
  opt:zero_grad()
  loom.F.cross_entropy(model(x), x):backward()
  opt:step()
  collectgarbage()
end
local dir = os.tmpname() os.remove(dir) os.execute("mkdir -p " .. dir)
loom.save({ model = model:state_dict() }, dir .. "/ck.loom")
model:load_state_dict(loom.load(dir .. "/ck.loom").model)
loom.save_safetensors({ w = loom.ones(2, 2) }, dir .. "/w.safetensors")
assert(loom.load_safetensors(dir .. "/w.safetensors").w:sum():item() == 4)
local tok = loom.data.Tokenizer.from_file("spec/fixtures/tokenizers/llama3.json")
assert(#tok:encode("hello world") > 0)
local tp = require("loom.parallel")
assert(tp.fnmatch("wq", "w?"))
require("loom.repl.readline")
os.execute("rm -rf " .. dir)
print("work done")
]]

local function run(code)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write('package.path = "lua/?.lua;lua/?/init.lua;" .. package.path\n', code)
  f:close()
  local rc, out = sys.sh_clean("luajit " .. path)
  os.remove(path)
  return rc, out
end

describe("loom inside another program's FFI declarations", function()
  it("works when the program declares libc its own way first", function()
    local rc, out = run(FOREIGN .. WORK)
    assert.equal(0, rc, out)
    assert.matches("work done", out, 1, true)
  end)

  it("works, and the program's own declarations too, when it declares them after loom", function()
    local rc, out = run(WORK .. FOREIGN .. 'print("after: ok")\n')
    assert.equal(0, rc, out)
    assert.matches("after: ok", out, 1, true)
  end)
end)
