"""python -m hbmcoll: what this installation is and what it found on this machine, for a bug
report or a first look: the version, the machine's memory and cores as the placement layer
sees them, and what was built in or found (NumPy's fast path, the bridge between nodes,
memkind, the frameworks, the launchers)."""
import ctypes
import importlib.util
import os
import shutil
import sys


def _lines():
    import hbmcoll
    from hbmcoll import _core
    yield f"hbmcoll {hbmcoll.__version__} at {os.path.dirname(hbmcoll.__file__)}, Python {sys.version.split()[0]}"
    plan, in_plan = _core.numa_report(None, 0, None, None, False).splitlines(), False
    for line in plan[1:]:  # the machine and its notes; the per-rank plan is python -m hbmcoll.topo's
        in_plan = line.startswith("  plan for") or (in_plan and not line.startswith("  notes:"))
        if not in_plan:
            yield line
    yield f"NumPy fast path: {'built in' if _core.NUMPY_SHORTCUT else 'not built (no NumPy headers at build time)'}"
    try:
        bridge = _core.Bridge("lo", 1 << 16)
        yield f"bridge between nodes: {bridge.describe().split(', fabric')[0]}"
        bridge.close()
    except Exception as exc:  # built without libfabric, or no provider: the reason, in its words
        yield f"bridge between nodes: unavailable: {exc}"
    try:
        ctypes.CDLL("libmemkind.so.0")
        yield "memkind: found (HBM scratch buffers and memory-server pools through its HBW kinds)"
    except OSError:
        yield "memkind: not found (HBM placement uses mbind alone)"
    for name, what in (("torch", "torch.distributed backend 'hbmcoll'"), ("tensorflow", "hbmcoll.tensorflow"),
                       ("mpi4py", "hbmcoll.init(comm=MPI.COMM_WORLD)")):
        found = importlib.util.find_spec(name) is not None
        yield f"{name}: {'installed, for ' + what if found else 'not installed'}"
    from .tools import tune_cache
    doc = tune_cache.load()
    yield ("thresholds: " + ", ".join(f"{k}={v}" for k, v in sorted(doc["choice"].items())) +
           f" (measured here {doc['when']}, {tune_cache.cache_path()})" if doc else
           "thresholds: the built-in defaults (python -m hbmcoll.tune measures this host's)")
    launchers = [n for n in ("torchrun", "mpiexec", "srun") if shutil.which(n)]
    yield f"launchers: hbmcoll-run{''.join(', ' + n for n in launchers)} (on PATH)"


def main():
    for line in _lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
