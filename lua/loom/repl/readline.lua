-- readline.lua: GNU readline (libreadline8) through the FFI, for the REPL:
-- line editing, history kept in a file (~/.loom_history), Tab completion
-- by a Lua function, and Ctrl-C at the prompt clearing the line (the
-- SIGINT handler is loom's, core/entry/interrupt.c; a read it interrupts
-- calls rl_signal_event_hook, here). open() returns nil and the reason
-- when the library is missing; the REPL then reads plain lines.
local ffi = require("ffi")

-- (declared under loom's own names, asm labels, as loom.posix does: a
-- program's own declarations of readline's functions cannot clash)
require("loom.posix")   -- loom_FILE, loom_malloc, loom_strdup, loom_free, loom_fputs, loom_fflush
ffi.cdef [[
char *loom_readline(const char *prompt) asm("readline");
void loom_add_history(const char *line) asm("add_history");
int loom_read_history(const char *filename) asm("read_history");
int loom_append_history(int n, const char *filename) asm("append_history");
int loom_history_truncate_file(const char *filename, int lines) asm("history_truncate_file");
typedef char **loom_rl_completion_func(const char *text, int start, int end);
typedef int loom_rl_hook_func(void);
extern loom_rl_completion_func *loom_rl_attempted_completion_function asm("rl_attempted_completion_function");
extern loom_rl_hook_func *loom_rl_signal_event_hook asm("rl_signal_event_hook");
extern const char *loom_rl_readline_name asm("rl_readline_name");
extern const char *loom_rl_basic_word_break_characters asm("rl_basic_word_break_characters");
extern char *loom_rl_line_buffer asm("rl_line_buffer");
extern int loom_rl_attempted_completion_over asm("rl_attempted_completion_over");
extern int loom_rl_completion_append_character asm("rl_completion_append_character");
extern int loom_rl_catch_signals asm("rl_catch_signals");
extern int loom_rl_catch_sigwinch asm("rl_catch_sigwinch");
extern int loom_rl_point asm("rl_point");
extern loom_FILE *loom_rl_instream asm("rl_instream");
extern loom_FILE *loom_rl_outstream asm("rl_outstream");
extern int loom_rl_end asm("rl_end");
int loom_rl_replace_line(const char *text, int clear_undo) asm("rl_replace_line");
int loom_rl_crlf(void) asm("rl_crlf");
int loom_rl_on_new_line(void) asm("rl_on_new_line");
void loom_rl_redisplay(void) asm("rl_redisplay");
int loom_rl_set_prompt(const char *prompt) asm("rl_set_prompt");
]]

local M = {}
local Reader = {}
Reader.__index = Reader

local function load_lib()
  for _, name in ipairs { "readline", "libreadline.so.8", "libreadline.so" } do
    local ok, lib = pcall(ffi.load, name)
    if ok then return lib end
  end
  return nil, "libreadline not found (apt-get install libreadline8)"
end

-- an array of C strings readline frees: {common prefix, matches...}, NULL
local function c_matches(list)
  local p = ffi.cast("char**", ffi.C.loom_malloc(ffi.sizeof("char*") * (#list + 2)))
  local prefix = list[1]
  for i = 2, #list do
    local j = 0
    while j < #prefix and prefix:byte(j + 1) == list[i]:byte(j + 1) do j = j + 1 end
    prefix = prefix:sub(1, j)
  end
  p[0] = ffi.C.loom_strdup(prefix)
  local n = #list == 1 and 0 or #list
  for i = 1, n do p[i] = ffi.C.loom_strdup(list[i]) end
  p[n + 1] = nil
  return p
end

-- open{history = path, complete = fn(word, line) -> list}: a reader, or
-- nil and why not
function M.open(opts)
  local rl, why = load_lib()
  if not rl then return nil, why end
  local self = setmetatable({ rl = rl, history = opts.history, interrupted = false }, Reader)
  rl.loom_rl_readline_name = "loom"
  rl.loom_rl_catch_signals = 0   -- loom's handler takes SIGINT; readline's own would end the read
  -- a word is a dotted name (loom.nn.Lin, x:si, ?loom.ze): . and : do not break it
  self.breaks = ffi.new("char[?]", 64, " \t\n\"\\'`@$><=;|&{(,+-*/%^~#[]}?")
  rl.loom_rl_basic_word_break_characters = self.breaks
  self.complete_cb = ffi.cast("loom_rl_completion_func*", function(text, start, stop)
    rl.loom_rl_attempted_completion_over = 1   -- no file names
    local ok, list = pcall(opts.complete, ffi.string(text), ffi.string(rl.loom_rl_line_buffer, start))
    if not ok or type(list) ~= "table" or #list == 0 then return nil end
    rl.loom_rl_completion_append_character = 0   -- loom.nn| goes on with . or (, not a space
    return c_matches(list)
  end)
  rl.loom_rl_attempted_completion_function = self.complete_cb
  -- Ctrl-C at the prompt: a new, empty line (and a chunk in progress dropped)
  self.signal_cb = ffi.cast("loom_rl_hook_func*", function()
    local C = require("loom.lib").C
    if C.lm_interrupt_take() == 1 then
      self.interrupted = true
      rl.loom_rl_replace_line("", 0)
      local out = rl.loom_rl_outstream ~= nil and rl.loom_rl_outstream or nil
      if out then ffi.C.loom_fputs("^C", out) ffi.C.loom_fflush(out) end
      rl.loom_rl_crlf()
      rl.loom_rl_set_prompt(self.first_prompt or "")
      rl.loom_rl_on_new_line()
      rl.loom_rl_redisplay()
    end
    return 0
  end)
  rl.loom_rl_signal_event_hook = self.signal_cb
  if self.history then
    local f = io.open(self.history, "a")   -- append_history needs the file
    if f then f:close() end
    rl.loom_read_history(self.history)
  end
  return self
end

-- r:line(prompt): a line (without its newline), or nil at the end of input
function Reader:line(prompt)
  local p = self.rl.loom_readline(prompt)
  if p == nil then return nil end
  local s = ffi.string(p)
  ffi.C.loom_free(p)
  if s:match("%S") and s ~= self.last then
    self.rl.loom_add_history(s)
    self.last = s
    if self.history then self.rl.loom_append_history(1, self.history) end
  end
  return s
end
-- callbacks run inside readline(): the call that enters it must not be compiled
jit.off(Reader.line)

function Reader:close()
  if self.history then self.rl.loom_history_truncate_file(self.history, 1000) end
end

return M
