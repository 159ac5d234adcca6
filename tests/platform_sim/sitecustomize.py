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

# AUTOSAFE_TEST_CUDA=initialised: CUDA as `model.cuda()` leaves it, on a
# machine without a GPU. In the training process torch.cuda.is_initialized()
# answers True; a child forked from it is in torch's "bad fork", so touching
# CUDA there (torch.cuda.init(), what any CUDA call does first) raises
# torch's own "Cannot re-initialize CUDA in forked subprocess" from torch's
# own _lazy_init; a fresh process (spawn, a fork server's children) touches
# CUDA without error. The training process is the first one to read the
# variable: it leaves its pid there for its children.
_cuda = os.environ.get("AUTOSAFE_TEST_CUDA")
if _cuda:
    import wrapt

    _training_process = _cuda == "initialised"
    if _training_process:
        os.environ["AUTOSAFE_TEST_CUDA"] = "pid %d" % os.getpid()

    def _simulate_cuda(torch):
        cuda = torch.cuda
        forked_after_init = []
        torch_lazy_init = cuda._lazy_init

        def _is_in_bad_fork():
            return bool(forked_after_init)

        def _lazy_init():
            if _is_in_bad_fork():
                torch_lazy_init()  # raises torch's own error
            cuda._initialized = True  # a CUDA context, as far as torch.cuda can tell

        def _after_fork_in_child():
            if cuda._initialized:
                forked_after_init.append(True)

        # Frames of torch's, as the real ones are: the user's line is the one
        # that touched CUDA, not these.
        for stand_in in (_is_in_bad_fork, _lazy_init):
            stand_in.__code__ = stand_in.__code__.replace(co_filename=cuda.__file__)
        cuda._is_in_bad_fork = _is_in_bad_fork
        cuda._lazy_init = _lazy_init
        os.register_at_fork(after_in_child=_after_fork_in_child)
        if _training_process:
            cuda._initialized = True

    wrapt.register_post_import_hook(_simulate_cuda, "torch")
