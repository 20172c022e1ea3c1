"""Machine and software facts recorded with every run (results.json "machine")."""
import glob
import os
import platform
import shutil
import subprocess
import sys


def _run(cmd, timeout=20):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _numa_nodes():
    """Per node: CPUs and memory size (a memory-only node is how flat-mode MCDRAM shows up)."""
    nodes = {}
    for d in sorted(glob.glob("/sys/devices/system/node/node[0-9]*")):
        name = os.path.basename(d)
        try:
            cpus = open(f"{d}/cpulist").read().strip()
            mem = next((ln.split()[3] for ln in open(f"{d}/meminfo") if "MemTotal" in ln), "?")
        except OSError:
            cpus, mem = "?", "?"
        nodes[name] = {"cpus": cpus, "mem_kB": mem}
    return nodes


def _cgroup_cpu():
    for p in ("/sys/fs/cgroup/cpu.max",):
        try:
            return open(p).read().strip()
        except OSError:
            pass
    return None


def _versions():
    v = {"python": sys.version.split()[0]}
    for mod in ("numpy", "torch", "mpi4py", "matplotlib"):
        out = _run([sys.executable, "-c", f"import {mod}; print({mod}.__version__)"])
        v[mod] = out.strip() or None
    out = _run([sys.executable, "-c",
                "import mpi4py.MPI as M; print(M.Get_library_version().splitlines()[0])"])
    v["mpi_library"] = out.strip() or None
    if shutil.which("mpiexec"):
        hv = _run(["mpiexec", "--version"])
        v["mpiexec"] = next((ln.split(":", 1)[1].strip() for ln in hv.splitlines()
                             if "Version" in ln), hv.splitlines()[0] if hv else None)
        v["mpiexec_path"] = os.path.realpath(shutil.which("mpiexec"))
    return v


def info():
    u = platform.uname()
    mem = None
    try:
        mem = next(ln.split()[1] for ln in open("/proc/meminfo") if ln.startswith("MemTotal"))
    except (OSError, StopIteration):
        pass
    return {
        "hostname": u.node, "kernel": u.release, "os": _os_release(), "arch": u.machine,
        "cpu_model": cpu_model(), "caches": caches(), "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)), "cgroup_cpu_max": _cgroup_cpu(),
        "mem_total_kB": mem, "numa_nodes": _numa_nodes(),
        "in_container": os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"),
        "lscpu": [ln for ln in _run(["lscpu"]).strip().splitlines()[:40]
                  if not ln.startswith(("Flags", "Vulnerab"))],
        "versions": _versions(),
    }


def _os_release():
    try:
        return next(ln.split("=", 1)[1].strip().strip('"') for ln in open("/etc/os-release")
                    if ln.startswith("PRETTY_NAME"))
    except (OSError, StopIteration):
        return None


def mem_available():
    """Bytes the kernel says are available now (MemAvailable), or None."""
    try:
        return 1024 * int(next(ln.split()[1] for ln in open("/proc/meminfo")
                               if ln.startswith("MemAvailable")))
    except (OSError, StopIteration, ValueError):
        return None


def caches():
    """This CPU's caches as lscpu names them, e.g. "L1d 48K, L1i 32K, L2 2048K, L3 491520K"
    (cpu0's view: per core or shared, as the kernel reports them)."""
    out = []
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            level, kind, size = (open(f"{d}/{f}").read().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        out.append(f"L{level}{ {'Data': 'd', 'Instruction': 'i'}.get(kind, '')} {size}")
    return ", ".join(out) or None


def llc_bytes():
    """Largest cache size on this machine (for buffer rotation), default 32 MiB."""
    best = 0
    for f in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        s = open(f).read().strip()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
        try:
            best = max(best, int(s.rstrip("KMG")) * mult)
        except ValueError:
            pass
    return best or 32 << 20


def busy_fraction(seconds=0.5):
    """Share of all CPUs busy over a short window (from /proc/stat): other jobs on the machine
    distort every number, so each launch records this just before it starts."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v), idle
    try:
        t0, i0 = snap()
        import time
        time.sleep(seconds)
        t1, i1 = snap()
        return 1.0 - (i1 - i0) / max(1, t1 - t0)
    except OSError:
        return None


def cpu_snapshot():
    """(busy CPU-seconds of the whole machine, CPU-seconds of our reaped children, time)."""
    import resource
    import time
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        busy = None
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, ru.ru_utime + ru.ru_stime, time.monotonic()


def foreign_busy(a, b):
    """Share of the CPUs used by processes other than ours between two snapshots: the
    interference a launch suffered from other work on the machine."""
    if a[0] is None or b[0] is None or b[2] <= a[2]:
        return None
    other = (b[0] - a[0]) - (b[1] - a[1])
    return max(0.0, other / ((b[2] - a[2]) * (os.cpu_count() or 1)))
