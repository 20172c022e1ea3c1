"""The speed targets hbmcoll holds itself to (issue 4), checked against a run's own numbers.

Each target compares hbmcoll with a peer measured in the same run, 2 ranks, float32. The verdict
uses the run's headline numbers (each library's best round, as in every table). Beside it: the
median over rounds of the ratio taken within each round (the libraries of one round run minutes
apart at most, so this pairs them under the same host state) and in how many rounds the target
held: a target met only in the best rounds is not one that holds.

For allreduce and gather with NumPy buffers the run also measures `floor-staged`
(bench/c/staged_floor.c): the least such a collective can cost here, bare C doing only the
memory work and the data that must cross between the cores (from 64 KiB: below, it is mostly
the cost of one ctypes call). The peer's time over it is the "ceiling": the largest speedup any
library with private buffers could show in that run. A miss with the ceiling below the target
is out of reach on that run's machine, not a shortfall of the library. The same holds for the
fraction of the memory-bandwidth limit: the limit counts the bytes of a zero-copy allreduce
(2PN), which NumPy buffers cannot reach without staging, so their ceiling there is the fraction
`floor-staged` reached; `hbmcoll.empty` buffers are judged against the limit itself.

    python bench/targets.py RESULTS_DIR      # re-check a finished run (its results.json)
"""
import json
import statistics
import sys

KiB, MiB = 1 << 10, 1 << 20

# (what, collective, size, hbmcoll labels, peer, least speedup = peer time / hbmcoll time)
SPEEDUPS = [
    ("allreduce 64 KiB >= 3x MPICH", "allreduce", 64 * KiB, ["hbmcoll-numpy"], "mpi4py", 3.0),
    ("allreduce 1 MiB >= 3x MPICH", "allreduce", MiB, ["hbmcoll-numpy"], "mpi4py", 3.0),
    ("allreduce 16 MiB >= 2x MPICH, NumPy buffers", "allreduce", 16 * MiB, ["hbmcoll-numpy"],
     "mpi4py", 2.0),
    ("allreduce 16 MiB >= 3x MPICH, hbmcoll.empty", "allreduce", 16 * MiB, ["hbmcoll-empty"],
     "mpi4py", 3.0),
    ("allreduce 8 B <= 0.8x MPICH's latency", "allreduce", 8, ["hbmcoll-numpy", "hbmcoll-empty"],
     "mpi4py", 1.25),
    ("bcast 1 MiB >= 2x MPICH", "bcast", MiB, ["hbmcoll-numpy"], "mpi4py", 2.0),
    ("gather 1 MiB >= 2x MPICH", "gather", MiB, ["hbmcoll-numpy"], "mpi4py", 2.0),
    ("bcast 8 B never slower than MPICH", "bcast", 8, ["hbmcoll-numpy", "hbmcoll-empty"],
     "mpi4py", 1.0),
    ("gather 8 B never slower than MPICH", "gather", 8, ["hbmcoll-numpy", "hbmcoll-empty"],
     "mpi4py", 1.0),
    ("allreduce 64 KiB >= 20x gloo", "allreduce", 64 * KiB, ["hbmcoll-numpy"], "torch", 20.0),
    ("allreduce 16 MiB >= 5x gloo", "allreduce", 16 * MiB, ["hbmcoll-numpy"], "torch", 5.0),
]
STAGED_FLOOR = "floor-staged"
CEILING_FOR = {("allreduce", "hbmcoll-numpy"), ("gather", "hbmcoll-numpy")}  # what it bounds
CEILING_MIN = 64 * KiB
OVERSUB = ("{P} ranks on {cores} cores: 8 B allreduce >= 10x MPICH", 10.0)  # judged if P > cores
LIMIT = ("allreduce 16 MiB >= 50% of the memory-bandwidth limit", "allreduce", 16 * MiB,
         ["hbmcoll-numpy", "hbmcoll-empty"], 0.5)


def _per_round(rows, label, coll, size, P=2):
    return {r["round"]: r["avg_us"] for r in rows
            if r.get("status", "ok") == "ok" and r["label"] == label and r["collective"] == coll
            and r["size"] == size and r["P"] == P}


def check(summ, rows, oversub, P=2):
    """One dict per target and hbmcoll label: measured, paired median, rounds held, verdict."""
    best = {(s["label"], s["P"], s["collective"], s["size"]): s for s in summ}
    out = []
    for what, coll, size, labels, peer, need in SPEEDUPS:
        for lb in labels:
            h, p = best.get((lb, P, coll, size)), best.get((peer, P, coll, size))
            res = {"target": what, "label": lb, "need": need, "measured": None,
                   "paired_median": None, "rounds_held": None, "ok": None, "ceiling": None}
            f = best.get((STAGED_FLOOR, P, coll, size)) if (
                (coll, lb) in CEILING_FOR and size >= CEILING_MIN) else None
            if f and p:
                res["ceiling"] = p["avg_us"] / f["avg_us"]
            if h and p:
                res["measured"] = p["avg_us"] / h["avg_us"]
                res["ok"] = res["measured"] >= need
                hr, pr = _per_round(rows, lb, coll, size, P), _per_round(rows, peer, coll, size, P)
                pairs = [pr[k] / hr[k] for k in hr if k in pr]
                if pairs:
                    res["paired_median"] = statistics.median(pairs)
                    res["rounds_held"] = f"{sum(x >= need for x in pairs)}/{len(pairs)}"
            out.append(res)
    what, need = OVERSUB
    ref = next((o for o in oversub or [] if o["label"] == "mpi4py"), None)
    for o in oversub or []:
        if not o["label"].startswith("hbmcoll") or ref is None or o.get("P", 0) <= o.get("cores", 0):
            continue
        res = {"target": what.format(**o), "label": o["label"], "need": need, "measured": None,
               "paired_median": None, "rounds_held": None, "ok": None, "note": None}
        if o.get("status") != "ok" or not o.get("avg_us"):
            res.update(ok=False, note=f"hbmcoll {o.get('status', 'failed')}")
        elif ref.get("status") != "ok" or not ref.get("avg_us"):
            res.update(ok=True, note=f"MPICH {ref.get('status', 'failed')}, hbmcoll "
                                     f"{o['avg_us']:.1f} us")
        else:
            res.update(measured=ref["avg_us"] / o["avg_us"], ok=ref["avg_us"] / o["avg_us"] >= need)
        out.append(res)
    what, coll, size, labels, need = LIMIT
    for lb in labels:  # the limit counts a zero-copy allreduce's bytes; NumPy buffers move twice
        s = best.get((lb, P, coll, size))
        if not s or s.get("frac_limit") is None:
            continue
        f = best.get((STAGED_FLOOR, P, coll, size)) if (coll, lb) in CEILING_FOR else None
        # a round's fraction: the best one's, scaled by its time over that round's
        fr = [s["frac_limit"] * s["avg_us"] / t for t in _per_round(rows, lb, coll, size, P).values()]
        out.append({"target": what, "label": lb, "need": need, "measured": s["frac_limit"],
                    "paired_median": statistics.median(fr) if fr else None,
                    "rounds_held": f"{sum(x >= need for x in fr)}/{len(fr)}" if fr else None,
                    "ok": s["frac_limit"] >= need,
                    "ceiling": f.get("frac_limit") if f else None})
    return out


def markdown(results):
    results = results or []
    if not any(r["ok"] is not None for r in results if r["target"] != LIMIT[0]):
        return []  # no hbmcoll result beside a peer's: not a run these targets speak of
    judged = [r for r in results if r["ok"] is not None]
    miss = [r for r in judged if not r["ok"]]
    reach = [r for r in miss if r.get("ceiling") is not None and r["ceiling"] < r["need"]]
    unmeasured = len(results) - len(judged)
    lines = ["## Speed targets (issue 4)", "",
             f"{len(judged) - len(miss)} of {len(judged)} held in this run" +
             (": missed " + "; ".join(f"{r['target']} ({r['label']}: {_x(r)})" for r in miss)
              if miss else "") + (f"; {unmeasured} not measured" if unmeasured else "") +
             (f"; {len(reach)} of the misses out of reach in this run (ceiling below the target)"
              if reach else "") +
             ". Speedup = peer's time / hbmcoll's, each library's best round, 2 ranks; paired = "
             "the median over rounds of the ratio within each round (for the limit: of each "
             "round's fraction); ceiling = peer's time / "
             f"`{STAGED_FLOOR}`'s, the most any library with private buffers could show (for "
             "the limit: the fraction it reached).", "",
             "| target | hbmcoll | speedup | paired | rounds held | ceiling | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        v = "-" if r["ok"] is None else ("ok" if r["ok"] else "**missed**")
        if r in reach:
            v += " (out of reach)"
        pm = "-" if r["paired_median"] is None else _x(r, r["paired_median"])
        ce = "-" if r.get("ceiling") is None else _x(r, r["ceiling"])
        lines.append(f"| {r['target']} | {r['label']} | {_x(r)} | {pm} | "
                     f"{r['rounds_held'] or '-'} | {ce} | {v} |")
    return lines + [""]


def _x(r, v=None):
    """A speedup as 2.53x, a fraction of the limit as 49%."""
    v = r["measured"] if v is None else v
    if v is None:
        return r.get("note") or "not measured"
    return f"{v:.0%}" if r["need"] < 1 else f"{v:.2f}x"


def main(argv):
    doc = json.load(open(argv[1].rstrip("/") + "/results.json"))
    print("\n".join(markdown(check(doc["summary"], doc["rows"], doc.get("oversubscribed")))))


if __name__ == "__main__":
    main(sys.argv)
