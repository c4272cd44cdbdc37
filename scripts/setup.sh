#!/usr/bin/env bash
# setup.sh: installs what loom needs on Debian 12 (only what is missing) and
# builds libloom into build/. Idempotent; run as root (or with sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake pkg-config luajit libluajit-5.1-dev lua-busted luarocks
      lua-dkjson lua-argparse lua-filesystem
      lua-check   # luacheck, the suite's lint (scripts/lint.sh)
      libpcre2-dev lua-cjson   # tokenizers: PCRE2 for the pre-tokenizers' regexes (FFI), cjson for tokenizer.json
      libutf8proc2   # tokenizers: NFC/NFKC normalizers and White_Space (lua/loom/text/unicode.lua, FFI)
      libreadline8   # the REPL's line editing, history and completion (lua/loom/repl/readline.lua)
      libdnnl-dev   # oneDNN: bf16 GEMMs with the CPU's bf16 dot products (kernels/cpu/gemm_dnnl.c; optional)
      libopenblas-dev libopenmpi-dev openmpi-bin gnuplot-nox valgrind
      python3)   # only for the benchmarks' PyTorch baseline script (cli_spec runs its --help)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
# the compilers' diagnostics only ("file:12:3: warning: ...", nvcc's "error :",
# make's "*** ... Error 1", the linker's), not progress lines that name a
# file such as core/tensor/error.c; a failed build shows its last lines too
log=$(mktemp)
rc=0
cmake --build build -j"$(nproc)" >"$log" 2>&1 || rc=$?
diag='(^|[: ])(fatal )?(error|warning) ?(#[0-9A-Za-z-]+)?:|\*\*\* |^CMake (Error|Warning)|undefined reference'
grep -E "$diag" "$log" | grep -vE '^\[ *[0-9]+%\] ' || true
[ $rc -eq 0 ] || { echo "setup: the build failed; its last lines:"; tail -n 20 "$log"; }
rm -f "$log"
test -f build/libloom.so || { echo "setup: the build failed"; exit 1; }
echo "setup: build/libloom.so is ready"
