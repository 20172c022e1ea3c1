"""python -m hbmcoll.memserver: the memory server (hbmcoll-memserver)."""
import sys

from .server import main

if __name__ == "__main__":
    sys.exit(main())
