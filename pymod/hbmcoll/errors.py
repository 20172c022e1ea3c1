"""hbmcoll's exceptions: one family, and one mapping from libcoll's codes to it.

Every exception hbmcoll raises is a `CodedError` with `.code` (libcoll's code: a negative
errno, or one of the COLL_E* codes of coll.h) and `.name` ("EMISMATCH", "ETIMEDOUT", ...).
Failures of a communicator or a collective are `hbmcoll.Error`s. A misuse (`ArgumentError`,
also a ValueError) is not: it is found before anything moves and leaves the communicator
usable, so `except hbmcoll.Error` around a training step does not swallow a programming
error. Where Python has a matching built-in exception the class derives from it too, so
`except ValueError` / `except MemoryError` / `except TimeoutError` / `except OSError` work. The C extension turns every code
into an exception through `from_code` below, and so does the Python code: one mapping.
"""
import builtins
import errno
import os

# libcoll/include/coll.h: COLL_ERRNO_MAP
EMISMATCH, EPEERLOST, EABORTED, EINTERRUPTED, EBOOTSTRAP, EBADARG, ENOTSUP, EFORKED = \
    range(-20001, -20009, -1)
_LIBCOLL_NAMES = {EMISMATCH: "EMISMATCH", EPEERLOST: "EPEERLOST", EABORTED: "EABORTED",
                  EINTERRUPTED: "EINTERRUPTED", EBOOTSTRAP: "EBOOTSTRAP", EBADARG: "EBADARG",
                  ENOTSUP: "ENOTSUP", EFORKED: "EFORKED"}


def code_name(code):
    """'EMISMATCH', 'ETIMEDOUT', ... for a libcoll code; 'UNKNOWN' otherwise."""
    if code in _LIBCOLL_NAMES:
        return _LIBCOLL_NAMES[code]
    return errno.errorcode.get(-code, "UNKNOWN") if code < 0 else "UNKNOWN"


class CodedError(Exception):
    """What every hbmcoll exception is: `.code`, libcoll's code; `.name`, its name."""
    code = EABORTED

    def __init__(self, *args, code=None):
        super().__init__(*args)
        if code is not None:
            self.code = code

    @property
    def name(self):
        return code_name(self.code)


class Error(CodedError, RuntimeError):
    """A collective or communicator failed (the communicator is closed for good)."""


class MismatchError(Error):
    """Ranks disagree on count, dtype, op, root or collective."""
    code = EMISMATCH


class PeerLostError(Error):
    """A rank died or left the communicator."""
    code = EPEERLOST


class TimeoutError(Error, builtins.TimeoutError):
    """A wait ran past HBMCOLL_TIMEOUT (or init's timeout=)."""
    code = -errno.ETIMEDOUT


class ArgumentError(CodedError, ValueError):
    """An argument or an HBMCOLL_* setting is not valid; found before anything moved (not an
    Error: the communicator stays usable)."""
    code = EBADARG


class OutOfMemoryError(Error, MemoryError):
    """Memory ran out: the shared segment, its arena, or a private copy."""
    code = -errno.ENOMEM


class BootstrapError(Error):
    """The ranks could not meet to build the communicator."""
    code = EBOOTSTRAP


class NotSupportedError(Error):
    """Not supported by this build or environment."""
    code = ENOTSUP


class ForkedError(Error):
    """The communicator belongs to the process that created it, not to this fork()ed child."""
    code = EFORKED


class SystemCallError(Error, OSError):
    """A system call failed: `.errno` as OSError has it, `.code` = -errno."""

    def __init__(self, err, text):
        OSError.__init__(self, err, text)
        self.code = -err


class NotFoundError(SystemCallError, FileNotFoundError):
    """A file hbmcoll was told to read (a topology, ...) does not exist."""


_BY_CODE = {EMISMATCH: MismatchError, EPEERLOST: PeerLostError, -errno.ETIMEDOUT: TimeoutError,
            EBADARG: ArgumentError, -errno.EINVAL: ArgumentError, -errno.ENOMEM: OutOfMemoryError,
            EBOOTSTRAP: BootstrapError, ENOTSUP: NotSupportedError, EFORKED: ForkedError}


def from_code(code, text=None):
    """The exception for libcoll code `code` (0 is not a failure), with `text` or the code's."""
    if not text:
        text = os.strerror(-code) if -4096 < code < 0 else code_name(code)
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(text, code=code)
    if -4096 < code < 0:
        return (NotFoundError if code == -errno.ENOENT else SystemCallError)(-code, text)
    return Error(text, code=code)


# Tracebacks and reprs name the classes as users import them: hbmcoll.PeerLostError, not
# hbmcoll.errors.PeerLostError (pickle finds them there too).
for _cls in (CodedError, Error, MismatchError, PeerLostError, TimeoutError, ArgumentError,
             OutOfMemoryError, BootstrapError, NotSupportedError, ForkedError, SystemCallError,
             NotFoundError):
    _cls.__module__ = "hbmcoll"
