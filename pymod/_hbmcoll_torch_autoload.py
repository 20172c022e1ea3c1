"""torch.distributed's "hbmcoll" backend without `import hbmcoll.torch`.

torch (2.5 and later) calls register() when it is imported, through the "torch.backends" entry
point this package installs (TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns torch's loading off). This
module sits outside the hbmcoll package so that `import torch` never imports hbmcoll itself:
it only names a creator, which imports hbmcoll.torch at the first process group of the backend.
Nothing here may fail torch's import: an older torch, or one without torch.distributed, leaves
the explicit `import hbmcoll.torch` as the way in.
"""


def register():
    try:
        import torch.distributed as dist
        if dist.is_available() and "HBMCOLL" not in dist.Backend._plugins:
            dist.Backend.register_backend("hbmcoll", _create, devices=["cpu"])
    except Exception:  # noqa: BLE001 - torch's import must go on whatever happens here
        pass


def _create(*args, **kwargs):
    import hbmcoll.torch  # noqa: F401 - the DDP hook and Horovod helpers come with it
    from hbmcoll.torch import backend
    return backend.create(*args, **kwargs)
