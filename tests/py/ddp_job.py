"""A rank of DDP across emulated nodes (test_across_nodes.py): the same model trained twice from
the same start on the same data, once over the default group (backend hbmcoll, across the nodes)
and once over a gloo group, then the weights compared; and a sub-group of the first and the last
rank (on different nodes). Prints "ddp ok <max difference>".
"""
import os
import zlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hbmcoll.torch  # noqa: F401  (registers the backend)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def train(group):
    net = DDP(model(), process_group=group, bucket_cap_mb=1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + dist.get_rank())
    for _ in range(8):
        x, y = torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


dist.init_process_group("hbmcoll")
assert dist.get_backend() == "hbmcoll"
gloo = dist.new_group(backend="gloo")
P, me = dist.get_world_size(), dist.get_rank()
ends = dist.new_group([0, P - 1], backend="hbmcoll")  # one rank on each node: built through the store
if me in (0, P - 1):
    t = torch.tensor([float(me), 1.0])
    dist.all_reduce(t, group=ends)
    assert t.tolist() == [P - 1.0, 2.0], t
    every = [torch.zeros(1) for _ in range(2)]
    dist.all_gather(every, torch.tensor([float(me)]), group=ends)
    assert [float(v) for v in every] == [0.0, P - 1.0], every
ours, theirs = train(None), train(gloo)
same = torch.tensor([zlib.crc32(ours.numpy().tobytes())], dtype=torch.int64)
every = [torch.zeros_like(same) for _ in range(dist.get_world_size())]
dist.all_gather(every, same)
assert len({int(t) for t in every}) == 1, "ranks disagree on the weights"
diff = float((ours - theirs).abs().max())
assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6), diff
os.write(1, f"ddp ok {diff:.2e}\n".encode())
kept = list(dist.distributed_c10d._world.pg_map)  # freeing a gloo group can deadlock in torch
dist.destroy_process_group()                      # 2.13 (ranks.destroy_torch): leave without it
os._exit(0)
