"""Two builds of the package against each other across two emulated nodes, in interleaved rounds,
quiet or beside a busy process per core (how the waits of issue 31 were chosen).

    sudo python3 bench/waits_ab.py A=PYMOD_DIR B=PYMOD_DIR [--per-node 2] [--sizes 8,65536,1048576]
                                   [--rounds 5] [--loaded] [--gloo] [--seconds 0.5]

Each LABEL=DIR is a pymod folder with its extension built in place (`python3 setup.py build_ext
--inplace` in a worktree, or a copy of one). Every round runs each build once (and gloo with
--gloo), in an order that rotates; the allreduce is bench/net_bridge.py's (run_torchrun, float32
sum, the slowest rank's mean per call). --loaded starts one `while True: pass` per CPU before the
first round and kills them after the last. Prints the median and the spread over the rounds, and
the load average at each round (other work on the machine shows there). Nothing is asserted.
"""
import argparse
import os
import subprocess
import sys

import net_bridge as nb  # the namespaces, ENV and run_torchrun
from netnodes import NetNodes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("builds", nargs="+", help="LABEL=PYMOD_DIR")
    ap.add_argument("--per-node", type=int, default=2)
    ap.add_argument("--sizes", default="8,65536,1048576")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--loaded", action="store_true", help="a busy process per CPU beside the job")
    ap.add_argument("--gloo", action="store_true", help="gloo in the same rounds")
    a = ap.parse_args()
    builds = dict(b.split("=", 1) for b in a.builds)
    sizes = [int(x) for x in a.sizes.split(",")]
    labels = list(builds) + (["gloo"] if a.gloo else [])
    times, busy = {}, []
    try:
        with NetNodes(nb.NODES) as nodes:
            if a.loaded:
                busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count())]
            for rnd in range(a.rounds):
                for label in labels[rnd % len(labels):] + labels[:rnd % len(labels)]:
                    lib = "gloo" if label == "gloo" else "hbmcoll"
                    nb.ENV["PYTHONPATH"] = builds.get(label, nb.ENV["PYTHONPATH"])
                    for size, us in nb.run_torchrun(lib, nodes, a.per_node, sizes, a.seconds).items():
                        times.setdefault(label, {}).setdefault(size, []).append(us)
                print(f"round {rnd + 1} done, load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(f"\n{nb.NODES} nodes x {a.per_node} ranks, {'a busy process per CPU' if a.loaded else 'quiet'}, "
          f"us per call: median [least-most] of {a.rounds} rounds")
    print("| build | " + " | ".join(f"{s} B" for s in sizes) + " |")
    print("|---" * (len(sizes) + 1) + "|")
    for label, got in times.items():
        cells = []
        for s in sizes:
            v = sorted(got.get(s, []))
            cells.append(f"{v[len(v) // 2]:.0f} [{v[0]:.0f}-{v[-1]:.0f}]" if v else "-")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
