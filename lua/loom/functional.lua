-- functional.lua: loom.F, PyTorch's torch.nn.functional in Lua. Each
-- function checks its arguments and calls registry ops; ids and dims are
-- 1-based here and converted for the C core.
local loom = require("loom")
local T = require("loom.tensor")
local C = require("loom.lib").C
local rope = require("loom.rope")

local F = {}
local op, check = T.op, T.check_tensor

function F.linear(x, w, b)
  check(x, "linear", "input")
  check(w, "linear", "weight")
  -- under autocast the weight is cast before it is transposed, as
  -- autocast would cast it: a dense cast, and its gradient comes back dense
  -- in the weight's own layout (casting w:t() copies across rows both ways);
  -- marked as autocast's cast, it takes the bf16 copy AdamW kept of w
  local low = C.lm_autocast_dtype()
  if low >= 0 and w.dtype ~= "f64" and w.dtype ~= T.dtypes[low + 1] then w = op(C.LM_OP_TO, { w }, { low, 1 }) end
  local y = x:matmul(w:t())
  if b == nil then return y end
  check(b, "linear", "bias")
  -- under autocast the bias joins the GEMM's dtype (PyTorch's linear is one
  -- autocast op); a recorded cast, so its gradient reaches it in f32
  if b.dtype ~= y.dtype and C.lm_autocast_dtype() >= 0 and b.dtype ~= "f64" then b = b:to(y.dtype) end
  return y + b
end

function F.relu(x) return check(x, "relu", "input"):relu() end
function F.hardtanh(x, min_val, max_val) return check(x, "hardtanh", "input"):hardtanh(min_val, max_val) end
function F.relu6(x) return check(x, "relu6", "input"):hardtanh(0, 6) end
function F.silu(x) return check(x, "silu", "input"):silu() end
-- softplus(x, beta, threshold) = log(1 + exp(beta x)) / beta, and x where
-- beta x > threshold (PyTorch's defaults 1 and 20); an options table works too
function F.softplus(x, beta, threshold)
  check(x, "softplus", "input")
  if type(beta) == "table" then beta, threshold = beta.beta, beta.threshold end
  beta, threshold = beta or 1, threshold or 20
  if type(beta) ~= "number" or not (beta > 0 and beta < math.huge) then
    T.argerror("softplus", "beta", "a positive number", T.describe(beta))
  end
  if type(threshold) ~= "number" or threshold ~= threshold then
    T.argerror("softplus", "threshold", "a number", T.describe(threshold))
  end
  return T.op1(C.LM_OP_SOFTPLUS, x, nil, { threshold, beta })
end
-- mish(x) = x tanh(softplus(x)) (Misra 2019; PyTorch's F.mish)
function F.mish(x) return T.op1(C.LM_OP_MISH, check(x, "mish", "input")) end
-- swiglu(gate, up) = silu(gate) * up (SwiGLU's product, one pass where
-- the backend has the fused kernel); gate and up broadcast
function F.swiglu(a, b)
  return T.op2(C.LM_OP_SWIGLU, check(a, "swiglu", "gate"), check(b, "swiglu", "up"))
end
function F.tanh(x) return check(x, "tanh", "input"):tanh() end
function F.sigmoid(x) return check(x, "sigmoid", "input"):sigmoid() end
function F.gelu(x, opts) return check(x, "gelu", "input"):gelu(opts) end
function F.softmax(x, d) return check(x, "softmax", "input"):softmax(d) end
function F.log_softmax(x, d) return check(x, "log_softmax", "input"):log_softmax(d) end

-- dropout(x, p, training): zeroes each element with probability p and
-- scales the rest by 1/(1-p); the mask comes from the counter-based RNG,
-- so it is reproducible and, on a DTensor, drawn by global index.
function F.dropout(x, p, training)
  check(x, "dropout", "input")
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then T.argerror("dropout", "p", "a probability in [0, 1]", T.describe(p)) end
  if training ~= nil and type(training) ~= "boolean" then T.argerror("dropout", "training", "a boolean", T.describe(training)) end
  if training == false or p == 0 then return x end
  if p == 1 then return x * 0 end
  local keep
  if x.dist ~= nil then   -- a DTensor: the mask's shards are slices of one global draw
    local dist = require("loom.distributed")
    local placements = {}
    for i, pl in ipairs(x.placements) do placements[i] = pl:is_partial() and dist.Replicate() or pl end
    x = x:redistribute(x.device_mesh, placements)
    keep = dist.rand(x:size(), x.device_mesh, placements):ge(p)
  else
    keep = loom.rand(x:size(), { dtype = "f32", device = x.device }):ge(p)
  end
  return x * keep:to(x.dtype) * (1 / (1 - p))
end

-- the norms' int attrs: {k (the normalized dims), flags..., the k sizes}.
-- normalized_shape must be the last k sizes of x (global ones for a
-- DTensor), as in PyTorch; the sizes ride after the flags.
local function norm_attrs(fname, x, shape, eps, ...)
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" or T.is_tensor(shape) or #shape == 0 then
    T.argerror(fname, "normalized_shape", "a size or a non-empty table of sizes", T.describe(shape), 3)
  end
  local xs, k = x:size(), #shape
  local want = table.concat(shape, ", ")
  if k > #xs then
    T.argerror(fname, "normalized_shape", string.format("at most the input's %d dims", #xs),
               string.format("{%s} (%d dims)", want, k), 3)
  end
  for j = 1, k do
    if shape[j] ~= xs[#xs - k + j] then
      T.argerror(fname, "normalized_shape", string.format("the last %d sizes of the input {%s}", k,
                 table.concat(xs, ", ", #xs - k + 1)), "{" .. want .. "}", 3)
    end
  end
  if eps ~= nil and (type(eps) ~= "number" or not (eps >= 0 and eps < math.huge)) then
    T.argerror(fname, "eps", "a finite number >= 0", T.describe(eps), 3)
  end
  local a = { k, ... }
  for j = 1, k do a[#a + 1] = shape[j] end
  return a
end

-- layer_norm(x, normalized_shape, weight, bias, eps)
function F.layer_norm(x, shape, w, b, eps)
  check(x, "layer_norm", "input")
  local inputs = { x }
  if w ~= nil then inputs[#inputs + 1] = check(w, "layer_norm", "weight") end
  if b ~= nil then inputs[#inputs + 1] = check(b, "layer_norm", "bias") end
  local y = op(C.LM_OP_LAYER_NORM, inputs, norm_attrs("layer_norm", x, shape, eps, w and 1 or 0, b and 1 or 0), { eps or 1e-5 })
  return y   -- not the op's second output (the rows' statistics)
end

-- rms_norm(x, normalized_shape, weight, eps): eps nil is the dtype's epsilon
function F.rms_norm(x, shape, w, eps)
  check(x, "rms_norm", "input")
  local inputs = { x }
  if w ~= nil then inputs[2] = check(w, "rms_norm", "weight") end
  local y = op(C.LM_OP_RMS_NORM, inputs, norm_attrs("rms_norm", x, shape, eps, w and 1 or 0), eps and { eps } or nil)
  return y   -- not the op's second output (the rows' statistics)
end

-- embedding(ids, weight): ids hold 1-based rows of weight
function F.embedding(ids, w)
  check(ids, "embedding", "input")
  check(w, "embedding", "weight")
  if ids.dtype ~= "i64" and ids.dtype ~= "i32" then
    T.argerror("embedding", "input", "integer ids (i64 or i32)", ids.dtype .. " tensor")
  end
  return op(C.LM_OP_EMBEDDING, { w, ids - 1 })
end

local REDUCTION = { none = 0, mean = 1, sum = 2 }
local CE_OPTS = { weight = true, ignore_index = true, reduction = true, label_smoothing = true }

-- cross_entropy(logits, target, {weight, ignore_index=-100, reduction="mean",
-- label_smoothing=0}): logits (N, C), (C) or (B, T, C) (flattened), target
-- 1-based class ids or probabilities of the logits' shape.
function F.cross_entropy(logits, target, opts)
  check(logits, "cross_entropy", "input")
  check(target, "cross_entropy", "target")
  if logits.dist ~= nil and F.parallel_cross_entropy then   -- inside loss_parallel
    return F.parallel_cross_entropy(logits, target, opts)
  end
  opts = T.check_opts("cross_entropy", opts, CE_OPTS)
  local red = REDUCTION[opts.reduction or "mean"]
  if not red then T.argerror("cross_entropy", "reduction", "\"none\", \"mean\" or \"sum\"", T.describe(opts.reduction)) end
  local ls = opts.label_smoothing or 0
  if type(ls) ~= "number" or not (ls >= 0 and ls <= 1) then
    T.argerror("cross_entropy", "label_smoothing", "a number in [0, 1]", T.describe(ls))
  end
  local ignore = opts.ignore_index or -100
  if not T.is_int(ignore) or math.abs(ignore) >= 2 ^ 53 then
    T.argerror("cross_entropy", "ignore_index", "an integer", T.describe(ignore))
  end
  local ids = target.dtype == "i64" or target.dtype == "i32"
  local lead = nil
  if logits:dim() > 2 then   -- (B, T, C) -> (B*T, C), the loss reshaped back
    lead = logits:size()
    table.remove(lead)
    local c = logits:size(-1)
    logits = logits:reshape(-1, c)
    target = ids and target:reshape(-1) or target:reshape(-1, c)
  end
  if ids then target = target - 1 end
  local inputs = { logits, target }
  if opts.weight ~= nil then inputs[3] = check(opts.weight, "cross_entropy", "weight") end
  local loss = op(C.LM_OP_CROSS_ENTROPY, inputs, { ids and ignore - 1 or ignore, red }, { ls })   -- not lse
  if lead and red == 0 then loss = loss:reshape(lead) end
  return loss
end

-- the bool mask (L, S) of causal attention over a sliding window: key j
-- kept for query i when i - window < j <= i (Mistral's, transformers'
-- sliding_window_overlay); cached weakly (the layers of a step share one)
local window_masks = setmetatable({}, { __mode = "v" })
function F.sliding_window_mask(L, S, window, device)
  local key = L .. ":" .. S .. ":" .. window .. ":" .. tostring(device)
  local m = window_masks[key]
  if m then return m end
  local i = loom.arange(0, L, 1, { dtype = "i64", device = device }):reshape(L, 1)
  local j = loom.arange(0, S, 1, { dtype = "i64", device = device }):reshape(1, S)
  m = j:le(i):logical_and(j:gt(i - window))
  window_masks[key] = m
  return m
end

-- scaled_dot_product_attention(q, k, v, {attn_mask, is_causal=false, scale,
-- window}): window (loom's, with is_causal): keys more than window - 1
-- positions before the query are masked too (a sliding window), through a
-- banded bool mask, so the fused kernels' masked path runs it
function F.scaled_dot_product_attention(q, k, v, opts)
  local fname = "scaled_dot_product_attention"
  opts = T.check_opts(fname, opts, { attn_mask = true, is_causal = true, scale = true, window = true })
  if opts.is_causal ~= nil and type(opts.is_causal) ~= "boolean" then
    T.argerror(fname, "is_causal", "a boolean", T.describe(opts.is_causal))
  end
  if opts.window ~= nil then
    if not T.is_int(opts.window) or opts.window < 1 then
      T.argerror(fname, "window", "a positive integer", T.describe(opts.window))
    end
    if not opts.is_causal or opts.attn_mask ~= nil then
      T.argerror(fname, "window", "a window with is_causal = true and no attn_mask", "is_causal "
                 .. tostring(opts.is_causal) .. (opts.attn_mask ~= nil and " and an attn_mask" or ""))
    end
    local L, S = q:size(q:dim() - 1), k:size(k:dim() - 1)
    if opts.window < S then   -- (a window as long as the keys masks nothing more)
      local dev = q.dist ~= nil and q:to_local().device or q.device
      opts = { attn_mask = F.sliding_window_mask(L, S, opts.window, dev), scale = opts.scale }
    else
      opts = { is_causal = true, scale = opts.scale }
    end
  end
  if opts.scale ~= nil and (type(opts.scale) ~= "number" or not (opts.scale > 0 and opts.scale < math.huge)) then
    T.argerror(fname, "scale", "a finite number > 0 (nil: 1/sqrt(head_dim))", T.describe(opts.scale))
  end
  local inputs = { check(q, "scaled_dot_product_attention", "query"),
                   check(k, "scaled_dot_product_attention", "key"),
                   check(v, "scaled_dot_product_attention", "value") }
  if opts.attn_mask ~= nil then inputs[4] = check(opts.attn_mask, "scaled_dot_product_attention", "attn_mask") end
  local o = op(C.LM_OP_SDPA, inputs, { opts.is_causal and 1 or 0 }, { opts.scale or 0 })
  return o   -- not the op's second output (lse, for its backward)
end

-- rotary embeddings (Llama's, interleaved pairs)
F.rope_tables = rope.rope_tables
F.apply_rotary_emb = rope.apply_rotary_emb

return F
