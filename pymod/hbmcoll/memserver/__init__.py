"""Memory servers: remote shared buffers on other nodes (Soft Memory Box's design).

- server.py: hbmcoll-memserver (`python -m hbmcoll.memserver` runs it too), with its control
  connections (control.py);
- protocol.py: what server and clients say to each other;
- client.py: hbmcoll.RemoteBuffer, a named buffer on the servers;
- param_sharing.py: parameter sharing through the servers (ShmCaffe's modes), the part the torch
  and Keras helpers (hbmcoll/torch/param_sharing.py, hbmcoll/tensorflow/param_sharing.py) share.
"""
from .server import MAX_HANDSHAKES, Buffer, Client, Server, main, parse_size, placed_pool, start_beside  # noqa: F401
