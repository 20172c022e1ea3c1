"""A small data-parallel training job on hbmcoll (what `make demo` runs).

Each rank holds a shard of a synthetic regression data set. Rank 0 initialises
the parameters and broadcasts them; every step each rank computes its local
gradient, the gradients are averaged with allreduce, and every rank applies the
same update. At the end the per-rank losses are gathered, the parameters of
all ranks are compared, and rank 0 checks the result against the same training
done in one process on the whole data set.

    python3 -m hbmcoll.run -n 4 examples/demo.py
"""
import os
import time

import numpy as np

import hbmcoll

FEATURES, SAMPLES_PER_RANK, STEPS, LR = 256, 2048, 50, 0.1


def shard(rank):
    """The rank's data: the same on every run, different per rank."""
    rng = np.random.default_rng(1000 + rank)
    x = rng.standard_normal((SAMPLES_PER_RANK, FEATURES), dtype=np.float32)
    true_w = np.linspace(-1, 1, FEATURES, dtype=np.float32)
    y = x @ true_w + 0.01 * rng.standard_normal(SAMPLES_PER_RANK, dtype=np.float32)
    return x, y


def gradient(w, x, y):
    err = x @ w - y
    return (x.T @ err) * np.float32(2.0 / len(y)), float(np.mean(err * err))


def main():
    comm = hbmcoll.init()
    rank, size = comm.rank, comm.size
    x, y = shard(rank)
    timings = {"bcast": [], "allreduce": [], "gather": []}

    w = np.random.default_rng(7).standard_normal(FEATURES).astype(np.float32) if rank == 0 \
        else np.zeros(FEATURES, np.float32)
    comm.barrier()  # timings below measure the collective, not the ranks' skew
    t = time.perf_counter()
    comm.bcast(w, root=0)
    timings["bcast"].append(time.perf_counter() - t)

    grad = hbmcoll.empty(FEATURES, "float32", comm=comm)  # lives in the shared segment
    for _ in range(STEPS):
        g, loss = gradient(w, x, y)
        grad[:] = g
        comm.barrier()
        t = time.perf_counter()
        comm.allreduce(grad, op="avg")
        timings["allreduce"].append(time.perf_counter() - t)
        w -= LR * grad

    comm.barrier()
    t = time.perf_counter()
    losses = comm.gather(np.array([loss], np.float64), root=0)
    timings["gather"].append(time.perf_counter() - t)
    all_w = comm.gather(w, root=0)
    cpus = sorted(os.sched_getaffinity(0))
    where = comm.gather(np.array([os.getpid(), cpus[0], cpus[-1], len(cpus)], np.int64), root=0)
    worst = {k: np.array([max(v)], np.float64) for k, v in timings.items()}
    mean = {k: np.array([np.mean(v)], np.float64) for k, v in timings.items()}
    for k in timings:  # slowest rank decides
        comm.reduce(worst[k], op="max", root=0)
        comm.reduce(mean[k], op="avg", root=0)

    if rank == 0:
        report(comm, losses, all_w, where, mean, worst)


def report(comm, losses, all_w, where, mean, worst):
    size = comm.size
    topo = hbmcoll.topology()
    print(f"hbmcoll demo: {size} ranks, {FEATURES} features, {SAMPLES_PER_RANK} samples per rank, "
          f"{STEPS} steps; memory mode {topo['memory_mode']}, HBM nodes {topo['hbm_nodes'] or 'none'}")
    print("placement:")
    for r in range(size):
        pid, lo, hi, n = where[r]
        cpus = f"CPU {lo}" if n == 1 else f"CPUs {lo}-{hi}" if hi - lo + 1 == n else f"{n} CPUs"
        nodes = topo["ranks"][r]["buffer_nodes"] if r < len(topo["ranks"]) else []
        print(f"  rank {r}: pid {pid}, runs on {cpus}, buffers on NUMA node(s) {nodes}")
    for note in topo.get("notices", []):
        print(f"  note: {note}")
    print("collective timings (mean / slowest rank):")
    for k in ("bcast", "allreduce", "gather"):
        print(f"  {k:9s} {mean[k][0] * 1e6:8.1f} us / {worst[k][0] * 1e6:8.1f} us")
    print("final loss per rank:", " ".join(f"{v[0]:.5f}" for v in losses))

    # Check: every rank ends with the same parameters, equal to one process
    # training on the union of the shards with the same steps.
    same = all(np.array_equal(all_w[0], all_w[r]) for r in range(size))
    xs, ys = zip(*(shard(r) for r in range(size)))
    w = np.random.default_rng(7).standard_normal(FEATURES).astype(np.float32)
    for _ in range(STEPS):
        g = np.mean([gradient(w, xs[r], ys[r])[0] for r in range(size)], axis=0, dtype=np.float32)
        w -= LR * g
    err = float(np.max(np.abs(w - all_w[0])))
    ok = same and err < 1e-4
    print(f"ranks agree: {same}; max difference to single-process training: {err:.2e}")
    print("VERIFIED" if ok else "FAILED")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
