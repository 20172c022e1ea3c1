"""Soft Memory Box's emulation of asynchronous SGD: a parameter server and workers, through
hbmcoll's memory server against the same emulation over MPI, in one run, across emulated nodes.

    sudo python3 bench/memserver_sgd.py [--workers 2,3,4] [--scale 16] [--iterations 20] [--rounds 3]

The server (or MPI's parameter server) runs on node 0 and each worker on a node of its own:
network namespaces on a bridge, as in the tests (rdma-bridge.md section 5). Each worker, per
iteration: "computes" (sleeps the model's compute time), pushes its gradient and pulls the
parameters. hbmcoll: accumulate into a RemoteBuffer on one hbmcoll-memserver, then read it
(libfabric tcp). MPI (mpi4py + MPICH under hydra, UCX_TLS=tcp,self, as the SMB authors used
MPI): rank 0 is the parameter server, which receives a gradient from any worker, adds it and
sends the parameters back; workers Send then Recv. The models are SMB's (parameters, compute
per iteration), both divided by --scale so the run fits this machine; the ratio of communication
to compute stays. Reported: communication time per iteration (the push and the pull, the
slowest worker's mean; best of --rounds) and its share of the iteration.

Also, in the same run: the server's accumulate kernel (y += alpha * x, float32, 1 MiB chunks into
a large buffer, as the server applies them) against this machine's memory bandwidth (a NumPy
copy of the same large buffer), both as bytes of the large buffer read and written per second.
A benchmark: nothing is asserted.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "pymod"))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
import machine  # noqa: E402

TOKEN = "bench-token-of-16-bytes-or-more"  # a server refuses a token under 16 bytes
from netnodes import NetNodes, finish  # noqa: E402  (the namespaces the tests use too)

ENV = dict(os.environ, OMP_NUM_THREADS="1", UCX_TLS="tcp,self", HBMCOLL_QUIET="1",
           PYTHONPATH=os.path.join(ROOT, "pymod"))

MODELS = {"Inception-v1": (51e6, 0.189), "ResNet-50": (121e6, 0.233)}  # bytes, compute seconds (SMB)

WORKER = r"""
import os, sys, time, numpy as np
lib, nbytes, compute, iters = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
n = nbytes // 4
grad = np.full(n, 1e-3, np.float32)
params = np.empty(n, np.float32)
if lib == "hbmcoll":
    import hbmcoll
    rb = hbmcoll.RemoteBuffer("params", (n,), "float32")
    rank, push, pull = int(os.environ["W"]), (lambda: rb.accumulate(grad)), (lambda: rb.read(out=params))
    done = lambda comm: print("comm %d %.6f" % (rank, comm / iters), flush=True)
else:
    import mpi4py
    mpi4py.rc.finalize = False  # MPICH 4.0 over UCX tcp hung in MPI_Finalize at 4 workers, after the work
    from mpi4py import MPI
    w = MPI.COMM_WORLD
    rank = w.Get_rank()
    if rank == 0:  # the parameter server
        ps, buf, st = np.zeros(n, np.float32), np.empty(n, np.float32), MPI.Status()
        for _ in range(iters * (w.Get_size() - 1)):
            w.Recv(buf, source=MPI.ANY_SOURCE, tag=1, status=st)
            ps += buf
            w.Send(ps, dest=st.Get_source(), tag=2)
        w.Barrier()  # everyone's last message is in before the ranks exit
        raise SystemExit(0)
    push, pull = (lambda: w.Send(grad, dest=0, tag=1)), (lambda: w.Recv(params, source=0, tag=2))
    done = lambda comm: (print("comm %d %.6f" % (rank, comm / iters), flush=True), w.Barrier())
push(); pull()  # warm
comm = 0.0
for _ in range(iters - 1):
    time.sleep(compute)
    t = time.perf_counter()
    push(); pull()
    comm += time.perf_counter() - t
done(comm * iters / (iters - 1))
"""


def run_hbmcoll(nodes, workers, nbytes, compute, iters, tmp):
    token = os.path.join(tmp, "token")
    with os.fdopen(os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # the server wants it private
        f.write(TOKEN)
    server = nodes.popen(0, [sys.executable, "-m", "hbmcoll.memserver", "--listen", "10.77.0.1:29980", "--token-file",
                             token, "--capacity", str(nbytes + (1 << 20))], stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        if " bytes for buffers at " not in server.stderr.readline():  # a refusal starts alike
            raise SystemExit("the memory server did not start")
        env = dict(ENV, HBMCOLL_MEMSERVERS="10.77.0.1:29980", HBMCOLL_TOKEN=TOKEN)
        procs = [nodes.popen(k + 1, [sys.executable, "-c", WORKER, "hbmcoll", str(nbytes), str(compute), str(iters)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(env, W=str(k)))
                 for k in range(workers)]
        res = finish(procs, 600)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    return _slowest("hbmcoll", res)


def run_mpi(nodes, workers, nbytes, compute, iters, tmp):
    ssh = nodes.ssh_stand_in(os.path.join(tmp, "ssh"))
    hosts = ",".join(f"{a}:1" for a in nodes.addrs[:workers + 1])
    p = nodes.popen(0, ["mpiexec.hydra", "-launcher", "ssh", "-launcher-exec", ssh, "-hosts", hosts, "-n",
                        str(workers + 1), sys.executable, "-c", WORKER, "mpi", str(nbytes), str(compute), str(iters)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    return _slowest("MPI", finish([p], 600))


def _slowest(label, res):
    outs = [out for _, out, _ in res]
    got = [float(t) for o in outs for t in re.findall(r"comm \d+ ([0-9.]+)", o)]  # hydra interleaves ranks' lines
    if not got or any(rc for rc, _, _ in res):
        raise SystemExit(f"the {label} emulation failed: " + " | ".join(e[-1500:] for _, _, e in res))
    return max(got)


def accumulate_vs_memory(big=256 << 20, chunk=1 << 20):
    """GB/s: the server's axpy (reads and writes y; x, a chunk, stays in cache) and a copy (reads
    one buffer, writes another), as bytes of the large buffers moved."""
    from hbmcoll import _core
    y, x = np.zeros(big, np.uint8), np.ones(chunk // 4, np.float32).view(np.uint8)
    dst = np.empty(big, np.uint8)
    best_axpy = best_copy = 0.0
    for _ in range(5):
        t = time.perf_counter()
        for off in range(0, big, chunk):
            _core.axpy(y[off:off + chunk], x, 0.5, "float32")
        best_axpy = max(best_axpy, 2 * big / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        np.copyto(dst, y)
        best_copy = max(best_copy, 2 * big / (time.perf_counter() - t) / 1e9)
    return best_axpy, best_copy


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through NetNodes: no namespace left
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,3,4")
    ap.add_argument("--scale", type=float, default=16, help="divide each model's bytes and compute by this")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each case, the best kept")
    a = ap.parse_args()
    counts = [int(x) for x in a.workers.split(",")]
    print(f"# {machine.cpu_model()}, {os.cpu_count()} CPUs; models / {a.scale:g}; {a.iterations} iterations, "
          f"best of {a.rounds}; server and workers on emulated nodes (one each)")
    axpy, copy = accumulate_vs_memory()
    print(f"server accumulate {axpy:.1f} GB/s against a copy's {copy:.1f} GB/s: {axpy / copy:.0%} "
          "of the memory bandwidth\n")
    print("| model | workers | hbmcoll comm ms/iter | share | MPI comm ms/iter | share | MPI/hbmcoll |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, NetNodes(max(counts) + 1) as nodes:
        for model, (nbytes, compute) in MODELS.items():
            nb, c = int(nbytes / a.scale) // 4 * 4, compute / a.scale
            for w in counts:
                h = m = float("inf")
                for _ in range(a.rounds):  # in turn, so both see the same minutes of this host
                    h = min(h, run_hbmcoll(nodes, w, nb, c, a.iterations, tmp))
                    m = min(m, run_mpi(nodes, w, nb, c, a.iterations, tmp))
                print(f"| {model} ({nb / 1e6:.1f} MB, {c * 1e3:.0f} ms) | {w} | {h * 1e3:.1f} | {h / (h + c):.0%} | "
                      f"{m * 1e3:.1f} | {m / (m + c):.0%} | {m / h:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
