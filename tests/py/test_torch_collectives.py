"""hbmcoll.torch: what each torch.distributed call of the backend "hbmcoll" computes, against gloo.

Every collective (all_reduce, reduce, reduce_scatter[_tensor], broadcast, gather, scatter,
all_gather[_into_tensor], all_to_all[_single], even and uneven) x dtype x op, contiguous or not,
blocking and async; PREMUL_SUM, many async works with their futures, coalesced and object
collectives, sub-groups (members and non-members), bad arguments that fail before any
communication, and ranks that disagree on a count (MismatchError, not a hang).

Every rank job initialises torch.distributed with backend "hbmcoll" and also makes a gloo group of
the same ranks, runs each case through both and compares in the rank (inputs are made from
(case, rank), so both backends see the same data). Where gloo has no answer (AVG on integers,
int16/uint16 tensors, PREMUL_SUM) the rank computes the reference itself from every rank's input.
Mismatches are collected and reported together at the end of a job. Starting processes that
import torch costs seconds, so one job runs the whole family of cases. Training, failures and
launchers: test_torch_jobs.py.
"""

import time

import pytest

from ranks import destroy_torch, free_port, init_torch

torch = pytest.importorskip("torch")


# ---- in the ranks ---------------------------------------------------------------------------------

def _data(seed, rank, shape, dtype):
    """Deterministic input of case `seed` on `rank`; values keep products and sums in range."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
    if dtype.is_floating_point:
        return (0.5 + torch.rand(shape, generator=g)).to(dtype)   # [0.5, 1.5): prod stays sane
    lo, hi = (0, 4) if dtype in (torch.uint8, torch.uint16) else (-3, 4)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def _close(a, b, dtype):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if dtype in (torch.float16, torch.bfloat16):
        tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
        return torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)
    if dtype.is_floating_point or dtype.is_complex:
        tol = 1e-5 if dtype in (torch.float32, torch.complex64) else 1e-12
        return torch.allclose(a, b, rtol=tol, atol=tol)
    return torch.equal(a, b)


class Checker:
    def __init__(self):
        self.fails = []
        self.count = 0

    def __call__(self, name, got, want, dtype=None):
        self.count += 1
        if isinstance(got, (list, tuple)):
            ok = len(got) == len(want) and all(_close(g, w, dtype or w.dtype)
                                                for g, w in zip(got, want))
        else:
            ok = _close(got, want, dtype or want.dtype)
        if not ok:
            self.fails.append(f"{name}: got {got!r}\n   want {want!r}"[:600])


def _local_reduce(xs, kind):
    """Reference reduction of the ranks' inputs xs (in rank order), computed in the rank."""
    R = torch.distributed.ReduceOp
    dtype = xs[0].dtype
    if not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool):
        xs = [x.to(torch.int64) for x in xs]   # uint16 has no arithmetic in torch
    acc = xs[0].clone()
    for x in xs[1:]:
        if kind == R.SUM or kind == R.AVG:
            acc = acc + x
        elif kind == R.PRODUCT:
            acc = acc * x
        elif kind == R.MIN:
            acc = torch.minimum(acc, x)
        elif kind == R.MAX:
            acc = torch.maximum(acc, x)
        elif kind == R.BAND:
            acc = acc & x
        elif kind == R.BOR:
            acc = acc | x
        elif kind == R.BXOR:
            acc = acc ^ x
    if kind == R.AVG:
        acc = acc / len(xs) if acc.is_floating_point() or acc.is_complex() \
            else torch.div(acc, len(xs), rounding_mode="trunc")
    return acc.to(dtype)


FLOATS = ["float32", "float64", "float16", "bfloat16"]
INTS = ["int8", "uint8", "int32", "int64"]
EXTRA = ["bool", "int16", "uint16", "complex64"]


def rank_collectives(comm, port):
    """Every collective x dtype x op through hbmcoll and through gloo (3 ranks)."""
    # slow to import (torch._dynamo): before the ranks start waiting on each other
    import torch.distributed._functional_collectives as fc

    dist, gloo = init_torch(comm, port)
    R = dist.ReduceOp
    r, P = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "hbmcoll"
    check = Checker()
    pg = dist.distributed_c10d._get_default_group()
    assert pg.name() == "hbmcoll" and pg.group_name, (pg.name(), pg.group_name)
    check("functional all_reduce", fc.wait_tensor(fc.all_reduce(torch.ones(2), "sum", pg)),
          torch.full((2,), float(P)))
    seed = [0]

    def case():
        seed[0] += 1
        return seed[0]

    ops = {"sum": R.SUM, "avg": R.AVG, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX,
           "band": R.BAND, "bor": R.BOR, "bxor": R.BXOR}
    for dname in FLOATS + INTS + EXTRA:
        dtype = getattr(torch, dname)
        for oname, op in ops.items():
            if oname in ("band", "bor", "bxor") and (dtype.is_floating_point or dtype.is_complex):
                continue
            if dtype.is_complex and oname not in ("sum", "avg"):
                continue
            if dtype == torch.bool and oname == "avg":
                continue
            gloo_ok = dname not in ("int16", "uint16") and not (oname == "avg" and
                                                               not dtype.is_floating_point)
            for shape, noncontig in (((37,), False), ((5, 6), True), ((), False), ((3000,), False)):
                s = case()
                xs = [_data(s, q, shape, dtype) for q in range(P)]
                x = xs[r]
                if noncontig:
                    x = x.t()
                if gloo_ok:
                    want = x.clone(memory_format=torch.contiguous_format)
                    dist.all_reduce(want, op, group=gloo)
                else:
                    want = _local_reduce(xs, op)
                    want = want.t() if noncontig else want
                got = x.clone()  # keeps x's strides
                assert got.is_contiguous() != noncontig
                dist.all_reduce(got, op)
                check(f"all_reduce {dname} {oname} {shape} nc={noncontig}", got, want, dtype)
                # async
                got2 = x.clone()
                w = dist.all_reduce(got2, op, async_op=True)
                w.wait()
                check(f"all_reduce async {dname} {oname} {shape}", got2, want, dtype)
            # reduce (to every root) and reduce_scatter, on a (P, 5) input
            for root in range(P):
                s = case()
                x = _data(s, r, (11,), dtype)
                a, b = x.clone(), x.clone()
                if gloo_ok:
                    dist.reduce(b, root, op, group=gloo)
                else:
                    b = _local_reduce([_data(s, q, (11,), dtype) for q in range(P)], op) \
                        if r == root else b
                dist.reduce(a, root, op)
                if r == root:
                    check(f"reduce {dname} {oname} root={root}", a, b, dtype)
            s = case()
            xs = [_data(s, q, (P, 5), dtype) for q in range(P)]
            if gloo_ok and dtype != torch.complex64:
                want = torch.empty(5, dtype=dtype)
                dist.reduce_scatter(want, list(xs[r].unbind(0)), op, group=gloo)
            else:
                want = _local_reduce(xs, op)[r]
            got = torch.empty(5, dtype=dtype)
            dist.reduce_scatter(got, [t.clone() for t in xs[r].unbind(0)], op)
            check(f"reduce_scatter {dname} {oname}", got, want, dtype)
            got = torch.empty(5, dtype=dtype)
            dist.reduce_scatter_tensor(got, xs[r].clone(), op)
            check(f"reduce_scatter_tensor {dname} {oname}", got, want, dtype)
            w = dist.reduce_scatter_tensor(got2 := torch.empty(5, dtype=dtype), xs[r].clone(), op,
                                           async_op=True)
            w.wait()
            check(f"reduce_scatter_tensor async {dname} {oname}", got2, want, dtype)

        # data movement; gloo moves what it lacks (int16, uint16; complex gather) as bytes
        view = {torch.int16: torch.int8, torch.uint16: torch.uint8,
                torch.complex64: torch.float32}.get(dtype)

        def gv(t, view=view):
            return t.view(view) if view is not None else t

        def gvs(ts):
            return None if ts is None else [gv(t) for t in ts]

        for root in range(P):
            s = case()
            x = _data(s, r, (4, 7), dtype)
            a, b = x.clone(), x.clone()
            dist.broadcast(gv(b), root, group=gloo)
            dist.broadcast(a, root)
            check(f"broadcast {dname} root={root}", a, b)
            a = x.clone().t()  # non-contiguous, in place
            dist.broadcast(a, root)
            check(f"broadcast non-contig {dname} root={root}", a, b.t())
            # gather / scatter
            outs = [torch.empty(4, 7, dtype=dtype) for _ in range(P)] if r == root else None
            outs_g = [torch.empty(4, 7, dtype=dtype) for _ in range(P)] if r == root else None
            dist.gather(x, outs, dst=root)
            dist.gather(gv(x), gvs(outs_g), dst=root, group=gloo)
            if r == root:
                check(f"gather {dname} root={root}", outs, outs_g)
            ins = [_data(s + 100, q, (3,), dtype) for q in range(P)] if r == root else None
            o1, o2 = torch.empty(3, dtype=dtype), torch.empty(3, dtype=dtype)
            dist.scatter(o1, ins, src=root)
            dist.scatter(gv(o2), gvs(ins), src=root, group=gloo)
            check(f"scatter {dname} root={root}", o1, o2)
        s = case()
        x = _data(s, r, (2, 3), dtype)
        a = [torch.empty(2, 3, dtype=dtype) for _ in range(P)]
        b = [torch.empty(2, 3, dtype=dtype) for _ in range(P)]
        dist.all_gather(a, x)
        dist.all_gather(gvs(b), gv(x), group=gloo)
        check(f"all_gather {dname}", a, b)
        a = [torch.empty(3, 2, dtype=dtype).t() for _ in range(P)]  # non-contiguous outputs
        dist.all_gather(a, x.t().contiguous().t())
        check(f"all_gather non-contig {dname}", a, b)
        o = torch.empty(P * 2, 3, dtype=dtype)
        dist.all_gather_into_tensor(o, x)
        check(f"all_gather_into_tensor {dname}", o, torch.cat(b))
        o = torch.empty(P, 2, 3, dtype=dtype)
        w = dist.all_gather_into_tensor(o, x, async_op=True)
        w.wait()
        check(f"all_gather_into_tensor async {dname}", o, torch.stack(b))
        # all_to_all with equal and uneven blocks
        ins = [_data(s + q, r, (q + r + 1,), dtype) for q in range(P)]   # to rank q
        outs = [torch.empty(r + q + 1, dtype=dtype) for q in range(P)]  # from rank q
        dist.all_to_all(outs, ins)  # gloo has no uneven all_to_all: what rank q sent us
        check(f"all_to_all uneven {dname}", outs,
              [_data(s + r, q, (r + q + 1,), dtype) for q in range(P)])
        ins = [_data(s + q, r, (2, 2), dtype) for q in range(P)]
        outs = [torch.empty(2, 2, dtype=dtype) for q in range(P)]
        outs_g = [torch.empty(2, 2, dtype=dtype) for q in range(P)]
        dist.all_to_all(outs, ins)
        dist.all_to_all(gvs(outs_g), gvs(ins), group=gloo)
        check(f"all_to_all {dname}", outs, outs_g)
        x = _data(s, r, (P * 4, 2), dtype)
        a, b = torch.empty_like(x), torch.empty_like(x)
        dist.all_to_all_single(a, x)
        dist.all_to_all_single(gv(b), gv(x), group=gloo)
        check(f"all_to_all_single {dname}", a, b)
        in_splits = [q + 1 for q in range(P)]
        out_splits = [r + 1] * P
        x = _data(s + 7, r, (sum(in_splits), 3), dtype)
        a = torch.empty(sum(out_splits), 3, dtype=dtype)
        b = torch.empty(sum(out_splits), 3, dtype=dtype)
        dist.all_to_all_single(a, x, out_splits, in_splits)
        dist.all_to_all_single(gv(b), gv(x), out_splits, in_splits, group=gloo)
        check(f"all_to_all_single uneven {dname}", a, b)

    # PREMUL_SUM: sum of factor * x
    s = case()
    xs = [_data(s, q, (9,), torch.float32) for q in range(P)]
    got = xs[r].clone()
    dist.all_reduce(got, dist._make_nccl_premul_sum(0.5))
    check("all_reduce premul_sum", got, 0.5 * sum(xs))

    # many async works in flight, waited on in reverse order, and futures
    works, tensors = [], []
    for i in range(20):
        t = torch.full((1000 * (i % 3 + 1),), float(r + i))
        tensors.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    futs = [w.get_future() for w in works]
    for w in reversed(works):
        assert w.wait()
    for i, t in enumerate(tensors):
        check(f"async #{i}", t, torch.full_like(t, sum(q + i for q in range(P))))
    # futures are completed by the backend's threads just after wait() returns: wait for them
    torch.futures.wait_all(futs)
    assert all(f.done() for f in futs) and all(w.is_completed() for w in works)
    t = torch.ones(10)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    check("future then", fut.wait(), torch.full((10,), 2.0 * P))
    t = torch.ones(3)
    w = dist.all_reduce(t, async_op=True)
    while not w.is_completed():
        time.sleep(0.001)
    check("is_completed polling", t, torch.full((3,), float(P)))
    w = dist.barrier(async_op=True)
    w.wait()
    dist.barrier()

    # coalesced, objects
    ts = [torch.full((3,), float(r)), torch.full((2, 2), float(r + 1))]
    ws = [t.clone() for t in ts]
    dist.all_reduce_coalesced(ts)
    dist.all_reduce_coalesced(ws, group=gloo)
    check("all_reduce_coalesced", ts, ws)
    objs = [None] * P
    dist.all_gather_object(objs, {"rank": r, "x": [r] * r})
    assert objs == [{"rank": q, "x": [q] * q} for q in range(P)], objs
    lst = [f"from {r}", r]
    dist.broadcast_object_list(lst, src=P - 1)
    assert lst == [f"from {P - 1}", P - 1], lst

    # sub-groups: every rank calls new_group; non-members get GroupMember.NON_GROUP_MEMBER
    members = [0, P - 1]
    sub = dist.new_group(members)                       # backend of the default group: hbmcoll
    sub_gloo = dist.new_group(members, backend="gloo")
    odd = dist.new_group([q for q in range(P) if q % 2 == 1])
    if r in members:
        assert dist.get_backend(sub) == "hbmcoll" and sub.size() == 2
        for dname in ("float32", "int64", "bfloat16"):
            dtype = getattr(torch, dname)
            x = _data(case(), r, (100,), dtype)
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, group=sub)
            dist.all_reduce(b, group=sub_gloo)
            check(f"subgroup all_reduce {dname}", a, b, dtype)
            a, b = x.clone(), x.clone()
            dist.broadcast(a, src=P - 1, group=sub)     # global rank of the source
            dist.broadcast(b, src=P - 1, group=sub_gloo)
            check(f"subgroup broadcast {dname}", a, b)
            o1 = [torch.empty_like(x) for _ in members]
            o2 = [torch.empty_like(x) for _ in members]
            dist.all_gather(o1, x, group=sub)
            dist.all_gather(o2, x, group=sub_gloo)
            check(f"subgroup all_gather {dname}", o1, o2)
        w = dist.all_reduce(torch.ones(5), group=sub, async_op=True)
        w.wait()
    else:
        assert sub == dist.GroupMember.NON_GROUP_MEMBER
    if r % 2 == 1:
        t = torch.ones(4)
        dist.all_reduce(t, group=odd)
        check("odd group", t, torch.full((4,), float(len(range(1, P, 2)))))
    dist.barrier()
    # the world communicator keeps working after sub-groups were used
    t = torch.full((8,), float(r))
    dist.all_reduce(t)
    check("world after subgroups", t, torch.full((8,), float(sum(range(P)))))

    # point-to-point: a ring of isend/irecv, then a recv from any source
    out = torch.empty(4)
    for w in [dist.isend(torch.full((4,), float(r)), (r + 1) % P), dist.irecv(out, (r - 1) % P)]:
        w.wait()
    check("isend/irecv ring", out, torch.full((4,), float((r - 1) % P)))
    if r == 0:
        src = dist.recv(out)
        check("recv from any source", torch.tensor([float(src)]), torch.tensor([1.0]))
    elif r == 1:
        dist.send(torch.full((4,), 7.0), 0)

    # bad arguments: errors before any communication, the group stays usable
    errs = []
    for bad in (lambda: dist.send(torch.ones(1), (r + 1) % P, tag=-1),
                lambda: dist.all_gather([torch.empty(2)] * P, torch.ones(3)),
                lambda: dist.all_reduce(torch.ones(2), dist.ReduceOp.BAND)):
        try:
            bad()
            errs.append("no error")
        except (NotImplementedError, ValueError, RuntimeError) as e:
            errs.append(type(e).__name__)
    t = torch.ones(2)
    dist.all_reduce(t)
    check("usable after bad arguments", t, torch.full((2,), float(P)))

    # ranks that disagree (count) get an error, not a hang; the communicator is then closed
    import hbmcoll
    try:
        dist.all_reduce(torch.ones(10 + r))
        mismatch = "no error"
    except hbmcoll.MismatchError:
        mismatch = "MismatchError"
    destroy_torch(dist)
    return {"fails": check.fails, "checked": check.count, "errs": errs, "mismatch": mismatch}


def test_collectives_match_gloo(run_ranks):
    res = run_ranks(3, rank_collectives, free_port(), timeout=300,
                    env={"HBMCOLL_TIMEOUT": "120"})   # generous: the machine may be shared
    fails = [f for r in res for f in r["fails"]]
    assert not fails, f"{len(fails)} mismatches, first ones:\n" + "\n".join(fails[:15])
    assert res[0]["checked"] > 500
    for r in res:
        assert r["errs"] == ["ArgumentError", "ArgumentError", "ArgumentError"], r["errs"]
        assert r["mismatch"] == "MismatchError"


def rank_inline_works(comm, port):
    """Async collectives run in the caller's thread (HBMCOLL_TORCH_INLINE=1) return complete
    Works that keep the Work contract: wait() with or without a timeout, futures, result()."""
    from datetime import timedelta
    dist, _ = init_torch(comm, port)
    P = dist.get_world_size()
    got = []
    t = torch.ones(4)
    w = dist.all_reduce(t, async_op=True)
    got += [w.is_completed(), w.wait(timeout=timedelta(seconds=5)), w.wait(5), w.wait(),
            w.is_success(), w.exception() is None]
    got.append(bool(torch.equal(w.get_future().wait()[0], torch.full((4,), float(P)))))
    got.append(bool(torch.equal(w.result()[0], t)))
    outs = [torch.empty(2) for _ in range(P)]
    w = dist.all_gather(outs, torch.full((2,), float(dist.get_rank())), async_op=True)
    got += [w.wait(timeout=timedelta(seconds=1)), [float(o[0]) for o in outs] == list(map(float, range(P)))]
    w = dist.barrier(async_op=True)
    got += [w.wait(timeout=timedelta(seconds=1)), w.get_future().done()]
    destroy_torch(dist)
    return got


def test_inline_works_keep_the_work_contract(run_ranks):
    for got in run_ranks(2, rank_inline_works, free_port(), timeout=120,
                         env={"HBMCOLL_TORCH_INLINE": "1"}):
        assert got == [True] * len(got), got
