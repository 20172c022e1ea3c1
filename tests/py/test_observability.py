"""HBMCOLL_TIMELINE (timeline.py) and HBMCOLL_LOG (log.py) in real jobs under hbmcoll-run: the
timeline file parses as JSON with every rank's calls, nested and timed; the log says what each
level promises; a bad level is one clear error on every rank."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(HERE)), "pymod"),
           HBMCOLL_BIND="none", HBMCOLL_TIMEOUT="60")
JOB = r"""
import numpy as np, hbmcoll
c = hbmcoll.init()
x = np.ones(1000, np.float32)
for _ in range(3):
    c.allreduce(x)
c.iallreduce(x).wait()
c.allgather_object({"rank": c.rank})
c.split(c.rank % 2).barrier()
c.sendrecv(x, (c.rank + 1) % c.size, np.empty_like(x), (c.rank - 1) % c.size)
"""


def _run(tmp_path, n, **env):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", str(n), sys.executable, str(script)],
                          env=dict(ENV, **env), capture_output=True, text=True, timeout=120)


def test_a_timeline_parses_with_every_ranks_calls(tmp_path):
    path = tmp_path / "timeline.json"
    path.write_text("left from an earlier job")  # emptied when the job starts
    res = _run(tmp_path, 3, HBMCOLL_TIMELINE=str(path))
    assert res.returncode == 0, res.stderr
    events = json.loads(path.read_text())
    calls = [e for e in events if e["ph"] == "X"]
    names = {r: sorted(e["name"] for e in calls if e["pid"] == r) for r in range(3)}
    assert all(names[r] == sorted(["allreduce"] * 3 + ["iallreduce", "allgather", "allgatherv",
                                                       "allgather_object", "barrier", "sendrecv"])
               for r in range(3)), names
    assert all(e["dur"] >= 0 and e["args"]["bytes"] >= 0 for e in calls)
    assert {e["args"]["bytes"] for e in calls if e["name"] == "allreduce"} == {4000}
    # 4000 bytes: the copy-in allreduce, as the core chose it (HBMCOLL_SMALL_MAX: 16K)
    assert {e["args"].get("algorithm") for e in calls if e["name"] == "allreduce"} == {"flat"}
    for r in range(3):  # the object collective's allgathers lie inside it
        outer = [e for e in calls if e["pid"] == r and e["name"] == "allgather_object"][0]
        inner = [e for e in calls if e["pid"] == r and e["name"] == "allgather"]
        assert all(outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] for e in inner)
    meta = {(e["pid"], e["name"]) for e in events if e["ph"] == "M"}
    assert {(r, "process_name") for r in range(3)} <= meta
    barrier_threads = {e["tid"] for e in calls if e["name"] == "barrier"}
    assert barrier_threads == {1}  # the split's communicator, a thread of its own


def test_log_levels_say_what_they_promise(tmp_path):
    quiet = _run(tmp_path, 2)
    info = _run(tmp_path, 2, HBMCOLL_LOG="info")
    debug = _run(tmp_path, 2, HBMCOLL_LOG="debug")
    assert quiet.returncode == info.returncode == debug.returncode == 0, debug.stderr
    assert "[rank" not in quiet.stderr
    for r in range(2):
        assert f"hbmcoll [rank {r}]: Communicator of 2 ranks" in info.stderr, info.stderr
        assert f"hbmcoll [rank {r}]: a wait ends after 60" in info.stderr
    assert "allreduce 4000 bytes" not in info.stderr
    assert debug.stderr.count("]: allreduce 4000 bytes") == 6, debug.stderr
    assert debug.stderr.count(" us (flat)") >= 6, debug.stderr
    assert debug.stderr.count("]: iallreduce 4000 bytes") == 2


@pytest.mark.parametrize("var", ["HBMCOLL_LOG"])
def test_a_bad_log_level_is_one_clear_error(tmp_path, var):
    res = _run(tmp_path, 2, **{var: "loud"})
    assert res.returncode != 0
    assert "HBMCOLL_LOG='loud': one of warn, info, debug" in res.stderr
