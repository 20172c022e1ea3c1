"""`python -m hbmcoll.tune`: choose this host's thresholds from measurements made here, and
cache them for every later job on the host.

    python -m hbmcoll.tune [--ranks 2] [--rounds 3]   # a few seconds; writes the cache
    python -m hbmcoll.tune --show                      # what the cache says, and where it is

A threshold tuned on one machine is wrong on the next: the same eager bcast wins up to one size
on one CPU and loses well below it on another (bench/README.md, "Measurements behind the code",
has the hosts and the numbers behind every remark here). For each candidate value the ranks make a
communicator with it and time bcast, gather and allreduce of NumPy buffers around the sizes it
decides (the slowest rank's time, best of --rounds); the value with the least geometric mean of
time over the best candidate's, size by size, is kept unless the default is within 5% of it
(noise). For a threshold, candidates that put a size on the same side of it take the same path
there, and share the median of their times at that size. The variables are measured in turn,
each with the choices before it applied (the push thresholds depend on each other). Measured now:

- HBMCOLL_SMALL_MAX: where the one-round eager/flat copy gives way to the pipelined one;
- HBMCOLL_CMA: single copy between private buffers for large bcast, gather, both or neither,
  where the kernel allows it (a container may not): it can win for gather and lose for bcast
  on the same host, as a bcast's staged root returns while the receivers copy; "auto" (the
  default: gather's single copy unless a probe at creation found staging faster) is scored by the
  paths its probe chose;
- HBMCOLL_CMA_MIN: from which size those collectives copy once (measured on them only);
- HBMCOLL_SLOT_BYTES: the chunk a pipelined collective moves per round (staging per rank);
- HBMCOLL_REP_MOVSB_MIN: from which size plain copies use `rep movsb` rather than memcpy ("auto":
  1M on AMD Zen 5 and later, where it was measured to pay, else never);
- HBMCOLL_STREAM_MIN: from which size results are written with streaming stores. "auto", half
  the largest cache the CPU reports, assumes that cache is ours; on a VM it is shared with
  other tenants;
- HBMCOLL_PUSH_MIN: from which size an allreduce of hbmcoll.empty buffers pushes (each rank
  writes its reduced slice into every output) instead of rsag's zero copy, and
  HBMCOLL_PUSH_STREAM_MIN, from which size it writes with streaming stores: whether the push
  wins, and with which stores, went opposite ways on two CPUs.

The cache (~/.cache/hbmcoll/tuned-<host>.json, or HBMCOLL_TUNE_FILE) is keyed by the CPU model,
core count, kernel and hbmcoll version; init() applies it to every variable the environment does
not set (an explicit HBMCOLL_* always wins), and says so at HBMCOLL_LOG=info.
HBMCOLL_TUNE=off ignores it. `python -m hbmcoll` and hbmcoll.topology()["tuned"] show it.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

from .tune_cache import CANDIDATES, apply, cache_path, host, load  # noqa: F401 (this module's names before the split)

DEFAULTS = {"HBMCOLL_SMALL_MAX": "16K", "HBMCOLL_CMA": "auto", "HBMCOLL_CMA_MIN": "256K",
            "HBMCOLL_SLOT_BYTES": "256K",
            "HBMCOLL_REP_MOVSB_MIN": "auto",
            "HBMCOLL_STREAM_MIN": "auto", "HBMCOLL_PUSH_MIN": "auto", "HBMCOLL_PUSH_STREAM_MIN": "auto"}
CASES = {"HBMCOLL_SMALL_MAX": (("bcast", "gather", "allreduce"), (4096, 16384, 32768, 65536, 131072)),
         "HBMCOLL_CMA": (("bcast", "gather"), (1 << 20, 4 << 20)),
         # on the collectives the CMA choice gave single copy (none: not measured)
         "HBMCOLL_CMA_MIN": ((), (64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20)),
         "HBMCOLL_SLOT_BYTES": (("bcast", "gather", "allreduce"), (1 << 20, 4 << 20)),
         "HBMCOLL_REP_MOVSB_MIN": (("bcast", "gather"), (1 << 20, 4 << 20)),
         # allreduce only: a gather's single copy and bcast's receivers took as long streaming as
         # not, within the noise, so their cases only blurred the choice (bench/README.md)
         "HBMCOLL_STREAM_MIN": (("allreduce",), (1 << 20, 4 << 20, 16 << 20)),
         "HBMCOLL_PUSH_MIN": (("allreduce-arena",), (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)),
         "HBMCOLL_PUSH_STREAM_MIN": (("allreduce-arena",), (1 << 20, 4 << 20, 16 << 20))}
# what each HBMCOLL_CMA word asks for ("auto": what the communicator's probe kept, recorded as
# "single" beside the times; so is what each word got, as a container may refuse single copy)
CMA_COLLS = {"0": (), "gather": ("gather",), "bcast": ("bcast",), "1": ("bcast", "gather"), "auto": ()}
NOT_CASES = ("works", "single")
NOISE = 1.05


ROTATE = 8   # buffers taken in turn, as the suite does: a message is rarely in cache twice running
ROTATE_BYTES = 512 << 20  # at most this much of them per rank (a gather's root holds P messages each)


def _time(comm, coll, nbytes, rounds):
    """The slowest rank's time of one call (best of `rounds`); "allreduce-arena": in place on
    hbmcoll.empty buffers, as the suite's empty variant."""
    import numpy as np
    from ..comm import empty
    count = max(nbytes // 4, 1)
    rows = comm.size if coll == "gather" and comm.rank == 0 else 1 if coll == "allreduce" else 0
    rotate = max(2, min(ROTATE, ROTATE_BYTES // (count * 4 * (1 + rows))))
    if coll == "allreduce-arena":
        xs = [empty(count, "float32", comm=comm) for _ in range(rotate)]
        for x in xs:
            x[:] = 1
    else:
        xs = [np.ones(count, np.float32) for _ in range(rotate)]
    outs = [np.empty((rows, count), np.float32) if rows else None for _ in range(rotate)]
    call = {"bcast": lambda k: comm.bcast(xs[k], root=0),
            "gather": lambda k: comm.gather(xs[k], root=0, out=outs[k]),
            "allreduce": lambda k: comm.allreduce(xs[k], out=outs[k][0]),
            "allreduce-arena": lambda k: comm.allreduce(xs[k])}[coll]
    n = max(16, min(500, (4 << 20) // max(nbytes, 1) * 4))
    best = math.inf
    for _ in range(rounds + 1):  # the first warms up
        comm.barrier()
        t = time.perf_counter()
        for i in range(n):
            call(i % rotate)
        took = np.array([(time.perf_counter() - t) / n])
        comm.allreduce(took, "max")
        best = min(best, float(took[0]))
    return best


def _worker(rounds):
    from ..launch.job import init
    got = {}
    for var, values in CANDIDATES.items():
        colls, sizes = CASES[var]
        if var == "HBMCOLL_CMA_MIN":
            colls = got[f"HBMCOLL_CMA={os.environ['HBMCOLL_CMA']}"]["single"]
            if not colls:  # no single copy here: its threshold changes nothing
                continue
            chosen = os.environ["HBMCOLL_CMA"]
            # measured with the word auto's probe gave (it probes again at every init, and a
            # flip between candidates would be scored as the threshold's doing)
            os.environ["HBMCOLL_CMA"] = {("gather",): "gather", ("bcast",): "bcast"}.get(tuple(colls), "1")
        for value in values:
            os.environ[var] = value
            comm = init()
            got[f"{var}={value}"] = {f"{c} {z}": _time(comm, c, z, rounds) for c in colls for z in sizes}
            if var == "HBMCOLL_CMA":
                got[f"{var}={value}"].update(works=bool(comm.single_copy), single=list(comm.single_copy))
            comm.close()
        if var == "HBMCOLL_CMA_MIN":
            os.environ["HBMCOLL_CMA"] = chosen
        # the next variables are measured with this choice (every rank has the same slowest-rank
        # times, so every rank chooses alike)
        os.environ[var] = _choose_one(var, {v: got[f"{var}={v}"] for v in values})[0]
    if comm.rank == 0:
        print("TUNED " + json.dumps(got), flush=True)


# thresholds whose effect at a size depends only on the side of it the size lies: "le", a
# size up to the threshold takes the path; "ge", from the threshold on
SIDES = {"HBMCOLL_SMALL_MAX": "le", "HBMCOLL_CMA_MIN": "ge", "HBMCOLL_STREAM_MIN": "ge",
         "HBMCOLL_PUSH_MIN": "ge", "HBMCOLL_PUSH_STREAM_MIN": "ge"}
HALF_LLC_AUTO = ("HBMCOLL_STREAM_MIN", "HBMCOLL_PUSH_STREAM_MIN")
AUTO_BYTES = {"HBMCOLL_PUSH_MIN": 0}  # an "auto" that is a fixed size in the core (param.c)


def _llc_bytes():
    """The largest CPU cache, as the C core reads it (param.c), or None."""
    best = 0
    for i in range(8):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{i}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        best = max(best, int(text.rstrip("KM")) * scale)
    return best or None


def _threshold_bytes(var, value):
    """A candidate's threshold in bytes ("auto" as the core resolves it), or None."""
    if value == "auto" and var in AUTO_BYTES:
        return AUTO_BYTES[var]
    if value == "auto":
        llc = _llc_bytes() if var in HALF_LLC_AUTO else None
        return llc // 2 if llc else None
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(value[-1:], 1)
    return int(value.rstrip("KMG")) * scale


def _takes_path(var, value, case, limit):
    """Whether candidate value sends a case down the variable's path: for a threshold, the
    case's size on its side of it; for HBMCOLL_CMA, whether the word gave the case's collective
    single copy (limit: the collectives it did)."""
    coll, size = case.split()[0], int(case.split()[-1])
    if var == "HBMCOLL_CMA":
        return coll in limit[value]
    return size <= limit[value] if SIDES[var] == "le" else size >= limit[value]


def _pooled(var, runs, cases):
    """The candidates that send a case down the same path (for a threshold, those putting its
    size on the same side; for HBMCOLL_CMA, the words that give its collective single copy or
    not, so bcast's choice and gather's are made apart) take the same measurement repeated.
    Each gets the median of its path's times, so
    the choice rests on the paths' difference, not on noise between equal candidates (scored one
    by one, such noise once outvoted a real gain of streaming: bench/README.md, "A threshold is
    scored by its paths")."""
    limit = {v: _threshold_bytes(var, v) for v in runs} if var in SIDES else {}
    if var == "HBMCOLL_CMA":
        limit = {v: r.get("single", CMA_COLLS[v]) for v, r in runs.items()}
    if var != "HBMCOLL_CMA" and (var not in SIDES or None in limit.values()):
        return runs
    out = {v: dict(r) for v, r in runs.items()}
    for case in cases:
        taken = {v: _takes_path(var, v, case, limit) for v in runs}
        for group in (True, False):
            members = sorted((runs[v][case], v) for v in runs if taken[v] == group)
            for _, v in members:
                out[v][case] = statistics.median(t for t, _ in members)
    return out


def _choose_one(var, runs):
    """(value, why) for one variable from {candidate: {case: seconds}}."""
    values = CANDIDATES[var]
    if var == "HBMCOLL_CMA" and not runs["1"].get("works"):
        return "0", "single copy does not work here"
    cases = [k for k in runs[values[0]] if k not in NOT_CASES]
    runs = _pooled(var, runs, cases)
    best = {k: min(runs[v][k] for v in values) for k in cases}
    score = {v: math.exp(sum(math.log(runs[v][k] / best[k]) for k in cases) / len(cases)) for v in values}
    top = min(score, key=score.get)
    keep = score[DEFAULTS[var]] <= score[top] * NOISE
    return (DEFAULTS[var] if keep else top,
            f"{', '.join(f'{v}: {score[v]:.2f}' for v in values)} (time over the best, geometric mean)")


def choose(measured):
    """{variable: (value, why)} from the worker's times (of the variables it measured)."""
    return {var: _choose_one(var, {v: measured[f"{var}={v}"] for v in values})
            for var, values in CANDIDATES.items() if all(f"{var}={v}" in measured for v in values)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m hbmcoll.tune", description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--show", action="store_true", help="print the cache of this host and stop")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return _worker(a.rounds)
    if a.show:
        doc = load()
        print(f"{cache_path()}: " + (json.dumps(doc.get("choice"), sort_keys=True) if doc else "no cache for this host"))
        return
    env = dict(os.environ, HBMCOLL_TUNE="off", HBMCOLL_QUIET="1")
    # measured with the library's defaults: a forced algorithm or a small arena (the arena case
    # holds 8 buffers of 16 MiB a rank) would skew or fail the measurement
    for var in (*CANDIDATES, "HBMCOLL_ALGO", "HBMCOLL_ARENA_BYTES"):
        env.pop(var, None)
    p = subprocess.run([sys.executable, "-m", "hbmcoll.launch.run", "-n", str(a.ranks), sys.executable, "-m", "hbmcoll.tools.tune",
                        "--worker", "--rounds", str(a.rounds)], env=env, capture_output=True, text=True, timeout=900)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("TUNED ")), None)
    if p.returncode or line is None:
        sys.exit(f"hbmcoll.tune: the measuring job failed: {p.stderr.strip()[-2000:]}")
    measured = json.loads(line[6:])
    choice = choose(measured)
    doc = {"host": host(), "when": time.strftime("%Y-%m-%d %H:%M:%S"), "ranks": a.ranks,
           "choice": {k: v for k, (v, _) in choice.items()}, "why": {k: w for k, (_, w) in choice.items()},
           "measured_s": measured}
    path = cache_path()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
    for var, (value, why) in choice.items():
        print(f"{var}={value}   {why}")
    print(f"written to {path}; jobs on this host take it from now on (HBMCOLL_TUNE=off ignores it)")


if __name__ == "__main__":
    main()
