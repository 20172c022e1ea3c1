"""The Python API contract: bad arguments raise TypeError/ValueError/BufferError before any
communication, and the exception classes form the documented hierarchy.

Most checks run on a size-1 communicator inside the pytest process (fixture comm1). One 2-rank
job shows that the checks really come before any communication: rank 0 makes every mistake while
rank 1 is already waiting in a barrier; had any bad call reached the shared segment, rank 1 would
see a mismatch, and the collectives after it would be out of step.
"""

import sys
import time

import numpy as np
import pytest

try:
    import hbmcoll
except ImportError:  # not built yet: the fixtures say so (conftest._require_core)
    hbmcoll = None


# ---- exception hierarchy ------------------------------------------------------------------------

def test_exception_hierarchy(comm1):
    assert issubclass(hbmcoll.Error, RuntimeError)
    for cls in (hbmcoll.MismatchError, hbmcoll.PeerLostError, hbmcoll.TimeoutError):
        assert issubclass(cls, hbmcoll.Error), cls
        assert issubclass(cls, RuntimeError), cls
    assert issubclass(hbmcoll.TimeoutError, TimeoutError)  # the builtin one
    assert hbmcoll.TimeoutError is not TimeoutError
    assert not issubclass(hbmcoll.MismatchError, hbmcoll.PeerLostError)
    assert not issubclass(hbmcoll.PeerLostError, hbmcoll.MismatchError)
    # the builtin TimeoutError is an OSError: so is hbmcoll.TimeoutError, caught either way
    try:
        raise hbmcoll.TimeoutError("x")
    except TimeoutError as e:
        assert isinstance(e, hbmcoll.Error)


# ---- argument checks on one rank -------------------------------------------------------------

def _bad_calls(comm):
    """(description, exception class, callable) for every misuse we check; each must raise."""
    P = comm.size
    f32 = np.zeros(8, np.float32)
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    strided = np.zeros(16, np.float32)[::2]
    calls = [
        ("list buf", TypeError, lambda: comm.allreduce([1.0, 2.0])),
        ("list buf bcast", TypeError, lambda: comm.bcast([1, 2, 3])),
        ("int buf", TypeError, lambda: comm.allreduce(3)),
        ("str buf", TypeError, lambda: comm.allgather("abc")),
        ("None buf", (TypeError, ValueError), lambda: comm.allreduce(None)),
        ("non-contiguous slice", BufferError, lambda: comm.allreduce(strided)),
        ("non-contiguous out", BufferError, lambda: comm.allreduce(f32, out=strided)),
        ("non-contiguous bcast", BufferError, lambda: comm.bcast(strided)),
        ("Fortran-ordered 2-D", BufferError, lambda: comm.allreduce(np.zeros((3, 4), np.float32, order="F"))),
        ("bool dtype", TypeError, lambda: comm.allreduce(np.zeros(4, bool))),
        ("uint16 dtype", TypeError, lambda: comm.allreduce(np.zeros(4, np.uint16))),
        ("int16 dtype", TypeError, lambda: comm.bcast(np.zeros(4, np.int16))),
        ("complex dtype", TypeError, lambda: comm.allreduce(np.zeros(4, np.complex64))),
        ("uint64 dtype", TypeError, lambda: comm.allreduce(np.zeros(4, np.uint64))),
        ("byte-swapped float32", TypeError, lambda: comm.allreduce(np.zeros(4, ">f4"))),
        ("byte-swapped out", (TypeError, BufferError), lambda: comm.allreduce(f32, out=np.zeros(8, ">f4"))),
        ("out too small", ValueError, lambda: comm.allreduce(f32, out=np.zeros(7, np.float32))),
        ("out too large", ValueError, lambda: comm.allreduce(f32, out=np.zeros(9, np.float32))),
        ("reduce out wrong size", ValueError, lambda: comm.reduce(f32, root=0, out=np.zeros(4, np.float32))),
        ("gather out wrong size", ValueError, lambda: comm.gather(f32, root=0, out=np.zeros(8 * P + 1, np.float32))),
        ("allgather out wrong size", ValueError, lambda: comm.allgather(f32, out=np.zeros(8, np.float32) if P > 1 else np.zeros(9, np.float32))),
        ("dtype mismatch buf/out", TypeError, lambda: comm.allreduce(f32, out=np.zeros(8, np.float64))),
        ("dtype mismatch int/float", TypeError, lambda: comm.allreduce(np.zeros(8, np.int32), out=np.zeros(8, np.float32))),
        ("reduce dtype mismatch", TypeError, lambda: comm.reduce(f32, root=0, out=np.zeros(8, np.int32))),
        ("allgather dtype mismatch", TypeError, lambda: comm.allgather(f32, out=np.zeros(8 * P, np.int32))),
        ("bad op name", ValueError, lambda: comm.allreduce(f32, op="bogus")),
        ("bad op int", ValueError, lambda: comm.allreduce(f32, op=7)),
        ("negative op", ValueError, lambda: comm.allreduce(f32, op=-1)),
        ("op None", ValueError, lambda: comm.allreduce(f32, op=None)),
        ("bad op reduce", ValueError, lambda: comm.reduce(f32, op="mean_square")),
        ("bad op reduce_scatter", ValueError, lambda: comm.reduce_scatter(np.zeros((P, 2), np.float32), op="xor")),
        ("root = size", ValueError, lambda: comm.bcast(f32, root=P)),
        ("root negative", ValueError, lambda: comm.bcast(f32, root=-1)),
        ("reduce root out of range", ValueError, lambda: comm.reduce(f32, root=P + 3)),
        ("gather root out of range", ValueError, lambda: comm.gather(f32, root=P)),
        ("scatter root out of range", ValueError, lambda: comm.scatter(np.zeros((P, 2), np.float32), root=-2)),
        ("root not an int", TypeError, lambda: comm.gather(f32, root="0")),
        ("root float", TypeError, lambda: comm.reduce(f32, root=0.0)),
        ("read-only bcast", BufferError, lambda: comm.bcast(ro)),
        ("bytes bcast", BufferError, lambda: comm.bcast(b"abcd")),
        ("read-only allreduce in place", BufferError, lambda: comm.allreduce(ro)),
        ("read-only out", BufferError, lambda: comm.allreduce(f32, out=ro)),
        ("scatter first dim", ValueError, lambda: comm.scatter(np.zeros((P + 1, 2), np.float32), root=0)),
        ("scatter nothing", ValueError, lambda: comm.scatter(None, root=0)),
        ("reduce_scatter first dim", ValueError, lambda: comm.reduce_scatter(np.zeros((P + 1, 2), np.float32))),
        ("reduce_scatter 0-d", ValueError, lambda: comm.reduce_scatter(np.zeros((), np.float32))),
        ("reduce_scatter out size", ValueError, lambda: comm.reduce_scatter(np.zeros((P, 2), np.float32), out=np.zeros(3, np.float32))),
        ("alltoall out size", ValueError, lambda: comm.alltoall(np.zeros(P * 2, np.float32), out=np.zeros(P * 2 + 1, np.float32))),
        ("iallreduce list", TypeError, lambda: comm.iallreduce([1, 2])),
        ("ibcast read-only", BufferError, lambda: comm.ibcast(ro)),
        ("ireduce bad op", ValueError, lambda: comm.ireduce(f32, op="nope")),
        ("igather bad root", ValueError, lambda: comm.igather(f32, root=P)),
        ("iallgather dtype mismatch", TypeError, lambda: comm.iallgather(f32, out=np.zeros(8 * P, np.float64))),
        ("ialltoall out size", ValueError, lambda: comm.ialltoall(np.zeros(P, np.float32), out=np.zeros(P + 1, np.float32))),
        ("set_algorithm unknown algorithm", ValueError, lambda: comm.set_algorithm("allreduce", "ring9")),
        ("set_algorithm rsag for bcast", ValueError, lambda: comm.set_algorithm("bcast", "rsag")),
        ("hbmcoll.empty without comm", ValueError, lambda: hbmcoll.empty(4, "float32")),
        ("hbmcoll.empty bad dtype", TypeError, lambda: comm.empty(4, "not-a-dtype")),
    ]
    if P > 1:
        calls.append(("alltoall count not a multiple of size", ValueError,
                      lambda: comm.alltoall(np.zeros(P * 2 + 1, np.float32))))
    return calls


TORCH_CASES = ["torch transposed", "torch strided slice", "torch bool", "torch int16",
               "torch complex", "torch dtype mismatch", "torch/numpy dtype mismatch",
               "torch out size", "torch gather out size"]


def _torch_bad_calls(comm):
    import torch

    P = comm.size
    t = torch.zeros(4, 6)
    return [
        ("torch transposed", BufferError, lambda: comm.allreduce(t.t())),
        ("torch strided slice", BufferError, lambda: comm.bcast(t[:, ::2])),
        ("torch bool", TypeError, lambda: comm.allreduce(torch.zeros(4, dtype=torch.bool))),
        ("torch int16", TypeError, lambda: comm.allreduce(torch.zeros(4, dtype=torch.int16))),
        ("torch complex", TypeError, lambda: comm.allreduce(torch.zeros(4, dtype=torch.complex64))),
        ("torch dtype mismatch", TypeError, lambda: comm.allreduce(t, out=torch.zeros(4, 6, dtype=torch.bfloat16))),
        ("torch/numpy dtype mismatch", TypeError, lambda: comm.allreduce(t, out=np.zeros(24, np.float64))),
        ("torch out size", ValueError, lambda: comm.allreduce(t, out=torch.zeros(23))),
        ("torch gather out size", ValueError, lambda: comm.gather(t, root=0, out=torch.zeros(P, 4, 5))),
    ]


class _Size1:
    size = 1


# NumPy refuses non-contiguous and read-only exports with ValueError; they must still arrive
# as the documented BufferError.
BAD_CALLS = [what for what, _, _ in _bad_calls(_Size1())]


@pytest.mark.parametrize("what", BAD_CALLS)
def test_bad_argument(comm1, what):
    exc, call = {w: (e, c) for w, e, c in _bad_calls(comm1)}[what]
    with pytest.raises(exc) as info:
        call()
    assert not isinstance(info.value, hbmcoll.Error), f"{what}: a misuse is not a collective failure"
    # nothing happened: the communicator still works and is in step
    x = np.arange(5, dtype=np.int64)
    assert comm1.allreduce(x) is x and list(x) == [0, 1, 2, 3, 4], what
    assert not comm1.closed


@pytest.mark.parametrize("what", TORCH_CASES)
def test_bad_torch_argument(comm1, what):
    pytest.importorskip("torch")
    calls = {w: (e, c) for w, e, c in _torch_bad_calls(comm1)}
    assert sorted(calls) == sorted(TORCH_CASES)
    exc, call = calls[what]
    with pytest.raises(exc):
        call()
    x = np.ones(3, np.float32)
    assert list(comm1.allreduce(x)) == [1, 1, 1], what


def test_read_only_input_is_fine(comm1):
    """A read-only buffer may be the input of an out-of-place collective."""
    ro = np.arange(6, dtype=np.float32)
    ro.flags.writeable = False
    out = np.zeros(6, np.float32)
    assert comm1.allreduce(ro, out=out) is out
    assert np.array_equal(out, ro)
    g = comm1.gather(b"abc", root=0)
    assert bytes(g) == b"abc"
    assert bytes(comm1.allgather(memoryview(b"xy"))) == b"xy"


def test_numpy_kinds_all_arrive(comm1):
    """Plain arrays take a shortcut past the buffer protocol (numpy_fast.c); subclasses,
    0-d arrays, views with an offset and every integer spelling of 4 and 8 bytes must
    still arrive with the right pointer, size and dtype."""
    class Sub(np.ndarray):
        pass

    base = np.arange(12, dtype=np.float32)
    cases = [base.view(Sub), np.array(2.5, np.float32), base[3:9], base.reshape(3, 4)[1:]]
    cases += [np.arange(5, dtype=t) for t in (np.intc, np.int_, np.longlong, np.float16, np.uint8)]
    for x in cases:
        want = np.array(x, copy=True)
        out = np.empty_like(want)
        got = comm1.allreduce(x, op="sum", out=out)
        assert got is out and np.array_equal(out, want), (x.dtype, x.shape)
        assert comm1.bcast(x) is x and np.array_equal(x, want)
    held = np.zeros(4, np.float32)
    before = sys.getrefcount(held)
    comm1.allreduce(held)
    assert sys.getrefcount(held) == before  # the shortcut's reference is given back


def test_numpy_shortcut_is_built_in():
    """A build without NumPy's headers still works but pays the buffer protocol on every
    array (0.15 us of a 0.3 us call); every way this project builds must have them."""
    from hbmcoll import _core
    assert _core.NUMPY_SHORTCUT == 1, "hbmcoll._core was built without NumPy headers"


def test_size_one_collectives(comm1):
    """Every collective on one rank is a copy (or nothing)."""
    a = np.arange(10, dtype=np.float64)
    assert comm1.bcast(a) is a
    assert np.array_equal(comm1.allreduce(a.copy(), op="avg"), a)
    assert np.array_equal(comm1.gather(a), a[None])
    assert np.array_equal(comm1.allgather(a), a[None])
    assert np.array_equal(comm1.scatter(a[None].copy()), a)
    assert np.array_equal(comm1.reduce_scatter(a[None].copy(), op="max"), a)
    assert np.array_equal(comm1.alltoall(a), a)
    assert comm1.reduce(a.copy()) is not None
    comm1.barrier()
    assert comm1.ibarrier().wait() is None
    assert (comm1.rank, comm1.size) == (0, 1)


def test_op_spellings(comm1):
    for op in ("sum", "SUM", "Sum", "prod", "min", "max", "avg", "mean", "average"):
        x = np.array([3], np.int32)
        comm1.allreduce(x, op=op)
        assert int(x[0]) == 3, op


def test_result_buffer_keeps_int8(comm1):
    """Bug: comm.py _empty_like() turns a memoryview of format 'b' (int8) into a bytearray
    (format 'B', uint8), so allgather/gather/scatter/alltoall without out= on an int8
    memoryview fail with 'buf is int8 but out is uint8'."""
    mv = memoryview(bytearray(b"\x01\xff\x02")).cast("b")
    out = comm1.allgather(mv)
    assert memoryview(out).format == "b" and memoryview(out).tolist() == [1, -1, 2]
    out = comm1.alltoall(mv)
    assert memoryview(out).format == "b" and memoryview(out).tolist() == [1, -1, 2]


def test_empty_torch_tensor_is_contiguous(comm1):
    """Bug: pymod/buffer.c buf_from_dlpack() rejects zero-element tensors whose strides are not
    the 'expected' ones, e.g. torch.zeros(2, 0) (strides (1, 1)): a tensor without elements is
    contiguous whatever its strides say."""
    torch = pytest.importorskip("torch")
    t = torch.zeros(2, 0)
    assert t.is_contiguous() and t.stride() == (1, 1)
    assert comm1.allreduce(t) is t
    assert comm1.bcast(torch.zeros(3, 0, dtype=torch.bfloat16)).shape == (3, 0)


def test_closed_communicator(comm1):
    import hbmcoll as h

    c = h.init()  # comm1's environment (size 1, no binding) is still in force
    x = np.ones(3, np.float32)
    c.allreduce(x)
    c.close()
    assert c.closed
    with pytest.raises(h.Error):
        c.allreduce(x)
    with pytest.raises(h.Error):
        c.iallreduce(x)
    c.close()  # twice is fine


def test_request_wait_negative_timeout(comm1):
    req = comm1.iallreduce(np.ones(4, np.float32))
    with pytest.raises(ValueError):
        req.wait(timeout=-1)
    assert list(req.wait()) == [1, 1, 1, 1]
    assert req.done and req.test()


def test_set_algorithm_unknown_collective_is_value_error(comm1):
    """Bug (minor): Communicator.set_algorithm looks the collective up in a dict, so a typo
    raises KeyError, not the ValueError the API promises for bad arguments."""
    with pytest.raises(ValueError):
        comm1.set_algorithm("allreduse", "flat")


# ---- misuse on two ranks: the checks come before any communication ---------------------------

def misuse_rank(comm):
    me = comm.rank
    failures = []
    if me == 0:
        calls = _bad_calls(comm)
        try:
            calls += _torch_bad_calls(comm)
        except ImportError:
            pass
        for what, _exc, call in calls:
            t = time.monotonic()
            try:
                call()
                failures.append(f"{what}: no exception")
            except (TypeError, ValueError, BufferError) as e:
                # (which class exactly is test_bad_argument's business; here: no communication)
                if isinstance(e, hbmcoll.Error):
                    failures.append(f"{what}: {type(e).__name__}: {e}")
            except BaseException as e:  # noqa: BLE001 - report, do not mask
                failures.append(f"{what}: {type(e).__name__}: {e}")
            if time.monotonic() - t > 2:
                failures.append(f"{what}: took {time.monotonic() - t:.1f} s (it waited for peers?)")
    comm.barrier()  # rank 1 has been waiting here all along
    x = np.full(4, me + 1, np.int64)
    comm.allreduce(x)
    assert list(x) == [sum(range(1, comm.size + 1))] * 4
    y = comm.bcast(np.full(3, me, np.float32), root=comm.size - 1)
    assert list(y) == [comm.size - 1] * 3
    assert not failures, "\n".join(failures)
    return len(failures)


@pytest.mark.parametrize("P", [2, 3])
def test_misuse_does_not_communicate(run_ranks, P):
    run_ranks(P, misuse_rank, timeout=120)


# ---- lifetimes: close() while things still point into the communicator ----------------------

def close_with_request_rank(comm, then):
    import hbmcoll as h

    x = np.ones(1000, np.float32)
    req = comm.iallreduce(x)
    comm.close()
    try:
        if then == "wait":
            req.wait(timeout=30)
        elif then == "test":
            req.test()
        else:
            del req
        return "ok"
    except h.Error as e:  # failing the request is fine too
        return type(e).__name__


@pytest.mark.parametrize("then", ["wait", "test", "del"])
def test_close_with_pending_request(run_ranks, then):
    """close() with a request in flight, then wait/test/drop the request: no crash. (Was a use
    after free, SIGSEGV: requests pointed at the freed communicator; fixed in c04a1b1.)"""
    for P in (1, 2):
        results = run_ranks(P, close_with_request_rank, then, timeout=60)
        assert all(r in ("ok", "Error", "PeerLostError") for r in results), results


def arena_after_close_rank(comm):
    a = comm.empty(1000, "float32")
    a[:] = 1
    comm.allreduce(a)
    comm.close()
    return float(a.sum())  # the array must stay readable (or close() must refuse)


def test_arena_array_outlives_close(run_ranks):
    """Bug: close() unmaps the shared segment while NumPy arrays from hbmcoll.empty() still
    point into it (ArenaBuffer keeps the Comm object alive, not the mapping): reading such an
    array after close() is a SIGSEGV (pymod/_core.c comm_close -> coll_comm_free munmap)."""
    assert run_ranks(1, arena_after_close_rank, timeout=60) == [1000.0]


def test_arena_exhausted_is_memory_error(comm1):
    with pytest.raises(MemoryError):
        comm1.empty(3 << 30, "uint8")  # more than the 1 GiB arena (default HBMCOLL_ARENA_BYTES)
    a = comm1.empty(10, "float64")  # still usable
    a[:] = 2
    assert list(comm1.allreduce(a)) == [2.0] * 10


def test_arena_free_and_reuse(comm1):
    """Arrays given back to the arena are reused, and freed neighbours coalesce."""
    import gc

    big = (1 << 30) // 4  # bytes: four of these fill the default 1 GiB arena
    arrs = [comm1.empty(big - 4096, "uint8") for _ in range(3)]
    with pytest.raises(MemoryError):
        comm1.empty(2 * big, "uint8")
    del arrs[1]
    gc.collect()
    with pytest.raises(MemoryError):
        comm1.empty(2 * big, "uint8")  # the hole of one array is not enough
    del arrs[0]
    gc.collect()
    whole = comm1.empty(2 * big - 8192, "uint8")  # two neighbours coalesced
    whole[:16] = 3
    assert list(comm1.allreduce(whole[:16])) == [3] * 16


def test_python_m_hbmcoll_reports_the_installation():
    """python -m hbmcoll: the version, this machine as the placement layer sees it, and what is
    built in or found, one line each (a bug report's first lines)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "hbmcoll"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"hbmcoll {hbmcoll.__version__} at ")
    for line in ("  NUMA nodes:", "NumPy fast path: built in", "bridge between nodes: ",
                 "memkind: ", "torch: ", "launchers: hbmcoll-run"):
        assert line in out.stdout, (line, out.stdout)


def test_topo_refuses_a_rank_count_below_one():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "hbmcoll.topo", "--ranks", "0"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "--ranks 0: give at least 1" in out.stderr, out
