#!/usr/bin/env bash
# Test install_and_consume: fasttrain used as a dependency, the way a user's project uses it.
#   1. `cmake --install` of a built tree into a temporary prefix;
#   2. examples/ configured by a plain cmake against that prefix (CMAKE_PREFIX_PATH) in a fresh
#      folder, built, and its tests run (each example must exit with 0 and print what it should);
#   3. a one-file program built with nothing but `pkg-config --cflags --libs fasttrain`, and run;
#   4. every program built here, and the installed CLI, loads the OpenBLAS the library was built
#      with (the OpenMP build; Debian's default libopenblas.so.0 is the pthreads one): by ldd, and
#      from inside the pkg-config program (/proc/self/maps, openblas_get_parallel). That check is
#      itself tested: with the pthreads build put first on LD_LIBRARY_PATH it must report it.
# The consumers get the build's compiler and CMAKE_CXX_FLAGS (sanitizer builds need them to link)
# and nothing else: no CUDA flags, whether or not the library has the CUDA backend.
#   scripts/test-install.sh <build folder>     (the library and the CLI must be built)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:?usage: $0 <build folder>}" && pwd)"
start=$SECONDS

cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
if [ "$(cache FASTTRAIN_FUZZ)" = ON ]; then
  echo "SKIP: a FASTTRAIN_FUZZ build instruments the library for libFuzzer; it is not one to install"
  exit 77
fi
cxx="$(cache CMAKE_CXX_COMPILER)"
cxxflags="$(cache CMAKE_CXX_FLAGS)"
openblas="$(cache OPENBLAS_LIB)"
want="$(readlink -f "$openblas")"

work="$(mktemp -d "${TMPDIR:-/tmp}/fasttrain-install.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# Runs a command quietly, showing its output only when it fails.
quiet() { "$@" >"$work/log" 2>&1 || { cat "$work/log"; fail "$*"; }; }

# The OpenBLAS file ldd resolves for a program must be the one the library was built with.
check_ldd() {
  local got
  got="$(ldd "$1" | awk '$1 ~ /^libopenblas/ {print $3}')"
  [ -n "$got" ] || fail "$1: ldd lists no OpenBLAS"
  [ "$(readlink -f "$got")" = "$want" ] || fail "$1 loads $got ($(readlink -f "$got")), not $openblas ($want)"
  echo "ldd: $(basename "$1") loads $got"
}

prefix="$work/prefix"
quiet cmake --install "$build" --prefix "$prefix"
echo "installed into a temporary prefix: $(cd "$prefix" && find . -type f | wc -l) files"

# 2. The examples, as a user's CMake project.
quiet cmake -S "$root/examples" -B "$work/examples" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$cxxflags"
quiet cmake --build "$work/examples"
ctest --test-dir "$work/examples" --output-on-failure || fail "an example failed"
mapfile -t programs < <(find "$work/examples" -type f -executable -not -path '*/CMakeFiles/*')
[ ${#programs[@]} -gt 0 ] || fail "no example program was built"
for program in "${programs[@]}"; do check_ldd "$program"; done

# 3. One file and pkg-config, as a user without CMake.
pc="$(find "$prefix" -name fasttrain.pc)"
[ -n "$pc" ] || fail "no fasttrain.pc installed"
read -ra pkg_flags < <(PKG_CONFIG_PATH="$(dirname "$pc")" pkg-config --cflags --libs fasttrain)
read -ra flags <<<"$cxxflags"
quiet "$cxx" "${flags[@]}" -std=c++20 "$root/tests/install/pkgconfig_consumer.cpp" "${pkg_flags[@]}" \
  -o "$work/pkgconfig_consumer"
check_ldd "$work/pkgconfig_consumer"
report="$("$work/pkgconfig_consumer")" || fail "the pkg-config program failed: $report"
echo "pkg-config program: $report"
read -r _ mapped _ parallel <<<"$report"
[ "$(readlink -f "$mapped")" = "$want" ] || fail "the process mapped $mapped, not $openblas ($want)"
if [[ "$openblas" == */openblas-openmp/* ]]; then
  [ "$parallel" = 2 ] || fail "openblas_get_parallel() is $parallel, not 2 (the OpenMP build)"
fi

# The in-process check must be able to fail: with the pthreads build first on LD_LIBRARY_PATH
# (which a run path, DT_RUNPATH, yields to), the program must report that build instead.
pthread_dir=/usr/lib/x86_64-linux-gnu/openblas-pthread
if [ -e "$pthread_dir/libopenblas.so.0" ] && [ "$(readlink -f "$pthread_dir/libopenblas.so.0")" != "$want" ] &&
  readelf -d "$work/pkgconfig_consumer" | grep -q RUNPATH; then
  report="$(LD_LIBRARY_PATH="$pthread_dir" "$work/pkgconfig_consumer")" || fail "pkg-config program with $pthread_dir"
  read -r _ mapped _ parallel <<<"$report"
  if [ "$(readlink -f "$mapped")" != "$(readlink -f "$pthread_dir/libopenblas.so.0")" ] || [ "$parallel" != 1 ]; then
    fail "the OpenBLAS check did not see the pthreads build put first: $report"
  fi
  echo "check of the check: with $pthread_dir first the program reports \"$report\""
fi

# 4. The installed CLI: CMake rewrites a program's run path when it installs it; the OpenMP
# build's folder is a link option of fasttrain::fasttrain, so it must still be there.
quiet "$prefix/bin/fasttrain" --version
check_ldd "$prefix/bin/fasttrain"

echo "install_and_consume: passed in $((SECONDS - start)) s"
