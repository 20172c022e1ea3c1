"""hbmcoll.torch in whole jobs: training, the job's life and its failures, the launchers.

DDP over hbmcoll (plain, small buckets with gradient views, comm hooks, initial weight sync) and
the Horovod-style DistributedOptimizer and helpers must end with the weights of the same training
over gloo, with DDP's allreduces on hbmcoll's threads or inline. A rank that dies mid-training
makes the others raise PeerLostError fast; work.wait(timeout) raises TimeoutError and leaves the
collective in flight; hvd.init()/shutdown() take and leave (or close) the communicator; and
examples/torch_ddp.py runs under hbmcoll-run and torchrun. What each collective computes:
test_torch_collectives.py.
"""

import os
import shutil
import subprocess
import sys
import time

import pytest

from ranks import PYMOD, REPO, destroy_torch, free_port, init_torch

torch = pytest.importorskip("torch")


# ---- DDP and the Horovod-style optimizer -----------------------------------------------------------

def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def _batches(rank, steps, bs=16):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(bs, 1, 8, 8, generator=g), torch.randint(0, 10, (bs,), generator=g))
            for _ in range(steps)]


def _train(model, opt, batches, before_step=None):
    lossf = torch.nn.CrossEntropyLoss()
    for x, y in batches:
        opt.zero_grad()
        lossf(model(x), y).backward()
        if before_step is not None:
            before_step()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def rank_training(comm, port):
    """DDP over hbmcoll vs DDP over gloo (plain, comm hooks), and hbmcoll.torch's
    DistributedOptimizer vs gloo DDP: same seeds and data, weights must end equal."""
    dist, gloo = init_torch(comm, port, use_env=False)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hbmcoll.torch as hvd

    r = dist.get_rank()
    pg = dist.distributed_c10d._get_default_group()
    launcher = pg.comm.launcher
    batches = _batches(r, 6)
    out = {"launcher": launcher, "diffs": {}}

    def run(group, hook=None, bucket_mb=25, grad_view=False, model_seed=1):
        m = _model(model_seed)
        ddp = DDP(m, process_group=group, bucket_cap_mb=bucket_mb,
                  gradient_as_bucket_view=grad_view)
        if hook is powerSGD.powerSGD_hook:
            state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                           start_powerSGD_iter=2, min_compression_rate=0.5,
                                           random_seed=0)
            ddp.register_comm_hook(state, hook)
        elif hook is not None:
            ddp.register_comm_hook(group, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        return _train(ddp, opt, batches)

    def maxdiff(a, b):
        return max(float((x - y).abs().max()) for x, y in zip(a, b))

    ref = run(gloo)
    out["diffs"]["ddp"] = maxdiff(run(pg), ref)
    out["diffs"]["ddp small buckets, grad views"] = maxdiff(run(pg, bucket_mb=0.001,
                                                                grad_view=True),
                                                            run(gloo, bucket_mb=0.001,
                                                                grad_view=True))
    out["diffs"]["ddp allreduce_hook"] = maxdiff(run(pg, default_hooks.allreduce_hook),
                                                 run(gloo, default_hooks.allreduce_hook))
    out["diffs"]["ddp fp16_compress_hook"] = maxdiff(run(pg, default_hooks.fp16_compress_hook),
                                                     run(gloo, default_hooks.fp16_compress_hook))
    out["diffs"]["ddp powerSGD_hook"] = maxdiff(run(pg, powerSGD.powerSGD_hook),
                                                run(gloo, powerSGD.powerSGD_hook))
    # DDP syncs the initial weights from rank 0: different seeds per rank end equal too
    w = run(pg, model_seed=10 + r)
    out["init_sync"] = [float(t.sum()) for t in w]
    out["ddp_arena"] = ddp_arena_state(pg, batches)

    # Horovod style, no DDP: broadcast from rank 0, DistributedOptimizer averages the gradients
    hvd.init()
    assert hvd.size() == dist.get_world_size() and hvd.rank() == r
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)  # one node
    for kw in ({}, {"bucket_cap_mb": 0.001}):
        m = _model(20 + r)                 # different on every rank until the broadcast
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        dopt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters(), **kw)
        hvd.broadcast_optimizer_state(dopt, root_rank=0)
        got = _train(m, dopt, batches)
        want = run(gloo, model_seed=20)    # DDP broadcasts rank 0's weights (seed 20)
        out["diffs"][f"hvd optimizer {kw}"] = maxdiff(got, want)
        dopt.remove_hooks()
    # gradient clipping between synchronize() and step()
    m = _model(20)
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1))

    def clip():
        dopt.synchronize()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)

    lossf = torch.nn.CrossEntropyLoss()
    for x, y in batches[:3]:
        dopt.zero_grad()
        lossf(m(x), y).backward()
        clip()
        with dopt.skip_synchronize():
            dopt.step()
    out["clipped"] = [float(p.detach().sum()) for p in m.parameters()]
    # backward_passes_per_step=2: two local backward passes, one allreduce
    m = _model(20)
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                    backward_passes_per_step=2)
    dopt.zero_grad()
    for x, y in batches[:2]:
        lossf(m(x), y).backward()
    dopt.step()
    out["passes2"] = [float(p.detach().sum()) for p in m.parameters()]
    m2 = _model(20)
    opt2 = torch.optim.SGD(m2.parameters(), lr=0.1)
    ddp2 = DDP(m2, process_group=gloo)
    opt2.zero_grad()
    with ddp2.no_sync():
        lossf(ddp2(batches[0][0]), batches[0][1]).backward()
    lossf(ddp2(batches[1][0]), batches[1][1]).backward()
    opt2.step()
    out["diffs"]["hvd backward_passes_per_step=2"] = maxdiff(list(m.parameters()),
                                                             list(m2.parameters()))
    # helpers
    t = torch.full((4,), float(r))
    out["allreduce"] = hvd.allreduce(t).tolist()                    # Average
    out["allreduce_sum"] = hvd.allreduce(t, op=hvd.Sum).tolist()
    out["allgather"] = hvd.allgather(torch.full((r + 1, 2), r)).tolist()
    out["broadcast"] = hvd.broadcast(torch.tensor([r, r]), root_rank=1).tolist()
    x = torch.full((3,), float(r + 1), requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    out["allreduce_grad"] = x.grad.tolist()
    out["object"] = hvd.broadcast_object({"r": r}, root_rank=1)
    out["objects"] = hvd.allgather_object(r * 10)
    destroy_torch(dist)
    return out


def ddp_arena_state(pg, batches):
    """Where a DDP model over hbmcoll keeps its buckets after two steps, which hook it got, and
    what registering a hook of one's own then says."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hbmcoll.torch
    from hbmcoll.torch import ddp as _torch_ddp

    m = DDP(_model(1), process_group=pg, bucket_cap_mb=0.001, gradient_as_bucket_view=True)
    _train(m, torch.optim.SGD(m.parameters(), lr=0.1), batches[:2])
    state = {"hooks": [h.__qualname__ for h, _ in m._comm_hooks],
             "grads_in_arena": [p.grad.untyped_storage().data_ptr() in _torch_ddp._in_arena
                                for p in m.parameters()]}
    try:
        m.register_comm_hook(pg, hbmcoll.torch.allreduce_hook)
        state["late"] = None
    except hbmcoll.ArgumentError as e:
        state["late"] = str(e)
    return state


@pytest.mark.parametrize("inline", ["0", "1"])
def test_ddp_and_optimizer_match_gloo(run_ranks, inline):
    """inline=0: DDP's allreduces run on hbmcoll's progress thread and completer threads
    complete the futures (what happens when a rank may use several CPUs); inline=1: they run
    in the caller's thread (the default when hbmcoll-run binds each rank to one CPU)."""
    res = run_ranks(2, rank_training, free_port(), timeout=300,
                    env={"HBMCOLL_TORCH_INLINE": inline, "HBMCOLL_TIMEOUT": "120"})
    for r, out in enumerate(res):
        assert out["launcher"] == "torch.distributed"   # bootstrapped through the Store
        bad = {k: v for k, v in out["diffs"].items() if not v <= 2e-5}
        assert not bad, f"rank {r}: weights differ from gloo's: {bad}"
    for key in ("init_sync", "clipped", "passes2"):
        assert res[0][key] == res[1][key], key
    assert res[0]["allreduce"] == [0.5] * 4 and res[1]["allreduce_sum"] == [1.0] * 4
    assert res[0]["allgather"] == [[0, 0], [1, 1], [1, 1]]
    assert res[0]["broadcast"] == [1, 1]
    assert res[0]["allreduce_grad"] == [2.0] * 3      # d(sum over ranks)/dx, summed
    assert res[0]["object"] == {"r": 1} and res[1]["objects"] == [0, 10]
    for out in res:  # DDP's buckets were moved into the shared arena (gradient views show it)
        arena = out["ddp_arena"]
        assert arena["hooks"] == ["allreduce_hook"] and all(arena["grads_in_arena"]), arena
        assert "register yours before the first forward" in arena["late"], arena


# ---- failures ------------------------------------------------------------------------------------

def rank_dies(comm, port, mode):
    """Rank 1 dies in the middle of training (mode "ddp": before its backward pass; "dist":
    before an all_reduce, which rank 0 makes blocking and rank 2 async); the others must get an
    exception, fast."""
    dist, _ = init_torch(comm, port)
    import hbmcoll
    from torch.nn.parallel import DistributedDataParallel as DDP

    r = dist.get_rank()
    m = DDP(_model(1))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    lossf = torch.nn.CrossEntropyLoss()
    t0 = time.monotonic()
    try:
        for step, (x, y) in enumerate(_batches(r, 50)):
            if step == 3 and r == 1 and mode == "ddp":
                os._exit(7)
            opt.zero_grad()
            lossf(m(x), y).backward()
            opt.step()
            if step == 3 and r == 1:
                os._exit(7)
            if r == 2:   # the same collective: rank 0 waits in it, rank 2 in work.wait()
                w = dist.all_reduce(torch.ones(10), async_op=True)
                w.wait()
            else:
                dist.all_reduce(torch.ones(10))
    except Exception as e:  # noqa: BLE001
        return {"exc": type(e).__name__, "msg": str(e)[:300],
                "peer_lost": isinstance(e, hbmcoll.PeerLostError) or "PeerLostError" in str(e),
                "after": time.monotonic() - t0, "step": step}
    return {"exc": None}


@pytest.mark.parametrize("mode", ["ddp", "ddp-inline", "dist"])
def test_dead_rank_raises(run_ranks, mode):
    env = {"HBMCOLL_TIMEOUT": "60", "HBMCOLL_TORCH_INLINE": "1" if mode == "ddp-inline" else "0"}
    res = run_ranks(3, rank_dies, free_port(), mode.split("-")[0], timeout=120, env=env,
                    check=False)
    assert res[1].status == "died" and res[1].returncode == 7, res[1].describe()
    for r in (0, 2):
        assert res[r].status == "ok", res[r].describe()
        v = res[r].value
        assert v["exc"] is not None, f"rank {r} trained on without its peer"
        assert v["peer_lost"], v
        assert v["step"] == 3, v
        assert v["after"] < 30, v   # well before HBMCOLL_TIMEOUT: found dead, not timed out
        if not mode.startswith("ddp"):
            assert v["exc"] == "PeerLostError", v  # hbmcoll's own exception from dist.*


def rank_wait_timeout(comm, port):
    """Rank 1 joins an async all_reduce 1.5 s late: rank 0's work.wait(timedelta(0.2 s)) must
    raise TimeoutError while the collective stays in flight, and a second wait() must then
    give the right sum; the communicator keeps working after it."""
    import datetime

    dist, _ = init_torch(comm, port)
    import hbmcoll

    r = dist.get_rank()
    x = torch.full((1000,), float(r + 1))
    if r == 1:
        time.sleep(1.5)
    w = dist.all_reduce(x, async_op=True)
    timed_out = False
    if r == 0:
        try:
            w.wait(datetime.timedelta(seconds=0.2))
        except hbmcoll.TimeoutError:
            timed_out = True
    w.wait()
    y = torch.ones(4)
    dist.all_reduce(y)
    return timed_out, float(x[0]), float(y[0])


def rank_horovod_job(comm, port):
    """hvd.init() takes torch.distributed's hbmcoll communicator and hvd.shutdown() leaves it
    open; a communicator handed to hvd.init(comm) is closed by shutdown()."""
    dist, _ = init_torch(comm, port)
    import hbmcoll.torch as hvd

    c = hvd.init()
    out = [c is dist.distributed_c10d._get_default_group().comm, hvd.rank(), hvd.size(),
           hvd.join()]
    hvd.shutdown()
    x = torch.ones(3)
    dist.all_reduce(x)                       # still open
    out += [hvd.is_initialized(), float(x[0])]
    sub = comm.split(0)
    hvd.init(sub)
    hvd.barrier()
    hvd.shutdown()
    out.append(sub.closed)
    try:
        hvd.rank()
    except ValueError:
        out.append("not initialised")
    return out


def test_horovod_job(run_ranks):
    assert run_ranks(2, rank_horovod_job, free_port(), timeout=120) == [
        [True, r, 2, 1, False, 2.0, True, "not initialised"] for r in (0, 1)]


def rank_compression(comm):
    """Horovod's compression= and arguments: fp16 travels as float16 and comes back float32,
    gradients included; a DistributedOptimizer with fp16 trains as fp32 does, within float16's
    precision, and alike on every rank; unknown arguments are refused, not ignored."""
    import hbmcoll
    import hbmcoll.torch as hvd
    hvd.init(comm)
    me, fp16 = hvd.rank(), hvd.Compression.fp16
    t = hvd.allreduce(torch.full((4,), me + 0.5), compression=fp16)
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x * (me + 1), compression=fp16, op=hvd.Sum).sum().backward()
    out = [t.dtype == torch.float32, float(t[0]), x.grad.tolist()]

    def train(compression):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), compression=compression,
                                       sparse_as_dense=True)
        g = torch.Generator().manual_seed(me)
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(torch.randn(16, 8, generator=g)),
                                              torch.randint(0, 2, (16,), generator=g)).backward()
            opt.step()
        opt.remove_hooks()
        return torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    w16, w32 = train(fp16), train(None)
    out += [w16.dtype == torch.float32, float((w16 - w32).abs().max()) < 1e-2,
            len(set(hvd.allgather_object(w16.numpy().tobytes()))) == 1]
    sgd = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    for kw, error in (({"bogus": 1}, TypeError), ({"num_groups": 2}, hbmcoll.NotSupportedError),
                      ({"compression": "fp16"}, hbmcoll.ArgumentError)):
        try:
            hvd.DistributedOptimizer(sgd, **kw)
            out.append(f"{kw} accepted")
        except error:
            out.append("refused")
    hvd.shutdown()
    return out


def test_horovod_compression_and_arguments(run_ranks):
    # x's gradient: the Sum allreduce's gradient is the Sum of the ranks' (2), times rank + 1
    assert run_ranks(2, rank_compression, timeout=120) == [
        [True, 1.0, [2.0 * (r + 1)] * 3, True, True, True, "refused", "refused", "refused"] for r in (0, 1)]


def test_work_wait_timeout(run_ranks):
    res = run_ranks(2, rank_wait_timeout, free_port(), timeout=120,
                    env={"HBMCOLL_TORCH_INLINE": "0"})
    assert res == [(True, 3.0, 2.0), (False, 3.0, 2.0)]


# ---- the example under both launchers ----------------------------------------------------------------

def _launch_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HBMCOLL_RANK", "HBMCOLL_SIZE", "HBMCOLL_LOCAL", "HBMCOLL_JOB_KEY"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYMOD), env.get("PYTHONPATH")]))
    env.update(HBMCOLL_QUIET="1", HBMCOLL_TIMEOUT="60", OMP_NUM_THREADS="1")
    return env


@pytest.mark.parametrize("launcher", ["hbmcoll-run", "torchrun"])
def test_example_ddp(launcher, tmp_path):
    script = os.path.join(REPO, "examples", "torch_ddp.py")
    args = [script, "--steps", "4", "--check"]
    if launcher == "hbmcoll-run":
        cmd = [sys.executable, "-m", "hbmcoll.run", "-n", "2", "--bind", "none"] + args
    else:
        if shutil.which("torchrun") is None:
            pytest.skip("torchrun is not installed")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(free_port())] + args
    p = subprocess.run(cmd, env=_launch_env(), capture_output=True, text=True, timeout=180,
                       cwd=str(tmp_path))
    assert p.returncode == 0, f"{cmd}:\n{p.stdout}\n{p.stderr[-4000:]}"
    assert "weights equal on all ranks" in p.stdout, p.stdout + p.stderr[-3000:]


NO_IMPORT_OF_OURS = r"""
import os, sys, torch, torch.distributed as dist
assert "hbmcoll" not in sys.modules, "import torch imported hbmcoll"
dist.init_process_group("hbmcoll")           # the one changed line: no import of hbmcoll
t = torch.full((3,), float(dist.get_rank() + 1))
dist.all_reduce(t)
assert type(dist.distributed_c10d._get_default_group()).__name__ == "ProcessGroupHbmcoll"
os.write(1, f"sum {t.tolist()}\n".encode())  # one write: the ranks share the pipe
dist.destroy_process_group()
"""


def test_init_process_group_needs_no_import_of_ours(tmp_path):
    """torch loads the backend through the "torch.backends" entry point the install carries."""
    script = tmp_path / "job.py"
    script.write_text(NO_IMPORT_OF_OURS)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), str(script)]
    p = subprocess.run(cmd, env=_launch_env(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("sum [3.0, 3.0, 3.0]") == 2, p.stdout


def _uneven_reference(P):
    """horovod_uneven_job.py's training in one process: at step k the gradients of the ranks
    that still have a batch are averaged; the weights after every step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = []
    for r in range(P):
        g = torch.Generator().manual_seed(10 + r)
        data.append([(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(3 + 2 * r)])
    after = []
    for k in range(3 + 2 * (P - 1)):
        grads = []
        for r in range(P):
            if k < len(data[r]):
                model.zero_grad()
                torch.nn.functional.cross_entropy(model(data[r][k][0]), data[r][k][1]).backward()
                grads.append([p.grad.clone() for p in model.parameters()])
        for p, *gs in zip(model.parameters(), *grads):
            p.grad = sum(gs) / len(gs)
        opt.step()
        after.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return after


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_a_horovod_script_with_uneven_data_joins(compression):
    """The ranks that run out of data join; the others' steps average over the ranks still in
    (against plain torch); join() gives the last rank on every rank."""
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_uneven_job.py")
    env = dict(os.environ, PYTHONPATH=str(PYMOD), HBMCOLL_BIND="none", HBMCOLL_TIMEOUT="60")
    res = subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", "3", sys.executable, job, compression],
                         capture_output=True, text=True, env=env, timeout=180)
    assert res.returncode == 0 and res.stdout.count("checks ok") == 3, res.stderr[-3000:]
    after = _uneven_reference(3)
    for line in res.stdout.splitlines():
        if line.startswith("rank"):
            f = line.split()
            r, last, seen = int(f[1]), int(f[3]), [int(v) for v in f[5:f.index("weights")]]
            w = torch.tensor([float(v) for v in f[f.index("weights") + 1:]])
            assert last == 2 and seen == [24, 24, 24, 16, 16, 8, 8][:3 + 2 * r], line
            tol = 2e-3 if compression == "fp16" else 1e-5  # float16 on the wire
            assert torch.allclose(w, after[2 + 2 * r], atol=tol), (r, (w - after[2 + 2 * r]).abs().max())


def rank_process_sets_and_sync_bn(comm):
    """Process sets: collectives on ranks 0 and 2 only (rank 1 is not asked), gradients through
    them, an optimizer over the set, a set added differently is a mismatch everywhere.
    SyncBatchNorm over 3 ranks' thirds of a batch: torch's BatchNorm2d on the whole batch."""
    import hbmcoll
    import hbmcoll.torch as hvd
    ps = hvd.ProcessSet([0, 2])
    hvd.init(comm, process_sets=[ps])
    r, out = hvd.rank(), {}
    if ps.included():
        x = torch.full((2,), float(r + 1), requires_grad=True)
        y = hvd.allreduce(x, op=hvd.Sum, process_set=ps)
        y.sum().backward()
        g = hvd.allgather(torch.tensor([float(r)]), process_set=ps)
        out["set"] = (ps.rank(), ps.size(), y.tolist(), x.grad.tolist(), g.tolist())
        m = torch.nn.Linear(2, 1)
        hvd.broadcast_parameters(m.state_dict(), root_rank=0, process_set=ps)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), process_set=ps)
        m(torch.full((1, 2), float(r))).sum().backward()
        opt.step()
        out["opt"] = len({str(w) for w in hvd.allgather_object(m.weight.detach().tolist(), process_set=ps)})
    else:
        try:
            hvd.allreduce(torch.ones(1), process_set=ps)
        except hbmcoll.ArgumentError as e:
            out["set"] = str(e)
    try:
        hvd.add_process_set([0, 1] if r == 0 else [1, 2])
    except hbmcoll.MismatchError:
        out["mismatch"] = True
    torch.manual_seed(0)
    whole = torch.randn(6, 3, 2, 2) * 3 + 1
    mine = whole[2 * r:2 * r + 2].clone().requires_grad_()
    bn = hvd.SyncBatchNorm(3)
    w = torch.arange(24.0).reshape(2, 3, 2, 2) + r
    (bn(mine) * w).sum().backward()
    wgrad = hvd.allreduce(bn.weight.grad, op=hvd.Sum)
    ref_bn, ref_x = torch.nn.BatchNorm2d(3), whole.clone().requires_grad_()
    (ref_bn(ref_x) * torch.cat([torch.arange(24.0).reshape(2, 3, 2, 2) + k for k in range(3)])).sum().backward()
    out["bn"] = [bool(torch.allclose(a, b, atol=1e-4)) for a, b in (
        (mine.grad, ref_x.grad[2 * r:2 * r + 2]), (wgrad, ref_bn.weight.grad),
        (bn.running_mean, ref_bn.running_mean), (bn.running_var, ref_bn.running_var))]
    return out


def test_process_sets_and_sync_batch_norm(run_ranks):
    res = run_ranks(3, rank_process_sets_and_sync_bn, timeout=120)
    assert res[0]["set"] == (0, 2, [4.0, 4.0], [2.0, 2.0], [0.0, 2.0]) and res[0]["opt"] == 1
    assert res[2]["set"] == (1, 2, [4.0, 4.0], [2.0, 2.0], [0.0, 2.0]) and res[2]["opt"] == 1
    assert "this rank is not in it" in res[1]["set"]
    assert all(r.get("mismatch") for r in res)
    assert all(r["bn"] == [True] * 4 for r in res), [r["bn"] for r in res]
