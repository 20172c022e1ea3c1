"""Where a small allreduce across two emulated nodes goes, and this tree against another, A/B.

    sudo python3 bench/net_small.py [--base /work/main] [--sizes 8] [--per-node 1] [--rounds 3]
                                    [--seconds 1] [--no-gloo]

In each round, in turn (the order rotating): libfabric's own fi_pingpong (tcp, rdm, 8 B: half a
round trip), the bridge alone (build/net_bench: -k pingpong, one coll__net_write and its note one
way; -k allgather of one meeting block, what a call's meeting costs between the nodes; the ring's
allreduce), hbmcoll.init() under torchrun from this tree's pymod and from --base's, MPICH and
gloo (bench/net_bridge.py's runners, same emulated nodes). The best round is kept. A benchmark:
nothing is asserted.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

import net_bridge as nb  # the runners, the namespaces
from netnodes import NetNodes, finish

BLOCK = 32 + 1024  # a meeting block (hier.c: head + COLL__HIER_SMALL; 2 x 1 rides up to 64 KiB)


def pingpong(nodes):
    args = ["fi_pingpong", "-p", "tcp", "-e", "rdm", "-S", "8", "-I", "2000"]
    srv = nodes.popen(0, args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    cli = nodes.popen(1, args + [nodes.addrs[0]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (_, out, _), _ = finish([cli, srv], 120)
    m = re.search(r"^\s*8(?:\s+\S+){5}\s+([0-9.]+)", out, re.M)  # bytes #sent #ack total time MB/sec usec/xfer
    return {8: float(m.group(1))} if m else {}


def bridge(nodes, kind, sizes, seconds):
    out = subprocess.run([os.path.join(nb.ROOT, "build", "net_bench"), ",".join(nodes.names), "-k", kind, "-s",
                          ",".join(map(str, sizes)), "-t", str(seconds)], capture_output=True, text=True,
                         env=dict(os.environ, FI_PROVIDER="tcp"), timeout=900)
    return _by_size(nb._report(kind, nb._times(out.stdout), sizes, [out.stderr]))


def _by_size(got):
    """{bytes: us} of net_bridge's {(collective, bytes): us}: one collective per run here."""
    return {size: us for (_, size), us in got.items()}


def hbmcoll(pymod, nodes, per_node, sizes, seconds):
    nb.ENV["PYTHONPATH"] = pymod
    return _by_size(nb.run_torchrun("hbmcoll", nodes, per_node, sizes, seconds))


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through NetNodes: no namespace left
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="/work/main", help="the tree to compare with (its pymod)")
    ap.add_argument("--sizes", default="8")
    ap.add_argument("--per-node", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--no-gloo", action="store_true")
    ap.add_argument("--no-c", action="store_true", help="skip the C breakdown (fi_pingpong, net_bench)")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    subprocess.run(["make", "-s", "-C", nb.ROOT, "build/net_bench"], check=True)
    runs = [("this", lambda n: hbmcoll(os.path.join(nb.ROOT, "pymod"), n, a.per_node, sizes, a.seconds)),
            ("base", lambda n: hbmcoll(os.path.join(a.base, "pymod"), n, a.per_node, sizes, a.seconds)),
            ("mpich", lambda n: _by_size(nb.run_mpich(n, a.per_node, sizes, a.seconds)))]
    if not a.no_gloo:
        runs.append(("gloo", lambda n: _by_size(nb.run_torchrun("gloo", n, a.per_node, sizes, a.seconds))))
    if not a.no_c and a.per_node == 1:
        runs += [("fi_pingpong 8 B one way", pingpong),
                 ("net_write one way", lambda n: bridge(n, "pingpong", sizes, a.seconds)),
                 ("meeting between nodes", lambda n: {s: v for s, v in bridge(n, "allgather", [BLOCK], a.seconds).items()}),
                 ("ring allreduce", lambda n: bridge(n, "allreduce", sizes, a.seconds))]
    best = {label: {} for label, _ in runs}
    with NetNodes(nb.NODES) as nodes:
        for rnd in range(a.rounds):
            for label, fn in runs[rnd % len(runs):] + runs[:rnd % len(runs)]:
                for size, us in fn(nodes).items():
                    best[label][size] = min(us, best[label].get(size, float("inf")))
            print(f"round {rnd + 1}: " + "; ".join(f"{k} {v}" for k, v in best.items()), file=sys.stderr)
    print(f"\n{nb.NODES} x {a.per_node}, us per call, best of {a.rounds} ({nb.machine.cpu_model()}, "
          f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f})")
    for label, got in best.items():
        print(f"| {label} | " + " | ".join(f"{s} B: {us:.1f}" for s, us in sorted(got.items())) + " |")


if __name__ == "__main__":
    main()
