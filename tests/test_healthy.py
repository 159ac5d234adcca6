"""Healthy loaders: a script that works keeps working, bit for bit.

Each scenario is a correct script under tests/scenarios/healthy/. It runs in
a real subprocess, with real workers, under fork, spawn and forkserver
(forced from outside by tests/platform_sim), once without autosafe_torch
and once with it (``AUTOSAFE_TORCH=1`` through the .pth hook, or
``autosafe-torch run``: the two alternate over the start methods, so every
scenario meets both). The two runs must print the same lines:

- ``BATCHES``: a sha256 over every batch, in order;
- ``STATE``: what the dataset and the parent can observe (fetch counts,
  RNG states, queue contents, the worker count, torch's own warnings and
  error messages);

and with the shim no intervention may be recorded: the JSON-lines log
(``AUTOSAFE_TORCH_LOG_FILE``) stays absent or empty and the shim writes no
line on stderr (no record, no ``autosafe_torch:`` line). The scenarios use
data that shows a change: random augmentation (torch, random, numpy), the
worker id in samples, fetch counters, barriers across all workers (which
give up after a timeout, so a broken run fails instead of hanging). The
scenarios whose point is a torch behaviour are checked to show it, on their
run without the shim.

The two runs of a pair run side by side, to halve the wall time.
"""

import inspect
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import support
from autosafe_torch import torch_private
from support import PLATFORM_SIM, START_METHODS, clean_env, shim_lines

WATCH_MISSING = bool(torch_private.watched_missing())

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios" / "healthy"
RUN_TIMEOUT = 120  # seconds for one run; a barrier gives up after 15 s

# name -> (script, arguments, environment). The first argument is the worker count.
SCENARIOS = {
    "iterable_sharded": ("iterable_sharded.py", [], {}),
    "numpy_seeding": ("numpy_seeding.py", [], {}),
    "worker_id_samples": ("worker_id_samples.py", [], {}),
    "barrier": ("barrier.py", ["2"], {}),
    "persistent_epochs": ("persistent_epochs.py", [], {}),
    "out_of_order": ("out_of_order.py", [], {}),
    "batch_sampler": ("batch_sampler.py", [], {}),
    "dict_namedtuple": ("dict_namedtuple.py", [], {}),
    "numpy_generator": ("numpy_generator.py", [], {}),
    "fetch_counter": ("fetch_counter.py", [], {}),
    "mp_queue": ("mp_queue.py", [], {}),
    "getstate_reopen": ("getstate_reopen.py", [], {}),
    "lazy_open_pid": ("lazy_open_pid.py", [], {}),
    "generator_shuffle": ("generator_shuffle.py", [], {}),
    "amp_cpu": ("amp_cpu.py", [], {}),
    # More workers than CPUs usable: torch warns, and the batches depend on the 3 workers.
    "workers_over_cpus": ("worker_id_samples.py", ["3"], {"AUTOSAFE_TEST_CPUS": "1"}),
    # PyTorch's test_worker_seed: all 3 workers must fetch before any returns.
    "barrier_over_cpus": ("barrier.py", ["3"], {"AUTOSAFE_TEST_CPUS": "1"}),
    "arg_boundaries": ("arg_boundaries.py", [], {}),
}

SHIM_ACTIVATIONS = ("env", "cli")


def _cases():
    """(scenario, start method, activation): the activation alternates. ``make
    test`` runs each scenario under one start method, turning with the
    scenario; the others are marked heavy (``make heavy``, run by CI)."""
    cases = []
    for i, name in enumerate(SCENARIOS):
        for j, method in enumerate(START_METHODS):
            activation = SHIM_ACTIVATIONS[(i + j) % 2]
            marks = () if j == i % len(START_METHODS) else (pytest.mark.heavy,)
            cases.append(pytest.param(name, method, activation, marks=marks,
                                      id="%s-%s-%s" % (name, method, activation)))
    return cases


class Run:
    """One finished subprocess: its exit status (or "timeout") and its output."""

    def __init__(self, rc, stdout, stderr, log_file=None):
        self.rc, self.stdout, self.stderr, self.log_file = rc, stdout, stderr, log_file

    @property
    def batches(self):
        return [line for line in self.stdout.splitlines() if line.startswith("BATCHES ")]

    @property
    def states(self):
        # Sorted: a line printed while workers run may come in another order.
        return sorted(line for line in self.stdout.splitlines() if line.startswith("STATE "))

    def interventions(self):
        if self.log_file is None or not self.log_file.exists():
            return []
        records = []
        for line in self.log_file.read_text().splitlines():
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError:
                    records.append({"code": "?", "raw": line})
        return records

    def shim_lines(self):
        """What the shim wrote, less the one line a torch without the watch's
        names gets by design (torch_private.watched_missing: a torch whose
        private names moved; tests/watch_gap.py)."""
        return [line for line in shim_lines(self.stderr)
                if not (WATCH_MISSING and "workers not watched" in line)]

    def tail(self):
        return "rc=%s\n--- stdout\n%s\n--- stderr\n%s" % (
            self.rc, self.stdout[-2000:], self.stderr[-4000:])


def _start(script, args, workdir, start_method, activation, extra_env):
    """Start ``script`` (None activation: without autosafe_torch) in ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = clean_env(dict(extra_env))
    env["PYTHONPATH"] = str(PLATFORM_SIM)
    env["AUTOSAFE_TEST_START_METHOD"] = start_method
    log_file = None
    if activation is not None:
        log_file = workdir / "interventions.jsonl"
        env["AUTOSAFE_TORCH_LOG_FILE"] = str(log_file)
    if activation == "env":
        env["AUTOSAFE_TORCH"] = "1"
    path = str(SCENARIO_DIR / script)
    if activation == "cli":
        cmd = [sys.executable, "-m", "autosafe_torch", "run", path, *args]
    else:
        cmd = [sys.executable, path, *args]
    proc = support.popen(cmd, workdir, env, start_new_session=True)
    return proc, log_file


def _wait(started, timeout=RUN_TIMEOUT):
    proc, log_file = started
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and its workers: our own session
        out, err = proc.communicate()
        rc = "timeout after %d s (hang)" % timeout
    return Run(rc, out, err, log_file)


def run_pair(tmp_path, name, start_method, activation):
    """The scenario without and with autosafe_torch, side by side."""
    script, args, extra_env = SCENARIOS[name]
    plain = _start(script, args, tmp_path / "without", start_method, None, extra_env)
    shim = _start(script, args, tmp_path / "with", start_method, activation, extra_env)
    return _wait(plain), _wait(shim)


def _describe(records):
    return "; ".join("%s %s: %s -> %s (%s)" % (
        r.get("code"), r.get("slug"), r.get("before"), r.get("after"), r.get("strategy"))
        for r in records)


@pytest.mark.parametrize("name,start_method,activation", _cases())
def test_healthy_loader_untouched(tmp_path, name, start_method, activation):
    plain, shim = run_pair(tmp_path, name, start_method, activation)
    assert plain.rc == 0, "the scenario itself fails without autosafe_torch:\n" + plain.tail()
    assert plain.batches or plain.states, "the scenario printed nothing:\n" + plain.tail()
    shows_what_it_is_for(name, plain)

    problems = []
    records = shim.interventions()
    if records:
        problems.append("interventions recorded: " + _describe(records))
    if shim.rc != 0:
        problems.append("the run with autosafe_torch failed (rc %s)" % shim.rc)
    if shim.batches != plain.batches:
        problems.append("batches differ: %s != %s" % (shim.batches, plain.batches))
    if shim.states != plain.states:
        only_plain = [s for s in plain.states if s not in shim.states]
        only_shim = [s for s in shim.states if s not in plain.states]
        problems.append("observable state differs: without only %s; with only %s"
                        % (only_plain, only_shim))
    if shim.shim_lines():
        problems.append("autosafe_torch wrote on stderr: %s" % shim.shim_lines()[:5])
    assert not problems, "%s under %s (%s):\n- %s\n\nwith autosafe_torch: %s" % (
        name, start_method, activation, "\n- ".join(problems), shim.tail())


# Facts the scenarios rely on, checked on the run without the shim (under whichever
# start method the pair runs), so that a scenario that stops showing what it is
# there to show is noticed.

def shows_what_it_is_for(name, plain):
    """The torch behaviour that scenario ``name`` is there to show, on ``plain``."""
    states, text = plain.states, "\n".join(plain.states)
    if name == "arg_boundaries":
        for expected in (
            "case timeout=-1 -> ValueError: timeout option should be non-negative",
            "case prefetch_factor=-1 -> ValueError: prefetch_factor option could only be "
            "specified",
            "case prefetch_factor=0 -> ValueError: prefetch_factor option could only be "
            "specified",
            "case multiprocessing_context='bogus' -> ValueError: multiprocessing_context can "
            "only be used with multi-process loading",
            "case timeout='5' -> TypeError",
        ):
            assert expected in text, (expected, text)
    elif name == "workers_over_cpus":
        assert "STATE num_workers 3" in text
        assert "This DataLoader will create 3 worker processes in total" in text, text
    elif name == "barrier_over_cpus":
        assert "STATE distinct_worker_seeds 3" in states, states
    elif name in ("getstate_reopen", "lazy_open_pid"):
        assert "STATE matches_num_workers_0 True" in states, (name, states)
        assert "STATE values_correct True" in states, (name, states)
        if name == "lazy_open_pid":
            assert "STATE parent_opened True" in states, states
    elif name == "fetch_counter":
        assert "STATE parent_fetches 0" in states and "STATE logged_fetches 12" in states, \
            states
    elif name == "out_of_order" and "in_order" in inspect.signature(
            DataLoader.__init__).parameters:
        assert "STATE samples 16" in states, states
