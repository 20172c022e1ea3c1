"""Every collective against NumPy, on 1 to 8 real processes (8 is oversubscribed on purpose).

One job per world size runs a whole family of cases in a loop (starting processes costs far more
than a collective). Each rank derives every rank's input from (case, rank), so it can compute the
expected answer itself, and checks only its own result; mismatches are collected and reported
together at the end of the job (a wrong answer does not desynchronise the ranks), while a library
exception ends the job at once.

Expected values follow the documented reduction semantics (coll.h): inputs combined left to right
in rank order; integers wrap around; float16/bfloat16 accumulate in float32 and round once; avg is
the sum divided by the size (integers: C truncating division of the wrapped sum). The matrix uses
values whose float sums are exact, so any correct implementation matches bit for bit; the
bitwise-identity test uses random floats and checks that every rank got the very same bits.
"""

import numpy as np
import pytest

from collective_data import (data_input, WORLD_SIZES, NP_DTYPES, DTYPES, OPS, SLOT, SMALL_MAX,
                             itemsize, counts_for, rank_input, model, to_buf, empty_buf, Checker)
from test_collectives_buffers import arena_rank


# ---- the reductions matrix: allreduce, reduce, reduce_scatter ----------------------------------

def reductions_rank(comm):
    P, me = comm.size, comm.rank
    chk = Checker(comm)
    case = 0
    # auto covers flat (small) and rsag (large); forcing flat on large and rsag on small
    # messages covers the other two corners (multi-chunk flat; rsag with empty slices).
    for algo in ("auto", "flat", "rsag"):
        comm.set_algorithm("allreduce", algo)
        comm.set_algorithm("reduce", algo)
        for dtype in DTYPES:
            es = itemsize(dtype)
            for op in OPS:
                for count in counts_for(dtype, P):
                    large = count * es > SMALL_MAX
                    if (algo == "flat" and not large) or (algo == "rsag" and large):
                        continue
                    case += 1
                    ins = [rank_input(case, r, count, dtype, op) for r in range(P)]
                    want = model(ins, op, dtype)
                    tag = f"{dtype} {op} n={count} algo={algo}"

                    buf = to_buf(ins[me], dtype)
                    res = comm.allreduce(buf, op=op)
                    chk.true(res is buf, f"allreduce in place {tag}: did not return buf")
                    chk.same(buf, want, dtype, f"allreduce in place {tag}")

                    buf = to_buf(ins[me], dtype)
                    out = empty_buf(count, dtype)
                    res = comm.allreduce(buf, op=op, out=out)
                    chk.true(res is out, f"allreduce out= {tag}: did not return out")
                    chk.same(out, want, dtype, f"allreduce out= {tag}")
                    chk.same(buf, ins[me], dtype, f"allreduce out= {tag}: input changed")

                    # reduce: the root moves with the case; out= on odd cases, in place on even
                    root = case % P
                    buf = to_buf(ins[me], dtype)
                    if case % 2:
                        out = empty_buf(count, dtype) if me == root else None
                        res = comm.reduce(buf, op=op, root=root, out=out)
                        if me == root:
                            chk.true(res is out, f"reduce out= {tag}: did not return out")
                            chk.same(out, want, dtype, f"reduce out= root={root} {tag}")
                    else:
                        res = comm.reduce(buf, op=op, root=root)
                        if me == root:
                            chk.true(res is buf, f"reduce in place {tag}: did not return buf")
                            chk.same(buf, want, dtype, f"reduce in place root={root} {tag}")
                    if me != root:
                        chk.true(res is None, f"reduce {tag}: non-root got {type(res)}")
                        chk.same(buf, ins[me], dtype, f"reduce root={root} {tag}: input changed")

    # reduce to every root, every op, small and multi-chunk
    comm.set_algorithm("allreduce", "auto")
    comm.set_algorithm("reduce", "auto")
    for root in range(P):
        for dtype in ("int32", "float16", "float64", "bfloat16"):
            for op in OPS:
                for count in (1, 1001, 2 * (SLOT // itemsize(dtype)) + 5):
                    case += 1
                    ins = [rank_input(case, r, count, dtype, op) for r in range(P)]
                    out = empty_buf(count, dtype) if me == root else None
                    comm.reduce(to_buf(ins[me], dtype), op=op, root=root, out=out)
                    if me == root:
                        chk.same(out, model(ins, op, dtype), dtype,
                                 f"reduce root={root} {dtype} {op} n={count}")

    # reduce_scatter: buf (P, n) -> my block; n = 0, 1, odd, and more than one staging piece
    for dtype in DTYPES:
        es = itemsize(dtype)
        for op in OPS:
            for n in (0, 1, 7, 1001, (160 << 10) // es + 3):
                case += 1
                ins = [rank_input(case, r, P * n, dtype, op) for r in range(P)]
                want = model(ins, op, dtype).reshape(P, n)[me]
                # (made (P, n)-shaped in NumPy first: a torch (P, 0) view has strides that
                # test_api.py::test_empty_torch_tensor_is_contiguous is about)
                buf = to_buf(ins[me].reshape(P, n), dtype)
                res = comm.reduce_scatter(buf, op=op)
                chk.true(tuple(res.shape) == (n,), f"reduce_scatter shape {tuple(res.shape)}")
                chk.same(res, want, dtype, f"reduce_scatter {dtype} {op} n={n}")
                out = empty_buf(n, dtype)
                comm.reduce_scatter(buf, op=op, out=out)
                chk.same(out, want, dtype, f"reduce_scatter out= {dtype} {op} n={n}")
                if dtype != "bfloat16":  # in place: my block of buf is out
                    comm.reduce_scatter(buf, op=op, out=buf[me])
                    chk.same(buf[me], want, dtype, f"reduce_scatter in place {dtype} {op} n={n}")
    return chk.done()


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_reductions(run_ranks, P):
    checked = run_ranks(P, reductions_rank, timeout=300)
    assert all(c > 100 for c in checked)


# ---- data movement: bcast, gather, scatter (every root), allgather, alltoall -----------------


def movement_rank(comm):
    P, me = comm.size, comm.rank
    chk = Checker(comm)
    case = 0
    for root in range(P):
        for dtype in NP_DTYPES:
            counts = counts_for(dtype, P)
            if dtype not in ("int8", "float16", "float64"):
                counts = counts[:-1]  # multi-chunk: a few element sizes are enough
            for count in counts:
                case += 1
                tag = f"{dtype} n={count} root={root}"
                ins = [data_input(case, r, count, dtype) for r in range(P)]

                buf = ins[me].copy() if me == root else np.full(count, 3, dtype)
                res = comm.bcast(buf, root=root)
                chk.true(res is buf, f"bcast {tag}: did not return buf")
                chk.same(buf, ins[root], None, f"bcast {tag}")

                res = comm.gather(ins[me], root=root)
                if me == root:
                    chk.true(tuple(res.shape) == (P, count), f"gather {tag}: shape {res.shape}")
                    chk.same(res, np.stack(ins), None, f"gather {tag}")
                    out = np.zeros((P, count), dtype)
                    res = comm.gather(ins[me], root=root, out=out)
                    chk.true(res is out, f"gather out= {tag}: did not return out")
                    chk.same(out, np.stack(ins), None, f"gather out= {tag}")
                else:
                    chk.true(res is None, f"gather {tag}: non-root got {type(res)}")
                    comm.gather(ins[me], root=root)

                # scatter: root's (P, count); non-roots pass out= (odd cases) or only a
                # (P, count)-shaped buf to learn the shape (even cases)
                sc = data_input(case, root, P * count, dtype, (P, count))
                if me == root:
                    res = comm.scatter(sc.copy(), root=root)
                elif case % 2:
                    out = np.zeros(count, dtype)
                    res = comm.scatter(None, root=root, out=out)
                    chk.true(res is out, f"scatter out= {tag}: did not return out")
                else:
                    res = comm.scatter(np.zeros((P, count), dtype), root=root)
                chk.same(res, sc[me], None, f"scatter {tag}")

    # "in place" forms: the root's own block already sits in out (gather, allgather), or the
    # root's out is its own block of buf (scatter)
    for root in range(P):
        for count in (1, 1001, 2 * SLOT + 3):
            case += 1
            tag = f"n={count} root={root}"
            ins = [data_input(case, r, count, "uint8") for r in range(P)]
            out = np.zeros((P, count), np.uint8)
            out[me] = ins[me]
            comm.gather(out[me], root=root, out=out if me == root else None)
            if me == root:
                chk.same(out, np.stack(ins), None, f"gather in place {tag}")
            out = np.zeros((P, count), np.uint8)
            out[me] = ins[me]
            comm.allgather(out[me], out=out)
            chk.same(out, np.stack(ins), None, f"allgather in place {tag}")
            sc = data_input(case, root, P * count, "uint8", (P, count))
            if me == root:
                buf = sc.copy()
                comm.scatter(buf, root=root, out=buf[root])
                chk.same(buf, sc, None, f"scatter in place {tag}")
            else:
                chk.same(comm.scatter(None, root=root, out=np.zeros(count, np.uint8)), sc[me], None,
                         f"scatter in place {tag} (receiver)")

    for dtype in NP_DTYPES:
        counts = counts_for(dtype, P)
        if dtype not in ("int8", "float32"):
            counts = counts[:-1]
        for count in counts:
            case += 1
            tag = f"{dtype} n={count}"
            ins = [data_input(case, r, count, dtype, (count,)) for r in range(P)]
            res = comm.allgather(ins[me])
            chk.true(tuple(res.shape) == (P, count), f"allgather {tag}: shape {res.shape}")
            chk.same(res, np.stack(ins), None, f"allgather {tag}")
            out = np.zeros((P, count), dtype)
            res = comm.allgather(ins[me], out=out)
            chk.true(res is out, f"allgather out= {tag}: did not return out")
            chk.same(out, np.stack(ins), None, f"allgather out= {tag}")

            ins = [data_input(case, r, P * count, dtype, (P, count)) for r in range(P)]
            want = np.stack([ins[q][me] for q in range(P)])
            res = comm.alltoall(ins[me])
            chk.true(tuple(res.shape) == (P, count), f"alltoall {tag}: shape {res.shape}")
            chk.same(res, want, None, f"alltoall {tag}")
            buf = ins[me].copy()
            res = comm.alltoall(buf, out=buf)  # in place
            chk.same(buf, want, None, f"alltoall in place {tag}")
    return chk.done()


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_data_movement(run_ranks, P):
    checked = run_ranks(P, movement_rank, timeout=300)
    assert all(c > 100 for c in checked)


# ---- many chunks: small staging slots -------------------------------------------------------------

def small_slots_rank(comm):
    assert SLOT == 4096 and SMALL_MAX == 2048, (SLOT, SMALL_MAX)
    return reductions_rank(comm) + movement_rank(comm) + arena_rank(comm)


@pytest.mark.parametrize("P", [3, 8])
def test_small_staging_slots(run_ranks, P):
    """The same matrices with 4 KiB slots (the smallest allowed) and rsag from 2 KiB: every
    message of a few KiB takes several pipelined rounds, with both slot parities in play."""
    run_ranks(P, small_slots_rank, timeout=300,
              env={"HBMCOLL_SLOT_BYTES": "4096", "HBMCOLL_SMALL_MAX": "2048"})


@pytest.mark.parametrize("P", [2, 3])
def test_streaming_stores(run_ranks, P):
    """Every reduction with results written by streaming stores from 0 B (HBMCOLL_STREAM_MIN=0):
    flat's reduce through its L1 scratch, rsag's copy-out, each only where the output is apart
    from the input (in place writes ordinary stores)."""
    run_ranks(P, reductions_rank, timeout=300, env={"HBMCOLL_STREAM_MIN": "0"})


@pytest.mark.parametrize("P", [2, 3])
def test_push(run_ranks, P):
    """Allreduce of hbmcoll.empty buffers pushed from 0 B, with ordinary stores and with
    streaming ones: each rank writes its reduced slice into every rank's output."""
    run_ranks(P, arena_rank, timeout=300, env={"HBMCOLL_PUSH_MIN": "0"})
    run_ranks(P, arena_rank, timeout=300, env={"HBMCOLL_PUSH_MIN": "0", "HBMCOLL_PUSH_STREAM_MIN": "0"})


@pytest.mark.parametrize("P", [2, 3])
def test_rsag_zero_copy_without_push(run_ranks, P):
    """Allreduce of hbmcoll.empty buffers by rsag reading and writing them in place, as a push
    threshold above every size gives (the default pushes from the smallest)."""
    run_ranks(P, arena_rank, timeout=300, env={"HBMCOLL_PUSH_MIN": "1G"})
    assert run_ranks(P, arena_algorithm_rank, env={"HBMCOLL_PUSH_MIN": "1G"}) == ["rsag"] * P
    assert run_ranks(P, arena_algorithm_rank) == ["push"] * P


def arena_algorithm_rank(comm):
    import hbmcoll
    buf = hbmcoll.empty(1 << 16, "float32", comm=comm)  # 256 KiB: past the one-round copy
    buf[:] = comm.rank
    comm.allreduce(buf)
    assert (buf == sum(range(comm.size))).all()
    return comm._c.algorithm


# ---- single copy (process_vm_readv/writev) for large bcast and gather ------------------------

def single_copy_rank(comm):
    P, me = comm.size, comm.rank
    out = []
    for n in (300_000, 1 << 20):                 # above HBMCOLL_CMA_MIN (256 KiB) in bytes
        for root in range(P):
            b = np.arange(n, dtype=np.float32) * (me + 1) if me == root else np.zeros(n, np.float32)
            comm.bcast(b, root=root)
            assert np.array_equal(b, np.arange(n, dtype=np.float32) * (root + 1))
            x = np.full(n, me + 0.5, np.float32)
            x[::997] = np.arange(x[::997].size) + me
            g = comm.gather(x, root=root)
            if me == root:
                for q in range(P):
                    want = np.full(n, q + 0.5, np.float32)
                    want[::997] = np.arange(want[::997].size) + q
                    assert np.array_equal(g[q], want), (q, root)
            # in place on the root: its input is the first block of its output
            g = np.empty((P, n), np.float32)
            g[0] = me + 7 if me == root else 0
            comm.gather(g[0] if me == root else np.full(n, me + 7, np.float32), root=root,
                        out=g if me == root else None)
            if me == root:
                assert all(np.all(g[q] == q + 7) for q in range(P))
    out.append(comm.single_copy)
    return out


@pytest.mark.parametrize("cma,kinds", [("1", ("bcast", "gather")), ("0", ()),
                                       ("gather", ("gather",)), ("bcast", ("bcast",))])
def test_single_copy_bcast_gather(run_ranks, cma, kinds):
    """With HBMCOLL_CMA=1 large bcast and gather copy straight between the ranks' own NumPy
    arrays (the kernel allows it here: same PID namespace, no seccomp or Yama refusal), with
    =gather or =bcast that one only; with 0 they stage through the segment. All give the
    same results, in place included."""
    res = run_ranks(3, single_copy_rank, timeout=120, env={"HBMCOLL_CMA": cma})
    assert res == [[kinds]] * 3


# ---- one large allreduce (>= 64 MiB) ---------------------------------------------------------

def large_allreduce_rank(comm, count):
    P, me = comm.size, comm.rank
    idx = np.arange(count, dtype=np.int64) % 1021
    a = (idx + 3 * me).astype(np.float32)  # exact: every partial sum is an integer < 2^24
    want = (P * idx + 3 * P * (P - 1) // 2).astype(np.float32)
    comm.allreduce(a)
    assert np.array_equal(a, want), f"in place: {np.count_nonzero(a != want)} wrong"
    # again from the shared arena (zero-copy), out of place
    src = comm.empty(count, "float32")
    src[:] = idx + 3 * me
    out = comm.empty(count, "float32")
    comm.allreduce(src, out=out)
    assert np.array_equal(out, want), f"arena: {np.count_nonzero(out != want)} wrong"
    comm.allreduce(src)  # in place in the arena: ranks write their slice into every output
    assert np.array_equal(src, want), f"arena in place: {np.count_nonzero(src != want)} wrong"
    return a.nbytes


@pytest.mark.parametrize("P", [2, 4])
def test_allreduce_64mib(run_ranks, P):
    count = (64 << 20) // 4 + 3
    assert run_ranks(P, large_allreduce_rank, count, timeout=300) == [count * 4] * P


def _objects(comm):
    mine = {"rank": comm.rank, "data": list(range(comm.rank * 1000)), "none": None}
    every = comm.allgather_object(mine)
    at_root = comm.gather_object(mine, root=comm.size - 1)
    told = comm.bcast_object({"said by": comm.rank} if comm.rank == 1 else "ignored", root=1)
    return every, at_root, told


@pytest.mark.parametrize("P", [2, 3])
def test_object_collectives(run_ranks, P):
    """Picklable objects of a different size on every rank: allgather, gather, bcast."""
    want = [{"rank": r, "data": list(range(r * 1000)), "none": None} for r in range(P)]
    for r, (every, at_root, told) in enumerate(run_ranks(P, _objects)):
        assert every == want and told == {"said by": 1}
        assert at_root == (want if r == P - 1 else None)


# ---- messages that ride in the descriptor (round.h: coll__post_inline) -------------------------

def inline_rounds_rank(comm, n):
    """n calls back to back of up to 8 bytes, each with new values and a rotating root: a bcast's
    root gives and goes, so it may write its descriptor two calls on while others still read
    this one; every result is checked."""
    P, me = comm.size, comm.rank
    bad = []
    b = np.zeros(2, np.float32)
    x = np.zeros(1, np.float64)
    y = np.zeros(7, np.int8)
    for i in range(n):
        root = i % P
        b[:] = (i, -i) if me == root else (-1, -1)
        comm.bcast(b, root=root)
        if b[0] != i or b[1] != -i:
            bad.append(("bcast", i, b.tolist()))
        x[0] = i + me
        comm.allreduce(x)
        if x[0] != P * i + P * (P - 1) // 2:
            bad.append(("allreduce", i, float(x[0])))
        y[:] = (me + i) % 100  # new each call: a stale part would show
        got = comm.reduce(y, op="max", root=root)
        if me == root and not (got == max((q + i) % 100 for q in range(P))).all():
            bad.append(("reduce", i, got.tolist()))
        g = comm.gather(np.array([i * P + me], np.int32), root=root)
        if me == root and g.ravel().tolist() != [i * P + q for q in range(P)]:
            bad.append(("gather", i, g.ravel().tolist()))
    return bad[:5]


@pytest.mark.parametrize("P", [2, 3])
def test_inline_messages_back_to_back(run_ranks, P):
    for r, bad in enumerate(run_ranks(P, inline_rounds_rank, 20000, timeout=240)):
        assert bad == [], (P, r, bad)
