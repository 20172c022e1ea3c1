"""Horovod-style DistributedOptimizer: fusion buckets in the shared arena against private ones,
and against bare allreduces of hbmcoll.empty buffers of the same sizes, in one run (issue 19).

    python3 bench/optimizer_buckets.py [--np 2] [--rounds 6] [--steps 30] [--width 1024]

Launches of --np ranks under hbmcoll-run alternate (ABBA) between buckets in the communicator's
shared arena (the default on one node) and private ones (ARENA_BUCKETS off, as before): each
trains an MLP (--width hidden units, float32) with hbmcoll.torch.DistributedOptimizer over SGD
for --steps steps after as many to warm up, then times bare allreduces of hbmcoll.empty buffers
of its buckets' sizes. One kind per launch: two models in one process disturbed each other's
timings (the one built first ran faster, whichever it was). Reported: steps/s (the slowest
rank's time, best launch), the time per step the buckets' allreduces take (timed around the
communicator's allreduce), and the bare allreduces. A benchmark: nothing is asserted.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "pymod"))


def worker(a):
    """One launch, one kind of bucket (--mode): prints steps/s and allreduce ms per step."""
    import numpy as np
    import torch
    import hbmcoll.torch as hvd
    from hbmcoll.torch import optimizer as _torch_optimizer
    torch.set_num_threads(1)
    comm = hvd.init()
    spent = [0.0]
    real = comm.allreduce

    def timed(buf, op="sum", out=None):  # every bucket allreduce of the steps
        t = time.perf_counter()
        got = real(buf, op, out)
        spent[0] += time.perf_counter() - t
        return got
    comm.allreduce = timed
    torch.manual_seed(0)
    w = a.width
    model = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                                torch.nn.Linear(w, 10))
    _torch_optimizer.ARENA_BUCKETS = a.mode == "arena"
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4), bucket_cap_mb=a.bucket_mb)
    assert (opt._hb_buckets[0].arena is not None) == (a.mode == "arena")
    x, y = torch.randn(32, w), torch.randint(0, 10, (32,))
    for k in range(2):  # a warm-up, then the timed steps
        comm.barrier()
        spent[0], t = 0.0, time.perf_counter()
        for _ in range(a.steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        took = np.array([time.perf_counter() - t, spent[0]])
        real(took, "max")
    bare = [hbmcoll_empty(comm, b.flat.numel()) for b in opt._hb_buckets]
    comm.barrier()
    t = time.perf_counter()
    for _ in range(a.steps):
        for b in bare:
            real(b, "avg")
    t_bare = np.array([time.perf_counter() - t])
    real(t_bare, "max")
    if comm.rank == 0:
        print(f"RESULT {a.steps / took[0]:.3f} {took[1] / a.steps * 1e3:.4f} {t_bare[0] / a.steps * 1e3:.4f} "
              + " ".join(str(b.flat.numel() * 4) for b in opt._hb_buckets), flush=True)


def launch(a, mode):
    env = dict(os.environ, OMP_NUM_THREADS="1", HBMCOLL_QUIET="1")
    out = subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", str(a.np), sys.executable, os.path.abspath(__file__),
                          "--worker", "--mode", mode, "--width", str(a.width), "--steps", str(a.steps),
                          "--bucket-mb", str(a.bucket_mb)], env=env, capture_output=True, text=True, timeout=600)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    if out.returncode or not line:
        raise SystemExit(f"the {mode} run failed: {out.stderr[-2000:]}")
    steps, ar, bare, *sizes = line[0].split()[1:]
    return float(steps), float(ar), float(bare), [int(z) for z in sizes]


def hbmcoll_empty(comm, n):
    import hbmcoll
    e = hbmcoll.empty(n, "float32", comm=comm)
    e[:] = 1.0
    return e


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6, help="launches of each kind, in ABBA order")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--width", type=int, default=1024, help="hidden units (1024: 8.4 MB of gradients)")
    ap.add_argument("--bucket-mb", type=float, default=4.0)
    ap.add_argument("--mode", choices=("arena", "private"), help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    import machine
    print(f"# {machine.cpu_model()}, {os.cpu_count()} CPUs; {a.np} ranks, width {a.width}, {a.steps} steps a "
          f"launch, best of {a.rounds} launches each (ABBA)")
    best = {}
    for r in range(a.rounds):
        for mode in (("arena", "private") if r % 2 == 0 else ("private", "arena")):
            got = launch(a, mode)
            if mode not in best or got[0] > best[mode][0]:
                best[mode] = got
    (sa, ara, bare, sizes), (sp, arp, _, _) = best["arena"], best["private"]
    print(f"| buckets | steps/s | bucket allreduces, ms per step |\n|---|---|---|\n"
          f"| shared arena | {sa:.1f} | {ara:.2f} |\n| private | {sp:.1f} | {arp:.2f} |\n"
          f"| bare hbmcoll.empty allreduces of the same sizes | | {bare:.2f} |\n"
          f"arena/private steps/s: {sa / sp:.2f}x; arena allreduces / bare: {ara / bare:.2f}x; buckets: "
          f"{', '.join(f'{z / 2**20:.2f} MiB' for z in sizes)}")


if __name__ == "__main__":
    main()
