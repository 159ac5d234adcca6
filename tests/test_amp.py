"""AMP501-AMP506 in real subprocesses: the warning or failure without
autosafe_torch, the clean run with it.

Warnings are turned into errors inside the scripts, so "clean" means no
FutureWarning and no UserWarning at all. Old torch API shapes are simulated
on a newer torch by hiding or replacing the newer names before autosafe_torch
patches them (``OLD_TORCH`` says which torch each shape stands for); on a
real old torch (``make compat``: torch 2.0.1) they are the real thing, and
the cases for the deprecated names skip. Real CUDA runs are marked ``gpu``
and skip without CUDA.
"""

import re

import pytest
import torch

from autosafe_torch.patches import original
from support import json_log, line_of, logged, run_script

# What the installed torch has, by feature, as the patch decides it.
# torch >= 2.4: torch.cuda.amp.autocast is deprecated (AMP501 routes it).
# torch >= 2.4 deprecates torch.cuda.amp.autocast: its class (2.9 and later, as far as
# run) or its __init__ (2.8) (AMP501).
ROUTES_AUTOCAST = any(getattr(obj, "__deprecated__", None) is not None for obj in (
    torch.cuda.amp.autocast, original(torch.cuda.amp.autocast, "__init__")))
# torch >= 2.3: torch.cuda.amp.GradScaler derives from torch.amp.GradScaler (AMP502).
_MODERN_SCALER = getattr(torch.amp, "GradScaler", None)
ROUTES_SCALER = _MODERN_SCALER is not None and _MODERN_SCALER is not torch.cuda.amp.GradScaler \
    and issubclass(torch.cuda.amp.GradScaler, _MODERN_SCALER)
needs_deprecated_names = pytest.mark.skipif(
    not (ROUTES_AUTOCAST and ROUTES_SCALER),
    reason="needs torch >= 2.4 (deprecated torch.cuda.amp names); this is torch %s"
    % torch.__version__)

# Each case is a snippet that sets ``result``; the script prints OK or FAILED.
RUNNER = '''
import os, sys, warnings
%(prelude)s
warnings.simplefilter("error", FutureWarning)
warnings.simplefilter("error", UserWarning)
CASES = %(cases)r

for code, snippet in CASES.items():
    scope = {"torch": torch, "warnings": warnings}
    try:
        exec(snippet, scope)
    except Exception as exc:
        print("FAILED", code, "%%s: %%s" %% (type(exc).__name__, str(exc).splitlines()[0]),
              flush=True)
    else:
        print("OK", code, repr(scope.get("result")), flush=True)
'''

CUSTOM_FN = '''
class Double(torch.autograd.Function):
    @staticmethod
    @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
    def forward(ctx, x):
        return x * 2
    @staticmethod
    @torch.cuda.amp.custom_bwd
    def backward(ctx, grad):
        return grad * 2
x = torch.ones(3, requires_grad=True)
Double.apply(x).sum().backward()
result = x.grad.tolist()
'''

# code -> (snippet, what torch says without autosafe_torch, result with it)
MODERN_TORCH_CASES = {
    "AMP501 cuda autocast(False)": (
        "a = torch.cuda.amp.autocast(False)\nresult = (a._enabled, a.fast_dtype)",
        "FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated",
        "(False, torch.float16)"),
    "AMP501 cpu autocast(True, fp16)": (
        "a = torch.cpu.amp.autocast(True, torch.float16)\nresult = (a._enabled, a.fast_dtype)",
        "FutureWarning: `torch.cpu.amp.autocast(args...)` is deprecated",
        "(True, torch.float16)"),
    "AMP501 custom_fwd/custom_bwd": (
        CUSTOM_FN, "FutureWarning: `torch.cuda.amp.custom_fwd(args...)` is deprecated",
        "[2.0, 2.0, 2.0]"),
    "AMP501 subclass": (
        "class Mine(torch.cuda.amp.autocast):\n    pass\n"
        "m = Mine(enabled=False)\n"
        "result = (isinstance(m, torch.cuda.amp.autocast), isinstance(m, torch.autocast))",
        "FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated",
        "(True, True)"),
    "AMP502 positional init_scale": (
        "s = torch.cpu.amp.GradScaler(1024.0)\n"
        "result = (s.get_scale(), type(s).__module__, isinstance(s, torch.amp.GradScaler))",
        "FutureWarning: `torch.cpu.amp.GradScaler(args...)` is deprecated",
        "(1024.0, 'torch.cpu.amp.grad_scaler', True)"),
    "AMP503 autocast('cuda')": (
        "with torch.autocast('cuda'):\n    result = torch.is_autocast_enabled('cuda')",
        ("UserWarning: CUDA is not available or torch_xla is imported. Disabling autocast.",
         "UserWarning: User provided device_type of 'cuda', but CUDA is not available."),  # 2.8
        "False"),
    "AMP503 GradScaler('cuda')": (
        "result = torch.amp.GradScaler('cuda').is_enabled()",
        "UserWarning: torch.cuda.amp.GradScaler is enabled, but CUDA is not available.",
        "False"),
    "AMP504 GradScaler(device=)": (
        "with warnings.catch_warnings():  # the TypeError, not the FutureWarning first\n"
        "    warnings.simplefilter('ignore', FutureWarning)\n"
        "    s = torch.cuda.amp.GradScaler(device='cpu', init_scale=8.0)\n"
        "result = (s.get_scale(), s._device)",
        ("TypeError: GradScaler.__init__() got an unexpected keyword argument 'device'",
         "TypeError: __init__() got an unexpected keyword argument 'device'"),  # Python 3.9
        "(8.0, 'cpu')"),
    "AMP505 torch.device": (
        "with torch.autocast(torch.device('cpu'), dtype=torch.bfloat16):\n"
        "    result = (torch.ones(2, 2) @ torch.ones(2, 2)).dtype",
        "ValueError: Expected `device_type` of type `str`, got: `<class 'torch.device'>`",
        "torch.bfloat16"),
}

# Old torch shapes on this torch, set up before autosafe_torch patches torch:
# simulated on a newer torch, real on torch 2.0-2.2 (which has no
# torch.amp.GradScaler), where only the missing torch.amp.autocast is simulated.
OLD_TORCH = '''
import torch
if hasattr(torch.amp, "GradScaler"):
    # torch 2.0-2.2: no torch.amp.GradScaler nor torch.GradScaler (both from 2.3), no
    # torch.cpu.amp.GradScaler; torch.cuda.amp.GradScaler is the implementation itself,
    # takes no device and is not deprecated.
    _Impl = torch.amp.grad_scaler.GradScaler
    class GradScaler(_Impl):
        def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                     growth_interval=2000, enabled=True):
            _Impl.__init__(self, "cuda", init_scale, growth_factor, backoff_factor,
                           growth_interval, enabled)
    torch.cuda.amp.GradScaler = torch.cuda.amp.grad_scaler.GradScaler = GradScaler
    del torch.amp.GradScaler, torch.GradScaler, torch.cpu.amp.GradScaler
    # torch 2.0: autocast takes 'cuda' and 'cpu' only, and on the CPU bfloat16 only
    # (with a warning, and disabled, for float16; torch 2.0 warns even when the
    # region is disabled).
    _init = torch.amp.autocast_mode.autocast.__init__
    def _torch20_init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type not in ("cuda", "cpu"):
            raise RuntimeError("User specified autocast device_type must be 'cuda' or 'cpu'")
        if device_type == "cpu" and dtype not in (None, torch.bfloat16):
            warnings.warn("In CPU autocast, but the target dtype is not supported. Disabling "
                          "autocast.\\nCPU Autocast only supports dtype of "
                          "torch.bfloat16 currently.")
            enabled = False
        _init(self, device_type, dtype, enabled, cache_enabled)
    torch.amp.autocast_mode.autocast.__init__ = _torch20_init
# A torch without the name torch.amp.autocast (torch.autocast stays).
del torch.amp.autocast
if os.environ.get("WITH_AUTOSAFE_TORCH"):
    import autosafe_torch  # activated after the shapes are in place
'''

OLD_TORCH_CASES = {
    "AMP506 torch.amp.GradScaler": (
        "s = torch.amp.GradScaler('cuda', 256.0, enabled=False)\n"
        "result = (isinstance(s, torch.cuda.amp.GradScaler), s.get_scale(), "
        "torch.GradScaler is torch.amp.GradScaler)",
        "AttributeError: module 'torch.amp' has no attribute 'GradScaler'",
        "(True, 1.0, True)"),
    "AMP506 GradScaler('cpu') on old torch": (
        "result = torch.amp.GradScaler('cpu').is_enabled()",
        "AttributeError: module 'torch.amp' has no attribute 'GradScaler'", "False"),
    "AMP506 torch.amp.autocast": (
        "a = torch.amp.autocast('cpu', dtype=torch.bfloat16)\n"
        "with a:  # (torch 2.0's __enter__ returns None)\n"
        "    result = ((torch.ones(2, 2) @ torch.ones(2, 2)).dtype,\n"
        "              isinstance(a, torch.amp.autocast))",
        "AttributeError: module 'torch.amp' has no attribute 'autocast'",
        "(torch.bfloat16, True)"),
    "AMP504 old GradScaler(device='cuda')": (
        "result = torch.cuda.amp.GradScaler(device='cuda', enabled=False).is_enabled()",
        ("TypeError: GradScaler.__init__() got an unexpected keyword argument 'device'",
         "TypeError: __init__() got an unexpected keyword argument 'device'"),  # Python 3.9
        "False"),
    "AMP503 old GradScaler()": (
        "result = torch.cuda.amp.GradScaler().is_enabled()",
        "UserWarning: torch.cuda.amp.GradScaler is enabled, but CUDA is not available.",
        "False"),
    "AMP503 autocast('xpu') on torch 2.0": (
        "with torch.autocast('xpu'):\n    result = (torch.ones(2, 2) @ torch.ones(2, 2)).dtype",
        # real torch 2.0 reaches for torch.xpu before it checks the device type
        ("RuntimeError: User specified autocast device_type must be 'cuda' or 'cpu'",
         "AttributeError: module 'torch' has no attribute 'xpu'"),
        "torch.float32"),
    "AMP503 autocast('mps') on torch 2.0": (
        "with torch.autocast('mps'):\n    result = (torch.ones(2, 2) @ torch.ones(2, 2)).dtype",
        "RuntimeError: User specified autocast device_type must be 'cuda' or 'cpu'",
        "torch.float32"),
    "AMP505 fp16 on CPU on torch 2.0": (
        "with torch.autocast('cpu', dtype=torch.float16):\n"
        "    result = (torch.ones(2, 2) @ torch.ones(2, 2)).dtype",
        "UserWarning: In CPU autocast, but the target dtype is not supported.",
        "torch.float32"),
}


def _runner(cases, prelude):
    return RUNNER % {"prelude": prelude, "cases": {c: s for c, (s, _, _) in cases.items()}}


def _outcomes(result):
    found = {}
    for line in result.stdout.splitlines():
        status, _, rest = line.partition(" ")
        if status in ("OK", "FAILED"):
            for code in _CODES:
                if rest.startswith(code + " "):
                    found[code] = (status, rest[len(code) + 1:])
    return found


_CODES = list(MODERN_TORCH_CASES) + list(OLD_TORCH_CASES)


def _check_without(result, cases):
    outcomes = _outcomes(result)
    for code, (_, error, _) in cases.items():
        status, text = outcomes[code]
        assert status == "FAILED" and text.startswith(error), (code, text, result)


def _check_with(result, cases):
    outcomes = _outcomes(result)
    for code, (_, _, expected) in cases.items():
        assert outcomes[code] == ("OK", expected), (code, outcomes[code], result)
    assert "internal error" not in result.stderr, result


@needs_deprecated_names
def test_modern_torch_cases_fail_or_warn_without_autosafe_torch(tmp_path):
    result = run_script(tmp_path, _runner(MODERN_TORCH_CASES, "import torch"))
    assert result.rc == 0, result
    _check_without(result, MODERN_TORCH_CASES)


@needs_deprecated_names
def test_modern_torch_cases_run_clean_with_autosafe_torch(tmp_path):
    result = run_script(tmp_path, _runner(MODERN_TORCH_CASES, "import torch"),
                        activation="import")
    assert result.rc == 0, result
    _check_with(result, MODERN_TORCH_CASES)
    codes = [r.code for r in logged(result.stderr)]
    assert sorted(set(codes)) == ["AMP501", "AMP502", "AMP503", "AMP504", "AMP505"], codes


def test_old_torch_shapes_fail_without_autosafe_torch(tmp_path):
    result = run_script(tmp_path, _runner(OLD_TORCH_CASES, "import warnings" + OLD_TORCH))
    assert result.rc == 0, result
    _check_without(result, OLD_TORCH_CASES)


def test_old_torch_shapes_run_clean_with_autosafe_torch(tmp_path):
    result = run_script(tmp_path, _runner(OLD_TORCH_CASES, "import warnings" + OLD_TORCH),
                        env={"WITH_AUTOSAFE_TORCH": "1"})
    assert result.rc == 0, result
    _check_with(result, OLD_TORCH_CASES)
    assert "AMP506 provided-amp-api" in result.stderr
    # Nothing deprecated to route on this shape of torch.
    assert "AMP502" not in result.stderr


# A legacy training loop, written for a CUDA machine, run on this CPU one.
TRAINING = '''
import re, warnings
import torch
import torch.nn.functional as F

def train(legacy, steps=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    scaler = torch.cuda.amp.GradScaler() if legacy else None
    losses = []
    for step in range(steps):
        opt.zero_grad()
        if legacy:
            with torch.cuda.amp.autocast():
                loss = F.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:  # already modern, for the CPU: nothing to change
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        losses.append(loss.item())
    return losses

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print("LEGACY", train(legacy=True))
    print("MODERN", train(legacy=False))
print("WARNINGS", len(caught))
'''


def _line(result, label):
    return next(line for line in result.stdout.splitlines() if line.startswith(label + " "))


def test_training_loop_same_losses_no_warning_one_log_line_per_site(tmp_path):
    without = run_script(tmp_path, TRAINING)
    with_ = run_script(tmp_path, TRAINING, activation="import")
    assert without.rc == 0 and with_.rc == 0, (without, with_)
    assert _line(with_, "LEGACY") == _line(without, "LEGACY")
    assert _line(with_, "MODERN") == _line(without, "MODERN")
    # Without: a UserWarning on every step, and the scaler's; and where the old
    # names are deprecated (torch >= 2.4), a FutureWarning on every step too.
    assert int(_line(without, "WARNINGS").split()[1]) >= (10 if ROUTES_AUTOCAST else 6), without
    assert _line(with_, "WARNINGS") == "WARNINGS 0", with_
    sites = [(r.code, r.site) for r in logged(with_.stderr) if r.site.startswith("train.py:")]
    # autocast: AMP501 (where deprecated) and AMP503 once each for its line; the
    # scaler: AMP502 (where deprecated), AMP503.
    expected = {"AMP503"} | ({"AMP501"} if ROUTES_AUTOCAST else set()) \
        | ({"AMP502"} if ROUTES_SCALER else set())
    assert len(sites) == len(set(sites)) == len(expected) + 1, with_.stderr
    # Counted on every step all the same: 5 autocasts, and the scaler once.
    if ROUTES_AUTOCAST:
        assert "AMP501 x5," in with_.stderr
    assert "AMP503 x6 (2 call sites)" in with_.stderr
    # The modern CPU loop needed nothing: no AMP505, nothing else logged.
    assert {code for code, _ in sites} == expected


MODES = '''
import warnings
import torch
import autosafe_torch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        with torch.cuda.amp.autocast(enabled=False):
            pass
        print("RAN")
    except autosafe_torch.UnsafeCallError as exc:
        print("REFUSED", exc)
    print("CAUGHT", [w.category.__name__ for w in caught])
autosafe_torch.deactivate()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.amp.autocast(enabled=False)
    torch.autocast("cuda")
    print("AFTER DEACTIVATE", sorted(w.category.__name__ for w in caught))
'''


@needs_deprecated_names
def test_warn_mode_changes_nothing_strict_refuses_deactivate_restores(tmp_path):
    log = tmp_path / "warn.jsonl"
    warn = run_script(tmp_path, MODES, env={"AUTOSAFE_TORCH_MODE": "warn",
                                            "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert "RAN" in warn.stdout and "CAUGHT ['FutureWarning']" in warn.stdout, warn
    (record,) = json_log(log)
    assert (record["code"], record["action"]) == ("AMP501", "would-fix"), record
    assert (record["before"], record["after"]) == ({"api": "torch.cuda.amp.autocast"},
                                                   {"api": "torch.amp.autocast('cuda')"}), record
    assert record["call_site"] == "train.py:%d" % line_of(
        tmp_path, "with torch.cuda.amp.autocast(enabled=False)"), record
    (rec,) = logged(warn.stderr, "AMP501")  # said on stderr too
    assert rec.site == record["call_site"], rec
    assert "AFTER DEACTIVATE ['FutureWarning', 'UserWarning']" in warn.stdout, warn
    strict = run_script(tmp_path, MODES, env={"AUTOSAFE_TORCH_MODE": "strict"})
    assert "REFUSED train.py:%d: AMP501 deprecated-autocast-api: refused" % line_of(
        tmp_path, "with torch.cuda.amp.autocast(enabled=False)") in strict.stdout, strict
    assert "CAUGHT []" in strict.stdout


def test_the_common_path_decides_once_per_argument_tuple(monkeypatch):
    """autocast is built every step: the arguments are bound and checked once."""
    import torch

    from autosafe_torch import callsite
    from autosafe_torch.patches.amp import autocast as amp_autocast
    from autosafe_torch.patches.amp.common import state

    if not state:
        pytest.skip("autosafe_torch is not active in this process")
    calls = []
    decide = amp_autocast._autocast_plan
    monkeypatch.setattr(amp_autocast, "_autocast_plan", lambda *a: calls.append(1) or decide(*a))
    monkeypatch.setattr(callsite, "user_call_site",
                        lambda *a: pytest.fail("no call site on the clean path"))
    for _ in range(50):
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            pass
    assert len(calls) <= 1


COMPILED = '''
import warnings
import torch
warnings.simplefilter("ignore")  # this test is about tracing, not the warnings

@torch.compile(backend="eager", fullgraph=True)
def step(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
    with torch.cuda.amp.autocast():
        z = x + 1
    return y.dtype, z.dtype

print("DTYPES", step(torch.randn(4, 4)))
'''


def _dynamo_supported():
    """torch.compile works on this torch and Python (torch 2.0: not on Python 3.11)."""
    try:
        from torch._dynamo import eval_frame

        eval_frame.check_if_dynamo_supported()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _dynamo_supported(), reason="needs torch >= 2.1 on Python 3.11: "
                    "torch.compile is not supported on this torch %s" % torch.__version__)
def test_torch_compile_still_traces_autocast(tmp_path):
    """Dynamo binds autocast arguments with inspect.signature of the class."""
    result = run_script(tmp_path, COMPILED, activation="import")
    assert result.rc == 0, result
    assert "DTYPES (torch.bfloat16, torch.float32)" in result.stdout


# --- real CUDA ------------------------------------------------------------------

GPU = '''
import torch
torch.manual_seed(0)
model = torch.nn.Linear(64, 64).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = %(scaler)s
x = torch.randn(32, 64, device="cuda")
losses = []
for step in range(4):
    opt.zero_grad()
    with %(autocast)s:
        out = model(x)
        loss = out.float().pow(2).mean()
    dtype = out.dtype
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    losses.append(loss.item())
print("DTYPE", dtype)
print("LOSSES", losses)
print("SCALER", scaler.state_dict())
'''

MODERN_GPU = GPU % {"scaler": "torch.amp.GradScaler('cuda', init_scale=1024.0)",
                    "autocast": "torch.autocast('cuda', dtype=torch.float16)"}
LEGACY_GPU = GPU % {"scaler": "torch.cuda.amp.GradScaler(1024.0)",
                    "autocast": "torch.cuda.amp.autocast(True, torch.float16)"}


def _cuda_available():
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs CUDA")
def test_gpu_modern_calls_are_untouched(tmp_path):
    without = run_script(tmp_path, MODERN_GPU)
    with_ = run_script(tmp_path, MODERN_GPU, activation="import")
    assert without.rc == 0 and with_.rc == 0, (without, with_)
    assert "DTYPE torch.float16" in with_.stdout
    assert with_.stdout == without.stdout
    assert "AMP5" not in with_.stderr, with_


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs CUDA")
def test_gpu_legacy_calls_are_routed_with_the_same_results(tmp_path):
    modern = run_script(tmp_path, MODERN_GPU)
    without = run_script(tmp_path, LEGACY_GPU)
    with_ = run_script(tmp_path, LEGACY_GPU, activation="import")
    assert modern.rc == without.rc == with_.rc == 0, (without, with_)
    assert "FutureWarning" in without.stderr
    assert "FutureWarning" not in with_.stderr and "UserWarning" not in with_.stderr
    assert with_.stdout == without.stdout == modern.stdout
    assert {r.code for r in logged(with_.stderr)} == {"AMP501", "AMP502"}, with_.stderr


@pytest.mark.internal_error_expected
@needs_deprecated_names
def test_a_fault_in_the_legacy_route_runs_the_original_call(tmp_path):
    """Fail open on the every-step path: the deprecated class is built by
    torch's own code (its FutureWarning included), and the fault is logged once."""
    body = """
import warnings
import autosafe_torch.patches.amp.autocast as m
def boom(*a, **k):
    raise RuntimeError('injected')
m.cached_call_site = boom
import torch
warnings.simplefilter("always")
for _ in range(3):
    with warnings.catch_warnings(record=True) as seen:
        with torch.cuda.amp.autocast(enabled=False):
            print("INSIDE", torch.is_autocast_enabled("cuda"))
    print("FUTUREWARNING", any(issubclass(w.category, FutureWarning) for w in seen))
"""
    result = run_script(tmp_path, body, activation="import")
    assert result.rc == 0, result
    assert result.stdout.count("INSIDE False") == 3, result
    assert result.stdout.count("FUTUREWARNING True") == 3, result
    # __new__ where torch deprecates the class, __init__ where it deprecates that (2.8)
    assert len(re.findall(r"internal error in torch\.cuda\.amp\.autocast\.__(new|init)__ "
                          r"\(RuntimeError: injected\)", result.stderr)) == 1, result
