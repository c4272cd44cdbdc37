-- moe.lua: nn.MoE, a mixture-of-experts feed-forward with the semantics of
-- Mixtral's and Qwen3-MoE's sparse blocks (transformers' MixtralSparseMoeBlock,
-- Qwen3MoeSparseMoeBlock): a router (a linear layer without bias, then a
-- softmax over the experts in f32), each token's top k experts, their
-- weights renormalised to sum 1 (Mixtral; Qwen3-MoE's norm_topk_prob), and
-- SwiGLU experts stored as one (experts, ...) weight per projection. The
-- tokens are sorted by expert on the host (a counting sort of the top-k
-- ids) and run through loom.grouped_mm, one op per projection over all the
-- experts; the combine gathers each token's k weighted rows back and sums them.
local ffi = require("ffi")
local loom = require("loom")
local T = require("loom.tensor")
local Module = require("loom.nn.module")
local layers = require("loom.nn.layers")
local init = require("loom.nn.weights")

local C, F = loom.C, loom.F
local M = {}
local LV = 4 -- argument errors name the line that built the module (as layers.lua's)

local function check_int(name, v, lo, hi)
  if not T.is_int(v) or v < lo or (hi and v > hi) then
    T.argerror("MoE", name, "an integer in [" .. lo .. ", " .. (hi or "inf") .. "]", T.describe(v), LV)
  end
end
local function check_num(name, v, positive)
  if v ~= nil and (type(v) ~= "number" or v ~= v or v < 0 or (positive and v == 0) or v == math.huge) then
    T.argerror("MoE", name, positive and "a finite number > 0" or "a finite number >= 0", T.describe(v), LV)
  end
end

---------------------------------------------------------------------------
-- the experts: w1 (gate) and w3 (up) (experts, hidden, dim), w2 (down)
-- (experts, dim, hidden), each expert's block laid out as nn.Linear's weight

M.MoEExperts = Module:extend("MoEExperts")
function M.MoEExperts:__init(dim, hidden, experts, opts)
  self.dim, self.hidden, self.num_experts = dim, hidden, experts
  local function param(size) return layers.Parameter(loom.empty(size, { dtype = opts.dtype, device = opts.device })) end
  self.w1 = param({ experts, hidden, dim })
  self.w2 = param({ experts, dim, hidden })
  self.w3 = param({ experts, hidden, dim })
  self:reset_parameters()
end
-- as nn.Linear initialises each expert's projections: U(-1/sqrt(in), 1/sqrt(in))
function M.MoEExperts:reset_parameters()
  local a, b = 1 / math.sqrt(self.dim), 1 / math.sqrt(self.hidden)
  init.uniform_(self.w1, -a, a)
  init.uniform_(self.w3, -a, a)
  init.uniform_(self.w2, -b, b)
end
-- the dim of each weight that holds the hidden size: what tensor
-- parallelism cuts (loom.parallel.ExpertTensorParallel)
M.MoEExperts.hidden_dims = { w1 = 2, w3 = 2, w2 = 3 }

-- x (rows, dim) sorted by expert, sizes (experts) i64 rows per expert:
-- w2 (silu(x w1^T) * x w3^T) per expert, three grouped GEMMs, with the
-- weights given (the module's, or this rank's shards of them)
function M.swiglu_experts(x, sizes, w1, w2, w3)
  local t = { trans_w = true }
  local h = F.swiglu(loom.grouped_mm(x, w1, sizes, t), loom.grouped_mm(x, w3, sizes, t))
  return loom.grouped_mm(h, w2, sizes, t)
end
function M.MoEExperts:forward(x, sizes) return M.swiglu_experts(x, sizes, self.w1, self.w2, self.w3) end

---------------------------------------------------------------------------
-- routing

-- the k largest of p (rows, E) per row, in decreasing order: values (rows, k)
-- and 0-based ids (rows, k) i64 (torch.topk); each pick is masked to -1
-- (below any probability) before the next
local function topk(p, k)
  local ar = loom.arange(p:size(2), { dtype = "i64", device = p.device })
  local vals, ids = {}, {}
  for j = 1, k do
    local v, i = p:max(2, true)
    vals[j], ids[j] = v, i - 1
    if j < k then p = p:where(ar:ne(ids[j]), -1) end
  end
  return loom.cat(vals, 2), loom.cat(ids, 2)
end

-- The dispatch plan from the top-k ids (rows, k): a counting sort by expert
-- (stable: token order within an expert), on the host. Returns the i64
-- tensors perm (kept slots -> flat position t*k + j), tok (kept slots ->
-- token), inv (flat position -> kept slot, or the number of kept slots for
-- a dropped one) and sizes (kept rows per expert), the assignments per
-- expert before drops (a Lua list), and the number dropped. capacity: the
-- most rows an expert takes (nil: all).
local function dispatch(ids, E, capacity)
  local rows, k = ids:size(1), ids:size(2)
  local n = rows * k
  local host = ids:to("cpu"):to("i32"):contiguous()
  local p = ffi.cast("const int32_t *", host:data_ptr())
  local counts, kept, start, fill = {}, {}, {}, {}
  for e = 0, E - 1 do counts[e] = 0 end
  for j = 0, n - 1 do counts[p[j]] = counts[p[j]] + 1 end
  local total, dropped = 0, 0
  for e = 0, E - 1 do
    kept[e] = capacity and math.min(counts[e], capacity) or counts[e]
    start[e], fill[e] = total, 0
    total, dropped = total + kept[e], dropped + counts[e] - kept[e]
  end
  local perm, tok = loom.empty({ total }, { dtype = "i64" }), loom.empty({ total }, { dtype = "i64" })
  local inv, sizes = loom.empty({ n }, { dtype = "i64" }), loom.empty({ E }, { dtype = "i64" })
  local pp, pt = ffi.cast("int64_t *", perm:data_ptr()), ffi.cast("int64_t *", tok:data_ptr())
  local pi, ps = ffi.cast("int64_t *", inv:data_ptr()), ffi.cast("int64_t *", sizes:data_ptr())
  for j = 0, n - 1 do
    local e = p[j]
    if fill[e] < kept[e] then
      local slot = start[e] + fill[e]
      pp[slot], pt[slot], pi[j] = j, math.floor(j / k), slot
      fill[e] = fill[e] + 1
    else
      pi[j] = total
    end
  end
  local list = {}
  for e = 0, E - 1 do ps[e], list[e + 1] = kept[e], counts[e] end
  return { perm = perm, tok = tok, inv = inv, sizes = sizes, kept = total }, list, dropped
end

-- rows of x (rows, d) at the 0-based ids (a gather; its gradient adds back)
local function gather(x, ids) return T.op(C.LM_OP_EMBEDDING, { x, ids }) end

-- x itself; in backward its gradient summed over comm's ranks
local function grad_reduce(x, comm) return T.op(C.LM_OP_DIST_GRAD_REDUCE, { x }, nil, nil, { comm }) end

---------------------------------------------------------------------------
-- the block

-- MoE{dim, hidden, experts, top_k = 2, norm_topk_prob = true,
-- aux_loss_coef = 0, router_z_loss_coef = 0, capacity_factor = nil, dtype,
-- device}. After a forward: aux_loss (the coefficients' sum of the terms
-- below that are on, to add to the loss; nil when none is), balance_loss
-- (the load-balancing loss, transformers' load_balancing_loss_func of this
-- layer: experts * sum_e (assignments_e / tokens) * mean_t p_te), z_loss
-- (ST-MoE: mean of logsumexp(logits)^2), router_logits (tokens, experts),
-- tokens_per_expert (a list: top-k assignments per expert, before drops)
-- and dropped (assignments past an expert's capacity, ceil(capacity_factor
-- * tokens * top_k / experts); none dropped by default). With its experts
-- cut over tp (loom.parallel.ExpertTensorParallel) the output is a Partial
-- DTensor on the tp mesh: each rank's share of the sum.
M.MoE = Module:extend("MoE")
function M.MoE:__init(opts)
  if type(opts) ~= "table" then T.argerror("MoE", "options", "a table {dim, hidden, experts, ...}", T.describe(opts), LV) end
  T.check_opts("MoE", opts, { dim = true, hidden = true, experts = true, top_k = true, norm_topk_prob = true,
                              aux_loss_coef = true, router_z_loss_coef = true, capacity_factor = true,
                              dtype = true, device = true }, LV - 1)
  check_int("dim", opts.dim, 1)
  check_int("hidden", opts.hidden, 1)
  check_int("experts", opts.experts, 1)
  check_int("top_k", opts.top_k or 2, 1, opts.experts)
  if opts.norm_topk_prob ~= nil and type(opts.norm_topk_prob) ~= "boolean" then
    T.argerror("MoE", "norm_topk_prob", "a boolean", T.describe(opts.norm_topk_prob), LV)
  end
  check_num("aux_loss_coef", opts.aux_loss_coef)
  check_num("router_z_loss_coef", opts.router_z_loss_coef)
  check_num("capacity_factor", opts.capacity_factor, true)
  self.dim, self.hidden, self.num_experts, self.top_k = opts.dim, opts.hidden, opts.experts, opts.top_k or 2
  self.norm_topk_prob = opts.norm_topk_prob ~= false
  self.aux_loss_coef, self.router_z_loss_coef = opts.aux_loss_coef or 0, opts.router_z_loss_coef or 0
  self.capacity_factor = opts.capacity_factor
  local o = { dtype = opts.dtype, device = opts.device }
  self.gate = layers.Linear(opts.dim, opts.experts, { bias = false, dtype = o.dtype, device = o.device })
  self.experts = M.MoEExperts(opts.dim, opts.hidden, opts.experts, o)
end

-- the router's losses from its logits (f32) and probabilities
function M.MoE:router_losses(logits, probs, counts, tokens)
  local E, terms = self.num_experts, nil
  self.balance_loss, self.z_loss = nil, nil
  if self.aux_loss_coef > 0 then
    local frac = {}
    for e = 1, E do frac[e] = counts[e] / tokens end
    local f = loom.tensor(frac, { device = probs.device })
    self.balance_loss = (f * probs:mean(1)):sum() * E
    terms = self.balance_loss * self.aux_loss_coef
  end
  if self.router_z_loss_coef > 0 then
    local m = logits:max(2, true):detach()
    local lse = ((logits - m):exp():sum(2, true)):log() + m
    self.z_loss = (lse * lse):mean()
    local z = self.z_loss * self.router_z_loss_coef
    terms = terms and terms + z or z
  end
  self.aux_loss = terms
end

function M.MoE:forward(x)
  local shape = x:size()
  local dim, E, k = self.dim, self.num_experts, self.top_k
  if shape[#shape] ~= dim then
    T.argerror("MoE", "input", "a tensor of size (..., " .. dim .. ")", "size " .. tostring(shape), 3)
  end
  local x2 = x:reshape(-1, dim)
  local tokens = x2:size(1)
  local logits = F.linear(x2, self.gate.weight)
  local lf = logits.dtype == "f64" and logits or logits:to("f32") -- the softmax in f32 (f64 stays f64)
  local probs = lf:softmax(2)
  local top, ids = topk(probs, k)
  if self.norm_topk_prob then top = top / top:sum(2, true) end
  local cap = self.capacity_factor and math.ceil(self.capacity_factor * tokens * k / E) or nil
  local plan, counts, dropped = dispatch(ids, E, cap)
  local dev = x.device
  if dev ~= "cpu" then
    for _, name in ipairs { "perm", "tok", "inv", "sizes" } do plan[name] = plan[name]:to(dev) end
  end
  -- experts cut over tp (ExpertTensorParallel): each rank's output is its
  -- share of the sum, so the gradients reaching the input and the router's
  -- weights through it are shares too, summed over tp in backward
  local etp = rawget(self.experts, "_etp")
  local xe, te = x2, top
  if etp then xe, te = grad_reduce(x2, etp.comm), grad_reduce(top, etp.comm) end
  -- rows sorted by expert, through the experts, weighted by the router
  local y = self.experts(gather(xe, plan.tok), plan.sizes)
  y = (y * gather(te:reshape(tokens * k, 1), plan.perm)):to(x.dtype)
  -- each token's k rows back in order (a dropped one reads a zero row), summed
  if plan.kept < tokens * k then y = loom.cat({ y, loom.zeros({ 1, dim }, { dtype = y.dtype, device = dev }) }, 1) end
  local out = gather(y, plan.inv):reshape(tokens, k, dim):sum(2)
  self.router_logits, self.tokens_per_expert, self.dropped = logits, counts, dropped
  self:router_losses(lf, probs, counts, tokens)
  out = out:reshape(shape)
  if etp then return etp.output(out, etp.mesh) end   -- a Partial DTensor (the parallel layer makes it)
  return out
end

-- transformers' load_balancing_loss_func over several layers' router
-- logits (a list of (tokens, experts) tensors, as MoE's router_logits):
-- assignment fractions and mean probabilities summed over the layers
-- before their product (Mixtral's and Qwen3-MoE's aux loss of a model)
function M.load_balancing_loss(router_logits, num_experts, top_k)
  if type(router_logits) ~= "table" or T.is_tensor(router_logits) or #router_logits == 0 then
    T.argerror("load_balancing_loss", "router_logits", "a list of (tokens, experts) tensors", T.describe(router_logits))
  end
  local counts, psum, rows = {}, nil, 0
  for e = 1, num_experts do counts[e] = 0 end
  for _, l in ipairs(router_logits) do
    local p = l:to("f32"):softmax(2)
    local _, ids = topk(p:detach(), top_k)
    local host = ids:to("cpu"):to("i32"):contiguous()
    local q = ffi.cast("const int32_t *", host:data_ptr())
    for j = 0, ids:numel() - 1 do counts[q[j] + 1] = counts[q[j] + 1] + 1 end
    local s = p:sum(1)
    psum = psum and psum + s or s
    rows = rows + p:size(1)
  end
  for e = 1, num_experts do counts[e] = counts[e] / rows end
  return (loom.tensor(counts, { device = psum.device }) * (psum / rows)):sum() * num_experts
end

return M
