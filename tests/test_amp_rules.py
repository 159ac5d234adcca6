"""AMP501-AMP506 as pure functions: arguments, injected Facts, a fake ``caps``.

No torch is needed here: the devices (CUDA, MPS) and the torch versions are
the facts and capabilities the checks are given.
"""

import pytest

from autosafe_torch.engine import run_checks
from autosafe_torch.facts import Facts
from autosafe_torch.rules import RULES, AmpContext, load_all
from autosafe_torch.rules import amp as r
from autosafe_torch.rules.amp import AmpCall


class FakeCaps:
    """What a torch's autocast accepts: device types, and (device, dtype) pairs."""

    def __init__(self, devices=("cuda", "cpu", "mps", "xpu"), unsupported=(),
                 loud_when_disabled=()):
        self.devices = set(devices)
        self.unsupported = set(unsupported)
        # (device, dtype) pairs that warn even in a disabled region (torch 2.0's CPU).
        self.loud_when_disabled = set(loud_when_disabled)

    def autocast_accepts(self, device):
        return device in self.devices

    def autocast_supports(self, device, dtype):
        return (device, dtype) not in self.unsupported

    def autocast_quiet_when_disabled(self, device, dtype):
        return (device, dtype) not in self.loud_when_disabled


class FakeDevice:
    """Stands in for torch.device."""

    def __init__(self, type):
        self.type = type

    def __repr__(self):
        return "device(type=%r)" % self.type


CPU_ONLY = Facts(platform="linux", accelerator=None)
WITH_CUDA = Facts(platform="linux", accelerator="cuda")
WITH_MPS = Facts(platform="darwin", accelerator="mps")

MODERN_AUTOCAST = AmpCall("torch.autocast")
MODERN_SCALER = AmpCall("torch.amp.GradScaler")
# torch >= 2.3: the old class derives from torch.amp.GradScaler and can be routed.
LEGACY_SCALER = AmpCall("torch.cuda.amp.GradScaler", device="cuda", takes_device=False,
                        route="torch.amp.GradScaler")
# torch < 2.3: torch.cuda.amp.GradScaler is the only GradScaler.
OLD_TORCH_SCALER = AmpCall("torch.cuda.amp.GradScaler", device="cuda", takes_device=False)
PROVIDED_SCALER = AmpCall("torch.amp.GradScaler", takes_device=True,
                          route="torch.cuda.amp.GradScaler", provided=True)


def ctx(facts, caps, call):
    return AmpContext(facts, caps=caps, call=call)


def autocast_args(device_type="cuda", dtype=None, enabled=True, cache_enabled=None):
    return {"device_type": device_type, "dtype": dtype, "enabled": enabled,
            "cache_enabled": cache_enabled}


def scaler_args(device=None, init_scale=2.0 ** 16, enabled=True):
    return {"device": device, "init_scale": init_scale, "growth_factor": 2.0,
            "backoff_factor": 0.5, "growth_interval": 2000, "enabled": enabled}


def autocast_outcome(args, facts, caps=None):
    found, fixed = run_checks("autocast", args, AmpContext(facts, caps=caps or FakeCaps(),
                                                           call=MODERN_AUTOCAST))
    return [f.rule.code for f in found], with_state(fixed, found)


def scaler_outcome(args, facts, call, caps=None):
    found, fixed = run_checks("scaler", args,
                              AmpContext(facts, caps=caps or FakeCaps(), call=call))
    return [f.rule.code for f in found], with_state(fixed, found)


def with_state(fixed, found):
    """The arguments as the checks left them, and the route (``api``) they chose."""
    for f in found:
        fixed = dict(fixed, **f.shown)
    return fixed


def test_all_six_rules_are_registered_with_their_texts():
    load_all()
    codes = [code for code, rule in sorted(RULES.items()) if rule.group == "amp"]
    assert codes == ["AMP501", "AMP502", "AMP503", "AMP504", "AMP505", "AMP506"]
    for code in codes:
        rule = RULES[code]
        assert rule.summary and rule.prevents and rule.fix and rule.slug
    assert "is deprecated" in RULES["AMP501"].prevents
    assert "unexpected keyword argument 'device'" in RULES["AMP504"].prevents


# AMP501 / AMP502: the deprecated names -------------------------------------------

def test_amp501_routes_a_deprecated_autocast_name():
    call = AmpCall("torch.cuda.amp.autocast", device="cuda", takes_device=False,
                   route="torch.amp.autocast('cuda')")
    found = r.deprecated_autocast_api({}, ctx(WITH_CUDA, FakeCaps(), call))
    assert found.after == {"api": "torch.amp.autocast('cuda')"}
    assert r.deprecated_autocast_api({}, ctx(WITH_CUDA, FakeCaps(), MODERN_AUTOCAST)) is None


def test_a_repeated_route_counts_into_the_record_and_is_recorded_anew_after_clear():
    from autosafe_torch import engine, report

    call = AmpCall("torch.cuda.amp.autocast", device="cuda", takes_device=False,
                   route="torch.amp.autocast('cuda')")
    found = (r.deprecated_autocast_api({}, ctx(WITH_CUDA, FakeCaps(), call)),)
    for _ in range(3):
        assert engine.settle_repeated(found, "train.py:7") is True
    assert [(i.code, i.count) for i in report.interventions()] == [("AMP501", 3)]
    report.clear()
    assert engine.settle_repeated(found, "train.py:7") is True
    assert [(i.code, i.count) for i in report.interventions()] == [("AMP501", 1)]


def test_amp502_routes_the_legacy_scaler_with_its_device():
    codes, fixed = scaler_outcome(scaler_args(init_scale=1024.0), WITH_CUDA, LEGACY_SCALER)
    assert codes == ["AMP502"]
    assert fixed["api"] == "torch.amp.GradScaler('cuda')"
    assert fixed["init_scale"] == 1024.0 and fixed["enabled"] is True


def test_amp502_has_nothing_to_route_on_old_torch_or_for_the_modern_class():
    assert scaler_outcome(scaler_args(), WITH_CUDA, OLD_TORCH_SCALER) == ([], scaler_args())
    assert scaler_outcome(scaler_args(device="cuda"), WITH_CUDA, MODERN_SCALER)[0] == []


# AMP503: a device that is not there ---------------------------------------------

def test_amp503_disables_cuda_autocast_without_cuda():
    codes, fixed = autocast_outcome(autocast_args("cuda"), CPU_ONLY)
    assert codes == ["AMP503"]
    assert fixed["enabled"] is False and fixed["device_type"] == "cuda"


def test_amp503_leaves_a_present_device_and_a_disabled_region_alone():
    assert autocast_outcome(autocast_args("cuda"), WITH_CUDA)[0] == []
    assert autocast_outcome(autocast_args("cpu"), CPU_ONLY)[0] == []
    assert autocast_outcome(autocast_args("cuda", enabled=False), CPU_ONLY)[0] == []


def test_amp503_swaps_a_device_type_this_torch_rejects_for_an_inert_one():
    """torch 2.0: autocast takes 'cuda' and 'cpu' only; 'xpu' raises RuntimeError."""
    torch20 = FakeCaps(devices=("cuda", "cpu"))
    codes, fixed = autocast_outcome(autocast_args("xpu"), CPU_ONLY, torch20)
    assert codes == ["AMP503"]
    assert fixed["device_type"] == "cuda" and fixed["enabled"] is False
    # With CUDA present, a disabled CUDA region would not be inert: CPU it is.
    codes, fixed = autocast_outcome(autocast_args("xpu"), WITH_CUDA, torch20)
    assert fixed["device_type"] == "cpu" and fixed["enabled"] is False


def test_amp503_and_amp505_drop_a_dtype_that_warns_even_when_disabled():
    """torch 2.0 checks the CPU dtype before ``enabled``: a disabled
    autocast("cpu", dtype=torch.float16) still warns, so the dtype goes too."""
    torch20 = FakeCaps(devices=("cuda", "cpu"), unsupported=[("cpu", "float16")],
                       loud_when_disabled=[("cpu", "float16")])
    codes, fixed = autocast_outcome(autocast_args("cpu", dtype="float16"), CPU_ONLY, torch20)
    assert codes == ["AMP505"] and fixed["enabled"] is False and fixed["dtype"] is None
    # An inert CPU region for a device this torch rejects, on a CUDA machine.
    codes, fixed = autocast_outcome(autocast_args("xpu", dtype="float16"), WITH_CUDA, torch20)
    assert codes == ["AMP503"]
    assert (fixed["device_type"], fixed["enabled"], fixed["dtype"]) == ("cpu", False, None)
    # Where a disabled region is quiet, the dtype is kept.
    codes, fixed = autocast_outcome(autocast_args("cpu", dtype="float16"), CPU_ONLY,
                                    FakeCaps(unsupported=[("cpu", "float16")]))
    assert codes == ["AMP505"] and fixed["dtype"] == "float16"


def test_amp503_disables_a_cuda_scaler_without_cuda():
    for call in (MODERN_SCALER, LEGACY_SCALER, OLD_TORCH_SCALER):
        args = scaler_args(device="cuda" if call.takes_device else None)
        codes, fixed = scaler_outcome(args, CPU_ONLY, call)
        assert "AMP503" in codes and fixed["enabled"] is False, call
    assert scaler_outcome(scaler_args(device="cpu"), CPU_ONLY, MODERN_SCALER)[0] == []
    assert scaler_outcome(scaler_args(device="cuda"), WITH_CUDA, MODERN_SCALER)[0] == []


# AMP504: GradScaler(device=...) on a class without one ------------------------------

def test_amp504_routes_a_device_where_torch_amp_has_the_scaler():
    codes, fixed = scaler_outcome(scaler_args(device=FakeDevice("cpu")), CPU_ONLY,
                                  LEGACY_SCALER)
    assert codes == ["AMP502", "AMP504"]
    assert fixed["device"] == "cpu" and fixed["enabled"] is True


def test_amp504_on_old_torch_drops_cuda_and_disables_another_device():
    codes, fixed = scaler_outcome(scaler_args(device="cuda"), WITH_CUDA, OLD_TORCH_SCALER)
    assert codes == ["AMP504"] and fixed["enabled"] is True
    codes, fixed = scaler_outcome(scaler_args(device="cpu"), WITH_CUDA, OLD_TORCH_SCALER)
    assert codes == ["AMP504"] and fixed["enabled"] is False
    assert "no GradScaler for cpu" in r.scaler_device_argument(
        scaler_args(device="cpu"), ctx(WITH_CUDA, FakeCaps(), OLD_TORCH_SCALER)).why


def test_amp504_is_silent_when_the_class_takes_a_device_or_none_is_given():
    assert r.scaler_device_argument(scaler_args(device="cuda"),
                                    ctx(WITH_CUDA, FakeCaps(), MODERN_SCALER)) is None
    assert r.scaler_device_argument(scaler_args(), ctx(WITH_CUDA, FakeCaps(),
                                                       LEGACY_SCALER)) is None


# AMP505: what this torch cannot autocast ------------------------------------------

def test_amp505_turns_a_torch_device_into_its_type():
    codes, fixed = autocast_outcome(autocast_args(FakeDevice("cpu")), CPU_ONLY)
    assert codes == ["AMP505"] and fixed["device_type"] == "cpu" and fixed["enabled"]


def test_amp505_then_amp503_for_a_torch_device_that_is_not_there():
    codes, fixed = autocast_outcome(autocast_args(FakeDevice("cuda")), CPU_ONLY)
    assert codes == ["AMP505", "AMP503"]
    assert fixed["device_type"] == "cuda" and fixed["enabled"] is False


@pytest.mark.parametrize("facts, device, dtype, shape", [
    (CPU_ONLY, "cpu", "float16", "torch 2.0: CPU autocast took bfloat16 only"),
    (WITH_MPS, "mps", "bfloat16", "torch 2.5: MPS autocast took float16 only"),
    (WITH_CUDA, "cuda", "bfloat16", "a GPU without bfloat16: torch raises"),
])
def test_amp505_disables_a_dtype_the_device_cannot_do(facts, device, dtype, shape):
    caps = FakeCaps(unsupported=[(device, dtype)])
    codes, fixed = autocast_outcome(autocast_args(device, dtype), facts, caps)
    assert codes == ["AMP505"], shape
    assert fixed["enabled"] is False and fixed["dtype"] == dtype


def test_amp505_leaves_supported_dtypes_and_absent_devices_alone():
    caps = FakeCaps(unsupported=[("cpu", "float16"), ("cuda", "bfloat16")])
    assert autocast_outcome(autocast_args("cpu", "bfloat16"), CPU_ONLY, caps)[0] == []
    # No CUDA here: that is AMP503's, not a dtype question.
    assert autocast_outcome(autocast_args("cuda", "bfloat16"), CPU_ONLY, caps)[0] == ["AMP503"]


def test_amp505_present_device_this_torch_cannot_autocast_on():
    """torch 2.0 on a Mac: MPS is there, autocast does not know it."""
    codes, fixed = autocast_outcome(autocast_args("mps"), WITH_MPS,
                                    FakeCaps(devices=("cuda", "cpu")))
    assert codes == ["AMP505"]
    assert fixed["enabled"] is False and fixed["device_type"] == "cuda"


# AMP506: provided where missing ----------------------------------------------------

def test_amp506_provided_scaler_is_cuda_only():
    codes, fixed = scaler_outcome(scaler_args(device="cuda"), WITH_CUDA, PROVIDED_SCALER)
    assert codes == ["AMP506"] and fixed["enabled"] is True
    codes, fixed = scaler_outcome(scaler_args(device="cpu"), WITH_CUDA, PROVIDED_SCALER)
    assert codes == ["AMP506"] and fixed["enabled"] is False
    codes, fixed = scaler_outcome(scaler_args(device="cuda"), CPU_ONLY, PROVIDED_SCALER)
    assert codes == ["AMP506", "AMP503"] and fixed["enabled"] is False


def test_amp506_provided_autocast():
    call = AmpCall("torch.amp.autocast", route="torch.autocast", provided=True)
    found = r.provided_amp_api({}, ctx(CPU_ONLY, FakeCaps(), call))
    assert found.after == {"api": "torch.autocast"}


def test_disabled_rules_are_skipped():
    from autosafe_torch.config import CONFIG

    CONFIG.disabled = frozenset({"AMP503"})
    assert autocast_outcome(autocast_args("cuda"), CPU_ONLY)[0] == []
    CONFIG.disabled = frozenset({"amp"})
    assert autocast_outcome(autocast_args(FakeDevice("cuda")), CPU_ONLY)[0] == []
