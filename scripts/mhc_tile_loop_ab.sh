#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mhc_tile_loop_ab.sh: the same-run A/B behind docs/design.md, "Not in the product" (mHC,
# clusters that run several tiles): this commit's tile loop against the one-tile kernel of
# its parent commit, on a machine with an NVIDIA GPU, about 4 minutes on the H200 host:
#   1. build fusedstep-bench and mhc_fused_test here (build-ab/new) and the parent's bench
#      (git archive HEAD^ into build-ab/parent-src, built in build-ab/parent)
#   2. mHC rows, hidden 5120 and 7168, T = 1 .. 16384: parent, this commit, twice each,
#      interleaved; then this commit with the late start forced to 0 / 2000 / 4000 ns
#      (FS_MHC_LATE_NS) at T = 337 .. 4096, and with the largest tile forced (24 at hidden
#      5120, 16 at 7168: the unbalanced tiles, extra tiles on the first clusters)
#   3. mhc_fused_test, and racecheck / memcheck over its several-tiles cases
# Usage: scripts/mhc_tile_loop_ab.sh OUT_DIR   (GoogleTest sources: GTEST=<dir>, default .deps/googletest)
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${1:?usage: $0 OUT_DIR}
mkdir -p "$OUT"
GTEST=${GTEST:-$PWD/.deps/googletest}
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/log.txt"; }
rm -rf build-ab/parent-src && mkdir -p build-ab/parent-src && git archive HEAD^ | tar -x -C build-ab/parent-src
( cmake -S . -B build-ab/new -DCMAKE_BUILD_TYPE=Release -DFUSEDSTEP_GTEST_SOURCE_DIR="$GTEST" \
    -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/configure.log" 2>&1 &&
  cmake --build build-ab/new -j12 --target fusedstep-bench mhc_fused_test > "$OUT/build.log" 2>&1 ) &
( cmake -S build-ab/parent-src -B build-ab/parent -DCMAKE_BUILD_TYPE=Release -DFUSEDSTEP_BUILD_TESTS=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/configure-parent.log" 2>&1 &&
  cmake --build build-ab/parent -j6 --target fusedstep-bench > "$OUT/build-parent.log" 2>&1 ) &
wait
log built
T=1,8,64,256,336,337,448,1024,2048,4096,16384
for r in ${ROUNDS:-1 2}; do
  for v in parent new; do
    timeout 100 build-ab/$v/bench/fusedstep-bench --op mhc --hidden 5120,7168 --tokens $T --json "$OUT/$v$r.jsonl" \
      > "$OUT/$v$r.log" 2>&1
    log "$v$r rc=$?"
  done
done
for ns in 0 2000 4000; do
  FS_MHC_LATE_NS=$ns timeout 100 build-ab/new/bench/fusedstep-bench --op mhc --hidden 5120,7168 \
    --tokens 337,448,1024,2048,4096 --json "$OUT/late$ns.jsonl" > "$OUT/late$ns.log" 2>&1
  log "late$ns rc=$?"
done
for ht in 5120:24 7168:16; do
  timeout 100 build-ab/new/bench/fusedstep-bench --op mhc --hidden ${ht%:*} --mhc-tile ${ht#*:} \
    --tokens 1024,2048,4096 --json "$OUT/tile${ht#*:}.jsonl" > "$OUT/tile${ht#*:}.log" 2>&1
  log "tile${ht#*:} rc=$?"
done
timeout 150 build-ab/new/tests/mhc_boundary/mhc_fused_test > "$OUT/mhc_fused_test.log" 2>&1
log "mhc_fused_test rc=$?"
for tool in racecheck memcheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 build-ab/new/tests/mhc_boundary/mhc_fused_test \
    --gtest_filter='*SmallSeveral*:*SmallTwoCta*' > "$OUT/sanitizer-$tool.log" 2>&1
  log "$tool rc=$?"
done
