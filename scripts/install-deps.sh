#!/usr/bin/env bash
# Installs the Debian 12 packages fasttrain needs to build and test, if any are missing.
# Everything comes from Debian; the CUDA toolkit, when present at /usr/local/cuda, is used as is.
set -euo pipefail

packages=(
  build-essential cmake            # compiler and build system
  pkg-config                       # test install_and_consume builds a program with fasttrain.pc
  libgtest-dev                     # GoogleTest
  libopenblas-dev libopenblas0-openmp  # BLAS for f32/f64 GEMM (OpenMP build: one thread pool with ours)
  libopenblas0-pthread             # the BLAS Debian's PyTorch (the benchmark peer) uses
  libdnnl-dev                      # oneDNN: bf16 GEMM and convolutions on the CPU
  nlohmann-json3-dev               # JSON (checkpoint metadata, parity references)
  libtomlplusplus-dev libcli11-dev # run configuration files (TOML) and command-line parsing
  libjpeg62-turbo-dev libpng-dev   # JPEG and PNG decoding (ImageFolderDataset, --task classify --data folder:DIR)
  zlib1g-dev                       # gzip-compressed datasets read as published (MNIST's .gz files)
  libpcre2-dev                     # tokenizer.json's Split patterns (Unicode-property regexes, JIT-compiled)
  python3 python3-numpy python3-torch   # PyTorch reference values for the parity tests and the peer benchmarks
  clang                            # libFuzzer builds of the file parsers (test fuzz_parsers)
  libclang-rt-14-dev               # clang's sanitizer and libFuzzer runtimes (not pulled in without recommends; the clean room showed it)
  libomp-dev                       # clang's OpenMP runtime and Archer, for the TSan build (scripts/sanitizers.sh)
  lld                              # LLVM's linker for the two clang sanitizer builds: a test links in a fifth of ld.bfd's time (CI time)
  clang-format                     # the format check (test clang_format, scripts/check-format.sh)
  chromium                         # headless rendering check of the run report (test_report)
  libopenmpi-dev openmpi-bin       # Open MPI: data-parallel jobs (src/dist), mpirun for their tests
  time                             # GNU time: the benchmarks' max RSS of each side (bench/compare_cpu.sh)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
