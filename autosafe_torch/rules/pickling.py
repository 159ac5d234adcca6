"""What travels to spawn/forkserver workers: DL202, DL203, DL208 and DL201.

Each reads the one pickling plan (``pickling_plan.py``) and says its part of
the repairs; where the plan leaves something that does not pickle, DL201
hands the loader to the ladder (``ladder.py``).
"""

import mmap

from ..inspection import holdings
from ..inspection.parts import PARTS
from ..rung import Rung
from . import Rewrite, a_or_an, number_of, rule, what_is
from .ladder import GROUP, SENT_TO_SPAWN, fallback, spawning_workers
from .pickling_plan import held_in_parts, pickling_plan

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
    if not spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    if plan.failures:
        return None  # the ladder (DL201) takes the loader elsewhere
    workers = number_of(args["num_workers"], "worker")
    found = [local_function_to_workers.rule.finding(
        {part: args[part]}, {part: new}, why, strategy="by-value", state=SENT_TO_SPAWN,
        done="%s (%s) sent by value to %s" % (part, what_is(args[part]), workers))
        for part, (new, why) in plan.by_value.items()]
    if plan.nested:
        from ..remedies import byvalue  # noqa: PLC0415 - only for a function sent by value

        path, why = plan.nested
        found.append(local_function_to_workers.rule.finding(
            {"function": path}, why=why, strategy="by-value", state=SENT_TO_SPAWN,
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
    if not spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    if plan.failures or ((plan.by_value or plan.nested) and not ctx.found("DL202")):
        return None
    from ..remedies import byvalue  # noqa: PLC0415 - only for a function sent by value

    return [interactive_main_class.rule.finding(
        {"class": "%s at %s" % (cls.__qualname__, path)}, why=why, strategy="by-value",
        state=SENT_TO_SPAWN, remedies=[lambda args, cls=cls: byvalue.register_by_value_class(cls)],
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
    if not spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    if not plan.pools or plan.failures:
        return None
    from ..remedies import pools  # noqa: PLC0415 - only for a dataset that holds a pool

    return thread_pool_to_spawned_workers.rule.finding(
        {"thread pool": ", ".join(plan.pools)}, why="a pool does not travel to a "
        "spawned worker; each gets a new one of the same size", strategy="new pool per worker",
        state=SENT_TO_SPAWN, remedies=[lambda args: pools.install_reducers()],
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
               "else, with no fork rung, build the dataset again in each worker by the "
               "call that built it (recorded, never run here), each worker checking "
               "that it opened the same files in the same order and holds the same "
               "values; else emulated workers)"),
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
    if not spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    if plan.failures:
        return fallback(unpicklable_dataset, args, ctx, None)
    needed = {"DL202": plan.by_value or plan.nested, "DL203": plan.classes,
              "DL208": plan.pools}
    if any(need and not ctx.found(code) for code, need in needed.items()):
        return None  # its own repair was turned off (AUTOSAFE_TORCH_DISABLE): torch's error stands
    if not (plan.files or plan.maps or plan.forwarders or plan.locks or plan.handlers
            or plan.images or plan.rebuilt):
        return None
    from ..inspection import dropped  # noqa: PLC0415 - when a loader needs it, not at torch's import
    from ..remedies import handlers, images, locks, memmaps, pickling, rebuild, reopen  # noqa: PLC0415 - when a loader needs it, not at torch's import

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
        whys += [why for _where, _d, why in plan.rebuilt]
        datasets = [d for _where, d, _why in plan.rebuilt]
        remedies.append(lambda args, datasets=datasets: rebuild.install(datasets))
        done.append("%s built again by its constructor's call, checked against this one "
                    "there," % _named([(where, d) for where, d, _why in plan.rebuilt]))
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
        rung=Rung.REBUILT if plan.rebuilt else None,
        state=dict(SENT_TO_SPAWN, _rebuilt=[d for _where, d, _why in plan.rebuilt])
        if plan.rebuilt else SENT_TO_SPAWN,
        remedies=remedies,
        fix=None if plan.files or plan.maps
        else dropped.IMAGE_FIX if plan.images and not (plan.rebuilt or plan.handlers)
        else REBUILD_FIX if plan.rebuilt or plan.handlers
        else LOCK_FIX if plan.locks and not plan.forwarders else FORWARDER_FIX,
        done="%s in each of %s" % (" and ".join(done), number_of(args["num_workers"], "worker")))


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
      versions=("every supported torch; spawn (macOS, Windows) and forkserver (Linux "
                "from Python 3.14)"),
      at="dataloader.iter")
def logging_config_to_workers(args, ctx):
    if not spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    if plan.failures or not plan.loggers:
        return None
    from ..remedies import loggers, pickling  # noqa: PLC0415 - when a loader needs it, not at torch's import

    found = list(plan.loggers)
    names = ", ".join(repr(lg.name) for lg in found)
    handlers = sum(len(link.handlers) for lg in found for link in loggers.chain(lg))
    return logging_config_to_workers.rule.finding(
        {"loggers": [lg.name for lg in found]},
        why="a logger pickles by its name: a spawned worker's has none of this process's "
        "handlers, levels or filters", strategy="carry logging configuration",
        state=dict(SENT_TO_SPAWN, _loggers=True),
        remedies=[lambda args: pickling.install(loggers.reducers(found))],
        done="the logger%s %s carried to each of %s with the configuration its records meet "
        "(%s)" % ("s" if len(found) > 1 else "", names, number_of(args["num_workers"], "worker"),
                  number_of(handlers, "handler")))


REBUILD_FIX = ("keep paths on the dataset and open files, readers and handlers lazily in "
               "__getitem__ (or in worker_init_fn), not in __init__")
LOCK_FIX = ("create locks lazily in __getitem__ or in worker_init_fn (or use "
            "multiprocessing's), not in __init__")
FORWARDER_FIX = ("let __getattr__ raise AttributeError for the names it does not forward: "
                 "unpickling asks the new, empty instance for __setstate__")


def _read_only_files(args):
    """``(path, file)`` for each read-only file the parts hold (the reducers
    reopen every one of them), as the walk finds them."""
    found, seen = [], set()
    for name in PARTS:
        for held in holdings.find_files(args[name], name) \
                if args[name] is not None else ():
            if held.kind == holdings.READONLY and id(held.obj) not in seen:
                seen.add(id(held.obj))
                found.append((held.path, held.obj))
    return found


def _memory_maps(args):
    """``(path, map)`` for each ``mmap.mmap`` the parts hold (the reducer maps
    every one of them again)."""
    return list(held_in_parts(args, lambda obj: type(obj) is mmap.mmap))


def _named(items, most=3):
    """``dataset.a (an open file), dataset.b (an h5py Dataset) and 2 more``."""
    shown = ["%s (%s)" % (path, what_is(obj)) for path, obj in items[:most]]
    more = len(items) - most
    return ", ".join(shown) + (" and %d more" % more if more > 0 else "")

