"""The user's file:line for a call that reached one of our wrappers.

``user_call_site`` is the nearest frame outside autosafe_torch, torch and
wrapt. Frameworks make loaders of their own from the user's: Lightning
re-creates it from its saved arguments (``lightning/fabric/utilities/data.py``),
Accelerate's ``prepare`` builds one around the user's dataset
(``accelerate/data_loader.py``), MONAI's ThreadDataLoader iterates in a thread
of its own. The line to change is the user's, where the original was made.

So every loader (and its dataset) keeps its origin, the user's file:line that
made it, in a weak map (nothing is written on the user's objects). A loader
made or iterated from inside an installed library (site-packages, the
standard library) takes the origin of the loader it is built from (in the
library frames' locals, or by its dataset), else the user's frame that called
into the library; the library frame comes second, and a loader re-made from a
re-made one still names the user's line::

    train.py:42 (via lightning/fabric/utilities/data.py:325)

Nothing here runs user code: it reads file names, line numbers and identities.
A Jupyter cell's temporary file (``/tmp/ipykernel_PID/HASH.py``) reads as
IPython's tracebacks name it, ``Cell In[4], line 6``.
"""

import contextlib
import dis
import functools
import os
import site
import sys
import sysconfig
import types
import weakref

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
VIA = " (via "


@functools.cache
def _skipped():
    dirs = [_PACKAGE_DIR]
    for name in ("torch", "wrapt"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)))
    return tuple(d + os.sep for d in dirs) + ("<frozen",)


def _installed_dirs():
    """Directories whose code is a library's, not the user's: site-packages
    (venv, system, user) and the standard library; longest first, so that a
    frame is shown relative to the most specific one."""
    dirs = set()
    paths = sysconfig.get_paths()
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        if paths.get(key):
            dirs.add(paths[key])
    with contextlib.suppress(Exception):
        dirs.update(site.getsitepackages())
    with contextlib.suppress(Exception):
        dirs.add(site.getusersitepackages())
    for path in sys.path:  # a venv's site-packages seen through sys.path
        if path and os.path.basename(path) in ("site-packages", "dist-packages"):
            dirs.add(path)
    out = {resolve(d) + os.sep for d in dirs if d
           for resolve in (os.path.abspath, os.path.realpath)}
    return tuple(sorted(out, key=len, reverse=True))


installed_dirs = functools.cache(_installed_dirs)


def _outside(frame, instance, depth=-1):
    """``frame`` and its callers (``depth`` of them at most), less those of
    autosafe_torch, torch, wrapt and ``instance``'s own methods (a DataLoader
    subclass's __init__ calling super: the site is where the object was made)."""
    skip = _skipped()
    while frame is not None and depth:
        depth -= 1
        if not (frame.f_code.co_filename.startswith(skip)
                or (instance is not None and _owned_by(frame, instance))):
            yield frame
        frame = frame.f_back


def user_call_site(instance=None):
    for frame in _outside(sys._getframe(1), instance):
        return _here(frame)
    return "<unknown>"


def user_part(site):
    """The user's file:line of a call site, without the library frame."""
    return site.split(VIA, 1)[0] if isinstance(site, str) else site


# -- origins of loaders and datasets -------------------------------------------

_origins = {}  # id(object) -> (weak reference, the user's file:line, is a loader)


def remember(obj, site, loader=True):
    """Keep ``site`` as ``obj``'s origin while it lives (a dataset keeps its first)."""
    key = id(obj)
    if not loader and origin_of(obj)[0] is not None:
        return
    try:
        ref = weakref.ref(obj, lambda _ref, key=key: _origins.pop(key, None))
    except TypeError:  # not weak-referenceable: no origin kept
        return
    _origins[key] = (ref, user_part(site), loader)


def origin_of(obj):
    """(``obj``'s origin, whether it is a loader), or (None, None)."""
    entry = _origins.get(id(obj))
    return entry[1:] if entry is not None and entry[0]() is obj else (None, None)


def _owned_by(frame, instance):
    """True for a frame of a function whose first argument is ``instance``: its
    own methods (a subclass's __init__) and wrappers of them (Lightning wraps
    DataLoader.__init__ as ``wrapper(obj, *args)`` while its hooks run)."""
    code = frame.f_code
    if not code.co_argcount:
        return False
    if sys.version_info < (3, 13) and code.co_varnames[0] in ("self", "cls") \
            and not _method_of(code, type(instance)) \
            and not code.co_filename.startswith(installed_dirs()):
        # A method of another object of the user's (a TestCase, a trainer): before
        # Python 3.13, reading its f_locals leaves a snapshot on the frame that keeps
        # every local alive after the method deletes it (an iterator, its workers).
        return False
    return frame.f_locals.get(code.co_varnames[0]) is instance


@functools.cache
def _method_of(code, cls):
    return any(getattr(getattr(value, "__func__", value), "__code__", None) is code
               for klass in cls.__mro__ for value in vars(klass).values())


def _here(frame):
    return place(frame.f_code.co_filename, frame.f_lineno)


def place(filename, lineno):
    """``file:line``; in a Jupyter kernel, a cell as IPython names it in its
    tracebacks: ``Cell In[4], line 6``."""
    named = None
    ipython = sys.modules.get("IPython")
    if ipython is not None and filename.endswith(".py"):
        with contextlib.suppress(Exception):  # no shell; no format_code_name (IPython < 8)
            named = ipython.get_ipython().compile.format_code_name(filename)
    if named:
        return "%s %s, line %d" % (named[0], named[1], lineno)
    return "%s:%d" % (filename, lineno)


def _relative(frame):
    """A library frame as ``package/module.py:line`` (relative to site-packages)."""
    filename = frame.f_code.co_filename
    prefix = next((p for p in installed_dirs() if filename.startswith(p)), "")
    return "%s:%d" % (filename[len(prefix):], frame.f_lineno)


def _origin_in(frames, exclude):
    """The origin of what the library frames hold: a loader it builds from
    (innermost frame first), else a dataset."""
    dataset_origin = None
    for frame in frames:
        try:
            values = list(frame.f_locals.values())
        except Exception:
            continue
        for value in values:
            origin, is_loader = (None, None) if value is exclude else origin_of(value)
            if is_loader:
                return origin
            dataset_origin = dataset_origin or origin
    return dataset_origin


def _site(instance, own=None, dataset=None):
    """(the call site, the origin it names): the first frame ``_outside`` that
    is the user's (within 64 frames), with the first library frame passed."""
    user, passed = None, []
    for frame in _outside(sys._getframe(1), instance, 64):
        if not frame.f_code.co_filename.startswith(installed_dirs()):
            user = frame
            break
        passed.append(frame)
    if not passed:
        return _here(user) if user is not None else "<unknown>", None
    via = _relative(passed[0])
    origin = (origin_of(own)[0] or _origin_in(passed, instance) or origin_of(dataset)[0]
              or (_here(user) if user is not None else None))
    return (via, None) if origin is None else ("%s%s%s)" % (origin, VIA, via), origin)


def loader_site(loader, dataset=None):
    """Call site of a DataLoader being made, remembered as its origin (and its
    dataset's, if that has none yet). Never raises."""
    try:
        site, origin = _site(loader, dataset=dataset)
        remember(loader, origin or site)
        if dataset is not None:
            remember(dataset, origin or site, loader=False)
        return site
    except Exception:
        return user_call_site(loader)


def iteration_site(loader):
    """Call site of an iteration over ``loader`` (a library's: the line that made
    it, with the library frame second). Never raises."""
    try:
        return _site(loader, own=loader)[0]
    except Exception:
        return user_call_site(loader)


_sites = {}  # (caller code, line, its caller's code, line) -> "file:line"
_SITES_LIMIT = 4096


def cached_call_site(instance=None):
    """``user_call_site`` cached by the first two frames outside the libraries:
    autocast is built every step from the same line, and reading a frame's
    locals (to skip a subclass's own ``__init__``) is not cheap."""
    frame = next(_outside(sys._getframe(1), None), None)
    if frame is None:
        return user_call_site(instance)
    back = frame.f_back
    key = (frame.f_code, frame.f_lineno,
           back.f_code if back is not None else None, back.f_lineno if back is not None else 0)
    site = _sites.get(key)
    if site is None:
        site = user_call_site(instance)
        if len(_sites) < _SITES_LIMIT:
            _sites[key] = site
    return site


# -- torch's warnings, where torch would raise them ------------------------------

def as_if_called_from(function, call, *args):
    """``call(*args)``, made from the line of ``function`` (torch's code that a
    wrapper of ours replaces) that calls it there, so that a warning ``call``
    raises with ``stacklevel=2`` names what it names without the shim (torch's
    "This DataLoader will create N worker processes" names ``_get_iterator``),
    not a file of ours: the frame's code is compiled under ``function``'s file
    name, at that line, with its module's globals (its once-per-place registry
    applies, no warning filter is touched). Where that line cannot be found, a
    plain call."""
    caller = _make_caller(function, getattr(call, "__name__", None))
    return call(*args) if caller is False else caller(call, args)


@functools.cache
def _make_caller(function, name):
    """A function ``(call, args) -> call(*args)`` whose frame reads as
    ``function``'s at the line that calls ``name``; False where there is none."""
    code = getattr(function, "__code__", None)
    line = _line_calling(code, name) if code is not None and name else None
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    if line is None or line < 2 or module is None:
        return False
    source = "\n" * (line - 2) + "def %s(call, args):\n    return call(*args)\n" % (
        code.co_name if code.co_name.isidentifier() else "caller")
    compiled = compile(source, code.co_filename, "exec")
    inner = next(c for c in compiled.co_consts if isinstance(c, types.CodeType))
    return types.FunctionType(inner, module.__dict__)


def _line_calling(code, name):
    """The first line of ``code`` that loads ``name`` (a method it calls), or None."""
    current = None
    for instruction in dis.get_instructions(code):
        current = line_of(instruction, current)
        if instruction.argval == name and instruction.opname.startswith(
                ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL")):
            return current
    return None


def line_of(instruction, last):
    """``instruction``'s line, else ``last`` (the line it continues)."""
    line = getattr(instruction, "line_number", None)  # Python 3.13
    if isinstance(line, int):
        return line
    starts = instruction.starts_line  # an int before 3.13
    return starts if isinstance(starts, int) and not isinstance(starts, bool) else last


# A pin-memory thread has no user frame: the loader's iteration site it serves.
_pin_thread_sites = weakref.WeakKeyDictionary()


def pin_thread_serves(iterator, site):
    """``iterator``'s pin-memory thread, if it has one, serves the loader
    iterated at ``site``: the line DL305 names."""
    from .torch_private import pin_memory_thread  # noqa: PLC0415 - imports torch: callsite loads at `import cv2` (patches.cv2 -> report -> callsite), before the program imports torch

    thread = pin_memory_thread(iterator)
    if thread is not None:
        _pin_thread_sites[thread] = site


def site_of_pin_thread(thread):
    return _pin_thread_sites.get(thread)
