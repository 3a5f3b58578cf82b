#!/usr/bin/env bash
# Test no_raw_settings: every environment variable the library and the program read as a setting
# of their own is a switch declared in src/core/switches.h (docs/ARCHITECTURE.md, "Process
# switches"). A getenv call anywhere else in src/ or apps/ fails this check, except in the files
# listed here, which read what is not a setting of ours: the switches' parser, the fault
# specification, the MPI launcher's variables and OpenBLAS's own.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
allowed='^(src/core/env_setting\.h|src/core/switches\.cpp|src/core/fault_injection\.cpp|src/dist/communicator\.cpp|src/backend/cpu/blas_setup\.cpp):'
found=$(cd "$root" && grep -rn --include='*.cpp' --include='*.h' --include='*.cu' --include='*.cuh' 'getenv *(' src apps || true)
bad=$(grep -Ev "$allowed" <<<"$found" || true)
if [ -n "$bad" ]; then
  echo "FAIL: settings read from the environment outside src/core/switches.h (declare a switch there):"
  echo "$bad"
  exit 1
fi
echo "no_raw_settings: $(grep -c . <<<"$found") getenv calls, all in the allowed files"
