"""Collectives with a count per rank (vcoll.py) against NumPy references: every rank derives
what every rank sends from the ranks' numbers and checks its own result. Counts include 0 and
blocks far apart in size; disagreeing counts fail on every rank."""
import numpy as np
import pytest

import hbmcoll


def _counts(P):
    return [(3 * k + 1) % 5 * (k + 1) for k in range(P)]  # 1, 8, 6, 0, 15: a 0 at P = 5


def _block(k, n, dtype):
    return (np.arange(n) + 100 * k).astype(dtype)


def _vcollectives(comm, dtype):
    r, P = comm.rank, comm.size
    counts = _counts(P)
    mine = _block(r, counts[r], dtype)
    every = np.concatenate([_block(k, counts[k], dtype) for k in range(P)])
    res = {"allgatherv": comm.allgatherv(mine, counts=counts), "allgatherv-sizes": comm.allgatherv(mine),
           "gatherv": comm.gatherv(mine, root=P - 1, counts=counts),
           "scatterv": comm.scatterv(every if r == 0 else None, counts, root=0, out=np.empty(counts[r], dtype))}
    send = [(r + j) % 4 for j in range(P)]  # what rank r sends to j
    res["alltoallv"] = comm.alltoallv(np.concatenate([_block(10 * r + j, send[j], dtype) for j in range(P)]), send)
    res["reduce_scatter"] = comm.reduce_scatter(np.arange(sum(counts), dtype=dtype), op="sum", counts=counts)
    return {k: (None if v is None else v.tolist()) for k, v in res.items()}


@pytest.mark.parametrize("P", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", ["int32", "float64", "uint8"])
def test_v_collectives_against_numpy(run_ranks, P, dtype):
    counts = _counts(P)
    every = np.concatenate([_block(k, counts[k], dtype) for k in range(P)])
    for r, got in enumerate(run_ranks(P, _vcollectives, dtype)):
        assert got["allgatherv"] == every.tolist() == got["allgatherv-sizes"]
        assert got["gatherv"] == (every.tolist() if r == P - 1 else None)
        assert got["scatterv"] == _block(r, counts[r], dtype).tolist()
        came = [_block(10 * k + r, (k + r) % 4, dtype) for k in range(P)]
        assert got["alltoallv"] == np.concatenate(came).tolist()
        at = sum(counts[:r])
        want = (P * np.arange(sum(counts), dtype=dtype))[at:at + counts[r]]
        assert got["reduce_scatter"] == want.tolist()


def _torch_vcollectives(comm):
    import torch
    mine = torch.full((comm.rank + 1,), comm.rank + 0.5, dtype=torch.bfloat16)
    every = comm.allgatherv(mine)
    rs = comm.reduce_scatter(torch.ones(3 * comm.size, dtype=torch.bfloat16), counts=[3] * comm.size)
    return every.dtype == torch.bfloat16, every.float().tolist(), rs.float().tolist()


def test_v_collectives_take_torch_tensors(run_ranks):
    pytest.importorskip("torch")
    for ok, every, rs in run_ranks(3, _torch_vcollectives):
        assert ok and every == [0.5, 1.5, 1.5, 2.5, 2.5, 2.5] and rs == [3.0, 3.0, 3.0]


def _disagree(comm, case):
    try:
        if case == "wrong-own-count":  # rank 1 says 5 but holds 1
            comm.allgatherv(np.zeros(1), counts=[1, 5, 1][:comm.size] if comm.rank == 1 else [1] * comm.size)
        elif case == "counts-differ":
            comm.allgatherv(np.zeros(1), counts=None if comm.rank == 0 else [1] * comm.size)
        elif case == "roots-differ":
            comm.gatherv(np.zeros(1), root=comm.rank)
        elif case == "bad-sendcounts":
            comm.alltoallv(np.zeros(comm.size), [1] * comm.size if comm.rank else [2] * comm.size)
        elif case == "dtypes-differ":  # the same bytes, read as different numbers
            comm.allgatherv(np.zeros(2, np.float32 if comm.rank else np.int32))
        elif case == "one-rank-bad-buffer":  # fails on rank 1 alone, before anything is sent
            comm.allgatherv(np.zeros((4, 4))[:, 0] if comm.rank == 1 else np.zeros(4))
        elif case == "bad-counts-type":
            comm.gatherv(np.zeros(1), counts=["x"] * comm.size if comm.rank == 2 else [1] * comm.size)
        comm.barrier()  # every rank left the failed call together: the next collective works
    except hbmcoll.MismatchError as exc:
        comm.barrier()
        return str(exc)
    return "no error"


@pytest.mark.parametrize("case", ["wrong-own-count", "counts-differ", "roots-differ", "bad-sendcounts", "dtypes-differ",
                                  "one-rank-bad-buffer", "bad-counts-type"])
def test_disagreeing_counts_fail_on_every_rank(run_ranks, case):
    said = run_ranks(3, _disagree, case)
    assert all(s != "no error" for s in said), said


def _empty_blocks(comm):
    import torch
    n = [0, 3, 0]
    every = comm.allgatherv(torch.ones(n[comm.rank]))  # an empty tensor may have no address
    none = comm.allgatherv(torch.ones(0), counts=[0] * 3)
    swapped = comm.alltoallv(np.zeros(0, np.float32), [0] * 3)
    gathered = comm.gatherv(torch.ones(n[comm.rank], dtype=torch.bfloat16), root=1)
    mine = comm.scatterv(torch.arange(3.) if comm.rank == 0 else None, n, out=torch.empty(n[comm.rank]))
    return (every.tolist(), none.tolist(), swapped.tolist(), swapped.dtype == np.float32,
            None if gathered is None else gathered.float().tolist(), mine.tolist())


def test_empty_blocks_and_empty_tensors(run_ranks):
    pytest.importorskip("torch")
    for r, got in enumerate(run_ranks(3, _empty_blocks)):
        assert got == ([1.0] * 3, [], [], True, [1.0] * 3 if r == 1 else None, [0.0, 1.0, 2.0] if r == 1 else [])


def _other_dtypes(comm):
    import torch
    P, r = comm.size, comm.rank
    counts = [k + 1 for k in range(P)]
    flags = comm.allgatherv(np.arange(r + 1) % 2 == 0)  # bool: no name in libcoll, moved as bytes
    shorts = comm.gatherv(np.full(r + 1, -r, np.int16), root=0, counts=counts)
    cplx = comm.alltoallv(np.full(P, r + 1j, np.complex64), [1] * P)
    tb = comm.allgatherv(torch.full((r + 1,), r % 2 == 1))
    mine = comm.scatterv(np.arange(sum(counts), dtype=np.uint16) if r == 0 else None, counts,
                         out=np.empty(r + 1, np.uint16))
    return (flags.dtype.name, flags.tolist(), None if shorts is None else shorts.tolist(), cplx.tolist(),
            str(tb.dtype), tb.tolist(), mine.tolist())


def test_dtypes_libcoll_has_no_name_for_move_as_bytes(run_ranks):
    pytest.importorskip("torch")
    P = 3
    at = [0, 1, 3]
    for r, got in enumerate(run_ranks(P, _other_dtypes)):
        assert got[0] == "bool" and got[1] == [True, True, False, True, False, True]
        assert got[2] == ([0, -1, -1, -2, -2, -2] if r == 0 else None)
        assert got[3] == [k + 1j for k in range(P)]
        assert got[4] == "torch.bool" and got[5] == [False, True, True, False, False, False]
        assert got[6] == list(range(at[r], at[r] + r + 1))
