"""Commands that measure, report on or describe this host and the library (each also runs as
`python -m hbmcoll.<name>`, its documented name):

- tune.py: measure this host's thresholds and cache them (init() applies the cache);
- bench.py: the benchmark suite (bench/suite.py, shipped as hbmcoll._bench);
- topo.py: the topology and placement plan (hbmcoll.topology());
- variables.py: the HBMCOLL_* variables, from libcoll's one list.
"""
