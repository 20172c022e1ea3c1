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
CEILING_FOR = {("allreduce", "hbmcoll-numpy"), ("gather", "hbmcoll-numpy"),
               ("bcast", "hbmcoll-numpy")}  # what it bounds
CEILING_MIN = 64 * KiB
OVERSUB = ("{P} ranks on {cores} cores: 8 B allreduce >= 10x MPICH", 10.0)  # judged if P > cores
LIMIT = ("allreduce 16 MiB >= 50% of the memory-bandwidth limit", "allreduce", 16 * MiB,
         ["hbmcoll-numpy", "hbmcoll-empty"], 0.5)


# Issue 19 (speed on every host): judged for every collective, size and rank count the run has
PEERS = ("mpi4py", "openmpi", "deepspeed", "torch")   # "the fastest peer": the fastest measured
FLOOR_NEAR = 1.2          # NumPy buffers within this of floor-staged, from CEILING_MIN
EMPTY_OVER_MPI = (("mpi4py", "MPICH"), ("openmpi", "Open MPI"))
EMPTY_SIZES, EMPTY_NEED = (MiB, 16 * MiB), 3.0


def _size(n):
    return f"{n >> 20} MiB" if n >= MiB and n % MiB == 0 else (
        f"{n >> 10} KiB" if n >= KiB and n % KiB == 0 else f"{n} B")


def _per_round(rows, label, coll, size, P=2):
    return {r["round"]: r["avg_us"] for r in rows
            if r.get("status", "ok") == "ok" and r["label"] == label and r["collective"] == coll
            and r["size"] == size and r["P"] == P}


def _speedup(best, rows, what, lb, P, coll, size, peers, need, floor_ceiling=True):
    """One target: the fastest of `peers` measured (each round: the fastest in that round)
    over hbmcoll's label lb, against `need`; None fields when a side was not measured."""
    res = {"target": what, "label": lb, "need": need, "measured": None, "paired_median": None,
           "rounds_held": None, "ok": None, "ceiling": None}
    h = best.get((lb, P, coll, size))
    ps = [best[k] for k in ((q, P, coll, size) for q in peers) if k in best]
    if not h or not ps:
        return res
    p = min(ps, key=lambda x: x["avg_us"])
    if len(peers) > 1:
        res["peer"] = p["label"]
    f = best.get((STAGED_FLOOR, P, coll, size)) if (
        floor_ceiling and (coll, lb) in CEILING_FOR and size >= CEILING_MIN) else None
    if f:
        res["ceiling"] = p["avg_us"] / f["avg_us"]
    res["measured"] = p["avg_us"] / h["avg_us"]
    res["ok"] = res["measured"] >= need
    hr = _per_round(rows, lb, coll, size, P)
    prs = [_per_round(rows, q, coll, size, P) for q in peers]
    pairs = [min(pr[k] for pr in prs if k in pr) / hr[k] for k in hr if any(k in pr for pr in prs)]
    if pairs:
        res["paired_median"] = statistics.median(pairs)
        res["rounds_held"] = f"{sum(x >= need for x in pairs)}/{len(pairs)}"
    return res


def check_hosts(summ, rows):
    """Issue 19's targets, one dict each (as check()'s), for every rank count, collective and
    size with hbmcoll-numpy in the run: at least as fast as the fastest peer; within
    FLOOR_NEAR of floor-staged from CEILING_MIN (kept as floor time / hbmcoll's >= 1/FLOOR_NEAR);
    hbmcoll.empty allreduce >= EMPTY_NEED x each MPI at EMPTY_SIZES."""
    best = {(s["label"], s["P"], s["collective"], s["size"]): s for s in summ}
    cells = sorted({(s["P"], s["collective"], s["size"]) for s in summ
                    if s["label"] == "hbmcoll-numpy"})
    out = [_speedup(best, rows, f"{c} {_size(z)}, {P} ranks: >= the fastest peer", "hbmcoll-numpy",
                    P, c, z, PEERS, 1.0) for P, c, z in cells]
    for P, c, z in cells:
        if z >= CEILING_MIN and (c, "hbmcoll-numpy") in CEILING_FOR:
            r = _speedup(best, rows, f"{c} {_size(z)}, {P} ranks: within {FLOOR_NEAR}x of "
                         f"{STAGED_FLOOR}", "hbmcoll-numpy", P, c, z, (STAGED_FLOOR,),
                         1 / FLOOR_NEAR, floor_ceiling=False)
            out.append(dict(r, over_floor=True))
    for P in sorted({P for P, _, _ in cells}):
        for z in EMPTY_SIZES:
            for peer, name in EMPTY_OVER_MPI:
                out.append(_speedup(best, rows, f"allreduce {_size(z)}, {P} ranks: >= {EMPTY_NEED:g}x "
                                    f"{name}, hbmcoll.empty", "hbmcoll-empty", P, "allreduce", z,
                                    (peer,), EMPTY_NEED))
    return out


def check(summ, rows, oversub, P=2):
    """One dict per target and hbmcoll label: measured, paired median, rounds held, verdict."""
    best = {(s["label"], s["P"], s["collective"], s["size"]): s for s in summ}
    out = [_speedup(best, rows, what, lb, P, coll, size, (peer,), need)
           for what, coll, size, labels, peer, need in SPEEDUPS for lb in labels]
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
    """Issue 4's table."""
    results = results or []
    if not any(r["ok"] is not None for r in results if r["target"] != LIMIT[0]):
        return []  # no hbmcoll result beside a peer's: not a run these targets speak of
    return _section(results, "Speed targets (issue 4)",
                    "Speedup = peer's time / hbmcoll's, each library's best round, 2 ranks; paired = "
                    "the median over rounds of the ratio within each round (for the limit: of each "
                    f"round's fraction); ceiling = peer's time / `{STAGED_FLOOR}`'s, the most any "
                    "library with private buffers could show (for the limit: the fraction it reached).")


def markdown_hosts(results):
    """Issue 19's table."""
    results = results or []
    if not any(r["ok"] is not None for r in results):
        return []
    return _section(results, "Speed on this host (issue 19)",
                    "Every collective and size measured, NumPy buffers against the fastest peer "
                    f"measured ({', '.join(PEERS)}; named in brackets), and against "
                    f"`{STAGED_FLOOR}` (shown as hbmcoll's time over it, at most {FLOOR_NEAR}x); "
                    "hbmcoll.empty allreduce against each MPI. Speedup = the peer's time / "
                    "hbmcoll's, each library's best round; paired = the median over rounds of the "
                    "ratio within each round; ceiling = the peer's time / "
                    f"`{STAGED_FLOOR}`'s, the most any library with private buffers could show.")


def _section(results, title, legend):
    judged = [r for r in results if r["ok"] is not None]
    miss = [r for r in judged if not r["ok"]]
    reach = [r for r in miss if r.get("ceiling") is not None and r["ceiling"] < r["need"]]
    unmeasured = len(results) - len(judged)
    lines = [f"## {title}", "",
             f"{len(judged) - len(miss)} of {len(judged)} held in this run" +
             (": missed " + "; ".join(f"{_what(r)} ({r['label']}: {_x(r)})" for r in miss)
              if miss else "") + (f"; {unmeasured} not measured" if unmeasured else "") +
             (f"; {len(reach)} of the misses out of reach in this run (ceiling below the target)"
              if reach else "") + ". " + legend, "",
             "| target | hbmcoll | speedup | paired | rounds held | ceiling | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        v = "-" if r["ok"] is None else ("ok" if r["ok"] else "**missed**")
        if r in reach:
            v += " (out of reach)"
        pm = "-" if r["paired_median"] is None else _x(r, r["paired_median"])
        ce = "-" if r.get("ceiling") is None else _x(r, r["ceiling"])
        lines.append(f"| {_what(r)} | {r['label']} | {_x(r)} | {pm} | "
                     f"{r['rounds_held'] or '-'} | {ce} | {v} |")
    return lines + [""]


def _what(r):
    return r["target"] + (f" ({r['peer']})" if r.get("peer") else "")


def _x(r, v=None):
    """A speedup as 2.53x, a fraction of the limit as 49%, a time over the floor as 1.13x."""
    v = r["measured"] if v is None else v
    if v is None:
        return r.get("note") or "not measured"
    if r.get("over_floor"):
        return f"{1 / v:.2f}x"
    return f"{v:.0%}" if r["need"] < 1 else f"{v:.2f}x"


def main(argv):
    doc = json.load(open(argv[1].rstrip("/") + "/results.json"))
    print("\n".join(markdown_hosts(check_hosts(doc["summary"], doc["rows"])) +
                    markdown(check(doc["summary"], doc["rows"], doc.get("oversubscribed")))))


if __name__ == "__main__":
    main(sys.argv)
