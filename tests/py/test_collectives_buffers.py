"""Collectives on every kind of buffer: zero-copy arena buffers (hbmcoll.empty) mixed with
NumPy ones, send and receive buffers that overlap, bytearray / memoryview / torch, and float
sums that are bitwise identical on every rank (random floats). Real processes, as in
test_collectives.py."""

import time

import numpy as np
import pytest

from collective_data import (data_input, SLOT, itemsize, round_to, rank_input, model, to_buf, bits,
                             Checker)


# ---- zero-copy arena buffers (hbmcoll.empty), mixed with ordinary NumPy buffers ----------------

def arena_rank(comm):
    import hbmcoll

    P, me = comm.size, comm.rank
    chk = Checker(comm)
    case = 0
    in_arena = me % 2 == 0  # even ranks zero-copy, odd ranks ordinary arrays
    for algo in ("auto", "flat", "rsag"):
        comm.set_algorithm("allreduce", algo)
        for dtype in ("int32", "float16", "float32", "float64"):
            es = itemsize(dtype)
            for count in (0, 1, 7, 1001, 3 * (SLOT // es) + 11):
                for op in ("sum", "max", "avg"):
                    case += 1
                    tag = f"{dtype} {op} n={count} algo={algo}"
                    ins = [rank_input(case, r, count, dtype, op) for r in range(P)]
                    want = model(ins, op, dtype)
                    # in place
                    buf = (hbmcoll.empty(count, dtype, comm=comm) if in_arena
                           else np.empty(count, dtype))
                    buf[:] = ins[me]
                    comm.allreduce(buf, op=op)
                    chk.same(buf, want, dtype, f"arena allreduce in place {tag}")
                    # out of place: arena->arena, arena->numpy, numpy->arena by case
                    mode = case % 3
                    src = comm.empty(count, dtype) if in_arena or mode == 2 else np.empty(count, dtype)
                    out = comm.empty(count, dtype) if mode != 1 else np.empty(count, dtype)
                    src[:] = ins[me]
                    comm.allreduce(src, op=op, out=out)
                    chk.same(out, want, dtype, f"arena allreduce out= mode {mode} {tag}")
                    chk.same(src, ins[me], dtype, f"arena allreduce out= mode {mode} {tag}: input changed")
    comm.set_algorithm("allreduce", "auto")

    # reduce with arena inputs (non-roots' inputs read in place by the root)
    for root in range(P):
        for count in (7, 3 * (SLOT // 4) + 1):
            case += 1
            ins = [rank_input(case, r, count, "float32", "sum") for r in range(P)]
            buf = comm.empty(count, "float32") if in_arena else np.empty(count, np.float32)
            buf[:] = ins[me]
            comm.reduce(buf, root=root)
            if me == root:
                chk.same(buf, model(ins, "sum", "float32"), "float32", f"arena reduce root={root} n={count}")
            buf[:] = -1  # at once: the root must be done reading it

    # Reuse right after return: a rank that changes its arena input as soon as the call
    # returns must not change what slower peers read.
    for algo in ("flat", "rsag"):
        comm.set_algorithm("allreduce", algo)
        count = 2 * (SLOT // 4) + 1
        buf = comm.empty(count, "float32")
        for it in range(6):
            buf[:] = me + it
            comm.allreduce(buf)
            exp = np.float32(sum(r + it for r in range(P)))
            chk.true(bool(np.all(buf == exp)), f"arena reuse algo={algo} it={it}: "
                     f"{np.count_nonzero(buf != exp)} wrong")
            if me == 0:
                time.sleep(0.01)  # let the others run ahead into the next round
    comm.set_algorithm("allreduce", "auto")

    # bcast from an arena buffer (zero-copy, and forced through the slots), every root
    for algo in ("auto", "arena", "flat"):
        comm.set_algorithm("bcast", algo)
        for root in range(P):
            for count in (0, 5, 3 * SLOT + 17):
                case += 1
                data = data_input(case, root, count, "uint8")
                buf = comm.empty(count, "uint8") if (me + root) % 2 == 0 else np.empty(count, "uint8")
                buf[:] = data if me == root else 0
                comm.bcast(buf, root=root)
                chk.same(buf, data, None, f"bcast algo={algo} root={root} n={count}")
                if me == root:
                    buf[:] = 255 - data  # at once: receivers must already be done reading
                comm.bcast(buf, root=root)
                chk.same(buf, 255 - data if count else data, None,
                         f"bcast reuse algo={algo} root={root} n={count}")
    # receivers follow the root's choice: ranks may force different bcast algorithms
    comm.set_algorithm("bcast", "flat" if me % 2 else "arena")
    for root in range(P):
        data = data_input(root, root, SLOT + 5, "uint8")
        buf = comm.empty(SLOT + 5, "uint8")
        buf[:] = data if me == root else 0
        comm.bcast(buf, root=root)
        chk.same(buf, data, None, f"bcast with per-rank algorithms root={root}")
    comm.set_algorithm("bcast", "auto")
    return chk.done()


@pytest.mark.parametrize("P", [2, 3, 4])
def test_arena_buffers(run_ranks, P):
    run_ranks(P, arena_rank, timeout=300)


# ---- send and receive buffers that overlap -----------------------------------------------------

def overlap_rank(comm):
    """Views of one array as send and out, shifted by a few elements, by more than a staging
    slot, by half the message: the result must be what separate buffers give (a private copy
    of send is taken for any overlap that is not an in-place form). Ordinary and arena arrays,
    blocking and nonblocking."""
    P, me = comm.size, comm.rank
    chk = Checker(comm)
    root = P - 1

    def data(r, n):
        return (np.arange(n, dtype=np.int64) * 7 + 1000 * r).astype(np.int32)

    def views(kind, n, ns, nr, shift):
        """send (ns elements) and out (nr elements) in one array, out = send + shift."""
        size = max(ns, nr) + abs(shift)
        base = comm.empty(size, "int32") if kind == "arena" else np.zeros(size, np.int32)
        s0, r0 = (0, shift) if shift >= 0 else (-shift, 0)
        return base[s0:s0 + ns], base[r0:r0 + nr]

    for kind in ("numpy", "arena"):
        for n in (1001, 2 * (SLOT // 4) + 5):
            for shift in (3, -3, n // 2, -(n // 2), SLOT // 4 * 3 // 2 + 1):
                tag = f"{kind} n={n} shift={shift}"
                ins = [data(r, n) for r in range(P)]
                total = np.sum(np.stack(ins).astype(np.int64), axis=0).astype(np.int32)
                for blocking in (True, False):
                    send, out = views(kind, n, n, n, shift)
                    send[:] = ins[me]
                    if blocking:
                        comm.allreduce(send, out=out)
                    else:
                        comm.iallreduce(send, out=out).wait()
                    chk.same(out, total, None, f"allreduce {tag} blocking={blocking}")
                send, out = views(kind, n, n, n, shift)
                send[:] = ins[me]
                comm.reduce(send, root=root, out=out if me == root else None)
                if me == root:
                    chk.same(out, total, None, f"reduce {tag}")

                wide = [data(r, P * n) for r in range(P)]
                for shift_w in (shift, P * n // 2 + 1):
                    tag = f"{kind} n={n} shift={shift_w}"
                    send, out = views(kind, n, n, P * n, shift_w)
                    send[:] = ins[me]
                    comm.allgather(send, out=out.reshape(P, n))
                    chk.same(out, np.concatenate(ins), None, f"allgather {tag}")
                    send, out = views(kind, n, n, P * n, shift_w)
                    send[:] = ins[me]
                    comm.gather(send, root=root, out=out.reshape(P, n) if me == root else None)
                    if me == root:
                        chk.same(out, np.concatenate(ins), None, f"gather {tag}")
                    send, out = views(kind, n, P * n, n, -shift_w)
                    send[:] = wide[me]
                    if me == root:
                        comm.scatter(send.reshape(P, n), root=root, out=out)
                    else:
                        comm.scatter(None, root=root, out=out)
                    chk.same(out, wide[root][me * n:(me + 1) * n], None, f"scatter {tag}")
                    send, out = views(kind, n, P * n, n, -shift_w)
                    send[:] = wide[me]
                    comm.reduce_scatter(send.reshape(P, n), out=out)
                    want = np.sum(np.stack(wide).astype(np.int64), axis=0).astype(np.int32)
                    chk.same(out, want[me * n:(me + 1) * n], None, f"reduce_scatter {tag}")
                    send, out = views(kind, n, P * n, P * n, shift_w)
                    send[:] = wide[me]
                    comm.alltoall(send.reshape(P, n), out=out.reshape(P, n))
                    want = np.concatenate([wide[q][me * n:(me + 1) * n] for q in range(P)])
                    chk.same(out, want, None, f"alltoall {tag}")
    return chk.done()


@pytest.mark.parametrize("P", [2, 3])
def test_overlapping_buffers(run_ranks, P):
    checked = run_ranks(P, overlap_rank, timeout=300)
    assert all(c > 100 for c in checked)


# ---- buffer kinds: bytearray, memoryview, torch ---------------------------------------------------

def buffers_rank(comm):
    import torch

    P, me = comm.size, comm.rank
    chk = Checker(comm)
    # bytearray: uint8, wraps around
    b = bytearray([(me * 100 + i) % 256 for i in range(301)])
    comm.allreduce(b)
    want = np.add.reduce(np.stack([np.array([(r * 100 + i) % 256 for i in range(301)], np.uint8)
                                   for r in range(P)]), axis=0, dtype=np.uint8)
    chk.same(b, want, None, "bytearray allreduce")
    b = bytearray(b"root%d" % (P - 1)) if me == P - 1 else bytearray(5)
    comm.bcast(b, root=P - 1)
    chk.true(bytes(b) == b"root%d" % (P - 1), f"bytearray bcast: {bytes(b)!r}")
    g = comm.gather(bytearray([me] * 3), root=0)
    if me == 0:
        chk.true(isinstance(g, bytearray) and bytes(g) == bytes(r for r in range(P) for _ in range(3)),
                 f"bytearray gather: {g!r}")
    ag = comm.allgather(bytearray([me, me]))
    chk.true(bytes(ag) == bytes(r for r in range(P) for _ in range(2)), f"bytearray allgather {ag!r}")

    # memoryview of several formats; out= a memoryview too
    for fmt, dtype in (("b", "int8"), ("i", "int32"), ("q", "int64"), ("f", "float32"), ("d", "float64")):
        base = np.arange(13, dtype=dtype) + me
        mv = memoryview(bytearray(base.tobytes())).cast(fmt)
        comm.allreduce(mv, op="max")
        chk.same(np.frombuffer(mv, dtype), np.arange(13, dtype=dtype) + P - 1, None, f"memoryview {fmt} max")
        out = memoryview(bytearray(base.nbytes)).cast(fmt)
        comm.allreduce(memoryview(base), op="sum", out=out)
        chk.same(np.frombuffer(out, dtype), np.arange(13, dtype=dtype) * P + sum(range(P)), None,
                 f"memoryview {fmt} sum out=")
        if fmt != "b":  # int8 memoryviews: see test_api.py::test_result_buffer_keeps_int8
            ag = comm.allgather(mv)
            chk.true(len(memoryview(ag).cast("B")) == P * base.nbytes, f"memoryview {fmt} allgather size")
            chk.true(memoryview(ag).format == fmt, f"memoryview {fmt} allgather format {memoryview(ag).format}")
    # a memoryview of a NumPy slice that is contiguous
    arr = np.zeros((4, 6), np.float64)
    arr[1] = me
    comm.allreduce(memoryview(arr[1]))
    chk.true(bool(np.all(arr[1] == sum(range(P)))) and not arr[0].any(), "memoryview of a row")

    # torch: float32, bfloat16, int64, several shapes
    for dt in (torch.float32, torch.bfloat16, torch.int64):
        t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(dt) + me
        r = comm.allreduce(t)
        chk.true(r is t, f"torch {dt} allreduce returns the tensor")
        want = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * P + sum(range(P))).to(dt)
        chk.true(torch.equal(t, want), f"torch {dt} allreduce: {t}")
        o = torch.empty(3, 4, dtype=dt)
        comm.allreduce(torch.full((3, 4), me + 1, dtype=dt), op="prod", out=o)
        chk.true(torch.equal(o, torch.full((3, 4), float(np.prod(range(1, P + 1))), dtype=dt)),
                 f"torch {dt} prod out=")
        x = torch.full((2, 5), float(me), dtype=dt)
        comm.bcast(x, root=P - 1)
        chk.true(torch.equal(x, torch.full((2, 5), float(P - 1), dtype=dt)), f"torch {dt} bcast")
        g = comm.gather(torch.full((2,), float(me), dtype=dt), root=0)
        if me == 0:
            chk.true(isinstance(g, torch.Tensor) and g.dtype == dt and tuple(g.shape) == (P, 2) and
                     torch.equal(g, torch.arange(P, dtype=torch.float32).repeat_interleave(2).reshape(P, 2).to(dt)),
                     f"torch {dt} gather: {g!r}")
        ag = comm.allgather(torch.full((2, 2), float(me), dtype=dt))
        chk.true(isinstance(ag, torch.Tensor) and ag.dtype == dt and tuple(ag.shape) == (P, 2, 2) and
                 all(torch.equal(ag[r], torch.full((2, 2), float(r), dtype=dt)) for r in range(P)),
                 f"torch {dt} allgather: {ag!r}")
        s = torch.arange(P * 3, dtype=torch.float32).reshape(P, 3).to(dt)
        sc = comm.scatter(s if me == 0 else torch.empty(P, 3, dtype=dt), root=0)
        chk.true(isinstance(sc, torch.Tensor) and torch.equal(sc, s[me]), f"torch {dt} scatter: {sc!r}")
        rs = comm.reduce_scatter(torch.ones(P, 4, dtype=dt) * (me + 1))
        chk.true(isinstance(rs, torch.Tensor) and tuple(rs.shape) == (4,) and
                 torch.equal(rs, torch.full((4,), float(P * (P + 1) // 2), dtype=dt)),
                 f"torch {dt} reduce_scatter: {rs!r}")
        a2a = comm.alltoall(torch.arange(P, dtype=torch.float32).to(dt) + 10 * me)
        chk.true(torch.equal(a2a, (torch.arange(P, dtype=torch.float32) * 10 + me).to(dt)),
                 f"torch {dt} alltoall: {a2a!r}")
    # a contiguous view with an offset (DLPack byte_offset / data pointer)
    base = torch.zeros(10, dtype=torch.float32)
    view = base[3:8]
    view += me + 1
    comm.allreduce(view)
    chk.true(torch.equal(base[3:8], torch.full((5,), float(P * (P + 1) // 2))) and
             not base[:3].any() and not base[8:].any(), f"torch view with offset: {base}")
    # every dtype through torch's short way in (torch_fast.c), against NumPy's
    for dt in (torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32,
               torch.float64):
        for op in ("sum", "max"):  # values that tell the dtypes apart (sign, float bits)
            v = (torch.arange(5) * 37 + me * 100 + 20) % 250
            t = (v * ((1 << 23) + 1) if dt in (torch.int32, torch.int64) else v).to(dt)
            n = t.numpy().copy()
            comm.allreduce(t, op)
            comm.allreduce(n, op)
            chk.true(np.array_equal(t.numpy(), n), f"torch {dt} {op} against NumPy: {t} {n}")
    # what the short way declines goes the general way: the same errors and results as before
    for bad, err in ((torch.ones(3, requires_grad=True), BufferError),
                     (torch.ones(4, 4).t(), BufferError), (torch.ones(2, dtype=torch.complex64), TypeError)):
        try:
            comm.allreduce(bad)
            chk.true(False, f"torch {bad!r} was taken")
        except err:
            pass

    class Sub(torch.Tensor):
        pass
    sub = torch.full((3,), float(me)).as_subclass(Sub)
    comm.allreduce(sub)
    chk.true(torch.equal(sub.as_subclass(torch.Tensor), torch.full((3,), float(sum(range(P))))),
             f"torch subclass: {sub}")
    # mixed kinds across ranks: the same dtype, different containers
    x = torch.full((6,), float(me)) if me % 2 else np.full(6, float(me), np.float32)
    comm.allreduce(x)
    chk.true(bool(np.all(np.asarray(x) == sum(range(P)))), f"mixed torch/numpy: {x}")
    return chk.done()


@pytest.mark.parametrize("P", [1, 2, 3])
def test_buffer_kinds(run_ranks, P):
    run_ranks(P, buffers_rank, timeout=120)


# ---- float sums are bitwise identical on every rank --------------------------------------------

def bitwise_rank(comm):
    P, me = comm.size, comm.rank
    chk = Checker(comm)
    case = 0
    for algo in ("auto", "flat", "rsag"):
        comm.set_algorithm("allreduce", algo)
        for dtype in ("float16", "bfloat16", "float32", "float64"):
            for count in (1, 333, 5000, 3 * SLOT // itemsize(dtype) + 7):
                for op in ("sum", "avg"):
                    case += 1
                    rng = [np.random.default_rng([case, r, 99]) for r in range(P)]
                    # magnitudes spread over 2^-10..2^10: sums round, and the order matters
                    ins = [round_to(g.standard_normal(count) * 2.0 ** g.integers(-10, 11, count), dtype)
                           for g in rng]
                    buf = to_buf(ins[me], dtype)
                    comm.allreduce(buf, op=op)
                    tag = f"{dtype} {op} n={count} algo={algo}"
                    chk.same(buf, model(ins, op, dtype), dtype, f"left-to-right model {tag}")
                    mine = bits(buf).view(np.uint8)
                    every = comm.allgather(mine)
                    chk.true(all(np.array_equal(every[r], mine) for r in range(P)),
                             f"ranks got different bits: {tag}")
                    if op == "sum":  # the same order in reduce and reduce_scatter
                        root = case % P
                        r = comm.reduce(to_buf(ins[me], dtype), root=root)
                        if me == root:
                            chk.same(r, buf, None, f"reduce == allreduce {tag}")
    return chk.done()


@pytest.mark.parametrize("P", [2, 3, 5, 8])
def test_float_sums_bitwise_identical(run_ranks, P):
    run_ranks(P, bitwise_rank, timeout=300)
