"""Start-up hook shipped at the root of site-packages (kept tiny: it is
imported at every interpreter start once Python reads ``.start`` files).

``autosafe_torch.pth`` (Python < 3.15) and ``autosafe_torch.start``
(PEP 829, Python >= 3.15) both call ``run``: nothing is imported unless
AUTOSAFE_TORCH is on, and nothing here ever raises.
"""

import os
import sys

# The same words as autosafe_torch.config (not imported: it would activate).
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")
_warned = False


def run():
    value = os.environ.get("AUTOSAFE_TORCH")
    if value is None:
        return
    word = value.strip().lower()
    if word in _OFF:
        return
    if word not in _ON:
        global _warned
        if _warned:  # once: site may read the .pth twice (seen in a virtual environment)
            return
        _warned = True
        sys.stderr.write("autosafe_torch: AUTOSAFE_TORCH=%r is not one of 1/true/yes/on "
                         "or 0/false/no/off; staying off\n" % value)
        return
    try:
        import autosafe_torch  # noqa: F401  (the import activates)
    except BaseException as exc:  # never break interpreter start
        sys.stderr.write("autosafe_torch: not activated, import failed: %r\n" % (exc,))
