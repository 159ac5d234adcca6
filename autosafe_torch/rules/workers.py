"""Worker hazards: the start method, what travels to workers, the ladder.

DL104 is decided at construction (the worker count). The others are
checked at ``dataloader.iter``, when an iterator is made, because the start
method can change between construction and iteration. They run in the order
they are declared here, each seeing the loader's arguments as the earlier
ones changed them: a rule that moves the loader to fork (DL204, DL201) is
followed by DL207 and DL212, which look at what fork means for open files
and native handles.

The ladder for a loader whose workers cannot start as asked (keep the first
rung that works; every rung yields the batches the requested workers yield on a
safe platform):

1. repair: read-only files (and h5py, sqlite, lmdb, cv2.VideoCapture
   handles) travel by path, lambdas/local functions and
   interactive-``__main__`` classes by value (``remedies``);
2. another start method: fork on Linux where safe (no lock held now, no
   live thread, and every file and handle one that the fork remedies, DL207
   and DL212, handle: ``fork_plan``; not once forked workers of the loader
   touched CUDA, DL205), spawn where all pickles;
3. where no fork is safe (macOS): the dataset built again in each worker
   from its constructor's arguments (``remedies/rebuild.py``), where a
   second build here holds the same state; below fork because it runs the
   user's constructor again, which fork never does;
4. emulated workers: the requested workers emulated in this process, each
   with its own copy of the dataset, its seeds and its worker info, so that
   the batches are exactly those of the workers asked for.
"""

import types

from ..inspection import objwalk
from ..inspection.objwalk import is_a
from . import Rewrite, a_or_an, emulated_workers, number_of, rule, what_is

GROUP = "dataloader"
SAFE_FORK_PLATFORMS = ("linux",)
NOTEBOOK_FIX = ("move the function or class into a .py module next to the notebook and "
                "import it from there: workers cannot import a notebook")


# -- DL104, at construction ----------------------------------------------------


# How `autosafe-torch fix` rewrites these rules' records (docs/fix.md).
MAIN_GUARD_REWRITE = Rewrite(
    'main_guard', 'file',
    "the top-level training code moved, in its order, under `if __name__ == "
    '"__main__":` at the end; imports, functions, classes and the assignments they read '
    "stay at module level; the loader's lambdas lifted as for DL202",
    "the file has a main guard; what stays would read or bind a name the moved code "
    "binds")

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
    facts = ctx.facts
    wanted, usable = values["num_workers"], facts.cpus_usable
    if not wanted or wanted <= usable or wanted > facts.cpus_affinity:
        return None  # enough CPUs, or torch warns itself (its message reaches the user)
    # No change: which worker fetches a batch, and with which seed, is part of
    # the batch (random augmentation); a dataset may wait for all its workers.
    return too_many_workers.rule.finding(
        {"num_workers": wanted}, {}, "only %d CPU(s) are usable here; more workers only "
        "compete for them, but the batches depend on the worker count: left as asked"
        % usable, strategy="advice",
        done="num_workers=%d left as asked, above the %s usable here (the container's "
        "CPU quota)" % (wanted, number_of(usable, "CPU")))



# -- at iteration ---------------------------------------------------------------

SPAWNING = ("spawn", "forkserver")


def start_method(args):
    from ..facts import effective_start_method

    return effective_start_method(args["multiprocessing_context"])


def _spawning_workers(args, ctx):
    """Workers started by spawn/forkserver from a guarded main: they get pickles."""
    return args["num_workers"] > 0 and start_method(args) in SPAWNING and ctx.main_guarded()


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
      versions=("every supported torch; spawn (macOS, Windows) and forkserver (Linux "
                "from Python 3.14)"),
      rewrite=MAIN_GUARD_REWRITE,
      at="dataloader.iter")
def unguarded_main(args, ctx):
    method = start_method(args)
    if args["num_workers"] > 0 and method in SPAWNING and not ctx.main_guarded():
        return _fallback(unguarded_main, args, ctx, "workers are started from top-level "
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
      at="dataloader.iter")
def fork_on_macos(args, ctx):
    if args["num_workers"] > 0 and start_method(args) == "fork" \
            and ctx.facts.platform == "darwin" and not _macos_forks_safely():
        return _away_from_fork(fork_on_macos, args, ctx,
                               "this process has more than one thread, and macOS aborts "
                               "the children it forks (Objective-C runtime)")


def _macos_forks_safely():
    """A fork the user asked for on macOS is left alone only while this process
    has one thread (``inspection/threads.py``): the Objective-C runtime aborts
    the children of a process that has, or had, more. The ladder itself never
    chooses fork on macOS: a library may start a thread at any time, and
    spawn's semantics are what a Mac user's script was written for."""
    from ..inspection import threads

    return threads.single_threaded()


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
      at="dataloader.iter")
def fork_after_cuda(args, ctx):
    """At iteration only once forked workers of this loader touched CUDA
    (``ctx.fork_failed``, from the recovery): never on the prediction that
    "CUDA is initialised", which holds for every GPU script and says nothing
    about what its workers do."""
    if args["num_workers"] > 0 and start_method(args) == "fork" \
            and ctx.fork_failed is not None:
        return _away_from_fork(fork_after_cuda, args, ctx,
                               "a forked worker touched CUDA, which this process had "
                               "initialised: %s" % ctx.fork_failed.what())


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
      versions=("every supported torch; spawn (macOS, Windows) and forkserver (Linux "
                "from Python 3.14)"),
      rewrite=LOCAL_FUNCTION_REWRITE,
      at="dataloader.iter",
      notebook_fix=NOTEBOOK_FIX)
def local_function_to_workers(args, ctx):
    if not _spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    if plan.failures:
        return None  # the ladder (DL201) takes the loader elsewhere
    workers = number_of(args["num_workers"], "worker")
    found = [local_function_to_workers.rule.finding(
        {part: args[part]}, {part: new}, why, strategy="by-value",
        done="%s (%s) sent by value to %s" % (part, what_is(args[part]), workers))
        for part, (new, why) in plan.by_value.items()]
    if plan.nested:
        from ..remedies import byvalue

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
      versions=("every supported torch; spawn (macOS, Windows) and forkserver (Linux "
                "from Python 3.14)"),
      at="dataloader.iter",
      notebook_fix=NOTEBOOK_FIX)
def interactive_main_class(args, ctx):
    if not _spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    if plan.failures or ((plan.by_value or plan.nested) and not ctx.found("DL202")):
        return None
    from ..remedies import byvalue

    return [interactive_main_class.rule.finding(
        {"class": "%s at %s" % (cls.__qualname__, path)}, why=why, strategy="by-value",
        remedies=[lambda args, cls=cls: byvalue.register_by_value_class(cls)],
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
      at="dataloader.iter")
def thread_pool_to_spawned_workers(args, ctx):
    if not _spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    if not plan.pools or plan.failures:
        return None
    from ..remedies import pools

    return thread_pool_to_spawned_workers.rule.finding(
        {"thread pool": ", ".join(plan.pools)}, why="a pool does not travel to a "
        "spawned worker; each gets a new one of the same size", strategy="new pool per worker",
        remedies=[lambda args: pools.install_reducers()],
        done="%s (a thread pool) sent as a new, empty pool to each of %s" % (
            ", ".join(plan.pools), number_of(args["num_workers"], "worker")))


@rule("DL201", "unpicklable-dataset", GROUP,
      summary=("spawn/forkserver workers and a dataset that does not pickle (or whose "
               "class forwards attributes and so does not unpickle): the repair ladder "
               "(reopen read-only files per worker, map an mmap.mmap of a named file "
               "again in each worker with its access and position, share an anonymous "
               "one through one block of shared memory, rebuild forwarders from their "
               "attributes, send the user's locks nobody holds as new, unlocked ones, "
               "make logging handlers again from their file or stream; else fork; "
               "else, with no fork rung, build the dataset again in each worker from "
               "its constructor's arguments where a second build here gives the same "
               "state; else emulated workers)"),
      prevents=("TypeError: cannot pickle '_io.BufferedReader' object (also "
                "'sqlite3.Connection', 'mmap.mmap', h5py and lmdb handles, "
                "'_thread.lock', pyarrow's ParquetReader, 'builtins.safe_open', "
                "pandas' TextReader, a logging handler's lock); "
                "RecursionError in a worker unpickling a __getattr__ forwarder "
                "(DataLoader worker exited unexpectedly)"),
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
      at="dataloader.iter")
def unpicklable_dataset(args, ctx):
    if not _spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    if plan.failures:
        return _fallback(unpicklable_dataset, args, ctx, None)
    needed = {"DL202": plan.by_value or plan.nested, "DL203": plan.classes,
              "DL208": plan.pools}
    if any(need and not ctx.found(code) for code, need in needed.items()):
        return None  # its own repair was turned off (AUTOSAFE_TORCH_DISABLE): torch's error stands
    if not (plan.files or plan.maps or plan.forwarders or plan.locks or plan.handlers
            or plan.images or plan.rebuilt):
        return None
    from ..inspection import roundtrip
    from ..remedies import handlers, images, locks, memmaps, pickling, rebuild, reopen

    whys, remedies, done, before, repairs = [], [], [], {}, []
    if plan.files:
        path, why, held = plan.files
        files = _read_only_files(args) or [(path, held)]
        before["files"] = [where for where, _f in files]
        whys += [why] + ["%s %s" % (where, note) for where, f in files
                         for note in [reopen.read_only_note(f)] if note]
        remedies.append(lambda args: reopen.install_reducers())
        done.append("%s reopened by path" % _named(files))
        repairs.append("reopen read-only files by path")
    if plan.maps:
        path, why, held = plan.maps
        maps = _memory_maps(args) or [(path, held)]
        before["maps"] = [where for where, _m in maps]
        whys.append(why)
        remedies.append(lambda args: pickling.install(memmaps.map_reducers()))
        named = [(where, m) for where, m in maps if not memmaps.anonymous(m)]
        shared = [(where, m) for where, m in maps if memmaps.anonymous(m)]
        if named:
            done.append("%s mapped again from %s" % (
                _named(named), "its file" if len(named) == 1 else "their files"))
            repairs.append("map memory maps again by path")
        if shared:
            done.append("%s (anonymous) shared through one block of shared memory"
                        % _named(shared))
            repairs.append("share anonymous maps")
    if plan.handlers:
        before["handlers"] = [where for where, _h in plan.handlers]
        classes = {type(h) for _where, h in plan.handlers}
        whys.append("a logging handler's lock and stream do not pickle")
        remedies.append(lambda args, classes=classes:  # bound now: later blocks reuse the name
                        pickling.install(handlers.handler_reducers(classes)))
        done.append("%s made again from its file or stream" % _named(plan.handlers))
        repairs.append("make logging handlers again")
    if plan.images:
        before["images"] = [where for where, _why, _img in plan.images]
        whys += [why for _where, why, _img in plan.images]
        remedies.append(lambda args: images.install_reducers())
        done.append("%s opened again at its frame" % _named(
            [(where, img) for where, _why, img in plan.images]))
        repairs.append("open images again")
    if plan.rebuilt:
        before["rebuilt"] = [where for where, _d, _why in plan.rebuilt]
        classes = {type(d) for _where, d, _why in plan.rebuilt}
        whys += [why for _where, _d, why in plan.rebuilt]
        remedies.append(lambda args, classes=classes: pickling.install(rebuild.reducers(classes)))
        done.append("%s built again from its constructor's arguments (checked here: the "
                    "same state)" % _named([(where, d) for where, d, _why in plan.rebuilt]))
        repairs.append("build the dataset again")
    if plan.forwarders:
        classes = list(plan.forwarders)
        before["forwarders"] = list(plan.forwarders.values())
        whys.append("a worker's unpickling of %s recurses in its __getattr__ (it asks the "
                    "empty instance for __setstate__)" % ", ".join(plan.forwarders.values()))
        remedies.append(lambda args: pickling.install(pickling.forwarder_reducers(classes)))
        done.append("%s rebuilt from its attributes" % ", ".join(
            "%s (%s)" % (where, a_or_an(cls.__name__)) for cls, where in plan.forwarders.items()))
        repairs.append("rebuild attribute forwarders")
    if plan.locks:
        path, why, found = plan.locks
        before["locks"] = [where for where, _lock in found] or [path]
        whys.append(why)
        remedies.append(lambda args: pickling.install(locks.lock_reducers()))
        done.append("%s made anew, unlocked," % (_named(found) if found else path))
        repairs.append("new unlocked locks")
    return unpicklable_dataset.rule.finding(
        before, why="; ".join(whys),
        strategy="repair: %s in each worker" % " and ".join(repairs),
        remedies=remedies, fix=None if plan.files or plan.maps
        else roundtrip.IMAGE_FIX if plan.images and not (plan.rebuilt or plan.handlers)
        else REBUILD_FIX if plan.rebuilt or plan.handlers
        else LOCK_FIX if plan.locks and not plan.forwarders else FORWARDER_FIX,
        done="%s in each of %s" % (" and ".join(done), number_of(args["num_workers"], "worker")))


REBUILD_FIX = ("keep paths on the dataset and open files, readers and handlers lazily in "
               "__getitem__ (or in worker_init_fn), not in __init__")
LOCK_FIX = ("create locks lazily in __getitem__ or in worker_init_fn (or use "
            "multiprocessing's), not in __init__")
FORWARDER_FIX = ("let __getattr__ raise AttributeError for the names it does not forward: "
                 "unpickling asks the new, empty instance for __setstate__")


def _read_only_files(args):
    """``(path, file)`` for each read-only file the parts hold (the reducers
    reopen every one of them), as the sampling walk finds them."""
    from ..inspection import holdings, objwalk

    found, seen = [], set()
    for name in PARTS:
        for held in holdings.find_files(args[name], name, items=objwalk.SAMPLE_ITEMS) \
                if args[name] is not None else ():
            if held.kind == holdings.READONLY and id(held.obj) not in seen:
                seen.add(id(held.obj))
                found.append((held.path, held.obj))
    return found


def _memory_maps(args):
    """``(path, map)`` for each ``mmap.mmap`` the parts hold (the reducer maps
    every one of them again)."""
    import mmap

    return list(held_in_parts(args, lambda obj: type(obj) is mmap.mmap))


def held_in_parts(parts, wanted):
    """``(path, obj)`` for each object the loader's parts (``dataset``,
    ``collate_fn``, ``worker_init_fn``: a mapping) hold for which ``wanted(obj)``,
    once each, as the sampling walk finds them."""
    from ..inspection import holdings, objwalk

    seen = set()
    for name in PARTS:
        if parts[name] is None:
            continue
        for here, obj, _edge in objwalk.walk(parts[name], name, stop=holdings.stop_at,
                                             items=objwalk.SAMPLE_ITEMS):
            if id(obj) not in seen and wanted(obj):
                seen.add(id(obj))
                yield here, obj


def _named(items, most=3):
    """``dataset.a (an open file), dataset.b (an h5py Dataset) and 2 more``."""
    shown = ["%s (%s)" % (path, what_is(obj)) for path, obj in items[:most]]
    more = len(items) - most
    return ", ".join(shown) + (" and %d more" % more if more > 0 else "")


def fork_plan(args, ctx):
    """What forked workers of this loader would share, and what the fork rung
    does about it (``remedies.isolation.ForkPlan``), cached on ``ctx``. Empty
    for a dataset that reopens its files per process by itself. The one check
    for deciding and acting: the worker step applies the same plan."""
    from ..inspection import holdings, objwalk
    from ..remedies import isolation

    def make():
        if holdings.reopens_per_process(args["dataset"]):
            return isolation.ForkPlan()
        return isolation.plan(isolation.parts_of(args), items=objwalk.SAMPLE_ITEMS)

    return _per_parts(ctx, "fork_plans", args, make)


def _forking(args):
    return bool(args["num_workers"]) and start_method(args) == "fork"


def _owned(plan, by_dl212):
    """The handles and the unhandled entries of ``plan`` that are DL212's (native
    handles a forked child must not use: lmdb, captures) or DL207's (the rest)."""
    handles = [(held, note) for held, _args, note in plan.handles
               if bool(held.fork_unsafe) == by_dl212]
    unhandled = [(path, why) for path, why, fork_unsafe in plan.unhandled
                 if bool(fork_unsafe) == by_dl212]
    return handles, unhandled


@rule("DL207", "shared-file-offset", GROUP,
      summary=("fork workers (and the children of a fork server): every file the process "
               "holds open for reading gets a description of its own in each worker, at "
               "the offset it had, under the same descriptor, whoever holds it (a file "
               "object, a raw os.open() descriptor, a closure, a C library); an h5py "
               "file is reopened by path in each worker; files only written stay shared"),
      prevents=("silently wrong samples: forked workers share one file offset "
                "(zipfile.BadZipFile: Bad CRC-32, gzip.BadGzipFile, EOFError: Compressed "
                "file ended before the end-of-stream marker was reached, other records, "
                "half the rows of a csv.reader)"),
      fix="open the file in worker_init_fn or lazily in __getitem__",
      example=(("class Records(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.fh = open(path, 'rb')   # one offset, shared by forked "
                "workers\n"
                "    def __getitem__(self, i):\n"
                "        self.fh.seek(i * SIZE)\n"
                "        return self.fh.read(SIZE)"),
               ("def open_in_worker(worker_id):\n"
                "    ds = torch.utils.data.get_worker_info().dataset\n"
                "    ds.fh = open(ds.path, 'rb')\n"
                "\n"
                "DataLoader(Records(path), num_workers=2, worker_init_fn=open_in_worker)")),
      versions="every supported torch; fork workers (Linux's default before Python 3.14)",
      rewrite=LAZY_OPEN_REWRITE,
      at="dataloader.iter")
def shared_file_offset(args, ctx):
    if not _forking(args):
        return None
    plan = fork_plan(args, ctx)
    handles, unhandled = _owned(plan, by_dl212=False)
    if unhandled:
        return _away_from_fork(shared_file_offset, args, ctx, "; ".join(
            "%s %s" % item for item in unhandled), repairs=False)
    if not (plan.isolate or handles):
        return None  # what no object shows is privatized all the same, and said if used
    what = ["%s: own offset" % d.describe() for d in plan.isolate]
    what += ["%s: reopened by path%s" % (held.path, ", " + note if note else "")
             for held, note in handles]
    if plan.shared:
        what.append("left shared, open for writing: %s" % ", ".join(
            d.describe() for d in plan.shared))
    return shared_file_offset.rule.finding(
        {"files": [d.path for d in plan.isolate] + [held.path for held, _ in handles]},
        why="forked workers would share one offset per file; in each worker: %s"
        % "; ".join(what), strategy="own offset in each worker",
        state={"fork_handles": bool(handles)},
        done=_fork_done(plan.isolate, handles, plan.shared, args["num_workers"]))


def _fork_done(isolated, handles, shared, workers):
    """The log line of DL207/DL212: what each forked worker gets of its own."""
    each = number_of(workers, "forked worker")
    done = []
    if isolated:
        done.append("%s: own file offset in each of %s" % (
            ", ".join(d.path for d in isolated), each))
    if handles:
        done.append("%s reopened by path in each of %s" % (", ".join(
            "%s (%s)" % (held.path, held.fork_unsafe or what_is(held.obj))
            for held, _note in handles), each))
    if shared:
        done.append("left shared, open for writing: %s" % ", ".join(d.path for d in shared))
    return "; ".join(done)


@rule("DL212", "handle-not-fork-safe", GROUP,
      summary=("fork workers and a dataset holding a native handle a forked child must "
               "not use: an lmdb environment (reopened read-only) or a cv2.VideoCapture "
               "of a file is reopened by path in each worker (the capture at the same "
               "frame); a capture that cannot be reopened (a camera, a stream): spawn "
               "where everything pickles, else emulated workers"),
      prevents=("forked workers that hang in cv2.VideoCapture.read() once the parent has "
                "decoded (RuntimeError: DataLoader timed out after N seconds, or "
                "forever); an lmdb environment used after fork, which LMDB forbids "
                "(segfaults, readers registered under the parent's pid)"),
      fix="open the environment or capture in worker_init_fn or lazily in __getitem__",
      example=(("class Frames(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.env = lmdb.open(path, readonly=True)   # used after fork"),
               ("class Frames(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.path, self.env = path, None\n"
                "    def __getitem__(self, i):\n"
                "        if self.env is None:\n"
                "            self.env = lmdb.open(self.path, readonly=True)\n"
                "        ...")),
      versions="every supported torch; fork workers",
      at="dataloader.iter")
def handle_not_fork_safe(args, ctx):
    if not _forking(args):
        return None
    handles, unhandled = _owned(fork_plan(args, ctx), by_dl212=True)
    if unhandled:
        return _away_from_fork(handle_not_fork_safe, args, ctx, "a forked worker must not "
                               "use the parent's handle, and it cannot be reopened: %s"
                               % "; ".join("%s %s" % item for item in unhandled),
                               repairs=False)
    if not handles:
        return None
    return handle_not_fork_safe.rule.finding(
        {"handles": [held.path for held, _note in handles]},
        why="a forked worker must not use the parent's %s" % ", ".join(
            "%s (%s)%s" % (held.path, held.fork_unsafe, ", " + note if note else "")
            for held, note in handles),
        strategy="reopen in each worker", state={"fork_handles": True},
        done=_fork_done((), handles, (), args["num_workers"]))


# -- what the workers report as they exit (``dataloader.outcome``) -----------------
#
# ``ctx.usage`` (``remedies.isolation.Usage``): the files the workers read
# through a description of their own; ``ctx.workers``: how many; ``ctx.named``:
# whether DL207 already named the loader's files. A record of what held.


def _used(usage, how):
    from ..remedies import isolation

    return sorted((fd, name) for name, fd in usage.used.get(getattr(isolation, how), {}).items())


def _files(used):
    return ", ".join("%s (fd %d)" % (name, fd) for fd, name in used)


@shared_file_offset.rule.check_at("dataloader.outcome")
def read_through_no_object(args, ctx):
    """What forked workers read through a description of their own that no
    object of the loader's named (a raw descriptor, a closure, a C library),
    or that a fork server opened (its children share it otherwise)."""
    forked = [] if ctx.named else _used(ctx.usage, "FORKED")
    server = _used(ctx.usage, "SERVER")
    if not (forked or server):
        return None
    done = []
    if forked:
        done.append("%s: own file offset in each of %s, which read it through no object "
                    "the shim can name" % (_files(forked),
                                           number_of(ctx.workers, "forked worker")))
    if server:
        done.append("%s, opened by the fork server: own file offset in each of %s" % (
            _files(server), number_of(ctx.workers, "worker")))
    return read_through_no_object.rule.finding(
        {"files": [name for _fd, name in forked + server]},
        why="the workers read these files, which forked workers would share one offset "
        "of", strategy="own offset in each worker", state={"privatized": True},
        done="; ".join(done))


@rule("DL217", "descriptor-to-workers", GROUP,
      summary=("spawn/forkserver workers of a dataset that reads a file through a "
               "descriptor of the training process, by its number (a raw os.open(), a "
               "library that keeps one): the descriptor reaches each worker under its "
               "number, at its own offset"),
      prevents=("OSError: [Errno 9] Bad file descriptor (or [Errno 29] Illegal seek) in "
                "a worker, or another file read without an error under that number (a "
                "forkserver worker's /dev/null)"),
      fix=("keep the path on the dataset and open the file in the process that reads it "
           "(lazily in __getitem__, or in worker_init_fn)"),
      example=(("class Records(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.fd = os.open(path, os.O_RDONLY)   # a number: spawn "
                "workers have no fd\n"
                "    def __getitem__(self, i):\n"
                "        os.lseek(self.fd, i * SIZE, os.SEEK_SET)\n"
                "        return os.read(self.fd, SIZE)"),
               ("class Records(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.path, self.fd = path, None\n"
                "    def __getitem__(self, i):\n"
                "        if self.fd is None:\n"
                "            self.fd = os.open(self.path, os.O_RDONLY)   # in each "
                "worker\n"
                "        os.lseek(self.fd, i * SIZE, os.SEEK_SET)\n"
                "        return os.read(self.fd, SIZE)")),
      versions=("every supported torch; spawn workers (macOS, Windows) and forkserver "
                "workers (Linux from Python 3.14)"),
      at="dataloader.outcome")
def descriptor_to_workers(args, ctx):
    """The carried descriptors the workers read (the offset moved), and those
    whose number the loader's parts hold, read or not (``os.pread`` moves no
    offset); the others were carried too, but nothing shows a worker used them."""
    from ..remedies import isolation

    usage = ctx.usage
    held = {fd: (name, usage.by_number[fd])
            for name, fd in usage.private.get(isolation.CARRIED, {}).items()
            if fd in usage.by_number}
    moved = [(fd, name) for fd, name in _used(usage, "CARRIED") if fd not in held]
    if not (held or moved):
        return None
    named = ["%s: %s (fd %d)" % (where, name, fd) for fd, (name, where) in sorted(held.items())]
    if moved:
        named.append(_files(moved))
    return descriptor_to_workers.rule.finding(
        {"files": [name for name, _where in held.values()] + [name for _fd, name in moved]},
        why="the workers read these descriptors of the training process by number; "
        "spawn workers have none of them", strategy="carried to each worker",
        state={"carried": True},
        done="%s, read by number: carried to each of %s, at its own offset" % (
            ", ".join(named), number_of(ctx.workers, "worker")))


@thread_pool_to_spawned_workers.rule.check_at("dataloader.iter")
def thread_pool_under_fork(args, ctx):
    from ..inspection import holdings
    from ..remedies import pools
    from ..remedies.workerinit import with_step

    if not args["num_workers"] or start_method(args) != "fork":
        return None
    used = [here for here, pool, _edge in holdings.find_thread_pools(args["dataset"])
            if holdings.thread_pool_in_use(pool)]
    if not used:
        return None
    init = with_step(args["worker_init_fn"], pools.rebuild_pools_in_worker)
    if init is args["worker_init_fn"]:
        return None
    return thread_pool_under_fork.rule.finding(
        {"worker_init_fn": args["worker_init_fn"]}, {"worker_init_fn": init},
        "the pool at %s has threads in this process; a forked worker would inherit it "
        "without them and wait forever on its first submit()" % ", ".join(used),
        strategy="new pool per worker",
        done="%s (a thread pool) made anew, empty, in each of %s" % (
            ", ".join(used), number_of(args["num_workers"], "forked worker")))


# -- what it takes to pickle the loader's parts ---------------------------------

class PicklingPlan:
    """The repairs that make a loader's parts reach spawn/forkserver workers.

    ``by_value``: part name -> (the part sent by value, why) for a lambda or
    local function as collate_fn/worker_init_fn (DL202); ``nested``: (path,
    why) of the first function or class inside a part that a worker cannot
    import, when all such go by value (DL202); ``classes``: class ->
    (path, why) for classes of an interactive ``__main__`` (DL203); ``files``:
    (path, why, the file) of the first read-only file, when files travel by path (DL201);
    ``maps``: (path, why, the map) of the first ``mmap.mmap``, when maps of
    named files are mapped again in each worker (DL201);
    ``pools``: paths of thread pools, sent as new ones (DL208);
    ``locks``: (path, why, the user's locks as ``UsersLocks.named``) of the
    first lock nobody holds, when such locks are sent as new, unlocked ones
    (DL201);
    ``forwarders``: class -> path of the first instance of a class that
    forwards unknown attributes, whose unpickling would recurse, built from
    its attributes instead (DL201); ``handlers``: ``(path, handler)`` of
    logging handlers made again in each worker from their file or stream
    (DL201); ``images``: ``(path, why, image)`` of PIL images whose pickle
    would drop their open file, opened again at their frame in each worker
    (DL201); ``rebuilt``: ``(path, dataset, why)`` of datasets built again in
    each worker from their constructor's arguments, where no fork rung is
    safe (DL201, ``remedies/rebuild.py``), and ``refused``: why a dataset
    could not be; ``failures``: what still does not pickle with all of
    these (ProbeResults).
    """

    __slots__ = ("by_value", "nested", "classes", "files", "maps", "pools", "forwarders",
                 "locks", "handlers", "images", "rebuilt", "refused", "failures")

    def __init__(self):
        self.by_value, self.classes, self.failures, self.pools = {}, {}, [], []
        self.forwarders, self.handlers, self.rebuilt, self.refused = {}, [], [], []
        self.images = []
        self.nested = self.files = self.maps = self.locks = None

    @property
    def needs_repair(self):
        return bool(self.by_value or self.nested or self.classes or self.files or self.maps
                    or self.pools or self.forwarders or self.locks or self.handlers
                    or self.images or self.rebuilt)


PARTS = ("dataset", "collate_fn", "worker_init_fn")
MAX_REPAIRS = 16  # one failure is found per probe; a dataset has few kinds


def pickling_plan(args, ctx):
    """The ``PicklingPlan`` for ``args``, cached on ``ctx`` (planning installs
    nothing: the probe tries the planned reducers without registering them)."""
    return _per_parts(ctx, "pickling_plans", args,
                      lambda: _plan_pickling({name: args[name] for name in PARTS},
                                             lambda: not _fork_is_safe(args, ctx)))


def _per_parts(ctx, name, args, make):
    """``make()``, once per check context ``ctx`` and loader parts (by identity),
    kept in ``ctx`` under ``name``: the checks of one iteration share a plan."""
    key = tuple(id(args[part]) for part in PARTS)
    cache = ctx.plans.setdefault(name, {})
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _plan_pickling(parts, may_rebuild=lambda: False, rebuilt=()):
    """The plan for ``parts``. ``may_rebuild()``: whether datasets may be
    built again in each worker (no fork rung is safe); ``rebuilt``: those
    approved so far, planned first (planning starts again after each one, so
    that nothing inside them is planned for)."""
    from ..inspection import holdings, probe
    from ..inspection.mainmodule import interactive_main
    from ..remedies import (byvalue, handlers, images, locks, memmaps, pickling, pools,
                            rebuild, reopen)

    given, parts = parts, dict(parts)  # by-value repairs replace parts in this copy
    plan, planned, owners = PicklingPlan(), {}, None
    plan.rebuilt = list(rebuilt)
    if plan.rebuilt:
        planned.update(rebuild.reducers({type(obj) for _path, obj, _why in plan.rebuilt}))
    if parts["dataset"] is not None:
        plan.pools = [here for here, _pool, _edge in holdings.find_thread_pools(parts["dataset"])
                      if not _inside(here, plan.rebuilt)]
        if plan.pools:
            planned.update(pools.pool_reducers())
    # What a dataset built again in each worker holds is made by its constructor there.
    plan.forwarders = {cls: here for cls, here in attribute_forwarders(parts).items()
                       if not _inside(here, plan.rebuilt)}
    if plan.forwarders:
        planned.update(pickling.forwarder_reducers(plan.forwarders))
    for _ in range(MAX_REPAIRS):
        failures = [r for name, part in parts.items() if part is not None
                    for r in [probe.probe(part, name, planned, plan.nested is not None)]
                    if not r.ok]
        if not failures:
            failures = _unfaithful(parts, planned, plan)
            if not failures:
                return plan
            if not plan.images and all(images.reopens(f.value) for f in failures):
                plan.images = [(f.path, f.error, f.value) for f in failures]
                planned.update(images.image_reducers())
                continue
        failure = failures[0]
        value, top = failure.value, failure.path.split(".")[0].split("[")[0]
        new = _by_value(parts.get(top), value) if top in ("collate_fn", "worker_init_fn") \
            else None
        cls = value if is_a(value, type) else type(value)
        why = "%s: %s" % (failure.path, failure.error)
        if owners is None:
            owners = objwalk.Owners(parts)
        handler = handlers.holding(owners, value)
        if new is not None:
            plan.by_value[top] = (new, why)
            parts[top] = new
        elif handler is not None and handler[1] not in [h for _p, h in plan.handlers]:
            plan.handlers.append(handler)
            planned.update(handlers.handler_reducers({type(handler[1])}))
        elif holdings.file_kind(value) == holdings.READONLY and plan.files is None:
            plan.files = (failure.path, failure.error, value)
            planned.update(reopen.file_reducers())
        elif plan.maps is None and memmaps.travels(value):
            plan.maps = (failure.path, failure.error, value)
            planned.update(memmaps.map_reducers())
        elif plan.locks is None and locks.unheld_lock(value) \
                and (users := locks.UsersLocks(parts)).holds(value):
            plan.locks = (failure.path, failure.error, users.named)
            planned.update(locks.lock_reducers())
        elif cls.__module__ == "__main__" and interactive_main() and cls not in plan.classes:
            plan.classes[cls] = (failure.path, failure.error)
            planned.update(byvalue.class_reducers((cls,)))
        elif plan.nested is None and _not_importable(value):
            plan.nested = (failure.path, why)
        elif may_rebuild() and len(plan.rebuilt) < MAX_REPAIRS:
            here, dataset, refusal = rebuild.approved_owner(owners, value)
            if dataset is None:
                plan.refused += [refusal] if refusal else []
                plan.failures = failures
                return plan
            return _plan_pickling(given, may_rebuild, plan.rebuilt + [(here, dataset, why)])
        else:
            plan.failures = failures
            return plan
    plan.failures = failures
    return plan


def _unfaithful(parts, planned, plan):
    """What pickles but loses an open file its methods use (a PIL multi-page
    image: ``inspection/roundtrip.py``), outside the datasets built again in
    each worker (their reducer is left out of the round trip: it would build
    them here)."""
    from ..inspection import roundtrip
    from ..remedies import rebuild

    table = {cls: reducer for cls, reducer in planned.items()
             if reducer is not rebuild.reduce_rebuilt}
    return [f for f in roundtrip.unfaithful(parts, table) if not _inside(f.path, plan.rebuilt)]


def _inside(path, rebuilt):
    """Whether ``path`` lies in one of the datasets ``rebuilt`` (``(path, dataset, why)``)."""
    return any(path == where or path.startswith((where + ".", where + "["))
               for where, _dataset, _why in rebuilt)


def attribute_forwarders(parts):
    """``{class: path}``: classes of the parts' objects that forward unknown
    attributes (``holdings.forwards_attributes``), each at its first instance."""
    from ..inspection import holdings

    found = {}
    for here, obj in held_in_parts(parts, holdings.forwards_attributes):
        found.setdefault(type(obj), here)
    return found


def _not_importable(value):
    """A function or class a worker cannot import (a lambda, a local function or
    class), or an instance of such a class: cloudpickle can send it by value."""
    from ..inspection.mainmodule import importable_by_reference

    if is_a(value, (types.FunctionType, type)):
        return not importable_by_reference(value)
    cls = type(value)
    return "<locals>" in cls.__qualname__ or (
        cls.__module__ == "__main__" and not importable_by_reference(cls))


def _by_value(part, failing):
    """``part`` (a collate_fn or worker_init_fn) with ``failing``, the function
    that does not pickle, sent by value; None when ``failing`` is not that
    function nor the user's own inside a worker_init_fn of ours."""
    from ..remedies import byvalue, workerinit

    if failing is part and callable(part):
        return byvalue.by_value(part)
    if failing is workerinit.user_function(part) and callable(failing):
        return workerinit.with_user_function(part, byvalue.by_value(failing))
    return None


# -- rungs 2-3: another start method, emulated workers ---------------------------

def _fork_is_safe(args, ctx):
    """Rung 2: fork, where this platform allows it and the fork rung's remedies
    handle everything forked workers would share: read-only files get their
    own offsets and native handles are reopened (DL207, DL212: the plan their
    worker step applies), thread pools are rebuilt (DL208). Not for a lock
    held now or a live thread, which a forked child cannot inherit, nor for
    a loader whose forked workers were seen to fail (``ctx.fork_failed``).
    CUDA initialised in this process is no reason: forked workers that do not
    touch it run, and those that do are recovered (DL205)."""
    import multiprocessing

    from ..inspection import holdings

    if ctx.facts.platform not in SAFE_FORK_PLATFORMS or ctx.fork_failed is not None:
        return False
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    if fork_plan(args, ctx).unhandled:
        return False
    return not holdings.fork_blockers(args["dataset"])


def _fallback(check, args, ctx, why):
    """Rungs 2-4 for a loader that cannot start as asked."""
    fix, reason, refused = None, why, []
    if why is None:
        failures, refused = pickling_plan(args, ctx).failures, pickling_plan(args, ctx).refused
        why = "; ".join(["%s: %s" % (f.path, f.error) for f in failures] + refused) \
            or "does not pickle"
        fix = failures and (getattr(failures[0], "fix", None)
                            or permanent_fix(failures[0].value))
        reason = failures and ("%s: %s" % (failures[0].path, failures[0].error)
                               if getattr(failures[0], "fix", None) else
                               "%s (%s) does not pickle" % (failures[0].path,
                                                             what_is(failures[0].value))) or why
    if _fork_is_safe(args, ctx):
        return check.rule.finding({"multiprocessing_context": start_method(args)},
                                  {"multiprocessing_context": "fork"}, why,
                                  strategy="start method: fork", fix=fix,
                                  done="workers started by fork instead of %s: %s" % (
                                      start_method(args), reason))
    found = emulated_workers(check, args, why, fix, reason)
    if refused:  # said where emulated workers cannot copy it either (NoExactRung)
        found.state["not_rebuilt"] = "; ".join(refused)
    return found


def _away_from_fork(check, args, ctx, why, repairs=True):
    """Spawn where everything pickles, else emulated workers. ``repairs``:
    whether the repairs that make it pickle can still be made (the checks
    that make them, DL201-DL203 and DL208, run before DL207 and DL212)."""
    plan = pickling_plan(args, ctx)
    if ctx.main_guarded() and not plan.failures and (repairs or not plan.needs_repair):
        return check.rule.finding({"multiprocessing_context": "fork"},
                                  {"multiprocessing_context": "spawn"}, why,
                                  strategy="start method: spawn",
                                  done="workers started by spawn instead of fork: " + why)
    return emulated_workers(check, args, why)


def permanent_fix(value):
    """The fix for what made a dataset unpicklable, by what it is."""
    from ..inspection import holdings

    if holdings.thread_pool_in_use(value) is not None:
        return "create the pool lazily in __getitem__ or in worker_init_fn, not in __init__"
    if holdings.threading_kind(value) is not None:
        return ("create locks and threads lazily in __getitem__ or in worker_init_fn "
                "(or use multiprocessing's), not in __init__")
    if is_a(value, types.GeneratorType):
        return "keep no generator on the dataset: make it in __iter__ or __getitem__"
    if holdings.is_file_object(value) or type(value).__name__ == "Connection":
        return "open files and connections lazily in __getitem__ (or in worker_init_fn)"
    return None
