#!/usr/bin/env python3
"""Compare several runs (e.g. KNL flat vs cache vs SNC-4, or bare metal vs Docker).

    python bench/compare.py NAME=RESULTS_DIR NAME=RESULTS_DIR ... [--label hbmcoll-numpy]
        [--collective allreduce] [--P 64] [--md out.md]

Prints, per (label, collective, P, size), the latency of every run and its ratio to the first
run (< 1: faster than the first). Each results dir is one `bench/suite.py` run; its mode and
topology come from its own results.json. Numbers from different runs are not interleaved, so
repeat each run (or use --rounds) before trusting small differences.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import human  # noqa: E402


def load(arg):
    name, _, path = arg.partition("=")
    if not path:
        name, path = os.path.basename(os.path.normpath(arg)), arg
    with open(os.path.join(path, "results.json")) as f:
        doc = json.load(f)
    return name, doc


def _gib(kb):
    return f"{int(kb) / (1 << 20):.1f}" if str(kb).isdigit() else "?"


def describe(name, doc):
    m = doc["meta"]["machine"]
    nodes = ", ".join(f"{k}: cpus {v['cpus']}, {_gib(v['mem_kB'])} GiB"
                      for k, v in m.get("numa_nodes", {}).items())
    topo = next((r.get("topology") for r in doc["rows"] if r.get("topology")), None)
    modes = {k: topo.get(k) for k in ("memory_mode", "cluster_mode", "modes")
             if k in topo} if isinstance(topo, dict) else None
    lim = doc.get("limits") or {}
    return (f"- **{name}**: {doc['meta']['run_id']}, {m.get('cpu_model')}, NUMA [{nodes}], "
            f"hbmcoll modes {json.dumps(modes)}, copy B all cores "
            f"{lim.get('all_cores_GBps', float('nan')):.1f} GB/s, "
            f"in container {m.get('in_container')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="NAME=DIR (or DIR)")
    ap.add_argument("--label", action="append", help="only these labels (repeatable)")
    ap.add_argument("--collective", action="append")
    ap.add_argument("--P", type=int, action="append")
    ap.add_argument("--md", help="also write the table to this file")
    a = ap.parse_args()
    runs = [load(r) for r in a.runs]
    keys, by = set(), []
    for _, doc in runs:
        d = {}
        for s in doc["summary"]:
            if a.label and s["label"] not in a.label:
                continue
            if a.collective and s["collective"] not in a.collective:
                continue
            if a.P and s["P"] not in a.P:
                continue
            k = (s["label"], s["collective"], s["P"], s["size"])
            d[k] = s
            keys.add(k)
        by.append(d)
    names = [n for n, _ in runs]
    out = ["# Comparison of runs", ""] + [describe(n, d) for n, d in runs] + [""]
    head = ["label", "collective", "P", "size"] + [f"{n} us" for n in names] + [
        f"{n}/{names[0]}" for n in names[1:]] + [f"{n} frac" for n in names]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in sorted(keys, key=lambda k: (k[1], k[0], k[2], k[3])):
        t = [d.get(k, {}).get("avg_us") for d in by]
        ratios = [f"{x / t[0]:.3g}" if x and t[0] else "-" for x in t[1:]]
        fr = [d.get(k, {}).get("frac_limit") for d in by]
        out.append("| " + " | ".join(
            [k[0], k[1], str(k[2]), human(k[3])] + [f"{x:.2f}" if x else "-" for x in t] + ratios
            + [f"{x:.1%}" if x else "-" for x in fr]) + " |")
    text = "\n".join(out)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
