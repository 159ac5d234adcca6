"""`make demo`: the legacy script crashes with plain python, runs with the shim."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "legacy_train.py")


def run(title, cmd):
    print("\n=== %s\n$ %s" % (title, " ".join(cmd)), flush=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSAFE_TORCH")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    text = (proc.stdout + proc.stderr).strip()
    print("\n".join(text.splitlines()[-12:]))
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


def main():
    ok = demo("a legacy training script", [SCRIPT], "ValueError: prefetch_factor")
    file_script = os.path.join(HERE, "legacy_file_dataset.py")
    ok &= demo("a dataset holding an open file, run as on macOS (spawn workers, no fork)",
               [file_script], "TypeError: cannot pickle",
               plain_args=[os.path.join(HERE, "as_on_macos.py"), file_script],
               run_options=("--as", "macos"))
    if ok:
        print("\nThe same scripts, unchanged: they crashed, and with autosafe_torch they ran.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
