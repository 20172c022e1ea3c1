"""Inputs, the reduction model and result checks shared by the collective tests
(test_collectives*.py): each rank derives every rank's input from (case, rank), so it can
compute the expected answer itself.

Expected values follow the documented reduction semantics (coll.h): inputs combined left to right
in rank order; integers wrap around; float16/bfloat16 accumulate in float32 and round once; avg is
the sum divided by the size (integers: C truncating division of the wrapped sum). The matrix uses
values whose float sums are exact, so any correct implementation matches bit for bit.
"""

import os

import numpy as np

WORLD_SIZES = [1, 2, 3, 4, 5, 8]
NP_DTYPES = ["int8", "uint8", "int32", "int64", "float16", "float32", "float64"]
DTYPES = NP_DTYPES + ["bfloat16"]
OPS = ["sum", "prod", "min", "max", "avg"]
# staging slot and flat/rsag switch as the library sees them (defaults 256 KiB, 16 KiB); ranks
# of test_small_staging_slots get other values in their environment, and sizes follow
SLOT = int(os.environ.get("HBMCOLL_SLOT_BYTES") or 256 << 10)
SMALL_MAX = int(os.environ.get("HBMCOLL_SMALL_MAX") or 16 << 10)


# ---- data: inputs, the reduction model, comparisons ------------------------------------------

def itemsize(dtype):
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def is_int(dtype):
    return dtype in ("int8", "uint8", "int32", "int64")


def counts_for(dtype, P):
    """0, 1, odd, P*k+1, and a message of more than two staging slots (multi-chunk)."""
    es = itemsize(dtype)
    return [0, 1, 7, 1001, P * 37 + 1, 2 * (SLOT // es) + 5]


def bf16_bits(x):
    """float32 values -> bfloat16 bit patterns (uint16), rounded to nearest even (no NaNs)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def bf16_values(b):
    """bfloat16 bit patterns -> float32 values."""
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_to(x, dtype):
    """Values -> the nearest values of `dtype`, as float32 (float64 for float64) NumPy."""
    if dtype == "bfloat16":
        return bf16_values(bf16_bits(np.asarray(x, np.float32)))
    return np.asarray(x).astype(dtype).astype(np.float64 if dtype == "float64" else np.float32)


_BASES = {}


def rank_input(seed, rank, count, dtype, op, shape=None):
    """Rank `rank`'s input of case `seed`, as NumPy (bfloat16: float32 holding bfloat16 values).
    Large inputs are rotations of one random array per (dtype, op, count): cheap to make P times."""
    if count > 4096:
        key = (dtype, op, count)
        if key not in _BASES:
            _BASES[key] = _make_input([count, 12345], count, dtype, op)
        x = np.roll(_BASES[key], (seed * 131 + rank * 7919) % count)
        return x.reshape(shape) if shape is not None else x
    return _make_input([seed, rank + 1], count, dtype, op, shape)


def _make_input(seed, count, dtype, op, shape=None):
    rng = np.random.default_rng(seed)
    if is_int(dtype):
        info = np.iinfo(dtype)
        if op == "prod":
            vals = rng.choice(np.array([1, 2, 3] if dtype == "uint8" else [1, 2, -1]), count)
            x = vals.astype(dtype)
        else:  # full range: sums wrap around
            x = rng.integers(info.min, info.max, size=count, endpoint=True, dtype=dtype)
    else:
        if op in ("sum", "avg"):
            x = rng.integers(-8, 9, size=count).astype(np.float64)  # sums stay exact
        elif op == "prod":
            x = rng.choice(np.array([1.0, 2.0, -1.0, 0.5]), count)
        else:
            x = rng.standard_normal(count) * 100
        x = round_to(x, dtype)
    return x.reshape(shape) if shape is not None else x


def model(inputs, op, dtype):
    """The expected result as NumPy (bfloat16: float32 holding the bfloat16 result)."""
    P = len(inputs)
    if is_int(dtype):
        dt = np.dtype(dtype)
        st = np.stack(inputs)
        if op in ("sum", "avg"):
            s = np.add.reduce(st, axis=0, dtype=dt)  # wraps
            if op == "sum":
                return s
            s = s.astype(np.int64)
            q = s // P
            q[(s % P != 0) & (s < 0)] += 1  # C truncates toward zero
            return q.astype(dt)
        if op == "prod":
            return np.multiply.reduce(st, axis=0, dtype=dt)
        return st.min(axis=0) if op == "min" else st.max(axis=0)
    acc_t = np.float64 if dtype == "float64" else np.float32
    acc = np.asarray(inputs[0], dtype=acc_t).copy()
    for x in inputs[1:]:
        x = np.asarray(x, dtype=acc_t)
        if op in ("sum", "avg"):
            acc = acc + x
        elif op == "prod":
            acc = acc * x
        elif op == "min":
            acc = np.where(x < acc, x, acc)
        else:
            acc = np.where(x > acc, x, acc)
    if op == "avg":
        acc = acc / acc_t(P)
    return acc if dtype == "bfloat16" else acc.astype(dtype)


def to_buf(x, dtype, kind="numpy"):
    """A new buffer holding the values x (NumPy; torch for bfloat16 or kind='torch')."""
    if dtype == "bfloat16":
        import torch
        b = bf16_bits(np.asarray(x, np.float32))
        return torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)
    a = np.ascontiguousarray(np.asarray(x).astype(dtype))
    if kind == "torch":
        import torch
        return torch.from_numpy(a)
    return a


def empty_buf(shape, dtype, kind="numpy"):
    """A buffer for results, filled with 77 (not a plausible answer: a skipped write shows)."""
    if dtype == "bfloat16":
        return to_buf(np.full(shape, 77, np.float32), dtype)
    out = np.full(shape, 77, dtype=dtype)
    return to_buf(out, dtype, "torch") if kind == "torch" else out


def bits(x):
    """The raw bits of a buffer, as a flat unsigned NumPy array."""
    if type(x).__module__.startswith("torch"):
        import torch
        t = x.contiguous().reshape(-1)
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.view(torch.int16)
        return bits(t.numpy())
    if isinstance(x, np.ndarray):
        a = np.ascontiguousarray(x).reshape(-1)
        return a.view(f"u{a.itemsize}")
    return np.frombuffer(memoryview(x).cast("B"), dtype=np.uint8)


def want_bits(values, dtype):
    return bits(to_buf(values, dtype))


class Checker:
    """Collects wrong results (with the case) instead of stopping at the first one."""

    def __init__(self, comm):
        self.rank, self.size = comm.rank, comm.size
        self.fails = []
        self.checked = 0

    def same(self, got, want, dtype, what):
        """got: the library's buffer; want: expected values (model output or raw buffer)."""
        self.checked += 1
        g = bits(got)
        w = want_bits(want, dtype) if isinstance(want, np.ndarray) and dtype else bits(want)
        if g.shape != w.shape:
            self.fails.append(f"{what}: {g.size} elements, expected {w.size}")
            return False
        if not np.array_equal(g, w):
            bad = np.flatnonzero(g != w)
            self.fails.append(f"{what}: {bad.size}/{g.size} elements differ, first at "
                              f"{bad[:5].tolist()}: got bits {g[bad[:5]].tolist()} "
                              f"expected {w[bad[:5]].tolist()}")
            return False
        return True

    def true(self, cond, what):
        self.checked += 1
        if not cond:
            self.fails.append(what)

    def done(self):
        if self.fails:
            more = f"\n... and {len(self.fails) - 40} more" if len(self.fails) > 40 else ""
            raise AssertionError(f"rank {self.rank} of {self.size}: {len(self.fails)} wrong "
                                 f"results of {self.checked}:\n" + "\n".join(self.fails[:40]) + more)
        return self.checked

def data_input(seed, rank, count, dtype, shape=None):
    rng = np.random.default_rng([seed, rank, 7])
    x = rng.integers(0, 256, size=count * np.dtype(dtype).itemsize, dtype=np.uint8)
    x = x.view(dtype)  # any bit pattern: data movement must not touch it (NaNs included)
    return x.reshape(shape) if shape is not None else x
