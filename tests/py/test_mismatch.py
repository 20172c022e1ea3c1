"""Disagreeing arguments: every rank gets MismatchError naming both calls, promptly, and the
communicator stays failed; a rank that only gives (a bcast's root, a small gather's or
reduce's sender) gets it at its next call, or from close() when that call was its last.
Nothing is left behind (conftest.py: nothing_left_behind).
"""

import os
import re
import time

import numpy as np
import pytest

DETECT_S = 8.0  # "promptly": far below HBMCOLL_TIMEOUT (30 s in these jobs)
ENV30 = {"HBMCOLL_TIMEOUT": "30"}
pytestmark = pytest.mark.usefixtures("nothing_left_behind")


# ---- disagreeing arguments ---------------------------------------------------------------------

def _mm_count(comm, odd):
    comm.allreduce(np.zeros(11 if odd else 10, np.float32))


def _mm_count_large(comm, odd):
    comm.allreduce(np.zeros(300002 if odd else 300001, np.float32))


def _mm_count_zero(comm, odd):
    comm.allreduce(np.zeros(1 if odd else 0, np.int64))


def _mm_count_inline(comm, odd):  # both within a descriptor's payload (round.h)
    comm.allreduce(np.zeros(1 if odd else 2, np.float32))


def _mm_root_bcast_inline(comm, odd):
    comm.bcast(np.zeros(2, np.float32), root=1 if odd else 0)


def _mm_op_reduce_inline(comm, odd):
    comm.reduce(np.zeros(1, np.float64), op="max" if odd else "sum", root=0)


def _mm_dtype(comm, odd):
    comm.allreduce(np.zeros(10, np.int32 if odd else np.float32))


def _mm_op(comm, odd):
    comm.allreduce(np.zeros(10, np.float32), op="max" if odd else "sum")


def _mm_op_reduce_scatter(comm, odd):
    comm.reduce_scatter(np.zeros((comm.size, 3), np.int64), op="min" if odd else "prod")


def _mm_root_bcast(comm, odd):
    comm.bcast(np.zeros(10, np.float32), root=1 if odd else 0)


def _mm_root_self_bcast(comm, odd):  # every rank a root: nobody receives
    comm.bcast(np.zeros(10, np.float32), root=comm.rank)


def _mm_root_self_bcast_large(comm, odd):  # the same through the slots, chunk by chunk
    comm.bcast(np.zeros(1 << 20, np.float32), root=comm.rank)


def _mm_root_reduce(comm, odd):
    comm.reduce(np.zeros(10, np.float32), root=1 if odd else 0)


def _mm_root_scatter(comm, odd):
    P = comm.size
    comm.scatter(np.zeros((P, 4), np.float32), root=1 if odd else 0)


def _mm_count_gather(comm, odd):
    comm.gather(np.zeros(5 if odd else 4, np.int32), root=0)


def _mm_count_bcast(comm, odd):  # a receiver with a buffer of another size
    comm.bcast(np.zeros(9 if odd else 8, np.uint8), root=0)


def _mm_kind(comm, odd):
    if odd:
        comm.bcast(np.zeros(10, np.float32), root=0)
    else:
        comm.allreduce(np.zeros(10, np.float32))


def _mm_kind_barrier(comm, odd):
    if odd:
        comm.barrier()
    else:
        comm.allreduce(np.zeros(3, np.float32))


def _mm_kind_allgather(comm, odd):
    P = comm.size
    if odd:
        comm.alltoall(np.zeros(P * 2, np.float32))
    else:
        comm.allgather(np.zeros(2, np.float32))


def _mm_algorithm(comm, odd):
    comm.set_algorithm("allreduce", "rsag" if odd else "flat")
    comm.allreduce(np.zeros(100, np.float32))


def _mm_algorithm_forced_flat(comm, odd):
    # one rank forced to flat, the others choosing with an arena buffer (2 ranks: flat whose
    # first round may hand over to rsag; they must not pair up with plain flat)
    if odd:
        comm.set_algorithm("allreduce", "flat")
    buf = np.zeros(16384, np.float32) if odd else comm.empty(16384, np.float32)
    comm.allreduce(buf)


def _mm_nonblocking(comm, odd):
    comm.iallreduce(np.zeros(6 if odd else 5, np.float64)).wait(timeout=60)


def _mm_after_good_calls(comm, odd):
    for i in range(5):  # in step for a while, then not
        comm.allreduce(np.full(7, i, np.float32))
    comm.bcast(np.zeros(3, np.int64), root=comm.size - 1 if odd else 0)


MISMATCHES = {name[4:]: fn for name, fn in globals().items() if name.startswith("_mm_")}


def mismatch_rank(comm, names):
    """Each case on a fresh communicator (a failed one stays failed); the last rank disagrees."""
    import hbmcoll

    comm.close()
    out = {}
    for name in names:
        c = hbmcoll.init(timeout=30)
        odd = c.rank == c.size - 1
        t = time.monotonic()
        try:
            MISMATCHES[name](c, odd)
            # a bcast's root, a small gather's sender: it gave and returned, and learns of the
            # disagreement when its next call compares (as when an MPI eager send returns)
            c.barrier()
            out[name] = ("no error", "", 0.0, [], "n/a")
            c.close()
            continue
        except hbmcoll.MismatchError as e:
            out[name] = ("MismatchError", str(e), time.monotonic() - t, expect_of(name, c, odd))
        except Exception as e:  # noqa: BLE001
            out[name] = (type(e).__name__, str(e), time.monotonic() - t, [])
        # failed for good: the next call fails at once, with the same story
        t = time.monotonic()
        try:
            c.allreduce(np.zeros(2, np.float32))
            out[name] += ("no error after failure",)
        except hbmcoll.Error as e:
            out[name] += (f"{type(e).__name__} after {time.monotonic() - t:.1f} s",)
        c.close()
    return out


def expect_of(name, c, odd):
    """The substrings the message must contain (what each side called)."""
    return {"count": ["count=10", "count=11"], "count_large": ["count=300001", "count=300002"],
            "count_zero": ["count=0", "count=1"], "dtype": ["dtype=float32", "dtype=int32"],
            "op": ["op=sum", "op=max"], "op_reduce_scatter": ["op=prod", "op=min"],
            "root_bcast": ["root=0", "root=1"], "root_self_bcast": ["bcast(count=10", "root="],
            "root_self_bcast_large": ["bcast(count=1048576", "root="], "root_reduce": ["root=0", "root=1"],
            "root_scatter": ["root=0", "root=1"], "count_gather": ["count=4", "count=5"],
            "count_bcast": ["count=8", "count=9"], "kind": ["allreduce(", "bcast("],
            "kind_barrier": ["allreduce(", "barrier("], "kind_allgather": ["allgather(", "alltoall("],
            "algorithm": ["algorithm 1", "algorithm 2"], "nonblocking": ["count=5", "count=6"],
            "algorithm_forced_flat": ["algorithm 1", "algorithm 3" if c.size == 2 else "algorithm 2"],
            "after_good_calls": ["root=0", f"root={c.size - 1}"],
            "count_inline": ["count=1", "count=2"], "root_bcast_inline": ["root=0", "root=1"],
            "op_reduce_inline": ["op=sum", "op=max"]}[name]


@pytest.mark.parametrize("P", [2, 3])
def test_mismatch_on_every_rank(run_ranks, P):
    names = sorted(MISMATCHES)
    results = run_ranks(P, mismatch_rank, names, timeout=240, env=ENV30)
    problems = []
    for name in names:
        msgs = set()
        for r, res in enumerate(results):
            kind, msg, dt, expect, after = res[name]
            if kind != "MismatchError":
                problems.append(f"{name}: rank {r} got {kind}: {msg}")
                continue
            msgs.add(msg)
            if dt > DETECT_S:
                problems.append(f"{name}: rank {r} needed {dt:.1f} s")
            missing = [s for s in expect if s not in msg]
            called = set(re.findall(r"rank (\d+) called", msg))
            if missing or len(called) != 2:
                problems.append(f"{name}: rank {r}: message does not name both calls "
                                f"(missing {missing}, ranks {sorted(called)}): {msg}")
            if not after.startswith("MismatchError after"):
                problems.append(f"{name}: rank {r}: the next call gave {after}")
        if len(msgs) > 1:
            problems.append(f"{name}: ranks got different messages: {msgs}")
    assert not problems, "\n".join(problems)


def closing_after_giving(comm, _):
    import hbmcoll

    comm.close()
    c = hbmcoll.init(timeout=30)
    c.bcast(np.zeros(4, np.float32), root=c.rank)   # each gives, nobody receives
    try:
        c.close()
    except hbmcoll.MismatchError as e:
        return "MismatchError", str(e), c.closed
    return "no error", "", c.closed


def test_close_reports_a_last_disagreeing_bcast(run_ranks):
    """A bcast's root returns before the receivers compare (as an MPI eager send does); when
    it was the last call, close() compares, raises the disagreement, and still closes."""
    for kind, msg, closed in run_ranks(2, closing_after_giving, None, timeout=120, env=ENV30):
        assert kind == "MismatchError" and "root=0" in msg and "root=1" in msg, (kind, msg)
        assert closed


def closing_elsewhere(comm, how):
    """Every rank names itself root of its last bcast, then closes from another thread, or
    while that bcast, nonblocking, may still be running on the request thread."""
    import threading

    import hbmcoll

    comm.close()
    c = hbmcoll.init(timeout=30)
    got = []

    def close():
        try:
            c.close()
            got.append("no error")
        except hbmcoll.MismatchError:
            got.append("MismatchError")
    if how == "thread":
        c.bcast(np.zeros(4, np.float32), root=c.rank)
        t = threading.Thread(target=close)
        t.start()
        t.join()
        return got[0]
    req = c.ibcast(np.ones(300_000, np.float32), root=c.rank)   # two chunks through the slots
    close()
    try:
        req.wait(timeout=30)
    except hbmcoll.Error as e:   # still queued at close: aborted, never given
        got.append(type(e).__name__)
    return got


def test_close_from_another_thread_or_during_a_request_still_reports(run_ranks):
    for got in run_ranks(2, closing_elsewhere, "thread", timeout=120, env=ENV30):
        assert got == "MismatchError", got
    for got in run_ranks(2, closing_elsewhere, "request", timeout=120, env=ENV30):
        assert got[0] == "MismatchError" or got[1:], got   # raised by close, or by the request


def test_a_last_disagreeing_bcast_without_close_is_said_at_exit(tmp_path):
    """A script that ends after its last call without close(): the communicator compares as
    it is freed and says the disagreement in one line on stderr."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text("import numpy as np, hbmcoll\ncomm = hbmcoll.init(timeout=30)\n"
                      "comm.bcast(np.zeros(10, np.float32), root=comm.rank)\n")
    p = subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", "2", sys.executable, str(script)],
                       env=dict(os.environ, **ENV30, HBMCOLL_TUNE="off"), capture_output=True,
                       text=True, timeout=120)
    said = [ln for ln in p.stderr.splitlines() if "freed without close()" in ln]
    assert len(said) == 2 and all("ranks disagree in collective #1" in ln for ln in said), p.stderr
