"""The benchmark suite (suite.py). Run from a checkout as `python bench/suite.py`; an installed
hbmcoll carries the suite's files as hbmcoll._bench (setup.py maps this folder there) for
`python -m hbmcoll.bench`. The modules import each other by plain name, as scripts."""
