"""The tuning cache: which variables `python -m hbmcoll.tune` (tune.py) sets and the candidates it
measures for each, where this host's cache is (keyed by the CPU model, core count, kernel and
hbmcoll version), and applying it: init() and the torch backend's groups call apply() before a
communicator is made, and the cached choices become the defaults of the variables the environment
leaves unset. Nothing here measures: the runtime imports this, never the measuring command.
"""
import hashlib
import json
import os
import platform

# the variables the tuning sets (the cache sets no other), and the candidates measured for each
CANDIDATES = {"HBMCOLL_SMALL_MAX": ["8K", "16K", "32K", "64K", "128K"],
              "HBMCOLL_CMA": ["0", "gather", "bcast", "1", "auto"],
              "HBMCOLL_CMA_MIN": ["64K", "128K", "256K", "512K", "1M"],
              "HBMCOLL_SLOT_BYTES": ["128K", "256K", "512K"],
              "HBMCOLL_REP_MOVSB_MIN": ["auto", "off", "256K", "1M"],
              "HBMCOLL_STREAM_MIN": ["auto", "1M", "4M", "16M"],
              "HBMCOLL_PUSH_MIN": ["auto", "256K", "1M", "4M"],
              "HBMCOLL_PUSH_STREAM_MIN": ["auto", "1M", "4M", "16M"]}
_applied = None


def host():
    """What the cache is keyed by."""
    from .._version import __version__
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "kernel": platform.release(), "hbmcoll": __version__}


def cache_path():
    if os.environ.get("HBMCOLL_TUNE_FILE"):
        return os.environ["HBMCOLL_TUNE_FILE"]
    key = hashlib.sha256(json.dumps(host(), sort_keys=True).encode()).hexdigest()[:16]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "hbmcoll", f"tuned-{key}.json")


def load():
    """The cache of this host, or None (none, HBMCOLL_TUNE=off, or another host's)."""
    if os.environ.get("HBMCOLL_TUNE", "").lower() in ("off", "0", "no"):
        return None
    try:
        with open(cache_path()) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if doc.get("host") == host() else None


def apply():
    """Once per process, before a communicator is made: the cached choices become the defaults
    of the variables the environment leaves unset. Returns what was applied ({} for none)."""
    global _applied
    if _applied is None:
        doc = load() or {}
        _applied = {k: v for k, v in doc.get("choice", {}).items() if k in CANDIDATES and k not in os.environ}
        os.environ.update(_applied)
        _applied = dict(_applied, _file=cache_path(), _when=doc.get("when")) if _applied else {}
    return _applied
