"""DDP's gradient buckets in the shared arena (hbmcoll/torch/ddp.py): the ways DDP is used
(static graphs, unused parameters, no_sync, join with uneven inputs, several buckets, half
precision) end with the weights of the same training over gloo, and a bucket that stays in
private memory (turned off, or an arena too small) trains alike and says why once. Where the
buckets live in the common case and the hook's late-registration error: test_torch_jobs.py."""

import logging

import pytest

from ranks import destroy_torch, free_port, init_torch

torch = pytest.importorskip("torch")


class _Net(torch.nn.Module):
    """Two layers; unused=True adds a third that forward never uses."""

    def __init__(self, seed, dtype=torch.float32, unused=False, hidden=32):
        super().__init__()
        torch.manual_seed(seed)
        layers = {"a": torch.nn.Linear(16, hidden), "b": torch.nn.Linear(hidden, 4)}
        if unused:
            layers["unused"] = torch.nn.Linear(hidden, 4)
        self.m = torch.nn.ModuleDict(layers).to(dtype)

    def forward(self, x):
        return self.m["b"](torch.relu(self.m["a"](x)))


def _batches(rank, steps, dtype):
    g = torch.Generator().manual_seed(100 + rank)
    n = 3 + rank if steps is None else steps  # None: uneven, rank r has 3 + r batches
    return [torch.randn(8, 16, generator=g).to(dtype) for _ in range(n)]


def _train(ddp, batches, mode):
    from torch.distributed.algorithms.join import Join

    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    if mode == "no_sync":  # accumulate two batches locally, then one synchronised step
        for i in range(0, len(batches) - 1, 2):
            opt.zero_grad()
            with ddp.no_sync():
                ddp(batches[i]).square().mean().backward()
            ddp(batches[i + 1]).square().mean().backward()
            opt.step()
    elif mode == "join":
        with Join([ddp]):
            for x in batches:
                opt.zero_grad()
                ddp(x).square().mean().backward()
                opt.step()
    else:
        for x in batches:
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()
    return torch.cat([p.detach().float().reshape(-1) for p in ddp.parameters()])


CASES = {"static_graph": dict(static_graph=True),
         "find_unused": dict(find_unused_parameters=True),
         "no_sync": {}, "join": {},
         # DDP's first bucket takes 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES) whatever the cap:
         # the net of this case is wide enough (hidden=20000, 1.6 MB) for several buckets
         "buckets": dict(bucket_cap_mb=0.25, gradient_as_bucket_view=True),
         "bfloat16": {}, "float64": {}}


def _prepared_calls(ddp, batches, dtype):
    """After the case's training, two more steps on every rank, then two again: what the hook's
    state holds then (its bucket indices), the same prepared calls both times (each step ran
    them, none was prepared again), and each over a bucket DDP holds now (no rebuilt or join
    bucket left pinned in the arena: with gradient_as_bucket_view, the grads' storages)."""
    state = ddp._comm_hooks[0][1]
    even = [torch.ones(8, 16, dtype=dtype)] * 2
    _train(ddp, even, "plain")
    before = {v[2]: v[0] for v in state.calls.values()}
    _train(ddp, even, "plain")
    after = {v[2]: v for v in state.calls.values()}
    grads = {p.grad.untyped_storage().data_ptr() for p in ddp.parameters() if p.grad is not None}
    return {"indices": sorted(after), "kept": all(before.get(i) is v[0] for i, v in after.items()),
            "current": all(v[1].value().untyped_storage().data_ptr() in grads
                           for v in after.values()) if ddp.gradient_as_bucket_view else None}


def rank_ddp_modes(comm, port):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hbmcoll.torch import ddp as _torch_ddp

    dist, gloo = init_torch(comm, port)
    pg = dist.distributed_c10d._get_default_group()
    r = dist.get_rank()
    out = {}
    for name, kw in CASES.items():
        dtype = {"bfloat16": torch.bfloat16, "float64": torch.float64}.get(name, torch.float32)
        mode = name if name in ("no_sync", "join") else "plain"
        batches = _batches(r, None if mode == "join" else 4, dtype)
        got = []
        for group in (pg, gloo):
            net = _Net(1, dtype, unused=name == "find_unused", hidden=20000 if name == "buckets" else 32)
            ddp = DDP(net, process_group=group, **kw)
            got.append(_train(ddp, batches, mode))
            if group is pg:
                hooks = [h.__qualname__ for h, _ in ddp._comm_hooks]
                storages = {p.grad.untyped_storage().data_ptr() for p in ddp.parameters()
                            if p.grad is not None}
                prepared = _prepared_calls(ddp, batches, dtype)
        tol = 2e-2 if dtype == torch.bfloat16 else 2e-5
        out[name] = {"diff": float((got[0] - got[1]).abs().max()), "tol": tol, "hooks": hooks,
                     "grad_view_in_arena": all(s in _torch_ddp._in_arena for s in storages),
                     "prepared": prepared, "inline": pg._inline}
    destroy_torch(dist)
    return out


@pytest.mark.parametrize("inline", ["1", "0"])
def test_ddp_modes_match_gloo(run_ranks, inline):
    """inline=1: each bucket's allreduce prepared once and called (ddp.py's _HookState); 0: the
    backend's nonblocking allreduce, nothing prepared."""
    res = run_ranks(2, rank_ddp_modes, free_port(), timeout=300,
                    env={"HBMCOLL_TIMEOUT": "120", "HBMCOLL_TORCH_INLINE": inline})
    for r, out in enumerate(res):
        for name, case in out.items():
            assert case["diff"] <= case["tol"], (r, name, case)
            assert case["hooks"] == ["allreduce_hook"], (r, name, case)
            assert case["inline"] == (inline == "1"), (r, name, case)
            got = case["prepared"]
            if inline == "0":
                assert got["indices"] == [], (r, name, case)
            else:  # one per bucket, called step after step
                assert got["indices"] == list(range(len(got["indices"]))) and got["kept"], \
                    (r, name, case)
                assert got["indices"] and got["current"] in (None, True), (r, name, case)
        assert out["buckets"]["grad_view_in_arena"], out["buckets"]
        assert inline == "0" or len(out["buckets"]["prepared"]["indices"]) > 1, out["buckets"]


def rank_ddp_private(comm, port):
    """DDP over hbmcoll whose buckets stay in private memory (HBMCOLL_TORCH_DDP_ARENA=0, or an
    arena too small): the same weights as over gloo, and the reason said in one line."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hbmcoll.torch import ddp as _torch_ddp

    lines = []
    handler = logging.Handler()
    handler.emit = lambda rec: lines.append(rec.getMessage())
    logging.getLogger("hbmcoll").addHandler(handler)
    dist, gloo = init_torch(comm, port)
    pg = dist.distributed_c10d._get_default_group()
    batches = _batches(dist.get_rank(), 4, torch.float32)
    got = []
    for group in (pg, gloo):
        m = DDP(_Net(1, hidden=256), process_group=group, gradient_as_bucket_view=True)  # 21 KB
        got.append(_train(m, batches, "plain"))
        if group is pg:
            hooks = [h.__qualname__ for h, _ in m._comm_hooks]
            in_arena = [p.grad.untyped_storage().data_ptr() in _torch_ddp._in_arena
                        for p in m.parameters()]
    diff = float((got[0] - got[1]).abs().max())
    destroy_torch(dist)
    return {"diff": diff, "hooks": hooks, "lines": lines, "in_arena": any(in_arena)}


@pytest.mark.parametrize("env", [{"HBMCOLL_TORCH_DDP_ARENA": "0"},
                                 {"HBMCOLL_ARENA_BYTES": "4K"}], ids=["off", "full"])
def test_ddp_buckets_stay_private_when_told_or_full(run_ranks, env):
    res = run_ranks(2, rank_ddp_private, free_port(), timeout=120, env=env)
    for out in res:
        assert out["diff"] <= 2e-5, out
        assert not out["in_arena"], out
        assert out["hooks"] == ([] if "HBMCOLL_TORCH_DDP_ARENA" in env else ["allreduce_hook"]), out
    said = [line for line in res[0]["lines"] if "DDP bucket" in line]
    if "HBMCOLL_TORCH_DDP_ARENA" in env:
        assert not said
    else:
        assert len(said) == 1 and "HBMCOLL_ARENA_BYTES" in said[0], res[0]["lines"]
