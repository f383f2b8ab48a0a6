#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per-source-line totals of an ncu SourceCounters report: shared-memory wavefronts
(excess over ideal) and warp-stall samples, mapped through nvdisasm's line info.

  ncu --clock-control none -k regex:KERNEL_NAME -c 1 --section SourceCounters \\
      -o R ./fusedstep-bench --op mhc --hidden 5120 --tokens 336 --iters 3
  ncu -i R.ncu-rep --page source --csv --print-source sass > R.csv
  nvcc -cubin -arch=sm_90a -O3 -DNDEBUG -lineinfo -std=c++20 --expt-relaxed-constexpr \\
      -Iinclude -Isrc -Isrc/common/portable -o k.cubin src/mhc_boundary/instantiations/FILE.cu
  nvdisasm -c -gi k.cubin > k.sass
  scripts/ncu_by_line.py R.csv k.sass KERNEL [lines]

The cubin must be built from the same tree and flags as the profiled binary (the CMake
Release flags plus -lineinfo), so that instruction offsets match; FILE is the
instantiation file of the profiled config. KERNEL is a substring of the profiled kernel's
mangled name (its template arguments). Rows: a source line as
"file:line<inlined-at file:line", its excess / total shared wavefronts, its stall samples
and their three largest reasons.
"""
import collections
import csv
import re
import sys


def line_info(sass_path, kernel):
    """Instruction offset -> (file, line, inlined-at file, line) of `kernel`'s SASS."""
    lines, cur, on, new_block = {}, None, False, True
    for text in open(sass_path):
        if text.startswith('.text.'):
            on = kernel in text
            continue
        if not on:
            continue
        if '//## File' in text:
            m = re.search(r'File "(.*?)", line (\d+)(?: inlined at "(.*?)", line (\d+))?', text)
            if new_block:
                cur = (m.group(1).split('/')[-1], int(m.group(2)), '', '')
            if not m.group(3):  # the outermost frame: where the inlined code sits
                cur = (cur[0], cur[1], m.group(1).split('/')[-1], m.group(2))
            new_block = False
            continue
        new_block = True
        m = re.match(r'\s+/\*([0-9a-f]{4,})\*/', text)
        if m:
            lines[int(m.group(1), 16)] = cur
    return lines


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rows = list(csv.reader(open(sys.argv[1])))
    header = rows[1]
    ix = {name: i for i, name in enumerate(header)}
    data = rows[2:]
    lines = line_info(sys.argv[2], sys.argv[3])
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 30
    base = int(data[0][ix['Address']], 16)
    number = lambda r, name: int((r[ix[name]] or '0').replace(',', '')) if name in ix else 0
    stall_names = [n for n in header if n.startswith('stall_') and '(Not Issued)' not in n]
    excess, wavefronts, samples = collections.Counter(), collections.Counter(), collections.Counter()
    reasons = collections.defaultdict(collections.Counter)
    for r in data:
        info = lines.get(int(r[ix['Address']], 16) - base)
        key = '%s:%s<%s:%s' % info if info else '?'
        excess[key] += number(r, 'L1 Wavefronts Shared Excessive')
        wavefronts[key] += number(r, 'L1 Wavefronts Shared')
        for n in stall_names:
            v = number(r, n)
            samples[key] += v
            reasons[key][n[len('stall_'):]] += v
    print('shared wavefronts %d, excess %d; stall samples %d' %
          (sum(wavefronts.values()), sum(excess.values()), sum(samples.values())))
    keys = sorted(set(wavefronts) | set(samples), key=lambda k: (-excess[k], -samples[k]))
    for k in keys[:top]:
        print('%-50s excess %7d of %8d  samples %5d  %s' %
              (k, excess[k], wavefronts[k], samples[k],
               ', '.join('%s %d' % kv for kv in reasons[k].most_common(3) if kv[1])))


if __name__ == '__main__':
    main()
