"""python -m hbmcoll.tune (hbmcoll/tools/tune.py): thresholds measured on this host, cached, applied by init()
where the environment sets none; another host's cache and HBMCOLL_TUNE=off are ignored."""
import json
import os
import subprocess
import sys

from hbmcoll.tools import tune

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(HERE)), "pymod"),
           HBMCOLL_BIND="none", HBMCOLL_TIMEOUT="60")
for _var in (*tune.CANDIDATES, "HBMCOLL_TUNE"):
    ENV.pop(_var, None)
JOB = r"""
import os, numpy as np, hbmcoll
c = hbmcoll.init()
x = np.ones(16384, np.float32)  # 64 KiB: eager below a tuned 64K or more, pipelined at 16K
c.bcast(x, root=0)
os.write(1, f"rank {c.rank} small_max {os.environ.get('HBMCOLL_SMALL_MAX')} bcast {c._c.algorithm} "
            f"tuned {hbmcoll.topology()['tuned'] is not None}\n".encode())
"""


def _job(tmp_path, **env):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    p = subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", "2", sys.executable, str(script)],
                       env=dict(ENV, **env), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p


def test_tune_measures_caches_and_init_applies_it(tmp_path):
    cache = str(tmp_path / "tuned.json")
    p = subprocess.run([sys.executable, "-m", "hbmcoll.tune", "--rounds", "1"], env=dict(ENV, HBMCOLL_TUNE_FILE=cache),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    doc = json.load(open(cache))
    assert doc["host"] == tune.host()
    assert doc["choice"]["HBMCOLL_SMALL_MAX"] in tune.CANDIDATES["HBMCOLL_SMALL_MAX"]
    assert doc["choice"]["HBMCOLL_CMA"] in tune.CANDIDATES["HBMCOLL_CMA"]
    assert all(t > 0 for run in doc["measured_s"].values() for k, t in run.items() if k not in ("works", "single"))
    show = subprocess.run([sys.executable, "-m", "hbmcoll.tune", "--show"], env=dict(ENV, HBMCOLL_TUNE_FILE=cache),
                          capture_output=True, text=True, timeout=60).stdout
    assert json.dumps(doc["choice"], sort_keys=True) in show

    # a job takes the cache where its environment is silent, and says so at info (single copy off in
    # the cache: what the measurement chose for it depends on the host and its load, and a bcast
    # with single copy is neither eager nor pipelined)
    doc["choice"]["HBMCOLL_SMALL_MAX"] = "128K"
    doc["choice"]["HBMCOLL_CMA"] = "0"
    json.dump(doc, open(cache, "w"))
    p = _job(tmp_path, HBMCOLL_TUNE_FILE=cache, HBMCOLL_LOG="info")
    assert p.stdout.count("small_max 128K bcast eager tuned True") == 2, p.stdout
    assert "thresholds measured on this host" in p.stderr and "HBMCOLL_SMALL_MAX=128K" in p.stderr
    # an explicit variable wins; HBMCOLL_TUNE=off and another host's cache leave the defaults
    p = _job(tmp_path, HBMCOLL_TUNE_FILE=cache, HBMCOLL_SMALL_MAX="16K")
    assert p.stdout.count("small_max 16K bcast pipelined") == 2, p.stdout
    assert _job(tmp_path, HBMCOLL_TUNE_FILE=cache, HBMCOLL_TUNE="off").stdout.count(
        "small_max None bcast pipelined tuned False") == 2
    doc["host"]["cpu"] = "another CPU"
    json.dump(doc, open(cache, "w"))
    assert _job(tmp_path, HBMCOLL_TUNE_FILE=cache).stdout.count("small_max None bcast pipelined tuned False") == 2


def test_the_choice_is_the_measured_best_unless_the_default_is_as_good():
    def runs(times):  # candidate -> (time at 4 KiB, eager for all; time at 64 KiB)
        return {f"HBMCOLL_SMALL_MAX={v}": {"bcast 4096": a, "bcast 65536": b} for v, (a, b) in times.items()}
    def cma_runs(times, auto_kept):  # single copy pays for gather and not for bcast, as on the Xeon VM
        asked = dict(tune.CMA_COLLS, auto=auto_kept)
        return {f"HBMCOLL_CMA={v}": {"bcast 1048576": b, "gather 1048576": g, "works": True,
                                     "single": list(asked[v])} for v, (b, g) in times.items()}
    times = {"0": (1.0, 2.0), "gather": (1.0, 1.0), "bcast": (1.6, 2.0), "1": (1.6, 1.0)}
    fast64 = runs({"8K": (1.0, 2.0), "16K": (1.1, 2.1), "32K": (1.0, 1.9), "64K": (1.0, 1.0), "128K": (0.9, 1.0)})
    # the creation probe kept gather's single copy: the default is as good as the best word
    cma = cma_runs(dict(times, auto=(1.0, 1.02)), ("gather",))
    assert {k: v for k, (v, _) in tune.choose(dict(fast64, **cma)).items()} == {
        "HBMCOLL_SMALL_MAX": "64K", "HBMCOLL_CMA": "auto"}
    # the probe got it wrong (it staged): the tune's measurement overrides it
    cma = cma_runs(dict(times, auto=(1.0, 2.0)), ())
    assert tune.choose(dict(fast64, **cma))["HBMCOLL_CMA"][0] == "gather"
    close = runs({"8K": (1.0, 1.03), "16K": (1.0, 1.03), "32K": (1.0, 1.03), "64K": (1.0, 1.0),
                  "128K": (1.0, 1.0)})  # eager at 64 KiB wins by less than the noise
    cma = cma_runs(dict(times, auto=(1.0, 2.0)), ())
    for run in cma.values():  # a container without process_vm_readv: every word stages
        run.update(works=False, single=[])
    choice = tune.choose(dict(close, **cma))
    assert choice["HBMCOLL_SMALL_MAX"][0] == "16K" and choice["HBMCOLL_CMA"] == ("0", "single copy does not work here")


def test_a_threshold_is_chosen_from_its_paths_not_from_noise_between_equal_candidates(monkeypatch):
    """The Xeon VM's STREAM_MIN measurement of 2026-11-26 (us; "auto" is 240 MiB there, so it
    never streams): at 1 MiB no candidate but 1M streams, and their times scatter by 15%; at
    16 MiB streaming wins by 20%. Scored candidate by candidate, the scatter kept "auto" (and
    the suite's 16 MiB allreduce missed its target); pooled by path, 4M wins."""
    monkeypatch.setattr(tune, "_llc_bytes", lambda: 480 << 20)
    measured = {"auto": (146.4, 762.2, 4345.0), "1M": (195.0, 758.0, 3707.5),
                "4M": (167.8, 755.6, 3582.3), "16M": (160.8, 801.8, 3599.7)}
    runs = {f"HBMCOLL_STREAM_MIN={v}": {f"allreduce {z}": t * 1e-6 for z, t in zip((1 << 20, 4 << 20, 16 << 20), ts)}
            for v, ts in measured.items()}
    assert tune.choose(runs)["HBMCOLL_STREAM_MIN"][0] == "4M"
    monkeypatch.setattr(tune, "SIDES", {})
    assert tune.choose(runs)["HBMCOLL_STREAM_MIN"][0] == "auto"


def test_single_copy_is_chosen_for_each_collective_apart():
    """The Xeon VM's HBMCOLL_CMA measurement of 2026-11-29 (us): bcast staged whatever the word
    gives gather, 360-484 us at 4 MiB between its runs; gather's single copy 641-660 against
    954-1,022 staged. Scored word by word, that scatter made "1" (both) win, and the suite's
    bcast of 1 and 16 MiB then lost to MPICH; pooled by each collective's path, "gather"."""
    measured = {"0": (100.5, 360.5, 161.8, 1022.4), "gather": (100.8, 484.1, 150.1, 659.7),
                "bcast": (101.6, 425.4, 154.6, 953.5), "1": (106.5, 427.0, 106.9, 641.2),
                "auto": (101.0, 370.2, 158.3, 1001.0)}  # (a probe that chose staging)
    cases = ("bcast 1048576", "bcast 4194304", "gather 1048576", "gather 4194304")
    asked = dict(tune.CMA_COLLS, auto=())
    runs = {f"HBMCOLL_CMA={v}": dict({c: t * 1e-6 for c, t in zip(cases, ts)}, works=True, single=list(asked[v]))
            for v, ts in measured.items()}
    assert tune.choose(runs)["HBMCOLL_CMA"][0] == "gather"


def test_ranks_with_different_thresholds_still_choose_alike(tmp_path):
    """The creating rank's HBMCOLL_SMALL_MAX holds for all (a cache rewritten between two
    ranks' starts must not split them into different algorithms, a MismatchError)."""
    script = tmp_path / "job.py"
    script.write_text("import os\nos.environ['HBMCOLL_SMALL_MAX'] = '128K' if os.environ['HBMCOLL_RANK'] == '1' "
                      "else '16K'\n" + JOB)
    p = subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", "2", sys.executable, str(script)],
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    algorithms = sorted(line.split()[5] for line in p.stdout.splitlines() if line.startswith("rank"))
    assert algorithms == ["pipelined", "pipelined"], p.stdout  # rank 0 made it, with 16K


def test_ranks_with_different_single_copy_sizes_still_choose_alike(tmp_path):
    """The creating rank's HBMCOLL_CMA_MIN holds for all too: a gather's ranks each choose
    single copy or staging, and a split choice would be a MismatchError."""
    script = tmp_path / "job.py"
    script.write_text(
        "import os, numpy as np, hbmcoll\n"
        "os.environ['HBMCOLL_CMA_MIN'] = '1G' if os.environ['HBMCOLL_RANK'] == '1' else '256K'\n"
        "c = hbmcoll.init()\n"
        "x = np.full(1 << 18, c.rank, np.float32)  # 1 MiB\n"
        "g = c.gather(x, root=0)\n"
        "assert c.rank or all((g[q] == q).all() for q in range(c.size))\n"
        "os.write(1, f'rank {c.rank} gather {c._c.algorithm}\\n'.encode())\n")
    p = subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", "2", sys.executable, str(script)],
                       env=dict(ENV, HBMCOLL_CMA="gather"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split()[3::4]) == ["single-copy", "single-copy"], p.stdout


def test_auto_is_the_default_of_every_byte_count(tmp_path):
    """The tune's candidates include "auto" (the library's own default); every byte-count
    variable takes it, in any case."""
    p = _job(tmp_path, HBMCOLL_TUNE="off", HBMCOLL_STREAM_MIN="auto", HBMCOLL_SLOT_BYTES="AUTO",
             HBMCOLL_SMALL_MAX="Auto")
    assert p.stdout.count("bcast pipelined tuned False") == 2, p.stdout
