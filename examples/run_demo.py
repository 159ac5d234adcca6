"""`make demo`: the legacy script crashes with plain python, runs with the shim,
and `autosafe-torch fix` turns what the run fixed into a patch of the script."""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "legacy_train.py")


def run(title, cmd, tail=12):
    print("\n=== %s\n$ %s" % (title, " ".join(cmd)), flush=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSAFE_TORCH")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    text = (proc.stdout + proc.stderr).strip()
    print("\n".join(text.splitlines()[-tail:]))
    print("--> exit code %d" % proc.returncode, flush=True)
    return proc.returncode, text


def demo(title, script_args, expected_error, plain_args=None, run_options=()):
    """The same script, without and with autosafe_torch: the expected crash,
    then success. A crash for another reason (a missing package) fails the demo."""
    plain, plain_out = run("%s, without autosafe_torch" % title,
                           [sys.executable] + (plain_args or script_args))
    shimmed, _ = run("%s, with autosafe_torch" % title,
                     [sys.executable, "-m", "autosafe_torch", "run", *run_options]
                     + script_args)
    ok = plain != 0 and expected_error in plain_out and shimmed == 0
    if not ok:
        print("\ndemo did not behave as expected (plain %d, shimmed %d; expected the plain "
              "run to fail with %r)" % (plain, shimmed, expected_error))
    return ok


def show_patch(log):
    """The patch of the legacy script that the run's log asks for, printed, not
    applied: the script stays as it is for the next demo."""
    rc, text = run("what the run fixed, as a patch of the script (--write applies it)",
                   [sys.executable, "-m", "autosafe_torch", "fix", "--from", log], tail=60)
    ok = rc == 0 and "+++ b/" in text and "rewritten" in text
    if not ok:
        print("\ndemo did not behave as expected: no patch from %s" % log)
    return ok


def main():
    logs = tempfile.mkdtemp()
    train_log = os.path.join(logs, "legacy_train.jsonl")
    file_log = os.path.join(logs, "legacy_file_dataset.jsonl")
    ok = demo("a legacy training script", [SCRIPT], "ValueError: prefetch_factor",
              run_options=("--log-file", train_log))
    file_script = os.path.join(HERE, "legacy_file_dataset.py")
    ok &= demo("a dataset holding an open file, run as on macOS (spawn workers, no fork)",
               [file_script], "TypeError: cannot pickle",
               plain_args=[os.path.join(HERE, "as_on_macos.py"), file_script],
               run_options=("--as", "macos", "--log-file", file_log))
    ok &= show_patch(file_log)
    ok &= show_patch(train_log)
    if ok:
        print("\nThe same scripts, unchanged: they crashed, and with autosafe_torch they ran; "
              "`autosafe-torch fix --from LOG --write` makes the fix permanent.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
