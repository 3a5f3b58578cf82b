#!/usr/bin/env bash
# One call on a GPU machine: the CUDA tests, then the GPU benchmarks beside PyTorch in the same
# run (fasttrain bench and bench/torch_bench.py alternately, same workload, batch and precision).
#
# Two ways to get the binaries:
# - build/gpu-carry/bundle.tar.xz present (scripts/gpu-bundle.sh made it on a Debian machine and
#   the device call carried build/gpu-carry): unpack and run them; the machine needs only a driver,
#   the CUDA toolkit's cuBLASLt (or PyTorch's copy of it) and python3 with torch.
# - otherwise: configure and build here, which needs the Debian -dev packages that
#   scripts/install-deps.sh installs (GoogleTest, nlohmann-json, toml++, CLI11, OpenBLAS, oneDNN).
#
# Results go to $OUT (the device tool's folder) or build/gpu/results: tests.txt (every test
# binary's output), bench.jsonl (every JSON line), gpu.txt. The summary is printed last.
# Usage: scripts/gpu-check.sh [tests|bench|all (default)] [gtest filter (default *)]
#   FT_GPU_ROWS="gpt-mini:bf16:16 ..." picks the benchmark rows (workload:precision:batch);
#   FT_GPU_PROFILE="gpt2-124m:bf16:16" also prints that row's time per op (bench --profile).
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
filter="${2:-*}"
out="${OUT:-build/gpu/results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"

if [ -f build/gpu-carry/bundle.tar.xz ]; then
  root=/tmp/fasttrain-bundle
  rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf build/gpu-carry/bundle.tar.xz
  bin="$root/bin" tests_dir="$root/bin"
  export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}"
else
  build=build/gpu
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFASTTRAIN_CUDA=ON -DFASTTRAIN_FUZZ=OFF >"$out/configure.log" ||
    { tail -20 "$out/configure.log"; exit 1; }
  cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  bin="$build" tests_dir="$build/tests"
fi
# cuBLASLt: the toolkit's, else the copy PyTorch's wheels carry.
if ! ldconfig -p | grep -q libcublasLt.so.13 && [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]; then
  lt=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null) &&
    export LD_LIBRARY_PATH="$lt:$LD_LIBRARY_PATH"
fi
"$bin/fasttrain" info | tee -a "$out/gpu.txt"

status=0
if [ "$what" != bench ]; then
  : >"$out/tests.txt"
  for t in "$tests_dir"/cuda_test_*; do
    echo "=== $(basename "$t")" >>"$out/tests.txt"
    timeout 150 "$t" --gtest_filter="$filter" >>"$out/tests.txt" 2>&1 || status=1
  done
  # bf16/f16 attention again on the CUDA-core kernels (the tensor-core ones ran above).
  echo "=== cuda_test_cuda_attention with FT_CUDA_ATTENTION_FMA=1" >>"$out/tests.txt"
  FT_CUDA_ATTENTION_FMA=1 timeout 150 "$tests_dir/cuda_test_cuda_attention" --gtest_filter="$filter" \
    >>"$out/tests.txt" 2>&1 || status=1
  # A skip here means the binary saw no GPU, which on this machine is a failure.
  grep -q "no CUDA device" "$out/tests.txt" && { echo "gpu-check: CUDA tests were skipped: no GPU seen"; status=1; }
fi

if [ "$what" != tests ]; then
  : >"$out/bench.jsonl"
  peer="${FT_PEER_PYTHON:-python3}"
  printf '%-10s %-6s %6s %12s %12s %8s\n' workload prec batch fasttrain_ms pytorch_ms ratio >"$out/bench.txt"
  # workload:precision:batch
  for row in ${FT_GPU_ROWS:-mlp:fp32:256 gpt-mini:fp32:16 gpt-mini:bf16:16 gpt2-124m:bf16:16}; do
    IFS=: read -r w p b <<<"$row"
    ft=$("$bin/fasttrain" bench --device cuda --workload "$w" --precision "$p" --batch "$b" --steps 20 --warmup 5 2>&1 | tail -1)
    pt=$("$peer" bench/torch_bench.py --device cuda --workload "$w" --precision "$p" --batch "$b" --steps 20 --warmup 5 2>&1 | tail -1)
    printf '%s\n%s\n' "$ft" "$pt" >>"$out/bench.jsonl"
    a=$(sed -nE 's/.*"ms_per_step": ([0-9.]+).*/\1/p' <<<"$ft") c=$(sed -nE 's/.*"ms_per_step": ([0-9.]+).*/\1/p' <<<"$pt")
    r=$(awk -v a="${a:-0}" -v c="${c:-0}" 'BEGIN { if (a > 0) printf "%.2f", c / a; else print "-" }')
    printf '%-10s %-6s %6s %12s %12s %8s\n' "$w" "$p" "$b" "${a:-fail}" "${c:-fail}" "$r" >>"$out/bench.txt"
  done
  for row in ${FT_GPU_PROFILE:-}; do
    IFS=: read -r w p b <<<"$row"
    "$bin/fasttrain" bench --device cuda --workload "$w" --precision "$p" --batch "$b" --steps 5 --warmup 3 \
      --profile 2 >>"$out/bench.txt" 2>&1
  done
  # The Trainer on the GPU: the README's default run, shortened.
  (cd /tmp && timeout 120 "$bin/fasttrain" train --device cuda --max-steps 300 --run-dir /tmp/ft-gpu-run) \
    >"$out/train.txt" 2>&1 || { echo "gpu-check: fasttrain train --device cuda failed"; status=1; }
  tail -4 "$out/train.txt" >>"$out/bench.txt"
fi

echo "--- summary"
if [ -f "$out/tests.txt" ] && [ "$what" != bench ]; then
  grep -E "^=== |\[  PASSED  \]|\[  FAILED  \]|tests? ran|FAILED TEST" "$out/tests.txt" | grep -v "^\[  FAILED  \] .*\.$" | head -80
fi
[ -f "$out/bench.txt" ] && [ "$what" != tests ] && cat "$out/bench.txt"
exit $status
