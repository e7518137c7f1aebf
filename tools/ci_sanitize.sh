#!/usr/bin/env bash
# ASan+UBSan build of the C++ suite (CUDA off) in build-asan/, then the whole ctest suite under it.
# Works on a fresh Debian 12 machine: installs clang-14 and its runtimes when missing; uses ccache
# when it is installed. Usage: tools/ci_sanitize.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD_ASAN:-build-asan}
JOBS=${JOBS:-$(nproc)}
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

need=()
command -v clang++-14 >/dev/null || need+=(clang-14)
[ -n "$(ls /usr/lib/llvm-14/lib/clang/14*/lib/linux/libclang_rt.asan-x86_64.a 2>/dev/null)" ] ||
  need+=(libclang-rt-14-dev)
[ -n "$(ls /usr/lib/llvm-14/lib/clang/14*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ] ||
  need+=(libclang-rt-14-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

# The Python module is off: an instrumented _C.so cannot load into an uninstrumented python3.
t0=$(date +%s)
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOONGFORGE_CUDA=OFF \
  -DLOONGFORGE_PYTHON=OFF -DLOONGFORGE_SANITIZE=address,undefined \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 "${launcher[@]}" >/dev/null
# The test binary and what it runs (the CLI, the allocator library); not the benches.
cmake --build "$BUILD" -j "$JOBS" --target loongforge_tests
t1=$(date +%s)

export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=0:check_initialization_order=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$ROOT/fuzz/lsan.supp:print_suppressions=0"
(cd "$BUILD" && ctest --output-on-failure -j "$JOBS" --timeout 600 "$@")
t2=$(date +%s)
echo "ci_sanitize: build $((t1 - t0)) s, ctest $((t2 - t1)) s"
