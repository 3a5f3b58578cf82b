#!/usr/bin/env bash
# Builds here what scripts/gpu-check.sh runs on a lent GPU machine whose image lacks the build's
# Debian packages (the device tool's CUDA image has the toolkit but no OpenBLAS, oneDNN or
# GoogleTest): a portable build (no -march=native) of the CLI and the CUDA tests, packed with the
# shared libraries they load that such an image lacks, into build/gpu-carry/bundle.tar.xz. The
# CUDA toolkit's own libraries (cuBLASLt) are the machine's. Carry build/gpu-carry with the call.
# Usage: scripts/gpu-bundle.sh [--pack-only]   (--pack-only: pack what build/gpu-bundle holds)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/gpu-bundle
carry=build/gpu-carry
mapfile -t tests < <(cd tests/cuda && ls test_*.cpp | sed 's/\.cpp$//; s/^/cuda_/')
if [ "${1:-}" != --pack-only ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFASTTRAIN_CUDA=ON -DFASTTRAIN_FUZZ=OFF -DFASTTRAIN_NATIVE=OFF >/dev/null
  cmake --build "$build" -j"$(nproc)" --target fasttrain_cli micro_ops "${tests[@]}"
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$carry"
cp "$build/fasttrain" "$build/micro_ops" "$stage/bin/"
for t in "${tests[@]}"; do cp "$build/tests/$t" "$stage/bin/"; done
strip "$stage"/bin/*  # symbols are most of their size, and the call carries 64 MiB at most
# Every library the binaries load from this system except glibc's own (the machine's is newer)
# and the CUDA toolkit's.
ldd "$stage"/bin/* | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux-x86-64)\.so|/usr/local/cuda' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
XZ_OPT=-9 tar -C "$stage" -cJf "$carry/bundle.tar.xz" .
ls -la "$carry/bundle.tar.xz"
