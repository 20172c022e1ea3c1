"""Hybrid parameter sharing (ShmCaffe-H) against synchronous DDP over hbmcoll: training
throughput at 2 groups, in one run, across emulated nodes.

    sudo python3 bench/hybrid_vs_ddp.py [--ranks 2] [--steps 40] [--rounds 3] [--rate 1gbit]

Two groups, each on an emulated node of its own (network namespaces on a bridge, as in the
tests), each of --ranks ranks; a third node holds the memory server. The model is a two-layer
perceptron of 3.2 MB of parameters (SMB's Inception-v1 divided by 16), batches of 64 random
samples. DDP: torchrun on the two nodes, `init_process_group("hbmcoll")` and torch's
DistributedDataParallel: every step waits for the gradients of all ranks. Hybrid: an
`hbmcoll-run -n RANKS` job on each node with `hbmcoll.torch.ParameterSharing(mode="hybrid")`:
the node's ranks average their gradients over shared memory, then its rank 0 pushes the change
to the server and pulls the parameters, with no wait for the other node: overlapped with the
next steps (the default), and in step (overlap=False: each step waits for its exchange).
Reported: samples per second of the whole job (every rank's timed samples over the slowest rank's time; best of
--rounds), and the ratio. --rate caps the link (tc tbf) as a slower network would. A benchmark:
nothing is asserted.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "pymod"))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
import machine  # noqa: E402
from netnodes import NetNodes, finish  # noqa: E402  (the namespaces the tests use too)

ENV = dict(os.environ, OMP_NUM_THREADS="1", HBMCOLL_QUIET="1", PYTHONPATH=os.path.join(ROOT, "pymod"),
           HBMCOLL_JOB_KEY="b" * 32, HBMCOLL_TOKEN="bench-token-of-16-bytes-or-more")

WORKER = r"""
import os, sys, time, torch
torch.set_num_threads(1)
import hbmcoll.torch
mode, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(784, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 10))  # 3.2 MB
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
if mode == "ddp":
    import torch.distributed as dist
    dist.init_process_group("hbmcoll")
    rank, model = dist.get_rank(), torch.nn.parallel.DistributedDataParallel(net)
    step = opt.step
else:
    sharing = hbmcoll.torch.ParameterSharing(net, opt, mode="hybrid", name="bench", overlap=mode == "hybrid")
    rank, model, step = int(os.environ["GROUP"]) * 100 + sharing.group.rank, net, sharing.step
for k in range(steps + 5):  # 5 to warm up
    if k == 5:
        t = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    step()
os.write(1, b"rank %d samples %d seconds %.6f\n" % (rank, 64 * steps, time.perf_counter() - t))
if mode != "ddp":
    sharing.finish()
"""


def _throughput(label, res):
    got = [(int(s), float(t)) for _, out, _ in res for s, t in re.findall(r"samples (\d+) seconds ([0-9.]+)", out)]
    if not got or any(rc for rc, _, _ in res):
        raise SystemExit(f"the {label} run failed: " + " | ".join(e[-1500:] for _, _, e in res))
    return sum(s for s, _ in got) / max(t for _, t in got), len(got)


def run_ddp(nodes, ranks, steps, port):
    procs = [nodes.popen(i + 1, [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
                                 "--nproc-per-node", str(ranks), "--master-addr", nodes.addrs[1], "--master-port",
                                 str(port), "--no-python", sys.executable, "-c", WORKER, "ddp", str(steps)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) for i in range(2)]
    return _throughput("DDP", finish(procs, 600))


def run_hybrid(nodes, ranks, steps, port, tmp, mode="hybrid"):
    token = os.path.join(tmp, "token")
    with os.fdopen(os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # the server wants it private
        f.write(ENV["HBMCOLL_TOKEN"])
    addr = f"{nodes.addrs[0]}:{port}"
    server = nodes.popen(0, [sys.executable, "-m", "hbmcoll.memserver", "--listen", addr, "--token-file", token,
                             "--capacity", "16M"], stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        if " bytes for buffers at " not in server.stderr.readline():
            raise SystemExit("the memory server did not start")
        procs = [nodes.popen(i + 1, [sys.executable, "-m", "hbmcoll.run", "-n", str(ranks), sys.executable, "-c",
                                     WORKER, mode, str(steps)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(ENV, HBMCOLL_MEMSERVERS=addr, GROUP=str(i))) for i in range(2)]
        return _throughput("hybrid", finish(procs, 600))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through NetNodes: no namespace left
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2, help="ranks per group (node)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each, in turn, the best kept")
    ap.add_argument("--rate", help="cap the link, e.g. 1gbit (tc tbf)")
    a = ap.parse_args()
    print(f"# {machine.cpu_model()}, {os.cpu_count()} CPUs; 2 groups x {a.ranks} ranks on emulated nodes"
          f"{', link capped at ' + a.rate if a.rate else ''}; {a.steps} steps of 64 samples per rank, best of {a.rounds}")
    ddp = hybrid = in_step = 0.0
    with tempfile.TemporaryDirectory() as tmp, NetNodes(3, rate=a.rate) as nodes:
        for r in range(a.rounds):  # in turn, so all see the same minutes of this host
            ddp = max(ddp, run_ddp(nodes, a.ranks, a.steps, 29810 + r)[0])
            hybrid = max(hybrid, run_hybrid(nodes, a.ranks, a.steps, 29820 + r, tmp)[0])
            in_step = max(in_step, run_hybrid(nodes, a.ranks, a.steps, 29830 + r, tmp, "hybrid-in-step")[0])
    print(f"| link | DDP over hbmcoll samples/s | hybrid samples/s | hybrid/DDP | hybrid in step samples/s |\n"
          f"|---|---|---|---|---|\n"
          f"| {a.rate or 'uncapped'} | {ddp:.0f} | {hybrid:.0f} | {hybrid / ddp:.2f}x | {in_step:.0f} |")


if __name__ == "__main__":
    main()
