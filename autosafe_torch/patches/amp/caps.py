"""What this torch's autocast can do, asked of torch itself (AMP503, AMP505),
by feature, not by version number."""

import warnings


class TorchAmpCaps:
    """Probed once per question: a probe builds an autocast object through the
    original ``__init__`` and never enters it: the device type is accepted when
    that does not raise, a dtype is supported when autocast stays enabled
    (torch disables it with a warning, or raises, for one the device cannot do)."""

    def __init__(self, autocast_cls, init):
        self._cls = autocast_cls
        self._init = init
        self._probed = {}  # (device, dtype, enabled) -> (built, still enabled, warned)

    def autocast_accepts(self, device):
        return self._probe(device, None, False)[0]

    def autocast_supports(self, device, dtype):
        built, enabled, _warned = self._probe(device, dtype, True)
        return built and enabled

    def autocast_quiet_when_disabled(self, device, dtype):
        """Whether a disabled autocast with ``dtype`` builds without a warning:
        torch 2.0 checks the CPU dtype before ``enabled``, so a disabled
        ``autocast("cpu", dtype=torch.float16)`` still warns there."""
        built, _enabled, warned = self._probe(device, dtype, False)
        return built and not warned

    def _probe(self, device, dtype, enabled):
        key = (device, dtype, enabled)
        if key not in self._probed:
            obj = self._cls.__new__(self._cls)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    self._init(obj, device, dtype=dtype, enabled=enabled)
                except Exception:
                    obj = None
            if obj is not None and enabled:
                from ...torch_private import autocast_enabled  # noqa: PLC0415 - cycle: torch_private -> torch -> (its import hook) patches.amp -> caps -> torch_private, partly initialised where torch_private is imported before torch

                enabled = autocast_enabled(obj)
            self._probed[key] = (obj is not None, enabled, bool(caught))
        return self._probed[key]
