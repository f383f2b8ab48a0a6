#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-check.sh: the whole GPU check on a machine with an NVIDIA GPU (the H200 that
# development uses), in one command, within about 9 minutes on 16 cores:
#   1. environment (nvidia-smi -L, nvcc, cmake) into env.log
#   2. configure + build (Release, every target)                   configure.log, build.log
#   3. ctest -L cpu and ctest -L gpu, --output-on-failure           ctest-cpu.log, ctest-gpu.log
#   4. compute-sanitizer memcheck, racecheck and synccheck over every GPU test binary,
#      restricted to its small cases
#                                                                   sanitizer-<tool>-<binary>.log
#   5. the Python package: the extension fusedstep._C (same build tree) and the pytest
#      suite tests/python, CPU and GPU tests (torch ops bitwise vs composed, CUDA graphs,
#      torch.compile, opcheck, streams, the example)                pytest.log
#   6. fusedstep-bench --json bench.jsonl (full run; QUICK=1: --quick)  bench.log, bench.jsonl
# and prints a short summary last. A failing step never stops the script: every step
# runs, and the exit status is non-zero at the end if any step failed.
#
# Usage: scripts/gpu-check.sh [OUT_DIR]    (default: $OUT when set, else ./gpu-check-out)
# Environment:
#   QUICK=1          bench --quick instead of the full run
#   BENCH=0          skip step 6 (run the main program yourself later, from $BUILD_DIR)
#   PYTHON=0         skip step 5 (the Python package; needs nanobind and torch)
#   TESTS=0          skip step 3 (ctest), e.g. to rerun only the sanitizers
#   SANITIZER_TOOLS="memcheck synccheck"   the tools of step 4 (default: all three)
#   RACECHECK_EXCLUDE="..."   test binaries racecheck leaves out (default: none)
#   RACECHECK_FILTER_kda_verify_fused_test=...   racecheck's gtest filter there
#                    (default: KdaFusedVerify.Small*, see step 4)
#   T_BUILD, T_CTEST_GPU, T_TEST, T_BENCH, ...  per-step limits in seconds (below)
#   BUILD_DIR=...    build directory (default build-gpu-check)
#   CUDA_ARCHS=...   CMAKE_CUDA_ARCHITECTURES (default 90a; "90a;100a" for Blackwell too)
#   FUSEDSTEP_COMMIT commit recorded in bench.jsonl (default: git rev-parse --short HEAD)
#
# Convention for test authors (the sanitizer step depends on it): every GPU test binary
# exposes a few fast cases whose gtest name contains "Small" (e.g.
# TEST(KdaDecodeFusedSmall, ...) or a parameterized instance named "Small..."). The
# sanitizers run only --gtest_filter='*Small*', because racecheck and memcheck slow a
# kernel down 10-100x. A GPU binary without Small cases is reported as "no Small cases".
# Over the KDA binaries racecheck has a limit of its own and leaves out 16-CTA clusters,
# and over kda_verify_fused_test a filter of its own (step 4); a filter that selects no
# test, or an exclusion that names no test binary, fails the step.
#
# racecheck coverage of the fused kernels (the test that puts each under racecheck):
#   mHC one-wave, one CTA per SM    mhc_fused_test         MhcFused.SmallBitwiseVsComposed
#   mHC one-wave, two CTAs per SM   mhc_fused_test         MhcFused.SmallTwoCtaBitwiseVsComposed
#   KDA decode (q = 1), C = 1-4     kda_decode_fused_test  KdaFused.SmallCaseEveryClusterSize
#   KDA decode, BF16 four CTAs/SM   kda_decode_fused_test  KdaFusedSmall.DecodeBf16FourCtasPerSmMatchesComposed
#   KDA verify (q > 1), C = 1-8     kda_verify_fused_test  KdaFusedVerify.SmallCaseEveryClusterSize
#   KDA commit                      kda_composed_test      KdaCommit.SmallEqualsNonRecordVerifyBitwise
set -u -o pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
OUT_DIR=${1:-${OUT:-$ROOT/gpu-check-out}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
BUILD_DIR=${BUILD_DIR:-build-gpu-check}
CUDA_ARCHS=${CUDA_ARCHS:-90a}
JOBS=$(nproc 2>/dev/null || echo 4)
QUICK=${QUICK:-0}

# Per-step limits (seconds). Worst case 45 + 150 + 30 + 120 + (240 + 120) + 90 + 170 = 965 s
# (a sanitizer run that starts within the 240 s runs to its own limit, at most 120 s)
# on the H200 host (PYTHON=0 drops the 90 s; the per-call limit of the development
# machine is 600 s, so a run that long has failed anyway); a normal run takes a fraction of each
# (the Python suite: 26 s of tests, 13 s of them torch.compile, on 2026-11-29).
T_CONFIGURE=${T_CONFIGURE:-45}
T_BUILD=${T_BUILD:-150}
T_CTEST_CPU=${T_CTEST_CPU:-30}
T_CTEST_GPU=${T_CTEST_GPU:-120}            # KdaFused.MatchesComposedBitwise... alone ran 70 s
T_TEST=${T_TEST:-90}                        # one ctest test (a GoogleTest case)
T_SANITIZER_ONE=${T_SANITIZER_ONE:-40}     # one tool over one binary
T_RACECHECK_KDA=${T_RACECHECK_KDA:-120}    # racecheck over each KDA fused test binary (see step 4)
T_RACECHECK_MHC=${T_RACECHECK_MHC:-90}     # racecheck over mhc_fused_test's Small cases (about 45 s)
T_SANITIZER_TOTAL=${T_SANITIZER_TOTAL:-240} # no new sanitizer run starts past this
if [ "$QUICK" = 1 ]; then T_BENCH=${T_BENCH:-60}; else T_BENCH=${T_BENCH:-170}; fi
T_PYTEST=${T_PYTEST:-90}                    # the Python suite (pytest tests/python)
PYTHON_STEP=${PYTHON:-1}

SUMMARY=()   # one line per step, printed last
FAILED=0
note() { SUMMARY+=("$1"); }
fail() { SUMMARY+=("$1"); FAILED=1; }
# "timeout" exits 124 when it had to stop the command, 137 when the command ignored the
# TERM and was killed KILL_AFTER seconds later (every timeout below uses -k): both are
# failures of their step, never a pass.
KILL_AFTER=${KILL_AFTER:-10}
status_text() { case $1 in 0) echo ok ;; 124|137) echo "TIMEOUT" ;; *) echo "FAILED (exit $1)" ;; esac; }
timed_out() { [ "$1" = 124 ] || [ "$1" = 137 ]; }
# True when every compute-sanitizer report in the log is a synccheck barrier error at
# mbarrier_arrive_expect_tx in a block whose x index mod 16 is 8..15, every report was
# printed (ERROR SUMMARY; the tool's own "overflow of tracked cuda::barrier structures"
# warning, seen with the probe's 1024 CTAs, counts there too), and there is one at least.
only_high_rank_barrier_reports() {  # logfile
  awk '
    /========= [A-Z][a-z]+ error detected|========= Barrier error/ { n++; pending = ($0 ~ /Barrier error detected\. Missing (wait|init)/) ? 1 : 2; at = 0; next }
    pending == 1 && /mbarrier_arrive_expect_tx/ { at = 1 }
    pending == 1 && /by thread .* in block \(/ {
      match($0, /in block \([0-9]+/); x = substr($0, RSTART + 10, RLENGTH - 10) + 0
      if (at && x % 16 >= 8) good++
      pending = 0; next
    }
    pending == 2 { pending = 0 }
    /ERROR SUMMARY: [0-9]+ error/ && total == "" { match($0, /SUMMARY: [0-9]+/); total = substr($0, RSTART + 9, RLENGTH - 9) + 0 }
    /Warning: Detected overflow of tracked cuda::barrier structures/ { capacity++ }
    END { exit !(n > 0 && good == n && (total == n || total == n + capacity)) }' "$1"
}
step_result() {  # name rc logfile
  if [ "$2" = 0 ]; then note "$1: ok"; else fail "$1: $(status_text "$2") -> $3"; fi
}

# ---- 1. environment
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)  cores: $JOBS"
  nvidia-smi -L 2>&1 || echo "nvidia-smi -L failed"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv 2>&1 || true
  nvcc --version 2>&1 | tail -2 || echo "nvcc not on PATH"
  cmake --version 2>&1 | head -1
} > "$OUT_DIR/env.log" 2>&1
GPU_LINE=$(nvidia-smi -L 2>/dev/null | head -1)
if [ -z "$GPU_LINE" ]; then fail "gpu: nvidia-smi -L lists no GPU"; else note "gpu: $GPU_LINE"; fi

if [ -z "${FUSEDSTEP_COMMIT:-}" ]; then
  FUSEDSTEP_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
fi
export FUSEDSTEP_COMMIT

# ---- 2. configure + build
CMAKE_ARGS=(-S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS"
            -DFUSEDSTEP_BUILD_TESTS=ON -DFUSEDSTEP_BUILD_BENCH=ON)
if [ -d "$ROOT/.deps/googletest" ]; then
  CMAKE_ARGS+=("-DFUSEDSTEP_GTEST_SOURCE_DIR=$ROOT/.deps/googletest")
fi
# The Python extension in the same tree (links the library built here, no second compile).
PYTHON_BIN=${PYTHON_BIN:-python3}
if [ "$PYTHON_STEP" != 0 ] && "$PYTHON_BIN" -c "import nanobind" > /dev/null 2>&1; then
  CMAKE_ARGS+=(-DFUSEDSTEP_PYTHON=ON "-DPython_EXECUTABLE=$(command -v "$PYTHON_BIN")")
  PYTHON_READY=1
else
  PYTHON_READY=0
fi
timeout -k "$KILL_AFTER" "$T_CONFIGURE" cmake "${CMAKE_ARGS[@]}" > "$OUT_DIR/configure.log" 2>&1
rc=$?
step_result configure $rc configure.log
BUILD_START=$SECONDS
# The main program first (a build cut short by its limit still leaves it), then
# everything; -k builds every target that can be built, so one broken file does not
# hide the rest.
timeout -k "$KILL_AFTER" "$T_BUILD" bash -c "cmake --build '$BUILD_DIR' --target fusedstep-bench -j$JOBS -- -k;
                            cmake --build '$BUILD_DIR' -j$JOBS -- -k" > "$OUT_DIR/build.log" 2>&1
rc=$?
step_result "build ($((SECONDS - BUILD_START)) s)" $rc build.log

# ---- 3. tests
run_ctest() {  # label limit parallel
  local log="$OUT_DIR/ctest-$1.log"
  timeout -k "$KILL_AFTER" "$2" ctest --test-dir "$BUILD_DIR" -L "$1" --output-on-failure -j"$3" --timeout "$T_TEST" > "$log" 2>&1
  local rc=$?
  local counts
  counts=$(grep -E "tests passed(, [0-9]+ tests failed)? out of" "$log" | tail -1)
  local skipped
  skipped=$(grep -c "\*\*\*Skipped\|Not Run (Skipped)\| Skipped " "$log" 2>/dev/null || true)
  if [ -z "$counts" ]; then
    if grep -q "No tests were found" "$log"; then counts="no tests with this label"; else counts="no test summary"; fi
  fi
  if [ $rc = 0 ]; then
    note "ctest -L $1: $counts (skipped: ${skipped:-0})"
  else
    fail "ctest -L $1: $(status_text $rc): $counts -> ctest-$1.log"
  fi
}
if [ "${TESTS:-1}" = 0 ]; then
  note "ctest: skipped (TESTS=0)"
else
  run_ctest cpu "$T_CTEST_CPU" "$JOBS"
  run_ctest gpu "$T_CTEST_GPU" 4  # a few processes share the one GPU
fi

# ---- 4. compute-sanitizer over the small GPU cases
SANITIZER=$(command -v compute-sanitizer || true)
for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer; do
  [ -z "$SANITIZER" ] && [ -x "$candidate" ] && SANITIZER=$candidate
done
# GPU test binaries: the test executables that have Small cases (found by listing them;
# ctest's own listing names a discovery wrapper instead of the binary under CMake 4).
GPU_BINARIES=$(find "$BUILD_DIR/tests" -type f -perm -u+x -name '*_test' 2>/dev/null | sort)
if [ -z "$SANITIZER" ]; then
  fail "sanitizer: compute-sanitizer not found"
elif [ -z "$GPU_BINARIES" ]; then
  fail "sanitizer: no GPU test binaries found (build failed?)"
else
  SAN_START=$SECONDS
  san_pass=0; san_fail=0; san_timeout=0; san_skip=0; san_empty=0; san_failed_logs=(); san_tool_limit=()
  # racecheck over the KDA kernels: the Small cases (a few seconds each binary; over
  # kda_verify_fused_test only KdaFusedVerify.Small*), under a limit of their own, with
  # clusters of at most 8 CTAs (FUSEDSTEP_TEST_MAX_CLUSTER, as for synccheck; the q = 1
  # kernel at most 4). A timeout is a failure.
  RACECHECK_EXCLUDE=${RACECHECK_EXCLUDE-}
  RACECHECK_FILTER_kda_verify_fused_test=${RACECHECK_FILTER_kda_verify_fused_test:-KdaFusedVerify.Small*}
  san_excluded=()
  for name in $RACECHECK_EXCLUDE; do
    if ! basename -a $GPU_BINARIES | grep -qx "$name"; then
      san_fail=$((san_fail + 1))
      san_failed_logs+=("RACECHECK_EXCLUDE names no test binary: $name")
    fi
  done
  # synccheck's known limit: on a minimal correct protocol (tests/tools/
  # synccheck_cluster_probe.cu) it reports "Missing wait" in CTAs of rank >= 8 of
  # 16-CTA clusters and nothing at 8 CTAs. The probe runs first; only while it still
  # shows exactly that are the fused kernels' reports of that shape (a barrier error at
  # mbarrier_arrive_expect_tx in a block whose x index mod 16 is >= 8) counted as the
  # tool's, and every other synccheck report still fails the step. The KDA tests'
  # synccheck runs also leave out 16-CTA clusters (FUSEDSTEP_TEST_MAX_CLUSTER), since a
  # report poisons the context for the cases after it.
  PROBE="$BUILD_DIR/tests/synccheck_cluster_probe"
  SYNC_TOOL_LIMIT=0
  if [ -x "$PROBE" ]; then
    timeout -k "$KILL_AFTER" 60 "$SANITIZER" --tool synccheck --error-exitcode 86 "$PROBE" 8 > "$OUT_DIR/sanitizer-probe-8.log" 2>&1
    probe8=$?
    timeout -k "$KILL_AFTER" 60 "$SANITIZER" --tool synccheck --error-exitcode 86 --print-limit 10000 "$PROBE" 16 \
      > "$OUT_DIR/sanitizer-probe-16.log" 2>&1
    probe16=$?
    if [ $probe8 = 0 ] && [ $probe16 = 86 ] && only_high_rank_barrier_reports "$OUT_DIR/sanitizer-probe-16.log"; then
      SYNC_TOOL_LIMIT=1
      note "synccheck probe: clean at 8 CTAs; $(grep -c 'Barrier error' "$OUT_DIR/sanitizer-probe-16.log") false reports at ranks 8-15 of a correct 16-CTA protocol (tool limit reproduced)"
    elif [ $probe8 = 0 ] && [ $probe16 = 0 ]; then
      note "synccheck probe: clean at 8 and 16 CTAs (the tool limit is gone: its allowance is off)"
    else
      fail "synccheck probe: unexpected (8 CTAs: $(status_text $probe8), 16 CTAs: $(status_text $probe16)) -> sanitizer-probe-*.log"
    fi
  else
    fail "synccheck probe: $PROBE was not built"
  fi
  for bin in $GPU_BINARIES; do
    name=$(basename "$bin")
    if [ -z "$("$bin" --gtest_list_tests --gtest_filter='*Small*' 2>/dev/null | grep -v '^[^ ]')" ]; then
      san_empty=$((san_empty + 1))
      continue
    fi
    for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck}; do
      log="$OUT_DIR/sanitizer-$tool-$name.log"
      if [ "$tool" = racecheck ] && [[ " $RACECHECK_EXCLUDE " == *" $name "* ]]; then
        echo "racecheck leaves out $name (RACECHECK_EXCLUDE, see step 4)" > "$log"
        san_excluded+=("$name")
        continue
      fi
      if [ $((SECONDS - SAN_START)) -ge "$T_SANITIZER_TOTAL" ]; then
        san_skip=$((san_skip + 1))
        echo "skipped: the sanitizer step's $T_SANITIZER_TOTAL s were spent" > "$log"
        continue
      fi
      max_cluster=16
      [ "$tool" = synccheck ] && max_cluster=8
      filter='*Small*'
      limit=$T_SANITIZER_ONE
      if [ "$tool" = racecheck ] && [[ $name == kda_*_fused_test ]]; then
        [ "$name" = kda_verify_fused_test ] && filter=$RACECHECK_FILTER_kda_verify_fused_test
        limit=$T_RACECHECK_KDA
        max_cluster=8
        # The q = 1 kernel's C = 8 config waits on the decays before its cluster wait,
        # an order racecheck reports as a deadlock (docs/design.md, "Tools").
        [ "$name" = kda_decode_fused_test ] && max_cluster=4
      fi
      [ "$tool" = racecheck ] && [ "$name" = mhc_fused_test ] && limit=$T_RACECHECK_MHC
      if [ "$filter" != '*Small*' ] &&
         [ -z "$("$bin" --gtest_list_tests --gtest_filter="$filter" 2>/dev/null | grep -v '^[^ ]')" ]; then
        echo "the $tool filter '$filter' selects no test of $name" > "$log"
        san_fail=$((san_fail + 1))
        san_failed_logs+=("$tool/$name: its filter selects no test")
        continue
      fi
      run_start=$SECONDS
      FUSEDSTEP_TEST_MAX_CLUSTER=$max_cluster timeout -k "$KILL_AFTER" "$limit" "$SANITIZER" --tool "$tool" \
        --error-exitcode 86 --print-limit 20 "$bin" --gtest_filter="$filter" > "$log" 2>&1
      rc=$?
      echo "gpu-check: $tool over $name --gtest_filter='$filter' (clusters <= $max_cluster): exit $rc after $((SECONDS - run_start)) s (limit $limit s)" >> "$log"
      if timed_out $rc; then
        # Cut short: what it did not check is unchecked, so this is a failure.
        san_timeout=$((san_timeout + 1))
        san_fail=$((san_fail + 1))
        san_failed_logs+=("$tool/$name: TIMEOUT after $limit s")
      elif [ $rc = 0 ]; then
        san_pass=$((san_pass + 1))
      elif [ $rc = 86 ] && [ "$tool" = synccheck ] && [ $SYNC_TOOL_LIMIT = 1 ] &&
           only_high_rank_barrier_reports "$log"; then
        # (synccheck ends a kernel at its first report, error 700, so the test cases
        # after it fail: the tests' bits are checked by ctest and memcheck instead.)
        san_pass=$((san_pass + 1))
        san_tool_limit+=("$name: $(grep -c 'Barrier error' "$log")")
      else
        san_fail=$((san_fail + 1))
        san_failed_logs+=("$tool/$name: $(status_text $rc)")
      fi
    done
  done
  line="sanitizer (memcheck, racecheck, synccheck on *Small*; KDA racecheck and synccheck without 16-CTA clusters, q = 1 racecheck without 8-CTA ones): $san_pass passed, $san_fail failed ($san_timeout of them timed out), $san_skip skipped for time ($san_empty test binaries have no Small cases)"
  line+="; racecheck leaves out: ${san_excluded[*]:-none} (RACECHECK_EXCLUDE)"
  [ ${#san_tool_limit[@]} -gt 0 ] && line+="; synccheck reports of the probe's shape only, counted as the tool's: ${san_tool_limit[*]}"
  if [ $san_fail = 0 ] && [ $san_skip = 0 ]; then note "$line"; else fail "$line ${san_failed_logs[*]:-}"; fi
fi

# ---- 5. the Python package (extension built in step 2) and its pytest suite
if [ "$PYTHON_STEP" = 0 ]; then
  note "python: skipped (PYTHON=0)"
elif [ "$PYTHON_READY" != 1 ]; then
  fail "python: nanobind is not importable by $PYTHON_BIN (python3 -m pip install nanobind)"
elif ! ls "$BUILD_DIR"/python/fusedstep/_C*.so > /dev/null 2>&1; then
  fail "python: the extension fusedstep._C was not built -> build.log"
else
  PYTEST_START=$SECONDS
  case $BUILD_DIR in /*) PY_BUILD=$BUILD_DIR ;; *) PY_BUILD=$ROOT/$BUILD_DIR ;; esac
  PYTHONPATH="$PY_BUILD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
    timeout -k "$KILL_AFTER" "$T_PYTEST" "$PYTHON_BIN" -m pytest "$ROOT/tests/python" -q -rs -p no:cacheprovider \
    --junitxml="$OUT_DIR/pytest.xml" > "$OUT_DIR/pytest.log" 2>&1
  rc=$?
  counts=$(grep -E "^(=+ )?[0-9]+ (passed|failed|error)" "$OUT_DIR/pytest.log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
  gpu_ran=$(grep -o '<testcase classname="[^"]*test_gpu"' "$OUT_DIR/pytest.xml" 2>/dev/null | wc -l)
  line="python (pytest tests/python, $((SECONDS - PYTEST_START)) s): ${counts:-no pytest summary} ($gpu_ran of them gpu tests)"
  if [ $rc != 0 ]; then
    fail "$line: $(status_text $rc) -> pytest.log"
  elif grep -qE "[0-9]+ skipped" "$OUT_DIR/pytest.log"; then
    # A skipped GPU test is not a pass here: this step exists to run them.
    fail "$line: FAILED (skipped tests; reasons in pytest.log)"
  else
    note "$line"
  fi
fi

# ---- 6. the main program
BENCH_STEP=${BENCH:-1}
BENCH="$BUILD_DIR/bench/fusedstep-bench"
BENCH_ARGS=(--json "$OUT_DIR/bench.jsonl")
[ "$QUICK" = 1 ] && BENCH_ARGS+=(--quick)
if [ "${BENCH_STEP:-1}" = 0 ]; then
  note "bench: skipped (BENCH=0)"
elif [ -x "$BENCH" ]; then
  timeout -k "$KILL_AFTER" "$T_BENCH" "$BENCH" "${BENCH_ARGS[@]}" > "$OUT_DIR/bench.log" 2>&1
  rc=$?
  rows=$(wc -l < "$OUT_DIR/bench.jsonl" 2>/dev/null || echo 0)
  step_result "bench ${BENCH_ARGS[*]} ($rows JSON rows)" $rc bench.log
else
  fail "bench: $BENCH was not built"
fi

# ---- summary (last)
echo "== gpu-check: logs in $OUT_DIR (commit $FUSEDSTEP_COMMIT)"
if [ -s "$OUT_DIR/bench.log" ]; then
  echo "-- bench key rows (DeepSeek-V4.1-Flash hidden 5120; Kimi K3 TP8 12 heads, q = 1)"
  grep -E "^  (mhc_boundary|kda_decode q=)" "$OUT_DIR/bench.log"
  grep -E "^(GPU 0|copy bandwidth|no GPU found|fusedstep needs)" "$OUT_DIR/bench.log"
  grep -E "^op +shape" "$OUT_DIR/bench.log" | head -1
  grep -E "^(mhc_boundary +H=5120 |kda_decode +H=12 B=[0-9]+ q=1 )" "$OUT_DIR/bench.log" | head -24
  grep -E "^summary:" "$OUT_DIR/bench.log"
fi
echo "-- steps"
for line in "${SUMMARY[@]}"; do echo "$line"; done
if [ $FAILED = 0 ]; then echo "gpu-check: PASS"; else echo "gpu-check: FAIL"; fi
exit $FAILED
