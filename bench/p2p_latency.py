"""One-way point-to-point latency between 2 ranks of a node (ping-pong / 2): the communicator's
send/recv (C, through the shared segment) beside the socket path (p2p.Channels, which the
communicator across nodes keeps), on the same communicator.

    python -m hbmcoll.run -n 2 python3 bench/p2p_latency.py [--iters N]
"""
import argparse
import time

import numpy as np

import hbmcoll
from hbmcoll.p2p import Channels

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
    args = ap.parse_args()
    comm = hbmcoll.init()
    sock = Channels(comm, b"p2p-latency".ljust(32, b"."))
    comm.barrier()
    rows = []
    for n in SIZES:
        buf = np.zeros(n, np.uint8)
        iters = args.iters if n <= 65536 else max(args.iters // 10, 50)
        c_us = min(pingpong(comm.send, comm.recv, comm.rank, buf, iters) for _ in range(3)) * 1e6
        comm.barrier()
        s_us = min(pingpong(sock.send, sock.recv, comm.rank, buf, iters) for _ in range(3)) * 1e6
        comm.barrier()
        rows.append((n, c_us, s_us))
    if comm.rank == 0:
        print(f"{'bytes':>8} {'shared memory (us)':>20} {'socket path (us)':>18}")
        for n, c_us, s_us in rows:
            print(f"{n:>8} {c_us:>20.2f} {s_us:>18.2f}")
    sock.close()
    comm.close()


if __name__ == "__main__":
    main()
