"""Build hbmcoll: the Python package in pymod/hbmcoll and its C extension
hbmcoll._core, compiled from libcoll/ (collectives), numa/ (placement) and
pymod/*.c (the CPython binding)."""
import glob
import os
import sys

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def sources(pattern):
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, pattern)))


numa_sources = [s for s in sources("numa/*.c") if not s.endswith("_main.c")]

# NumPy's headers give plain arrays a faster way in (pymod/numpy_fast.c); without
# them at build time the extension uses the buffer protocol for everything.
try:
    import numpy
    numpy_include, numpy_macros = [numpy.get_include()], [("HB_HAVE_NUMPY", "1")]
except ImportError:
    numpy_include, numpy_macros = [], []
    print("hbmcoll: NumPy is not importable at build time: plain arrays will take the buffer "
          "protocol (slower for small messages)", file=sys.stderr)

core = Extension(
    "hbmcoll._core",
    sources=sources("pymod/*.c") + sources("libcoll/src/*.c") + numa_sources,
    include_dirs=["libcoll/include", "libcoll/src", "numa/include", "numa", "pymod"] + numpy_include,
    define_macros=[("_GNU_SOURCE", "1")] + numpy_macros,
    extra_compile_args=["-std=c11", "-O3", "-Wall", "-Wextra", "-Werror",
                        "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
    libraries=["hwloc", "memkind"] if numa_sources else [],
)

setup(
    name="hbmcoll",
    version="0.1.0",
    description="Collectives for Python on many-core, high-bandwidth-memory nodes",
    license="BSD-3-Clause",
    package_dir={"": "pymod"},
    packages=["hbmcoll"],
    ext_modules=[core],
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require={"torch": ["torch"], "test": ["pytest", "torch==2.13.0", "mpi4py"]},
    entry_points={"console_scripts": ["hbmcoll-run = hbmcoll.run:main"]},
)
