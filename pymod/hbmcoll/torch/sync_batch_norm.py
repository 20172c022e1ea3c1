"""Horovod's SyncBatchNorm for hbmcoll.torch (CPU): batch normalisation whose statistics are
those of the whole batch across the ranks, so small per-rank batches normalise as one large one.

In training, each rank sums its batch's values and squares per channel and counts its rows;
one allreduce (sum) of the three gives every rank the global mean and variance. The allreduce
is hbmcoll.torch's differentiable one, whose backward pass is the allreduce of the gradients,
so autograd yields the exact gradient of the global statistics. The sums are taken in float64
(mean of squares less squared mean cancels badly in float32). In eval mode, and without
track_running_stats, it is torch's BatchNorm. The running statistics take the unbiased
variance of the global batch, as torch's do.
"""
import torch

from . import horovod_api as hvd


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """torch.nn.BatchNorm*d whose training statistics are the whole batch's across the ranks
    (Horovod's hvd.SyncBatchNorm): the same arguments (num_features, eps, momentum, affine,
    track_running_stats)."""

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects (N, C, ...) input, got {x.dim()} dimensions")

    def forward(self, x):
        self._check_input_dim(x)
        if not self.training:  # evaluation never synchronises (one rank may evaluate alone)
            return super().forward(x)
        dims = [0] + list(range(2, x.dim()))
        x64 = x.to(torch.float64)
        count = torch.tensor([x.numel() / x.shape[1]], dtype=torch.float64)
        stats = torch.cat([x64.sum(dims), (x64 * x64).sum(dims), count])
        total = hvd.allreduce(stats, op=hvd.Sum, name="sync_batch_norm")
        c = x.shape[1]
        n = total[2 * c]
        mean = total[:c] / n
        var = total[c:2 * c] / n - mean * mean
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                unbiased = var * (n / (n - 1)) if n > 1 else var
                self.running_mean.mul_(1 - m).add_(m * mean.to(self.running_mean.dtype))
                self.running_var.mul_(1 - m).add_(m * unbiased.to(self.running_var.dtype))
        shape = [1, c] + [1] * (x.dim() - 2)
        y = (x64 - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        y = y.to(x.dtype)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y
