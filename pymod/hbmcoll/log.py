"""HBMCOLL_LOG=warn|info|debug: what hbmcoll decides, on stderr, a line each, naming the rank.

- warn (the default): what went another way than asked (no HBM, cache mode, mbind refused, a
  missing provider) and waits that last, as the C core prints them (HBMCOLL_QUIET=1 silences
  the fallback lines).
- info: also each communicator as it is made: ranks, launcher, where the rank is pinned and its
  buffers placed, the transports, the limit on a wait, forced algorithms.
- debug: also every call with its bytes and time (timeline.py measures them).

The lines go through Python's logging (logger "hbmcoll"), so an application can route them.
"""
import logging
import os

from .errors import ArgumentError

LEVELS = {"warn": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}
logger = logging.getLogger("hbmcoll")
_level = None


def level():
    """HBMCOLL_LOG as a logging level (parsed once; a bad value is an error on every rank)."""
    global _level
    if _level is None:
        text = os.environ.get("HBMCOLL_LOG", "warn").strip().lower()
        if text not in LEVELS:
            raise ArgumentError(f"HBMCOLL_LOG={text!r}: one of {', '.join(LEVELS)}")
        _level = LEVELS[text]
        if _level < logging.WARNING:
            if not logger.handlers:  # an application's own handler keeps its place
                handler = logging.StreamHandler()
                handler.setFormatter(logging.Formatter("hbmcoll %(message)s"))
                logger.addHandler(handler)
                logger.propagate = False
            logger.setLevel(_level)
    return _level


def enabled(at):
    return level() <= at


def say(at, rank, text):
    if level() <= at:
        logger.log(at, "[rank %s]: %s", rank, text)


def communicator_made(comm, kind, transports):
    """The info lines of a new communicator."""
    if level() > logging.INFO:
        return
    say(logging.INFO, comm.rank, f"{kind} of {comm.size} ranks ({comm.local_size} on this node, launched by "
                                 f"{comm.launcher}); transports: {transports}")
    placement = getattr(comm, "_placement", None)
    if placement is not None:
        where = "not pinned" if placement.pu is None else f"pinned to PU {placement.pu}"
        say(logging.INFO, comm.rank, f"{where}, {placement.threads} compute thread(s); "
                                     f"{(placement.notice or 'placement as planned').removeprefix('hbmcoll: ')}")
    timeout = getattr(comm, "_timeout", None)
    say(logging.INFO, comm.rank, f"a wait ends after {timeout} s (HBMCOLL_TIMEOUT)" if timeout else
        "waits have no limit (HBMCOLL_TIMEOUT unset): a stalled peer is reported, not ended")
    from .tools import tune_cache
    tuned = tune_cache.apply()
    if tuned:
        say(logging.INFO, comm.rank, "thresholds measured on this host (python -m hbmcoll.tune, " +
            f"{tuned['_when']}, {tuned['_file']}): " +
            ", ".join(f"{k}={v}" for k, v in tuned.items() if not k.startswith("_")))
    forced = os.environ.get("HBMCOLL_ALGO")
    if forced:
        say(logging.INFO, comm.rank, f"algorithms forced by HBMCOLL_ALGO={forced}")
