"""Aggregation and output: per-rank files -> rows -> summary -> JSON, CSV, Markdown, PNG.

Row: one (round, library label, world size P, collective, size) with avg/min/max over ranks
of the per-rank mean latency. Summary: per (label, P, collective, size) the best (lowest) round
of the rank-average: rounds interleave the libraries, and on a shared machine interference only
ever adds time, so each library's best round is its least disturbed one (the same rule for
every library; the median over rounds is kept beside it as `median_us`), min and max over
everything, effective bandwidth (least bytes the collective must move / time), fraction of the
copy-bandwidth limit, and time ratios label/peer from the same run.
"""
import csv
import glob
import json
import os
import statistics

import limits as L
import noise
import targets as T

PEERS = ("mpi4py", "openmpi", "torch", "deepspeed")   # deepspeed: allreduce only
# what each label of the tables and plots measures
LABELS = {"mpi4py": "MPICH's collective through mpi4py (NumPy buffers)",
          "openmpi": "Open MPI's collective through mpi4py built against it (NumPy buffers)",
          "torch": "torch.distributed with gloo (CPU tensors)",
          "deepspeed": "DeepSpeed's shared-memory CPU allreduce (inference_all_reduce), torch tensors",
          "hbmcoll-numpy": "hbmcoll with NumPy buffers (private memory: staged through the shared segment)",
          "hbmcoll-empty": "hbmcoll with hbmcoll.empty buffers (in the shared segment: no staging copy)",
          "floor": "no communication: only the memory work an out-of-place allreduce cannot avoid",
          "floor-staged": "bare C: that memory work plus the least data that must cross between ranks"}
FLOOR = "floor"   # bench/workers/floor_worker.py: the local memory work alone
FLOOR_MIN = 64 << 10   # below this the floor is mostly the cost of one NumPy call
ORDER = ["allreduce", "bcast", "gather", "reduce", "allgather", "reduce_scatter", "alltoall",
         "barrier"]


def _coll_key(cp):
    c, P = cp
    return (ORDER.index(c) if c in ORDER else len(ORDER), c, P)


def collect(prefix, world):
    """Read OUT_PREFIX.r*.json; return (meta of rank 0, per-(coll,size) rank stats) or None."""
    files = sorted(glob.glob(prefix + ".r*.json"))
    if len(files) != world:
        return None
    per = [json.load(open(f)) for f in files]
    meta0 = next(p["meta"] for p in per if p["meta"]["rank"] == 0)
    stats = {}
    for p in per:
        for r in p["rows"]:
            stats.setdefault((r["collective"], r["size"]), {"r": r, "sec": []})["sec"].append(
                r["sec"])
    out = []
    for (coll, size), v in stats.items():
        s = v["sec"]
        out.append({"collective": coll, "size": size, "iters": v["r"]["iters"],
                    "skip": v["r"]["skip"], "nbuf": v["r"]["nbuf"],
                    "avg_us": 1e6 * sum(s) / len(s), "min_us": 1e6 * min(s),
                    "max_us": 1e6 * max(s)})
    meta0["variation_us"] = 1e6 * max(p["meta"]["variation_sec"] for p in per)
    per.sort(key=lambda p: p["meta"]["rank"])
    meta0["affinities"] = [p["meta"]["affinity"] for p in per]
    return meta0, out


def summarize(rows, lim, large=1 << 20):
    groups = {}
    for r in rows:
        if r.get("status", "ok") == "ok":
            groups.setdefault((r["label"], r["P"], r["collective"], r["size"]), []).append(r)
    summ = []
    for (label, P, coll, size), rs in sorted(groups.items(), key=lambda kv: (
            kv[0][2], kv[0][1], kv[0][3], kv[0][0])):
        avgs = [r["avg_us"] for r in rs]
        t = min(avgs)
        nb = L.min_bytes(coll, P, size)
        s = {"label": label, "library": rs[0]["library"], "P": P, "collective": coll,
             "size": size, "rounds": len(rs), "avg_us": t, "median_us": statistics.median(avgs),
             "min_us": min(r["min_us"] for r in rs),
             "max_us": max(r["max_us"] for r in rs),
             "round_spread": (max(avgs) - min(avgs)) / t if t else 0.0,
             "eff_GBps": nb / (t * 1e-6) / 1e9 if nb and t else None, "frac_limit": None}
        if lim and nb and size >= large:
            s["limit_GBps"] = L.bandwidth_for(lim, P) / 1e9
            s["frac_limit"] = (nb / L.bandwidth_for(lim, P)) / (t * 1e-6)
            s["bound_us"] = nb / L.bandwidth_for(lim, P) * 1e6  # no library can be faster
        summ.append(s)
    # ratios label/peer per (P, collective, size), all from this run
    idx = {(s["label"], s["P"], s["collective"], s["size"]): s for s in summ}
    for s in summ:
        for peer in PEERS:
            o = idx.get((peer, s["P"], s["collective"], s["size"]))
            if o and s["label"] != peer:
                s[f"ratio_vs_{peer}"] = s["avg_us"] / o["avg_us"]
    return summ


def human(n):
    for unit, v in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v and n % v == 0:
            return f"{n // v} {unit}"
    return f"{n} B"


def write_csv(path, rows):
    nested = {k for r in rows for k, v in r.items() if isinstance(v, (dict, list))}
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys and k not in nested]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def _fmt(x, nd=1):
    if x is None:
        return "-"
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{nd}f}" if x >= 10 else f"{x:.2f}"


def _table(head, rows):
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(r) + " |" for r in rows]


def _ratio(x):
    return "-" if x is None else f"{x:.3g}"


def markdown(summ, lim, meta, oversub, tg=None, tg_hosts=None):
    out = [f"# hbmcoll bench {meta.get('run_id', '')}", ""]
    m = meta.get("machine", {})
    out.append(f"Machine: {m.get('cpu_model')} (caches {m.get('caches') or 'unknown'}), "
               f"{m.get('usable_cpus')} usable CPUs, "
               f"{len(m.get('numa_nodes', {}))} NUMA node(s), kernel {m.get('kernel')}; "
               f"mode `{meta.get('mode')}`, {meta.get('rounds')} interleaved round(s); "
               f"float32, sum; latency = the mean over ranks in each library's best round (us; "
               f"interference only adds time; medians over rounds in results.json).")
    topo = next((t["meta"]["topology"] for t in meta.get("tasks", [])
                 if t.get("meta", {}).get("topology")), None)
    if isinstance(topo, dict):
        facts = {k: topo[k] for k in ("memory_mode", "cluster_mode", "hbm_nodes", "tuned", "error")
                 if k in topo}
        out.append(f"hbmcoll.topology(): {json.dumps(facts, default=str)} "
                   "(full topology per launch in results.json).")
    if meta.get("warning"):
        out.append(f"**Warning: {meta['warning']}.**")
    if lim:
        out.append(f"Memory bandwidth (the limit B is the better of STREAM copy and add, numpy, per number of processes): copy single core "
                   f"{lim['single_core_GBps']:.1f} GB/s, all {lim['cores']} cores "
                   f"{lim['all_cores_GBps']:.1f} GB/s" + (
                       f" (STREAM add, all cores: {lim['all_cores_add_GBps']:.1f} GB/s)"
                       if lim.get("all_cores_add_GBps") else "") +
                   ". Above 100% of B: the data stayed in cache, the machine was quieter "
                   "during that launch than during every bandwidth measurement, or the "
                   "collective wrote with streaming stores (no read for ownership, which the "
                   "STREAM kernels pay and do not count).")
    hn = meta.get("noise") or {}
    if hn.get("start") or hn.get("end"):
        out.append("Host noise (`bench/noise.py`: a pinned process per CPU reading the clock; a "
                   "gap is time the CPU was taken away): at the start " +
                   (noise.describe(hn.get("start")) or "not measured") + "; at the end " +
                   (noise.describe(hn.get("end")) or "not measured") + ".")
    xc = noise.slow_cross_core(meta.get("tasks", []))
    if xc:
        out.append(xc)
    var = [t["meta"]["variation_us"] for t in meta.get("tasks", []) if t.get("meta")]
    if var:
        out.append(f"Every latency includes the same data-variation step (buffer rotation and "
                   f"a one-word write, identical code for all libraries), measured alone at "
                   f"{statistics.median(var):.3f} us per iteration (median over launches, "
                   f"max {max(var):.3f}).")
    if any(s["label"] == FLOOR for s in summ):
        out.append("`floor`: no communication at all; each rank only computes `out = in + 1` on "
                   "its own rotating buffers, all ranks at once, pinned (the memory work an "
                   "out-of-place allreduce cannot avoid: read the input, write the output). "
                   "A library's time over the floor is what its communication adds.")
    if any(s["label"] == T.STAGED_FLOOR for s in summ):
        out.append(f"`{T.STAGED_FLOOR}` (allreduce, gather, bcast): the memory work plus the least "
                   "data that must cross between the ranks through shared memory (a rank's "
                   "result needs its peers' private inputs), done by bare C with a spinning "
                   "flag per chunk and nothing else, the fastest of its schedules at each size "
                   "(`bench/c/staged_floor.c`): the least such a collective of private buffers "
                   "can cost here, so a peer's time over it is the largest speedup any library "
                   "with private buffers could show (from 64 KiB; below, it is mostly one "
                   "ctypes call).")
    present_labels = sorted({s["label"] for s in summ})
    out += ["", "Labels: " + "; ".join(f"`{lb}`: {LABELS.get(lb, lb)}" for lb in present_labels) + ".", ""]
    labels = sorted({s["label"] for s in summ}, key=lambda x: (x not in PEERS, PEERS.index(x)
                                                                if x in PEERS else 0, x))
    for (coll, P) in sorted({(s["collective"], s["P"]) for s in summ}, key=_coll_key):
        ss = [s for s in summ if s["collective"] == coll and s["P"] == P]
        present = [lb for lb in labels if any(s["label"] == lb for s in ss)]
        sizes = sorted({s["size"] for s in ss})
        by = {(s["label"], s["size"]): s for s in ss}
        out += [f"## {coll}, {P} ranks", "", "Latency (us):", ""]
        out += _table(["size"] + present, [[human(z)] + [
            _fmt(by[lb, z]["avg_us"]) if (lb, z) in by else "-" for lb in present] for z in sizes])
        for p in PEERS:                     # one ratio table per peer keeps tables narrow
            cols = [lb for lb in present if lb != p and p in present
                    and not (p == "torch" and (lb in PEERS or lb.startswith(FLOOR)))]
            if not cols:
                continue
            out += ["", f"Time ratio to {p} (< 1: faster than {p}):", ""]
            out += _table(["size"] + [f"{lb}/{p}" for lb in cols], [[human(z)] + [
                _ratio(by[lb, z].get(f"ratio_vs_{p}")) if (lb, z) in by else "-"
                for lb in cols] for z in sizes])
        fz = [z for z in sizes if z >= FLOOR_MIN and (FLOOR, z) in by]
        if fz:
            out += ["", "Time over the floor (each label's time / the floor's at that size, from "
                    f"{human(FLOOR_MIN)}: below, the floor is mostly one NumPy call; 1 = nothing "
                    "but the local memory work):", ""]
            out += _table(["size"] + [lb for lb in present if lb != FLOOR], [[human(z)] + [
                f"{by[lb, z]['avg_us'] / by[FLOOR, z]['avg_us']:.2f}x" if (lb, z) in by else "-"
                for lb in present if lb != FLOOR] for z in fz])
        big = [s for s in ss if s["frac_limit"] is not None]
        if big:
            out += ["", f"Fraction of the memory-bandwidth limit (least bytes / B / time), "
                    f"B = {big[0]['limit_GBps']:.1f} GB/s:", ""]
            bsz = sorted({s["size"] for s in big})
            fr = {(s["label"], s["size"]): s["frac_limit"] for s in big}
            out += _table(["label"] + [human(z) for z in bsz], [[lb] + [
                f"{fr[lb, z]:.1%}" if (lb, z) in fr else "-" for z in bsz] for lb in present])
            # the limit as a time, and the largest speedup over each peer it leaves room for
            bound = {s["size"]: s["bound_us"] for s in big}
            out += ["", "What the limit allows: the least time (least bytes / B, us) and the "
                    "largest speedup over each peer any library could show in this run:", ""]
            rows = [["least time"] + [_fmt(bound[z]) for z in bsz]]
            for p in PEERS:
                if p in present:
                    rows.append([f"max speedup over {p}"] + [
                        f"{by[p, z]['avg_us'] / bound[z]:.2f}x" if (p, z) in by else "-"
                        for z in bsz])
            out += _table(["", *[human(z) for z in bsz]], rows)
        out.append("")
    out += T.markdown_hosts(tg_hosts)  # the targets, after the plain results: this host's
    out += T.markdown(tg)              # (issue 19), then issue 4's
    if oversub:
        out += ["## Oversubscribed: 8-byte allreduce, more ranks than cores", "",
                "MPICH's shared-memory path busy-polls, so ranks waiting for a descheduled "
                "peer burn the cores it needs; a timeout means it did not finish in time.", "",
                "| label | ranks | cores | iterations | status | us per allreduce | wall s |"
                " ratio to mpi4py |", "|---|---|---|---|---|---|---|---|"]
        ref = next((o.get("avg_us") for o in oversub if o["label"] == "mpi4py"), None)
        for o in oversub:
            t = o.get("avg_us")
            out.append(f"| {o['label']} | {o['P']} | {o['cores']} | {o['iters']} | {o['status']} "
                       f"| {_fmt(t)} | {o['wall_s']:.1f} | "
                       f"{_ratio(t / ref) if t and ref else '-'} |")
        out.append("")
    return "\n".join(out)


def plots(outdir, summ, lim):
    """One PNG per (collective, P): latency and effective bandwidth against size."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator
    except ImportError:
        return []
    made = []
    for (coll, P) in sorted({(s["collective"], s["P"]) for s in summ}):
        ss = [s for s in summ if s["collective"] == coll and s["P"] == P]
        if coll == "barrier":
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for lb in sorted({s["label"] for s in ss}):
            pts = sorted((s["size"], s["avg_us"], s["eff_GBps"]) for s in ss if s["label"] == lb)
            x = [p[0] for p in pts]
            style = "-o" if lb in PEERS else "-s"
            a1.plot(x, [p[1] for p in pts], style, label=lb, ms=4)
            a2.plot(x, [p[2] for p in pts], style, label=lb, ms=4)
        if lim:
            a2.axhline(L.bandwidth_for(lim, P) / 1e9, color="k", ls="--", lw=1,
                       label="memory bandwidth (limit)")
        for a in (a1, a2):
            a.set_xscale("log", base=2)
            a.xaxis.set_major_locator(LogLocator(base=16))
            a.xaxis.set_major_formatter(FuncFormatter(lambda x, _: human(int(round(x)))))
            a.set_xlabel("message size (bytes)")
            a.grid(True, which="both", alpha=0.3)
        a1.set_yscale("log")
        a1.set_ylabel("latency (us)")
        a2.set_ylabel("least bytes moved / time (GB/s)")
        a2.set_yscale("log")
        a1.legend(fontsize=8)
        a2.legend(fontsize=8)
        fig.suptitle(f"{coll}, {P} ranks (float32)")
        shown = sorted({s["label"] for s in ss})
        fig.text(0.01, 0.01, "\n".join(f"{lb}: {LABELS.get(lb, lb)}" for lb in shown), fontsize=7, va="bottom")
        fig.tight_layout(rect=(0, 0.04 + 0.025 * len(shown), 1, 1))
        name = f"{coll}_P{P}.png"
        fig.savefig(os.path.join(outdir, name), dpi=110)
        plt.close(fig)
        made.append(name)
    return made


def write_all(outdir, meta, rows, summ, lim, oversub):
    meta["plots"] = plots(outdir, summ, lim)
    tg, tg_hosts = T.check(summ, rows, oversub), T.check_hosts(summ, rows)
    doc = {"meta": meta, "limits": lim, "summary": summ, "rows": rows, "oversubscribed": oversub,
           "targets": tg, "targets_hosts": tg_hosts}
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    write_csv(os.path.join(outdir, "results.csv"), summ)
    write_csv(os.path.join(outdir, "rounds.csv"), rows)
    md = markdown(summ, lim, meta, oversub, tg, tg_hosts)
    with open(os.path.join(outdir, "table.md"), "w") as f:
        f.write(md + "\n")
    return md
