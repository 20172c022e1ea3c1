"""A job across nodes: what hbmcoll.init() needs besides the C core when the launcher's ranks
span several nodes (the meeting, the layout, the rings and every call are libcoll's:
libcoll/src/nodes_join.c, nodes_comm.c, hier.c; _core.join_nodes).

- where.py: where the nodes meet (address, ports, the job's secret), through which interface,
  and the node's name;
- netaddr.py: addresses of either family (A, A:P, [v6]:P), for the nodes, the launcher and the
  memory servers.
"""
