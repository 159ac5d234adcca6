"""Run a script with the start method macOS and Windows use (spawn), without
autosafe_torch: what a Mac user sees.

    python examples/as_on_macos.py SCRIPT [ARGS...]

Only the platform's default changes, from outside the script, as on a Mac.
With autosafe_torch the same rehearsal is built in, and the rules also see
macOS (no fork rung):

    autosafe-torch run --as macos SCRIPT [ARGS...]
"""

import multiprocessing
import os
import runpy
import sys

if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
