"""Host noise: how often, and for how long, each CPU is taken away from a running process.

On a shared or virtual machine the hypervisor and the host's interrupts stop a vCPU for tens to
hundreds of microseconds at a time. A 64 KiB allreduce timed over OSU's 100 iterations spans about
half a millisecond, so one such pause on either rank shows up as a 10-20% slower round. The suite
measures the pauses at the start and the end of a run and prints them with the tables, so a
reader can tell a noisy run from a slow library.

Method (like `sysjitter` / `hiccups`): one process pinned to each usable CPU reads the clock in a
tight loop for `seconds`; any gap between two reads longer than `threshold_us` is a pause.

Core to core (`cross_core`): on the AMD EPYC VM of bench/README.md the hypervisor now and then ran
the two vCPUs where data one wrote reached the other 4x slower, for seconds at a time; staged
copies felt it and single copies did not, so one library's launch could be 3x slower while the
next library's was not. The suite samples the rate (bench/c/xcore_bench.c, 256 KiB turns, about
0.2 s) before every launch and names the launches that ran after a sample under half the best.
"""
import multiprocessing as mp
import os
import queue
import re
import shlex
import signal
import subprocess
import tempfile
import time

XCORE_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "c", "xcore_bench.c")


def _probe(cpu, seconds, threshold_ns, q):
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        pass
    now = time.perf_counter_ns
    t0 = prev = now()
    end = t0 + int(seconds * 1e9)
    n = lost = longest = 0
    while prev < end:
        t = now()
        g = t - prev
        if g > threshold_ns:
            n += 1
            lost += g
            longest = max(longest, g)
        prev = t
    span = prev - t0
    q.put({"cpu": cpu, "pauses_per_s": n / (span / 1e9), "lost_fraction": lost / span,
           "longest_us": longest / 1e3})


def measure(seconds=1.0, threshold_us=20.0):
    """Per usable CPU: pauses longer than threshold_us per second, the share of time lost to
    them, the longest (us); all CPUs at once. None where processes cannot be forked."""
    cpus = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_probe, args=(c, seconds, threshold_us * 1e3, q)) for c in cpus]
    got = []
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + seconds + 30
        while len(got) < len(procs):   # a probe that dies costs its own CPU's line only
            got.append(q.get(timeout=max(0.1, deadline - time.monotonic())))
    except (OSError, queue.Empty):
        if not got:
            return None
    finally:
        for p in procs:
            if p.pid is not None:
                if p.is_alive():
                    p.terminate()
                p.join()
    got.sort(key=lambda r: r["cpu"])
    return {"threshold_us": threshold_us, "seconds": seconds, "per_cpu": got}


def describe(n):
    """One line for the table: the worst CPU's numbers."""
    if not n or not n.get("per_cpu"):
        return None
    w = max(n["per_cpu"], key=lambda r: r["lost_fraction"])
    return (f"{w['pauses_per_s']:.0f} pauses/s over {n['threshold_us']:.0f} us, "
            f"{w['lost_fraction']:.1%} of the time lost, longest {w['longest_us']:,.0f} us "
            f"(worst CPU, {w['cpu']})")


_xcore = {}  # this process's build of xcore_bench: its path, or None when it cannot be built


def _xcore_exe():
    """bench/c/xcore_bench.c compiled once per process into a private temporary folder; None
    without the source (an installed suite) or a working compiler ($CC, default cc)."""
    if "exe" not in _xcore:
        _xcore["exe"] = None
        if os.path.exists(XCORE_SRC):
            exe = os.path.join(tempfile.mkdtemp(prefix="hbmcoll-xcore-"), "xcore_bench")
            try:
                p = subprocess.run(shlex.split(os.environ.get("CC", "cc")) + ["-std=c11", "-O2", XCORE_SRC, "-o", exe],
                                   capture_output=True, text=True, timeout=120)
                _xcore["exe"] = exe if p.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired):
                pass
    return _xcore["exe"]


def cross_core(nbytes=256 << 10):
    """GB/s at which data one pinned core writes reaches another (xcore_bench), or None."""
    exe = _xcore_exe()
    if exe is None or len(os.sched_getaffinity(0)) < 2:
        return None
    try:  # its own session: a timeout kills the reader it forks too
        p = subprocess.Popen([exe, str(nbytes)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True)
    except OSError:
        return None
    try:
        out = p.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None
    m = re.search(r"([0-9.]+) GB/s", out)
    return float(m.group(1)) if m else None


def slow_cross_core(tasks):
    """One line naming the launches whose core-to-core sample was under half the run's best."""
    rates = [t["xcore_gbps"] for t in tasks if t.get("xcore_gbps")]
    if not rates:
        return None
    best = max(rates)
    def name(t):
        r = t.get("round")
        return f"{t['label']} " + (f"round {r + 1}" if isinstance(r, int) else str(r))
    slow = [f"{name(t)} ({t['xcore_gbps']:.1f})" for t in tasks
            if t.get("xcore_gbps") and t["xcore_gbps"] < best / 2]
    return (f"Core to core before each launch (`bench/c/xcore_bench.c`, 256 KiB turns): "
            f"{min(rates):.1f}-{best:.1f} GB/s, median {sorted(rates)[len(rates) // 2]:.1f}; " +
            (f"under half the best before {len(slow)} of {len(rates)} launches ({', '.join(slow)}): "
             "those ran while the host slowed core-to-core traffic (bench/README.md, \"A host that "
             "moves its vCPUs apart\"), which hits staged copies and not single ones."
             if slow else "no launch under half the best."))
