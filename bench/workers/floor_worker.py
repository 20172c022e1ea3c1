"""Floors: what an out-of-place allreduce of private buffers cannot avoid, with no library.

    python floor_worker.py P SPEC.json OUT_PREFIX [staged]

`floor` (the default): no communication, only each rank's memory work.
`staged` (label floor-staged): that work plus the least data that must cross between the
ranks, done by a bare C kernel (bench/c/staged_floor.c, compiled here on first use) in each of
its three schedules; at each size the one fastest on average over the ranks is kept.

Forks P processes, rank r pinned to the r-th allowed CPU (where hbmcoll's launcher puts its
ranks when there are no more ranks than cores; on larger machines it spreads them), that all at
once do `out = in + 1` on their own buffers: read the N-byte input, write the N-byte output with
ordinary stores. Same rotation, touch and timing loop as the library workers
(common.py), so a library's time over this one is what its communication costs on top of the
bytes every rank must read and write anyway. The plain floor is for allreduce only, the staged
one for allreduce, gather and bcast; other collectives are reported as not supported. Buffers are
ordinary NumPy arrays, so the floors are for the out-of-place variants (mpi4py,
hbmcoll-numpy); hbmcoll-empty runs in place and moves less.
"""
import ctypes
import json
import mmap
import multiprocessing as mp
import multiprocessing.connection  # noqa: F401  (mp.connection.wait)
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import common as C  # noqa: E402


HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL_SRC = os.path.join(HERE, "..", "c", "staged_floor.c")
# per collective, the schedules (kernel variants) measured; pass i runs the i-th of each
SCHEDULES = {"allreduce": ("rsag", "flat", "rsag_nt"), "gather": ("memcpy", "movsb", "nt"),
             "bcast": ("memcpy", "movsb", "nt")}
PASSES = len(SCHEDULES["allreduce"])   # the same number for every collective


def staged_kernel():
    """The staged floor's kernel as a ctypes library, compiled (again) when its source is newer."""
    repo = os.path.join(HERE, "..", "..")    # a checkout's; installed, hbmcoll/: not there
    build = os.path.join(repo, "build")
    if not os.path.isdir(os.path.join(repo, "pymod", "hbmcoll")) or not os.access(
            build if os.path.isdir(build) else repo, os.W_OK):
        build = tempfile.gettempdir()
    os.makedirs(build, exist_ok=True)
    so = os.path.join(build, "staged_floor.so")
    if not os.path.exists(so) or os.path.getmtime(so) < os.path.getmtime(KERNEL_SRC):
        tmp = f"{so}.{os.getpid()}"
        cc = os.environ.get("CC", "cc")
        p = subprocess.run([cc, "-std=c11", "-O3", "-march=native", "-shared", "-fPIC",
                            KERNEL_SRC, "-o", tmp], capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"[floor] cannot build the staged floor's kernel with {cc}: "
                     f"{p.stderr.strip()[-400:]}")
        os.replace(tmp, so)  # atomic: a concurrent run sees the old file or the new one
    lib = ctypes.CDLL(so)
    lib.staged_floor_bytes.argtypes = [ctypes.c_int]
    lib.staged_floor_bytes.restype = ctypes.c_size_t
    ptr, i32, n = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    for name in SCHEDULES["allreduce"]:
        f = getattr(lib, f"staged_floor_{name}")
        f.argtypes, f.restype = [ptr, i32, i32, ptr, ptr, n], i32
    lib.staged_floor_gather.argtypes = [ptr, i32, i32, i32, i32, ptr, ptr, n]
    lib.staged_floor_gather.restype = i32
    lib.staged_floor_bcast.argtypes = [ptr, i32, i32, i32, i32, ptr, n]
    lib.staged_floor_bcast.restype = i32
    return lib


def rank_main(rank, P, spec, out, barrier, kernel=None, shared=None):
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    one = C.DTYPE(1)

    def build(coll, size, nbuf, npass=0):
        if coll not in (("allreduce",) if kernel is None else SCHEDULES):
            return None
        n = C.count(size)
        s = [C.filled(n, rank + k) for k in range(nbuf)]
        if kernel is None:
            r = [C.output(n) for _ in range(nbuf)]
            return (lambda k: np.add(s[k], one, out=r[k])), s
        base = ctypes.addressof(ctypes.c_char.from_buffer(shared))
        if coll == "gather":   # only the root has an output
            r = [C.output(n * P if rank == 0 else 1) for _ in range(nbuf)]
            how = npass   # 0 memcpy, 1 movsb, 2 nt: SCHEDULES["gather"] in that order

            def call(b, me, P, sp, rp, n):
                return kernel.staged_floor_gather(b, me, P, 0, how, sp, rp, n)
        elif coll == "bcast":  # in place: rank 0's buffers are the source, the others' the output
            r, how = s, npass

            def call(b, me, P, sp, rp, n):
                return kernel.staged_floor_bcast(b, me, P, 0, how, sp, n)
        else:
            r = [C.output(n) for _ in range(nbuf)]
            call = getattr(kernel, f"staged_floor_{SCHEDULES[coll][npass]}")
        sp, rp = [a.ctypes.data for a in s], [a.ctypes.data for a in r]

        def op(k, keep=(s, r)):  # the arrays must outlive their addresses
            if call(base, rank, P, sp[k], rp[k], n):
                raise RuntimeError("staged floor: a peer stopped answering")
        return op, s

    if kernel is None:
        rows = C.run_all(spec, rank, P, barrier.wait, build)
        meta = {"library": "floor", "op": "out = in + 1, no communication"}
    else:  # every schedule; main() keeps the fastest at each size
        rows = [dict(row, schedule=SCHEDULES[row["collective"]][i]) for i in range(PASSES)
                for row in C.run_all(spec, rank, P, barrier.wait,
                                     lambda c, z, nb, i=i: build(c, z, nb, i))]
        meta = {"library": "floor-staged", "op": "bare C (bench/c/staged_floor.c)"}
    C.write_rank(out, rank, P, dict(meta, pinned_cpu=cpus[rank % len(cpus)]), rows)


def keep_fastest_schedule(out, P):
    """Leave in every rank's file only the rows of the schedule that was fastest at each size
    (mean over ranks), the same one for all ranks."""
    files = [f"{out}.r{r}.json" for r in range(P)]
    docs = [json.load(open(f)) for f in files]
    mean = {}
    for d in docs:
        for row in d["rows"]:
            mean.setdefault((row["collective"], row["size"], row["schedule"]), []).append(row["sec"])
    best = {}
    for (coll, size, sch), secs in mean.items():
        t = sum(secs) / len(secs)
        if (coll, size) not in best or t < best[coll, size][1]:
            best[coll, size] = (sch, t)
    for f, d in zip(files, docs):
        d["rows"] = [row for row in d["rows"]
                     if best[row["collective"], row["size"]][0] == row["schedule"]]
        with open(f, "w") as fh:
            json.dump(d, fh)


def end_ranks(procs):
    """SIGTERM, then SIGKILL, whatever each rank is doing. (Not Barrier.abort(): it waits,
    without a timeout, for every rank at the barrier to wake, and a dead one never does.)"""
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


def main():
    if len(sys.argv) not in (4, 5) or sys.argv[4:] not in ([], ["staged"]):
        sys.exit("usage: floor_worker.py P SPEC.json OUT_PREFIX [staged]")
    P = int(sys.argv[1])
    spec, out = C.load_spec(sys.argv[2:4])
    kernel = staged_kernel() if sys.argv[4:] else None
    shared = mmap.mmap(-1, kernel.staged_floor_bytes(P)) if kernel else None  # MAP_SHARED, zeroed
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(P, timeout=600)
    procs = [ctx.Process(target=rank_main, args=(r, P, spec, out, barrier, kernel, shared))
             for r in range(P)]
    for p in procs:
        p.start()
    left = {p.sentinel: p for p in procs}
    while left:  # a rank that fails ends the others: they would wait at the next barrier
        for s in mp.connection.wait(list(left)):
            p = left.pop(s)
            p.join()
            if p.exitcode != 0:
                end_ranks(list(left.values()))
                left.clear()
                break
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    for r, code in bad:
        print(f"[floor] rank {r} exited with {code}", file=sys.stderr)
    if kernel and not bad:
        keep_fastest_schedule(out, P)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
