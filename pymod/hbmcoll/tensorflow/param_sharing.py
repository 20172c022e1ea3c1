"""Parameter sharing through memory servers for Keras models (ShmCaffe's two modes):
hbmcoll.tensorflow.callbacks.ParameterSharingCallback.

    model.fit(x, y, callbacks=[hbmcoll.tensorflow.callbacks.ParameterSharingCallback(mode="async")])

After every batch the worker pushes the change its optimizer made to the shared parameters (an
accumulate on the servers) and pulls everyone's back (hbmcoll/memserver/param_sharing.py), with no
barrier among workers; staleness=s bounds how far ahead of the slowest worker one may run. hybrid: the group
(group=, by default hbmcoll.init()'s communicator) averages its gradients first, through
hbmcoll.tensorflow.DistributedOptimizer around the model's optimizer, and only its rank 0 talks
to the servers, broadcasting what it pulled to the group. All of the model's weights are shared
(float32).
"""
import numpy as np

from ..launch.job import init as _init
from ..memserver.param_sharing import SharedParameters, check_mode


def callback_class(keras):
    class ParameterSharingCallback(keras.callbacks.Callback):
        """Shares all of a Keras model's weights through memory servers after every batch, as
        hbmcoll.torch.ParameterSharing does for torch (async, or hybrid with a group); at the
        end of training every worker holds the servers' final weights."""

        def __init__(self, mode="async", servers=None, staleness=None, name="parameters", token=None, group=None,
                     timeout=300, workers=None):
            super().__init__()
            check_mode(mode, staleness)
            self.mode, self.group, self.shared = mode, group, None
            self.opened = dict(servers=servers, token=token, name=name, staleness=staleness, timeout=timeout,
                               workers=workers)

        def _flat(self):
            return np.concatenate([np.asarray(w, np.float32).reshape(-1) for w in self.model.get_weights()])

        def _set(self, flat):
            at, weights = 0, []
            for w in self.model.get_weights():
                weights.append(flat[at:at + w.size].reshape(w.shape).astype(w.dtype))
                at += w.size
            self.model.set_weights(weights)

        def on_train_begin(self, logs=None):
            if self.mode == "hybrid" and self.group is None:
                self.group = _init()
            flat = self._flat()
            if self.group is None or self.group.rank == 0:  # who talks to the servers
                self.shared = SharedParameters(len(flat), **self.opened)
                self.shared.start(flat)
            if self.group is not None:
                self.group.bcast(flat, root=0)
            self._set(flat)

        def on_train_batch_begin(self, batch, logs=None):
            self.before = self._flat()

        def on_train_batch_end(self, batch, logs=None):
            flat = self._flat()
            if self.shared is not None:
                self.shared.push_pull(flat - self.before, flat)
            if self.group is not None:
                self.group.bcast(flat, root=0)
            self._set(flat)

        def on_train_end(self, logs=None):  # every worker ends on the servers' final weights
            flat = self._flat()
            if self.shared is not None:
                self.shared.finish(flat)
            if self.group is not None:
                self.group.bcast(flat, root=0)
            self._set(flat)

    return ParameterSharingCallback
