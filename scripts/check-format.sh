#!/usr/bin/env bash
# Fails when a tracked C++ or CUDA file differs from what clang-format (.clang-format) makes of
# it. `scripts/check-format.sh --fix` rewrites them instead. Exit 77 (a CTest skip) when
# clang-format is not installed or the tree is not a git checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "SKIP: clang-format not installed"; exit 77; }
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "SKIP: not a git checkout"; exit 77; }
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
clang-format --dry-run -Werror "${files[@]}"
echo "check-format: ${#files[@]} files match .clang-format"
