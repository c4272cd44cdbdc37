-- loom.repl: the interactive REPL of the `loom` command (scripts/loom).
-- Lines are read through GNU readline when stdin is a terminal (editing,
-- history in ~/.loom_history, Tab completion), else plain lines with no
-- prompt; each chunk runs in one session (session.lua). Exit status: 0, or
-- 1 when input was piped and a chunk failed.
local ffi = require("ffi")
local session = require("loom.repl.session")
local complete = require("loom.repl.complete")
local chunk = require("loom.repl.chunk")

require("loom.posix")   -- declares isatty

local M = {}

local function history_path()
  local p = os.getenv("LOOM_HISTORY")
  if p then return p ~= "" and p or nil end
  local home = os.getenv("HOME")
  return home and home .. "/.loom_history" or nil
end

-- plain lines (stdin not a terminal, or no readline)
local function plain_reader(prompting)
  return {
    line = function(_, prompt)
      if prompting then io.write(prompt) io.flush() end
      return io.read("*l")
    end,
    close = function() end,
  }
end

-- reader(env, tty): a line reader and whether it is readline
function M.reader(env, tty)
  if tty then
    local r, why = require("loom.repl.readline").open {
      history = history_path(),
      complete = function(word) return complete.candidates(env, word) end,
    }
    if r then return r, true end
    io.stderr:write("loom: " .. why .. "; reading plain lines\n")
  end
  local want = os.getenv("LOOM_REPL_PROMPT")
  return plain_reader(want == "1" or (want ~= "0" and tty)), false
end

-- read_chunk(reader): lines until they make a whole chunk; nil at the end
-- of input. Ctrl-C at a prompt (reader.interrupted) drops what was typed.
-- The pending chunk is compiled only when it may be whole (chunk.scanner:
-- its blocks and brackets closed), while it is small (so that a mistake
-- typed inside a block shows at once) and when it has doubled: reading a
-- chunk of n lines costs O(n).
local SMALL = 1024
function M.read_chunk(reader)
  local lines, scan, size, next_try
  local function reset() lines, scan, size, next_try = {}, chunk.scanner(), 0, 0 end
  reset()
  reader.first_prompt = "loom> "
  while true do
    reader.interrupted = false
    local line = reader:line(#lines == 0 and "loom> " or "...> ")
    if reader.interrupted then reset() end
    if not line then return #lines > 0 and table.concat(lines, "\n") or nil end
    if reader.interrupted then reset() end
    lines[#lines + 1] = line
    size = size + #line + 1
    scan:feed(line)
    if scan:maybe_whole() or size < SMALL or size >= next_try then
      local src = table.concat(lines, "\n")
      if not session.incomplete(src) then return src end
      next_try = 2 * size
    end
  end
end

M.BANNER = "loom REPL (LuaJIT): `loom` is loaded; help() or ?name for help, Tab completes, "
            .. "Ctrl-C interrupts, quit() or Ctrl-D leaves"

function M.main(args)
  args = args or {}
  if args[1] == "-h" or args[1] == "--help" then
    print("usage: loom            the interactive REPL (help() inside it)\n"
       .. "       loom < file.lua  runs the chunks of file.lua as typed; exit 1 when one failed\n"
       .. "       loom --env       the shell line for `luajit script.lua` to find this loom:\n"
       .. "                        eval \"$(loom --env)\"\n"
       .. "SPMD on N ranks: scripts/loomrun -n N --repl. History: ~/.loom_history (LOOM_HISTORY)")
    return 0
  end
  if args[1] then
    io.stderr:write("loom: unknown argument " .. args[1] .. " (loom takes no arguments; run a script with luajit)\n")
    return 2
  end
  local s = session.new()
  local tty = ffi.C.loom_isatty(0) == 1
  session.install_interrupt()
  local reader = M.reader(s.env, tty)
  if tty then print(M.BANNER) end
  while not s.quit do
    local src = M.read_chunk(reader)
    if not src then break end
    s:run(src)
    io.stdout:flush()
  end
  reader:close()
  if tty and not s.quit then io.write("\n") end
  return (not tty and s.failed > 0) and 1 or 0
end

return M
