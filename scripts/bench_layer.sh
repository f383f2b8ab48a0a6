#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_layer.sh: the ops where engines run them, on a machine with an NVIDIA GPU, in one
# command (about 4 minutes on the 16-core H200 host: 2 to build, 2 to run):
#   1. configure + build fusedstep-bench alone (no tests)           configure.log, build.log
#   2. the back-to-back KDA q = 1 rows (12 and 24 heads, batch 1-256, FP32 state), with
#      vLLM's kernel's peer_us and peer_with_fb_us when its library is given
#                                                                   bench-kda.log, bench-kda.jsonl
#   3. --context layer: the mHC and KDA chains (cuBLAS and the early-releasing GEMM, PDL
#      off and on, the peer's rows)                                 layer.log, layer.jsonl
#   4. the layer-context table (scripts/bench_tables.py --layer)     layer-table.md
# Every step runs under a limit; the exit status is non-zero if any step failed, or if a
# peer library was given and did not load.
#
# Usage: scripts/bench_layer.sh OUT_DIR [PEER_LIB]
#   PEER_LIB (or $PEER_LIB): vLLM's CUDA KDA kernel as a shared library, already built by
#   you with the peer folder's own tooling, passed to fusedstep-bench --kda-peer-lib. This
#   repository builds none of the peer's code. With the folder restored as its README.md
#   says (e.g. at .peer/vllm_cuda_kda, git-ignored), its peer.py builds the library:
#     python3 -c "import sys; sys.path.insert(0, '.peer/vllm_cuda_kda'); import peer; \
#                 peer.build('build-peer/libvllm_kda.so')"
#   Without PEER_LIB the peer fields are absent.
# Environment:
#   BUILD=0          reuse $BUILD_DIR as built (e.g. by an earlier call), skip step 1
#   RUN=0            build only
#   BUILD_DIR=...    build directory (default build-layer)
#   ITERS=N          graph replays per measurement (default: the bench's 50)
#   STATE_DTYPE=...  --state-dtype of both runs (default fp32: the peer reads an FP32 state)
#   LAYER_ARGS="..." extra options of the layer run (e.g. "--op kda --batch 1,64")
#   T_CONFIGURE, T_BUILD, T_B2B, T_LAYER   per-step limits in seconds (60, 300, 150, 240)
#   FUSEDSTEP_COMMIT commit recorded in the JSON lines (default: git rev-parse --short HEAD)
set -u -o pipefail

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [PEER_LIB]" >&2
  exit 2
fi
OUT_DIR=$1
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
PEER_LIB=${2:-${PEER_LIB:-}}
if [ -n "$PEER_LIB" ]; then
  if [ ! -f "$PEER_LIB" ]; then
    echo "peer library $PEER_LIB not found: build it first with the peer folder's peer.py (see the header)" >&2
    exit 2
  fi
  PEER_LIB=$(cd "$(dirname "$PEER_LIB")" && pwd)/$(basename "$PEER_LIB")
fi
BUILD_DIR=${BUILD_DIR:-build-layer}
JOBS=$(nproc 2>/dev/null || echo 4)
T_CONFIGURE=${T_CONFIGURE:-60}
T_BUILD=${T_BUILD:-300}
T_B2B=${T_B2B:-150}
T_LAYER=${T_LAYER:-240}
KILL_AFTER=10
if [ -z "${FUSEDSTEP_COMMIT:-}" ]; then
  FUSEDSTEP_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
fi
export FUSEDSTEP_COMMIT

SUMMARY=()
FAILED=0
step() {  # name rc log
  case $2 in
    0) SUMMARY+=("$1: ok") ;;
    124|137) SUMMARY+=("$1: TIMEOUT -> $3"); FAILED=1 ;;
    *) SUMMARY+=("$1: FAILED (exit $2) -> $3"); FAILED=1 ;;
  esac
}
BENCH=$ROOT/$BUILD_DIR/bench/fusedstep-bench

# ---- 1. configure + build (the bench and what it links)
if [ "${BUILD:-1}" != 0 ]; then
  CMAKE_ARGS=(-S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a
              -DFUSEDSTEP_BUILD_TESTS=OFF -DFUSEDSTEP_BUILD_BENCH=ON)
  timeout -k "$KILL_AFTER" "$T_CONFIGURE" cmake "${CMAKE_ARGS[@]}" > "$OUT_DIR/configure.log" 2>&1
  rc=$?
  step configure $rc "$OUT_DIR/configure.log"
  if [ $rc = 0 ]; then
    timeout -k "$KILL_AFTER" "$T_BUILD" cmake --build "$BUILD_DIR" --target fusedstep-bench -j"$JOBS" \
      > "$OUT_DIR/build.log" 2>&1
    step build $? "$OUT_DIR/build.log"
  fi
fi

if [ "${RUN:-1}" != 0 ] && [ -x "$BENCH" ] && [ $FAILED = 0 ]; then
  COMMON_ARGS=(--state-dtype "${STATE_DTYPE:-fp32}")
  [ -n "${ITERS:-}" ] && COMMON_ARGS+=(--iters "$ITERS")
  [ -n "$PEER_LIB" ] && COMMON_ARGS+=(--kda-peer-lib "$PEER_LIB")
  # ---- 2. back-to-back KDA q = 1 rows, with the peer's fields where it is loaded
  timeout -k "$KILL_AFTER" "$T_B2B" "$BENCH" --op kda --heads 12,24 --batch 1,8,16,64,128,256 --q 1 \
    "${COMMON_ARGS[@]}" --json "$OUT_DIR/bench-kda.jsonl" > "$OUT_DIR/bench-kda.log" 2>&1
  step "back-to-back KDA rows" $? "$OUT_DIR/bench-kda.log"
  # ---- 3. the layer context
  # shellcheck disable=SC2086  # LAYER_ARGS is a list of options
  timeout -k "$KILL_AFTER" "$T_LAYER" "$BENCH" --context layer "${COMMON_ARGS[@]}" ${LAYER_ARGS:-} \
    --json "$OUT_DIR/layer.jsonl" > "$OUT_DIR/layer.log" 2>&1
  step "layer context" $? "$OUT_DIR/layer.log"
  # A peer library that was given but did not load leaves the peer out of the runs.
  NOT_LOADED=$(grep -h -m1 "^vllm_cuda_kda peer: not loaded" "$OUT_DIR/bench-kda.log" "$OUT_DIR/layer.log" | head -1)
  if [ -n "$PEER_LIB" ] && [ -n "$NOT_LOADED" ]; then
    SUMMARY+=("peer: NOT LOADED -> $NOT_LOADED")
    FAILED=1
  fi
  # ---- 4. the table
  python3 "$ROOT/scripts/bench_tables.py" --layer "$OUT_DIR/layer.jsonl" "$OUT_DIR/bench-kda.jsonl" \
    > "$OUT_DIR/layer-table.md" 2> "$OUT_DIR/layer-table.log"
  step "layer table" $? "$OUT_DIR/layer-table.log"
elif [ "${RUN:-1}" != 0 ]; then
  SUMMARY+=("run: skipped (no $BENCH, or an earlier step failed)")
  FAILED=1
fi

echo "bench_layer.sh: commit $FUSEDSTEP_COMMIT, peer ${PEER_LIB:-none}, logs in $OUT_DIR"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
[ -f "$OUT_DIR/layer.log" ] && grep -E "^summary:" "$OUT_DIR/layer.log" | sed 's/^/  layer run /'
[ -f "$OUT_DIR/bench-kda.log" ] && grep -E "^summary:" "$OUT_DIR/bench-kda.log" | sed 's/^/  back-to-back run /'
exit $FAILED
