"""Allreduce across two emulated nodes: hbmcoll against gloo, MPICH and Open MPI over the same links.

    sudo python3 bench/net_bridge.py [--sizes 8,65536,1048576,16777216] [--rounds 3]
                                     [--collectives allreduce,bcast,allgather]
                                     [--per-node 1,2] [--rates none,2gbit] [--seconds 1] [--load]

Two network namespaces (the nodes) on a bridge in a third, one veth each (hbnet0, 10.77.0.1-2),
as rdma-bridge.md section 5 describes; a rate caps each node's link with tc tbf. For each rate
and ranks per node, in each round and in turn (the order rotates): hbmcoll.init() under torchrun
(the library's whole path: shared memory in the node, the bridge's rings between, NumPy
buffers), torch's gloo under torchrun, mpi4py + MPICH under hydra (an ssh stand-in enters the
other namespace; UCX_TLS=tcp,self, as otherwise UCX's shared memory crosses the namespaces),
mpi4py + Open MPI under its mpiexec where `make openmpi-peer` built it (ob1 with the vader BTL
in a node and tcp on the nodes' link only, as Open MPI's FAQ configures tcp), and with one rank
per node the bridge's ring alone (build/net_bench, the C path). Each worker is
bench/nodes_worker.py (float32 sum, the slowest rank's mean per call); the best round is kept.
The link's ceiling is fi_pingpong's bandwidth (libfabric tcp, 16 MiB messages) in the same run.
With --load, one busy process per CPU (a Python loop, outside the namespaces) runs beside every
library for the whole run, as a data loader or the framework's compute would.
The namespaces are removed at the end, also on Ctrl-C. A benchmark: nothing is asserted.
"""
import contextlib
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import machine  # bench/machine.py: the facts every run records

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NODES = 2
WORKER = os.path.join(HERE, "nodes_worker.py")
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from netnodes import NetNodes, finish  # noqa: E402  (the namespaces the tests use too)

ENV = dict(os.environ, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="bench" * 6, HBMCOLL_QUIET="1",
           GLOO_SOCKET_IFNAME="hbnet0", UCX_TLS="tcp,self", PYTHONPATH=os.path.join(ROOT, "pymod"))
_port = [29900]
COLLS = ["allreduce"]  # --collectives: what every worker times (the ring alone: allreduce only)


def _times(text):
    """{(collective, bytes): us} of a worker's lines."""
    return {(c, int(b)): float(us) for c, b, us in re.findall(r"^(\w+) (\d+) B: ([0-9.]+) us", text, re.M)}


def _report(label, got, sizes, outs):
    if len(got) != len(sizes) * (1 if label == "ring" else len(COLLS)):
        print(f"{label} failed:", *[o[-400:] for o in outs], sep="\n", file=sys.stderr)
    return got


def run_torchrun(lib, nodes, per_node, sizes, seconds):
    _port[0] += 2
    procs = [nodes.popen(i, [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node-rank",
                             str(i), "--nproc-per-node", str(per_node), "--master-addr", nodes.addrs[0],
                             "--master-port", str(_port[0]), "--no-python", sys.executable, WORKER, lib,
                             ",".join(map(str, sizes)), str(seconds), ",".join(COLLS)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for i in range(NODES)]
    res = finish(procs, 900)
    return _report(lib, _times(res[0][1]), sizes, [e for _, _, e in res])


def run_mpich(nodes, per_node, sizes, seconds):
    with tempfile.TemporaryDirectory() as tmp:
        ssh = nodes.ssh_stand_in(os.path.join(tmp, "ssh"))
        hosts = ",".join(f"{a}:{per_node}" for a in nodes.addrs)
        p = nodes.popen(0, ["mpiexec.hydra", "-launcher", "ssh", "-launcher-exec", ssh, "-hosts", hosts, "-n",
                            str(NODES * per_node), sys.executable, WORKER, "mpich", ",".join(map(str, sizes)),
                            str(seconds), ",".join(COLLS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        (rc, out, err), = finish([p], 900)
    return _report("mpich", _times(out), sizes, [err])


OMPI_PYTHON = os.path.join(ROOT, "build", "ompi-venv", "bin", "python")


def run_openmpi(nodes, per_node, sizes, seconds):
    """mpi4py over Open MPI: the ob1 pml, vader between the ranks of a node (Open MPI tells nodes
    apart by its daemons, one per host), tcp between the nodes on hbnet0 only (btl_tcp_if_include,
    oob_tcp_if_include: the FAQ's way to keep tcp to one interface). --bind-to none: each emulated
    node's daemon binds its ranks from core 0 up, so the nodes' ranks would share cores that the
    real nodes would not (MPICH's hydra binds nothing by default)."""
    with tempfile.TemporaryDirectory() as tmp:
        ssh = nodes.ssh_stand_in(os.path.join(tmp, "ssh"))
        hosts = ",".join(f"{a}:{per_node}" for a in nodes.addrs)
        mca = {"plm_rsh_agent": ssh, "pml": "ob1", "btl": "vader,tcp,self", "btl_tcp_if_include": "hbnet0",
               "oob_tcp_if_include": "hbnet0"}
        argv = ["mpiexec.openmpi", "--allow-run-as-root", "--bind-to", "none", "--host", hosts, "-np",
                str(NODES * per_node)]
        for k, v in mca.items():
            argv += ["--mca", k, v]
        p = nodes.popen(0, argv + [OMPI_PYTHON, WORKER, "openmpi", ",".join(map(str, sizes)), str(seconds),
                                   ",".join(COLLS)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        (rc, out, err), = finish([p], 900)
    return _report("openmpi", _times(out), sizes, [err])


def run_ring(nodes, per_node, sizes, seconds):
    out = subprocess.run([os.path.join(ROOT, "build", "net_bench"), ",".join(nodes.names), "-s",
                          ",".join(map(str, sizes)), "-t", str(seconds)], capture_output=True, text=True,
                         env=dict(os.environ, FI_PROVIDER="tcp"), timeout=900)
    return _report("ring", _times(out.stdout), sizes, [out.stderr])


def link_ceiling(nodes):
    """fi_pingpong's bandwidth between the nodes (libfabric tcp, 16 MiB), in Gbit/s, or None."""
    if shutil.which("fi_pingpong") is None:
        return None
    args = ["fi_pingpong", "-p", "tcp", "-e", "rdm", "-S", str(16 << 20), "-I", "20"]
    srv = nodes.popen(0, args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # the server listening first
    cli = nodes.popen(1, args + [nodes.addrs[0]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (_, out, _), _ = finish([cli, srv], 120)
    m = re.search(r"^\s*16m(?:\s+\S+){4}\s+([0-9.]+)", out, re.M)  # bytes #sent #ack total time MB/sec
    return float(m.group(1)) * 8 / 1000 if m else None


@contextlib.contextmanager
def busy(on):
    """One busy process per CPU while the block runs (none unless on)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() if on else 0)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def table(best, sizes, per_node, rate, ceiling, cpu, rounds, load=False, coll="allreduce"):
    best = {lib: {size: us for (c, size), us in got.items() if c == coll} for lib, got in best.items()}
    libs = [lib for lib in ("hbmcoll", "gloo", "mpich", "openmpi", "ring") if best.get(lib)]
    what = "allreduce float32 sum" if coll == "allreduce" else f"{coll} float32"
    print(f"\n{NODES} nodes x {per_node} rank(s), {what}, us per call (best of {rounds} rounds; "
          f"{cpu}, {os.cpu_count()} CPUs; link {'capped at ' + rate if rate else 'uncapped'}, "
          f"fi_pingpong {'%.2f Gbit/s' % ceiling if ceiling else 'not measured'}"
          f"{'; a busy process per CPU beside the job' if load else ', quiet'})")
    peers = [p for p in ("gloo", "mpich", "openmpi") if best.get(p)]
    print("| bytes | " + " | ".join(libs) + " | " + " | ".join(f"{p}/hbmcoll" for p in peers) +
          " | hbmcoll bus bandwidth |")
    print("|---" * (len(libs) + len(peers) + 2) + "|")
    for size in sizes:
        h = best["hbmcoll"].get(size)
        cells = ["%.1f" % best[lib][size] if size in best[lib] else "-" for lib in libs]
        ratio = ["%.2fx" % (best[p][size] / h) if h and size in best.get(p, {}) else "-" for p in peers]
        ranks = NODES * per_node  # bytes each rank moves per call, per the usual bus-bandwidth factors
        factor = {"allreduce": 2 * (NODES - 1) / NODES, "bcast": 1, "allgather": ranks - 1}[coll]
        bus = "%.2f Gbit/s" % (factor * size * 8 / (h * 1e3)) if h else "-"
        print(f"| {size} | " + " | ".join(cells + ratio) + f" | {bus} |")


def measure(nodes, per_node, sizes, rate, a):
    """{library: {size: best us}} over a.rounds rounds, the order rotating."""
    runs = [("hbmcoll", lambda *x: run_torchrun("hbmcoll", *x)),
            ("gloo", lambda *x: run_torchrun("gloo", *x)), ("mpich", run_mpich)]
    if os.path.exists(OMPI_PYTHON):
        runs.append(("openmpi", run_openmpi))
    elif per_node == 1 and rate is None:
        print("Open MPI: not measured (`make openmpi-peer` builds its mpi4py)", file=sys.stderr)
    if per_node == 1 and "allreduce" in COLLS:
        runs.append(("ring", run_ring))
    best = {label: {} for label, _ in runs}
    for rnd in range(a.rounds):
        for label, fn in runs[rnd % len(runs):] + runs[:rnd % len(runs)]:
            for size, us in fn(nodes, per_node, sizes, a.seconds).items():
                best[label][size] = min(us, best[label].get(size, float("inf")))
        print(f"{per_node}/node, {rate or 'uncapped'}: round {rnd + 1} done", file=sys.stderr)
    return best


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through NetNodes: no namespace left
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,65536,1048576,16777216")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-node", default="1,2", help="ranks per node, one table each")
    ap.add_argument("--rates", default="none,2gbit", help="tc tbf rate per node link, or none")
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per size and library")
    ap.add_argument("--load", action="store_true", help="a busy process per CPU beside every library")
    ap.add_argument("--collectives", default="allreduce", help="of allreduce, bcast, allgather")
    a = ap.parse_args()
    COLLS[:] = a.collectives.split(",")
    sizes = [int(x) for x in a.sizes.split(",")]
    subprocess.run(["make", "-s", "-C", ROOT, "build/net_bench"], check=True)
    cpu = machine.cpu_model()
    for rate in [None if r == "none" else r for r in a.rates.split(",")]:
        with NetNodes(NODES, rate) as nodes:
            ceiling = link_ceiling(nodes)  # quiet: the link's, not the load's
            with busy(a.load):
                for per_node in [int(x) for x in a.per_node.split(",")]:
                    best = measure(nodes, per_node, sizes, rate, a)
                    for coll in COLLS:
                        table(best, sizes, per_node, rate, ceiling, cpu, a.rounds, a.load, coll)


if __name__ == "__main__":
    main()
