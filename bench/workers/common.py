"""Shared by the three workers: the spec, the OSU/OMB-Py timing loop, buffer rotation, output.

Each worker runs under its own library's launcher, builds one `op(k)` callable per
(collective, size) and hands it to `time_op`. Everything that is not the collective itself
(buffer rotation, the one-word touch, the Python loop) is this same code for every library,
so its cost is equal across libraries; it is also measured (`variation_us`) and reported.

Message size semantics follow OSU: `size` is the bytes each rank contributes
(allreduce/bcast/reduce: the vector; gather/allgather: each rank's part; alltoall: one block
per destination; reduce_scatter: the whole vector, each rank receives size/P).
"""
import json
import os
import platform
import sys
import time

import numpy as np

DTYPE = np.float32
ITEM = 4
LLC_BYTES = 32 << 20          # default when the spec does not give the last-level cache size
MAX_ROTATE = 16               # buffers per (collective, size) at most
ROTATE_BYTES = 256 << 20      # memory one rank may spend on rotating send buffers


def load_spec(argv=None):
    """Worker command line: `worker.py SPEC.json OUT_PREFIX` (OUT_PREFIX.r<rank>.json per rank)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.exit("usage: worker.py SPEC.json OUT_PREFIX")
    with open(argv[0]) as f:
        spec = json.load(f)
    return spec, argv[1]


def iterations(spec, size):
    """OSU defaults: 10,000 timed + 1,000 warm-up up to 8 KB, 100 + 10 above."""
    if size <= spec.get("small_limit", 8192):
        return spec.get("iters_small", 10000), spec.get("skip_small", 1000)
    return spec.get("iters_large", 100), spec.get("skip_large", 10)


def n_rotate(spec, slot_bytes):
    """How many pre-filled buffer sets to rotate among: enough that each rank's sets outgrow
    the LLC four times (so cache-resident data does not flatter medium sizes, even where a VM
    hides a second cache), a power of two, at most MAX_ROTATE, within ROTATE_BYTES per rank.
    `slot_bytes`: one set's bytes on one rank."""
    llc = spec.get("llc_bytes", LLC_BYTES)
    k = 1
    while k < MAX_ROTATE and k * slot_bytes < 4 * llc and 2 * k * slot_bytes <= ROTATE_BYTES:
        k *= 2
    return k


def count(size):
    return max(1, size // ITEM)


def filled(shape, seed, alloc=np.empty):
    """A buffer with distinct, finite contents per rank and per rotation slot."""
    a = alloc(shape, DTYPE)
    a.reshape(-1)[:] = np.arange(a.size, dtype=DTYPE) % 251 * 1e-3 + seed
    return a


def output(shape, alloc=np.empty):
    """A result buffer, written once now: a fresh np.empty is untouched memory, and its page
    faults would land in whichever timed call first writes it (the warm-up does not reach every
    rotating buffer above 8 KB), a cost of the harness that no library should carry."""
    a = alloc(shape, DTYPE)
    a.reshape(-1)[:] = 0
    return a


def time_op(op, touch, nbuf, iters, skip, barrier):
    """OMB-Py method: barrier, warm-up, barrier, back-to-back timed loop, barrier.

    `touch[k]` is a 1-element NumPy view of send buffer k: writing it every iteration makes
    the data differ between iterations at the same (tiny) cost for every library.
    Returns seconds per iteration on this rank.
    """
    m = nbuf - 1
    barrier()
    for i in range(skip):
        k = i & m
        touch[k][0] = i
        op(k)
    barrier()
    t0 = time.perf_counter()
    for i in range(iters):
        k = i & m
        touch[k][0] = i
        op(k)
    t1 = time.perf_counter()
    barrier()
    return (t1 - t0) / iters


def variation_cost(nbuf, iters=20000):
    """Cost of the loop, rotation and touch alone (no collective), seconds per iteration."""
    views = [np.zeros(1, DTYPE) for _ in range(nbuf)]
    return time_op(lambda k: None, views, nbuf, iters, 100, lambda: None)


def run_all(spec, rank, size_p, barrier, build, progress=None):
    """Time every (collective, size) the spec asks for. `build(coll, size, nbuf)` returns
    (op, touch_views) or None when the library lacks that collective."""
    rows = []
    colls = spec["collectives"]
    for ci, coll in enumerate(colls):
        for size in spec["sizes"]:
            if coll == "reduce_scatter" and size < ITEM * size_p:
                continue                  # fewer elements than ranks: nothing to scatter
            wide = size_p if coll in ("gather", "allgather", "alltoall") else 1
            slot = size * (1 + wide)
            if size_p * slot > spec.get("mem_budget", float("inf")):
                if rank == 0:          # e.g. 64 MiB alltoall over 64 ranks: 512 GiB
                    print(f"[bench] {coll} {size} B: needs more than the memory budget, skipped",
                          file=sys.stderr)
                continue
            nbuf = 1 if coll == "barrier" else n_rotate(spec, slot)
            made = build(coll, size, nbuf)
            if made is None:
                if rank == 0 and size == spec["sizes"][0]:
                    print(f"[bench] {coll}: not supported, skipped", file=sys.stderr)
                break
            op, touch = made
            iters, skip = iterations(spec, size)
            if coll == "barrier":
                iters, skip = spec.get("iters_small", 10000), spec.get("skip_small", 1000)
            t = time_op(op, touch, nbuf, iters, skip, barrier)
            rows.append({"collective": coll, "size": 0 if coll == "barrier" else size,
                         "iters": iters, "skip": skip, "nbuf": nbuf, "sec": t})
            del op, touch, made
            if coll == "barrier":
                break
        if progress and rank == 0:
            progress(ci + 1, len(colls))
    return rows


def write_rank(out_prefix, rank, world, meta, rows):
    meta = dict(meta)
    meta.update({"rank": rank, "world_size": world, "pid": os.getpid(),
                 "host": platform.node(), "affinity": sorted(os.sched_getaffinity(0)),
                 "variation_sec": variation_cost(4)})
    with open(f"{out_prefix}.r{rank}.json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, default=str)
