#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Same-run A/B of fusedstep-bench binaries: each binary runs the same shapes, in turn,
# ROUNDS times (so drift shows as disagreement between rounds), and the fused us per
# call are printed side by side, one column per binary, rounds separated by "/".
#
#   scripts/bench_ab.sh OUT_DIR BIN_A BIN_B [BIN ...] -- [fusedstep-bench options]
#   e.g. scripts/bench_ab.sh out/ab abin/bench-base build/bench/fusedstep-bench -- \
#          --op kda --heads 12 --batch 1,4,16 --q 2,4,8 --iters 30
#
# Build the baseline from a clean worktree of the base commit (git worktree add) and carry
# the binaries to the GPU machine; logs land in OUT_DIR/<binary name>.<round>.log.
set -euo pipefail
OUT_DIR=$1; shift
BINS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do BINS+=("$1"); shift; done
[ $# -gt 0 ] && shift
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT_DIR"
for r in $(seq 1 "$ROUNDS"); do
  for i in "${!BINS[@]}"; do
    "${BINS[$i]}" "$@" > "$OUT_DIR/$i-$(basename "${BINS[$i]}").$r.log" 2>&1
  done
done
python3 - "$OUT_DIR" "${BINS[@]}" <<'PY'
import collections, glob, os, sys
out, bins = sys.argv[1], sys.argv[2:]
names = ['%d-%s' % (i, os.path.basename(b)) for i, b in enumerate(bins)]
rows = collections.OrderedDict()
def short(words):  # "cluster=1 lanes=16 early=2 evict_first" -> c1l16e2x (bench's schedule names)
    f = dict(w.split('=', 1) for w in words if '=' in w)
    name = 'c%sl%se%s' % (f.get('cluster', '?'), f.get('lanes', '?'), f.get('early', '?'))
    name += 'x' if 'evict_first' in words else ''
    return name
for n in names:
    for f in sorted(glob.glob(os.path.join(out, n + '.*.log'))):
        for line in open(f):
            p = line.split()
            if len(p) > 8 and p[0] in ('kda_decode', 'mhc_boundary') and p[1].startswith('H='):
                # shape, schedule (words with '=', KDA's evict_first, mHC's 1cta/sm), waves, fused_us
                # (after the shape's own words, its suffixes: "records", "(1-wave max)")
                sched = lambda w: '=' in w or w in ('evict_first', '1cta/sm')
                j = 4 if p[0] == 'kda_decode' else 3
                while j < len(p) and not sched(p[j]) and not p[j].isdigit():
                    j += 1
                i = j
                while i < len(p) and sched(p[i]):
                    i += 1
                if i + 1 >= len(p) or p[i + 1] == '-':
                    continue  # not run
                key = ' '.join(p[1:j])
                if p[0] == 'kda_decode':  # a --schedules / sweep row is its own row
                    key += ' ' + short(p[j:i])
                rows.setdefault(key, {}).setdefault(n, []).append(float(p[i + 1]))
print('%-32s' % 'shape' + ''.join('%18s' % n[:17] for n in names))
for key, v in rows.items():
    print('%-32s' % key + ''.join('%18s' % '/'.join('%.2f' % x for x in v.get(n, [])) for n in names))
PY
