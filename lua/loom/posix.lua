-- posix.lua: the libc functions loom's Lua side calls (files, locks, memory
-- maps, clocks, the REPL's descriptors), declared in one place so that two
-- modules never declare one function two ways, and errno's message.
-- Requiring it declares them; call them through ffi.C.
local ffi = require("ffi")

-- one declaration at a time: one already made (by readline, say) fails
-- alone and leaves the rest
for _, decl in ipairs {
  "typedef struct { long tv_sec; long tv_nsec; } loom_timespec;",
  "typedef struct FILE FILE;",
  "int open(const char *path, int flags, ...);",
  "int close(int fd);",
  "int64_t lseek(int fd, int64_t offset, int whence);",
  "long read(int fd, void *buf, size_t n);",
  "long write(int fd, const void *buf, size_t n);",
  "long pread(int fd, void *buf, size_t n, int64_t offset);",
  "int fsync(int fd);",
  "int ftruncate(int fd, int64_t length);",
  "int flock(int fd, int op);",
  "int dup(int fd);",
  "int dup2(int fd, int fd2);",
  "int isatty(int fd);",
  "int getpid(void);",
  "void *mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t off);",
  "int munmap(void *addr, size_t len);",
  "int memcmp(const void *a, const void *b, size_t n);",
  "char *strerror(int errnum);",
  "int clock_gettime(int clk, loom_timespec *ts);",
  "int nanosleep(const loom_timespec *req, loom_timespec *rem);",
  "FILE *tmpfile(void);",
  "FILE *fdopen(int fd, const char *mode);",
  "int fileno(FILE *f);",
  "int fflush(FILE *f);",
  "int fclose(FILE *f);",
} do pcall(ffi.cdef, decl) end

local M = {}

-- errno_msg(): the message of errno, as strerror gives it
function M.errno_msg() return ffi.string(ffi.C.strerror(ffi.errno())) end

-- pread_all(fd, dst, n, offset): reads n bytes at offset of fd into dst;
-- true, or false and why (the file ended first, or the read failed)
local EINTR = 4
function M.pread_all(fd, dst, n, offset)
  dst = ffi.cast("uint8_t *", dst)
  local done = 0
  while done < n do
    local got = tonumber(ffi.C.pread(fd, dst + done, n - done, offset + done))
    if got < 0 and ffi.errno() ~= EINTR then return false, M.errno_msg() end
    if got == 0 then return false, "the file ends early: it shrank after it was opened?" end
    if got > 0 then done = done + got end
  end
  return true
end

return M
