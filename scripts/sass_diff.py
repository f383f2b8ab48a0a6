#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Which kernels' SASS differ between two builds of one object file.

    scripts/sass_diff.py OLD.o NEW.o [--filter SUBSTRING] [--cuobjdump PATH]

Prints one line per kernel (demangled): `same`, `DIFF` (with the instruction counts) or
`only in OLD/NEW`. Instruction addresses and encodings are stripped, so only the
instruction text is compared. A kernel whose SASS did not change needs no new
measurement; one that did needs a same-run A/B even when the source change was meant to
touch only other kernels: ptxas's register allocation of these kernels moves on
unrelated edits (docs/benchmarks.md, "Method"). Build OLD.o from the base commit
with the same flags, for example by compiling the source file of each state with
`nvcc ... -c -o`.

cuobjdump comes from the CUDA toolkit (or the nvidia-cuda-cuobjdump wheel); pass its
path with --cuobjdump or the CUOBJDUMP environment variable when it is not on PATH.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys


def kernels(cuobjdump, obj):
    sass = subprocess.run([cuobjdump, "-sass", obj], check=True, capture_output=True, text=True).stdout
    out, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = []
            continue
        if name is None:
            continue
        text = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)       # instruction address
        text = re.sub(r"/\* 0x[0-9a-f]+ \*/", "", text).strip()  # encoding
        if text:
            out[name].append(text)
    return out


def demangle(names):
    filt = shutil.which("c++filt")
    if not filt or not names:
        return {n: n for n in names}
    res = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return {n: d.replace("(anonymous namespace)::", "").split("(")[0] for n, d in zip(names, res)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--filter", default="", help="only kernels whose demangled name contains this")
    ap.add_argument("--cuobjdump", default=os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump"))
    args = ap.parse_args()
    if not args.cuobjdump:
        sys.exit("sass_diff: no cuobjdump (pass --cuobjdump or set CUOBJDUMP)")
    # Kernels pair up by demangled name: an anonymous namespace mangles with hashes of the
    # source path and a number that changes from compile to compile.
    def by_name(sass):
        pretty = demangle(list(sass))
        return {pretty[n]: body for n, body in sass.items()}
    old, new = by_name(kernels(args.cuobjdump, args.old)), by_name(kernels(args.cuobjdump, args.new))
    names = sorted(set(old) | set(new))
    pretty = {n: n for n in names}
    changed = 0
    for n in names:
        if args.filter not in pretty[n]:
            continue
        if n not in old or n not in new:
            print("only in %s  %s" % ("NEW" if n not in old else "OLD", pretty[n]))
            changed += 1
        elif old[n] == new[n]:
            print("same  %s" % pretty[n])
        else:
            print("DIFF  %s  (%d -> %d instructions)" % (pretty[n], len(old[n]), len(new[n])))
            changed += 1
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
