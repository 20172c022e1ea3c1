"""alltoall across nodes (NodesCommunicator's): the blocks for the node's own ranks go by a local
alltoall; the others cross the network by the bridge's shifts where every node has one rank per
ring, else in a gather of node blocks."""
import numpy as np


def alltoall(comm, src, dst):
    """src and dst: P blocks of bytes. The blocks for this node's ranks go by a local alltoall;
    the others by shifts (_by_shifts), or where nodes differ in ranks, in this node's block
    (its ranks' parts, padded to the largest node's), which every node gathers, each rank
    taking its own."""
    lay, P, L = comm._layout, comm.size, comm.local_size
    b = len(src) // P
    src, dst = src.reshape(P, b), dst.reshape(P, b)
    here = list(lay.nodes[comm.node])
    if L > 1:
        got = np.empty((L, b), np.uint8)
        comm._local.alltoall(np.ascontiguousarray(src[here]), out=got)
        dst[here] = got
    else:
        dst[here] = src[here]
    if comm.nodes == 1 or b == 0:
        return
    if comm._even:
        return _by_shifts(comm, src, dst, b)
    elsewhere = [r for r in range(P) if r not in set(here)]
    mine = np.ascontiguousarray(src[elsewhere]).reshape(-1)
    part = mine.reshape(1, -1) if L == 1 else comm._local.allgather(mine)
    width = max(len(n) * (P - len(n)) for n in lay.nodes) * b
    block = np.zeros(width, np.uint8)
    block[:part.size] = part.reshape(-1)
    every = comm._gather_across(block)
    for k, ranks in enumerate(lay.nodes):
        if k != comm.node:
            away = [r for r in range(P) if r not in set(ranks)]  # node k's part, by rank
            rows = every[k, :len(ranks) * len(away) * b].reshape(len(ranks), len(away), b)
            dst[list(ranks)] = rows[:, away.index(comm.rank)]


def _by_shifts(comm, src, dst, b):
    """Where every node has one rank per ring (L ranks): in step j, each rank sends its blocks
    for node + j's ranks to its ring's member there and gets node - j's (the bridge's shift),
    so every block crosses the network once; a local alltoall then hands each to its rank."""
    lay, L, N, node = comm._layout, comm.local_size, comm.nodes, comm.node
    got = np.empty((N - 1, L, b), np.uint8)  # [j - 1, l]: from my peer on node - j, for local rank l
    for j in range(1, N):
        comm._bridge.shift(j, np.ascontiguousarray(src[list(lay.nodes[(node + j) % N])]), got[j - 1], comm._timeout)
    mine = got.transpose(1, 0, 2)            # [l, j - 1]: what local rank l gets from me
    if L > 1:
        mine = comm._local.alltoall(np.ascontiguousarray(mine))  # [l, j - 1]: from local rank l's peer
    for j in range(1, N):
        dst[list(lay.nodes[(node - j) % N])] = mine[:, j - 1]
