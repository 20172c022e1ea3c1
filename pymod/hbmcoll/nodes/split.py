"""Sub-communicators of a job across nodes: NodesCommunicator.split.

Every rank of the parent calls split(color, key). The parent carries the whole bootstrap, so no
rendezvous address or port is needed again:
1. The parent allgathers every rank's (color, key); a group is the ranks of one color, ordered by
   (key, parent rank) as MPI_Comm_split orders them.
2. Each node's communicator splits the same way (new ranks as keys, so a node's members keep the
   group's order).
3. A group on one node is that node's sub-communicator, nothing more. A group spanning nodes has
   one ring per member index every one of its nodes has: those members open bridge endpoints,
   and the parent allgathers every rank's card (a fixed-size block, empty for the others; an
   endpoint that failed to open is marked, and its whole group gets the error).

A group spanning nodes watches the parent's connections for lost nodes and, on a failure, ends
them too, so every node's waits end. Its endpoints close with the parent's (its close hands them
over): only the parent's close knows that no node still writes to them.
"""
import numpy as np

from .. import _core
from ..errors import BootstrapError, Error
from .layout import Layout, open_bridge, probe, ring

CARD_BLOCK = 2 + 256   # a card's length (2 bytes, 0xffff: the endpoint failed) and the card


def split(parent, color, key):
    """The group of this rank's color (a NodesCommunicator, as the parent, or a node's
    Communicator), or None."""
    c = -1 if color is None else int(color)
    mine = np.array([c, int(key)], dtype=np.int64)
    every = np.empty((parent.size, 2), np.int64)
    parent._hier.run(_core.ALLGATHER, mine, every)  # already in the parent's call order
    members = sorted((r for r in range(parent.size) if every[r, 0] == c), key=lambda r: (every[r, 1], r))
    new_rank = members.index(parent.rank) if c >= 0 else -1
    local = parent._local._split(c if c >= 0 else None, max(new_rank, 0))  # internal: not timed
    by_node = {}
    for nr, r in enumerate(members):
        by_node.setdefault(parent._layout.place(r)[0], []).append(nr)
    node_lists = sorted(by_node.values(), key=min)
    spans = c >= 0 and len(node_lists) > 1
    rings = min(len(n) for n in node_lists) if spans else 0
    bridge, block = None, np.zeros(CARD_BLOCK, np.uint8)
    if spans and local.rank < rings:
        try:
            bridge = open_bridge(parent._iface, parent._pool_bytes, parent._local, parent._family)  # lives as long
            card = bridge.card()
            block[:2] = np.frombuffer(np.uint16(len(card)).tobytes(), np.uint8)
            block[2:2 + len(card)] = np.frombuffer(card, np.uint8)
        except (Error, ValueError, OSError):
            block[:2] = 0xFF
    cards = np.empty((parent.size, CARD_BLOCK), np.uint8)
    parent._hier.run(_core.ALLGATHER, block, cards)
    if c < 0:
        return None
    if not spans:
        return local
    try:
        failed = [members[nr] for n in node_lists for nr in n[:rings]
                  if int(cards[members[nr], :2].view(np.uint16)[0]) == 0xFFFF]
        if failed:
            raise BootstrapError(f"split: parent ranks {failed} could not open their bridge endpoints")
        me = [i for i, n in enumerate(node_lists) if new_rank in n][0]
        names = tuple(parent._layout.names[parent._layout.place(members[n[0]])[0]] for n in node_lists)
        lay = Layout(tuple(tuple(n) for n in node_lists), names, me)
        if bridge is not None:
            def card_of(nr):
                row = cards[members[nr]]
                return row[2:2 + int(row[:2].view(np.uint16)[0])].tobytes()
            ring(bridge, lay, [card_of(n[local.rank]) for n in node_lists])
            if parent._watch is not None:
                bridge.watch(parent._watch.fileno(), "the job's other nodes")
            probe(bridge, lay, min(parent._timeout or 60, 60))
    except BaseException:
        if bridge is not None:
            bridge.close()
        local.abort()
        raise
    return type(parent)(local, lay, bridge, parent._watch, new_rank, len(members), parent._timeout,
                             parent.launcher, parent._iface, parent._pool_bytes, parent=parent, family=parent._family)
