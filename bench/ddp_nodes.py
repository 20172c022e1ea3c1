"""DDP training across two emulated nodes: backend "hbmcoll" against gloo, in the same job.

    sudo python3 bench/ddp_nodes.py [--per-node 2] [--rates none,2gbit] [--rounds 4] [--steps 60] [--load]

Two network namespaces on a bridge (tests/py/netnodes.py, as bench/net_bridge.py), a rate capping
each node's link with tc tbf. torchrun in each node starts bench/ddp_throughput.py's worker: every
rank makes the default group on hbmcoll and a gloo group of the same ranks, one DDP model on each
from the same weights, and the rounds interleave them (ABBA); the ceilings (DDP with no peer, the
step with no communication) run in the same rounds. Throughput = steps / wall time of the slowest
rank. With --load, one busy process per CPU (outside the namespaces) runs for the whole run, as a
data loader or other compute would. The namespaces go at the end, also on Ctrl-C. Nothing is
asserted.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys

import machine  # bench/machine.py: the facts every run records
from net_bridge import busy  # one busy process per CPU while a block runs

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NODES = 2
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from netnodes import NetNodes, finish  # noqa: E402  (the namespaces the tests use too)

ENV = dict(os.environ, OMP_NUM_THREADS="1", HBMCOLL_QUIET="1", GLOO_SOCKET_IFNAME="hbnet0",
           PYTHONPATH=os.path.join(ROOT, "pymod"))
for _k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
    ENV.pop(_k, None)


def run(nodes, a, port):
    """The worker's JSON line (rank 0's), or None with the ranks' output on stderr."""
    worker = [os.path.join(HERE, "ddp_throughput.py"), "--worker", "--rounds", str(a.rounds), "--steps",
              str(a.steps), "--warmup", str(a.warmup)]
    procs = [nodes.popen(i, [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node-rank",
                             str(i), "--nproc-per-node", str(a.per_node), "--master-addr", nodes.addrs[0],
                             "--master-port", str(port), "--no-python", sys.executable, *worker],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for i in range(NODES)]
    res = finish(procs, 1800)
    lines = [ln for ln in res[0][1].splitlines() if ln.startswith("{")]
    if any(rc != 0 for rc, _, _ in res) or not lines:
        print("the job failed:", *[e[-1500:] for _, _, e in res], sep="\n", file=sys.stderr)
        return None
    return json.loads(lines[-1])


def row(got, label):
    rounds = got["rounds"]
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    ratio = statistics.median(r["hbmcoll"] / r["gloo"] for r in rounds)
    ceiling = statistics.median(max(r["solo-gloo"], r["solo-hbmcoll"]) for r in rounds)
    print(f"| {label} | {med['hbmcoll']:.1f} | {med['gloo']:.1f} | {ratio:.2f}x | {ceiling:.1f} | "
          f"{med['compute']:.1f} | {got['ddp_allreduce_us_per_step']:.0f} | {got['bare_empty_us_per_step']:.0f} |")
    return {"label": label, "median": med, "ratio": ratio, "no_peer_ceiling": ceiling, **got}


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through NetNodes: no namespace left
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-node", type=int, default=2, help="ranks per node (default 2)")
    ap.add_argument("--rates", default="none,2gbit", help="tc tbf rate per node link, or none")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    ap.add_argument("--steps", type=int, default=60, help="timed steps per round and model")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps per model first")
    ap.add_argument("--load", action="store_true", help="a busy process per CPU beside the job")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "ddp_nodes.json"))
    a = ap.parse_args()
    print(f"DDP across {NODES} nodes x {a.per_node} ranks, the model of examples/torch_ddp.py, steps/s "
          f"(median of {a.rounds} interleaved rounds x {a.steps} steps; {machine.cpu_model()}, "
          f"{os.cpu_count()} CPUs{'; a busy process per CPU beside the job' if a.load else ', quiet'})")
    print("| link | hbmcoll | gloo | hbmcoll/gloo | DDP with no peer | no communication | "
          "allreduce per step in DDP (us) | bare, hbmcoll.empty (us) |")
    print("|---" * 8 + "|")
    out, port = [], 29700 + os.getpid() % 100 * 2
    for rate in [None if r == "none" else r for r in a.rates.split(",")]:
        with NetNodes(NODES, rate) as nodes, busy(a.load):
            got = run(nodes, a, port)
            port += 2
            if got:
                out.append(row(got, f"capped at {rate}" if rate else "uncapped"))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"load": a.load, "per_node": a.per_node, "cpu": machine.cpu_model(), "runs": out}, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
