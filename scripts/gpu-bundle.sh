#!/usr/bin/env bash
# Builds here what scripts/gpu-check.sh runs on a lent GPU machine whose image lacks the build's
# Debian packages (the device tool's CUDA image has the toolkit but no OpenBLAS, oneDNN or
# GoogleTest): a portable build (no -march=native) of the CLI and the CUDA tests, packed with the
# shared libraries they load that such an image lacks, into build/gpu-carry/bundle.tar.xz. The
# CUDA toolkit's own libraries (cuBLASLt) are the machine's. Carry build/gpu-carry with the call.
# Open MPI's launcher goes along too (mpirun, orted, their components and help files under
# mpi/usr, the libraries they load in lib/), relocated by OPAL_PREFIX and PMIx's component path,
# which gpu-check.sh sets: the image has no MPI, and the data-parallel checks start 2 ranks.
# Usage: scripts/gpu-bundle.sh [--pack-only | --mpi-only DIR]
#   --pack-only: pack what build/gpu-bundle holds; --mpi-only DIR: only the MPI part, into DIR
#   (to check the relocation on this machine: scripts/gpu-bundle.sh --mpi-only /tmp/m, then run
#   /tmp/m/mpi/usr/bin/mpirun with gpu-check.sh's variables while /usr's Open MPI is hidden).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/gpu-bundle
carry=build/gpu-carry
mapfile -t tests < <(cd tests/cuda && ls test_*.cpp | sed 's/\.cpp$//; s/^/cuda_/')

# Open MPI's runtime (Debian's layout, under $1/mpi/usr) and the libraries it and its components
# load (into $1/lib), glibc's own and the CUDA toolkit's excepted.
pack_mpi() {
  local dest=$1 arch=/usr/lib/x86_64-linux-gnu
  local usr="$dest/mpi/usr"
  mkdir -p "$usr/bin" "$usr/lib/x86_64-linux-gnu" "$usr/share" "$dest/lib"
  cp /usr/bin/orterun /usr/bin/orted "$usr/bin/"
  ln -sf orterun "$usr/bin/mpirun"
  cp -a "$arch/openmpi" "$arch/pmix2" "$usr/lib/x86_64-linux-gnu/"
  cp -a /usr/share/openmpi "$usr/share/"
  for f in "$arch"/openmpi/lib/openmpi3/*.so "$arch"/pmix2/lib/pmix/*.so /usr/bin/orterun /usr/bin/orted; do ldd "$f"; done |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux-x86-64)\.so|/usr/local/cuda' |
    while read -r lib; do cp -L "$lib" "$dest/lib/"; done
}
if [ "${1:-}" = --mpi-only ]; then
  pack_mpi "$2"
  exit 0
fi

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
pack_mpi "$stage"
XZ_OPT=-9 tar -C "$stage" -cJf "$carry/bundle.tar.xz" .
ls -la "$carry/bundle.tar.xz"
