"""Horovod's gradient compression for the torch helpers (hbmcoll.torch.Compression):

    hvd.allreduce(t, compression=hvd.Compression.fp16)
    hvd.DistributedOptimizer(opt, compression=hvd.Compression.fp16)

none sends tensors as they are; fp16 sends floating-point tensors as float16 (the library adds
float16 in float32 and rounds once) and gives them back in their own dtype: half the bytes, at
float16's precision. Other dtypes travel as they are.
"""
import torch

from ..errors import ArgumentError


class Compressor:
    """compress(tensor) -> (tensor to send, ctx); decompress(tensor, ctx) -> the result;
    wire_dtype(dtype): the dtype a tensor of dtype travels as."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor

    @staticmethod
    def wire_dtype(dtype):
        return dtype


class NoneCompressor(Compressor):
    pass


class FP16Compressor(Compressor):
    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)

    @staticmethod
    def wire_dtype(dtype):
        return torch.float16 if dtype.is_floating_point else dtype


class Compression:
    """Horovod's compression= choices: none, or fp16 (floating-point tensors travel as float16)."""
    none = NoneCompressor
    fp16 = FP16Compressor


def compressor(compression):
    """compression= as given (None: none), checked: an unknown object is refused, not ignored."""
    if compression is None:
        return NoneCompressor
    if not all(callable(getattr(compression, f, None)) for f in ("compress", "decompress", "wire_dtype")):
        raise ArgumentError(f"compression={compression!r}: hbmcoll.torch.Compression.none or .fp16 (or a "
                            "Compressor with compress, decompress and wire_dtype)")
    return compression
