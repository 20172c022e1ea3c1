#!/usr/bin/env python3
"""Regenerate the synthetic topology fixtures of tests/numa/fixtures/.

Each one is made the way knl-emulation/README.md says: an hwloc synthetic
description exported with `lstopo-no-graphics -i "<synthetic>" --of xml`, then
`hwloc-annotate` for subtypes, KNL mode infos and Bandwidth memattrs. Memory-
side caches cannot be written in the synthetic grammar, so for cache and hybrid
modes the DDR NUMANode elements are wrapped in a MemCache object here (as hwloc
itself shows Xeon Max cache mode and HMAT memory-side caches), and the result
is reloaded through lstopo so hwloc checks it.

The copied real fixtures (hwloc's test suite, BSD) are not touched.
Usage: python3 tests/numa/make_fixtures.py  (needs hwloc-nox)
"""
import os
import subprocess
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
GB = 1 << 30

# KNL 7210-like: 64 cores in 32 tiles (2 cores share an L2), 4 threads per core.
KNL = {
    "quad": ("Quadrant", "package:1 {mem} l2:32 core:2 pu:4"),
    "snc2": ("SNC2", "package:1 group:2 {mem} l2:16 core:2 pu:4"),
    "snc4": ("SNC4", "package:1 group:4 {mem} l2:8 core:2 pu:4"),
}
# KNL 7290-like: 72 cores in 36 tiles (the largest Xeon Phi), for the tree plan checks.
KNL72 = {
    "quad": ("Quadrant", "package:1 {mem} l2:36 core:2 pu:4"),
    "snc4": ("SNC4", "package:1 group:4 {mem} l2:9 core:2 pu:4"),
}
# DDR 96 GB + MCDRAM 16 GB, split over the clusters
KNL_NCL = {"quad": 1, "snc2": 2, "snc4": 4}


def run(*args):
    subprocess.run(args, check=True)


def synth(desc, path):
    run("lstopo-no-graphics", "-i", desc, "--of", "xml", "-f", path)


def annotate(path, *loc_and_annotation):
    run("hwloc-annotate", path, path, *loc_and_annotation)


def cpuset_of(path, loc):
    return subprocess.run(["hwloc-calc", "-i", path, loc], check=True, capture_output=True,
                          text=True).stdout.strip()


def wrap_ddr_in_memcache(path, cache_bytes, ddr_logical):
    """Put a MemCache of cache_bytes above each NUMANode whose logical index is in ddr_logical."""
    tree = ET.parse(path)
    root = tree.getroot()
    gp = max(int(e.get("gp_index", "0")) for e in root.iter("object")) + 1
    numas = [e for e in root.iter("object") if e.get("type") == "NUMANode"]
    parents = {c: p for p in root.iter() for c in p}
    for i, node in enumerate(numas):
        if i not in ddr_logical:
            continue
        parent = parents[node]
        idx = list(parent).index(node)
        mc = ET.Element("object", {
            "type": "MemCache", "cpuset": node.get("cpuset"),
            "complete_cpuset": node.get("complete_cpuset"), "nodeset": node.get("nodeset"),
            "complete_nodeset": node.get("complete_nodeset"), "gp_index": str(gp),
            "cache_size": str(cache_bytes), "depth": "1", "cache_linesize": "64",
            "cache_associativity": "1", "cache_type": "0"})
        gp += 1
        parent.remove(node)
        mc.append(node)
        parent.insert(idx, mc)
    with tempfile.NamedTemporaryFile("wb", suffix=".xml", delete=False) as f:
        tree.write(f, encoding="UTF-8", xml_declaration=True)
        tmp = f.name
    try:  # reload through hwloc: checks it and writes it back in hwloc's form
        run("lstopo-no-graphics", "-i", tmp, "--of", "xml", "-f", path)
    finally:
        os.unlink(tmp)


def knl(cluster, mode, shapes=KNL, prefix="knl"):
    cmode, shape = shapes[cluster]
    ncl = KNL_NCL[cluster]
    ddr = 96 * GB // ncl
    mcdram = 16 * GB // ncl
    if mode == "flat":
        mem = f"[numa(memory={ddr})] [numa(memory={mcdram})]"
    elif mode == "cache":
        mem = f"[numa(memory={ddr})]"
    else:  # hybrid 50: half the MCDRAM is a cache, half a NUMA node
        mem = f"[numa(memory={ddr})] [numa(memory={mcdram // 2})]"
    path = os.path.join(OUT, f"{prefix}-{cluster}-{mode}.xml")
    synth(shape.format(mem=mem), path)
    per = 1 if mode == "cache" else 2
    if mode != "cache":
        for c in range(ncl):
            annotate(path, f"NUMANode:{c * per + 1}", "subtype", "MCDRAM")
    annotate(path, "root", "info", "ClusterMode", cmode)
    annotate(path, "root", "info", "MemoryMode",
             {"flat": "Flat", "cache": "Cache", "hybrid": "Hybrid50"}[mode])
    if mode != "flat":
        cache = mcdram if mode == "cache" else mcdram // 2
        wrap_ddr_in_memcache(path, cache, {c * per for c in range(ncl)})


def xeonmax(name, hbm_bw, ddr_bw=70000):
    """Two sockets of 56 cores, SNC-4: per SNC domain 32 GB DDR + 16 GB HBM.
    No subtype and no KNL infos: only HMAT-like Bandwidth memattrs (MiB/s)."""
    path = os.path.join(OUT, name)
    synth("package:2 group:4 [numa(memory=34359738368)] [numa(memory=17179869184)] core:14 pu:2",
          path)
    for n in range(16):
        cpus = cpuset_of(path, f"numa:{n}")
        annotate(path, f"NUMANode:{n}", "memattr", "Bandwidth", cpus,
                 str(hbm_bw if n % 2 else ddr_bw))


def main():
    os.makedirs(OUT, exist_ok=True)
    for cluster in KNL:
        for mode in ("flat", "cache", "hybrid"):
            knl(cluster, mode)
    knl("quad", "cache", KNL72, "knl72")
    knl("snc4", "flat", KNL72, "knl72")
    xeonmax("xeonmax-2s-snc4-flat.xml", hbm_bw=250000)
    # negative case: a slower-than-2x second tier (CXL-like) is not HBM
    xeonmax("2s-snc4-second-tier-1.5x.xml", hbm_bw=105000)


if __name__ == "__main__":
    main()
