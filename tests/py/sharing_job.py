"""One worker of test_memserver.py's training tests: a small classifier trained on its shard of a
synthetic set with hbmcoll.torch.ParameterSharing (MODE async or hybrid), the parameters shared
through the memory servers in HBMCOLL_MEMSERVERS.

    sharing_job.py MODE SHARD SHARDS      (hybrid, under hbmcoll-run: SHARD is the group's number
                                           and each rank of the group takes a part of its shard)
Prints "accuracy A" (on the whole set, of its own model after finish()) when all went well.
"""
import os
import sys

import torch

torch.set_num_threads(1)
import hbmcoll.torch  # noqa: E402


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4000, 20, generator=g)
    w = torch.randn(20, generator=g)
    y = ((x @ w + 0.3 * torch.randn(4000, generator=g)) > 0).long()
    return x, y


def model():
    torch.manual_seed(int(os.environ.get("SEED", 0)))
    return torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def accuracy(net, x, y):
    with torch.no_grad():
        return float((net(x).argmax(1) == y).float().mean())


def main():
    mode, shard, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    x, y = data()
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=float(os.environ.get("LR", 0.05)))
    sharing = hbmcoll.torch.ParameterSharing(net, opt, mode=mode, name="classifier",
                                             staleness=int(os.environ["STALENESS"]) if "STALENESS" in os.environ else None,
                                             timeout=120, workers=shards)  # a wait that never ends fails inside the test's time
    part = torch.arange(shard, 4000, shards)
    if mode == "hybrid":  # the group's ranks split the group's shard
        part = part[sharing.group.rank::sharing.group.size]
    for epoch in range(int(os.environ.get("EPOCHS", 4))):
        for b in range(0, len(part), 32):
            i = part[b:b + 32]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x[i]), y[i]).backward()
            sharing.step()
    sharing.finish()  # every worker's model: the servers' final parameters
    os.write(1, b"accuracy %.4f\n" % accuracy(net, x, y))  # one write: a group's ranks share the pipe


if __name__ == "__main__":
    main()
