"""The torch backend's tensor adapters: tensors as buffers hbmcoll takes without a copy, and
what it does not do natively (non-contiguous tensors, dtypes outside its set, bitwise and
PREMUL_SUM reductions) made of what it does (process_group.py)."""
import torch
import torch.distributed as dist

from ..errors import ArgumentError

_R = dist.ReduceOp.RedOpType
_OPS = {_R.SUM: "sum", _R.AVG: "avg", _R.PRODUCT: "prod", _R.MIN: "min", _R.MAX: "max"}
_BITWISE = {_R.BAND: torch.bitwise_and, _R.BOR: torch.bitwise_or, _R.BXOR: torch.bitwise_xor}
_NATIVE = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16,
                     torch.int8, torch.uint8, torch.int32, torch.int64})
# integer dtypes hbmcoll lacks: reduce in a wider one (sum/prod wrap the same way once cast back)
_WIDEN = {torch.int16: torch.int32, torch.uint16: torch.int32, torch.uint32: torch.int64}


def _plain(t):
    return t.detach() if t.requires_grad else t


def _flat_mv(t):
    """A contiguous buffer with t's data for moving (not reducing): t itself when it can be,
    else a copy; raw bytes for dtypes hbmcoll does not know."""
    t = _plain(t)
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype not in _NATIVE:
        t = t.reshape(-1).view(torch.uint8)
    return t


def _mv_dtype(dtype):
    return dtype if dtype in _NATIVE else torch.uint8


def _unit_count(t):
    """Elements of t in units of its movement buffer."""
    return t.numel() if t.dtype in _NATIVE else t.numel() * t.element_size()


def _as_like(flat, like):
    """flat (1-D, movement units) reinterpreted with like's dtype and shape."""
    if flat.dtype != like.dtype:
        flat = flat.view(like.dtype)
    return flat.view(like.shape)


def _copy_into(dst, flat):
    dst = _plain(dst)
    dst.copy_(_as_like(flat, dst))


def _inout(t):
    """(buffer, finish) to move data in place in t (bcast)."""
    buf = _flat_mv(t)
    p = _plain(t)
    if buf.data_ptr() == p.data_ptr() and buf.dtype == p.dtype:
        return buf, None
    if p.is_contiguous():  # raw-byte view of t itself: nothing to copy back
        return buf, None
    return buf, lambda: p.copy_(_as_like(buf.reshape(-1), p))


def _out_buf(t):
    """(buffer, finish) to receive into t: t itself when contiguous, else a temporary."""
    p = _plain(t)
    if p.is_contiguous():
        return (p if p.dtype in _NATIVE else p.reshape(-1).view(torch.uint8)), None
    tmp = torch.empty(_unit_count(p), dtype=_mv_dtype(p.dtype))
    return tmp, lambda: p.copy_(_as_like(tmp, p))


class _RedPlan:
    """How to reduce tensors of one dtype with one torch ReduceOp on hbmcoll."""

    __slots__ = ("op", "fold", "work_dtype", "mode", "factor")

    def __init__(self, dtype, redop):
        kind = getattr(redop, "op", redop)
        self.factor = None
        self.mode = None          # None: as is; "cast": to work_dtype; "view": reinterpret
        self.work_dtype = dtype
        self.fold = None
        if kind == _R.PREMUL_SUM:
            self.factor = redop.factor
            kind = _R.SUM
        if dtype == torch.bool:
            if kind in (_R.SUM, _R.MAX, _R.BOR):
                kind = _R.MAX
            elif kind in (_R.PRODUCT, _R.MIN, _R.BAND):
                kind = _R.MIN
            elif kind != _R.BXOR:
                raise ArgumentError(f"hbmcoll: {kind.name} is not defined for bool tensors")
            self.mode, self.work_dtype = "cast", torch.uint8
        elif dtype in _NATIVE:
            pass
        elif dtype in _WIDEN:
            self.mode, self.work_dtype = "cast", _WIDEN[dtype]
        elif dtype == torch.uint64:
            if kind in (_R.MIN, _R.MAX, _R.AVG):
                raise ArgumentError(f"hbmcoll: {kind.name} is not supported for uint64 tensors")
            self.mode, self.work_dtype = "view", torch.int64   # same bits for wrapping sum/prod
        elif dtype.is_complex:
            if kind not in (_R.SUM, _R.AVG):
                raise ArgumentError(f"hbmcoll: {kind.name} is not defined for complex tensors")
            self.mode = "complex"
            self.work_dtype = torch.float32 if dtype == torch.complex64 else torch.float64
        elif dtype.is_floating_point:
            self.mode, self.work_dtype = "cast", torch.float32
        else:
            raise TypeError(f"hbmcoll: cannot reduce tensors of dtype {dtype}")
        if kind in _BITWISE:
            if self.work_dtype.is_floating_point:
                raise ArgumentError(f"hbmcoll: {kind.name} needs integer or bool tensors, "
                                 f"not {dtype}")
            self.fold, self.op = _BITWISE[kind], None
        else:
            self.op = _OPS.get(kind)
            if self.op is None:
                raise ArgumentError(f"hbmcoll: unsupported reduce op {kind}")

    def to_work(self, t):
        """A contiguous work copy of t, or t itself when nothing is to change."""
        t = _plain(t)
        if self.factor is not None:
            t = t * self.factor
        if self.mode is None:
            return t if t.is_contiguous() else t.contiguous()
        if self.mode == "cast":
            return t.to(self.work_dtype).contiguous()
        if self.mode == "complex":
            return torch.view_as_real(t.contiguous())
        return t.contiguous().view(self.work_dtype)

    def store(self, dst, work):
        """Write a work-dtype result into dst (any layout, its own dtype)."""
        dst = _plain(dst)
        if work.data_ptr() == dst.data_ptr() and self.mode in (None, "view", "complex") \
                and dst.is_contiguous():
            return
        if self.mode == "complex":
            work = torch.view_as_complex(work.reshape(-1, 2))
        elif self.mode == "view":
            work = work.view(dst.dtype)
        dst.copy_(work.view(dst.shape))

    def fold_rows(self, stacked):
        """Reduce a (P, ...) tensor of the ranks' contributions over its first dimension."""
        acc = stacked[0].clone()
        for i in range(1, stacked.shape[0]):
            self.fold(acc, stacked[i], out=acc)
        return acc


def _flat_cat(tensors, dtype=None):
    """One contiguous 1-D tensor of the tensors' data (movement units unless dtype given)."""
    parts = [_plain(t).reshape(-1) for t in tensors]
    if dtype is None and parts and parts[0].dtype not in _NATIVE:
        parts = [p.contiguous().view(torch.uint8) for p in parts]
    return torch.cat(parts) if parts else torch.empty(0, dtype=dtype or torch.uint8)
