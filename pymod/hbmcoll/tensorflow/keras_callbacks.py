"""Horovod's Keras callbacks for hbmcoll.tensorflow (hvd.callbacks.*), built when first used
(importing keras takes seconds): broadcasting the variables at the start, averaging the
epoch's metrics, and the learning-rate schedule and warm-up of Goyal et al. (large batches:
start at lr / size and reach lr after a few epochs).
"""
import types

import numpy as np

from ..errors import NotSupportedError


def module(keras, hvd):
    class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
        """Start every rank from root_rank's model and optimizer variables: broadcast when
        training begins and again after the first batch (optimizers may create their
        variables on the first step)."""

        def __init__(self, root_rank=0, device=""):
            super().__init__()
            self.root_rank = root_rank
            self.done = False

        def _variables(self):
            vs = list(self.model.variables)
            opt = getattr(self.model, "optimizer", None)
            if opt is not None and getattr(opt, "built", True):
                vs += list(opt.variables)
            return vs

        def on_train_begin(self, logs=None):
            hvd.init()
            hvd.broadcast_variables(self._variables(), self.root_rank)

        def on_train_batch_end(self, batch, logs=None):
            if not self.done:
                hvd.broadcast_variables(self._variables(), self.root_rank)
                self.done = True

    class MetricAverageCallback(keras.callbacks.Callback):
        """Average the epoch's metrics (logs) over the ranks at the end of each epoch."""

        def on_epoch_end(self, epoch, logs=None):
            if not logs:
                return
            keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
            vals = np.array([float(logs[k]) for k in keys], np.float64)
            hvd._c().allreduce(vals, "avg")
            for k, v in zip(keys, vals):
                logs[k] = float(v)

    mod = types.ModuleType(hvd.__name__ + ".callbacks", "Keras callbacks of hbmcoll.tensorflow")
    mod.BroadcastGlobalVariablesCallback = BroadcastGlobalVariablesCallback
    mod.MetricAverageCallback = MetricAverageCallback
    mod.LearningRateScheduleCallback, mod.LearningRateWarmupCallback = _lr_callbacks(keras, hvd)
    from .param_sharing import callback_class
    mod.ParameterSharingCallback = callback_class(keras)  # memory servers: async and hybrid sharing
    return mod


def _lr_callbacks(keras, hvd):
    class LearningRateScheduleCallback(keras.callbacks.Callback):
        """lr = initial_lr * multiplier(epoch) (or * multiplier, a number) from start_epoch to
        end_epoch; staircase=False moves it every batch by the fraction of the epoch done
        (steps_per_epoch: the batches of an epoch, else taken from fit's params)."""

        def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                     momentum_correction=True, steps_per_epoch=None, verbose=0):
            super().__init__()
            self.initial_lr, self.start, self.end = float(initial_lr), start_epoch, end_epoch
            self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
            self.staircase, self.steps, self.verbose = staircase, steps_per_epoch, verbose
            self.momentum_correction, self.epoch = momentum_correction, 0

        def on_train_begin(self, logs=None):
            opt = self.model.optimizer
            # Horovod rescales momentum by the lr's change for one step; a Keras 3 optimizer's
            # momentum is a constant of its compiled step, so that cannot be done here
            if self.momentum_correction and float(getattr(opt, "momentum", 0) or 0) > 0:
                raise NotSupportedError("momentum_correction=True with a momentum optimizer: pass "
                                        "momentum_correction=False (the momentum stays as it is)")
            if self.steps is None:
                self.steps = (self.params or {}).get("steps")

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            if self.staircase:
                self._set(epoch)

        def on_train_batch_begin(self, batch, logs=None):
            if not self.staircase:
                if not self.steps:
                    raise ValueError("staircase=False needs steps_per_epoch")
                self._set(self.epoch + batch / self.steps)

        def _set(self, epoch):
            if epoch < self.start or (self.end is not None and epoch >= self.end):
                return
            lr = self.initial_lr * self.multiplier(epoch)
            self.model.optimizer.learning_rate = lr
            if self.verbose and hvd.rank() == 0:
                print(f"epoch {epoch:.2f}: learning rate {lr:g}")

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))

    class LearningRateWarmupCallback(LearningRateScheduleCallback):
        """From initial_lr / size to initial_lr over warmup_epochs, moved every batch (the
        large-batch warm-up): then the schedule's own callbacks take over."""

        def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None,
                     verbose=0):
            size = hvd.size()
            super().__init__(initial_lr, lambda epoch: 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1),
                             start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                             momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch,
                             verbose=verbose)

    return LearningRateScheduleCallback, LearningRateWarmupCallback
