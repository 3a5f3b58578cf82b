# Sourced by the comparison scripts (compare_cpu.sh, compare_ddp.sh, compare_loader.sh): the fair
# PyTorch peers of shared/BENCH.md and the environment they run in.
#
# Peers (FT_PEERS picks some, in this order by default):
#   torch-1.13          Debian 12's python3-torch, /usr/bin/python3, with LD_LIBRARY_PATH on the
#                       OpenMP build of OpenBLAS (Debian's default is the pthreads build, whose
#                       threads spin beside torch's OpenMP threads after every product and slow
#                       every elementwise op several times: docs/PERF.md, "fair peers");
#   torch-2.6           Debian 13's PyTorch 2.6 in the root scripts/torch26-chroot.sh makes
#                       ($FT_TORCH26_ROOT, default /var/tmp/fasttrain-torch26), eager;
#   torch-2.6-compile   the same with torch.compile (compare_cpu.sh only).
# FT_PEER_PYTHON=PATH replaces them all by one peer, "torch", run by that interpreter (a GPU
# machine's image). A peer that cannot run here is skipped with a line saying why; a peer that
# would multiply with the pthreads OpenBLAS or the reference BLAS stops the comparison
# (check_peer_blas), since its figures would be the handicapped ones.

# OpenBLAS's kernels: those of this CPU's instruction sets, for both sides (fasttrain takes the
# variable as the user's choice too: src/backend/cpu/blas_setup.cpp). OpenBLAS misdetects some
# AVX-512 VMs and falls back to SSE3 kernels, and some machines set OPENBLAS_CORETYPE=Haswell (with
# OPENBLAS_L2_SIZE) for older OpenBLAS builds' sake: measured 2026-11-29 on Zen 5, PyTorch 1.13's
# mlp fp32 step took 46.5 ms with Haswell's kernels and 24.6 ms with Cooperlake's, which compute the
# same products (check_peer_blas checks each peer's product against float64). Both variables are
# replaced here, in the comparison's process only; FT_KEEP_OPENBLAS_ENV=1 keeps them as they are.
if [ -z "${FT_KEEP_OPENBLAS_ENV:-}" ] && grep -q avx512f /proc/cpuinfo; then
  unset OPENBLAS_L2_SIZE
  if grep -q avx512_bf16 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Cooperlake; else export OPENBLAS_CORETYPE=SkylakeX; fi
fi

# glibc's malloc hands every large block back to the OS when it is freed and maps it anew on the
# next request, so a program without a caching allocator of its own, as PyTorch on the CPU, pays a
# page fault for every 4 KiB of every large tensor on every step. Measured 2026-11-29 on Zen 5: a
# 196 MiB tensor (gpt2-124m's logits) cost 328 ms of faults per allocation; PyTorch 2.6's mlp fp32
# step took 56.2 ms by default and 11.8 ms without them. PyTorch's CPU performance guide answers
# with a caching malloc (jemalloc, tcmalloc); glibc's own thresholds do the same with no package:
# never map large blocks separately, never trim the heap. Both sides run with them (fasttrain's
# caching allocator does the same inside); FT_KEEP_MALLOC_ENV=1 keeps glibc's defaults.
if [ -z "${FT_KEEP_MALLOC_ENV:-}" ]; then
  export MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296
fi

peer_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
torch26_root="${FT_TORCH26_ROOT:-/var/tmp/fasttrain-torch26}"
openblas_openmp_dir=/usr/lib/x86_64-linux-gnu/openblas-openmp

# The peers to run, one name a line; the skipped ones are reported on stderr.
peer_names() {
  if [ -n "${FT_PEER_PYTHON:-}" ]; then
    echo torch
    return
  fi
  local name
  for name in ${FT_PEERS:-torch-1.13 torch-2.6 torch-2.6-compile}; do
    case "$name" in
      torch-1.13)
        if [ -d "$openblas_openmp_dir" ]; then echo "$name"; else
          echo "peer $name skipped: $openblas_openmp_dir missing (apt-get install libopenblas0-openmp)" >&2
        fi ;;
      torch-2.6|torch-2.6-compile)
        # After a reboot the root is there but unmounted: the script mounts /proc, /sys and /dev again.
        if [ -x "$torch26_root/usr/bin/python3" ] && [ "$(id -u)" -eq 0 ] &&
          { mountpoint -q "$torch26_root/proc" || "$peer_here/../scripts/torch26-chroot.sh" "$torch26_root" >&2; }; then
          echo "$name"
        else
          echo "peer $name skipped: no PyTorch 2.6 root at $torch26_root, or not root (make it with" \
            "scripts/torch26-chroot.sh)" >&2
        fi ;;
      *) echo "peer_env.sh: unknown peer '$name' (expected torch-1.13, torch-2.6 or torch-2.6-compile)" >&2
         return 2 ;;
    esac
  done
}

# peer_command NAME SCRIPT: sets the array peer_cmd to the command that runs bench/SCRIPT (a file
# beside this one) under peer NAME; append the script's arguments to it.
peer_command() {
  local name="$1" script="$2"
  case "$name" in
    torch) peer_cmd=("$FT_PEER_PYTHON" "$peer_here/$script") ;;
    torch-1.13)
      peer_cmd=(env "LD_LIBRARY_PATH=$openblas_openmp_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" /usr/bin/python3
        "$peer_here/$script") ;;
    torch-2.6|torch-2.6-compile)
      # The root sees only its own files: the peer's scripts are copied in (cheap, and always current).
      mkdir -p "$torch26_root/opt/fasttrain-peer"
      cp "$peer_here"/torch_*.py "$peer_here"/micro_cases*.json "$torch26_root/opt/fasttrain-peer/"
      peer_cmd=(chroot "$torch26_root" python3 "/opt/fasttrain-peer/$script")
      if [ "$name" = torch-2.6-compile ]; then peer_cmd+=(--compile); fi ;;
    *) echo "peer_env.sh: unknown peer '$name'" >&2; return 2 ;;
  esac
}

# peer_run NAME SCRIPT ARGS...: runs bench/SCRIPT under peer NAME.
peer_run() {
  peer_command "$1" "$2"
  shift 2
  "${peer_cmd[@]}" "$@"
}

# fair_peers [DEFAULT]: sets the array `peers` to the peers to run (FT_PEERS, else DEFAULT, else
# all three) and checks each one's BLAS; the scripts that have no compiled form pass the eager two.
fair_peers() {
  mapfile -t peers < <(FT_PEERS="${FT_PEERS:-${1:-}}" peer_names)
  local peer
  for peer in "${peers[@]}"; do check_peer_blas "$peer"; done
}

# peer_lines NAME SCRIPT ARGS...: runs bench/SCRIPT under peer NAME, its JSON lines tagged with
# the peer's name ("peer").
peer_lines() {
  local name="$1"
  shift
  peer_run "$name" "$@" | sed "s/^{/{\"peer\": \"$name\", /"
}

# check_peer_blas NAME: stops the comparison (exit 3) unless the peer multiplies with the OpenMP
# OpenBLAS, MKL or a BLAS built into torch.
check_peer_blas() {
  local line blas
  line=$(peer_run "$1" torch_bench.py --blas) || { echo "peer $1: cannot start PyTorch" >&2; exit 3; }
  blas=$(sed -E 's/.*"blas": "([^"]*)".*/\1/' <<<"$line")
  case "$blas" in
    *openblas-pthread*|*reference*|"")
      echo "peer $1 would multiply with '$blas': an unfair peer (expected the OpenMP OpenBLAS; see bench/peer_env.sh)" >&2
      exit 3 ;;
  esac
  # The kernels chosen above must compute the product: relative error of f32 against float64.
  if ! grep -q -E '"gemm_error": [0-9.e-]+' <<<"$line" ||
    ! awk -v e="$(sed -E 's/.*"gemm_error": ([0-9.e-]+).*/\1/' <<<"$line")" 'BEGIN { exit !(e < 1e-5) }'; then
    echo "peer $1: its BLAS computes a wrong f32 product with OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}: $line" >&2
    exit 3
  fi
  echo "peer $1: $line" >&2
}
