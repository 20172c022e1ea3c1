"""One-way point-to-point latency between 2 ranks of a node (ping-pong / 2): the communicator's
send/recv (C, through the shared segment). Across nodes: bench/p2p_nodes.py.

    python -m hbmcoll.run -n 2 python3 bench/p2p_latency.py [--iters N] [--reps R] [--sizes 8,65536]

Each number is the best of R repetitions (the mean of N iterations each), and the median of
them in brackets: on a loaded machine the best is luck, the median what a program sees.
"""
import argparse
import statistics
import time

import numpy as np

import hbmcoll

SIZES = [8, 65536, 1 << 20]


def pingpong(send, recv, rank, buf, iters):
    other = 1 - rank
    for _ in range(max(iters // 10, 3)):  # warm-up
        if rank == 0:
            send(buf, other), recv(buf, other)
        else:
            recv(buf, other), send(buf, other)
    t = time.perf_counter()
    for _ in range(iters):
        if rank == 0:
            send(buf, other), recv(buf, other)
        else:
            recv(buf, other), send(buf, other)
    return (time.perf_counter() - t) / iters / 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    args = ap.parse_args()
    comm = hbmcoll.init()
    comm.barrier()
    rows = []
    for n in map(int, args.sizes.split(",")):
        buf = np.zeros(n, np.uint8)
        iters = args.iters if n <= 65536 else max(args.iters // 10, 50)
        c_us = []
        for _ in range(args.reps):
            c_us.append(pingpong(comm.send, comm.recv, comm.rank, buf, iters) * 1e6)
            comm.barrier()
        rows.append((n, c_us))
    if comm.rank == 0:
        print(f"{'bytes':>8} {'shared memory (us)':>24}")
        for n, c_us in rows:
            c = f"{min(c_us):.2f} [{statistics.median(c_us):.2f}]"
            print(f"{n:>8} {c:>24}")
    comm.close()


if __name__ == "__main__":
    main()
