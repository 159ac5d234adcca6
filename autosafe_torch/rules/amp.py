"""AMP across torch versions and devices: autocast and GradScaler.

The AMP API moved: ``torch.cuda.amp`` / ``torch.cpu.amp`` became
``torch.amp`` with a leading device argument (GradScaler in 2.3, autocast
and custom_fwd in 2.4, with a FutureWarning on the old names), and each
device learned its autocast dtypes at its own pace. Scripts written for one
torch and machine warn, crash, or silently run in fp32 on another.

Every check takes the call's arguments by name (GradScaler's ``device``:
None when not given) and an ``AmpContext`` (its ``caps`` probed once; tests
pass a fake). A routing finding shows the pseudo-argument ``api``: the patch
builds the object through the modern class instead.
"""

from typing import Any, NamedTuple, Optional

from . import AmpContext, Rewrite, rule

GROUP = "amp"


class AmpCall(NamedTuple):
    """Which AMP API a call went through: ``api``, the name called;
    ``device``, the device that API is fixed to (None: an argument);
    ``route``: the modern API it can be built through here, or None;
    ``provided``: supplied by autosafe_torch because this torch lacks it."""

    api: str
    device: Optional[str] = None
    takes_device: bool = True
    route: Optional[str] = None
    provided: bool = False


def device_type(value):
    """``"cuda"`` for "cuda", "cuda:1" or torch.device("cuda", 1); None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.split(":", 1)[0]
    return getattr(value, "type", value)


def device_available(device, facts):
    return device in ("cpu", facts.accelerator)


def _disable(before, after, args, ctx, device):
    """Autocast on ``device`` disabled. Where this torch would refuse ``device``,
    on one every torch accepts and nothing here runs on, so the region changes
    no tensor: "cuda" where there is no CUDA, else "cpu" (it would only matter
    nested in an enabled CPU region). The dtype reset where this torch warns
    about it even in a disabled region (torch 2.0 checks the CPU dtype before
    ``enabled``), which never uses it."""
    before["enabled"], after["enabled"] = True, False
    if not ctx.caps.autocast_accepts(device):
        after["device_type"] = "cpu" if ctx.facts.accelerator == "cuda" else "cuda"
    dtype = args["dtype"]
    device = after.get("device_type", device_type(args["device_type"]))
    if dtype is not None and not ctx.caps.autocast_quiet_when_disabled(device, dtype):
        before["dtype"], after["dtype"] = dtype, None


def _scaler_device(args, call):
    return device_type(args["device"]) or call.device or "cuda"


TORCH_AMP_REWRITE = Rewrite(
    'amp', 'site',
    '`torch.amp.autocast("cuda", ...)`, `torch.amp.GradScaler("cuda", ...)`, '
    '`torch.amp.custom_fwd(device_type="cuda")`, with the old positional arguments '
    "given by the names they bound to (`autocast(False)` is `enabled=False`, not a "
    "dtype); calls, decorators, and names imported `from torch.cuda.amp` (the import "
    "goes once nothing uses it); a `device=` the old scaler was given becomes the new "
    "one's device",
    "`*args`, `**kwargs`; the call is not at the logged line")


@rule("AMP501", "deprecated-autocast-api", GROUP,
      summary=("torch.cuda.amp.autocast, torch.cpu.amp.autocast, "
               "torch.cuda.amp.custom_fwd and custom_bwd: built through torch.amp, the "
               "old positional arguments kept by name"),
      prevents=("FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated. Please "
                "use `torch.amp.autocast('cuda', args...)` instead."),
      fix=("torch.amp.autocast('cuda', enabled=..., dtype=...) with keywords (a "
           "positional `enabled` would now be the dtype); "
           "torch.amp.custom_fwd(device_type='cuda')"),
      example=(("with torch.cuda.amp.autocast(True):\n"
                "    loss = model(x)"),
               ("with torch.amp.autocast('cuda', enabled=True):\n"
                "    loss = model(x)")),
      versions=("torch 2.4 and later warn (the old names are deprecated); earlier torch "
                "has torch.amp.autocast too"),
      rewrite=TORCH_AMP_REWRITE,
      at="amp.legacy")
def deprecated_autocast_api(args, ctx: AmpContext):
    call = ctx.call
    if call.route and call.api != call.route:
        return deprecated_autocast_api.rule.finding(
            {"api": call.api}, shown={"api": call.route}, applied_by="patch", why=
            "the old name warns on every call and will be removed; the same object is "
            "built through torch.amp",
            done="%s built through %s, without the FutureWarning" % (call.api, call.route))


@rule("AMP502", "deprecated-grad-scaler", GROUP,
      summary=("torch.cuda.amp.GradScaler, torch.cpu.amp.GradScaler: built as "
               "torch.amp.GradScaler(device, ...), the old positional arguments kept by "
               "name"),
      prevents=("FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated. "
                "Please use `torch.amp.GradScaler('cuda', args...)` instead."),
      fix=("torch.amp.GradScaler('cuda', init_scale=..., ...) with keywords (a "
           "positional init_scale would now be the device)"),
      example=("scaler = torch.cuda.amp.GradScaler(2.0 ** 16)",
               "scaler = torch.amp.GradScaler('cuda', init_scale=2.0 ** 16)"),
      versions="torch 2.4 and later warn; torch.amp.GradScaler exists from torch 2.3",
      rewrite=TORCH_AMP_REWRITE,
      at="scaler")
def deprecated_grad_scaler(args, ctx: AmpContext):
    call = ctx.call
    if call.route and not call.provided:
        built = "%s(%r)" % (call.route, _scaler_device(args, call))
        return deprecated_grad_scaler.rule.finding(
            {"api": call.api}, shown={"api": built}, applied_by="patch", why=
            "the old name is deprecated and will be removed; the same scaler is built "
            "through torch.amp",
            done="%s built as %s, without the FutureWarning" % (call.api, built))


@rule("AMP506", "provided-amp-api", GROUP,
      summary=("torch.amp.GradScaler / torch.amp.autocast missing on this torch: "
               "provided (GradScaler by the CUDA one; for another device, disabled)"),
      prevents="AttributeError: module 'torch.amp' has no attribute 'GradScaler'",
      fix=("torch >= 2.3, or torch.cuda.amp.GradScaler() / torch.autocast(...) on older "
           "torch"),
      example=("scaler = torch.amp.GradScaler('cuda')   # on torch 2.2",
               "scaler = torch.cuda.amp.GradScaler()    # or torch >= 2.3"),
      versions="torch before 2.3 (no torch.amp.GradScaler)",
      at=("scaler", "amp.provided"))
def provided_amp_api(args, ctx: AmpContext):
    call = ctx.call
    if not call.provided:
        return None
    before: dict[str, Any] = {"api": call.api + " (missing)"}
    changes: dict[str, Any] = {}
    why = "this torch has no %s; %s does the same" % (call.api, call.route)
    done = "%s, missing here, provided by %s" % (call.api, call.route)
    device = _scaler_device(args, call) if "device" in args else "cuda"  # "device": a GradScaler
    if device != "cuda" and args["enabled"]:
        before["enabled"], changes["enabled"] = True, False
        why += ", for CUDA only, so the scaler for %s is disabled" % device
        done += " (CUDA only: disabled for %s)" % device
    return provided_amp_api.rule.finding(before, changes, why, shown={"api": call.route},
                                         applied_by="patch", done=done)


@rule("AMP504", "scaler-device-argument", GROUP,
      summary=("GradScaler(device=...) on a class that takes no device "
               "(torch.cuda.amp.GradScaler; GradScaler before torch 2.3): accepted and "
               "routed"),
      prevents=("TypeError: GradScaler.__init__() got an unexpected keyword argument "
                "'device'"),
      fix=("torch.amp.GradScaler(device, ...) on torch >= 2.3; on older torch, "
           "torch.cuda.amp.GradScaler(...) without a device"),
      example=("scaler = torch.cuda.amp.GradScaler(device='cuda')",
               ("scaler = torch.amp.GradScaler('cuda')          # torch >= 2.3\n"
                "scaler = torch.cuda.amp.GradScaler()           # older torch")),
      versions=("torch before 2.3 (GradScaler takes no device), and "
                "torch.cuda.amp.GradScaler on every torch"),
      rewrite=TORCH_AMP_REWRITE,
      at="scaler",
      # it reads enabled, which AMP506 may turn off
      after=("provided_amp_api",))
def scaler_device_argument(args, ctx: AmpContext):
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
      summary=("autocast with a dtype (or on a device) this torch cannot autocast to: "
               "disabled, as torch itself would, without the warning or the error; a "
               "torch.device given as device_type: its type string"),
      prevents=("UserWarning: In CPU autocast, but the target dtype is not supported. "
                "Disabling autocast. / RuntimeError: Current CUDA Device does not "
                "support bfloat16. Please switch dtype to float16. / ValueError: "
                "Expected `device_type` of type `str`, got: `<class 'torch.device'>`"),
      fix=("pass device_type=device.type, and a dtype the device autocasts to on your "
           "oldest torch (bfloat16 on CPU, float16 on MPS before torch 2.6)"),
      example=(("with torch.autocast('cpu', dtype=torch.float16):\n"
                "    loss = model(x)"),
               ("with torch.autocast('cpu', dtype=torch.bfloat16):\n"
                "    loss = model(x)")),
      versions=("any: which device types and dtypes autocast takes is asked of the "
                "installed torch (probed once), not read from its version number"),
      rewrite=Rewrite(
        'amp', 'site',
        "a `torch.device` as device type: `device.type`; bfloat16 on a GPU that cannot: "
        "`enabled=... torch.cuda.is_bf16_supported()`",
        "any other dtype the device cannot autocast to"),
      at="autocast")
def autocast_unsupported(args, ctx: AmpContext):
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
            _disable(before, after, args, ctx, device)
            why.append("this torch cannot autocast on %s; the region runs in the "
                       "model's own precision" % device)
            done.append("autocast on %s disabled: this torch cannot autocast there" % device)
        elif args["dtype"] is not None and not caps.autocast_supports(device, args["dtype"]):
            before["dtype"] = args["dtype"]
            _disable(before, after, args, ctx, device)
            why.append("this torch cannot autocast to %s on %s; disabled, as torch "
                       "itself does (or would, instead of raising), so the region runs "
                       "in the model's own precision" % (args["dtype"], device))
            done.append("autocast to %s on %s disabled, as torch does: this torch cannot "
                        "autocast to it" % (args["dtype"], device))
    if after:
        return autocast_unsupported.rule.finding(before, after, "; ".join(why),
                                                 done="; ".join(done))


@rule("AMP503", "amp-device-unavailable", GROUP,
      summary=("autocast or GradScaler for a device that is not available: disabled, "
               "logged once per call site"),
      prevents=("UserWarning: CUDA is not available or torch_xla is imported. Disabling "
                "autocast. / UserWarning: torch.cuda.amp.GradScaler is enabled, but CUDA "
                "is not available.  Disabling. / RuntimeError: User specified autocast "
                "device_type must be 'cuda' or 'cpu' (torch 2.0)"),
      fix=("take the device from the model (device_type=device.type) and pass "
           "enabled=(device.type == 'cuda') where AMP is CUDA-only"),
      example=(("with torch.autocast('cuda'):       # on a machine without CUDA\n"
                "    loss = model(x)"),
               ("device = next(model.parameters()).device\n"
                "with torch.autocast(device.type, enabled=device.type == 'cuda'):\n"
                "    loss = model(x)")),
      versions=("every supported torch; torch 2.0 raises for a device type other than "
                "cuda or cpu"),
      rewrite=Rewrite(
        'amp', 'site',
        "`enabled=torch.cuda.is_available()` for the device the run asked for "
        "(`torch.backends.mps`, `torch.xpu` likewise; `enabled=x and ...` for a given value)",
        "the run changed more than `enabled` (an old torch)"),
      at=("autocast", "scaler"),
      # it reads enabled and the device as the others left them
      after=("autocast_unsupported", "scaler_device_argument", "provided_amp_api",
             "deprecated_grad_scaler"))
def amp_device_unavailable(args, ctx: AmpContext):
    facts, call = ctx.facts, ctx.call
    if not args["enabled"]:
        return None
    if "device_type" in args:
        device = device_type(args["device_type"])
        if device_available(device, facts):
            return None
        before, after = {"device_type": args["device_type"]}, dict[str, Any]()
        _disable(before, after, args, ctx, device)
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
