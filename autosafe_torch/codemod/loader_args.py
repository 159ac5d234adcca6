"""DL101, DL102, DL103, DL107: arguments that only make sense with workers;
DL105: pin_memory without an accelerator.

The log names the ``DataLoader(...)`` call. An argument the run reset
becomes conditional on the call's own ``num_workers`` expression, with the
value the run gave it when there were none::

    prefetch_factor=4                 ->  prefetch_factor=4 if NUM_WORKERS > 0 else None
    persistent_workers=True           ->  persistent_workers=NUM_WORKERS > 0
    pin_memory=True                   ->  pin_memory=torch.cuda.is_available()

Where the call gives no ``num_workers`` (or 0), the argument can only fail,
and it goes. Exact only where ``num_workers`` reads the same twice and does
nothing else (a name, an attribute, a literal): a computed one is left as a
comment.
"""

import libcst as cst

from .records import NOT_EXACT, REWRITTEN
from .source import (DATALOADER, LOADER_POSITIONAL, both, find_arg, has_star, if_else,
                     literal, remove_arg, set_arg_value, simple, workers_test)

WORKER_ONLY = {"DL101": "prefetch_factor", "DL102": "persistent_workers",
               "DL103": "multiprocessing_context", "DL107": "timeout"}


def _with_arg(name, change):
    """An edit of the call: ``change(call, index, arg)`` on the argument ``name``."""
    def edit(call):
        found = find_arg(call, name, LOADER_POSITIONAL)
        return change(call, *found) if found else call
    return edit


def rewrite(source, records):
    calls = source.calls_at(records[0].line, DATALOADER)
    if not calls:
        return [(r, NOT_EXACT, "no DataLoader(...) call at this line") for r in records]
    call = calls[0]
    if has_star(call):
        return [(r, NOT_EXACT, "the call passes arguments by * or **") for r in records]
    workers = find_arg(call, "num_workers", LOADER_POSITIONAL)
    workers = workers[1].value if workers else None
    return [_pin_memory(source, call, r) if r.code == "DL105"
            else _worker_only(source, call, workers, r) for r in records]


def _worker_only(source, call, workers, record):
    name = WORKER_ONLY[record.code]
    found = find_arg(call, name, LOADER_POSITIONAL)
    default = literal(record.after.get(name))
    if found is None:
        return record, NOT_EXACT, "%s is not written at the call" % name
    if default is None:
        return record, NOT_EXACT, "the value the run gave %s is not a literal" % name
    value = found[1].value
    if workers is None or (isinstance(workers, cst.Integer) and workers.value == "0"):
        if found[1].keyword is not None:
            source.edit(call, _with_arg(name, lambda c, i, a: remove_arg(c, i)))
            done = "%s removed: this loader has no workers" % name
        else:
            source.edit(call, _with_arg(name, lambda c, i, a: set_arg_value(
                c, i, cst.parse_expression(default))))
            done = "%s=%s: this loader has no workers" % (name, default)
    elif simple(workers):
        if record.code == "DL102" and isinstance(value, cst.Name) and value.value == "True":
            new = workers_test(workers)
        else:
            new = if_else(value, workers_test(workers), cst.parse_expression(default))
        source.edit(call, _with_arg(name, lambda c, i, a: set_arg_value(c, i, new)))
        done = "%s=%s" % (name, source.code(new))
    else:
        return record, NOT_EXACT, ("num_workers is computed at the call (%s); give it a "
                                   "name first" % source.code(workers))
    source.comment(call, "%s: %s only with workers" % (record.code, name))
    return record, REWRITTEN, done


def _pin_memory(source, call, record):
    found = find_arg(call, "pin_memory", LOADER_POSITIONAL)
    if found is None:
        return record, NOT_EXACT, "pin_memory is not written at the call"
    value = found[1].value
    cuda = cst.parse_expression("%s.cuda.is_available()" % source.module_name("torch"))
    new = cuda if isinstance(value, cst.Name) and value.value == "True" else both(value, cuda)
    source.edit(call, _with_arg("pin_memory", lambda c, i, a: set_arg_value(c, i, new)))
    source.comment(call, "DL105: pin_memory only with CUDA")
    return record, REWRITTEN, "pin_memory=%s" % source.code(new)
