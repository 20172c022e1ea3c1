"""Plans against every topology fixture, compared to golden JSON files.

Run:   make -f numa/Makefile.inc build/coll-topo && python3 -m pytest -q tests/numa/test_plans.py
Regenerate goldens (then review every changed one by hand: `git diff tests/numa/golden`):
       HBMCOLL_REGEN_GOLDEN=1 python3 -m pytest -q tests/numa/test_plans.py

Besides the goldens, each plan is checked against invariants computed here
from the hwloc XML itself (one rank per core while cores are free, buffers on
a node local to the rank's PU, HBM used whenever there is some, ranks even
over packages and clusters), so that a wrong golden cannot pass silently.
"""
import json
import os
import re
import shutil
import subprocess
import tarfile
import xml.etree.ElementTree as ET

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(HERE, "fixtures")
GOLDEN = os.path.join(HERE, "golden")
CLI = os.environ.get("COLL_TOPO", os.path.join(ROOT, "build", "coll-topo"))
REGEN = os.environ.get("HBMCOLL_REGEN_GOLDEN") == "1"

# What each fixture must give (independent of the goldens).
EXPECT = {
    "64intel64-fakeKNL-SNC4-hybrid.xml": ("hybrid", "SNC4", [4, 5, 6, 7]),
    "64intel64-fakeKNL-SNC4-hybrid.tar.bz2": ("hybrid", "SNC4", [4, 5, 6, 7]),
    "64intel64-fakeKNL-A2A-cache.tar.bz2": ("cache", "All2All", []),
    # captured from the emulated KNL guest (tests/numa/capture_qemu_fsroot.sh): hwloc's KNL
    # quirk says MemoryMode=Flat and shows no MemCache; sysfs memory_side_cache makes it hybrid
    "qemu-knl-snc4-hybrid.tar.bz2": ("hybrid", "SNC4", [4, 5, 6, 7]),
    "8intel64-fakeKNL-A2A-hybrid.rootattachednumas.xml": ("hybrid", "All2All", [1]),
    "knl-snc4-flat-synth.xml": ("flat", None, [1, 3, 5, 7]),
    "knl-quad-flat.xml": ("flat", "Quadrant", [1]),
    "knl-quad-cache.xml": ("cache", "Quadrant", []),
    "knl-quad-hybrid.xml": ("hybrid", "Quadrant", [1]),
    "knl-snc2-flat.xml": ("flat", "SNC2", [1, 3]),
    "knl-snc2-cache.xml": ("cache", "SNC2", []),
    "knl-snc2-hybrid.xml": ("hybrid", "SNC2", [1, 3]),
    "knl-snc4-flat.xml": ("flat", "SNC4", [1, 3, 5, 7]),
    "knl-snc4-cache.xml": ("cache", "SNC4", []),
    "knl-snc4-hybrid.xml": ("hybrid", "SNC4", [1, 3, 5, 7]),
    "knl72-quad-cache.xml": ("cache", "Quadrant", []),
    "knl72-snc4-flat.xml": ("flat", "SNC4", [1, 3, 5, 7]),
    "xeonmax-2s-snc4-flat.xml": ("flat", None, [1, 3, 5, 7, 9, 11, 13, 15]),
    "2s-snc4-second-tier-1.5x.xml": ("none", None, []),
}

RANKS = [1, 6, 70]
# (fixture, ranks, memory, bind) beyond the default policy
VARIANTS = [
    ("knl-snc4-flat.xml", 4, None, None),   # 4 ranks x 16 cores: frameworks' KNL layout
    ("knl-snc4-flat.xml", 6, None, "core"),  # one core each, as before share was the default
    ("knl-snc4-flat.xml", 6, "hbm_bind", None),
    ("knl-snc4-flat.xml", 6, "hbm_interleave", None),
    ("knl-snc4-flat.xml", 6, "ddr", None),
    ("knl-snc4-flat.xml", 6, None, "cluster"),
    ("knl-snc4-flat.xml", 6, None, "none"),
    ("knl-quad-cache.xml", 4, "hbm_bind", None),
    ("xeonmax-2s-snc4-flat.xml", 10, "hbm_interleave", None),
    ("xeonmax-2s-snc4-flat.xml", 120, None, None),
    ("64intel64-fakeKNL-SNC4-hybrid.xml", 20, "ddr", None),
]


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HBMCOLL_", "HWLOC_")) and k != "MEMKIND_HBW_NODES"}
    return env


def run_cli(args, env=None):
    if not os.path.exists(CLI):
        subprocess.run(["make", "-s", "-f", "numa/Makefile.inc", "build/coll-topo"], cwd=ROOT,
                       check=True)
    return subprocess.run([CLI] + args, capture_output=True, text=True, env=env or clean_env(),
                          timeout=60)


@pytest.fixture(scope="session")
def extracted(tmp_path_factory):
    """Tarball fixtures extracted once: name -> directory usable as HWLOC_FSROOT."""
    out = {}
    base = tmp_path_factory.mktemp("fsroot")
    for name in sorted(os.listdir(FIXTURES)):
        if name.endswith(".tar.bz2"):
            with tarfile.open(os.path.join(FIXTURES, name)) as t:
                if hasattr(tarfile, "data_filter"):
                    t.extractall(base, filter="data")
                else:
                    t.extractall(base)
            out[name] = str(base / name[:-len(".tar.bz2")])
    return out


def topology_arg(name, extracted):
    return extracted[name] if name.endswith(".tar.bz2") else os.path.join(FIXTURES, name)


def xml_of(name, extracted):
    """hwloc XML text of a fixture (tarballs exported through lstopo)."""
    if not name.endswith(".tar.bz2"):
        with open(os.path.join(FIXTURES, name)) as f:
            return f.read()
    env = clean_env()
    env.update(HWLOC_FSROOT=extracted[name], HWLOC_COMPONENTS="linux,stop",
               HWLOC_DUMPED_HWDATA_DIR="/var/run/hwloc")
    return subprocess.run(["lstopo-no-graphics", "--no-io", "--of", "xml", "-"], env=env,
                          check=True, capture_output=True, text=True).stdout


def parse_bitmap(s):
    """hwloc bitmap string ("0xffffffff,,0x1") -> set of bits."""
    words = s.split(",")
    bits = set()
    for i, w in enumerate(reversed(words)):
        v = int(w, 16) if w else 0
        bits.update(i * 32 + b for b in range(32) if v >> b & 1)
    return bits


def facts(xml_text):
    """core of each PU, package of each PU, cpuset of each NUMA node."""
    root = ET.fromstring(xml_text)
    pu_core, pu_pkg, node_cpus = {}, {}, {}

    def walk(e, core, pkg):
        t = e.get("type")
        if t == "Core":
            core = e.get("gp_index")
        if t == "Package":
            pkg = e.get("gp_index")
        if t == "PU":
            os_i = int(e.get("os_index"))
            pu_core[os_i] = core if core is not None else "pu%d" % os_i
            pu_pkg[os_i] = pkg
        if t == "NUMANode":
            node_cpus[int(e.get("os_index"))] = parse_bitmap(e.get("cpuset"))
        for c in e.findall("object"):
            walk(c, core, pkg)

    for top in root.findall("object"):
        walk(top, None, None)
    return pu_core, pu_pkg, node_cpus


def golden_name(fixture, ranks, memory, bind):
    n = "%s__r%d" % (fixture, ranks)
    if memory:
        n += "__mem-" + memory
    if bind:
        n += "__bind-" + bind
    return os.path.join(GOLDEN, n + ".json")


def parse_list(text):
    """'0-3,8' -> {0, 1, 2, 3, 8}"""
    out = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out


def check_invariants(plan, fixture, ranks, memory, bind, extracted):
    mode, cmode, hbm = EXPECT[fixture]
    assert plan["memory_mode"] == mode
    assert plan["cluster_mode"] == cmode
    assert plan["hbm_nodes"] == hbm
    assert [r["rank"] for r in plan["ranks"]] == list(range(ranks))
    pu_core, pu_pkg, node_cpus = facts(xml_of(fixture, extracted))
    ncores = len(set(pu_core.values()))
    pus = [r["pu"] for r in plan["ranks"]]
    if bind == "none":
        assert all(p is None for p in pus)
    else:
        assert all(p in pu_core for p in pus)
        assert len(set(pus)) == min(ranks, len(pu_core)), "two ranks on one PU while PUs are free"
        cores = [pu_core[p] for p in pus]
        assert len(set(cores)) == min(ranks, ncores), "two ranks on one core while cores are free"
        pkgs = {}
        for p in pus:
            pkgs[pu_pkg[p]] = pkgs.get(pu_pkg[p], 0) + 1
        if len(pkgs) > 1 or len(set(pu_pkg.values())) > 1:
            counts = [pkgs.get(k, 0) for k in set(pu_pkg.values())]
            assert max(counts) - min(counts) <= 1, "ranks uneven over packages: %s" % counts
    if bind in (None, "share") and ranks <= ncores:
        # share (the default): every core of the machine is some rank's, no core is two
        # ranks', each rank's set holds its PU, and its threads are its cores
        sets = [parse_list(r["cpus"]) for r in plan["ranks"]]
        assert all(r["pu"] in s for r, s in zip(plan["ranks"], sets))
        owners = {}
        for i, cpus in enumerate(sets):
            for p in cpus:
                assert p not in owners, f"PU {p} in the sets of ranks {owners[p]} and {i}"
                owners[p] = i
        assert set(owners) == set(pu_core), "cores left to no rank"
        for r, cpus in zip(plan["ranks"], sets):
            assert r["threads"] == len({pu_core[p] for p in cpus})
    elif bind == "core" and ranks <= ncores:
        assert all(len({pu_core[p] for p in parse_list(r["cpus"])}) == 1 for r in plan["ranks"])
    for r in plan["ranks"]:
        nodes = r["buffer_nodes"]
        assert nodes and all(n in node_cpus for n in nodes)
        want_hbm = bool(hbm) and memory != "ddr"
        assert all((n in hbm) == want_hbm for n in nodes), r
        if memory == "hbm_interleave" and hbm:
            assert nodes == hbm
        elif r["pu"] is not None:
            assert len(nodes) == 1 and r["pu"] in node_cpus[nodes[0]], "buffer not local: %s" % r


CASES = [(f, n, None, None) for f in sorted(EXPECT) for n in RANKS] + VARIANTS


def case_id(c):
    f, n, m, b = c
    return "%s-r%d%s%s" % (f, n, "-" + m if m else "", "-" + b if b else "")


def test_every_fixture_has_expectations():
    have = sorted(f for f in os.listdir(FIXTURES) if f.endswith((".xml", ".tar.bz2")))
    assert have == sorted(EXPECT)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_plan_matches_golden(case, extracted):
    fixture, ranks, memory, bind = case
    args = ["--topology", topology_arg(fixture, extracted), "--ranks", str(ranks), "--json"]
    if memory:
        args += ["--memory", memory]
    if bind:
        args += ["--bind", bind]
    res = run_cli(args)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert sorted(plan) == ["cluster_mode", "hbm_nodes", "memory_mode", "ranks"]
    check_invariants(plan, fixture, ranks, memory, bind, extracted)
    path = golden_name(fixture, ranks, memory, bind)
    if REGEN:
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            json.dump(plan, f, indent=1)
            f.write("\n")
    with open(path) as f:
        assert plan == json.load(f)


def test_no_orphan_goldens():
    want = {os.path.basename(golden_name(*c)) for c in CASES}
    have = set(os.listdir(GOLDEN))
    assert have <= want, "goldens without a case: %s" % sorted(have - want)


# ---- this machine and the human report -----------------------------------

def test_this_machine_without_hbm_says_ddr():
    res = run_cli(["--ranks", "2"])
    assert res.returncode == 0, res.stderr
    nodes = os.listdir("/sys/devices/system/node") if os.path.isdir("/sys/devices/system/node") else []
    if sum(n.startswith("node") for n in nodes) != 1:
        pytest.skip("this test describes the one-node dev box")
    assert "no high-bandwidth memory" in res.stdout and "buffers use DDR" in res.stdout
    plan = json.loads(run_cli(["--ranks", "2", "--json"]).stdout)
    assert plan["memory_mode"] == "none" and plan["hbm_nodes"] == []
    assert all(r["buffer_nodes"] == [0] for r in plan["ranks"])


def test_hbm_nodes_override_on_this_machine():
    env = clean_env()
    env["HBMCOLL_HBM_NODES"] = "0"
    plan = json.loads(run_cli(["--ranks", "2", "--json"], env=env).stdout)
    assert plan["hbm_nodes"] == [0] and plan["memory_mode"] == "flat"
    env = clean_env()
    env["MEMKIND_HBW_NODES"] = "0"
    plan = json.loads(run_cli(["--ranks", "1", "--json"], env=env).stdout)
    assert plan["hbm_nodes"] == [0]


def test_override_replaces_detection_and_drops_unknown_nodes():
    env = clean_env()
    env["HBMCOLL_HBM_NODES"] = "3,99"
    res = run_cli(["--topology", os.path.join(FIXTURES, "knl-snc4-flat.xml"), "--ranks", "4"],
                  env=env)
    assert res.returncode == 0, res.stderr
    assert "node 99" in res.stdout and "ignored" in res.stdout
    res = run_cli(["--topology", os.path.join(FIXTURES, "knl-snc4-flat.xml"), "--ranks", "4",
                   "--json"], env=env)
    plan = json.loads(res.stdout)
    assert plan["hbm_nodes"] == [3]
    # cluster 1 uses its own HBM node; the others the nearest one in the package
    assert [r["buffer_nodes"] for r in plan["ranks"]] == [[3], [3], [3], [3]]


def test_cache_mode_report_says_ddr(extracted):
    res = run_cli(["--topology", topology_arg("64intel64-fakeKNL-A2A-cache.tar.bz2", extracted)])
    assert res.returncode == 0, res.stderr
    assert "memory mode:  cache" in res.stdout and "buffers use DDR" in res.stdout


QEMU_HYBRID = "qemu-knl-snc4-hybrid.tar.bz2"


def test_sysfs_memory_side_caches_make_hybrid(extracted):
    """hwloc shows no memory-side cache in the KNL guest; sysfs does: hybrid, said where from."""
    root = extracted[QEMU_HYBRID]
    node0 = os.path.join(root, "sys/devices/system/node/node0/memory_side_cache")
    assert os.path.isdir(node0)
    env = clean_env()
    env.update(HWLOC_FSROOT=root, HWLOC_COMPONENTS="linux,stop")
    lst = subprocess.run(["lstopo-no-graphics", "--no-io", "-v"], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert "MemoryMode=Flat" in lst and "MemCache" not in lst, "hwloc's view changed: recheck"
    res = run_cli(["--topology", root, "--ranks", "4"])
    assert res.returncode == 0, res.stderr
    assert "memory mode:  hybrid (hwloc MemoryMode=Flat)" in res.stdout
    assert "memory-side caches: 4, 32 MiB in total (from sysfs memory_side_cache" in res.stdout
    for n in range(4):
        assert re.search(r"node %d +DDR .*behind a memory-side cache" % n, res.stdout)
    for n in range(4, 8):
        assert re.search(r"node %d +HBM " % n, res.stdout)
        assert not re.search(r"node %d +HBM .*behind" % n, res.stdout)
    # this machine's sysfs is read relative to HWLOC_FSROOT when the user sets it
    plan = json.loads(run_cli(["--ranks", "4", "--json"], env=env).stdout)
    assert plan["memory_mode"] == "hybrid" and plan["hbm_nodes"] == [4, 5, 6, 7]


def test_sysfs_memory_side_caches_absent_stays_flat(extracted, tmp_path):
    """The same guest without the memory_side_cache directories is flat: the sysfs entries,
    not the KNL CPU or the MCDRAM nodes, make it hybrid."""
    root = str(tmp_path / "flat")
    shutil.copytree(extracted[QEMU_HYBRID], root, symlinks=True)
    for n in range(8):
        shutil.rmtree(os.path.join(root, "sys/devices/system/node/node%d/memory_side_cache" % n),
                      ignore_errors=True)
    plan = json.loads(run_cli(["--topology", root, "--ranks", "4", "--json"]).stdout)
    assert plan["memory_mode"] == "flat" and plan["hbm_nodes"] == [4, 5, 6, 7]


def test_xml_topology_never_reads_sysfs(extracted):
    """An XML topology is a foreign machine: no sysfs is read for it (here: flat stays flat
    even when HWLOC_FSROOT points at a tree with memory-side caches)."""
    env = clean_env()
    env.update(HWLOC_FSROOT=extracted[QEMU_HYBRID])
    plan = json.loads(run_cli(["--topology", os.path.join(FIXTURES, "knl-snc4-flat.xml"),
                               "--ranks", "4", "--json"], env=env).stdout)
    assert plan["memory_mode"] == "flat"


def test_xeon_max_without_subtype_found_by_bandwidth():
    res = run_cli(["--topology", os.path.join(FIXTURES, "xeonmax-2s-snc4-flat.xml")])
    assert res.returncode == 0, res.stderr
    assert "HBM nodes: 1, 3, 5, 7, 9, 11, 13, 15" in res.stdout


@pytest.mark.parametrize("args,code", [
    (["--memory", "fast"], 1), (["--bind", "socketx"], 1), (["--ranks", "0"], 2),
    (["--topology", "/nonexistent.xml"], 1), (["--frobnicate"], 2)])
def test_bad_arguments(args, code):
    res = run_cli(args)
    assert res.returncode == code
    assert res.stderr.startswith("coll-topo: ")


def test_bad_env_policy():
    env = clean_env()
    env["HBMCOLL_MEMORY"] = "fast"
    assert run_cli([], env=env).returncode == 1
