-- module_to_spec.lua: where a module's tensors live: Module:to and its
-- shorthands, and the meta-device flow (build on meta, to_empty,
-- init_weights) that equals an ordinary build bit for bit.
local loom = require("loom")
local nn = loom.nn
local tr = loom.models.transformer
local sys = require("support.sys")

local CFG = { vocab_size = 40, dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, max_seq_len = 16 }

local function same_state(a, b)
  local sa, sb = a:state_dict(), b:state_dict()
  local n = 0
  for k, v in pairs(sa) do
    assert.is_not_nil(sb[k], k)
    assert.are.equal(v.dtype, sb[k].dtype, k)
    assert.are.equal(0, (v:to("f64") - sb[k]:to("f64")):abs():max():item(), k)
    n = n + 1
  end
  return n
end

describe("Module:to", function()
  it("casts floating point parameters and buffers, keeps requires_grad, and round trips", function()
    loom.manual_seed(1)
    local m = tr.new(CFG)
    local ref = tr.new(CFG)
    ref:load_state_dict(m:state_dict())
    m:to("f64")
    for _, p in ipairs(m:parameters()) do assert.are.equal("f64", p.dtype) assert.is_true(p.requires_grad) end
    assert.are.equal("f64", m.rope_cos.dtype)
    m:float()
    assert.are.equal(3 + 2 * 9, same_state(m, ref))
  end)

  it("keeps autograd working after a move", function()
    local lin = nn.Linear(3, 2):double()
    local y = lin(loom.ones({ 4, 3 }, { dtype = "f64" })):sum()
    y:backward()
    assert.are.equal("f64", lin.weight.grad.dtype)
    assert.are.same({ 4, 4, 4 }, lin.weight.grad:totable()[1])
  end)

  it("keeps tied weights tied", function()
    local m = tr.new { vocab_size = 40, dim = 32, n_layers = 1, n_heads = 4, max_seq_len = 8, tie_embeddings = true }
    m:to("f64")
    assert.are.equal(require("ffi").cast("void*", m.output.weight), require("ffi").cast("void*", m.tok_embeddings.weight))
  end)

  it("rejects what it cannot do, naming it", function()
    local lin = nn.Linear(2, 2)
    assert.has_error(function() lin:to("i64") end)
    assert.has_error(function() lin:to("tpu") end)
    local ok, e = pcall(function() nn.Linear(2, 2, { device = "meta" }):to("cpu") end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("weight is on the meta device", 1, true), tostring(e))
    ok, e = pcall(function() lin:to_empty("cpu") end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("to_empty: weight is on cpu", 1, true), tostring(e))
  end)
end)

describe("building on the meta device", function()
  it("takes no memory, then materialises to the ordinary model bit for bit", function()
    loom.manual_seed(7)
    local ref = tr.new(CFG)
    local before = tonumber(loom.C.lm_allocated_bytes())
    loom.manual_seed(7)
    local m = loom.device("meta"):use(tr.new, CFG)
    assert.are.equal(before, tonumber(loom.C.lm_allocated_bytes()))
    assert.are.equal("meta", m.layers[1].attention.wq.weight.device)
    m:to_empty("cpu")
    loom.manual_seed(7)
    m:init_weights()
    same_state(m, ref)
    assert.are.equal(0, (m.rope_sin - ref.rope_sin):abs():max():item())
    local ids = loom.randint(1, 41, { 2, 8 })
    assert.are.equal(0, (m(ids) - ref(ids)):abs():max():item())
  end)

  it("keeps the rotary tables out of the state and moves them with the model", function()
    local m = tr.new(CFG)
    assert.is_nil(m:state_dict().rope_cos)
    m:to("f64")
    assert.are.equal("f64", m.rope_cos.dtype)
  end)
end)

describe("loom.device(d):use(fn)", function()
  it("makes tensors on d inside fn only, and restores it after an error", function()
    assert.are.equal("meta", loom.device("meta"):use(function() return loom.zeros(2) end).device)
    assert.are.equal("cpu", loom.zeros(2).device)
    assert.has_error(function() loom.device("meta"):use(function() error("x") end) end)
    assert.are.equal("cpu", loom.ones(1).device)
    assert.has_error(function() loom.device("gpu") end)
  end)
end)

describe("the runtime's settings", function()
  it("show what this build is", function()
    local s
    local real = io.write
    io.write = function() end   -- luacheck: ignore 122 (silenced while it prints)
    s = loom.show_config()
    io.write = real             -- luacheck: ignore 122
    assert.truthy(s:find("OpenBLAS", 1, true))
    assert.truthy(s:find("threads: %d+"))
    assert.truthy(s:find("OPENBLAS_THREAD_TIMEOUT", 1, true))
  end)

  -- the environment variable `name` as a child sees it after require("loom")
  local function env_in_child(name, env)
    local _, out = sys.luajit(string.format("require('loom') io.write(os.getenv(%q) or 'unset')", name), env)
    return out
  end

  it("let OpenBLAS's workers sleep between GEMMs unless the user says otherwise", function()
    assert.are.equal("4", env_in_child("OPENBLAS_THREAD_TIMEOUT", "env -u OPENBLAS_THREAD_TIMEOUT"))
    assert.are.equal("20", env_in_child("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_THREAD_TIMEOUT=20"))
  end)

  -- the flags of real CPUs (shortened to what decides): Sapphire Rapids,
  -- Skylake-SP, Haswell, Zen 3, and a Core 2 that OpenBLAS names itself
  it("name OpenBLAS's core from the CPU's flags", function()
    local core = require("loom.lib").blas_coretype
    local function info(vendor, flags)
      return "processor\t: 0\nvendor_id\t: " .. vendor .. "\nflags\t\t: fpu sse2 " .. flags .. "\n\nprocessor\t: 1\n"
    end
    local avx512 = "avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl"
    assert.are.equal("Cooperlake", core(info("GenuineIntel", avx512 .. " avx512_bf16 amx_bf16")))
    assert.are.equal("SkylakeX", core(info("GenuineIntel", avx512)))
    assert.are.equal("Haswell", core(info("GenuineIntel", "avx avx2 fma")))
    assert.are.equal("Zen", core(info("AuthenticAMD", "avx avx2 fma")))
    assert.is_nil(core(info("GenuineIntel", "ssse3")))
    assert.is_nil(core(""))
    local f = io.open("/proc/cpuinfo", "rb")
    local here = core(f:read("*a")) or "unset"
    f:close()
    -- what loom sets before OpenBLAS loads on this machine; the user's wins
    assert.are.equal(here, env_in_child("OPENBLAS_CORETYPE", "env -u OPENBLAS_CORETYPE"))
    assert.are.equal("Haswell", env_in_child("OPENBLAS_CORETYPE", "OPENBLAS_CORETYPE=Haswell"))
  end)

  it("set the f32 matmul precision, as PyTorch's", function()
    loom.set_float32_matmul_precision("high")
    assert.are.equal("high", loom.get_float32_matmul_precision())
    loom.set_float32_matmul_precision("highest")
    assert.are.equal("highest", loom.get_float32_matmul_precision())
    assert.has_error(function() loom.set_float32_matmul_precision("medium-ish") end)
  end)
end)
