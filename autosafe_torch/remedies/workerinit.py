"""Code that must run inside every DataLoader worker, under every start method.

Setting something in the parent does not reach spawn/forkserver workers, so
rules inject a ``worker_init_fn``. It must pickle: never a closure or a
wrapt proxy, but a ``functools.partial`` of the module-level ``_run`` over
picklable steps, which then calls the user's own ``worker_init_fn``.
Several rules may add steps to one loader; they are merged, never nested.
"""

import functools


def _run(steps, user_fn, worker_id):
    for step in steps:
        step(worker_id)
    if user_fn is not None:
        user_fn(worker_id)


def with_step(worker_init_fn, step, first=False):
    """A worker_init_fn that runs ``step(worker_id)`` after the steps it has
    (``first``: before them), then the original.

    ``step`` must be a module-level function (or a partial of one). Adding a
    step that is already there changes nothing.
    """
    if isinstance(worker_init_fn, functools.partial) and worker_init_fn.func is _run:
        steps, user_fn = worker_init_fn.args
        if step in steps:
            return worker_init_fn
        return functools.partial(_run, (step,) + steps if first else steps + (step,), user_fn)
    return functools.partial(_run, (step,), worker_init_fn)


def user_function(worker_init_fn):
    """The user's own worker_init_fn inside one of ours (or it as it is)."""
    if isinstance(worker_init_fn, functools.partial) and worker_init_fn.func is _run:
        return worker_init_fn.args[1]
    return worker_init_fn


def with_user_function(worker_init_fn, user_fn):
    """One of ours with the user's function replaced (sent by value, say)."""
    return functools.partial(_run, steps_of(worker_init_fn), user_fn)


def steps_of(worker_init_fn):
    if isinstance(worker_init_fn, functools.partial) and worker_init_fn.func is _run:
        return worker_init_fn.args[0]
    return ()
