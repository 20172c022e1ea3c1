"""Allreduce between two emulated nodes: hbmcoll's bridge against gloo over the same link.

    sudo python3 bench/net_bridge.py [--sizes 8,65536,1048576,16777216] [--rounds 3]
                                     [--rate 2gbit] [--seconds 1]

Two network namespaces (the nodes) on a bridge in a third, one veth each (hbnet0,
10.77.0.1-2), as rdma-bridge.md section 5 describes; --rate caps each node's link with tc tbf.
One rank per node. In each round, in turn: build/net_bench (the bridge's ring allreduce over
libfabric tcp;ofi_rxm, the C path) and torch.distributed's gloo (init over TCP in the namespaces,
GLOO_SOCKET_IFNAME=hbnet0), float32 sum, the slowest rank's mean per call; the best round is
kept. The namespaces are removed at the end, also on Ctrl-C. A benchmark: nothing is asserted.
"""
import argparse
import os
import re
import subprocess
import sys

import machine  # bench/machine.py: the facts every run records

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NODES = 2
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from netnodes import NetNodes  # noqa: E402  (the namespaces the tests use too)


def run_bridge(nodes, sizes, seconds):
    out = subprocess.run([os.path.join(ROOT, "build", "net_bench"), ",".join(nodes.names), "-s",
                          ",".join(map(str, sizes)), "-t", str(seconds)], capture_output=True, text=True,
                         env=dict(os.environ, FI_PROVIDER="tcp"), timeout=900)
    got = {int(b): float(us) for b, us in re.findall(r"allreduce (\d+) B: ([0-9.]+) us", out.stdout)}
    if len(got) != len(sizes):
        print("net_bench failed:", out.stderr[-500:], file=sys.stderr)
    return got


GLOO_WORKER = r"""
import os, sys, time, torch, torch.distributed as dist
sizes, seconds = [int(x) for x in sys.argv[1].split(",")], float(sys.argv[2])
dist.init_process_group("gloo", init_method="tcp://10.77.0.1:29533", rank=int(os.environ["RANK"]), world_size=2)
for size in sizes:
    t = torch.zeros(max(size // 4, 1))
    t0 = time.perf_counter()
    for _ in range(3): dist.all_reduce(t)
    iters = torch.tensor([max(5.0, min(100000.0, seconds / ((time.perf_counter() - t0) / 3 + 1e-6)))])
    dist.broadcast(iters, 0)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(int(iters.item())): dist.all_reduce(t)
    us = torch.tensor([(time.perf_counter() - t0) / int(iters.item()) * 1e6])
    dist.all_reduce(us, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0: print("allreduce %d B: %.2f us" % (size, us.item()), flush=True)
dist.destroy_process_group()
"""


def run_gloo(nodes, sizes, seconds):
    procs = []
    for rank, m in enumerate(nodes.names):
        env = dict(os.environ, RANK=str(rank), GLOO_SOCKET_IFNAME="hbnet0", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(["ip", "netns", "exec", m, sys.executable, "-c", GLOO_WORKER,
                                       ",".join(map(str, sizes)), str(seconds)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=900) for p in procs]
    got = {int(b): float(us) for b, us in re.findall(r"allreduce (\d+) B: ([0-9.]+) us", outs[0][0])}
    if len(got) != len(sizes):
        print("gloo failed:", outs[0][1][-500:], outs[1][1][-300:], file=sys.stderr)
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,65536,1048576,16777216")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", default=None, help="tc tbf rate per node link, e.g. 2gbit")
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per size and library")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    subprocess.run(["make", "-s", "-C", ROOT, "build/net_bench"], check=True)
    cpu = machine.cpu_model()
    nodes = NetNodes(NODES, a.rate).__enter__()
    best = {"hbmcoll": {}, "gloo": {}}
    try:
        for rnd in range(a.rounds):
            runs = [("hbmcoll", run_bridge), ("gloo", run_gloo)]
            for label, fn in runs[rnd % 2:] + runs[:rnd % 2]:
                for size, us in fn(nodes, sizes, a.seconds).items():
                    best[label][size] = min(us, best[label].get(size, float("inf")))
            print("round %d done" % (rnd + 1), file=sys.stderr)
    finally:
        nodes.close()
    print("2 nodes x 1 rank, allreduce float32 sum, us per call (best of %d rounds; %s, %d CPUs%s)"
          % (a.rounds, cpu, os.cpu_count(), ", links capped at " + a.rate if a.rate else ""))
    print("| bytes | hbmcoll bridge | gloo | gloo/hbmcoll | hbmcoll bus bandwidth |")
    print("|---|---|---|---|---|")
    for size in sizes:
        h, g = best["hbmcoll"].get(size), best["gloo"].get(size)
        bus = "%.2f GB/s" % (2 * (NODES - 1) / NODES * size / (h * 1e3)) if h else "-"
        print("| %d | %s | %s | %s | %s |" % (size, "%.1f" % h if h else "-", "%.1f" % g if g else "-",
                                            "%.2fx" % (g / h) if h and g else "-", bus))


if __name__ == "__main__":
    main()
