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
    out = (proc.stdout + proc.stderr).strip().splitlines()
    print("\n".join(out[-12:]))
    print("--> exit code %d" % proc.returncode, flush=True)
    return proc.returncode


def main():
    plain = run("without autosafe_torch", [sys.executable, SCRIPT])
    shimmed = run("with autosafe_torch", [sys.executable, "-m", "autosafe_torch", "run", SCRIPT])
    if plain == 0 or shimmed != 0:
        print("\ndemo did not behave as expected (plain %d, shimmed %d)" % (plain, shimmed))
        return 1
    print("\nThe same script, unchanged: it crashed, and with autosafe_torch it trained.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
