-- safetensors_spec.lua: loom.load_safetensors / loom.save_safetensors and
-- Hugging Face checkpoints (loom.models.hf). Reads files written by the
-- reference `safetensors` package (spec/fixtures, made by
-- scripts/make_safetensors_fixtures.py), round-trips every dtype, reads
-- blocks, rejects truncated and corrupt files with errors naming the file
-- and the tensor, and checks the logits of tiny Llama (GQA and tied) and
-- GPT-2 checkpoints against a numpy forward of the HF models.
-- Tolerance for logits: f32, max abs error 1e-4 (observed about 3e-6).
local ffi = require("ffi")
local loom = require("loom")
local st = require("loom.safetensors")
local hf = loom.models.hf

local FIX = "spec/fixtures/"
local TOL = 1e-4

local sys = require("support.sys")
local X = require("support.misuse")
local tmpdir, read, write = sys.tmpdir, sys.read, sys.write
local function u64(n) return ffi.string(ffi.new("uint64_t[1]", n), 8) end
-- a file from a header string and data bytes, as the format lays it out
local function raw(path, header, data)
  write(path, u64(#header) .. header .. (data or ""))
  return path
end
local errmsg, has = X.error_of, X.has
local SIZE = { f32 = 4, f64 = 8, bf16 = 2, f16 = 2, i32 = 4, i64 = 8, bool = 1 }
local function bytes(t)
  local c = t:contiguous()
  return ffi.string(c:data_ptr(), c:numel() * SIZE[c.dtype])
end
local function same_tensor(a, b)
  assert.is_true(loom.is_tensor(b))
  assert.equal(a.dtype, b.dtype)
  assert.same(a:size(), b:size())
  assert.equal(bytes(a), bytes(b))
end
local function max_err(a, b) return (a:to("f64") - b:to("f64")):abs():max():item() end

describe("safetensors files", function()
  it("reads every dtype the reference writer wrote, with its metadata", function()
    local t = loom.load_safetensors(FIX .. "dtypes.safetensors")
    local names = {}
    for k in pairs(t) do names[#names + 1] = k end
    table.sort(names)
    assert.same({ "bf16", "bool", "empty", "f16", "f32", "f64", "i32", "i64", "scalar" }, names)
    assert.equal("f32", t.f32.dtype)
    assert.same({ 2, 3 }, t.f32:size())
    local f = t.f32:totable()
    assert.same({ 1.5, -2.25, 3 }, f[1])
    assert.equal(0, f[2][1])
    assert.equal(-1 / 0, 1 / f[2][2])   -- -0.0 kept
    assert.is_true(math.abs(f[2][3] - 1e-3) < 1e-10)
    assert.same({ 1 / 3, -1e300 }, t.f64:totable())
    assert.equal("bf16", t.bf16.dtype)
    assert.same({ { 1, -2.5 }, { 0.15625, -1024 } }, t.bf16:to("f32"):totable())
    assert.same({ 0.5, -65504, 6.103515625e-05 }, t.f16:to("f32"):totable())
    assert.same({ -2147483648, 7, 2147483647 }, t.i32:totable())
    assert.equal("i64", t.i64.dtype)
    assert.same({ 2, 1 }, t.i64:size())
    assert.equal(2 ^ 40 + 3, tonumber(ffi.cast("int64_t *", t.i64:data_ptr())[0]))
    assert.equal(-5, tonumber(ffi.cast("int64_t *", t.i64:data_ptr())[1]))
    assert.same({ true, false, true }, t.bool:totable())
    assert.equal(0, t.scalar:dim())
    assert.equal(4, t.scalar:item())
    assert.same({ 0, 3 }, t.empty:size())
    local meta = st.metadata(FIX .. "dtypes.safetensors")
    assert.same({ format = "pt", note = "loom fixture" }, meta)
  end)

  it("round-trips every dtype, scalars, empty and non-contiguous tensors, and metadata", function()
    local d = tmpdir()
    loom.manual_seed(5)
    local src = {
      f32 = loom.randn({ 3, 4 }), f64 = loom.randn({ 5 }, { dtype = "f64" }),
      bf16 = loom.randn({ 2, 3, 2 }):to("bf16"), f16 = loom.randn({ 7 }):to("f16"),
      i32 = loom.randint(-1000, 1000, { 4, 2 }, { dtype = "i32" }),
      i64 = loom.tensor({ 2 ^ 50 + 1, -7, 0 }, { dtype = "i64" }),
      bool = loom.rand({ 9 }):ge(0.5), scalar = loom.tensor(2.5), empty = loom.zeros({ 0, 4 }),
      transposed = loom.randn({ 3, 5 }):t(),
    }
    st.save(src, d .. "/a.safetensors", { metadata = { who = "loom", ["k e y"] = "v\"al" } })
    local back = loom.load_safetensors(d .. "/a.safetensors")
    for k, v in pairs(src) do same_tensor(v, back[k]) end
    local n = 0
    for _ in pairs(back) do n = n + 1 end
    assert.equal(10, n)
    local meta, entries = st.metadata(d .. "/a.safetensors")
    assert.same({ who = "loom", ["k e y"] = "v\"al" }, meta)
    -- the data starts 8-byte aligned, and every tensor at a multiple of its element size
    local s = read(d .. "/a.safetensors")
    assert.equal(0, (8 + tonumber(ffi.cast("uint64_t *", s:sub(1, 8))[0])) % 8)
    local esz = { F32 = 4, F64 = 8, BF16 = 2, F16 = 2, I32 = 4, I64 = 8, BOOL = 1 }
    for name, e in pairs(entries) do assert.equal(0, e.begin % esz[e.dtype], name) end
  end)

  it("writes the bytes the format specifies", function()
    local d = tmpdir()
    st.save({ x = loom.tensor({ 1, 2 }) }, d .. "/x.safetensors")
    local h = '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    h = h .. string.rep(" ", (8 - (8 + #h) % 8) % 8)
    local data = ffi.string(ffi.new("float[2]", { 1, 2 }), 8)
    assert.equal(u64(#h) .. h .. data, read(d .. "/x.safetensors"))
    assert.is_nil(io.open(d .. "/x.safetensors.tmp", "rb"))
  end)

  it("loads a subset, converts floating dtypes only, and keeps integers", function()
    local t = loom.load_safetensors(FIX .. "dtypes.safetensors", { names = { "f32", "i64", "bf16" }, dtype = "f64" })
    local n = 0
    for _ in pairs(t) do n = n + 1 end
    assert.equal(3, n)
    assert.equal("f64", t.f32.dtype)
    assert.equal("f64", t.bf16.dtype)
    assert.equal("i64", t.i64.dtype)
    assert.same({ { 1, -2.5 }, { 0.15625, -1024 } }, t.bf16:totable())
    has(errmsg(loom.load_safetensors, FIX .. "dtypes.safetensors", { names = { "f32", "nope" } }),
        "dtypes.safetensors", "has no tensor nope")
    has(errmsg(loom.load_safetensors, FIX .. "dtypes.safetensors", { names = "f32" }), "names")
    has(errmsg(loom.load_safetensors, FIX .. "dtypes.safetensors", { dtype = "f8" }), "f8")
    has(errmsg(loom.load_safetensors, FIX .. "dtypes.safetensors", { placements = { loom.distributed.Shard(1) } }),
        "placements given without a mesh")
  end)

  it("reads blocks: rows, column runs and inner blocks equal slices of the whole", function()
    local r = st.open(FIX .. "hf_llama_gqa/model.safetensors")
    local name = "model.layers.0.mlp.down_proj.weight"   -- 16 x 24
    local full = r:read(name)
    assert.same({ 16, 24 }, full:size())
    for _, b in ipairs { { { 4, 0 }, { 8, 24 } }, { { 0, 12 }, { 16, 12 } }, { { 3, 5 }, { 7, 11 } },
                         { { 15, 23 }, { 1, 1 } }, { { 2, 0 }, { 0, 24 } } } do
      local got = r:read(name, b[1], b[2])
      local want = full:narrow(1, b[1][1] + 1, b[2][1]):narrow(2, b[1][2] + 1, b[2][2])
      same_tensor(want:contiguous(), got)
    end
    has(errmsg(r.read, r, name, { 10, 0 }, { 8, 24 }), "outside dim 1 of size 16")
    r:close()
    local d = tmpdir()
    local cube = loom.arange(0, 60):reshape(3, 4, 5):to("i32")
    st.save({ cube = cube }, d .. "/c.safetensors")
    r = st.open(d .. "/c.safetensors")
    same_tensor(cube:narrow(2, 2, 2):narrow(3, 3, 3):contiguous(), r:read("cube", { 0, 1, 2 }, { 3, 2, 3 }))
    same_tensor(cube:narrow(1, 2, 2):narrow(2, 2, 3):contiguous(), r:read("cube", { 1, 1, 0 }, { 2, 3, 5 }))
    r:close()
  end)

  it("loads into the tensors of a model's state_dict (opts.model)", function()
    local tr = loom.models.transformer
    local cfg = { vocab_size = 11, dim = 8, n_layers = 1, n_heads = 2, max_seq_len = 8 }
    loom.manual_seed(1)
    local a = tr.new(cfg)
    loom.manual_seed(2)
    local b = tr.new(cfg)
    local d = tmpdir()
    st.save(a:state_dict(), d .. "/m.safetensors")
    b:load_state_dict(loom.load_safetensors(d .. "/m.safetensors", { model = b }))
    for _, kv in ipairs(a:named_parameters()) do
      same_tensor(kv[2], b:get_submodule(kv[1]:match("^(.*)%.[^.]+$"))[kv[1]:match("[^.]+$")])
    end
    local small = tr.new({ vocab_size = 11, dim = 8, n_layers = 1, n_heads = 2, max_seq_len = 8, ffn_dim = 8 })
    has(errmsg(loom.load_safetensors, d .. "/m.safetensors", { model = small }),
        "tensor layers.1.feed_forward.w1.weight has shape", "the model's has 8x8")
  end)
end)

describe("safetensors errors", function()
  local d = tmpdir()
  local ok_header = '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
  local eight = string.rep("\0", 8)

  it("a missing, empty or short file", function()
    has(errmsg(loom.load_safetensors, d .. "/none.safetensors"), "none.safetensors", "cannot open")
    write(d .. "/short", "abc")
    has(errmsg(loom.load_safetensors, d .. "/short"), "short", "truncated (3 bytes")
    has(errmsg(loom.load_safetensors, 42), "path", "a file name")
  end)

  it("header lengths out of bounds", function()
    write(d .. "/huge", u64(2 ^ 40) .. "{}")
    has(errmsg(loom.load_safetensors, d .. "/huge"), "huge", "exceeds the limit")
    write(d .. "/long", u64(100) .. ok_header)
    has(errmsg(loom.load_safetensors, d .. "/long"), "long", "truncated", "says 100 bytes")
    write(d .. "/zero", u64(0))
    has(errmsg(loom.load_safetensors, d .. "/zero"), "zero", "too small")
  end)

  it("corrupt headers name the file and the tensor", function()
    local cases = {
      { '{"x": ', "not valid JSON" },
      { '[1, 2]', "not a JSON object" },
      { '{"x":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}}', "tensor x: unknown dtype F33" },
      { '{"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}}', "tensor x: shape[1] is -1" },
      { '{"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}}', "tensor x: shape[1] is 1.5" },
      { '{"x":{"dtype":"F32","shape":[2]}}', "tensor x: data_offsets" },
      { '{"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', "tensor x: data_offsets" },
      { '{"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]}}', "tensor x: data_offsets [0, 8] hold 8 bytes, "
        .. "but dtype F32 and shape 2x2 need 16" },
      { '{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', "tensor x: its data (bytes 0 to 16", "truncated" },
      { '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}}',
        "tensors a and b overlap" },
      { '{"__metadata__":{"k":1},' .. ok_header:sub(2), "__metadata__[k] is a number" },
      { '{"__metadata__":"x",' .. ok_header:sub(2), "__metadata__ is not an object" },
      { ok_header .. " x", "trailing bytes" },
    }
    for i, c in ipairs(cases) do
      local p = raw(d .. "/bad" .. i .. ".safetensors", c[1], eight)
      has(errmsg(loom.load_safetensors, p), "bad" .. i .. ".safetensors", unpack(c, 2))
    end
  end)

  it("a tensor of a dtype loom lacks is an error only when asked for", function()
    local p = raw(d .. "/u8.safetensors",
                  '{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                  .. '"u":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',
                  eight)
    has(errmsg(loom.load_safetensors, p), "u8.safetensors", "tensor u has dtype U8", "loom does not have")
    assert.same({ 0 }, loom.load_safetensors(p, { names = { "x" } }).x:totable())
  end)

  it("a truncated copy of a real file names the file and a tensor", function()
    local s = read(FIX .. "hf_llama_gqa/model.safetensors")
    local n = tonumber(ffi.cast("uint64_t *", s:sub(1, 8))[0])
    for _, cut in ipairs { 5, 8 + math.floor(n / 2), #s - 100 } do
      write(d .. "/cut.safetensors", s:sub(1, cut))
      local msg = errmsg(loom.load_safetensors, d .. "/cut.safetensors")
      has(msg, "cut.safetensors", "truncated")
      if cut > 8 + n then has(msg, "tensor model.") end
    end
  end)

  it("bad arguments to save", function()
    has(errmsg(st.save, { x = 1 }, d .. "/s.safetensors"), "tensors.x", "a tensor")
    has(errmsg(st.save, { [1] = loom.zeros(1) }, d .. "/s.safetensors"), "tensors", "names")
    has(errmsg(st.save, { __metadata__ = loom.zeros(1) }, d .. "/s.safetensors"), "__metadata__")
    has(errmsg(st.save, { x = loom.zeros(1) }, d .. "/s.safetensors", { metadata = { k = 1 } }), "metadata[k]")
    has(errmsg(st.save, { x = loom.zeros(1) }, nil), "path")
    has(errmsg(st.save, { x = loom.zeros(1) }, d .. "/no/such/dir/s.safetensors"), "cannot open for writing")
  end)
end)

describe("Hugging Face checkpoints", function()
  local function logits_error(model, dir)
    local ref = loom.load_safetensors(FIX .. dir .. "/reference.safetensors")
    local out = loom.no_grad(function() return model(ref.ids + 1) end)
    assert.same(ref.logits:size(), out:size())
    return max_err(out, ref.logits)
  end
  local function copy_fixture(dir, edit)
    local d = tmpdir()
    local t = loom.load_safetensors(FIX .. dir .. "/model.safetensors")
    edit(t)
    st.save(t, d .. "/model.safetensors")
    write(d .. "/config.json", read(FIX .. dir .. "/config.json"))
    return d
  end

  for _, case in ipairs { { "hf_llama_gqa", "llama", "GQA: 4 heads, 2 kv heads" },
                          { "hf_llama_tied", "llama", "tied embeddings, no lm_head" },
                          { "hf_gpt2", "gpt2", "Conv1D, fused c_attn, tied lm_head" } } do
    it(case[1] .. " (" .. case[3] .. "): logits equal numpy's HF forward", function()
      local model, arch = hf.from_pretrained(FIX .. case[1])
      assert.equal(case[2], arch)
      local err = logits_error(model, case[1])
      assert.is_true(err < TOL, case[1] .. ": max abs error " .. err)
      if os.getenv("LOOM_SPEC_VERBOSE") then print(string.format("\n%s: max abs logit error %.3g", case[1], err)) end
    end)
  end

  it("reads the config", function()
    local arch, c = hf.read_config(FIX .. "hf_llama_gqa")
    assert.equal("llama", arch)
    assert.same({ vocab_size = 32, dim = 16, n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 4, ffn_dim = 24,
                  norm_eps = 1e-5, rope_theta = 1000, max_seq_len = 32, tie_embeddings = false, act = "silu",
                  model_type = "llama" }, c)
    local arch2, c2 = hf.read_config(FIX .. "hf_gpt2/model.safetensors")
    assert.equal("gpt2", arch2)
    assert.equal(64, c2.n_inner)
    local d = tmpdir()
    write(d .. "/config.json", '{"model_type": "llama", "rope_scaling": {"rope_type": "dynamic"}}')
    has(errmsg(hf.read_config, d), "rope_scaling: rope_type dynamic is not supported")
    write(d .. "/config.json", '{"model_type": "bert"}')
    has(errmsg(hf.read_config, d), "model_type bert is not supported")
  end)

  it("the q/k un-permutation matters: rows as stored give other logits", function()
    local model = hf.from_pretrained(FIX .. "hf_llama_gqa")
    local raw_w = loom.load_safetensors(FIX .. "hf_llama_gqa/model.safetensors")
    loom.no_grad(function()
      for i = 1, 2 do
        local a = model.layers:at(i).attention
        a.wq.weight:copy_(raw_w["model.layers." .. (i - 1) .. ".self_attn.q_proj.weight"])
        a.wk.weight:copy_(raw_w["model.layers." .. (i - 1) .. ".self_attn.k_proj.weight"])
      end
    end)
    assert.is_true(logits_error(model, "hf_llama_gqa") > 0.05)
  end)

  it("a missing, extra or mis-shaped tensor is an error naming it", function()
    local tr = loom.models.transformer
    local _, cfg = hf.read_config(FIX .. "hf_llama_gqa")
    local model = tr.new(cfg)
    local d = copy_fixture("hf_llama_gqa", function(t) t["model.layers.1.mlp.up_proj.weight"] = nil end)
    has(errmsg(hf.load_weights, model, d), "model.safetensors",
        "missing tensor model.layers.1.mlp.up_proj.weight (for layers.2.feed_forward.w3.weight)")
    d = copy_fixture("hf_llama_gqa", function(t) t["model.layers.2.mlp.up_proj.weight"] = loom.zeros(24, 16) end)
    has(errmsg(hf.load_weights, model, d), "unexpected tensor model.layers.2.mlp.up_proj.weight")
    hf.load_weights(model, d, { strict = false })
    d = copy_fixture("hf_llama_gqa", function(t) t["model.layers.0.self_attn.k_proj.weight"] = loom.zeros(16, 16) end)
    has(errmsg(hf.load_weights, model, d), "mis-shaped tensor model.layers.0.self_attn.k_proj.weight has shape "
        .. "16x16, the model needs 8x16 (for layers.1.attention.wk.weight)")
    -- an untied model and a tied checkpoint: lm_head is missing
    local _, tcfg = hf.read_config(FIX .. "hf_llama_tied")
    tcfg.tie_embeddings = false
    has(errmsg(hf.load_weights, tr.new(tcfg), FIX .. "hf_llama_tied"),
        "missing tensor lm_head.weight (for output.weight)")
    has(errmsg(hf.load_weights, loom.nn.Linear(2, 2), FIX .. "hf_llama_tied"), "model")
  end)

  it("GPT-2 without the transformer. prefix and with attention-mask buffers loads alike", function()
    local d = copy_fixture("hf_gpt2", function(t)
      local renamed = {}
      for k, v in pairs(t) do renamed[k:gsub("^transformer%.", "")] = v end
      for k in pairs(renamed) do t["transformer." .. k] = nil end
      for k, v in pairs(renamed) do t[k] = v end
      t["h.0.attn.bias"] = loom.ones({ 1, 1, 16, 16 })
      t["h.1.attn.masked_bias"] = loom.tensor(-1e4)
    end)
    local err = logits_error(hf.from_pretrained(d), "hf_gpt2")
    assert.is_true(err < TOL, "max abs error " .. err)
  end)

  it("a checkpoint split over files (model.safetensors.index.json) loads alike", function()
    local d = tmpdir()
    local t = loom.load_safetensors(FIX .. "hf_llama_gqa/model.safetensors")
    local parts, map = { {}, {} }, {}
    for k, v in pairs(t) do
      local i = k:find("layers.1.", 1, true) and 2 or 1
      parts[i][k] = v
      map[#map + 1] = string.format("%q: %q", k, "model-0000" .. i .. "-of-00002.safetensors")
    end
    for i = 1, 2 do st.save(parts[i], d .. "/model-0000" .. i .. "-of-00002.safetensors") end
    write(d .. "/model.safetensors.index.json", '{"metadata": {"total_size": 1}, "weight_map": {'
          .. table.concat(map, ", ") .. "}}")
    write(d .. "/config.json", read(FIX .. "hf_llama_gqa/config.json"))
    local err = logits_error(hf.from_pretrained(d), "hf_llama_gqa")
    assert.is_true(err < TOL, "max abs error " .. err)
    local all = loom.load_safetensors(d .. "/model.safetensors.index.json")
    for k, v in pairs(t) do same_tensor(v, all[k]) end
    -- an index naming a tensor its file lacks, or a file that is not there
    write(d .. "/bad.index.json", '{"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}')
    has(errmsg(loom.load_safetensors, d .. "/bad.index.json"), "bad.index.json",
        "puts tensor model.norm.weight in model-00002-of-00002.safetensors, which does not hold it")
    write(d .. "/gone.index.json", '{"weight_map": {"x": "gone.safetensors"}}')
    has(errmsg(loom.load_safetensors, d .. "/gone.index.json"), "gone.safetensors", "cannot open")
  end)

  it("save_pretrained writes back the same tensors and config (permuted, transposed, fused)", function()
    for _, dir in ipairs { "hf_llama_gqa", "hf_llama_tied", "hf_gpt2" } do
      local model = hf.from_pretrained(FIX .. dir)
      local d = tmpdir()
      hf.save_pretrained(model, d)
      local want = loom.load_safetensors(FIX .. dir .. "/model.safetensors")
      local got = loom.load_safetensors(d .. "/model.safetensors")
      for k, v in pairs(want) do same_tensor(v, got[k]) end
      for k in pairs(got) do assert.is_not_nil(want[k], dir .. ": extra " .. k) end
      local a1, c1 = hf.read_config(FIX .. dir)
      local a2, c2 = hf.read_config(d)
      assert.equal(a1, a2)
      assert.same(c1, c2)
    end
  end)

  it("tied embeddings: kept by from_pretrained{dtype}, and loaded when a conversion broke the tie", function()
    local m = hf.from_pretrained(FIX .. "hf_llama_tied", { dtype = "bf16" })
    assert.equal("bf16", m.output.weight.dtype)
    assert.is_true(rawequal(m.output.weight, m.tok_embeddings.weight) or
                   m.output.weight:data_ptr() == m.tok_embeddings.weight:data_ptr())
    local _, cfg = hf.read_config(FIX .. "hf_llama_tied")
    local untied = loom.models.transformer.new(cfg)
    untied:apply(function(mod)   -- as examples/train.lua converts, one module at a time
      for name, p in pairs(rawget(mod, "_parameters")) do mod[name] = loom.nn.Parameter(p:to("bf16")) end
    end)
    assert.is_not.equal(untied.output.weight:data_ptr(), untied.tok_embeddings.weight:data_ptr())
    hf.load_weights(untied, FIX .. "hf_llama_tied")
    same_tensor(untied.tok_embeddings.weight:detach(), untied.output.weight:detach())
    assert.is_nil(hf.hf_state_dict(untied)["lm_head.weight"])
  end)

  it("a bf16 checkpoint loads into an f32 model as its rounded values", function()
    local d = copy_fixture("hf_llama_gqa", function(t) for k, v in pairs(t) do t[k] = v:to("bf16") end end)
    local model = hf.from_pretrained(d)
    local w = loom.load_safetensors(FIX .. "hf_llama_gqa/model.safetensors")
    same_tensor(w["model.norm.weight"]:to("bf16"):to("f32"), model.norm.weight:detach())
    assert.is_true(logits_error(model, "hf_llama_gqa") < 0.1)
  end)
end)

describe("examples/train.lua --init-from", function()
  it("fine-tunes the checkpoint on 1 and 2 ranks: the first loss is the loaded model's", function()
    local d = tmpdir()
    -- a corpus of at most 28 characters, within the checkpoint's 32 ids
    local text = read("examples/data/tinyshakespeare.txt"):sub(1, 20000):lower():gsub("[^a-z \n]", "")
    write(d .. "/corpus.txt", text)
    local data = loom.data
    local tok = data.CharTokenizer(text)
    local x, y = data.Sampler(data.split(tok:encode(text), 0.9), { batch = 2, seq = 8, seed = 1337, rank = 0,
                                                                    world = 1 }):next()
    local model = hf.from_pretrained(FIX .. "hf_llama_gqa", { config = { max_seq_len = 8 } })
    local want = loom.no_grad(function() return loom.F.cross_entropy(model(x), y):item() end)
    sys.fine_tunes("--init-from " .. FIX .. "hf_llama_gqa --data " .. d .. "/corpus.txt"
                   .. " --steps 3 --batch 2 --seq 8 --eval-every 100 --eval-iters 1 --sample 0 --quiet", want, d)
    -- a corpus larger than the vocabulary is refused, naming both sizes
    write(d .. "/wide.txt", read("examples/data/tinyshakespeare.txt"):sub(1, 20000))
    local rc, out = sys.sh_clean("luajit examples/train.lua --init-from " .. FIX .. "hf_llama_gqa --data " .. d
                       .. "/wide.txt --steps 1 --sample 0 --quiet")
    assert.is_not.equal(0, rc)
    assert.is_truthy(out:find("the checkpoint's vocabulary only 32", 1, true), out)
  end)
end)
