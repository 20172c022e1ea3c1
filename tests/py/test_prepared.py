"""Comm.prepare (prepared.c): a collective's arguments read once, run by calling the result, as
MPI-4's persistent collectives. It reads the buffers at each call (not at prepare), runs on
private and arena buffers, holds its NumPy buffers (they cannot be resized under it), refuses bad
arguments at prepare, and fails like comm.run: a disagreement is MismatchError on every rank,
a closed communicator an error. DDP's comm hook runs on it (test_torch_ddp_arena.py)."""

import gc
import threading
import weakref

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("nothing_left_behind")


def rank_prepared_results(comm):
    from hbmcoll import _core

    c, P, me = comm._c, comm.size, comm.rank
    out = []
    x = np.zeros(1000, np.float32)
    run = c.prepare(_core.ALLREDUCE, x, x, _core.SUM, 0)
    for step in range(3):  # what the buffer holds at the call, each time
        x[:] = me + step
        run()
        out.append(bool((x == sum(r + step for r in range(P))).all()))
    try:  # held: NumPy refuses to move its memory while prepared
        x.resize(2000)
        out.append("resized")
    except ValueError:
        out.append(True)
    a = comm.empty(300000, np.float32)  # the arena, out of place, averaged (the hook's case)
    b = comm.empty(300000, np.float32)
    avg = c.prepare(_core.ALLREDUCE, a, b, _core.AVG, 0)
    for step in range(3):
        a[:] = 2 * me + step
        avg()
        out.append(bool(np.allclose(b, (P - 1) + step)))
    y = np.arange(64, dtype=np.int64) * (me + 1)  # another collective: bcast from the last rank
    bc = c.prepare(_core.BCAST, None, y, 0, P - 1)
    bc()
    out.append(bool((y == np.arange(64) * P).all()))
    del run, avg, bc, a, b  # the arena blocks go back before close
    return out


def test_prepared_reads_the_buffers_at_each_call(run_ranks):
    for n in (2, 3):
        for r, got in enumerate(run_ranks(n, rank_prepared_results)):
            assert got == [True] * 8, (n, r, got)


def rank_prepared_refusals(comm):
    import hbmcoll
    from hbmcoll import _core

    c = comm._c
    x = np.zeros(10, np.float32)
    said = {}
    for name, args in {"kind": (99, x, x, 0, 0), "op": (_core.ALLREDUCE, x, x, 42, 0),
                       "root": (_core.BCAST, None, x, 0, comm.size),
                       "shape": (_core.ALLREDUCE, x, np.zeros(11, np.float32), 0, 0),
                       "dtype": (_core.ALLREDUCE, x, np.zeros(10, np.float64), 0, 0)}.items():
        try:
            c.prepare(*args)
            said[name] = "prepared"
        except (hbmcoll.ArgumentError, TypeError) as e:
            said[name] = type(e).__name__
    run = c.prepare(_core.ALLREDUCE, x, x, 0, 0)
    try:
        run(1)
        said["call args"] = "ran"
    except TypeError:
        said["call args"] = "TypeError"

    def elsewhere():  # as comm.run: only the communicator's thread issues collectives
        try:
            run()
            said["thread"] = "ran"
        except hbmcoll.NotSupportedError:
            said["thread"] = "NotSupportedError"
    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()

    class Held(bytearray):  # a buffer holding its own prepared call: a cycle the collector frees
        pass
    b = Held(16)
    b.run = c.prepare(_core.ALLREDUCE, b, b, 0, 0)
    gone = weakref.ref(b)
    del b
    gc.collect()
    said["cycle freed"] = gone() is None
    comm.barrier()  # the refusals moved nothing: the ranks are still in step
    return said


def test_prepared_refuses_bad_arguments_on_its_own_rank(run_ranks):
    for said in run_ranks(2, rank_prepared_refusals):
        assert said == {"kind": "ArgumentError", "op": "ArgumentError", "root": "ArgumentError",
                        "shape": "ArgumentError", "dtype": "TypeError",
                        "call args": "TypeError", "thread": "NotSupportedError",
                        "cycle freed": True}, said


def rank_prepared_mismatch(comm):
    import hbmcoll
    from hbmcoll import _core

    x = np.zeros(11 if comm.rank == comm.size - 1 else 10, np.float32)
    run = comm._c.prepare(_core.ALLREDUCE, x, x, _core.SUM, 0)
    try:
        run()
        got = "ran"
    except hbmcoll.MismatchError:
        got = "MismatchError"
    comm.close()
    try:
        run()
        after = "ran"
    except hbmcoll.Error as e:
        after = type(e).__name__
    return got, after


def test_prepared_disagreement_and_close_fail_like_run(run_ranks):
    for got, after in run_ranks(3, rank_prepared_mismatch, env={"HBMCOLL_TIMEOUT": "30"}):
        assert got == "MismatchError" and after != "ran", (got, after)
