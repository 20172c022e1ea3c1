"""Topology and placement: what hbmcoll.topology() returns and what
`python -m hbmcoll.topo` prints.

    python -m hbmcoll.topo                          # this machine, one rank per core, each its share
    python -m hbmcoll.topo --ranks 64 --json        # the plan as JSON
    python -m hbmcoll.topo --topology knl.xml --ranks 64 --memory hbm_bind
    python -m hbmcoll.topo --topology knl.xml --ranks 64 --tree   # the small collectives' tree

--topology takes an hwloc XML file or a directory usable as HWLOC_FSROOT, and
plans for that machine without applying anything: check a job before it runs.
"""
import argparse
import json
import sys

from .. import _core

_placement = None  # this process's Placement, once init() made one


def setup(local_rank, local_size):
    """Discover this machine, plan, pin this process (HBMCOLL_BIND) and keep
    the context for segment placement. Returns the Placement object."""
    global _placement
    _placement = _core.Placement(local_rank, local_size)
    return _placement


def topology(ranks=None):
    """Dict: memory_mode, cluster_mode, hbm_nodes, ranks (the plan), notices.
    After init() it describes what this job applied; before, a plan for
    `ranks` ranks (default one per core) on this machine."""
    from . import tune_cache
    doc = tune_cache.load()
    got = json.loads(_placement.report(True)) if _placement is not None and ranks is None else \
        json.loads(_core.numa_report(None, ranks or 0, None, None, True))
    got["tuned"] = {"file": tune_cache.cache_path(), "when": doc["when"], "choice": doc["choice"]} if doc else None
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m hbmcoll.topo", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", metavar="FILE", help="hwloc XML file or HWLOC_FSROOT directory")
    ap.add_argument("--ranks", type=int, help="local ranks to plan for (default: one per core)")
    words = _core.policy_words()
    ap.add_argument("--memory", choices=words["memory"])
    ap.add_argument("--bind", choices=words["bind"])
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ap.add_argument("--tree", action="store_true",
                    help="print the tree the small collectives run on above 8 ranks: each rank's "
                         "PU, parent and children")
    args = ap.parse_args(argv)
    if args.ranks is not None and args.ranks < 1:
        ap.error(f"--ranks {args.ranks}: give at least 1 (leave it out for one per core)")
    try:
        text = _core.numa_report(args.topology, args.ranks or 0, args.memory, args.bind, args.json, args.tree)
    except (OSError, ValueError) as exc:
        print(f"hbmcoll.topo: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
