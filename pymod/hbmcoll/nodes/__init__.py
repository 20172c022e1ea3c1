"""A job across nodes: what hbmcoll.init() builds when the launcher's ranks span several nodes.

- layout.py: who is where (the nodes' ranks, names and rings), the rendezvous' address and
  ports, the bridge's endpoints and rings;
- rendezvous.py: how the nodes meet (authenticated by the job's secret) and the connections
  that tell a node when another is lost (Watch);
- communicator.py: NodesCommunicator, over the node's communicator and the C layer that runs
  every collective across the nodes (libcoll/src/hier.h, _core.Hier);
- split.py: its sub-communicators;
- netaddr.py: addresses of either family (A, A:P, [v6]:P), for the nodes, the launcher and the
  memory servers.
"""
