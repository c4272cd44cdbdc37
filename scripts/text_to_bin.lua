-- text_to_bin.lua: tokenizes a text file into nanoGPT's token files,
-- DIR/train.bin and DIR/val.bin (the last --val fraction of the text): flat
-- arrays of 0-based ids (HF's), uint16 when the vocabulary fits, else uint32.
-- The text is read and encoded in chunks cut at line ends (or spaces), so
-- memory stays bounded by --chunk whatever the file's size; a text with
-- neither for 16 chunks is cut at a UTF-8 character boundary (said once).
--   luajit scripts/text_to_bin.lua --tokenizer tokenizer.json --input text.txt --out DIR
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/text_to_bin%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local ffi = require("ffi")

local FLAGS = {
  { "tokenizer", "", "tokenizer.json (Hugging Face format)" },
  { "input", "", "the text file" },
  { "out", "", "the directory for train.bin and val.bin" },
  { "val", 0.1, "the fraction of the text (its end) for val.bin" },
  { "eos", "", "a token appended after the text (e.g. <|endoftext|>)" },
  { "chunk", 1048576, "bytes encoded at a time (cut at a line end)" },
}

local function main(argv)
  local o = require("loom.train.cli").parse("text_to_bin.lua", FLAGS, argv, "Tokenizes a text file into train.bin/val.bin.")
  for _, k in ipairs { "tokenizer", "input", "out" } do
    if o[k] == "" then error("text_to_bin.lua: --" .. k .. " is required (see --help)", 0) end
  end
  if not (o.val >= 0 and o.val < 1) then error("text_to_bin.lua: --val expects a fraction in [0, 1), got " .. o.val, 0) end
  if o.chunk < 64 or o.chunk % 1 ~= 0 then
    error("text_to_bin.lua: --chunk expects an integer number of bytes >= 64, got " .. o.chunk, 0)
  end
  local mode = require("lfs").attributes(o.input, "mode")
  if mode ~= "file" then
    error("text_to_bin.lua: --input " .. o.input .. (mode and " is a " .. mode .. ", not a regular file" or ": no such file"), 0)
  end
  local tok = require("loom.text.tokenizer").from_file(o.tokenizer)
  local dtype = tok.vocab_size <= 65536 and "uint16" or "uint32"
  local ctype = dtype == "uint16" and "uint16_t[?]" or "uint32_t[?]"
  local f = assert(io.open(o.input, "rb"))
  local size = f:seek("end")
  f:seek("set", 0)
  local val_from = math.floor(size * (1 - o.val))
  require("loom.fs").mkdir_p(o.out)
  local outs = { train = assert(io.open(o.out .. "/train.bin", "wb")), val = assert(io.open(o.out .. "/val.bin", "wb")) }
  local counts, pos = { train = 0, val = 0 }, 0
  local function write(ids, which)
    local buf = ffi.new(ctype, #ids)
    for i, id in ipairs(ids) do buf[i - 1] = id - 1 end
    outs[which]:write(ffi.string(buf, ffi.sizeof(buf)))
    counts[which] = counts[which] + #ids
  end
  local function encode(piece)   -- to train, or to val once past the split point (at a line end)
    local k = val_from - pos
    if k > 0 and k < #piece then
      local nl = piece:find("\n", k, true) or #piece
      write(tok:encode(piece:sub(1, nl), { add_special_tokens = false }), "train")
      write(tok:encode(piece:sub(nl + 1), { add_special_tokens = false }), "val")
    else
      write(tok:encode(piece, { add_special_tokens = false }), k > 0 and "train" or "val")
    end
    pos = pos + #piece
  end
  -- the pieces read since the last cut (kept as a list: a text without line
  -- ends must not be copied again at each chunk), cut through the last line
  -- end (or space) of each new block, so tokens are not cut
  local pending, held, warned = {}, 0, false
  local function flush(upto)   -- encodes the pending text through byte upto, keeps the rest
    local text = table.concat(pending)
    encode(text:sub(1, upto))
    pending, held = { text:sub(upto + 1) }, #text - upto
  end
  while true do
    local block = f:read(o.chunk)
    if not block then break end
    local cut = block:match(".*\n()") or block:match(".* ()")
    pending[#pending + 1] = block
    held = held + #block
    if cut then
      flush(held - #block + cut - 1)
    elseif held > 16 * o.chunk then   -- no line end nor space for 16 chunks: a character boundary
      if not warned then
        io.stderr:write("text_to_bin.lua: no line end or space in ", held, " bytes: cut at a character boundary\n")
        warned = true
      end
      local text = table.concat(pending)
      local at = #text   -- back to the first byte of the last character (whole or not): cut before it
      while at > 1 and text:byte(at) >= 0x80 and text:byte(at) < 0xC0 do at = at - 1 end
      pending, held = { text }, #text
      flush(at - 1)
    end
  end
  if held > 0 then encode(table.concat(pending)) end
  if o.eos ~= "" then
    local id = tok.token_to_id[o.eos]
    if not id then error("text_to_bin.lua: --eos " .. o.eos .. " is not a token of the tokenizer", 0) end
    write({ id }, counts.val > 0 and "val" or "train")
  end
  f:close()
  outs.train:close()
  outs.val:close()
  print(string.format("text_to_bin: %d train and %d val tokens (%s) in %s/train.bin, %s/val.bin", counts.train,
                      counts.val, dtype, o.out, o.out))
end

require("loom.train.cli").run("text_to_bin.lua", main, arg or {})
