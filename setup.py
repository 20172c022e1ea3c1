"""Build hbmcoll: the Python package in pymod/hbmcoll and its C extension hbmcoll._core
(pymod/*.c, the CPython binding), linked with libhbmcoll: the collectives (libcoll/) and
placement (numa/).

`make build` builds libhbmcoll once (libcoll/Makefile.inc) and passes its folder in
HBMCOLL_LIB_DIR; a plain `pip install` builds the same static library here first. Either way
the package carries the library, its headers and a pkg-config file (hbmcoll/lib,
hbmcoll/include; `python3 -m hbmcoll.clib` prints where), so C programs can link the copy pip
installed. It also carries the benchmark suite (bench/ as hbmcoll._bench: `python -m
hbmcoll.bench`).

Before anything compiles, tools/prebuild_check.py checks for a C compiler, Python's headers and
hwloc, and stops with one message naming what is missing and its package."""
import glob
import os
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build import build
from setuptools.command.build_clib import build_clib
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "tools"))
import prebuild_check  # noqa: E402  (tools/, shipped in the sdist)

VERSION = "0.1.0"  # also pymod/hbmcoll/_version.py and the pkg-config file
HEADERS = ["libcoll/include/coll.h", "numa/include/coll_numa.h"]
LINK = ["hwloc", "pthread", "m", "dl"]


def sources(pattern):
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, pattern)))


# the make build's library, or none: then build_clib makes it from the same sources
LIB_DIR = os.environ.get("HBMCOLL_LIB_DIR", "")
PREBUILT = os.path.join(LIB_DIR, "libhbmcoll.a") if LIB_DIR else ""
if PREBUILT and not os.path.exists(PREBUILT):
    sys.exit(f"hbmcoll: HBMCOLL_LIB_DIR={LIB_DIR} holds no libhbmcoll.a (`make lib` builds it)")
# warnings are errors in the project's own build only: a newer compiler must not fail an install
WARN = ["-Wall", "-Wextra", "-Wno-missing-field-initializers"] + (["-Werror"] if PREBUILT else [])
INCLUDE = ["libcoll/include", "libcoll/src", "numa/include", "numa", "pymod"]

# NumPy's headers give plain arrays a faster way in (pymod/numpy_fast.c); without
# them at build time the extension uses the buffer protocol for everything.
try:
    import numpy
    numpy_include, numpy_macros = [numpy.get_include()], [("HB_HAVE_NUMPY", "1")]
except ImportError:
    numpy_include, numpy_macros = [], []
    print("hbmcoll: NumPy is not importable at build time: plain arrays will take the buffer "
          "protocol (slower for small messages)", file=sys.stderr)

lib_sources = sources("libcoll/src/*.c") + [s for s in sources("numa/*.c") if not s.endswith("_main.c")]
libhbmcoll = ("hbmcoll", {
    "sources": lib_sources,
    "include_dirs": INCLUDE,
    "macros": [("_GNU_SOURCE", "1")],
    "cflags": ["-std=c11", "-O3", "-g", "-fPIC"] + WARN,
})

core = Extension(
    "hbmcoll._core",
    sources=sources("pymod/*.c"),
    include_dirs=INCLUDE + numpy_include,
    define_macros=[("_GNU_SOURCE", "1")] + numpy_macros,
    extra_compile_args=["-std=c11", "-O3"] + WARN + ["-Wno-cast-function-type"],
    extra_objects=[PREBUILT] if PREBUILT else [],
    libraries=LINK,
    # relinked when the library or a header changes, not only its own sources
    depends=([PREBUILT] if PREBUILT else []) + sources("pymod/*.h") + HEADERS,
)

PC = """prefix=${pcfiledir}/../..
libdir=${prefix}/lib
includedir=${prefix}/include

Name: hbmcoll
Description: Collectives over shared memory for many-core, high-bandwidth-memory nodes (pip)
Version: %s
Libs: -L${libdir} -lhbmcoll %s
Cflags: -I${includedir}
"""


# The benchmark suite ships as hbmcoll._bench, mapped from bench/, for `python -m hbmcoll.bench`:
# the driver and what it imports, the workers it launches and the staged floor's C kernel.
# bench/'s other scripts (net_bridge, many_ranks, ...) need a checkout's tests and build/.
BENCH_MODULES = {"hbmcoll._bench": {"__init__", "suite", "limits", "machine", "noise", "report",
                                    "targets"}}


class BuildPy(build_py):
    """Only the suite's modules of bench/ (also what the sdist takes of it)."""

    def find_package_modules(self, package, package_dir):
        keep = BENCH_MODULES.get(package)
        return [m for m in super().find_package_modules(package, package_dir)
                if keep is None or m[1] in keep]


# The check runs first in whichever command starts the build (pip: build; `make build` and
# editable installs: build_ext or build_clib directly), once.
class Build(build):
    def run(self):
        prebuild_check.run_once()
        super().run()


class BuildClib(build_clib):
    def run(self):
        prebuild_check.run_once()
        super().run()


class BuildExt(build_ext):
    """The extension, then the library, headers and hbmcoll.pc beside it in the package."""

    def run(self):
        prebuild_check.run_once()
        lib = PREBUILT
        if not lib:  # build it (`setup.py build_ext` alone skips build_clib), and link it first:
            self.run_command("build_clib")  # a static library must come before what it uses
            lib = os.path.join(self.get_finalized_command("build_clib").build_clib, "libhbmcoll.a")
            self.libraries = [n for n in self.libraries if n != "hbmcoll"]
            core.extra_objects = [lib]
            core.depends.append(lib)
        super().run()
        pkg = os.path.dirname(self.get_ext_fullpath("hbmcoll._core"))
        os.makedirs(os.path.join(pkg, "lib", "pkgconfig"), exist_ok=True)
        os.makedirs(os.path.join(pkg, "include", "hbmcoll"), exist_ok=True)
        shutil.copyfile(lib, os.path.join(pkg, "lib", "libhbmcoll.a"))
        for h in HEADERS:
            shutil.copyfile(os.path.join(HERE, h), os.path.join(pkg, "include", "hbmcoll", os.path.basename(h)))
        with open(os.path.join(pkg, "lib", "pkgconfig", "hbmcoll.pc"), "w") as f:
            f.write(PC % (VERSION, " ".join("-l" + n for n in LINK)))


setup(
    name="hbmcoll",
    version=VERSION,
    description="Collectives for Python on many-core, high-bandwidth-memory nodes",
    license="BSD-3-Clause",
    package_dir={"": "pymod", "hbmcoll._bench": "bench"},
    packages=["hbmcoll", "hbmcoll.horovod", "hbmcoll.launch", "hbmcoll.memserver", "hbmcoll.nodes", "hbmcoll.tensorflow",
              "hbmcoll.tools", "hbmcoll.torch", "hbmcoll._bench", "hbmcoll._bench.workers"],
    py_modules=["_hbmcoll_torch_autoload"],  # init_process_group("hbmcoll") with no import of ours
    package_data={"hbmcoll._bench": ["c/staged_floor.c"], "hbmcoll": ["py.typed", "*.pyi"]},  # PEP 561
    libraries=[] if PREBUILT else [libhbmcoll],
    ext_modules=[core],
    cmdclass={"build": Build, "build_clib": BuildClib, "build_ext": BuildExt, "build_py": BuildPy},
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require={"torch": ["torch"], "test": ["pytest", "torch==2.13.0", "mpi4py"]},
    entry_points={"console_scripts": ["hbmcoll-run = hbmcoll.launch.run:main",
                                     "hbmcoll-memserver = hbmcoll.memserver.server:main"],
                  "torch.backends": ["hbmcoll = _hbmcoll_torch_autoload:register"]},
)
