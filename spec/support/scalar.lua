-- scalar.lua: scalar functions Lua lacks (erf, GELU, SiLU ...) in f64, and
-- rounding a double to the precision of a narrower float. Part of the spec
-- references: support/ref.lua gives these as R.erf, R.gelu, R.bf16 ...
local R = {}

-- erf: Taylor series for |x| < 3 (error ~1e-13); erfc for x >= 0.5 from
-- its continued fraction (evaluated backwards with many terms), so the tails
-- keep their relative accuracy
local function erf_series(ax)
  local sum, term, n = 0, ax, 0
  repeat
    local t = term / (2 * n + 1)
    sum = sum + t
    n = n + 1
    term = -term * ax * ax / n
  until math.abs(t) < 1e-17 * math.abs(sum) or n > 200
  return 2 / math.sqrt(math.pi) * sum
end

-- erfc(x[, terms]): terms of the continued fraction, 4000 unless given
-- (1000 agree to the last bit on [0.5, 2] and are faster for many points)
function R.erfc(x, terms)
  if x ~= x then return x end
  if x < 0.5 then return 1 - R.erf(x) end
  -- erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))
  local f = x
  for k = terms or 4000, 1, -1 do f = x + (k / 2) / f end
  return math.exp(-x * x) / math.sqrt(math.pi) / f
end

function R.erf(x)
  if x ~= x then return x end
  local ax = math.abs(x)
  local r = ax < 2 and erf_series(ax) or 1 - R.erfc(ax)
  return x < 0 and -r or r
end

function R.sigmoid(x) return 1 / (1 + math.exp(-x)) end
function R.gelu(x)
  if x < 0 then return 0.5 * x * R.erfc(-x / math.sqrt(2)) end
  return 0.5 * x * (1 + R.erf(x / math.sqrt(2)))
end
function R.gelu_tanh(x)
  return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3)))
end
function R.silu(x) return x / (1 + math.exp(-x)) end
function R.sign(x) return x > 0 and 1 or x < 0 and -1 or 0 end

-- rounds a double to `bits` significant bits, nearest even (bf16: 8, f16: 11,
-- f32: 24), ignoring range limits
function R.round_bits(x, bits)
  if x == 0 or x ~= x or math.abs(x) == math.huge then return x end
  local m, e = math.frexp(x)            -- x = m * 2^e, 0.5 <= |m| < 1
  local scaled = m * 2 ^ bits
  local fl = math.floor(scaled)
  local frac = scaled - fl
  local r
  if frac > 0.5 then r = fl + 1
  elseif frac < 0.5 then r = fl
  else r = (fl % 2 == 0) and fl or fl + 1 end
  return math.ldexp(r, e - bits)
end
function R.bf16(x) return R.round_bits(x, 8) end
function R.f16(x) return R.round_bits(x, 11) end
function R.f32(x) return R.round_bits(x, 24) end

return R
