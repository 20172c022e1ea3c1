"""PyTorch DistributedDataParallel on hbmcoll: a small CNN learns scikit-learn's digits.

    python3 -m hbmcoll.run -n 2 examples/torch_ddp.py
    torchrun --nproc-per-node 2 examples/torch_ddp.py
    torchrun --nproc-per-node 2 examples/torch_ddp.py --backend gloo     # the same, over gloo

The only hbmcoll-specific line is `import hbmcoll.torch`, which registers the backend; the rest is
a plain DDP script. Each rank trains on its shard of the 8x8 digit images (1797 of them, shipped
with scikit-learn; a synthetic set of the same shape stands in when scikit-learn is missing).
`--check` ends by comparing the weights of all ranks (they must be equal: DDP averages the
gradients, so every rank applies the same update).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import hbmcoll.torch  # noqa: F401  registers the "hbmcoll" backend


class Net(nn.Module):
    """Two 3x3 convolutions and two dense layers for 1x8x8 images, 10 classes."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def load_digits():
    """(images N x 1 x 8 x 8 float32 in [0, 1], labels N int64)."""
    try:
        from sklearn.datasets import load_digits as sk_digits
        d = sk_digits()
        x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
        y = torch.tensor(d.target, dtype=torch.int64)
    except ImportError:  # synthetic digits: a fixed pattern per class plus noise
        g = torch.Generator().manual_seed(0)
        protos = torch.rand(10, 1, 8, 8, generator=g)
        y = torch.randint(0, 10, (1797,), generator=g)
        x = (protos[y] + 0.3 * torch.randn(1797, 1, 8, 8, generator=g)).clamp(0, 1)
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="hbmcoll")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--check", action="store_true", help="compare the weights of all ranks")
    args = ap.parse_args()

    dist.init_process_group(args.backend)  # RANK, WORLD_SIZE, MASTER_* from the launcher
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234 + rank)  # deliberately different: DDP broadcasts rank 0's weights

    x, y = load_digits()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    n_test = len(y) // 5
    x_test, y_test = x[:n_test], y[:n_test]
    x_train, y_train = x[n_test:][rank::size], y[n_test:][rank::size]  # this rank's shard

    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    steps, t0 = 0, time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(epoch))
        total = torch.zeros(2)
        for i in range(0, len(order) - args.batch + 1, args.batch):
            idx = order[i:i + args.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item(), 1.0])
            steps += 1
            if args.steps and steps >= args.steps:
                break
        dist.all_reduce(total)  # mean loss over all ranks' batches
        with torch.no_grad():
            acc = (model(x_test).argmax(1) == y_test).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch}: loss {total[0] / total[1]:.4f}  test accuracy {acc:.3f}  "
                  f"({steps / (time.perf_counter() - t0):.1f} steps/s, backend {args.backend}, "
                  f"{size} ranks)", flush=True)
        if args.steps and steps >= args.steps:
            break

    if args.check:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        every = [torch.empty_like(flat) for _ in range(size)]
        dist.all_gather(every, flat)
        if not all(torch.equal(every[0], w) for w in every):
            raise SystemExit(f"rank {rank}: weights differ between ranks")
        if rank == 0:
            print(f"weights equal on all ranks ({flat.numel()} parameters)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("HBMCOLL_QUIET", "1")
    main()
