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

import os
import threading
import time

import numpy as np
import pytest

WORLD_SIZES = [1, 2, 3, 4, 5, 8]
NP_DTYPES = ["int8", "uint8", "int32", "int64", "float16", "float32", "float64"]
DTYPES = NP_DTYPES + ["bfloat16"]
OPS = ["sum", "prod", "min", "max", "avg"]
# staging slot and flat/rsag switch as the library sees them (defaults 256 KiB, 16 KiB); ranks
# of test_small_staging_slots get other values in their environment, and sizes follow
SLOT = int(os.environ.get("HBMCOLL_SLOT_BYTES") or 256 << 10)
SMALL_MAX = int(os.environ.get("HBMCOLL_SMALL_MAX") or 16 << 10)


# ---- data: inputs, the reduction model, comparisons ------------------------------------------

def itemsize(dtype):
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def is_int(dtype):
    return dtype in ("int8", "uint8", "int32", "int64")


def counts_for(dtype, P):
    """0, 1, odd, P*k+1, and a message of more than two staging slots (multi-chunk)."""
    es = itemsize(dtype)
    return [0, 1, 7, 1001, P * 37 + 1, 2 * (SLOT // es) + 5]


def bf16_bits(x):
    """float32 values -> bfloat16 bit patterns (uint16), rounded to nearest even (no NaNs)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def bf16_values(b):
    """bfloat16 bit patterns -> float32 values."""
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_to(x, dtype):
    """Values -> the nearest values of `dtype`, as float32 (float64 for float64) NumPy."""
    if dtype == "bfloat16":
        return bf16_values(bf16_bits(np.asarray(x, np.float32)))
    return np.asarray(x).astype(dtype).astype(np.float64 if dtype == "float64" else np.float32)


_BASES = {}


def rank_input(seed, rank, count, dtype, op, shape=None):
    """Rank `rank`'s input of case `seed`, as NumPy (bfloat16: float32 holding bfloat16 values).
    Large inputs are rotations of one random array per (dtype, op, count): cheap to make P times."""
    if count > 4096:
        key = (dtype, op, count)
        if key not in _BASES:
            _BASES[key] = _make_input([count, 12345], count, dtype, op)
        x = np.roll(_BASES[key], (seed * 131 + rank * 7919) % count)
        return x.reshape(shape) if shape is not None else x
    return _make_input([seed, rank + 1], count, dtype, op, shape)


def _make_input(seed, count, dtype, op, shape=None):
    rng = np.random.default_rng(seed)
    if is_int(dtype):
        info = np.iinfo(dtype)
        if op == "prod":
            vals = rng.choice(np.array([1, 2, 3] if dtype == "uint8" else [1, 2, -1]), count)
            x = vals.astype(dtype)
        else:  # full range: sums wrap around
            x = rng.integers(info.min, info.max, size=count, endpoint=True, dtype=dtype)
    else:
        if op in ("sum", "avg"):
            x = rng.integers(-8, 9, size=count).astype(np.float64)  # sums stay exact
        elif op == "prod":
            x = rng.choice(np.array([1.0, 2.0, -1.0, 0.5]), count)
        else:
            x = rng.standard_normal(count) * 100
        x = round_to(x, dtype)
    return x.reshape(shape) if shape is not None else x


def model(inputs, op, dtype):
    """The expected result as NumPy (bfloat16: float32 holding the bfloat16 result)."""
    P = len(inputs)
    if is_int(dtype):
        dt = np.dtype(dtype)
        st = np.stack(inputs)
        if op in ("sum", "avg"):
            s = np.add.reduce(st, axis=0, dtype=dt)  # wraps
            if op == "sum":
                return s
            s = s.astype(np.int64)
            q = s // P
            q[(s % P != 0) & (s < 0)] += 1  # C truncates toward zero
            return q.astype(dt)
        if op == "prod":
            return np.multiply.reduce(st, axis=0, dtype=dt)
        return st.min(axis=0) if op == "min" else st.max(axis=0)
    acc_t = np.float64 if dtype == "float64" else np.float32
    acc = np.asarray(inputs[0], dtype=acc_t).copy()
    for x in inputs[1:]:
        x = np.asarray(x, dtype=acc_t)
        if op in ("sum", "avg"):
            acc = acc + x
        elif op == "prod":
            acc = acc * x
        elif op == "min":
            acc = np.where(x < acc, x, acc)
        else:
            acc = np.where(x > acc, x, acc)
    if op == "avg":
        acc = acc / acc_t(P)
    return acc if dtype == "bfloat16" else acc.astype(dtype)


def to_buf(x, dtype, kind="numpy"):
    """A new buffer holding the values x (NumPy; torch for bfloat16 or kind='torch')."""
    if dtype == "bfloat16":
        import torch
        b = bf16_bits(np.asarray(x, np.float32))
        return torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)
    a = np.ascontiguousarray(np.asarray(x).astype(dtype))
    if kind == "torch":
        import torch
        return torch.from_numpy(a)
    return a


def empty_buf(shape, dtype, kind="numpy"):
    """A buffer for results, filled with 77 (not a plausible answer: a skipped write shows)."""
    if dtype == "bfloat16":
        return to_buf(np.full(shape, 77, np.float32), dtype)
    out = np.full(shape, 77, dtype=dtype)
    return to_buf(out, dtype, "torch") if kind == "torch" else out


def bits(x):
    """The raw bits of a buffer, as a flat unsigned NumPy array."""
    if type(x).__module__.startswith("torch"):
        import torch
        t = x.contiguous().reshape(-1)
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.view(torch.int16)
        return bits(t.numpy())
    if isinstance(x, np.ndarray):
        a = np.ascontiguousarray(x).reshape(-1)
        return a.view(f"u{a.itemsize}")
    return np.frombuffer(memoryview(x).cast("B"), dtype=np.uint8)


def want_bits(values, dtype):
    return bits(to_buf(values, dtype))


class Checker:
    """Collects wrong results (with the case) instead of stopping at the first one."""

    def __init__(self, comm):
        self.rank, self.size = comm.rank, comm.size
        self.fails = []
        self.checked = 0

    def same(self, got, want, dtype, what):
        """got: the library's buffer; want: expected values (model output or raw buffer)."""
        self.checked += 1
        g = bits(got)
        w = want_bits(want, dtype) if isinstance(want, np.ndarray) and dtype else bits(want)
        if g.shape != w.shape:
            self.fails.append(f"{what}: {g.size} elements, expected {w.size}")
            return False
        if not np.array_equal(g, w):
            bad = np.flatnonzero(g != w)
            self.fails.append(f"{what}: {bad.size}/{g.size} elements differ, first at "
                              f"{bad[:5].tolist()}: got bits {g[bad[:5]].tolist()} "
                              f"expected {w[bad[:5]].tolist()}")
            return False
        return True

    def true(self, cond, what):
        self.checked += 1
        if not cond:
            self.fails.append(what)

    def done(self):
        if self.fails:
            more = f"\n... and {len(self.fails) - 40} more" if len(self.fails) > 40 else ""
            raise AssertionError(f"rank {self.rank} of {self.size}: {len(self.fails)} wrong "
                                 f"results of {self.checked}:\n" + "\n".join(self.fails[:40]) + more)
        return self.checked


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

def data_input(seed, rank, count, dtype, shape=None):
    rng = np.random.default_rng([seed, rank, 7])
    x = rng.integers(0, 256, size=count * np.dtype(dtype).itemsize, dtype=np.uint8)
    x = x.view(dtype)  # any bit pattern: data movement must not touch it (NaNs included)
    return x.reshape(shape) if shape is not None else x


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


@pytest.mark.parametrize("cma", ["1", "0"])
def test_single_copy_bcast_gather(run_ranks, cma):
    """With HBMCOLL_CMA=1 large bcast and gather copy straight between the ranks' own NumPy
    arrays (the kernel allows it here: same PID namespace, no seccomp or Yama refusal); by
    default they stage through the segment. Both give the same results, in place included."""
    res = run_ranks(3, single_copy_rank, timeout=120, env={"HBMCOLL_CMA": cma})
    assert res == [[cma == "1"]] * 3


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


# ---- sub-communicators ------------------------------------------------------------------------

def split_rank(comm):
    P, me = comm.size, comm.rank
    chk = Checker(comm)
    half = comm.split(me % 2, key=me)
    peers = [r for r in range(P) if r % 2 == me % 2]
    chk.true(half.size == len(peers) and half.rank == peers.index(me),
             f"even/odd split: rank {half.rank} of {half.size}")
    rev = comm.split(0, key=-me)  # one group, reversed order
    chk.true(rev.size == P and rev.rank == P - 1 - me, f"reversed split: rank {rev.rank}")
    ties = comm.split(7, key=0)  # equal keys: old rank order
    chk.true(ties.rank == me, f"tied keys: rank {ties.rank}")
    none = comm.split(None if me == 0 else 1, key=me)
    if me == 0:
        chk.true(none is None, f"color None gave {none!r}")
    else:
        chk.true(none is not None and none.size == P - 1 and none.rank == me - 1,
                 f"color 1 without rank 0: {none!r}")

    order = rev.allgather(np.array([me], np.int64)).reshape(-1)
    chk.same(order, np.arange(P - 1, -1, -1, dtype=np.int64), None, "reversed split order")

    for it in range(4):  # collectives on the parent and the children, interleaved
        x = np.array([me + 1, it], np.int64)
        comm.allreduce(x)
        chk.same(x, np.array([P * (P + 1) // 2, P * it], np.int64), None, f"parent it={it}")
        y = np.full(1001, me + it, np.float64)
        half.allreduce(y)
        chk.true(bool(np.all(y == sum(r + it for r in peers))), f"half allreduce it={it}")
        b = np.array([me * 10 + it], np.int32)
        half.bcast(b, root=half.size - 1)
        chk.true(int(b[0]) == peers[-1] * 10 + it, f"half bcast it={it}: {b}")
        g = rev.gather(np.array([me], np.int32), root=0)
        if rev.rank == 0:
            chk.same(g.reshape(-1), np.arange(P - 1, -1, -1, dtype=np.int32), None, f"rev gather it={it}")
        if none is not None:
            z = none.allreduce(np.array([me], np.int64))
            chk.true(int(z[0]) == sum(range(1, P)), f"none allreduce it={it}")
        comm.barrier()

    # an arena array of one communicator used in another's collectives (ordinary memory there)
    a = half.empty(1001, "float32")
    a[:] = me
    comm.allreduce(a)
    chk.true(bool(np.all(a == sum(range(P)))), "child's arena array in a parent collective")
    b = comm.empty(1001, "float32")
    b[:] = me
    half.allreduce(b)
    chk.true(bool(np.all(b == sum(peers))), "parent's arena array in a child collective")

    # a split of a split, and a nonblocking collective on a child while the parent works
    quarter = half.split(half.rank % 2, key=0)
    q = quarter.allreduce(np.array([me], np.int64))
    qpeers = [r for i, r in enumerate(peers) if i % 2 == half.rank % 2]
    chk.true(int(q[0]) == sum(qpeers), f"nested split: {q} for {qpeers}")
    big = np.full(3 * SLOT // 4 + 1, float(me), np.float32)
    req = half.iallreduce(big)
    x = comm.allreduce(np.array([1], np.int32))
    req.wait()
    chk.true(int(x[0]) == P and bool(np.all(big == sum(peers))), "child iallreduce + parent")
    for c in (quarter, none, ties, rev, half):
        if c is not None:
            c.close()
    comm.barrier()  # the parent still works after its children are gone
    return chk.done()


@pytest.mark.parametrize("P", [2, 4, 5, 8])
def test_split(run_ranks, P):
    run_ranks(P, split_rank, timeout=120)


def deep_split_rank(comm, depth):
    from ranks import event

    c = comm
    for _ in range(depth):  # everyone stays together; only the key grows
        c = c.split(0, key=0)
    pair = c.split(c.rank // 2, key=0)  # {0, 1} and {2, 3}
    # Both pairs split again, so that pair {0, 1} is still meeting (rank 0 listening; rank 1 is
    # held by the test with SIGSTOP) when pair {2, 3} meets.
    if comm.rank == 0:
        time.sleep(1.0)
    elif comm.rank == 1:
        event("entering")
    else:
        time.sleep(2.0)
    again = pair.split(0, key=0)
    x = np.array([comm.rank], np.int64)
    again.allreduce(x)
    mates = [r for r in range(comm.size) if r // 2 == comm.rank // 2]
    assert again.size == len(mates) and int(x[0]) == sum(mates), (again.size, x)
    return again.size


def test_deeply_nested_split(start_ranks):
    """Bug: coll_comm_split (libcoll/src/comm.c) names a child "%.150s/s<n>.<color>" after its
    parent's key, cut to 150 characters. Past ~20 levels of nesting the part that told sibling
    groups apart is cut off, so two groups that split at the same time get the same key and
    meet on the same socket: one group's rank 0 cannot listen ('Address already in use'), or
    ranks of different groups end up in one communicator."""
    import signal

    job = start_ranks(4, deep_split_rank, 32, timeout=120, env={"HBMCOLL_TIMEOUT": "10"})
    job.wait_event(1, "entering")
    time.sleep(0.3)  # rank 1 is in pair {0, 1}'s split, waiting for rank 0
    job.signal(1, signal.SIGSTOP)
    time.sleep(3.0)  # rank 0 listens from ~1 s on; pair {2, 3} meets at ~2 s
    job.signal(1, signal.SIGCONT)
    job.join()
    assert job.check() == [2, 2, 2, 2]


# ---- nonblocking collectives ---------------------------------------------------------------------

def nonblocking_rank(comm):
    P, me = comm.size, comm.rank
    chk = Checker(comm)
    n = 3 * SLOT // 4 + 3
    # overlap with computation
    a = np.full(n, float(me), np.float32)
    req = comm.iallreduce(a)
    m = np.random.default_rng(me).standard_normal((200, 200))
    for _ in range(20):
        m = m @ m.T / 200
    res = req.wait()
    chk.true(res is a and req.done, "iallreduce: wait() returns buf and done is True")
    chk.true(bool(np.all(a == sum(range(P)))), "iallreduce overlapped with compute")

    # several outstanding requests of every kind; completed in the order issued
    bufs = [np.full(1000 + i, me + i, np.int64) for i in range(4)]
    bc = np.full(77, me, np.int32)
    ga = np.full(5, me, np.float64)
    sc_out = np.zeros(3, np.int32)
    sc_in = np.arange(P * 3, dtype=np.int32).reshape(P, 3) if me == 1 % P else None
    rs = np.ones((P, 9), np.float32) * (me + 1)
    a2a = np.arange(P * 2, dtype=np.int64).reshape(P, 2) + 100 * me
    rd = np.full(11, me, np.int64)
    reqs = [comm.iallreduce(bufs[0]), comm.ibcast(bc, root=P - 1), comm.iallreduce(bufs[1], op="max"),
            comm.iallgather(ga), comm.iscatter(sc_in, root=1 % P, out=sc_out),
            comm.ireduce_scatter(rs), comm.ialltoall(a2a), comm.ireduce(rd, root=0),
            comm.igather(np.array([me], np.int32), root=P - 1), comm.ibarrier(),
            comm.iallreduce(bufs[2], op="min"), comm.iallreduce(bufs[3], op="prod")]
    last = reqs[-1].wait()  # the last one first: all before it must be done by then
    chk.true(all(r.done for r in reqs), f"in-order completion: {[r.done for r in reqs]}")
    results = [r.wait() for r in reqs[:-1]] + [last]
    chk.true(bool(np.all(bufs[0] == sum(range(P)))), "iallreduce sum")
    chk.true(bool(np.all(bc == P - 1)), "ibcast")
    chk.true(bool(np.all(bufs[1] == P - 1 + 1)), "iallreduce max")
    chk.same(results[3], np.repeat(np.arange(P, dtype=np.float64), 5).reshape(P, 5), None, "iallgather")
    chk.same(sc_out, np.arange(3, dtype=np.int32) + 3 * me, None, "iscatter")
    chk.true(bool(np.all(results[5] == P * (P + 1) / 2)), "ireduce_scatter")
    want = np.stack([np.arange(2, dtype=np.int64) + 2 * me + 100 * q for q in range(P)])
    chk.same(results[6], want, None, "ialltoall")
    if me == 0:
        chk.true(bool(np.all(rd == sum(range(P)))), "ireduce root")
    else:
        chk.true(results[7] is None, "ireduce non-root")
    if me == P - 1:
        chk.same(results[8].reshape(-1), np.arange(P, dtype=np.int32), None, "igather")
    chk.true(results[9] is None, "ibarrier")
    chk.true(bool(np.all(bufs[2] == 2)), "iallreduce min")
    chk.true(bool(np.all(bufs[3] == np.prod([r + 3 for r in range(P)]))), "iallreduce prod")

    # wait(timeout) running out raises TimeoutError but leaves the request going
    import hbmcoll
    comm.barrier()
    if me == 0:
        time.sleep(0.3)
    w = np.full(5, me, np.int64)
    req = comm.iallreduce(w)
    if me != 0 and P > 1:
        try:
            req.wait(timeout=0)
            chk.true(False, "wait(timeout=0) returned while rank 0 was away")
        except hbmcoll.TimeoutError:
            pass
    req.wait(timeout=60)
    chk.true(bool(np.all(w == sum(range(P)))), "request after a wait that timed out")

    # a request dropped without wait(): it still completes (its owner waits for it on release)
    z = np.full(33, me, np.int32)
    comm.iallreduce(z)
    chk.true(bool(np.all(z == sum(range(P)))), "dropped request")

    # mixed with blocking calls: a blocking call issued after requests completes after them
    for it in range(5):
        x = np.full(SLOT // 4 + 1, me + it, np.float32)
        r1 = comm.iallreduce(x)
        y = comm.allreduce(np.array([me], np.int64))
        chk.true(r1.done, f"it={it}: blocking call returned before the earlier request")
        r2 = comm.iallreduce(np.array([it], np.int32))
        while not r2.test():
            pass
        chk.true(int(r2.wait()[0]) == P * it, f"it={it}: test() polling")
        r1.wait(timeout=30)
        chk.true(bool(np.all(x == sum(r + it for r in range(P)))) and int(y[0]) == sum(range(P)),
                 f"it={it}: mixed results")
    return chk.done()


@pytest.mark.parametrize("P", [1, 2, 3, 5])
def test_nonblocking(run_ranks, P):
    run_ranks(P, nonblocking_rank, timeout=120)


# ---- the GIL is released while waiting -----------------------------------------------------------

def thread_rank(comm, delay):
    me = comm.rank
    counts = {}
    stop = threading.Event()
    count = [0]

    def counter():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=counter, daemon=True)
    t.start()
    for kind in ("blocking", "request"):
        comm.barrier()
        if me == 1:
            time.sleep(delay)  # everyone else waits in the collective meanwhile
        before = count[0]
        x = np.array([me], np.int64)
        if kind == "blocking":
            comm.allreduce(x)
        else:
            comm.iallreduce(x).wait()
        counts[kind] = count[0] - before
        assert int(x[0]) == sum(range(comm.size))
    stop.set()
    t.join()
    # a collective run from a thread that is not the main one (the interrupt check takes the GIL
    # from there), handed the communicator with bind_thread()
    box = []
    worker = threading.Thread(target=lambda: (comm.bind_thread(), box.append(
        comm.allreduce(np.array([me + 1], np.int64)))))
    worker.start()
    worker.join(60)
    assert box and int(box[0][0]) == comm.size * (comm.size + 1) // 2, box
    if me != 1:  # waited about `delay` seconds: the other thread must have run meanwhile
        for kind, c in counts.items():
            assert c > 10000, f"{kind}: the counting thread advanced only {c} times during the wait"
    return counts


@pytest.mark.parametrize("P", [2, 3])
def test_thread_runs_during_wait(run_ranks, P):
    run_ranks(P, thread_rank, 1.0, timeout=60)


def contended_rank(comm, rounds):
    """Two threads of one rank share a communicator: the second waits (without the GIL) until
    the first's collective is over, then runs its own at once; the calls keep their order.
    Opted in with allow_any_thread(), as the torch backend does (by default a second thread is
    refused: test_trust.py)."""
    comm._c.allow_any_thread()
    me = comm.rank
    handoffs = []
    for _ in range(rounds):
        comm.barrier()  # both ranks start together
        if me == 0:
            ended = []

            def first():
                x = comm.allreduce(np.array([1], np.int64))
                ended.append(time.monotonic())
                assert int(x[0]) == comm.size

            t = threading.Thread(target=first)
            t.start()
            time.sleep(0.3)  # `first` now waits inside allreduce for rank 1
            t0 = time.monotonic()
            comm.barrier()  # must wait for `first` to finish, not run inside it
            done = time.monotonic()
            t.join(30)
            assert ended and done - t0 > 0.4, (ended, done - t0)
            handoffs.append(done - ended[0])
        else:
            time.sleep(1.0)
            x = comm.allreduce(np.array([1], np.int64))
            assert int(x[0]) == comm.size
            comm.barrier()
    if me == 0:  # woken when the flag is given back, not at the end of a 200 ms wait slice
        assert sorted(handoffs)[len(handoffs) // 2] < 0.05, handoffs
    return me


def test_threads_share_a_communicator(run_ranks):
    run_ranks(2, contended_rank, 3, timeout=60)


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
