-- setup_filter_spec.lua: scripts/setup.sh shows the build's diagnostics
-- only: a compiler's warning or error, make's "*** ... Error", the linker's
-- undefined reference; never a progress line naming a file such as
-- core/tensor/error.c. The filter is read from setup.sh and run by grep on
-- a build log of each kind of line.
local sys = require("support.sys")

describe("setup.sh's build output", function()
  it("keeps diagnostics and drops progress lines", function()
    local src = sys.read(sys.root .. "scripts/setup.sh")
    local diag = src:match("\ndiag='([^\n]*)'\n")
    assert.is_not_nil(diag, "no diag= line in setup.sh")
    local keep = {
      "core/x.c:12:3: warning: unused variable 'a' [-Wunused-variable]",
      "core/x.c:1:10: fatal error: foo.h: No such file or directory",
      "kernels/cuda/a.cu(12): error: identifier \"x\" is undefined",
      "kernels/cuda/a.cu(3): warning #177-D: variable \"v\" was declared but never referenced",
      "make[2]: *** [CMakeFiles/loom.dir/build.make:76: x.o] Error 1",
      "/usr/bin/ld: x.o: in function `f': undefined reference to `g'",
      "CMake Error at CMakeLists.txt:3 (project):",
    }
    local drop = {
      "[ 45%] Building C object CMakeFiles/loom.dir/core/tensor/error.c.o",
      "[100%] Linking C shared library liberror.so",
      "[ 12%] Building CUDA object kernels/cuda/CMakeFiles/loom_cuda.dir/warning.cu.o",
      "-- Configuring done",
    }
    local log = sys.tmpfile(table.concat(keep, "\n") .. "\n" .. table.concat(drop, "\n") .. "\n")
    local rc, out = sys.sh("grep -E " .. sys.shq(diag) .. " " .. log .. " | grep -vE '^\\[ *[0-9]+%\\] '")
    os.remove(log)
    assert.equal(0, rc, out)
    assert.equal(table.concat(keep, "\n") .. "\n", out)
  end)
end)
