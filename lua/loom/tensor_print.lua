-- tensor_print.lua: tensors printed Torch7 style: the values (the first
-- and last rows and columns of a big one), then a footer with dtype,
-- device and size. tostring(x) and print(x) call format(x).
local T = require("loom.tensor")
local C = require("loom.lib").C

local M = {}
local props, values = T.props, T.values

local function fmt_for(x, flat)
  if x.dtype_ >= C.LM_I32 then return "%d", 0 end
  local maxabs, allint = 0, true
  for _, v in ipairs(flat) do
    if v == v and math.abs(v) ~= math.huge then
      maxabs = math.max(maxabs, math.abs(v))
      if v ~= math.floor(v) then allint = false end
    end
  end
  if allint and maxabs < 1e9 then return "%.0f", 0 end
  if maxabs >= 1e5 or (maxabs < 1e-3 and maxabs > 0) then return "%.4e", 0 end
  return "%.4f", 0
end

-- a DTensor: its spec (loom.distributed.dtensor, loaded whenever a DTensor
-- exists) and its local shard
local function format_dtensor(x)
  return string.format("DTensor(%s, local=\n%s)", require("loom.distributed.dtensor").describe(x),
                       M.format(T.wrap(C.lm_dtensor_to_local(x))))
end

function M.format(x)
  if x.dist ~= nil then return format_dtensor(x) end
  local size = x:size()
  local footer = string.format("[loom.Tensor %s %s of size %s]", props.dtype(x), props.device(x),
                               #size == 0 and "scalar" or table.concat(size, "x"))
  if x.numel_ == 0 then return "[empty tensor]\n" .. footer end
  local full = x.numel_ <= 1000
  local p, keep = values(x)
  local flat = {}
  for i = 0, tonumber(x.numel_) - 1 do flat[#flat + 1] = p[i] end
  local _ = keep
  local f = fmt_for(x, flat)
  -- the closures below never capture x: a compiled trace would keep it
  -- (docs/architecture.md, "Rules of the house")
  local is_bool = x.dtype_ == C.LM_BOOL
  local function s(v)
    if is_bool then return v ~= 0 and "true" or "false" end
    return string.format(f, v)
  end
  local strs, width = {}, 0
  for i, v in ipairs(flat) do strs[i] = s(v) width = math.max(width, #strs[i]) end
  local function cell(i) return string.rep(" ", width - #strs[i] + 1) .. strs[i] end
  local lines = {}
  if #size == 0 then return strs[1] .. "\n" .. footer end
  local cols = size[#size]
  local rows = tonumber(x.numel_) / cols
  local function row(r)
    local parts = {}
    if full or cols <= 8 then
      for c = 1, cols do parts[c] = cell(r * cols + c) end
    else
      for c = 1, 3 do parts[#parts + 1] = cell(r * cols + c) end
      parts[#parts + 1] = " ..."
      for c = cols - 2, cols do parts[#parts + 1] = cell(r * cols + c) end
    end
    return table.concat(parts)
  end
  local rows_per_mat = #size >= 2 and size[#size - 1] or 1
  for r = 0, rows - 1 do
    local in_mat = r % rows_per_mat
    local show = full or rows <= 20 or r < 3 or r >= rows - 3
    if #size > 2 and in_mat == 0 and show then
      local idx, rem = {}, r / rows_per_mat
      for d = #size - 2, 1, -1 do idx[d] = rem % size[d] + 1 rem = math.floor(rem / size[d]) end
      if #lines > 0 then lines[#lines + 1] = "" end
      lines[#lines + 1] = "(" .. table.concat(idx, ",") .. ",.,.) = "
    end
    if show then lines[#lines + 1] = row(r)
    elseif r == 3 then lines[#lines + 1] = " ..." end
  end
  return table.concat(lines, "\n") .. "\n" .. footer
end

return M
