"""DL101-DL107: arguments PyTorch rejects (or warns about) without workers.

Each case fails in a real subprocess without autosafe_torch, and runs clean
through each of the four activations, with the same batches as the
known-safe loader (the same call without the offending argument).
"""

import inspect

import pytest
from torch.utils.data import dataloader as torch_dataloader

from support import ACTIVATIONS, logged, once_per_run, run_script

# rule -> (DataLoader keyword arguments that break, the error PyTorch gives)
CASES = {
    "DL101": ("num_workers=0, prefetch_factor=2",
              "ValueError: prefetch_factor option could only be specified in multiprocessing"),
    "DL102": ("num_workers=0, persistent_workers=True",
              "ValueError: persistent_workers option needs num_workers > 0"),
    "DL103": ("num_workers=0, multiprocessing_context='spawn'",
              "ValueError: multiprocessing_context can only be used with multi-process loading"),
    "DL107": ("num_workers=0, timeout=5",
              "AssertionError: _SingleProcessDataLoaderIter requires timeout == 0"),
    "DL105": ("num_workers=0, pin_memory=True",
              "UserWarning: 'pin_memory' argument is set as true but no accelerator is found"),
    "DL106": ("num_workers=2, prefetch_factor=0",
              "AssertionError: prefetch_factor must be greater than 0"),
}

# How torch 2.0 words it where its dataloader.py lacks the message above: bare
# assertions (DL106, DL107), and pin_memory without CUDA dropped silently (DL105:
# nothing fails, and the rule, which asks torch whether it warns, leaves it).
OLD_TORCH_WORDING = {"DL106": "AssertionError: ", "DL107": "AssertionError: ", "DL105": None}
_TORCH_SOURCE = inspect.getsource(torch_dataloader)


def expected_error(code):
    """The failure this torch shows for ``code`` (None: it runs without one)."""
    error = CASES[code][1]
    if code in OLD_TORCH_WORDING and error.split(": ", 1)[1] not in _TORCH_SOURCE:
        return OLD_TORCH_WORDING[code]
    return error


# Every case in one script: each loader is built and read in turn, and the
# outcome printed, so one subprocess shows all failures or all successes.
SCRIPT = '''
import sys, warnings
import torch
from torch.utils.data import DataLoader, TensorDataset

warnings.simplefilter("error", UserWarning)  # a per-epoch warning counts as a failure
CASES = %r

def main():
    ds = TensorDataset(torch.arange(20.).reshape(10, 2), torch.arange(10))
    for code, kwargs in CASES.items():
        try:
            loader = DataLoader(ds, batch_size=3, **eval("dict(" + kwargs + ")"))
            for epoch in range(2):
                digest(loader)
        except Exception as exc:
            print("FAILED", code, "%%s: %%s" %% (type(exc).__name__, exc), flush=True)
        else:
            print("OK", code, flush=True)

if __name__ == "__main__":
    main()
'''

REFERENCE = '''
import torch
from torch.utils.data import DataLoader, TensorDataset
if __name__ == "__main__":
    ds = TensorDataset(torch.arange(20.).reshape(10, 2), torch.arange(10))
    for code in %r:
        for epoch in range(2):
            digest(DataLoader(ds, batch_size=3))
'''


def _script():
    return SCRIPT % ({code: kwargs for code, (kwargs, _) in CASES.items()},)


def _batches(result):
    return [line.split()[1] for line in result.stdout.splitlines() if line.startswith("BATCHES")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Each case's batches from a loader without the hazard (once in the whole test run)."""

    def batches():
        result = run_script(tmp_path_factory.mktemp("ref"), REFERENCE % (list(CASES),))
        assert result.rc == 0, result
        return _batches(result)

    return once_per_run(tmp_path_factory, "loader-args-reference", batches)


def test_each_case_fails_without_autosafe_torch(tmp_path):
    result = run_script(tmp_path, _script())
    for code in CASES:
        error = expected_error(code)
        if error is None:
            assert "OK %s" % code in result.stdout, (code, result)
            continue
        failed = [line for line in result.stdout.splitlines()
                  if line.startswith("FAILED %s " % code)]
        assert failed and error in failed[0], (code, result)


@pytest.mark.rule("DL101", "DL102", "DL103", "DL105", "DL106", "DL107")
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_each_case_runs_clean_with_autosafe_torch(tmp_path, activation, reference):
    result = run_script(tmp_path, _script(), activation=activation)
    assert result.rc == 0, result
    for code in CASES:
        assert "OK %s" % code in result.stdout, (code, result)
        # logged once per call site, with the user's file:line and the fix;
        # nothing where this torch does not fail (a working call is left alone)
        records = logged(result.stderr, code)
        assert len(records) == (0 if expected_error(code) is None else 1), (code, result)
        assert all(r.site.startswith("train.py:") and r.fix for r in records), records
    assert _batches(result) == reference


def test_dl105_only_where_torch_warns():
    from autosafe_torch.facts import Facts
    from autosafe_torch.rules import Context
    from autosafe_torch.rules.loader_args import pin_memory_without_accelerator as dl105

    args = {"pin_memory": True}
    assert dl105(args, Context(Facts(accelerator=None, pin_memory_warns=True))).after == \
        {"pin_memory": False}
    assert dl105(args, Context(Facts(accelerator=None, pin_memory_warns=False))) is None
    assert dl105(args, Context(Facts(accelerator="mps", pin_memory_warns=False))) is not None
    assert dl105(args, Context(Facts(accelerator="cuda"))) is None


# Values torch rejects for their own sake, not for the missing workers: each
# reaches torch's own error untouched (DL101, DL102, DL103, DL106, DL107).
INVALID = [
    "num_workers=0, timeout=-1",                     # DL107: negative
    "num_workers=0, timeout='5'",                    # DL107: wrong type
    "num_workers=0, prefetch_factor=-1",             # DL101: negative
    "num_workers=0, prefetch_factor=2.5",            # DL101: not a count
    "num_workers=0, persistent_workers='yes'",       # DL102: not a flag
    "num_workers=0, multiprocessing_context='bogus'",  # DL103: no such start method
    "num_workers=2, prefetch_factor=-1",             # DL106: negative
    "num_workers=-1",                                # not a count of workers at all
    "num_workers=0, timeout=0, prefetch_factor=None",  # valid: nothing to do
]

BOUNDARY_SCRIPT = '''
import torch
from torch.utils.data import DataLoader, TensorDataset
CASES = %r
if __name__ == "__main__":
    ds = TensorDataset(torch.arange(8.))
    for kwargs in CASES:
        try:
            print(kwargs, "->", len(list(DataLoader(ds, batch_size=4,
                                                    **eval("dict(" + kwargs + ")")))))
        except Exception as exc:
            print(kwargs, "->", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
''' % (INVALID,)


def test_invalid_values_reach_torch_s_own_error(tmp_path):
    plain = run_script(tmp_path, BOUNDARY_SCRIPT)
    log = tmp_path / "log.jsonl"
    shimmed = run_script(tmp_path, BOUNDARY_SCRIPT, activation="env",
                         env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert plain.rc == 0 and shimmed.rc == 0, shimmed
    assert "timeout option should be non-negative" in plain.stdout
    assert shimmed.stdout == plain.stdout
    assert not log.exists(), log.read_text()
