"""Point-to-point latency across two emulated nodes, one rank on each: hbmcoll's C send/recv, from C
and from Python, against MPICH's over the same link.

    sudo python3 bench/p2p_nodes.py [--sizes 8,65536,1048576] [--rounds 3] [--seconds 1]

The nodes are the namespaces of bench/net_bridge.py (tests/py/netnodes.py). bench/c/pingpong.c is
built twice: against libhbmcoll (coll_job_create, coll_send/coll_recv: libfabric tagged messages
over tcp;ofi_rxm) under `hbmcoll-run --nnodes 2`, and against MPICH (MPI_Send/MPI_Recv: ch4 over
UCX with UCX_TLS=tcp,self, as net_bridge.py runs it) under hydra with an ssh stand-in; Python's
comm.send/recv (NumPy buffers) is bench/p2p_latency.py under `hbmcoll-run --nnodes 2`. Each number
is one way in microseconds (the round trip / 2), the best of the rounds; the order rotates. The
namespaces are removed at the end. A benchmark: nothing is asserted.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import machine  # bench/machine.py
import net_bridge as nb

SRC = os.path.join(nb.HERE, "c", "pingpong.c")
BUILD = os.path.join(nb.ROOT, "build")


def build():
    """(hbmcoll binary, MPICH binary or None)."""
    prefix = os.path.join(BUILD, "prefix")
    subprocess.run(["make", "-s", "-C", nb.ROOT, "install", f"PREFIX={prefix}"], check=True, capture_output=True)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "hbmcoll"], capture_output=True, text=True, check=True,
                           env=dict(os.environ, PKG_CONFIG_PATH=os.path.join(prefix, "lib", "pkgconfig"))).stdout
    hb = os.path.join(BUILD, "pingpong_hbmcoll")
    subprocess.run(["cc", "-std=c11", "-O2", "-D_GNU_SOURCE", SRC, "-o", hb, *flags.split(),
                    "-Wl,-rpath," + os.path.join(prefix, "lib")], check=True)
    mpi = None
    if shutil.which("mpicc") and shutil.which("mpiexec.hydra"):
        mpi = os.path.join(BUILD, "pingpong_mpich")
        subprocess.run(["mpicc", "-O2", "-DWITH_MPI", "-D_GNU_SOURCE", SRC, "-o", mpi], check=True)
    else:
        print("p2p_nodes: no mpicc/mpiexec.hydra (apt-get install mpich libmpich-dev): MPICH left out", file=sys.stderr)
    return hb, mpi


def parse(out):
    return {int(a): float(b) for a, b in (line.split() for line in out.splitlines() if len(line.split()) == 2)}


def run_hbmcoll(nodes, binary, sizes, seconds):
    nb._port[0] += 2
    procs = [nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "1", "--nnodes", "2", "--node-rank", str(i),
                             "--master", f"{nodes.addrs[0]}:{nb._port[0]}", binary, ",".join(map(str, sizes)),
                             str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(nb.ENV, HBMCOLL_IFACE="hbnet0", FI_PROVIDER="tcp"))
             for i in range(2)]
    res = nb.finish(procs, 600)
    for _, _, err in res:
        if err.strip():
            print(err.strip()[-400:], file=sys.stderr)
    return parse(res[0][1])


def run_python(nodes, sizes, seconds):
    nb._port[0] += 2
    iters = str(max(200, int(2000 * seconds)))
    procs = [nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "1", "--nnodes", "2", "--node-rank", str(i),
                             "--master", f"{nodes.addrs[0]}:{nb._port[0]}", sys.executable,
                             os.path.join(nb.HERE, "p2p_latency.py"), "--sizes", ",".join(map(str, sizes)), "--iters",
                             iters, "--reps", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(nb.ENV, HBMCOLL_IFACE="hbnet0", FI_PROVIDER="tcp"))
             for i in range(2)]
    res = nb.finish(procs, 600)
    rows = [line.split() for line in res[0][1].splitlines()]
    return {int(r[0]): float(r[1]) for r in rows if len(r) >= 2 and r[0].isdigit()}


def run_mpich(nodes, binary, sizes, seconds):
    with tempfile.TemporaryDirectory() as tmp:
        ssh = nodes.ssh_stand_in(os.path.join(tmp, "ssh"))
        hosts = ",".join(f"{a}:1" for a in nodes.addrs)
        p = nodes.popen(0, ["mpiexec.hydra", "-launcher", "ssh", "-launcher-exec", ssh, "-hosts", hosts, "-n", "2",
                            binary, ",".join(map(str, sizes)), str(seconds)], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True, env=nb.ENV)
        (rc, out, err), = nb.finish([p], 600)
    if err.strip():
        print(err.strip()[-400:], file=sys.stderr)
    return parse(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,65536,1048576")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    hb, mpi = build()
    runs = [("hbmcoll", lambda n: run_hbmcoll(n, hb, sizes, a.seconds)),
            ("hbmcoll from Python", lambda n: run_python(n, sizes, a.seconds))]
    if mpi:
        runs.append(("mpich", lambda n: run_mpich(n, mpi, sizes, a.seconds)))
    best = {label: {} for label, _ in runs}
    with nb.NetNodes(2) as nodes:
        for rnd in range(a.rounds):
            for label, fn in runs[rnd % len(runs):] + runs[:rnd % len(runs)]:
                for size, us in fn(nodes).items():
                    best[label][size] = min(us, best[label].get(size, float("inf")))
    print(f"\npoint-to-point one way across 2 emulated nodes (1 rank each), us, best of {a.rounds}; "
          f"{machine.cpu_model()}")
    print("| bytes | " + " | ".join(label for label, _ in runs) + (" | hbmcoll / MPICH |" if mpi else " |"))
    print("|---" * (len(runs) + 1 + (1 if mpi else 0)) + "|")
    for s in sizes:
        row = [f"{best[label].get(s, float('nan')):.1f}" for label, _ in runs]
        ratio = f" | {best['hbmcoll'].get(s, float('nan')) / best['mpich'].get(s, float('nan')):.2f}" if mpi else ""
        print(f"| {s} | " + " | ".join(row) + ratio + " |")


if __name__ == "__main__":
    main()
