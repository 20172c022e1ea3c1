"""`python -m hbmcoll.bench`, the documented name of the benchmark suite's command
(hbmcoll.tools.bench)."""
import sys

from .tools.bench import main, suite_paths  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
