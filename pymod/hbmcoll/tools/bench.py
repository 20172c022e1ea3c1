"""`python -m hbmcoll.bench [options]`: run the benchmark suite (bench/suite.py).

An installed hbmcoll carries the suite as hbmcoll/_bench (setup.py maps bench/ there); the
package of a checkout (pymod/hbmcoll) runs that checkout's bench/suite.py. `python -m
hbmcoll.bench --help` lists the options.
"""
import os
import runpy
import sys


def suite_paths():
    """Where the suite may be: installed beside this file, or in the checkout around it."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hbmcoll/, above tools/
    return [os.path.join(pkg, "_bench", "suite.py"),
            os.path.join(os.path.dirname(os.path.dirname(pkg)), "bench", "suite.py")]


def main():
    path = next((p for p in suite_paths() if os.path.isfile(p)), None)
    if path is None:
        sys.exit("hbmcoll.bench: the benchmark suite is not here (looked for "
                 + " and ".join(suite_paths()) + "): install hbmcoll from its sdist or wheel, "
                 "or run `python bench/suite.py` in a checkout")
    sys.argv[0] = path
    runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":
    main()
