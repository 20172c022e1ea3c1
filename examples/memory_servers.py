"""Remote shared memory: named buffers on a memory server that every rank writes, reads and
accumulates into (docs/memory-servers.md).

    hbmcoll-run -n 2 --memservers 1 python examples/memory_servers.py
    python3 -m hbmcoll.run -n 2 --memservers 1 examples/memory_servers.py   # the same

`--memservers 1` starts one server beside the job, gives the ranks HBMCOLL_MEMSERVERS (where it
listens) and HBMCOLL_TOKEN (the secret it asks for), and stops it with the job. Under torchrun,
mpiexec or srun, start the servers yourself and set those two variables (HBMCOLL_TOKEN_FILE in
place of HBMCOLL_TOKEN):

    (umask 077; python3 -c 'import secrets; print(secrets.token_hex(16))' > token)
    hbmcoll-memserver --listen 10.0.0.5:29900 --token-file token --capacity 4G &
    export HBMCOLL_MEMSERVERS=10.0.0.5:29900 HBMCOLL_TOKEN_FILE=token

The communicator is used only to line the ranks up between the steps; the buffers themselves
need none (any process holding the token may open them).
"""
import numpy as np

import hbmcoll

comm = hbmcoll.init()
P, me = comm.size, comm.rank

# The first open of a name creates the buffer; every later open must give the same shape and
# dtype (another is a MismatchError).
weights = hbmcoll.RemoteBuffer("example-weights", (4, 1024), "float32")
if me == 0:
    weights.write(np.zeros((4, 1024), np.float32))
comm.barrier()

# Accumulate: y += alpha * x, applied one request at a time by the server, so concurrent
# accumulates from every rank never lose an update.
weights.accumulate(np.ones((4, 1024), np.float32), alpha=me + 1)
req = weights.iaccumulate(np.full((4, 1024), 0.5, np.float32))   # nonblocking
req.wait()
comm.barrier()

w = weights.read()
expect = sum(r + 1 for r in range(P)) + 0.5 * P
assert w.shape == (4, 1024) and w.dtype == np.float32 and (w == expect).all(), w
# version: the writes and accumulates the buffer has taken (1 write + 2 accumulates per rank)
assert weights.version == 1 + 2 * P, weights.version

# A lock makes a read-modify-write whole: each rank adds its rank to a counter in turn. A holder
# that dies, or outlives its lease (seconds), loses the lock, and its later writes are refused.
counter = hbmcoll.RemoteBuffer("example-counter", (1,), "int64")
if me == 0:
    counter.write(np.zeros(1, np.int64))
comm.barrier()
with counter.lock(timeout=5, lease=10):
    c = counter.read()
    counter.write(c + me)
comm.barrier()
total = int(counter.read()[0])
assert total == sum(range(P)), total

if me == 0:
    print(f"rank 0 of {P}: weights all {expect} after {weights.version} updates, counter {total}", flush=True)
comm.close()
