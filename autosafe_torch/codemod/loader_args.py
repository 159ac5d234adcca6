"""DL101, DL102, DL103, DL107: arguments that only make sense with workers;
DL105: pin_memory without an accelerator (what it writes, and where it would
not be exact: ``rules.loader_args.WORKER_ARGUMENT_REWRITE``).
"""

import libcst as cst

from .records import NOT_EXACT, REWRITTEN, NotExact
from .source import DATALOADER, LOADER_POSITIONAL, atom, both, find_arg, simple, unstarred

WORKER_ONLY = {"DL101": "prefetch_factor", "DL102": "persistent_workers",
               "DL103": "multiprocessing_context", "DL107": "timeout"}


def rewrite(source, records):
    calls = source.calls_at(records[0].line, DATALOADER)
    if not calls:
        raise NotExact("no DataLoader(...) call at this line")
    call = unstarred(calls[0])
    workers = find_arg(call, "num_workers", LOADER_POSITIONAL)
    workers = workers[1].value if workers else None
    return [_pin_memory(source, call, r) if r.code == "DL105"
            else _worker_only(source, call, workers, r) for r in records]


def _worker_only(source, call, workers, record):
    name = WORKER_ONLY[record.code]
    found = find_arg(call, name, LOADER_POSITIONAL)
    given = record.after.get(name)  # the run's value without workers, if a Python literal
    default = repr(given) if given is None or isinstance(given, (bool, int, float, str)) else None
    if found is None:
        return record, NOT_EXACT, "%s is not written at the call" % name
    if default is None:
        return record, NOT_EXACT, "the value the run gave %s is not a literal" % name
    value = found[1].value
    if workers is None or (isinstance(workers, cst.Integer) and workers.value == "0"):
        if found[1].keyword is not None:
            source.set_arg(call, name, None)
            done = "%s removed: this loader has no workers" % name
        else:
            source.set_arg(call, name, cst.parse_expression(default))
            done = "%s=%s: this loader has no workers" % (name, default)
    elif simple(workers):
        new = cst.Comparison(left=atom(workers), comparisons=[  # num_workers > 0
            cst.ComparisonTarget(cst.GreaterThan(), cst.Integer("0"))])
        if record.code != "DL102" or not (isinstance(value, cst.Name) and value.value == "True"):
            new = cst.IfExp(test=new, body=atom(value), orelse=cst.parse_expression(default))
        source.set_arg(call, name, new)
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
    source.set_arg(call, "pin_memory", new)
    source.comment(call, "DL105: pin_memory only with CUDA")
    return record, REWRITTEN, "pin_memory=%s" % source.code(new)
