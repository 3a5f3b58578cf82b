#!/usr/bin/env bash
# The sanitizer job of CI (.ci/run), also runnable by hand from a checkout:
#   1. AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer at exit): preset `debug`;
#   2. ThreadSanitizer: preset `tsan`, clang, whose OpenMP runtime reports its barriers to TSan.
# Both run the whole suite. A sanitizer report fails the test it happens in: UBSan is built with
# -fno-sanitize-recover, ASan and LSan stop by default, the tsan test preset sets halt_on_error=1.
# Nothing is suppressed (docs/ARCHITECTURE.md, "Sanitizers").
#
# Left out of both, as not meaningful here: fuzz_parsers (scripts/fuzz.sh) builds its targets in
# this job's ASan build and fuzzes them (the release run of the suite does that); clang_format
# checks sources; and the two goal runs of the built-in tasks (Trainer.CharTaskApproachesThe-
# EntropyFloor, Trainer.ImagesTaskReaches95PercentValidationAccuracy), whose point is the loss or
# accuracy reached after hundreds of steps: their code is the loop every other Trainer test runs
# under the sanitizers, and they were the longest tests of both runs (202 s and 45 s under ASan,
# 117 s and 36 s under TSan), so CI's wall time waited on them. The release run checks them.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
not_meaningful='^(fuzz_parsers|clang_format|Trainer\.CharTaskApproachesTheEntropyFloor|Trainer\.ImagesTaskReaches95PercentValidationAccuracy)$'
# Left out of the TSan run only (docs/ARCHITECTURE.md, "Sanitizers", lists why): the three fault
# tests that provoke a SIGBUS or run the binary under a small file-size limit. TSan's runtime
# cannot start under a low `ulimit -f` (even `fasttrain --version` dies in it with SIGBUS), and a
# SIGBUS raised inside TSan's memcpy interceptor never reaches the program's handler. These tests
# start no thread of their own; the release and ASan runs cover them.
not_under_tsan='^(Faults\.FileSizeLimitInsideACheckpointWriteIsAClearError|FaultsInProcess\.(ShardTruncatedWhileTheLoaderReadsItIsAnErrorNamingTheFile|ImageFileTruncatedWhileReadIsAnErrorNamingTheFile))$'

start=$SECONDS
echo "== sanitizers: ASan + UBSan (preset debug)"
cmake --preset debug -DFASTTRAIN_BENCH=OFF  # benchmarks time things; under ASan they test nothing
cmake --build --preset debug -j"$jobs"
ctest --preset debug -j"$jobs" -E "$not_meaningful"
asan_s=$((SECONDS - start))

start=$SECONDS
echo "== sanitizers: TSan (preset tsan)"
cmake --preset tsan
cmake --build --preset tsan -j"$jobs"
ctest --preset tsan -j"$jobs" -E "$not_meaningful|$not_under_tsan"
tsan_s=$((SECONDS - start))

echo "sanitizers: ASan + UBSan ${asan_s} s, TSan ${tsan_s} s (configure, build and tests)"
