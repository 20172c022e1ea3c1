"""A rank of a Horovod-style script across emulated nodes (test_across_nodes.py): the import is
the only change from Horovod. Prints "horovod ok" when every check held.
"""
import os
import zlib

import torch

import hbmcoll.torch as hvd

hvd.init()
P, me = hvd.size(), hvd.rank()
assert 0 <= hvd.local_rank() < hvd.local_size() < P
assert (hvd.cross_rank(), hvd.cross_size()) == (me // hvd.local_size(), P // hvd.local_size())
t = hvd.allreduce(torch.full((5,), float(me)), op=hvd.Sum)
assert torch.equal(t, torch.full((5,), float(sum(range(P))))), t
assert hvd.allgather_object(me) == list(range(P))
assert hvd.broadcast_object({"from": me}, root_rank=P - 1) == {"from": P - 1}
torch.manual_seed(me)  # different starts: broadcast_parameters must make them one
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
hvd.broadcast_optimizer_state(opt, root_rank=0)
gen = torch.Generator().manual_seed(100 + me)
for _ in range(5):
    x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 4, (16,), generator=gen)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
crcs = hvd.allgather_object(zlib.crc32(flat.numpy().tobytes()))
assert len(set(crcs)) == 1, "ranks disagree on the weights"
os.write(1, b"horovod ok\n")
hvd.shutdown()
