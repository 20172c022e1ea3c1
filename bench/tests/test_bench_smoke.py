"""Smoke tests of the benchmark suite: it runs and writes its files. No timing is asserted.

    python -m pytest bench/tests -q
"""
import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.join(BENCH, "workers"))

import common  # noqa: E402
import floor_worker  # noqa: E402
import limits  # noqa: E402
import noise  # noqa: E402
import report  # noqa: E402
import targets  # noqa: E402


def test_iterations_follow_osu():
    assert common.iterations({}, 8192) == (10000, 1000)
    assert common.iterations({}, 8193) == (100, 10)


def test_rotation_outgrows_llc_within_memory():
    spec = {"llc_bytes": 32 << 20}
    assert common.n_rotate(spec, 16) == common.MAX_ROTATE
    k = common.n_rotate(spec, 32 << 20)
    assert k * (32 << 20) >= 128 << 20 and k & (k - 1) == 0
    assert common.n_rotate(spec, 512 << 20) == 1


def test_least_bytes():
    assert limits.min_bytes("allreduce", 4, 100) == 800
    assert limits.min_bytes("bcast", 4, 100) == 400
    assert limits.min_bytes("barrier", 4, 0) == 0


def test_summary_ratios_and_fraction():
    rows = [{"label": lb, "library": lb.split("-")[0], "P": 2, "collective": "allreduce",
             "size": 1 << 20, "avg_us": t, "min_us": t, "max_us": t, "status": "ok"}
            for lb, t in (("mpi4py", 100.0), ("torch", 400.0), ("hbmcoll-numpy", 50.0))]
    lim = {"cores": 2, "all_cores_GBps": 10.0, "by_procs": {"2": {"best_GBps": 10.0}}}
    s = {x["label"]: x for x in report.summarize(rows, lim)}
    assert s["hbmcoll-numpy"]["ratio_vs_mpi4py"] == pytest.approx(0.5)
    assert s["hbmcoll-numpy"]["ratio_vs_torch"] == pytest.approx(0.125)
    # 2PN = 4 MiB at 10 GB/s = 419 us; measured 100 us -> 4.19
    assert s["mpi4py"]["frac_limit"] == pytest.approx(4 * (1 << 20) / 10e9 / 100e-6)


def test_targets_verdict_pairs_rounds_and_oversub():
    def row(lb, rnd, t, size=1 << 20):
        return {"label": lb, "library": lb.split("-")[0], "P": 2, "collective": "allreduce",
                "size": size, "round": rnd, "avg_us": t, "min_us": t, "max_us": t, "status": "ok"}
    # MPICH 310/200/400 us, hbmcoll 100/90/140: best 200/90 = 2.2x (missed), rounds 3.1/2.2/2.9
    rows = [row("mpi4py", k, t) for k, t in enumerate((310.0, 200.0, 400.0))] + \
           [row("hbmcoll-numpy", k, t) for k, t in enumerate((100.0, 90.0, 140.0))] + \
           [row("mpi4py", 0, 20.0, 65536), row("hbmcoll-numpy", 0, 5.0, 65536)]
    summ = report.summarize(rows, None)
    def over(lb, status="ok", t=None):
        return {"label": lb, "P": 8, "cores": 2, "status": status, "avg_us": t}
    oversub = [over("mpi4py", t=24000.0), over("hbmcoll-numpy", t=30.0)]
    res = {(r["target"], r["label"]): r for r in targets.check(summ, rows, oversub)}
    one = res["allreduce 1 MiB >= 3x MPICH", "hbmcoll-numpy"]
    assert one["measured"] == pytest.approx(200 / 90) and one["ok"] is False
    assert one["paired_median"] == pytest.approx(400 / 140) and one["rounds_held"] == "1/3"
    assert res["allreduce 64 KiB >= 3x MPICH", "hbmcoll-numpy"]["ok"] is True
    assert res["8 ranks on 2 cores: 8 B allreduce >= 10x MPICH", "hbmcoll-numpy"]["ok"] is True
    assert res["bcast 1 MiB >= 2x MPICH", "hbmcoll-numpy"]["ok"] is None   # not measured
    md = "\n".join(targets.markdown(targets.check(summ, rows, oversub)))
    assert "missed allreduce 1 MiB >= 3x MPICH (hbmcoll-numpy: 2.22x)" in md, md
    # judged: 64 KiB ok, 1 MiB missed, oversubscribed ok; the other 12 rows were not measured
    assert "2 of 3 held in this run" in md and "12 not measured" in md, md
    # a timeout in the oversubscribed case: hbmcoll's is a miss, MPICH's alone is a pass
    late = targets.check(summ, rows, [over("mpi4py", t=24000.0), over("hbmcoll-numpy", "timeout")])
    assert [r["ok"] for r in late if r["target"].startswith("8 ranks")] == [False]
    late = targets.check(summ, rows, [over("mpi4py", "timeout"), over("hbmcoll-numpy", t=30.0)])
    assert [r["ok"] for r in late if r["target"].startswith("8 ranks")] == [True]
    # not oversubscribed (more cores than ranks): not judged
    wide = [dict(o, cores=64) for o in oversub]
    assert not [r for r in targets.check(summ, rows, wide) if r["target"].startswith("8 ranks")]
    # the staged floor bounds what private buffers allow: best MPICH 200 us over its 80 us is
    # a ceiling of 2.5x, below 3x, so the 1 MiB miss is out of reach; at 64 KiB 20/4 = 5x
    staged = [row("floor-staged", k, t) for k, t in enumerate((90.0, 80.0, 85.0))]
    staged.append(row("floor-staged", 0, 4.0, 65536))
    summ = report.summarize(rows + staged, None)
    res = {(r["target"], r["label"]): r for r in targets.check(summ, rows + staged, oversub)}
    assert res["allreduce 1 MiB >= 3x MPICH", "hbmcoll-numpy"]["ceiling"] == pytest.approx(2.5)
    assert res["allreduce 64 KiB >= 3x MPICH", "hbmcoll-numpy"]["ceiling"] == pytest.approx(5.0)
    assert res["allreduce 16 MiB >= 3x MPICH, hbmcoll.empty", "hbmcoll-empty"]["ceiling"] is None
    md = "\n".join(targets.markdown(targets.check(summ, rows + staged, oversub)))
    assert "1 of the misses out of reach" in md and "| 2.50x | **missed** (out of reach) |" in md, md


def test_host_targets_take_the_fastest_peer_of_each_round_and_the_staged_floor():
    def row(lb, rnd, t, size=1 << 20):
        return {"label": lb, "library": lb.split("-")[0], "P": 2, "collective": "allreduce",
                "size": size, "round": rnd, "avg_us": t, "min_us": t, "max_us": t, "status": "ok"}
    # hbmcoll 100/150; MPICH 120/140, Open MPI 110/300: fastest best 110 (Open MPI) = 1.1x;
    # per round min(120, 110)/100 = 1.1, min(140, 300)/150 = 0.93: 1 of 2 held
    rows = [row("hbmcoll-numpy", 0, 100.0), row("hbmcoll-numpy", 1, 150.0),
            row("mpi4py", 0, 120.0), row("mpi4py", 1, 140.0),
            row("openmpi", 0, 110.0), row("openmpi", 1, 300.0),
            row("floor-staged", 0, 80.0), row("floor-staged", 1, 90.0),
            row("hbmcoll-empty", 0, 40.0), row("hbmcoll-numpy", 0, 2.0, 8), row("mpi4py", 0, 1.0, 8)]
    res = {r["target"]: r for r in targets.check_hosts(report.summarize(rows, None), rows)}
    peer = res["allreduce 1 MiB, 2 ranks: >= the fastest peer"]
    assert peer["peer"] == "openmpi" and peer["measured"] == pytest.approx(1.1) and peer["ok"]
    assert peer["rounds_held"] == "1/2" and peer["ceiling"] == pytest.approx(110 / 80)
    near = res["allreduce 1 MiB, 2 ranks: within 1.2x of floor-staged"]
    assert near["measured"] == pytest.approx(0.8) and near["ok"] is False  # 100 us over 80: 1.25x
    assert res["allreduce 8 B, 2 ranks: >= the fastest peer"]["ok"] is False
    assert "allreduce 8 B, 2 ranks: within 1.2x of floor-staged" not in res  # from 64 KiB only
    assert res["allreduce 1 MiB, 2 ranks: >= 3x MPICH, hbmcoll.empty"]["ok"] is True
    assert res["allreduce 1 MiB, 2 ranks: >= 3x Open MPI, hbmcoll.empty"]["measured"] == \
        pytest.approx(110 / 40)
    assert res["allreduce 16 MiB, 2 ranks: >= 3x MPICH, hbmcoll.empty"]["ok"] is None
    md = "\n".join(targets.markdown_hosts(list(res.values())))
    assert "| allreduce 1 MiB, 2 ranks: within 1.2x of floor-staged | hbmcoll-numpy | 1.25x |" in md, md
    assert "missed allreduce 8 B, 2 ranks: >= the fastest peer (mpi4py) (hbmcoll-numpy: 0.50x)" in md, md


def test_limit_target_judges_both_buffers_and_bounds_numpy_by_the_staged_floor():
    def row(lb, rnd, t):
        return {"label": lb, "library": lb.split("-")[0], "P": 2, "collective": "allreduce",
                "size": 16 << 20, "round": rnd, "avg_us": t, "min_us": t, "max_us": t,
                "status": "ok"}
    # 2PN = 64 MiB at 33.554432 GB/s = 2000 us: a 4000 us allreduce reaches 50%
    lim = {"cores": 2, "all_cores_GBps": 33.554432, "by_procs": {"2": {"best_GBps": 33.554432}}}
    rows = [row("hbmcoll-numpy", k, t) for k, t in enumerate((4200.0, 5000.0))] + \
           [row("floor-staged", k, t) for k, t in enumerate((4100.0, 4400.0))] + \
           [row("hbmcoll-empty", k, t) for k, t in enumerate((2500.0, 5000.0))]
    res = {r["label"]: r for r in targets.check(report.summarize(rows, lim), rows, [])
           if r["target"] == targets.LIMIT[0]}
    numpy, empty = res["hbmcoll-numpy"], res["hbmcoll-empty"]
    assert numpy["measured"] == pytest.approx(2000 / 4200) and numpy["ok"] is False
    assert numpy["ceiling"] == pytest.approx(2000 / 4100)  # the floor itself is below 50%
    assert numpy["rounds_held"] == "0/2"
    assert empty["measured"] == pytest.approx(0.8) and empty["ok"] is True
    assert empty["rounds_held"] == "1/2" and empty["paired_median"] == pytest.approx(0.6)
    md = "\n".join(targets.markdown(list(res.values()) + [
        {"target": "x", "label": "y", "need": 2.0, "measured": 3.0, "paired_median": None,
         "rounds_held": None, "ok": True}]))
    assert "| 48% | 44% | 0/2 | 49% | **missed** (out of reach) |" in md, md


@pytest.mark.parametrize("P", [2, 3])
def test_staged_floor_kernel_is_an_allreduce(P):
    """The staged floor must do the work it stands for: every rank ends with the sum (the
    root with every part, in gather), for a length that leaves a partial chunk and uneven
    slices, call after call."""
    kernel = floor_worker.staged_kernel()
    import mmap
    import numpy as np
    shared = mmap.mmap(-1, kernel.staged_floor_bytes(P))
    n = 150_001                       # 2 chunks of 64 Ki floats and a partial one
    pids = []
    for me in range(P):
        pid = os.fork()
        if pid == 0:
            ok = False
            try:
                import ctypes
                base = ctypes.addressof(ctypes.c_char.from_buffer(shared))
                ok = True
                for it in range(5):
                    x = np.arange(n, dtype=np.float32) % 97 + me + it
                    out = np.zeros(n, np.float32)
                    want = sum(np.arange(n, dtype=np.float32) % 97 + q + it for q in range(P))
                    for schedule in floor_worker.SCHEDULES["allreduce"]:  # one after the other
                        out[:] = 0
                        rc = getattr(kernel, f"staged_floor_{schedule}")(
                            base, me, P, x.ctypes.data, out.ctypes.data, n)
                        ok = ok and rc == 0 and np.array_equal(out, want)
                    for root, how in ((P - 1, 0), (0, 1), (P // 2, 2)):   # gather, to the root
                        g = np.zeros(n * P, np.float32)
                        rc = kernel.staged_floor_gather(base, me, P, root, how, x.ctypes.data,
                                                        g.ctypes.data, n)
                        want_g = np.concatenate([np.arange(n, dtype=np.float32) % 97 + q + it
                                                 for q in range(P)])
                        ok = ok and rc == 0 and (me != root or np.array_equal(g, want_g))
                    for root, how in ((0, 0), (P - 1, 1), (P // 2, 2)):   # bcast, in place
                        b = x.copy() if me == root else np.zeros(n, np.float32)
                        rc = kernel.staged_floor_bcast(base, me, P, root, how, b.ctypes.data, n)
                        want_b = np.arange(n, dtype=np.float32) % 97 + root + it
                        ok = ok and rc == 0 and np.array_equal(b, want_b)
            finally:
                os._exit(0 if ok else 1)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    assert codes == [0] * P


def test_suite_runs_and_writes_files(tmp_path):
    cmd = [sys.executable, os.path.join(BENCH, "suite.py"), "--sizes", "8,64K",
           "--collectives", "allreduce,bcast,gather,barrier", "--iters", "20",
           "--iters-large", "3", "--rounds", "1", "--oversub-np", "3", "--oversub-iters", "5",
           "--no-limits", "--timeout", "240", "--out", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if "no library available" in p.stderr:
        pytest.skip("none of mpi4py, torch, hbmcoll is usable here")
    assert p.returncode == 0, p.stderr[-3000:]
    run = os.path.join(tmp_path, "latest")
    doc = json.load(open(os.path.join(run, "results.json")))
    assert doc["meta"]["machine"]["usable_cpus"] >= 1
    cpus = doc["meta"]["noise"]["start"]["per_cpu"]      # host noise, one probe per CPU
    assert len(cpus) == doc["meta"]["machine"]["usable_cpus"]
    assert all(0 <= c["lost_fraction"] < 1 for c in cpus), cpus
    assert doc["summary"], doc["meta"]["tasks"]
    assert all(t["status"] == "ok" for t in doc["meta"]["tasks"]), doc["meta"]["tasks"]
    with open(os.path.join(run, "results.csv")) as f:
        assert len(list(csv.DictReader(f))) == len(doc["summary"])
    table = open(os.path.join(run, "table.md")).read()
    assert "## allreduce, 2 ranks" in table
    if doc["meta"]["machine"]["usable_cpus"] >= 2 and noise.cross_core() is not None:
        # a core-to-core sample before every launch (where a compiler builds the probe)
        assert all(t["xcore_gbps"] > 0 for t in doc["meta"]["tasks"]), doc["meta"]["tasks"]
        assert "Core to core before each launch" in table
    # the issue-4 targets are checked in every run that has the peers (64 KiB allreduce here)
    if "mpi4py" in doc["meta"]["libraries"] and "hbmcoll" in doc["meta"]["libraries"]:
        ar64 = [t for t in doc["targets"] if t["target"] == "allreduce 64 KiB >= 3x MPICH"]
        assert ar64 and ar64[0]["measured"] > 0 and "## Speed targets" in table, doc["targets"]
        # plain results first, each label explained, the target bookkeeping after them
        assert table.index("## allreduce, 2 ranks") < table.index("## Speed targets")
        assert "`hbmcoll-empty`: hbmcoll with hbmcoll.empty buffers" in table
    # the floor (no communication) is measured for allreduce only, the staged floor for
    # allreduce, gather and bcast, beside the libraries
    for lb, colls in (("floor", ["allreduce"]), ("floor-staged", ["allreduce", "gather", "bcast"])):
        floor = {(s["collective"], s["size"]) for s in doc["summary"] if s["label"] == lb}
        assert floor == {(c, z) for c in colls for z in (8, 65536)}, (lb, floor)


def test_launches_after_a_slow_core_to_core_sample_are_named():
    tasks = [{"label": "mpi4py", "round": 0, "xcore_gbps": 9.0}, {"label": "hbmcoll-numpy", "round": 0,
             "xcore_gbps": 2.2}, {"label": "hbmcoll-numpy", "round": "oversub", "xcore_gbps": 5.0},
             {"label": "torch", "round": 1, "xcore_gbps": None}]
    line = noise.slow_cross_core(tasks)
    assert "2.2-9.0 GB/s" in line and "before 1 of 3 launches (hbmcoll-numpy round 1 (2.2))" in line, line
    assert noise.slow_cross_core([{"label": "x", "round": 0}]) is None


def test_an_unknown_library_is_refused_with_the_valid_names():
    p = subprocess.run([sys.executable, os.path.join(BENCH, "suite.py"), "--libs", "hbmcoll,gloo"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and ("unknown gloo: choose from mpi4py, openmpi, torch, deepspeed, hbmcoll, "
                                  "floor, floor-staged") in p.stderr


def test_deepspeed_peer_is_its_shm_allreduce_and_leaves_no_segments(tmp_path):
    """DeepSpeed's shm allreduce under its own launcher, below and above its 1 MiB switch (each
    rank reduces all / its slice): each size checked by the worker, allreduce only (no shm
    bcast), and none of its /dev/shm segments left."""
    ds_python = os.environ.get("HBMCOLL_BENCH_DEEPSPEED_PYTHON") or os.path.join(
        os.path.dirname(BENCH), "build", "ds-venv", "bin", "python")
    if not os.path.exists(ds_python):
        pytest.skip(f"no DeepSpeed peer at {ds_python}: `make deepspeed-peer` makes build/ds-venv")
    shm = lambda: {f for f in os.listdir("/dev/shm") if f.startswith("deepspeed_allreduce")}  # noqa: E731
    before = shm()
    cmd = [sys.executable, os.path.join(BENCH, "suite.py"), "--libs", "deepspeed", "--sizes",
           "8,2M", "--collectives", "allreduce,bcast", "--iters", "20", "--iters-large", "3",
           "--rounds", "1", "--no-oversub", "--no-limits", "--no-plots", "--timeout", "240",
           "--out", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    skipped = [ln for ln in p.stderr.splitlines() if ln.startswith("[bench] deepspeed skipped")]
    if skipped:
        pytest.skip(skipped[0])
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.load(open(os.path.join(tmp_path, "latest", "results.json")))
    (task,) = doc["meta"]["tasks"]
    assert task["status"] == "ok", task
    assert task["meta"]["call"].startswith("deepspeed.comm.inference_all_reduce"), task["meta"]
    assert task["meta"]["shm_vector_kernel_level"] >= 1 and task["meta"]["LOCAL_SIZE"] == "2"
    assert {(s["collective"], s["size"]) for s in doc["summary"]} == {
        ("allreduce", 8), ("allreduce", 2 << 20)}, doc["summary"]
    assert "`deepspeed`: DeepSpeed's shared-memory CPU allreduce" in open(
        os.path.join(tmp_path, "latest", "table.md")).read()
    assert shm() <= before, shm() - before


def test_floor_worker_dead_rank_stops_the_others(tmp_path):
    """A rank that dies while it waits at a barrier ends the run at once: the survivor is not
    left at the next barrier (600 s), and the worker says which rank died."""
    spec = tmp_path / "spec.json"
    # many short timed loops: a barrier every few milliseconds, for minutes
    spec.write_text(json.dumps({"collectives": ["allreduce"], "sizes": [8] * 100000,
                                "iters_small": 2000, "skip_small": 10}))
    worker = os.path.join(BENCH, "workers", "floor_worker.py")
    p = subprocess.Popen([sys.executable, worker, "2", str(spec), str(tmp_path / "out")],
                         stderr=subprocess.PIPE, text=True, start_new_session=True)

    def state(pid):  # R running, S sleeping (a barrier), T stopped
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]

    try:
        children = f"/proc/{p.pid}/task/{p.pid}/children"
        deadline = time.monotonic() + 60
        kids = []
        while time.monotonic() < deadline and len(kids) < 2:
            kids = open(children).read().split() if os.path.exists(children) else []
            time.sleep(0.02)
        assert len(kids) == 2, kids
        os.kill(int(kids[0]), signal.SIGSTOP)    # rank 0 held: rank 1 ends up waiting for it
        while time.monotonic() < deadline and state(kids[1]) != "S":
            time.sleep(0.01)
        assert state(kids[1]) == "S"              # rank 1 asleep at a barrier
        os.kill(int(kids[1]), signal.SIGKILL)     # dies there (Barrier.abort() would then hang)
        os.kill(int(kids[0]), signal.SIGCONT)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 1 and "rank 1 exited with -9" in err, err
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)     # nothing of the run may outlive the test
        except ProcessLookupError:
            pass
        p.wait()
