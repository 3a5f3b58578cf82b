#!/usr/bin/env bash
# The README's promise, checked: its two commands, exactly as written there, on a fresh Debian 12.
# Makes a Debian 12 root with debootstrap (minbase, plus git: the user cloned the project with
# it), clones the given commit of this repository into it, and runs the README's two commands
# ("The two commands" section, read from the README of that commit) one after the other inside
# it (chroot), printing each one's wall time and exit status, and the last lines of its output;
# the whole output is kept in DIR/clean-room-<n>.log. CI cannot prove this: its machine already
# has many of the packages. Not part of the test suite (it takes as long as both commands).
# usage: scripts/clean-room.sh [COMMIT (default HEAD)] [DIR (default /var/tmp/fasttrain-clean-room)]
# Needs root and Debian's package registry; the root is made anew each time (the old one removed).
# A CUDA toolkit is not installed: a fresh machine has none, so the build is the CPU one.
# Containerfile (beside the README) runs the same steps for image builders.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
commit="$(git -C "$repo" rev-parse "${1:-HEAD}")"
root="${2:-/var/tmp/fasttrain-clean-room}"
[ "$(id -u)" -eq 0 ] || { echo "clean-room.sh: needs root (debootstrap, chroot, mount)" >&2; exit 2; }
if ! command -v debootstrap >/dev/null; then
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
fi

unmount_all() {
  local m
  for m in dev/shm dev/pts dev sys proc; do
    mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m"
  done
  return 0
}
trap unmount_all EXIT
if [ -e "$root" ]; then
  unmount_all
  rm -rf --one-file-system "$root"
fi

start=$SECONDS
echo "clean-room: Debian 12 (bookworm) minbase root in $root" >&2
debootstrap --variant=minbase --include=git,ca-certificates bookworm "$root" http://deb.debian.org/debian \
  >"$root.debootstrap.log" 2>&1 || { tail -20 "$root.debootstrap.log" >&2; exit 1; }
# The package sources of a Debian 12 install: the release, its updates and its security updates.
cat >"$root/etc/apt/sources.list" <<'LIST'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
LIST
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
echo "clean-room: root made in $(( SECONDS - start )) s" >&2

# A clean clone of the commit, as a user gets it.
git clone -q --no-local "$repo" "$root/root/fasttrain"
git -C "$root/root/fasttrain" checkout -q "$commit"
echo "clean-room: commit $commit ($(git -C "$repo" log -1 --format=%s "$commit" | cut -c1-70))" >&2

# The two commands: the first two sh blocks of the README's "The two commands" section.
mapfile -t commands < <(awk '/^## The two commands/ { on = 1; next } on && /^## / { exit }
  on && /^```sh/ { block = 1; next } block && /^```/ { block = 0; if (++blocks == 2) exit; next } block { print }' \
  "$root/root/fasttrain/README.md")
[ "${#commands[@]}" -eq 2 ] || { echo "clean-room: expected two commands in the README, found ${#commands[@]}" >&2; exit 1; }

status=0
for i in 0 1; do
  log="$root.command-$((i + 1)).log"
  echo "clean-room: command $((i + 1)): ${commands[$i]}" >&2
  t0=$SECONDS
  rc=0
  # A login shell of a fresh machine's root: HOME, a standard PATH, no variables of this one.
  env -i HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    chroot "$root" bash -lc "cd /root/fasttrain && ${commands[$i]}" >"$log" 2>&1 || rc=$?
  echo "clean-room: command $((i + 1)): exit $rc after $(( SECONDS - t0 )) s (log: $log); its last lines:" >&2
  tail -8 "$log" | sed 's/^/    /' >&2
  [ "$rc" -eq 0 ] || status=1
done
echo "clean-room: done in $(( SECONDS - start )) s, $([ $status -eq 0 ] && echo 'both commands passed' || echo 'a command FAILED')" >&2
exit $status
