"""Conformance: PyTorch's own ``test/test_dataloader.py``, without and with the shim.

``make conformance TEST_DATALOADER=path/to/test_dataloader.py`` (not part of
``make test`` or CI). The file is not in this repository: take it from the
PyTorch repository at the installed torch's tag, or the nearest copy whose
tests all pass on that torch (for torch 2.13: ``cyyever/pytorch`` at
1e91f44f2d12ab5a9004ea487c92938d3223b731, sha256 a678b813...). Its
``hw_classification`` metadata lines (newer than torch 2.13's test helpers)
are dropped on a copy; the file given is never changed.

The suite runs twice under pytest, in a fresh interpreter each time: once
without autosafe_torch, once with ``AUTOSAFE_TORCH=1`` (the ``.pth`` hook of
the installed autosafe_torch, so worker processes and the suite's own spawn
children are covered too) or with ``sitecustomize_template/`` on PYTHONPATH
(``--activation sitecustomize``). Outcomes come from pytest's junit xml.
Every test whose outcome differs is printed.

A test may differ by design where it asserts that torch rejects a call the
shim exists to fix (``prefetch_factor``, ``persistent_workers`` or
``multiprocessing_context`` with ``num_workers=0``; a local ``worker_init_fn``
under forkserver). Such a test must pass when its rule is disabled. So each
differing test is then re-run alone with the shim, recording which rules fired
(``AUTOSAFE_TORCH_LOG_FILE``), and once more with exactly those rules disabled
(``AUTOSAFE_TORCH_DISABLE``); ``--disable CODES`` re-runs them with given
rules disabled instead. The command of each re-run is printed.

Exit status: 0 when every differing test passes with its rules disabled,
1 otherwise, 2 when the suite could not run.
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_DIR = ROOT / "sitecustomize_template"

# Rules whose fix is the point of the shim: a test asserting that torch rejects
# the call they repair may differ (prefetch_factor, persistent_workers,
# multiprocessing_context without workers; a local worker_init_fn that spawn
# or forkserver cannot pickle, sent by value).
BY_DESIGN = {"DL101", "DL102", "DL103", "DL202"}

# Lines of the newer test file that torch 2.13's test helpers do not know.
_DROP = re.compile(r"^\s*(hw_classification\s*=.*|HardwareClassification,)\s*$")


def prepare(source, workdir):
    """A copy of ``source`` without its hw_classification lines; its path.

    The copy keeps the name test_dataloader.py: the file imports itself by
    its own basename (``self_module``), for the classes spawn workers need.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    lines = Path(source).read_text().splitlines(keepends=True)
    kept = [line for line in lines if not _DROP.match(line)]
    copy = workdir / "test_dataloader.py"
    copy.write_text("".join(kept))
    return copy, len(lines) - len(kept)


def environment(shim, activation="pth", log_file=None, disable=None):
    """The environment of one run: no AUTOSAFE_* from outside, then the shim's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AUTOSAFE_") and k != "PYTHONPATH"}
    env["PYTHONUNBUFFERED"] = "1"
    if shim:
        if activation == "sitecustomize":
            env["PYTHONPATH"] = str(TEMPLATE_DIR)
        else:
            env["AUTOSAFE_TORCH"] = "1"
        env["AUTOSAFE_TORCH_QUIET"] = "1"  # the suite asserts on warnings, not on our lines
        if log_file:
            env["AUTOSAFE_TORCH_LOG_FILE"] = str(log_file)
        if disable:
            env["AUTOSAFE_TORCH_DISABLE"] = disable
    return env


def pytest_command(python, copy, junit, selection=(), timeout=300, extra=()):
    cmd = [python, "-m", "pytest", *(selection or [str(copy)]), "-p", "no:cacheprovider", "-q",
           "-rfE",
           "--junitxml", str(junit), "-o", "junit_family=xunit1",
           "--timeout", str(timeout), "--timeout-method", "signal"]
    cmd += list(extra)
    return cmd


def run_pytest(cmd, env, cwd, log_path, wall_limit):
    """Run one pytest; its output goes to ``log_path``. Returns (rc, seconds)."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, env=env, cwd=str(cwd), stdout=log,
                                  stderr=subprocess.STDOUT, timeout=wall_limit)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, time.monotonic() - start


def outcomes(junit):
    """{test id: (outcome, message)} from a junit xml file (missing -> {})."""
    if not Path(junit).exists():
        return {}
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = "%s::%s" % (case.get("classname", "").rsplit(".", 1)[-1], case.get("name"))
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or node.text or "").strip()
                break
        result[name] = (outcome, message)
    return result


def node_id(copy, test):
    """pytest node id for ``Class::test``."""
    return "%s::%s" % (copy, test)


def rules_fired(log_file):
    """Rule codes (and the call sites) recorded in a JSON-lines log."""
    codes = {}
    if not Path(log_file).exists():
        return codes
    for line in Path(log_file).read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        codes.setdefault(record.get("code"), set()).add(record.get("call_site"))
    return codes


def short(message, width=160):
    message = " ".join(message.split())
    return message if len(message) <= width else message[: width - 3] + "..."


def _fired_text(fired):
    return "; ".join("%s at %s" % (code, ", ".join(sorted(s for s in sites if s)))
                     for code, sites in sorted(fired.items(), key=str)) or "none"


def rule_codes(python):
    """Every rule code of the installed autosafe_torch."""
    out = subprocess.run([python, "-m", "autosafe_torch", "rules", "--format", "json"],
                         capture_output=True, text=True)
    try:
        return sorted(r["code"] for r in json.loads(out.stdout))
    except (ValueError, KeyError, TypeError):
        return []


class Rerun:
    """Runs one test alone, with the shim and a set of rules disabled."""

    def __init__(self, args, workdir, copy, name):
        self.args, self.workdir, self.copy, self.name = args, workdir, copy, name
        self.slug = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        self.count = 0
        self.last_command = ""

    def __call__(self, disabled, quiet=False):
        """(outcome, message, {rule: call sites} fired) with ``disabled`` rules off."""
        tag = "%s-%d" % (self.slug, self.count)
        self.count += 1
        log_file = self.workdir / ("rerun-%s.jsonl" % tag)
        junit = self.workdir / ("rerun-%s.xml" % tag)
        for stale in (log_file, junit):
            if stale.exists():
                stale.unlink()
        env = environment(True, self.args.activation, log_file, ",".join(sorted(disabled)))
        cmd = pytest_command(self.args.python, self.copy, junit, [node_id(self.copy, self.name)],
                             self.args.rerun_timeout)
        run_pytest(cmd, env, self.workdir, self.workdir / ("rerun-%s.log" % tag),
                   wall_limit=1800)
        result, message = outcomes(junit).get(self.name, ("absent", ""))
        fired = rules_fired(log_file)
        self.last_command = "cd %s && %s %s" % (
            shlex.quote(str(self.workdir)),
            " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(env.items())
                     if k.startswith("AUTOSAFE_") or k == "PYTHONPATH"),
            " ".join(shlex.quote(c) for c in cmd))
        label = ("AUTOSAFE_TORCH_DISABLE=%s" % ",".join(sorted(disabled))) if disabled \
            else "every rule on"
        if not quiet:
            print("  %s [%s]: %s; rules fired: %s" % (self.name, label, result,
                                                      _fired_text(fired)), flush=True)
            if result != "passed" and message:
                print("      %s" % short(message))
        return result, message, fired


def _ok(result):
    return result in ("passed", "skipped")


def bisect_rules(run, disabled, candidates):
    """A small set of ``candidates`` whose disabling (with ``disabled``) makes the test
    pass, for a change no rule recorded (a hang before the log is written, user code
    run while planning). Assumes that disabling all of ``candidates`` passes."""
    if len(candidates) <= 1:
        return set(candidates)
    half = len(candidates) // 2
    first, second = candidates[:half], candidates[half:]
    print("      bisecting: %s" % ",".join(first), flush=True)
    if _ok(run(disabled | set(first), quiet=True)[0]):
        return bisect_rules(run, disabled, first)
    print("      bisecting: %s" % ",".join(second), flush=True)
    if _ok(run(disabled | set(second), quiet=True)[0]):
        return bisect_rules(run, disabled, second)
    # Rules from both halves are needed.
    need_second = bisect_rules(run, disabled | set(first), second)
    return bisect_rules(run, disabled | need_second, first) | need_second


def rerun(args, workdir, copy, name, rounds=6):
    """Re-run one differing test alone: without the shim, with it, with rules disabled.

    With ``--disable`` the given rules are disabled. Otherwise the rules that
    fired are disabled, and the test is run again; a test stops at its first
    failing assertion, so a later call may need another rule: the rules that
    fire in each round are added, until it passes or no new rule fires. Still
    failing then, it is run with every rule disabled (``*``); if that passes,
    a rule changed something without recording it, and the rules are bisected
    to name it. Returns True when it passes with only by-design rules disabled.
    """
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    # First alone without the shim: a test that fails alone too (load, timing) is
    # not the shim's doing.
    junit = workdir / ("rerun-%s-without.xml" % slug)
    junit.unlink(missing_ok=True)
    cmd = pytest_command(args.python, copy, junit, [node_id(copy, name)], args.rerun_timeout)
    run_pytest(cmd, environment(False), workdir, workdir / ("rerun-%s-without.log" % slug),
               wall_limit=1800)
    base, base_message = outcomes(junit).get(name, ("absent", ""))
    print("  %s [without autosafe_torch]: %s" % (name, base), flush=True)
    if not _ok(base):
        print("      %s" % short(base_message))
        print("      => fails alone without autosafe_torch too: not the shim's doing")
        return True

    run = Rerun(args, workdir, copy, name)
    disabled = set(c.strip() for c in (args.disable or "").split(",") if c.strip())
    unrecorded = set()
    result = "absent"
    for _ in range(rounds):
        result, message, fired = run(disabled)
        if _ok(result):
            break  # with every rule on, or with the rules disabled so far
        new = set(c for c in fired if c) - disabled
        if args.disable:
            break
        if not new:
            if _ok(result):
                break
            # Nothing (more) recorded, still failing: is it the shim at all?
            everything, _, _ = run({"*"})
            if not _ok(everything):
                break
            codes = [c for c in rule_codes(args.python) if c not in disabled]
            print("      passes with every rule disabled: bisecting the rules that act "
                  "without recording it", flush=True)
            unrecorded = bisect_rules(run, disabled, codes)
            disabled |= unrecorded
            continue
        disabled |= new
    print("      command: %s" % run.last_command)
    if _ok(result) and not disabled:
        print("      => %s alone with every rule on: the difference comes from the full "
              "run (test order, load), not from a rule" % result)
        return True
    passes = _ok(result) and bool(disabled)
    not_by_design = sorted(disabled - BY_DESIGN)
    if unrecorded:
        print("      unrecorded change: %s changed the outcome without logging an "
              "intervention" % ",".join(sorted(unrecorded)))
    if not passes:
        print("      => still %s with %s disabled: not explained by a rule" % (
            result, ",".join(sorted(disabled)) or "no rule"))
    elif not_by_design:
        print("      => passes with %s disabled; NOT by design: %s" % (
            ",".join(sorted(disabled)), ",".join(not_by_design)))
    else:
        print("      => by design: passes with %s disabled" % ",".join(sorted(disabled)))
    return passes and not not_by_design


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Extra pytest arguments go after --.")
    p.add_argument("test_file", help="PyTorch's test/test_dataloader.py (not changed)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter with torch, pytest, pytest-timeout, expecttest, psutil "
                        "and autosafe_torch installed (default: this one)")
    p.add_argument("--workdir", default=os.environ.get("CONFORMANCE_DIR",
                                                       "/tmp/autosafe-conformance"),
                   help="where the copy, the junit files and the logs go")
    p.add_argument("--activation", choices=("pth", "sitecustomize"), default="pth")
    p.add_argument("--timeout", type=int, default=600,
                   help="seconds per test (pytest-timeout); on a loaded 2-core machine "
                        "test_ind_worker_queue alone takes over 3 minutes")
    p.add_argument("--rerun-timeout", type=int, default=240,
                   help="seconds per test when re-running one alone (a hang costs this much)")
    p.add_argument("--disable", default=None,
                   help="re-run the differing tests with these rules disabled "
                        "(default: with the rules each one fired)")
    p.add_argument("--no-rerun", action="store_true", help="only compare the two runs")
    p.add_argument("--rerun-only", default=None, metavar="SUBSTRINGS",
                   help="re-run only the differing tests whose Class::test name holds one "
                        "of these comma-separated substrings")
    p.add_argument("--reuse", action="store_true",
                   help="reuse junit files of an earlier run in --workdir")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    args = p.parse_args(argv)
    args.pytest_args = extra

    workdir = Path(args.workdir).resolve()
    copy, dropped = prepare(args.test_file, workdir)
    print("conformance: %s -> %s (%d hw_classification lines dropped)"
          % (args.test_file, copy, dropped), flush=True)
    version = subprocess.run([args.python, "-c", "import torch, autosafe_torch; "
                              "print(torch.__version__, autosafe_torch.__version__)"],
                             capture_output=True, text=True)
    if version.returncode:
        print(version.stderr, file=sys.stderr)
        return 2
    print("conformance: torch %s, autosafe_torch %s" % tuple(version.stdout.split()), flush=True)

    runs = {}
    for label, shim in (("without", False), ("with", True)):
        junit = workdir / ("junit-%s.xml" % label)
        log_file = workdir / "interventions-with.jsonl"
        if not (args.reuse and junit.exists()):
            # an earlier run's results must not stand in for a run that fails to start
            junit.unlink(missing_ok=True)
            if shim and log_file.exists():
                log_file.unlink()
            env = environment(shim, args.activation, log_file if shim else None)
            cmd = pytest_command(args.python, copy, junit, timeout=args.timeout,
                                 extra=args.pytest_args)
            rc, seconds = run_pytest(cmd, env, workdir, workdir / ("pytest-%s.log" % label),
                                     wall_limit=3 * 3600)
            print("conformance: %s autosafe_torch: rc %s in %.0f s (log %s)"
                  % (label, rc, seconds, workdir / ("pytest-%s.log" % label)), flush=True)
        runs[label] = outcomes(junit)
        counts = {}
        for outcome, _ in runs[label].values():
            counts[outcome] = counts.get(outcome, 0) + 1
        print("conformance: %s autosafe_torch: %s" % (
            label, ", ".join("%d %s" % (n, o) for o, n in sorted(counts.items()))), flush=True)
    if not runs["without"] or not runs["with"]:
        print("conformance: a run produced no results; see the logs", file=sys.stderr)
        return 2

    names = sorted(set(runs["without"]) | set(runs["with"]))
    differ = [n for n in names if runs["without"].get(n, ("absent", ""))[0]
              != runs["with"].get(n, ("absent", ""))[0]]
    print("\n%d test(s) differ (without -> with autosafe_torch):" % len(differ))
    for name in differ:
        before, _ = runs["without"].get(name, ("absent", ""))
        after, message = runs["with"].get(name, ("absent", ""))
        print("  %s: %s -> %s" % (name, before, after))
        if message:
            print("      %s" % short(message))
    if not differ or args.no_rerun:
        return 0 if not differ else 1

    print("\nRe-running each differing test alone, without and with autosafe_torch:")
    all_ok = True
    wanted = [w for w in (args.rerun_only or "").split(",") if w]
    for name in differ:
        if wanted and not any(w in name for w in wanted):
            continue
        all_ok &= rerun(args, workdir, copy, name)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
