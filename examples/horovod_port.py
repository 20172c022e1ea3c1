"""A Horovod PyTorch training script moved to hbmcoll by its import (docs/pytorch.md).

    python3 -m hbmcoll.run -n 2 examples/horovod_port.py
    torchrun --nproc-per-node 2 examples/horovod_port.py
    horovodrun -np 2 python examples/horovod_port.py        # with the import changed back

The script is Horovod's usual shape (horovod/examples/pytorch): init, a shard of the data per
rank, the learning rate scaled by the number of ranks, rank 0's weights and optimizer state
broadcast, DistributedOptimizer, metrics averaged with allreduce. The one changed line is the
import: `import horovod.torch as hvd` became `import hbmcoll.torch as hvd`. The data are
scikit-learn's 8x8 digits (a synthetic set of the same shape when scikit-learn is missing).
"""
import argparse
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

import hbmcoll.torch as hvd  # was: import horovod.torch as hvd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_digits():
    """(images N x 64 float32 in [0, 1], labels N int64)."""
    try:
        from sklearn.datasets import load_digits as sk_digits
        d = sk_digits()
        return torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target, dtype=torch.int64)
    except ImportError:  # a fixed pattern per class plus noise
        g = torch.Generator().manual_seed(0)
        protos, y = torch.rand(10, 64, generator=g), torch.randint(0, 10, (1797,), generator=g)
        return (protos[y] + 0.3 * torch.randn(1797, 64, generator=g)).clamp(0, 1), y


def metric_average(value, name):
    """Horovod's idiom: the mean of a number over the ranks."""
    return hvd.allreduce(torch.tensor(value), name=name).item()  # op defaults to Average


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by hvd.size()")
    ap.add_argument("--fp16-allreduce", action="store_true", help="send the gradients as float16")
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(42 + hvd.rank())  # different starts: broadcast_parameters makes them one
    torch.set_num_threads(1)

    x, y = load_digits()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    n_test = len(y) // 5
    x_test, y_test = x[:n_test][hvd.rank()::hvd.size()], y[:n_test][hvd.rank()::hvd.size()]
    x_train, y_train = x[n_test:][hvd.rank()::hvd.size()], y[n_test:][hvd.rank()::hvd.size()]

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    # equal steps on every rank: every step's allreduce needs all of them
    steps = min(hvd.allgather_object(len(y_train))) // args.batch
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(epoch))
        for i in range(steps):
            idx = order[i * args.batch:(i + 1) * args.batch]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            out = model(x_test)
            test_loss = F.cross_entropy(out, y_test).item()
            test_acc = (out.argmax(1) == y_test).float().mean().item()
        test_loss, test_acc = metric_average(test_loss, "avg_loss"), metric_average(test_acc, "avg_accuracy")
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}: test loss {test_loss:.3f}, accuracy {100 * test_acc:.1f}%", flush=True)

    # every rank applied the same averaged gradients, so all hold the same weights
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    crcs = hvd.allgather_object(zlib.crc32(flat.numpy().tobytes()))
    assert len(set(crcs)) == 1, "ranks disagree on the weights"
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks hold the same weights", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
