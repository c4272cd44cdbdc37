-- readline.lua: GNU readline (libreadline8) through the FFI, for the REPL:
-- line editing, history kept in a file (~/.loom_history), Tab completion
-- by a Lua function, and Ctrl-C at the prompt clearing the line (the
-- SIGINT handler is loom's, core/entry/interrupt.c; a read it interrupts
-- calls rl_signal_event_hook, here). open() returns nil and the reason
-- when the library is missing; the REPL then reads plain lines.
local ffi = require("ffi")

pcall(ffi.cdef, "typedef struct FILE FILE;")
pcall(ffi.cdef, [[
char *readline(const char *prompt);
void add_history(const char *line);
int read_history(const char *filename);
int append_history(int n, const char *filename);
int history_truncate_file(const char *filename, int lines);
typedef char **loom_rl_completion_func(const char *text, int start, int end);
typedef int loom_rl_hook_func(void);
extern loom_rl_completion_func *rl_attempted_completion_function;
extern loom_rl_hook_func *rl_signal_event_hook;
extern const char *rl_readline_name;
extern const char *rl_basic_word_break_characters;
extern char *rl_line_buffer;
extern int rl_attempted_completion_over;
extern int rl_completion_append_character;
extern int rl_catch_signals;
extern int rl_catch_sigwinch;
extern int rl_point;
extern FILE *rl_instream;
extern FILE *rl_outstream;
extern int rl_end;
int rl_replace_line(const char *text, int clear_undo);
int rl_crlf(void);
int rl_on_new_line(void);
void rl_redisplay(void);
int rl_set_prompt(const char *prompt);
void free(void *p);
int fputs(const char *s, FILE *f);
int fflush(FILE *f);
void *malloc(size_t n);
char *strdup(const char *s);
]])

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
  local p = ffi.cast("char**", ffi.C.malloc(ffi.sizeof("char*") * (#list + 2)))
  local prefix = list[1]
  for i = 2, #list do
    local j = 0
    while j < #prefix and prefix:byte(j + 1) == list[i]:byte(j + 1) do j = j + 1 end
    prefix = prefix:sub(1, j)
  end
  p[0] = ffi.C.strdup(prefix)
  local n = #list == 1 and 0 or #list
  for i = 1, n do p[i] = ffi.C.strdup(list[i]) end
  p[n + 1] = nil
  return p
end

-- open{history = path, complete = fn(word, line) -> list}: a reader, or
-- nil and why not
function M.open(opts)
  local rl, why = load_lib()
  if not rl then return nil, why end
  local self = setmetatable({ rl = rl, history = opts.history, interrupted = false }, Reader)
  rl.rl_readline_name = "loom"
  rl.rl_catch_signals = 0   -- loom's handler takes SIGINT; readline's own would end the read
  -- a word is a dotted name (loom.nn.Lin, x:si, ?loom.ze): . and : do not break it
  self.breaks = ffi.new("char[?]", 64, " \t\n\"\\'`@$><=;|&{(,+-*/%^~#[]}?")
  rl.rl_basic_word_break_characters = self.breaks
  self.complete_cb = ffi.cast("loom_rl_completion_func*", function(text, start, stop)
    rl.rl_attempted_completion_over = 1   -- no file names
    local ok, list = pcall(opts.complete, ffi.string(text), ffi.string(rl.rl_line_buffer, start))
    if not ok or type(list) ~= "table" or #list == 0 then return nil end
    rl.rl_completion_append_character = 0   -- loom.nn| goes on with . or (, not a space
    return c_matches(list)
  end)
  rl.rl_attempted_completion_function = self.complete_cb
  -- Ctrl-C at the prompt: a new, empty line (and a chunk in progress dropped)
  self.signal_cb = ffi.cast("loom_rl_hook_func*", function()
    local C = require("loom.lib").C
    if C.lm_interrupt_take() == 1 then
      self.interrupted = true
      rl.rl_replace_line("", 0)
      local out = rl.rl_outstream ~= nil and rl.rl_outstream or nil
      if out then ffi.C.fputs("^C", out) ffi.C.fflush(out) end
      rl.rl_crlf()
      rl.rl_set_prompt(self.first_prompt or "")
      rl.rl_on_new_line()
      rl.rl_redisplay()
    end
    return 0
  end)
  rl.rl_signal_event_hook = self.signal_cb
  if self.history then
    local f = io.open(self.history, "a")   -- append_history needs the file
    if f then f:close() end
    rl.read_history(self.history)
  end
  return self
end

-- r:line(prompt): a line (without its newline), or nil at the end of input
function Reader:line(prompt)
  local p = self.rl.readline(prompt)
  if p == nil then return nil end
  local s = ffi.string(p)
  ffi.C.free(p)
  if s:match("%S") and s ~= self.last then
    self.rl.add_history(s)
    self.last = s
    if self.history then self.rl.append_history(1, self.history) end
  end
  return s
end
-- callbacks run inside readline(): the call that enters it must not be compiled
jit.off(Reader.line)

function Reader:close()
  if self.history then self.rl.history_truncate_file(self.history, 1000) end
end

return M
