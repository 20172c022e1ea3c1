"""Host noise: how often, and for how long, each CPU is taken away from a running process.

On a shared or virtual machine the hypervisor and the host's interrupts stop a vCPU for tens to
hundreds of microseconds at a time. A 64 KiB allreduce timed over OSU's 100 iterations spans about
half a millisecond, so one such pause on either rank shows up as a 10-20% slower round. The suite
measures the pauses at the start and the end of a run and prints them with the tables, so a
reader can tell a noisy run from a slow library.

Method (like `sysjitter` / `hiccups`): one process pinned to each usable CPU reads the clock in a
tight loop for `seconds`; any gap between two reads longer than `threshold_us` is a pause.
"""
import multiprocessing as mp
import os
import queue
import time


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
