"""`python -m hbmcoll.topo`, the documented name of the placement report (hbmcoll.tools.topo)."""
import sys

from .tools.topo import main, setup, topology  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
