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


def _parts(worker_init_fn):
    """``(steps, user's function)`` of one of ours; ``((), it)`` for any other."""
    if isinstance(worker_init_fn, functools.partial) and worker_init_fn.func is _run:
        return worker_init_fn.args
    return (), worker_init_fn


def with_step(worker_init_fn, step, first=False):
    """A worker_init_fn that runs ``step(worker_id)`` (a module-level function
    or a partial of one) after the steps it has (``first``: before them), then
    the original; a step already there is not added again."""
    steps, user_fn = _parts(worker_init_fn)
    if step in steps:
        return worker_init_fn
    return functools.partial(_run, (step,) + steps if first else steps + (step,), user_fn)


def user_function(worker_init_fn):
    return _parts(worker_init_fn)[1]


def with_user_function(worker_init_fn, user_fn):
    """One of ours with the user's function replaced (sent by value, say)."""
    return functools.partial(_run, steps_of(worker_init_fn), user_fn)


def steps_of(worker_init_fn):
    return _parts(worker_init_fn)[0]
