"""`make demo`: the legacy script crashes with plain python, runs with the shim,
and `autosafe-torch fix` turns what the run fixed into a patch of the script."""

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "legacy_train.py")


def run(title, cmd, tail=12):
    """Run ``cmd``; its exit code, its whole output, and what the demo shows of it
    (the title, the command, the last ``tail`` lines, the exit code)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSAFE_TORCH")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    text = (proc.stdout + proc.stderr).strip()
    shown = "\n=== %s\n$ %s\n%s\n--> exit code %d" % (
        title, " ".join(cmd), "\n".join(text.splitlines()[-tail:]), proc.returncode)
    return proc.returncode, text, shown


def demo(title, script_args, expected_error, plain_args=None, run_options=()):
    """The same script, without and with autosafe_torch: the expected crash,
    then success. A crash for another reason (a missing package) fails the demo.
    Whether it behaved so, and what it shows."""
    plain, plain_out, plain_shown = run("%s, without autosafe_torch" % title,
                                        [sys.executable] + (plain_args or script_args))
    shimmed, _, shimmed_shown = run("%s, with autosafe_torch" % title,
                                    [sys.executable, "-m", "autosafe_torch", "run",
                                     *run_options] + script_args)
    shown = [plain_shown, shimmed_shown]
    ok = plain != 0 and expected_error in plain_out and shimmed == 0
    if not ok:
        shown.append("\ndemo did not behave as expected (plain %d, shimmed %d; expected the "
                     "plain run to fail with %r)" % (plain, shimmed, expected_error))
    return ok, "\n".join(shown)


def show_patch(log):
    """The patch of the legacy script that the run's log asks for, printed, not
    applied: the script stays as it is for the next demo. Whether there was one,
    and what it shows."""
    rc, text, shown = run("what the run fixed, as a patch of the script (--write applies it)",
                          [sys.executable, "-m", "autosafe_torch", "fix", "--from", log],
                          tail=60)
    ok = rc == 0 and "+++ b/" in text and "rewritten" in text
    if not ok:
        shown += "\n\ndemo did not behave as expected: no patch from %s" % log
    return ok, shown


def shown_in_order(steps):
    """Each step's transcript as soon as it and those before it are done; whether
    all behaved as expected."""
    ok = True
    for step in steps:
        step_ok, shown = step.result()
        print(shown, flush=True)
        ok &= step_ok
    return ok


def main():
    with tempfile.TemporaryDirectory() as logs:
        return _run(logs)


def _run(logs):
    train_log = os.path.join(logs, "legacy_train.jsonl")
    file_log = os.path.join(logs, "legacy_file_dataset.jsonl")
    file_script = os.path.join(HERE, "legacy_file_dataset.py")
    # The two scripts do not depend on each other: they run side by side, their
    # transcripts shown in order (on 2 cores the runs took 10.5 s here, 15.6 s in turn).
    with ThreadPoolExecutor(max_workers=2) as pool:
        ok = shown_in_order([
            pool.submit(demo, "a legacy training script", [SCRIPT], "ValueError: prefetch_factor",
                        run_options=("--log-file", train_log)),
            pool.submit(demo, "a dataset holding an open file, run as on macOS (spawn workers, "
                        "no fork)", [file_script], "TypeError: cannot pickle",
                        plain_args=[os.path.join(HERE, "as_on_macos.py"), file_script],
                        run_options=("--as", "macos", "--log-file", file_log))])
        ok &= shown_in_order([pool.submit(show_patch, file_log),
                              pool.submit(show_patch, train_log)])
    if ok:
        print("\nThe same scripts, unchanged: they crashed, and with autosafe_torch they ran; "
              "`autosafe-torch fix --from LOG --write` makes the fix permanent.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
