"""OpenCV in DataLoader workers (CV401, CV402), by measurement.

Measured on opencv-python-headless 4.5.1 .. 5.0.0 (pthreads backend, two
cores, fork workers; README, "Devices, shared memory, open files and
OpenCV"): DataLoader workers with no fix did not hang; raw forks at a high
rate while the parent's threads ran cv2 did, rarely (5.0.0), never with
``cv2.setNumThreads(0)`` in the child; any non-zero count in a forked child
hung or crashed on every release. A parent that used OpenCL (``cv2.UMat``)
on a usable device hands its context to forked workers, which then hang in
UMat whatever ``worker_init_fn`` sets. Stopping the parent's pool at
``import cv2`` cost main-process cv2 code 0.57x. So the program keeps its
threads and each worker gets ``setNumThreads(0)``, never another count
(CV401; fork workers also by patches/cv2.py's after-fork hook), and OpenCL
workers start clean only where that hazard is a fact (CV402).

Nothing here imports cv2: the steps are added only once the program has.
"""

import sys

from ..remedies import cv2 as cv2_remedies
from ..remedies.workerinit import with_step
from ..rung import Rung
from . import IterContext, Rewrite, number_of, rule
from .fork_plan import forking
from .ladder import emulated_workers
from .pickling_plan import pickling_plan

GROUP = "cv2"


@rule("CV401", "cv2-threads", GROUP,
      summary=("cv2 imported and a DataLoader with workers: cv2.setNumThreads(0) in each "
               "worker before your code runs there (fork workers as they fork); your "
               "program keeps its own OpenCV threads"),
      prevents=("DataLoader workers that hang in cv2 calls after fork; workers x OpenCV "
                "threads oversubscribing the CPUs"),
      fix=("call cv2.setNumThreads(0) in worker_init_fn (never a non-zero count in a "
           "forked worker)"),
      example=(("import cv2\n"
                "DataLoader(images_resized_with_cv2, num_workers=4)"),
               ("import cv2\n"
                "\n"
                "def worker_init(worker_id):\n"
                "    cv2.setNumThreads(0)  # 0, never another count, in a forked worker\n"
                "\n"
                "DataLoader(images_resized_with_cv2, num_workers=4, "
                "worker_init_fn=worker_init)")),
      versions="every supported torch; any OpenCV (opencv-python, -headless, -contrib)",
      rewrite=Rewrite(
        'cv2', 'file',
        "after `import cv2`: `os.register_at_fork(after_in_child=lambda: "
        "cv2.setNumThreads(0))`, and `cv2.setNumThreads(0)` under `if __name__ == "
        '"__mp_main__":` (spawned workers import the module again); your program\'s own '
        "threads untouched",
        "cv2 is not imported at module level in the file"),
      at="dataloader.init")
def cv2_threads_in_workers(args, ctx):
    if args["num_workers"] <= 0 or "cv2" not in sys.modules:
        return None
    old = args["worker_init_fn"]
    new = with_step(old, cv2_remedies.worker_threads_off)
    if new is old:
        return None
    return cv2_threads_in_workers.rule.finding(
        {"worker_init_fn": old}, {"worker_init_fn": new},
        "cv2 is imported; cv2.setNumThreads(0) in each worker under every start method, "
        "before the worker_init_fn of the program; never a non-zero count in a forked worker",
        strategy="worker_init_fn step",
        done="cv2.setNumThreads(0) in each of %s (a worker_init_fn step before yours; fork "
        "workers also as they fork)" % number_of(args["num_workers"], "worker"))


@rule("CV402", "cv2-opencl", GROUP,
      summary=("fork workers while this process has used OpenCL on a usable OpenCL "
               "device: the workers start from the warm server (a clean process, spawn's "
               "semantics) where the dataset travels there, else emulated in this "
               "process; OpenCL off in the workers. Nothing where no OpenCL device is "
               "usable"),
      prevents=("forked workers that hang in cv2 calls on cv2.UMat: they inherit the "
                "parent's OpenCL context (even with OpenCL off in worker_init_fn)"),
      fix=("where the main process uses OpenCL (cv2.UMat), start the workers with "
           "multiprocessing_context='forkserver' (or 'spawn') and call "
           "cv2.ocl.setUseOpenCL(False) in worker_init_fn"),
      example=(("import cv2\n"
                "cv2.GaussianBlur(cv2.UMat(image), (5, 5), 0)  # OpenCL in the main "
                "process\n"
                "DataLoader(images_blurred_with_umat, num_workers=4)"),
               ("import multiprocessing\n"
                "import cv2\n"
                "\n"
                "def worker_init(worker_id):\n"
                "    cv2.ocl.setUseOpenCL(False)\n"
                "\n"
                "DataLoader(images_blurred_with_umat, num_workers=4, "
                "worker_init_fn=worker_init,\n"
                "           "
                "multiprocessing_context=multiprocessing.get_context('forkserver'))")),
      versions=("every supported torch; OpenCV builds with OpenCL, where an OpenCL "
                "device is usable"),
      at="dataloader.iter",
      # it reads the start method the ladder and DL209 chose, and whether a check
      # emulated the workers: it runs last
      after=("warm_worker_start",))
def cv2_opencl_context(args, ctx: IterContext):
    if "cv2" not in sys.modules or not forking(args):
        return None
    if any(f.rung is Rung.EMULATED for f in ctx.findings):
        return None  # no worker is forked
    from ..facts import fork_server_available, opencl_device_usable, opencl_runtime_loaded  # noqa: PLC0415 - 0.2 ms at `import cv2` before torch, where the rules load (-X importtime: facts)

    runtime = opencl_runtime_loaded()
    if runtime is None or not opencl_device_usable():
        return None  # the parent has not used OpenCL, or it is inert here
    why = "this process has used OpenCL (%s loaded) on a usable device, and a forked " \
        "worker would inherit its OpenCL context" % runtime
    # The warm server where the dataset travels (it pickles as it is, the main
    # module is importable), else emulated workers.
    plan = pickling_plan(args, ctx)
    if not (ctx.main_guarded() and not plan.failures and not plan.needs_repair
            and fork_server_available(ctx.facts.platform)):
        reason = "the dataset cannot travel to a clean worker (%s)" % (
            "; ".join("%s: %s" % (f.path, f.error) for f in plan.failures)
            or ("it pickles only once repaired" if plan.needs_repair
                else "no fork server here" if ctx.main_guarded()
                else "the main module is not guarded"))
        # the line says why in short; the details (what does not pickle) are in why
        return emulated_workers(cv2_opencl_context, args, why + "; " + reason,
                                reason="not forked from this one, which used OpenCL, and "
                                "the dataset cannot travel to a clean worker")
    from ..remedies import warmstart  # noqa: PLC0415 - 0.6/1.5 ms at `import torch` / `import cv2`, where the rules load (-X importtime: remedies.warmstart, diagnostics, faulthandler; at cv2's also multiprocessing.connection, resource_sharer, spawn)

    libraries = warmstart.libraries_for(
        [args["dataset"], args["collate_fn"], args["worker_init_fn"]])
    init = with_step(args["worker_init_fn"], warmstart.exit_with_parent)
    init = with_step(init, cv2_remedies.worker_opencl_off)
    return cv2_opencl_context.rule.finding(
        {"multiprocessing_context": "fork"},
        {"multiprocessing_context": warmstart.warm_context(args["multiprocessing_context"]),
         "worker_init_fn": init},
        why + "; the dataset travels, so each worker starts from the warm server, "
        "clean, as spawn starts it", strategy="warm forkserver",
        remedies=[lambda args: warmstart.preload(libraries)],
        # What the warm context guarantees however the start goes: a new process.
        done="workers start in new processes (from the warm server, else by plain spawn), "
        "not forked from this one, which used OpenCL; OpenCL off in each of %s"
        % number_of(args["num_workers"], "worker"))
