"""What travels to spawn/forkserver workers: DL202, DL203, DL208, DL201, DL219
and DL220, each saying its part of the one pickling plan (``pickling_plan.py``);
where something still does not pickle, DL201 hands the loader to ``ladder.py``.
"""

from ..inspection import holdings
from ..inspection.parts import PARTS
from ..inspection.reads import reads_of
from ..loaderstate import Kept
from ..remedies import pickling
from ..remedies.process_state import Carry
from ..rung import Rung
from . import IterContext, Rewrite, number_of, rule, what_is
from .fork_plan import SPAWN_VERSIONS, spawning_workers
from .ladder import GROUP, fallback
from .pickling_plan import pickling_plan
from .repairs import REPAIRS, what_dl201_says

NOTEBOOK_FIX = ("move the function or class into a .py module next to the notebook and "
                "import it from there: workers cannot import a notebook")


LOCAL_FUNCTION_REWRITE = Rewrite(
    'local_functions', 'site',
    "a lambda or local `collate_fn`/`worker_init_fn` becomes a module-level function; "
    "one that reads local variables takes them as keyword-only arguments, given as "
    "`functools.partial(f, scale=scale)`",
    "a variable it reads is assigned more than once or after the loader is made; "
    "decorators, defaults, `nonlocal`; a function inside the dataset")

LAZY_OPEN_REWRITE = Rewrite(
    'lazy_open', 'site',
    "`self.f = open(path, ...)` in `__init__`, used in `__getitem__` only: opened "
    "lazily there, once per process (`os.getpid()`: forked workers get their own "
    "offset), left behind when the dataset is pickled (`__getstate__`)",
    "opened for writing; used elsewhere too; the class pickles itself (`__getstate__`, "
    "`__reduce__`, `__slots__`); the dataset's class is not in the file")


def _spawn_plan(args, ctx: IterContext):
    """The pickling plan, where the workers get pickles; else None."""
    return pickling_plan(args, ctx) if spawning_workers(args, ctx) else None


@rule("DL202", "local-function-to-workers", GROUP,
      summary=("lambda, local function or local class as collate_fn/worker_init_fn or "
               "anywhere in the dataset, under spawn/forkserver: pickled by value "
               "(cloudpickle)"),
      prevents=("AttributeError: Can't pickle local object 'main.<locals>.<lambda>' "
                "(PicklingError on older Python)"),
      fix=("define the functions, lambdas and classes workers use at module level of an "
           "importable module"),
      example=(("def main():\n"
                "    loader = DataLoader(ds, num_workers=2, collate_fn=lambda b: "
                "torch.stack(b))"),
               ("def stack(batch):                  # module level of an importable "
                "module\n"
                "    return torch.stack(batch)\n"
                "\n"
                "def main():\n"
                "    loader = DataLoader(ds, num_workers=2, collate_fn=stack)")),
      versions=SPAWN_VERSIONS,
      rewrite=LOCAL_FUNCTION_REWRITE,
      at="dataloader.iter",
      # it reads the start method these may have moved the loader to
      after=("fork_on_macos", "fork_after_cuda"),
      notebook_fix=NOTEBOOK_FIX)
def local_function_to_workers(args, ctx: IterContext):
    plan = _spawn_plan(args, ctx)
    if plan is None or plan.failures:
        return None  # the ladder (DL201) takes the loader elsewhere
    workers = number_of(args["num_workers"], "worker")
    found = [local_function_to_workers.rule.finding(
        {part: args[part]}, {part: new}, why, strategy="by-value",
        done="%s (%s) sent by value to %s" % (part, what_is(args[part]), workers))
        for part, (new, why) in plan.by_value.items()]
    if plan.nested:
        from ..remedies import byvalue  # noqa: PLC0415 - 0.1 ms at `import torch` and at `import cv2`, where the rules load (-X importtime: remedies.byvalue)

        path, why = plan.nested
        found.append(local_function_to_workers.rule.finding(
            {"function": path}, why=why, strategy="by-value",
            remedies=[lambda args: byvalue.send_by_value_where_needed()],
            done="%s and other code workers cannot import sent by value to %s"
            % (path, workers)))
    return found


@rule("DL203", "interactive-main-class", GROUP,
      summary=("dataset class defined in an interactive __main__ (notebook, -c, stdin) "
               "under spawn/forkserver: pickled by value"),
      prevents=("AttributeError: Can't get attribute 'DS' on <module '__main__' "
                "(built-in)>"),
      fix="move the dataset class into an importable module",
      example=(("# a notebook cell, or python -c / stdin\n"
                "class Squares(Dataset): ...\n"
                "DataLoader(Squares(), num_workers=2)"),
               ("# squares.py, next to the notebook\n"
                "class Squares(Dataset): ...\n"
                "\n"
                "# the notebook\n"
                "from squares import Squares\n"
                "DataLoader(Squares(), num_workers=2)")),
      versions=SPAWN_VERSIONS,
      at="dataloader.iter",
      # it reads whether DL202 repairs the dataset's functions (ctx.found)
      after=("local_function_to_workers",),
      notebook_fix=NOTEBOOK_FIX)
def interactive_main_class(args, ctx: IterContext):
    plan = _spawn_plan(args, ctx)
    if plan is None or plan.failures or ((plan.by_value or plan.nested) and not ctx.found("DL202")):
        return None
    from ..remedies import byvalue  # noqa: PLC0415 - 0.1 ms at `import torch` and at `import cv2`, where the rules load (-X importtime: remedies.byvalue)

    return [interactive_main_class.rule.finding(
        {"class": "%s at %s" % (cls.__qualname__, path)}, why=why, strategy="by-value",
        # cls=cls: each finding's own class (a default mypy cannot type in a lambda)
        remedies=[lambda args, cls=cls: byvalue.register_by_value_class(cls)],  # type: ignore[misc]
        done="class %s of __main__ (%s) sent by value to %s" % (
            cls.__qualname__, path, number_of(args["num_workers"], "worker")))
        for cls, (path, why) in plan.classes.items()]


@rule("DL208", "thread-pool-in-workers", GROUP,
      summary=("dataset holds a thread pool: each worker gets a new, empty one of the "
               "same size (fork: a worker_init step; spawn/forkserver: sent as a new "
               "pool)"),
      prevents=("fork: workers hang forever on their first submit() to a pool whose "
                "threads stayed in the parent; spawn: TypeError: cannot pickle "
                "'_thread.lock' object"),
      fix="create the pool lazily in __getitem__ or in worker_init_fn, not in __init__",
      example=(("class Decoded(Dataset):\n"
                "    def __init__(self):\n"
                "        self.pool = ThreadPoolExecutor(4)"),
               ("class Decoded(Dataset):\n"
                "    def __init__(self):\n"
                "        self.pool = None\n"
                "    def __getitem__(self, i):\n"
                "        if self.pool is None:\n"
                "            self.pool = ThreadPoolExecutor(4)   # made in each worker\n"
                "        ...")),
      versions=("every supported torch; fork (a hang) and spawn/forkserver (a pickling "
                "error)"),
      at="dataloader.iter",
      # it reads the start method these may have moved the loader to
      after=("fork_on_macos", "fork_after_cuda"))
def thread_pool_to_spawned_workers(args, ctx: IterContext):
    plan = _spawn_plan(args, ctx)
    if plan is None or not plan.pools or plan.failures:
        return None
    from ..remedies import pools  # noqa: PLC0415 - imports torch (torch.utils.data): the rules load at `import cv2`, before the program imports torch

    return thread_pool_to_spawned_workers.rule.finding(
        {"thread pool": ", ".join(plan.pools)}, why="a pool does not travel to a "
        "spawned worker; each gets a new one of the same size", strategy="new pool per worker",
        remedies=[lambda args: pickling.install(pools.pool_reducers())],
        done="%s (a thread pool) sent as a new, empty pool to each of %s" % (
            ", ".join(plan.pools), number_of(args["num_workers"], "worker")))


DL201_SAYS = [r for r in REPAIRS if r.code == "DL201"]  # its words, from the registry


@rule("DL201", "unpicklable-dataset", GROUP,
      summary=("spawn/forkserver workers and a dataset that does not pickle (or whose class "
               "forwards attributes and so does not unpickle, or whose pickle drops a file "
               "it reads): the repair ladder (%s; else fork; else, with no fork rung, %s; "
               "else emulated workers)" % tuple(", ".join(
                   r.summary for r in DL201_SAYS if r.runs_user_code is last)
                   for last in (False, True))),
      prevents="; ".join(r.prevents for r in DL201_SAYS),
      fix="open files lazily in __getitem__ (or in worker_init_fn), not in __init__",
      example=(("class Frames(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.fh = open(path, 'rb')        # does not pickle\n"
                "    def __getitem__(self, i):\n"
                "        self.fh.seek(i * SIZE)\n"
                "        return self.fh.read(SIZE)"),
               ("class Frames(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.path, self.fh = path, None\n"
                "    def __getitem__(self, i):\n"
                "        if self.fh is None:\n"
                "            self.fh = open(self.path, 'rb')  # opened in each worker\n"
                "        self.fh.seek(i * SIZE)\n"
                "        return self.fh.read(SIZE)")),
      versions=("every supported torch; the platforms that start workers by spawn "
                "(macOS, Windows) or forkserver (Linux from Python 3.14)"),
      rewrite=LAZY_OPEN_REWRITE,
      at="dataloader.iter",
      # it reads whether their repairs were made (ctx.found)
      after=("local_function_to_workers", "interactive_main_class",
             "thread_pool_to_spawned_workers"))
def unpicklable_dataset(args, ctx: IterContext):
    plan = _spawn_plan(args, ctx)
    if plan is None:
        return None
    if plan.failures:
        return fallback(unpicklable_dataset, args, ctx, None)
    if any(not ctx.found(r.code) for r in REPAIRS
           if r.code != "DL201" and not r.carried and getattr(plan, r.field)):
        return None  # its own repair was turned off (AUTOSAFE_TORCH_DISABLE): torch's error stands
    said = what_dl201_says(plan, args)
    if said is None:
        return None
    return unpicklable_dataset.rule.finding(
        **said, rung=Rung.REBUILT if plan.rebuilt else None,
        kept=Kept(rebuilt=tuple(d for _where, d, _why in plan.rebuilt)) if plan.rebuilt else None)


@rule("DL219", "logging-config-to-workers", GROUP,
      summary=("spawn/forkserver workers and a dataset holding a logger configured in the "
               "training process (handlers, levels, filters): the configuration its records "
               "meet travels with it, made again in each worker in place of the worker's own "
               "(files opened again for appending)"),
      prevents=("a dataset's log lines lost without an error in spawn workers: a Logger "
                "pickles by its name, and a worker's logger of that name has no handler "
                "(an audit log with 0 of its 720 lines)"),
      fix=("configure the dataset's logging where the worker runs: in worker_init_fn, or "
           "lazily in __getitem__ (a handler added once per process)"),
      example=(("class Audited(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.log = logging.getLogger('audit')\n"
                "        self.log.addHandler(logging.FileHandler(path))"),
               ("def configure_audit(worker_id):\n"
                "    logging.getLogger('audit').addHandler(logging.FileHandler(PATH))\n"
                "\n"
                "DataLoader(ds, num_workers=2, worker_init_fn=configure_audit)")),
      versions=SPAWN_VERSIONS,
      at="dataloader.iter",
      # it reads the rung DL201 chose (fork, or emulated workers)
      after=("unpicklable_dataset",))
def logging_config_to_workers(args, ctx: IterContext):
    plan = _spawn_plan(args, ctx)
    if plan is None or plan.failures or not plan.loggers:
        return None
    from ..remedies import loggers  # noqa: PLC0415 - 0.8 ms at `import torch` and at `import cv2`, where the rules load (-X importtime: remedies.loggers, handlers, diagnostics, faulthandler)

    found = list(plan.loggers)
    names = ", ".join(repr(lg.name) for lg in found)
    handlers = sum(len(link.handlers) for lg in found for link in holdings.chain(lg))
    # Whether a worker needs it is its own to see: its imports may configure
    # the same (a library's logger); then it keeps its own, and no record is made.
    reports = loggers.Reports()
    return logging_config_to_workers.rule.finding(
        {"loggers": [lg.name for lg in found]},
        why="a logger pickles by its name: a spawned worker's has none of this process's "
        "handlers, levels or filters", strategy="carry logging configuration",
        kept=Kept(loggers=reports), needed=reports.needed,
        remedies=[lambda args: pickling.install(loggers.reducers(found))],
        done="the logger%s %s carried to each of %s with the configuration its records meet "
        "(%s)" % ("s" if len(found) > 1 else "", names, number_of(args["num_workers"], "worker"),
                  number_of(handlers, "handler")))


PROCESS_STATE_REWRITE = Rewrite(
    "process_state", "site",
    "the module globals and class attributes of the loader's own file that the run "
    "carried are given to each worker by its `worker_init_fn`: a function the rewrite "
    "adds at module level sets them there, then calls the loader's own "
    "`worker_init_fn`, given as `functools.partial(set_state, {...}, own)`",
    "a value of another module, a library-wide setting, a library function the program "
    "replaced, an attribute of a nested class or a value that did not pickle; a call that "
    "passes `worker_init_fn` positionally or by `*`/`**`; a name local where the loader "
    "is made, or bound again after it (a worker would get the value at the loader, not "
    "at its start); a value a `__setstate__`, `__getattr__` or `__getattribute__` reads "
    "(it must be in place before the dataset arrives)")


@rule("DL220", "process-state", GROUP,
      summary=("spawn/forkserver workers: the module globals and class attributes their "
               "code reads (the dataset's methods, its transforms, collate_fn, "
               "worker_init_fn and the program's functions and classes they name) and the "
               "library-wide settings a new interpreter resets (torch's default dtype, "
               "deterministic algorithms...), carried from the training process where a "
               "worker's own import left another value, before the dataset arrives: the "
               "values a forked worker would have"),
      prevents=("silently wrong batches, with no error: a spawned worker imports the script "
                "again, so a config main() filled from argparse, class statistics it "
                "computed, torch.set_default_dtype() or a library function it replaced are "
                "at their import-time values there"),
      fix=("pass what the dataset's code reads to its constructor and keep it on the "
           "dataset (or set it in worker_init_fn), not in a module global or class "
           "attribute that main() changes"),
      example=(("CONFIG = {'scale': 1.0}\n"
                "\n"
                "class Spectra(Dataset):\n"
                "    def __getitem__(self, i):\n"
                "        return self.data[i] * CONFIG['scale']   # 1.0 in a spawned worker\n"
                "\n"
                "if __name__ == '__main__':\n"
                "    CONFIG['scale'] = parse_args().scale\n"
                "    DataLoader(Spectra(data), num_workers=2)"),
               ("class Spectra(Dataset):\n"
                "    def __init__(self, data, scale):\n"
                "        self.data, self.scale = data, scale     # travels with the dataset\n"
                "    def __getitem__(self, i):\n"
                "        return self.data[i] * self.scale\n"
                "\n"
                "if __name__ == '__main__':\n"
                "    DataLoader(Spectra(data, parse_args().scale), num_workers=2)")),
      versions=SPAWN_VERSIONS,
      rewrite=PROCESS_STATE_REWRITE,
      at="dataloader.iter",
      # it reads the start method and the rung the ladder chose (fork, emulated
      # workers: their workers read this process's own values)
      after=("memmap_by_reference",))
def process_state_to_workers(args, ctx: IterContext):
    if not spawning_workers(args, ctx) or any(f.rung is Rung.EMULATED for f in ctx.findings):
        return None
    rebuilt = {type(d) for f in ctx.findings for d in f.kept.rebuilt or ()}
    reads = reads_of([args[part] for part in PARTS], rebuilt)
    carry = Carry(reads, args["num_workers"])
    # Whether a worker's value differs is its own to see: the record is made from
    # what the workers said (none where every value was the import's).
    return process_state_to_workers.rule.finding(
        {"read": [r.label for r in reads]},
        why="a spawned worker imports the program's modules again: what main() changed is "
        "at its import-time value there", strategy="carried to each worker",
        kept=Kept(process_state=carry), needed=carry.outcome,
        done="the values main() set that its workers read carried to each of %s" % (
            number_of(args["num_workers"], "worker")))
