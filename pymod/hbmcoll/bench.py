"""`python -m hbmcoll.bench [options]`: run the benchmark suite of this checkout (bench/suite.py).

The suite lives beside the package in the source tree (it launches mpiexec and torchrun and is
not installed with the wheel); `python -m hbmcoll.bench --help` lists the options.
"""
import os
import runpy
import sys


def suite_path():
    here = os.path.dirname(os.path.abspath(__file__))            # <checkout>/pymod/hbmcoll
    return os.path.join(os.path.dirname(os.path.dirname(here)), "bench", "suite.py")


def main():
    path = suite_path()
    if not os.path.isfile(path):
        sys.exit("hbmcoll.bench: the benchmark suite is not installed with the package; it runs "
                 f"from a source checkout (looked for {path}).\nClone the hbmcoll repository and "
                 "run `python bench/suite.py` or `make bench` there.")
    sys.argv[0] = path
    runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":
    main()
