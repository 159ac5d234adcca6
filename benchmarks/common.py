"""Shared pieces of the benchmarks: paired statistics, child processes, rows.

Every figure is a ratio or a difference of two (or three) variants measured
side by side in one run: the variants alternate (A B A B ...), each pair (or
block of pairs) gives one value of the figure, and a figure is reported as
the median of those values with their min-max. Nothing is compared with a
number measured at another time.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS_DIR = HERE / "results"          # scratch (git-ignored): data, venvs
QUICK = os.environ.get("BENCH_QUICK", "").strip() not in ("", "0")


def median(values):
    return statistics.median(values)


def summary(values):
    """(median, min, max) of a list of numbers."""
    values = list(values)
    return median(values), min(values), max(values)


def child_env(extra=None, drop=()):
    """The environment of a benchmark child: ours without AUTOSAFE_* and
    PYTHONPATH, with bytecode caching allowed (as on a user's machine: the
    sandbox this was written in sets PYTHONDONTWRITEBYTECODE, which would
    charge a compile of every imported module to every start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSAFE_TORCH")}
    for name in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE") + tuple(drop):
        env.pop(name, None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def timed_run(cmd, env, cwd=None, timeout=300):
    """Wall time of one child process (s), and the completed process."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)
    return time.perf_counter() - t0, proc


def json_child(args, env, timeout=600, cwd=None):
    """Run ``python args...`` whose last stdout line is JSON; return it.

    Raises ``ChildFailed`` with the tail of its output when it fails.
    """
    proc = subprocess.run([sys.executable] + list(args), env=env, cwd=cwd,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise ChildFailed(args, proc)
    return json.loads(lines[-1])


class ChildFailed(RuntimeError):
    def __init__(self, args, proc):
        self.proc = proc
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        super().__init__("%s exited %s: %s" % (" ".join(map(str, args)),
                                               proc.returncode, " | ".join(tail)))


class Row:
    """One line of the results table.

    ``kind``: "le" (measured <= budget is ok), "ge" (measured >= budget is
    ok) or None (reported, no budget). ``unit`` formats the numbers.
    """

    def __init__(self, fig, name, budget=None, kind=None, unit="", values=None,
                 note="", na=None, budget_text=None):
        self.fig = fig
        self.name = name
        self.budget = budget
        self.kind = kind
        self.unit = unit
        self.values = list(values or [])
        self.note = note
        self.na = na
        self.budget_text = budget_text

    @classmethod
    def not_available(cls, fig, name, why, budget=None, kind=None, unit="",
                      budget_text=None):
        return cls(fig, name, budget, kind, unit, na=why, budget_text=budget_text)

    def stats(self):
        return summary(self.values) if self.values else None

    def verdict(self):
        if self.na or not self.values:
            return "n/a"
        med = self.stats()[0]
        if self.kind == "le":
            return "ok" if med <= self.budget else "over budget"
        if self.kind == "ge":
            return "ok" if med >= self.budget else "below goal"
        return "info"

    def fmt(self, x):
        return fmt_value(x, self.unit)

    def budget_str(self):
        if self.budget_text:
            return self.budget_text
        if self.kind is None or self.budget is None:
            return "-"
        return "%s %s" % ("≤" if self.kind == "le" else "≥", self.fmt(self.budget))

    def measured_str(self):
        if self.na or not self.values:
            return "n/a (not available: %s)" % (self.na or "no values")
        med, lo, hi = self.stats()
        return "%s (%s – %s, n=%d)" % (self.fmt(med), self.fmt(lo), self.fmt(hi),
                                       len(self.values))

    def as_dict(self):
        st = self.stats()
        return {"fig": self.fig, "name": self.name, "budget": self.budget_str(),
                "median": st[0] if st else None, "min": st[1] if st else None,
                "max": st[2] if st else None, "n": len(self.values),
                "verdict": self.verdict(), "note": self.note, "na": self.na}


def fmt_value(x, unit):
    if unit == "x":
        return "%.3f×" % x
    if unit == "ms":
        return "%+.2f ms" % x if x < 0 else "%.2f ms" % x
    if unit == "us":
        return "%+.1f µs" % x if x < 0 else "%.1f µs" % x
    if unit == "%":
        return "%+.2f %%" % x
    if unit == "MB":
        return "%.3f MB" % x
    if unit == "s":
        return "%.2f s" % x
    return "%.4g%s" % (x, unit)


# The loop both training-script children run (size.py, figure 19;
# process_state.py, figure 20): a loader of 2 workers over ``data`` (batch 256,
# every 97th sample, shuffled), the model and optimizer built after the loader,
# the first batch timed from ``iter()``, then a real step per batch. It leaves
# ``first`` (the first batch), ``first_batch`` and ``epoch`` (s). Indented for
# the script's ``if __name__ == "__main__":`` block, where the script's line
# ``FIRST_EPOCH_AT`` stands (``with_first_epoch``).
FIRST_EPOCH = """\
    loader = DataLoader(data, batch_size=256, num_workers=2,
                        sampler=torch.utils.data.SubsetRandomSampler(range(0, len(data), 97)))
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    first_batch = time.perf_counter() - t0
    for x in [first] + list(it):
        optimizer.zero_grad(); model(x).square().mean().backward(); optimizer.step()
    epoch = time.perf_counter() - t0
"""
FIRST_EPOCH_AT = "    # common.FIRST_EPOCH\n"


def with_first_epoch(script):
    """``script`` with its line ``FIRST_EPOCH_AT`` replaced by ``FIRST_EPOCH``."""
    if script.count(FIRST_EPOCH_AT) != 1:
        raise ValueError("the script has no single line %r" % FIRST_EPOCH_AT.strip())
    return script.replace(FIRST_EPOCH_AT, FIRST_EPOCH)


def log(message):
    sys.stderr.write("[bench] %s\n" % message)
    sys.stderr.flush()
