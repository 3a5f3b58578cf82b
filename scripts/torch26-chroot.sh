#!/usr/bin/env bash
# The second CPU peer of the benchmarks (shared/BENCH.md, "Protocol"): a Debian 13 root holding
# Debian's PyTorch 2.6 with the OpenMP build of OpenBLAS selected, and g++ with torch's C++ headers
# where torch.compile's C++ backend (inductor) looks for them. Made once with debootstrap (root and
# Debian's package registry; a few minutes and about 1.5 GB), then reused: a second call only
# mounts /proc, /sys and /dev again after a reboot. Prints the peer's torch version and BLAS.
# usage: scripts/torch26-chroot.sh [DIR]   (default: $FT_TORCH26_ROOT, else /var/tmp/fasttrain-torch26)
# The comparison scripts (bench/peer_env.sh) run the peer as `chroot DIR python3 ...` when DIR holds it.
set -euo pipefail
root="${1:-${FT_TORCH26_ROOT:-/var/tmp/fasttrain-torch26}}"
[ "$(id -u)" -eq 0 ] || { echo "torch26-chroot.sh: needs root (debootstrap, chroot, mount)" >&2; exit 2; }
if ! command -v debootstrap >/dev/null; then
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
fi
mount_into() {
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  mountpoint -q "$root/sys" || mount --rbind /sys "$root/sys"
  mountpoint -q "$root/dev" || mount --rbind /dev "$root/dev"
}
if [ ! -x "$root/usr/bin/python3" ] || ! chroot "$root" python3 -c "import torch" 2>/dev/null; then
  echo "torch26-chroot.sh: making the Debian 13 root in $root (debootstrap)" >&2
  debootstrap --variant=minbase \
    --include=python3-torch,python3-numpy,libopenblas0-openmp,g++,python3-dev,libtorch-dev trixie "$root" >&2
fi
mount_into
# Every BLAS and LAPACK alternative to the OpenMP build: Debian's default, the pthreads build,
# spins its threads beside torch's OpenMP ones after each product (docs/PERF.md, fair peers).
chroot "$root" bash -c '
  for alt in $(update-alternatives --get-selections | awk "/blas|lapack/ { print \$1 }"); do
    choice=$(update-alternatives --list "$alt" | grep openblas-openmp | head -1)
    [ -n "$choice" ] && update-alternatives --set "$alt" "$choice" >/dev/null
  done
  ldconfig
  # inductor compiles its kernels against torch/include; Debian keeps those headers in /usr/include.
  cd /usr/lib/python3/dist-packages/torch && mkdir -p include && cd include &&
    for d in ATen c10 torch caffe2; do [ -e "/usr/include/$d" ] && ln -sfn "/usr/include/$d" "$d"; done; true'
chroot "$root" python3 -c "
import torch
torch.ones(64, 64) @ torch.ones(64, 64)
blas = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'blas' in l.split()[-1]})
print('torch', torch.__version__, torch.backends.cpu.get_cpu_capability(), ' '.join(blas))"
