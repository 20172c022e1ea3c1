"""A rank of test_exits.py's jobs across emulated nodes (started by hbmcoll-run on each node):
ranks make BATCHES allreduces, rank BUSY one more (BUSY=-1: none), then close.

Prints "done after N s" when it closed, or "lost after N s: why" when a collective raised
PeerLostError (N counted from the moment the others began closing, about)."""
import os
import time

import numpy as np

import hbmcoll


def say(*words):
    os.write(1, (" ".join(map(str, words)) + "\n").encode())


c = hbmcoll.init()
busy = int(os.environ["BUSY"])
for _ in range(int(os.environ.get("BATCHES", "3"))):
    c.allreduce(np.ones(1000, dtype=np.float32))
t0 = time.monotonic()
try:
    if c.rank == busy:
        c.allreduce(np.ones(1000, dtype=np.float32))  # the others never make this one
    c.close()
    say(f"done after {time.monotonic() - t0:.1f} s")
except hbmcoll.PeerLostError as e:
    say(f"lost after {time.monotonic() - t0:.1f} s: {e}")
    raise SystemExit(5)
