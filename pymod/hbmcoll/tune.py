"""`python -m hbmcoll.tune`, the documented name of the tuning command (hbmcoll.tools.tune)."""
import sys

from .tools.tune import apply, cache_path, choose, host, load, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
