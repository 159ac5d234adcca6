"""What this torch's autocast can do, asked of torch itself (AMP503, AMP505).

Decided by feature, not by version number: a probe builds an autocast object
through the original ``__init__`` and never enters it.
"""

import warnings


class TorchAmpCaps:
    """What this torch's ``torch.amp.autocast`` accepts, probed once per question.

    A probe builds an autocast object through the original ``__init__`` and
    never enters it: the device type is accepted when that does not raise,
    a dtype is supported when autocast stays enabled (torch disables it with
    a warning, or raises, for a dtype the device cannot do).
    """

    def __init__(self, autocast_cls, init):
        self._cls = autocast_cls
        self._init = init
        self._accepts = {}
        self._supports = {}
        self._quiet = {}

    def autocast_accepts(self, device):
        if device not in self._accepts:
            self._accepts[device] = self._probe(device, None, False) is not None
        return self._accepts[device]

    def autocast_supports(self, device, dtype):
        key = (device, dtype)
        if key not in self._supports:
            from ...torch_private import autocast_enabled  # noqa: PLC0415 - cycle: torch_private -> torch -> (its import hook) patches.amp -> caps -> torch_private, partly initialised where torch_private is imported before torch

            probe = self._probe(device, dtype, True)
            self._supports[key] = probe is not None and autocast_enabled(probe)
        return self._supports[key]

    def autocast_quiet_when_disabled(self, device, dtype):
        """Whether a disabled autocast with ``dtype`` builds without a warning.

        torch 2.0 checks the CPU dtype before ``enabled``: a disabled
        ``autocast("cpu", dtype=torch.float16)`` still warns there.
        """
        key = (device, dtype)
        if key not in self._quiet:
            obj = self._cls.__new__(self._cls)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    self._init(obj, device, dtype=dtype, enabled=False)
                    quiet = True
                except Exception:
                    quiet = False
            self._quiet[key] = quiet and not caught
        return self._quiet[key]

    def _probe(self, device, dtype, enabled):
        obj = self._cls.__new__(self._cls)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                self._init(obj, device, dtype=dtype, enabled=enabled)
            except Exception:
                return None
        return obj
