"""`python -m hbmcoll.run`, the documented name of the launcher hbmcoll-run (hbmcoll.launch.run)."""
import sys

from .launch.run import main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
