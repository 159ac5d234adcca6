"""Simulates a platform from outside the code under test.

On PYTHONPATH for test subprocesses: AUTOSAFE_TEST_START_METHOD=spawn makes
this Linux machine start workers the way macOS and Windows do, forkserver
the way Linux does from Python 3.14. Set before the script runs, as the
platform's default would be.
"""

import os

# AUTOSAFE_TEST_CPUS=1: a machine (or container) with that many usable CPUs.
_cpus = os.environ.get("AUTOSAFE_TEST_CPUS")
if _cpus:
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: int(_cpus)]))

_method = os.environ.get("AUTOSAFE_TEST_START_METHOD")
if _method:
    import multiprocessing

    multiprocessing.set_start_method(_method, force=True)
