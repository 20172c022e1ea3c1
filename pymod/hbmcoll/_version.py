"""hbmcoll's version, in a module of its own so that the modules that compare it (the rendezvous
across nodes, the tuning cache's key) need not import the package's __init__, which imports them."""
__version__ = "0.1.0"  # also setup.py's VERSION and the pkg-config file
