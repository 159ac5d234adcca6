"""How workers start: the start method, the main module, the worker count.

DL104 is decided at construction (the worker count). The others are checked
at ``dataloader.iter``, when an iterator is made, because the start method
can change between construction and iteration; where the workers cannot
start as asked, ``ladder.py`` chooses the rung.
"""

from . import IterContext, Rewrite, number_of, rule
from .fork_plan import SPAWN_VERSIONS, SPAWNING, forking, start_method
from .ladder import GROUP, away_from_fork, fallback


@rule("DL104", "too-many-workers", GROUP,
      summary=("num_workers above the container's CPU quota, which torch's own "
               "worker-count warning (affinity only) misses: advice only, the count is "
               "left as asked (each worker is seeded base_seed + worker_id and batches "
               "go to workers round robin, so random augmentation, get_worker_info(), "
               "sharding and barriers depend on it)"),
      prevents=("oversubscription in containers (slow epochs, freezes) that torch's "
                "warning 'This DataLoader will create N worker processes in total...' "
                "does not see: it reads the CPU affinity, not the cgroup quota"),
      fix=("num_workers=min(wanted, len(os.sched_getaffinity(0))) and the container's "
           "CPU quota"),
      example=(("# in a container limited to 2 CPUs (cgroup quota) on a 64-core host\n"
                "DataLoader(ds, num_workers=16)"),
               ("DataLoader(ds, num_workers=min(16, usable_cpus()))  # affinity and the "
                "quota")),
      versions=("every supported torch: its own warning reads the CPU affinity, never "
                "the cgroup quota"),
      at="dataloader.init")
def too_many_workers(values, ctx):
    wanted, usable = values["num_workers"], ctx.facts.cpus_usable
    if not wanted or wanted <= usable or wanted > ctx.facts.cpus_affinity:
        return None  # enough CPUs, or torch warns itself (its message reaches the user)
    return too_many_workers.rule.finding(
        {"num_workers": wanted}, {}, "only %d CPU(s) are usable here; more workers only "
        "compete for them, but the batches depend on the worker count: left as asked"
        % usable, strategy="advice",
        done="num_workers=%d left as asked, above the %s usable here (the container's "
        "CPU quota)" % (wanted, number_of(usable, "CPU")))


@rule("DL204", "unguarded-main", GROUP,
      summary=("workers started from unguarded top-level code of __main__ (or a script "
               "read from stdin) under spawn/forkserver: fork where safe, else emulated "
               "workers"),
      prevents=("RuntimeError: An attempt has been made to start a new process before "
                "the current process has finished its bootstrapping phase. "
                "(BrokenPipeError on Windows)"),
      fix='put the training code under if __name__ == "__main__":',
      example=(("loader = DataLoader(ds, num_workers=2)\n"
                "for batch in loader:\n"
                "    train(batch)"),
               ('if __name__ == "__main__":\n'
                "    loader = DataLoader(ds, num_workers=2)\n"
                "    for batch in loader:\n"
                "        train(batch)")),
      versions=SPAWN_VERSIONS,
      rewrite=Rewrite(
        'main_guard', 'file',
        "the top-level training code moved, in its order, under `if __name__ == "
        '"__main__":` at the end; imports, functions, classes and the assignments they read '
        "stay at module level; the loader's lambdas lifted as for DL202",
        "the file has a main guard; what stays would read or bind a name the moved code binds"),
      at="dataloader.iter")
def unguarded_main(args, ctx: IterContext):
    method = start_method(args)
    if args["num_workers"] > 0 and method in SPAWNING and not ctx.main_guarded():
        return fallback(unguarded_main, args, ctx, "workers are started from top-level "
                         "code of __main__ that %s re-runs in every worker" % method)


@rule("DL206", "fork-on-macos", GROUP,
      summary=("fork workers on macOS from a process that has (or had) more than one "
               "thread: spawn where everything pickles, else emulated workers"),
      prevents=("objc[...]: +[NSNumber initialize] may have been in progress in another "
                "thread when fork() was called. Crashing instead."),
      fix="leave macOS's default start method (spawn) alone",
      example=(("multiprocessing.set_start_method('fork')   # on macOS\n"
                "DataLoader(ds, num_workers=2)"),
               "DataLoader(ds, num_workers=2)              # macOS's default: spawn"),
      versions="every supported torch, on macOS",
      at="dataloader.iter",
      # it reads the start method these may have moved the loader to
      after=("unguarded_main",))
def fork_on_macos(args, ctx: IterContext):
    # Fork on macOS is left alone only while this process has one thread (the
    # Objective-C runtime aborts the children of one that has, or had, more); the
    # ladder never chooses it: a library may start a thread at any time.
    from ..inspection import threads  # noqa: PLC0415 - 0.1 ms at `import torch` and at `import cv2`, where the rules load (-X importtime: inspection.threads)

    if forking(args) and ctx.facts.platform == "darwin" and not threads.single_threaded():
        return away_from_fork(fork_on_macos, args, ctx,
                               "this process has more than one thread, and macOS aborts "
                               "the children it forks (Objective-C runtime)")


@rule("DL205", "fork-after-cuda", GROUP,
      summary=("a forked worker touched CUDA, which the parent had initialised (a CUDA "
               "tensor the dataset holds, .cuda() in __getitem__): seen, not predicted, "
               "so the ordinary GPU script whose workers never touch CUDA keeps fork; "
               "the workers are restarted by spawn (CUDA tensors travel by CUDA IPC, "
               "the batches keep their device) where everything pickles, else emulated "
               "in this process, and resume at the first batch not delivered"),
      prevents=("RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use "
                "CUDA with multiprocessing, you must use the 'spawn' start method; "
                "torch.AcceleratorError: CUDA error: initialization error"),
      fix=("keep CUDA out of the workers: hold CPU data in the dataset and move each "
           "batch in the training loop (batch.cuda(non_blocking=True), pin_memory=True); "
           "or pass multiprocessing_context='spawn'"),
      example=(("model = Net().cuda()               # CUDA is initialised here\n"
                "class DS(Dataset):\n"
                "    def __getitem__(self, i):\n"
                "        return self.x[i].cuda()      # in a forked worker"),
               ("class DS(Dataset):\n"
                "    def __getitem__(self, i):\n"
                "        return self.x[i]             # CPU in the worker\n"
                "for xb in DataLoader(DS(), num_workers=2, pin_memory=True):\n"
                "    xb = xb.cuda(non_blocking=True)")),
      versions="every supported torch with CUDA, on Linux (fork)",
      at="dataloader.iter",
      # it reads the start method these may have moved the loader to
      after=("unguarded_main", "fork_on_macos"))
def fork_after_cuda(args, ctx: IterContext):
    """Only once forked workers of this loader touched CUDA (``ctx.fork_failed``):
    never on "CUDA is initialised", true of every GPU script."""
    if forking(args) and ctx.fork_failed is not None:
        return away_from_fork(fork_after_cuda, args, ctx,
                               "a forked worker touched CUDA, which this process had "
                               "initialised: %s" % ctx.fork_failed.what())
