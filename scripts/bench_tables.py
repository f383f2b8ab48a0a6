#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Render fusedstep-bench JSON lines as the Markdown tables of docs/benchmarks.md.

Usage: scripts/bench_tables.py bench/results/h200.jsonl > tables.md
Reads only the standard library. Rows: one per JSON object; sweep rows are skipped.
"""
import json
import sys
from collections import defaultdict


def fmt(value, digits=2):
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(rows, shape_cols):
    cols = shape_cols + ["schedule", "waves", "fused_us", "composed_us", "speedup",
                         "MB", "floor_us", "pct_copy_bw", "exact"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        values = [fmt(r.get(c)) for c in shape_cols]
        values += [fmt(r.get("schedule")), fmt(r.get("waves")), fmt(r.get("fused_us")),
                   fmt(r.get("composed_us")),
                   (fmt(r.get("speedup")) + "x") if r.get("speedup") is not None else "-",
                   fmt(r.get("bytes", 0) / 1e6, 3), fmt(r.get("floor_us")),
                   (fmt(r.get("pct_copy_bw"), 1) + "%") if r.get("pct_copy_bw") is not None else "-",
                   fmt(r.get("exact"))]
        out.append("| " + " | ".join(values) + " |")
    return "\n".join(out)


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if not r.get("sweep")]
    if not rows:
        print("no rows")
        return 1
    first = rows[0]
    print(f"GPU {first.get('gpu')}, commit {first.get('commit')}, {first.get('date')}, "
          f"copy bandwidth {first.get('copy_gbps', 0):.0f} GB/s (best copy, read + write).\n")
    groups = defaultdict(list)
    for r in rows:
        if r["op"] == "mhc_boundary":
            groups[("mhc_boundary", f"hidden {r['hidden']}, {r.get('rounding', 'tf32_rna')}")].append(r)
        else:
            mode = "records" if r.get("records") else "q"
            title = (f"heads {r['heads']}, {mode} = {r['q']}" if mode == "q"
                     else f"heads {r['heads']}, q = {r['q']}, records")
            # bench options that change what is measured (--kda-gate, --kda-slots, --kda-activations)
            for key, default in (("gate", "f_a"), ("slots", "shuffled"), ("activations", "cold")):
                if r.get(key, default) != default:
                    title += f", {key} {r[key]}"
            groups[("kda_decode", title)].append(r)
    for (op, title), group in groups.items():
        print(f"### {op}: {title}\n")
        cols = ["tokens"] if op == "mhc_boundary" else ["batch"]
        print(table(group, cols))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/h200.jsonl"))
