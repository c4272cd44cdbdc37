-- bench_train.lua: time of one training step of the Llama-style model
-- (forward, backward, AdamW), split by op, with the time in GEMM (the
-- matmul op) next to the total; with --dtype f32,bf16 the same config in
-- each dtype in the same run (bf16: mixed precision, autocast); in f32 the
-- step's GEMM rate next to cblas_sgemm replaying the same shapes right after
-- each step (the 97M Llama: --layers 12 --dim 768 --heads 12 --seq 256
-- --batch 4 --vocab 8192 --warmup 1 --steps 3). Usage:
--   luajit scripts/bench_train.lua [--layers 4 --dim 128 --heads 4 --seq 64 --batch 12 --steps 20 --warmup 3 --dtype f32]
-- Distributed (TP x DP, replicate() or --fsdp): how much of the data-parallel
-- communication backward hides (see overlap() below):
--   scripts/loomrun -n 4 scripts/bench_train.lua --tp 2 --dp 2 [--fsdp] [--bucket-mb 25] [--json out.json]
-- TP alone: loom's step time next to PyTorch DTensor's over gloo on the same
-- plan (see tp_vs_torch() below):
--   LOOM_BENCH_PYTHON=/opt/torchvenv/bin/python scripts/loomrun -n 2 scripts/bench_train.lua --tp 2
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_train%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local loom = require("loom")
local bench = require("loom.train.bench")
local C = loom.C

local o = bench.args(arg, { layers = 4, dim = 128, heads = 4, seq = 64, batch = 12, steps = 20, vocab = 65,
                            dtype = "f32", warmup = 3, tp = 0, dp = 0, fsdp = false, ["no-reshard"] = false,
                            ["sequence-parallel"] = false, json = "",
                            ["bucket-mb"] = 25 }, "bench_train.lua")

-- The data-parallel collectives (replicate()'s all-reduces, FSDP's
-- all-gathers and reduce-scatters) are the Lua calls dist.all_reduce,
-- all_gather and reduce_scatter; tensor parallelism's run inside the ops.
-- watch(mode) wraps those three: "record" notes each call (to replay it
-- alone), "sync" waits for an async one at once (no overlap), nil passes.
-- state.waited sums the seconds spent in Work:wait (communication the
-- step did not hide, plus the wait for the slowest rank to join).
local dist_fns = { "all_reduce", "all_gather", "reduce_scatter" }
local function watch(dist, state)
  local orig = { wait = dist.Work.wait }
  state.waited = 0
  dist.Work.wait = function(w)
    local t0 = bench.now()
    local r = orig.wait(w)
    state.waited = state.waited + bench.now() - t0
    return r
  end
  for _, name in ipairs(dist_fns) do
    orig[name] = dist[name]
    dist[name] = function(t, ...)
      local args = { n = select("#", ...), ... }
      if state.mode == "record" then
        state.calls[#state.calls + 1] = { name = name, size = t:size(), dtype = t.dtype, args = args }
      end
      local r = orig[name](t, ...)
      if state.mode == "sync" and type(r) == "table" and r.wait then r:wait() end
      return r
    end
  end
  return orig
end

-- the recorded collectives again, blocking, on zeros of the same sizes
local function replay(orig, calls)
  local loom_ = require("loom")
  for _, c in ipairs(calls) do
    local args = { unpack(c.args, 1, c.args.n) }
    local last = args[c.args.n]
    if type(last) == "table" and last.async_op ~= nil then   -- the options: keep all but async_op
      local copy = {}
      for k, v in pairs(last) do if k ~= "async_op" then copy[k] = v end end
      args[c.args.n] = copy
    end
    orig[c.name](loom_.zeros(c.size, { dtype = c.dtype }), unpack(args, 1, c.args.n))
  end
end

-- The TP x DP model of o on this job's mesh: dist, tp, fsdp, the mesh, the
-- model with its AdamW, this dp rank's batch and run() (forward with the
-- loss and backward; under loss_parallel when tp > 1, as tp_plan asks).
local function build(o)   -- luacheck: ignore 431 (a config, this run's or another)
  local dist, tp = require("loom.distributed"), require("loom.parallel")
  local fsdp = require("loom.distributed.fsdp")
  local tr = loom.models.transformer
  local world = dist.world_size()
  local ntp = o.tp > 0 and o.tp or (o.dp > 0 and world / o.dp or 1)
  local ndp = o.dp > 0 and o.dp or world / ntp
  if ntp * ndp ~= world or ntp % 1 ~= 0 or ndp % 1 ~= 0 then
    error(string.format("bench_train.lua: --tp %d x --dp %d must equal the world size %d", ntp, ndp, world), 0)
  end
  if o.batch % ndp ~= 0 then error(string.format("bench_train.lua: --batch %d must divide by dp %d", o.batch, ndp), 0) end
  local mesh = dist.init_device_mesh("cpu", { ndp, ntp }, { mesh_dim_names = { "dp", "tp" } })
  loom.manual_seed(0)
  local model = tr.new { vocab_size = o.vocab, dim = o.dim, n_layers = o.layers, n_heads = o.heads, max_seq_len = o.seq }
  local lp = ntp > 1
  if ntp > 1 then
    tp.parallelize_module(model, mesh["tp"], tr.tp_plan({ sequence_parallel = o["sequence-parallel"], loss_parallel = lp,
                                                          tp = ntp }, model), { src_data_rank = false })
  end
  if o.fsdp then
    local opts = { mesh = mesh["dp"], reshard_after_forward = not o["no-reshard"] }
    for _, block in model.layers:ipairs() do fsdp.fully_shard(block, opts) end
    fsdp.fully_shard(model, { mesh = mesh["dp"] })
  elseif ndp > 1 then
    tp.replicate(model, mesh["dp"], { bucket_cap_mb = o["bucket-mb"] })
  end
  local opt = loom.optim.AdamW(model:parameters(), { lr = 1e-3 })
  loom.manual_seed(1 + mesh:get_local_rank("dp"))
  local x = loom.randint(1, o.vocab + 1, { o.batch / ndp, o.seq })
  local y = loom.randint(1, o.vocab + 1, { o.batch / ndp, o.seq })
  local function run()
    local l = loom.F.cross_entropy(model(x), y)
    l:backward()
  end
  return { dist = dist, tp = tp, fsdp = fsdp, mesh = mesh, model = model, opt = opt, ntp = ntp, ndp = ndp,
           run = lp and function() tp.loss_parallel(run) end or run }
end

-- Step times of the TP x DP model with the data-parallel collectives
-- overlapped with backward (as they run) and waited for at once, steps of
-- the two kinds alternating; the communication measured alone; the
-- fraction of it hidden = (t_no_overlap - t_overlap) / t_comm. Each
-- figure is the slowest rank's median.
local function overlap(o, b)   -- luacheck: ignore 431
  local dist, fsdp, model, opt, run = b.dist, b.fsdp, b.model, b.opt, b.run
  local ntp, ndp, me = b.ntp, b.ndp, dist.rank()
  local state = { calls = {} }
  local orig = watch(dist, state)
  local function step(mode)
    state.mode, state.waited = mode, 0
    dist.barrier()
    local t0 = bench.now()
    opt:zero_grad()
    run()
    opt:step()
    local t = bench.now() - t0
    state.mode = nil
    return t
  end
  step("record")
  local calls = state.calls
  step("sync")
  local times = { overlap = {}, sync = {}, comm = {}, wait_overlap = {}, wait_sync = {} }
  for _ = 1, o.steps do
    times.overlap[#times.overlap + 1] = step(nil)
    times.wait_overlap[#times.wait_overlap + 1] = state.waited
    times.sync[#times.sync + 1] = step("sync")
    times.wait_sync[#times.wait_sync + 1] = state.waited
    dist.barrier()
    local t0 = bench.now()
    replay(orig, calls)
    times.comm[#times.comm + 1] = bench.now() - t0
  end
  for _, name in ipairs(dist_fns) do dist[name] = orig[name] end
  dist.Work.wait = orig.wait
  local function slowest(v)
    return dist.all_reduce(loom.tensor({ bench.median(v) }, { dtype = "f64" }), "max"):item() * 1e3
  end
  local t_ov, t_no, t_comm = slowest(times.overlap), slowest(times.sync), slowest(times.comm)
  local w_ov, w_no = slowest(times.wait_overlap), slowest(times.wait_sync)
  local counts, bytes = {}, 0
  for _, c in ipairs(calls) do
    counts[c.name] = (counts[c.name] or 0) + 1
    local n = 4
    for _, s in ipairs(c.size) do n = n * s end
    bytes = bytes + n
  end
  local kinds = {}
  for _, name in ipairs(dist_fns) do if counts[name] then kinds[#kinds + 1] = counts[name] .. " " .. name end end
  local mem = fsdp.memory(model, opt)
  local hidden = (t_no - t_ov) / t_comm
  if me == 0 then
    print(string.format("training step, %s: %d layers, dim %d, %d heads, batch %dx%d (%d per dp rank), tp %d x dp %d, "
                        .. "%d threads per rank, %d steps of each kind", o.fsdp and "FSDP (fully_shard)" or "replicate()",
                        o.layers, o.dim, o.heads, o.batch, o.seq, o.batch / ndp, ntp, ndp, loom.num_threads(), o.steps))
    print(string.format("data-parallel collectives per step: %s, %.2f MB in", table.concat(kinds, ", "), bytes / 2^20))
    print(string.format("parameters + AdamW state per rank: %.2f MB\n", mem.total / 2^20))
    bench.table({ "measure", "ms (slowest rank's median)", "of it waiting for collectives" }, {
      { "step, collectives overlapped with backward", t_ov, w_ov },
      { "step, each collective waited for at once", t_no, w_no },
      { "the data-parallel collectives alone", t_comm, "" },
    })
    print(string.format("\nhidden fraction of the communication: (%.1f - %.1f) / %.1f = %.2f",
                        t_no, t_ov, t_comm, hidden))
    -- the step times of a busy machine swing by more than the collectives
    -- take; the time spent waiting for them is steadier
    print(string.format("waiting for collectives: %.1f ms with overlap, %.1f ms without: %.0f%% of it hidden",
                        w_ov, w_no, 100 * (1 - w_ov / w_no)))
    if o.json ~= "" then
      bench.write_json(o.json, { fsdp = o.fsdp, tp = ntp, dp = ndp, layers = o.layers, dim = o.dim, batch = o.batch,
                                 seq = o.seq, step_overlap_ms = t_ov, step_no_overlap_ms = t_no, comm_ms = t_comm,
                                 waited_overlap_ms = w_ov, waited_no_overlap_ms = w_no,
                                 hidden_fraction = hidden,
                                 hidden_wait_fraction = 1 - w_ov / w_no, collectives = counts, comm_bytes = bytes,
                                 memory_per_rank_bytes = mem.total })
    end
  end
end

-- PyTorch as a baseline, when a Python with torch is at hand
-- (LOOM_BENCH_PYTHON, else python3): never a dependency of loom
local function torch_python()
  local py = os.getenv("LOOM_BENCH_PYTHON") or "python3"
  return py, os.execute(py .. " -c 'import torch' >/dev/null 2>&1") == 0
end

local function torch_cmd(py, extra)
  return string.format("OMP_WAIT_POLICY=PASSIVE %s %sscripts/bench_torch_train.py --layers %d --dim %d --heads %d "
                       .. "--seq %d --batch %d --steps %d --vocab %d --threads %d %s", py, root, o.layers, o.dim,
                       o.heads, o.seq, o.batch, o.steps, o.vocab, loom.num_threads(), extra)
end

local function decode(out)
  local ok, r = pcall(require("dkjson").decode, out:match("{.*}") or "")
  return ok and type(r) == "table" and r or nil
end

local ffi = require("ffi")
pcall(ffi.cdef, "int nanosleep(const loom_timespec *req, loom_timespec *rem);")   -- (loom.bench has the struct)
local function sleep(s) ffi.C.nanosleep(ffi.new("loom_timespec", { 0, s * 1e9 }), nil) end   -- s < 1

-- PyTorch DTensor over gloo on the same TP plan (bench_torch_train.py --tp),
-- run by rank 0 while the other ranks wait; rank 0 gets its JSON (nil
-- without torch or when it failed). The wait is an all_reduce of a "done"
-- flag every 0.5 s, not one barrier: a run longer than
-- LOOM_COLLECTIVE_TIMEOUT (300 s) would make the watchdog end a job that
-- waits in one collective that long (20 steps of the default config take
-- about 16 s on the 2-vCPU VM). Each wait naps (<= 1 ms polls).
local function torch_tp(dist, ntp)
  local me, py, has, out = dist.rank(), nil, false, nil
  if me == 0 and not o["sequence-parallel"] then
    py, has = torch_python()
    if has then
      out = os.tmpname()
      os.execute(string.format("(%s > %s 2> %s.err; touch %s.done) &", torch_cmd(py, "--tp " .. ntp), out, out, out))
    end
  end
  local done
  repeat
    local mine = 1
    if out then
      sleep(0.5)
      local f = io.open(out .. ".done")
      mine = f and 1 or 0
      if f then f:close() end
    end
    done = dist.all_reduce(loom.tensor({ mine }, { dtype = "f64" }), "min"):item()   -- the others are ready: 1
  until done == 1
  if not out then return nil, py, has end
  local f, e = io.open(out), io.open(out .. ".err")
  local r, err = decode(f:read("*a")), e:read("*a")
  f:close() e:close()
  if not r then io.stderr:write("bench_train.lua: the PyTorch TP run printed no result:\n", err:sub(-2000), "\n") end
  for _, suffix in ipairs { "", ".err", ".done" } do os.remove(out .. suffix) end
  return r, py, has
end

-- TP alone (no dp, no fsdp): loom's step time (3 warm-up steps, then
-- o.steps, a barrier before each; the slowest rank's median) next to
-- PyTorch's on the same config, plan and threads per rank, one after the
-- other. Tokens/s count the global batch (batch x seq) per step.
local function tp_vs_torch(o, b)   -- luacheck: ignore 431
  local dist, opt, run = b.dist, b.opt, b.run
  local function step()
    dist.barrier()
    local t0 = bench.now()
    opt:zero_grad()
    run()
    opt:step()
    return bench.now() - t0
  end
  for _ = 1, 3 do step() end
  local times = {}
  for i = 1, o.steps do times[i] = step() end
  local ms = dist.all_reduce(loom.tensor({ bench.median(times) }, { dtype = "f64" }), "max"):item() * 1e3
  local pt, py, has = torch_tp(dist, b.ntp)
  if dist.rank() ~= 0 then return end
  local tokens = o.batch * o.seq
  print(string.format("training step, tensor parallel: %d layers, dim %d, %d heads, batch %dx%d, tp %d, "
                      .. "%d threads per rank, %d steps timed (slowest rank's median)", o.layers, o.dim, o.heads,
                      o.batch, o.seq, b.ntp, loom.num_threads(), o.steps))
  local why = o["sequence-parallel"] and "n/a with --sequence-parallel (the PyTorch replica has no sequence parallelism)"
              or not has and "not importable, set LOOM_BENCH_PYTHON to a Python with torch"
              or not pt and "torch from " .. py .. " failed, see its stderr"
              or string.format("torch %s from %s, %d ranks over gloo", pt.torch, py, b.ntp)
  print(string.format("\nsame config, same run, one after the other (PyTorch DTensor, loss_parallel: %s):", why))
  bench.table({ "tp", "loom step ms", "loom tokens/s", "PyTorch step ms", "PyTorch tokens/s", "loom speed-up" }, {
    { b.ntp, ms, tokens / (ms / 1e3), pt and pt.step_ms or "n/a", pt and pt.tokens_per_s or "n/a",
      pt and string.format("%.2fx", pt.step_ms / ms) or "n/a" } })
  if o.json ~= "" then
    bench.write_json(o.json, { tp = b.ntp, dp = 1, layers = o.layers, dim = o.dim, heads = o.heads, batch = o.batch,
                               seq = o.seq, threads = loom.num_threads(), step_ms = ms, tokens_per_s = tokens / (ms / 1e3),
                               torch_step_ms = pt and pt.step_ms, torch_tokens_per_s = pt and pt.tokens_per_s,
                               torch = pt and pt.torch })
  end
end

if os.getenv("OMPI_COMM_WORLD_SIZE") or o.tp > 0 or o.dp > 0 then
  local b = build(o)
  if b.ntp > 1 and b.ndp == 1 and not o.fsdp then tp_vs_torch(o, b) else overlap(o, b) end
  return
end

-- The step's GEMMs replayed through the library's own GEMM called
-- directly, in the same run: cblas_sgemm for f32; for bf16, where libloom
-- came with oneDNN, its bf16 GEMM dnnl_gemm_bf16bf16f32 (bf16 operands,
-- f32 results). Each Linear weight (out, in) does y = x W^T forward,
-- dX = dY W and dW = dY^T X backward on tokens = batch x seq rows:
-- 6 x tokens x numel(W) FLOPs a step. Returns the FLOPs and the seconds of
-- one replay (nil without such a GEMM for the dtype).
pcall(ffi.cdef, [[
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
int dnnl_gemm_bf16bf16f32(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha,
                          const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                          float *c, int64_t ldc);
]])
local REPLAY_NAME = { f32 = "cblas_sgemm", bf16 = "oneDNN's dnnl_gemm_bf16bf16f32" }
local function replay_gemm(dtype)
  if dtype == "f32" then
    local RM, N_, T_ = 101, 111, 112
    local tr = { N = N_, T = T_ }
    return function(ta, tb, m, n, k, a, lda, b, ldb, c, ldc)
      ffi.C.cblas_sgemm(RM, tr[ta], tr[tb], m, n, k, 1, a, lda, b, ldb, 0, c, ldc)
    end, "float*"
  end
  local ok = dtype == "bf16" and pcall(function() return ffi.C.dnnl_gemm_bf16bf16f32 end)
  if not ok then return nil end
  return function(ta, tb, m, n, k, a, lda, b, ldb, c, ldc)
    assert(ffi.C.dnnl_gemm_bf16bf16f32(ta:byte(), tb:byte(), m, n, k, 1, a, lda, b, ldb, 0, c, ldc) == 0, "dnnl_gemm_bf16bf16f32 failed")
  end, "uint16_t*"
end
local function linear_shapes(model)
  local shapes = {}
  for _, kv in ipairs(model:named_parameters()) do
    local w = kv[2]
    if w:dim() == 2 and not kv[1]:find("embeddings") then shapes[#shapes + 1] = { w:size(1), w:size(2) } end
  end
  return shapes
end
local function gemm_replay(model, dtype)
  local gemm, ptr = replay_gemm(dtype)
  if not gemm then return nil end
  local T = o.batch * o.seq
  local shapes, flops, biggest = linear_shapes(model), 0, 0
  for _, s in ipairs(shapes) do
    flops = flops + 6 * T * s[1] * s[2]
    biggest = math.max(biggest, s[1], s[2])
  end
  -- operands in the dtype; results in f32 (oneDNN's bf16 GEMM writes f32)
  local X, W, Y = loom.randn(T, biggest):to(dtype), loom.randn(biggest, biggest):to(dtype), loom.randn(T, biggest):to(dtype)
  local R = loom.empty(math.max(T, biggest), biggest)
  local px, pw, py = ffi.cast(ptr, X:data_ptr()), ffi.cast(ptr, W:data_ptr()), ffi.cast(ptr, Y:data_ptr())
  local pr = ffi.cast("float*", R:data_ptr())
  local t0 = bench.now()
  for _, s in ipairs(shapes) do
    local out, inp = s[1], s[2]
    gemm("N", "T", T, out, inp, px, inp, pw, inp, dtype == "f32" and py or pr, out)   -- Y = X W^T
    gemm("N", "N", T, inp, out, py, out, pw, inp, dtype == "f32" and px or pr, inp)   -- dX = dY W
    gemm("T", "N", out, inp, T, py, out, px, inp, pr, inp)                             -- dW = dY^T X
  end
  return flops, bench.now() - t0
end

-- one config in one dtype: phase times and the op profile
local function measure(dtype)
  loom.manual_seed(0)
  local model = loom.models.transformer.new { vocab_size = o.vocab, dim = o.dim, n_layers = o.layers,
                                              n_heads = o.heads, max_seq_len = o.seq }
  local opt = loom.optim.AdamW(model:parameters(), { lr = 1e-3 })
  local x = loom.randint(1, o.vocab + 1, { o.batch, o.seq })
  local y = loom.randint(1, o.vocab + 1, { o.batch, o.seq })
  local function forward() return loom.F.cross_entropy(model(x), y) end
  local phases = { forward = {}, backward = {}, optimizer = {}, step = {} }
  local function step(record)
    local t0 = bench.now()
    local loss = dtype == "f32" and forward() or loom.autocast(dtype, forward)
    local t1 = bench.now()
    opt:zero_grad()
    loss:backward()
    local t2 = bench.now()
    opt:step()
    local t3 = bench.now()
    if record then
      table.insert(phases.forward, t1 - t0) table.insert(phases.backward, t2 - t1)
      table.insert(phases.optimizer, t3 - t2) table.insert(phases.step, t3 - t0)
    end
  end
  for _ = 1, o.warmup do step(false) end
  C.lm_profile_reset()
  C.lm_profile_enable(1)
  local mm, gemm_rate = C.LM_OP_MATMUL, { step = {}, blas = {} }
  for _ = 1, o.steps do
    local before = C.lm_profile_seconds(mm)
    step(true)
    -- the same GEMMs through the library right after: both see the same neighbours
    C.lm_profile_enable(0)
    local flops, t_blas = gemm_replay(model, dtype)
    C.lm_profile_enable(1)
    if flops then
      gemm_rate.flops = flops
      table.insert(gemm_rate.step, flops / (C.lm_profile_seconds(mm) - before) / 1e9)
      table.insert(gemm_rate.blas, flops / t_blas / 1e9)
    end
  end
  C.lm_profile_enable(0)
  local total, ops = 0, {}
  for id = 0, C.lm_op_count() - 1 do
    local s = C.lm_profile_seconds(id)
    if s > 0 then
      total = total + s
      ops[#ops + 1] = { require("ffi").string(C.lm_op_name(id)), s / o.steps * 1e3, tonumber(C.lm_profile_calls(id)) / o.steps }
    end
  end
  table.sort(ops, function(a, b) return a[2] > b[2] end)
  for _, r in ipairs(ops) do r[4] = 100 * r[2] / (total / o.steps * 1e3) end
  return phases, ops, gemm_rate
end


-- PyTorch eager on the same config
local py, has_torch = torch_python()
local function torch_step(dtype)
  if not has_torch then return nil end
  local f = io.popen(torch_cmd(py, "--dtype " .. dtype))
  local out = f:read("*a")
  f:close()
  return decode(out)
end

print(string.format("training step: %d layers, dim %d, %d heads, batch %dx%d, %d threads, %d steps timed",
                    o.layers, o.dim, o.heads, o.batch, o.seq, loom.num_threads(), o.steps))
local summary, gemm_rows = {}, {}
for dtype in o.dtype:gmatch("[^,]+") do
  local phases, ops, gemm_rate = measure(dtype)
  print(string.format("\n-- %s%s", dtype, dtype == "f32" and "" or " (mixed precision: autocast, f32 parameters)"))
  local rows = {}
  for _, name in ipairs { "forward", "backward", "optimizer", "step" } do
    rows[#rows + 1] = { name, bench.median(phases[name]) * 1e3, bench.min(phases[name]) * 1e3 }
  end
  bench.table({ "phase", "median ms", "min ms" }, rows)
  print()
  bench.table({ "op (exclusive)", "ms/step", "calls/step", "% of op time" }, { unpack(ops, 1, 12) })
  local gemm, step_ms = 0, bench.median(phases.step) * 1e3
  for _, r in ipairs(ops) do if r[1] == "matmul" then gemm = r[2] end end
  print(string.format("\nGEMM (matmul op) %.1f ms of %.1f ms per step (%.0f%%); %.0f tokens/s",
                      gemm, step_ms, 100 * gemm / step_ms, o.batch * o.seq / (step_ms / 1e3)))
  if gemm_rate.flops then
    local rate, blas = bench.max(gemm_rate.step), bench.max(gemm_rate.blas)
    print(string.format("GEMM rate (%.2f GFLOP of Linear layers a step): the step's matmul op %.1f GFLOP/s, " ..
                        "%s on the same shapes called directly %.1f GFLOP/s, each step followed by " ..
                        "its replay, best of %d: %.0f%%", gemm_rate.flops / 1e9, rate, REPLAY_NAME[dtype], blas, o.steps,
                        100 * rate / blas))
    gemm_rows[#gemm_rows + 1] = { dtype, rate, REPLAY_NAME[dtype], blas, string.format("%.0f%%", 100 * rate / blas) }
  end
  local pt = torch_step(dtype)
  summary[#summary + 1] = { dtype, step_ms, o.batch * o.seq / (step_ms / 1e3), pt and pt.step_ms or "n/a",
                            pt and pt.tokens_per_s or "n/a",
                            pt and string.format("%.2fx", pt.step_ms / step_ms) or "n/a" }
end
print(string.format("\nsame config, same run (PyTorch eager: %s):", has_torch and "torch from " .. py or
                    "not importable, set LOOM_BENCH_PYTHON to a Python with torch"))
bench.table({ "dtype", "loom step ms", "loom tokens/s", "PyTorch step ms", "PyTorch tokens/s", "loom speed-up" },
            summary)
if #gemm_rows > 0 then
  print("\nGEMM rate of the step's Linear layers, same run (GFLOP/s, best step; the library called directly " ..
        "on the same shapes right after each step):")
  bench.table({ "dtype", "loom matmul op", "library GEMM", "library GFLOP/s", "loom / library" }, gemm_rows)
end
