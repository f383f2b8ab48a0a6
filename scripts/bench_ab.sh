#!/bin/bash
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
for n in names:
    for f in sorted(glob.glob(os.path.join(out, n + '.*.log'))):
        for line in open(f):
            p = line.split()
            if len(p) > 8 and p[0] in ('kda_decode', 'mhc_boundary') and p[1].startswith('H='):
                key = ' '.join(p[1:4]) if p[0] == 'kda_decode' else ' '.join(p[1:3])
                rows.setdefault(key, {}).setdefault(n, []).append(float(p[-7]))  # fused_us
print('%-22s' % 'shape' + ''.join('%18s' % n[:17] for n in names))
for key, v in rows.items():
    print('%-22s' % key + ''.join('%18s' % '/'.join('%.2f' % x for x in v.get(n, [])) for n in names))
PY
