-- posix.lua: every libc function loom's Lua side calls (files, locks,
-- memory maps, clocks, the environment, the REPL's descriptors), declared
-- once, here, and under loom's own names: `int loom_open(...) asm("open")`
-- binds libc's open to the name loom_open, with loom's own types
-- (loom_timespec, loom_FILE). A program that declares open, clock_gettime
-- or FILE its own way through ffi.cdef, before or after require("loom"),
-- neither breaks loom nor is broken by it. Call them as ffi.C.loom_<name>.
local ffi = require("ffi")

ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } loom_timespec;
typedef struct loom_FILE loom_FILE;
int loom_open(const char *path, int flags, ...) asm("open");
int loom_close(int fd) asm("close");
int64_t loom_lseek(int fd, int64_t offset, int whence) asm("lseek");
long loom_read(int fd, void *buf, size_t n) asm("read");
long loom_write(int fd, const void *buf, size_t n) asm("write");
long loom_pread(int fd, void *buf, size_t n, int64_t offset) asm("pread");
int loom_fsync(int fd) asm("fsync");
int loom_ftruncate(int fd, int64_t length) asm("ftruncate");
int loom_flock(int fd, int op) asm("flock");
int loom_dup(int fd) asm("dup");
int loom_dup2(int fd, int fd2) asm("dup2");
int loom_isatty(int fd) asm("isatty");
int loom_getpid(void) asm("getpid");
void *loom_mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t off) asm("mmap");
int loom_munmap(void *addr, size_t len) asm("munmap");
int loom_memcmp(const void *a, const void *b, size_t n) asm("memcmp");
char *loom_strerror(int errnum) asm("strerror");
int loom_clock_gettime(int clk, loom_timespec *ts) asm("clock_gettime");
int loom_nanosleep(const loom_timespec *req, loom_timespec *rem) asm("nanosleep");
loom_FILE *loom_tmpfile(void) asm("tmpfile");
loom_FILE *loom_fdopen(int fd, const char *mode) asm("fdopen");
int loom_fileno(loom_FILE *f) asm("fileno");
int loom_fflush(loom_FILE *f) asm("fflush");
int loom_fclose(loom_FILE *f) asm("fclose");
int loom_setenv(const char *name, const char *value, int overwrite) asm("setenv");
long loom_sysconf(int name) asm("sysconf");
int loom_sched_getaffinity(int pid, size_t size, void *mask) asm("sched_getaffinity");
int loom_fnmatch(const char *pattern, const char *string, int flags) asm("fnmatch");
void *loom_malloc(size_t n) asm("malloc");
void loom_free(void *p) asm("free");
char *loom_strdup(const char *s) asm("strdup");
int loom_fputs(const char *s, loom_FILE *f) asm("fputs");
struct loom_winsize { unsigned short row, col, xpixel, ypixel; };
int loom_ioctl_winsize(int fd, unsigned long req, struct loom_winsize *w) asm("ioctl");
]]

local M = {}

-- errno_msg(): the message of errno, as strerror gives it
function M.errno_msg() return ffi.string(ffi.C.loom_strerror(ffi.errno())) end

-- now(): seconds on the monotonic clock (CLOCK_MONOTONIC)
local ts = ffi.new("loom_timespec")
function M.now()
  ffi.C.loom_clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- pread_all(fd, dst, n, offset): reads n bytes at offset of fd into dst;
-- true, or false and why (the file ended first, or the read failed)
local EINTR = 4
function M.pread_all(fd, dst, n, offset)
  dst = ffi.cast("uint8_t *", dst)
  local done = 0
  while done < n do
    local got = tonumber(ffi.C.loom_pread(fd, dst + done, n - done, offset + done))
    if got < 0 and ffi.errno() ~= EINTR then return false, M.errno_msg() end
    if got == 0 then return false, "the file ends early: it shrank after it was opened?" end
    if got > 0 then done = done + got end
  end
  return true
end

return M
