"""A buffer's bytes as a flat uint8 NumPy view, without a copy: NumPy arrays, CPU torch tensors
(any dtype, bfloat16 too) and the buffer protocol. What send/recv (p2p.py) and the v-collectives
(vcoll.py) move."""
import numpy as np

from .errors import ArgumentError


def flat_bytes(buf, what, writable=False):
    """(uint8 view of buf's bytes, its item size); ArgumentError for what cannot be viewed so."""
    if type(buf).__module__.startswith("torch"):
        import torch
        if buf.device.type != "cpu" or not buf.is_contiguous():
            raise ArgumentError(f"{what} take contiguous CPU tensors")
        return buf.detach().reshape(-1).view(torch.uint8).numpy(), buf.element_size()
    mv = memoryview(buf)
    if not mv.c_contiguous:
        raise ArgumentError(f"{what} take C-contiguous buffers")
    if writable and mv.readonly:
        raise ArgumentError(f"{what}: the buffer is read-only")
    return np.frombuffer(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv, np.uint8), mv.itemsize
