"""A Horovod training script with uneven data per rank, ported by changing only its import
(test_torch_jobs.py runs it under hbmcoll-run and checks it against plain torch). Rank r has
3 + 2r batches; the ranks that run out call hvd.join() and take part with zeros until the last
is done. Also Compression, grouped_allreduce, alltoall and reducescatter.

    horovod_uneven_job.py none|fp16      prints "rank R last L weights W..." and "checks ok"
"""
import os
import sys

import torch

import hbmcoll.torch as hvd  # was: import horovod.torch as hvd

hvd.init()
r, P = hvd.rank(), hvd.size()
torch.manual_seed(0)
model = torch.nn.Linear(6, 3)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
compression = hvd.Compression.fp16 if sys.argv[1] == "fp16" else hvd.Compression.none
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), compression=compression)

# alltoall: row j of every rank goes to rank j; reducescatter: 5 rows split 2, 2, 1 (P = 3)
got, splits = hvd.alltoall(torch.arange(2.0 * P).reshape(P, 2) + 100 * r)
assert splits.tolist() == [1] * P and got.tolist() == [[100 * k + 2 * r, 100 * k + 2 * r + 1] for k in range(P)]
part = hvd.reducescatter(torch.ones(5, 2) * (r + 1), op=hvd.Sum)
assert part.shape[0] == [2, 2, 1][r] and (part == sum(range(1, P + 1))).all(), part

g = torch.Generator().manual_seed(10 + r)
batches = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(3 + 2 * r)]
seen = []
for x, y in batches:
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    total, n = hvd.grouped_allreduce([loss.detach(), torch.tensor([float(len(y))])], op=hvd.Sum,
                                     compression=compression)
    seen.append(n.item())
last = hvd.join()
w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
os.write(1, (f"rank {r} last {last} seen {' '.join(str(int(v)) for v in seen)} "  # one write: a shared pipe
             f"weights {' '.join(f'{v:.7f}' for v in w.tolist())}\nchecks ok\n").encode())
