"""AMP across torch versions and devices: autocast and GradScaler.

The AMP API moved twice: ``torch.cuda.amp`` / ``torch.cpu.amp`` became
``torch.amp`` with a leading device argument (GradScaler in 2.3, autocast and
custom_fwd in 2.4, with a FutureWarning on the old names), and each device
learned its autocast dtypes at its own pace. Scripts written for one torch
and one machine warn, crash, or silently run in fp32 on another.

Every check takes the call's arguments by name, the platform facts, ``caps``
(what this torch's AMP can do, probed once by the patch; tests pass a fake)
and an ``AmpCall`` that says which API was called. Arguments:

- autocast: ``device_type``, ``dtype``, ``enabled``, ``cache_enabled``;
- GradScaler: ``device`` (None when the call gave none), ``init_scale``,
  ``growth_factor``, ``backoff_factor``, ``growth_interval``, ``enabled``.

A routing finding changes the pseudo-argument ``api``: the patch builds the
object through the modern class instead of the deprecated one.
"""

from . import rule

GROUP = "amp"


class AmpCall:
    """Which AMP API a call went through.

    ``api``: the name the user called (``torch.cuda.amp.GradScaler``);
    ``device``: the device that API is fixed to (``"cuda"``), None when the
    device is an argument; ``takes_device``: whether its signature has one;
    ``route``: the modern API it can be built through on this torch, or None;
    ``provided``: autosafe_torch supplied the API because this torch lacks it.
    """

    __slots__ = ("api", "device", "takes_device", "route", "provided")

    def __init__(self, api, device=None, takes_device=True, route=None, provided=False):
        self.api = api
        self.device = device
        self.takes_device = takes_device
        self.route = route
        self.provided = provided

    def __repr__(self):
        return "AmpCall(%s)" % ", ".join("%s=%r" % (n, getattr(self, n)) for n in self.__slots__)


def device_type(value):
    """``"cuda"`` for "cuda", "cuda:1" or torch.device("cuda", 1); None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.split(":", 1)[0]
    return getattr(value, "type", value)


def device_available(device, facts):
    return device == "cpu" or device == facts.accelerator


def inert_device(facts):
    """An autocast device type every torch accepts and nothing here runs on.

    A disabled region for it changes no tensor: "cuda" where there is no
    CUDA; otherwise "cpu" (it would only matter nested inside an enabled CPU
    autocast region).
    """
    return "cpu" if facts.accelerator == "cuda" else "cuda"


def _disable_quietly(before, after, args, caps):
    """Disabling keeps the user's dtype, unless this torch warns about it even in
    a disabled region (torch 2.0 checks the CPU dtype before ``enabled``): then
    the device's default, which a disabled region never uses."""
    dtype = args["dtype"]
    device = after.get("device_type", device_type(args["device_type"]))
    if dtype is not None and not caps.autocast_quiet_when_disabled(device, dtype):
        before["dtype"], after["dtype"] = dtype, None


def _scaler_device(args, call):
    return device_type(args["device"]) or call.device or "cuda"


@rule("AMP501", "deprecated-autocast-api", GROUP,
      "torch.cuda.amp.autocast, torch.cpu.amp.autocast, torch.cuda.amp.custom_fwd and "
      "custom_bwd: built through torch.amp, the old positional arguments kept by name",
      "FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated. Please use "
      "`torch.amp.autocast('cuda', args...)` instead.",
      "torch.amp.autocast('cuda', enabled=..., dtype=...) with keywords (a positional "
      "`enabled` would now be the dtype); torch.amp.custom_fwd(device_type='cuda')",
      at="amp.legacy")
def deprecated_autocast_api(args, ctx):
    call = ctx.call
    if call.route and call.api != call.route:
        return deprecated_autocast_api.rule.finding(
            {"api": call.api}, state={"api": call.route}, why=
            "the old name warns on every call and will be removed; the same object is "
            "built through torch.amp",
            done="%s built through %s, without the FutureWarning" % (call.api, call.route))


@rule("AMP502", "deprecated-grad-scaler", GROUP,
      "torch.cuda.amp.GradScaler, torch.cpu.amp.GradScaler: built as "
      "torch.amp.GradScaler(device, ...), the old positional arguments kept by name",
      "FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated. Please use "
      "`torch.amp.GradScaler('cuda', args...)` instead.",
      "torch.amp.GradScaler('cuda', init_scale=..., ...) with keywords (a positional "
      "init_scale would now be the device)",
      at="scaler")
def deprecated_grad_scaler(args, ctx):
    call = ctx.call
    if call.route and not call.provided:
        return deprecated_grad_scaler.rule.finding(
            {"api": call.api}, state={"api": "%s(%r)" % (call.route, _scaler_device(args, call))},
            why=
            "the old name is deprecated and will be removed; the same scaler is built "
            "through torch.amp",
            done="%s built as %s(%r), without the FutureWarning" % (
                call.api, call.route, _scaler_device(args, call)))


@rule("AMP506", "provided-amp-api", GROUP,
      "torch.amp.GradScaler / torch.amp.autocast missing on this torch: provided "
      "(GradScaler by the CUDA one; for another device, disabled)",
      "AttributeError: module 'torch.amp' has no attribute 'GradScaler'",
      "torch >= 2.3, or torch.cuda.amp.GradScaler() / torch.autocast(...) on older torch",
      at=("scaler", "amp.provided"))
def provided_amp_api(args, ctx):
    call = ctx.call
    if not call.provided:
        return None
    before, changes = {"api": call.api + " (missing)"}, {}
    why = "this torch has no %s; %s does the same" % (call.api, call.route)
    done = "%s, missing here, provided by %s" % (call.api, call.route)
    if "device" in args:  # a GradScaler
        device = _scaler_device(args, call)
        if device != "cuda" and args["enabled"]:
            before["enabled"], changes["enabled"] = True, False
            why += ", for CUDA only, so the scaler for %s is disabled" % device
            done += " (CUDA only: disabled for %s)" % device
    return provided_amp_api.rule.finding(before, changes, why, state={"api": call.route},
                                         done=done)


@rule("AMP504", "scaler-device-argument", GROUP,
      "GradScaler(device=...) on a class that takes no device (torch.cuda.amp.GradScaler; "
      "GradScaler before torch 2.3): accepted and routed",
      "TypeError: GradScaler.__init__() got an unexpected keyword argument 'device'",
      "torch.amp.GradScaler(device, ...) on torch >= 2.3; on older torch, "
      "torch.cuda.amp.GradScaler(...) without a device",
      at="scaler")
def scaler_device_argument(args, ctx):
    call = ctx.call
    given = args["device"]
    if given is None or call.takes_device:
        return None
    device = device_type(given)
    after = {"device": device}
    if call.route:
        why = "routed to %s(%r), which takes the device" % (call.route, device)
    elif device == call.device:
        why = "%s is already for %s; the argument is dropped" % (call.api, device)
    else:
        if args["enabled"]:
            after["enabled"] = False
        why = ("this torch has no GradScaler for %s (%s scales %s tensors only); "
               "disabled" % (device, call.api, call.device))
    return scaler_device_argument.rule.finding({"device": given}, after, why,
                                               done="device=%r accepted: %s" % (device, why))


@rule("AMP505", "autocast-unsupported", GROUP,
      "autocast with a dtype (or on a device) this torch cannot autocast to: disabled, "
      "as torch itself would, without the warning or the error; a torch.device given as "
      "device_type: its type string",
      "UserWarning: In CPU autocast, but the target dtype is not supported. Disabling "
      "autocast. / RuntimeError: Current CUDA Device does not support bfloat16. Please "
      "switch dtype to float16. / ValueError: Expected `device_type` of type `str`, got: "
      "`<class 'torch.device'>`",
      "pass device_type=device.type, and a dtype the device autocasts to on your oldest "
      "torch (bfloat16 on CPU, float16 on MPS before torch 2.6)",
      at="autocast")
def autocast_unsupported(args, ctx):
    facts, caps = ctx.facts, ctx.caps
    given = args["device_type"]
    before, after, why, done = {}, {}, [], []
    device = device_type(given)
    if not isinstance(given, str) and hasattr(given, "type"):
        before["device_type"], after["device_type"] = given, device
        why.append("autocast takes the device type as a string")
        done.append("device_type torch.device(%r) -> %r" % (str(given), device))
    # Only for a device that is here; one that is not is AMP503's.
    if args["enabled"] and device_available(device, facts):
        if not caps.autocast_accepts(device):
            before["enabled"], after["enabled"] = True, False
            after["device_type"] = inert_device(facts)
            why.append("this torch cannot autocast on %s; the region runs in the "
                       "model's own precision" % device)
            done.append("autocast on %s disabled: this torch cannot autocast there" % device)
        elif args["dtype"] is not None and not caps.autocast_supports(device, args["dtype"]):
            before["dtype"], before["enabled"], after["enabled"] = args["dtype"], True, False
            why.append("this torch cannot autocast to %s on %s; disabled, as torch "
                       "itself does (or would, instead of raising), so the region runs "
                       "in the model's own precision" % (args["dtype"], device))
            done.append("autocast to %s on %s disabled, as torch does: this torch cannot "
                        "autocast to it" % (args["dtype"], device))
        if after.get("enabled") is False:
            _disable_quietly(before, after, args, caps)
    if after:
        return autocast_unsupported.rule.finding(before, after, "; ".join(why),
                                                 done="; ".join(done))


@rule("AMP503", "amp-device-unavailable", GROUP,
      "autocast or GradScaler for a device that is not available: disabled, logged once "
      "per call site",
      "UserWarning: CUDA is not available or torch_xla is imported. Disabling autocast. / "
      "UserWarning: torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  "
      "Disabling. / RuntimeError: User specified autocast device_type must be 'cuda' or "
      "'cpu' (torch 2.0)",
      "take the device from the model (device_type=device.type) and pass "
      "enabled=(device.type == 'cuda') where AMP is CUDA-only",
      at=("autocast", "scaler"))
def amp_device_unavailable(args, ctx):
    facts, caps, call = ctx.facts, ctx.caps, ctx.call
    if not args["enabled"]:
        return None
    if "device_type" in args:
        device = device_type(args["device_type"])
        if device_available(device, facts):
            return None
        after = {"enabled": False}
        if not caps.autocast_accepts(device):
            after["device_type"] = inert_device(facts)
        before = {"device_type": args["device_type"], "enabled": True}
        _disable_quietly(before, after, args, caps)
        return amp_device_unavailable.rule.finding(
            before, after,
            "there is no %s device here, so there is nothing to autocast on it" % device,
            done="autocast(%r) disabled: no %s device here" % (device, device))
    device = _scaler_device(args, call)
    if device_available(device, facts):
        return None
    return amp_device_unavailable.rule.finding(
        {"device": device, "enabled": True}, {"enabled": False},
        "there is no %s device here; a disabled scaler passes the loss and the "
        "optimizer step through unchanged" % device,
        done="GradScaler(%r) disabled: no %s device here (it passes the loss through)"
        % (device, device))

# Checks run in their order here, per hook: autocast: AMP505 then AMP503 (a
# device type is normalised before it is looked up); scaler: AMP502, AMP506,
# AMP504, AMP503.
