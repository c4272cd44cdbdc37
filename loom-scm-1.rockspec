rockspec_format = "3.0"
package = "loom"
version = "scm-1"
source = { url = "git+file://." }
description = {
  summary = "Tensors, autograd and tensor parallelism for LuaJIT",
  detailed = "A C11 core (tensors, autograd, DTensor, collectives; OpenBLAS, MPI, optional CUDA) "
          .. "with a LuaJIT FFI layer exposing Torch-like nn modules and PyTorch-style tensor parallelism.",
  license = "MIT",
}
dependencies = { "lua >= 5.1", "dkjson", "argparse", "luafilesystem", "lua-cjson" }   -- cjson: tokenizer.json (libpcre2-8 from the system, through the FFI)
build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    LUADIR = "$(LUADIR)",
    LIBDIR = "$(LIBDIR)",
  },
  install = { bin = { loomrun = "scripts/loomrun", loom = "scripts/loom" } },
}
