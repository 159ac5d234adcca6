"""Does an object that pickles itself (``__getstate__``, ``__reduce__``) reach a
spawn/forkserver worker whole, or does its pickle drop an open file its methods
read? PIL's ``ImageFile`` keeps one frame's pixels: a spawned worker's
``img.seek(i)`` fails (``'TiffImageFile' object has no attribute '_min_frame'``).

One walk per part finds the open files; above each, the outermost object that
pickles itself goes through an inventory pass: a file it never reaches was
dropped, by the deepest object it did reach. Fail open: an object whose
inspection or pickling raises is skipped.
"""

import contextlib
import dis
import functools
import io
import os
import types

from . import holdings, inventory, objwalk
from .objwalk import Edge, is_a
from .probe import ProbeResult, sent_table
from .slots import instance_dict

# Objects pickled per call (a PIL image costs one frame's pixels); a few tell.
MAX_PICKLED = 16

IMAGE_FIX, FILE_FIX = ("open the %s lazily in __getitem__ (or in worker_init_fn), keeping its "
                       "path on the dataset" % what for what in ("image", "file"))


def image_file_class():
    """``PIL.ImageFile.ImageFile`` where PIL is imported (never imported here)."""
    cls = holdings.loaded("PIL.ImageFile", "ImageFile")
    return cls if isinstance(cls, type) else None


def is_image_file(obj):
    return is_a(obj, image_file_class() or ())


def image_stream(img):
    """``(attribute, stream)`` a PIL image reads frames from (``fp``, or ``_fp``
    once PIL loaded a frame and set ``fp`` to None), or None."""
    attrs = instance_dict(img) or {}
    for name in ("fp", "_fp"):
        stream = attrs.get(name)
        if stream is not None and live_stream(stream):
            return name, stream
    return None


def single_frame(img):
    """Whether a PIL image is known to hold one frame, from what PIL already set
    or a format that cannot seek: never asking the image, which may read its file."""
    attrs = instance_dict(img) or {}
    animated = attrs.get("is_animated")
    if type(animated) is bool:
        return not animated
    for name in ("_n_frames", "n_frames"):
        count = attrs.get(name)
        if type(count) is int:
            return count <= 1
    base = holdings.loaded("PIL.Image", "Image")
    return base is not None and getattr(type(img), "seek", None) is getattr(base, "seek", None)


def _identity(st):
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def reopen_args(img):
    try:
        if not is_image_file(img) or (held := image_stream(img)) is None:
            return None
        stream = held[1]
        attrs = object.__getattribute__(img, "__dict__")
        shape = (img.format, img.mode, img.size, img.tell())
        if is_a(stream, io.BytesIO):
            return ("memory", stream.getvalue(), None) + shape
        raw = holdings.raw_file(stream)
        path = holdings.real_path(raw) if raw is not None else None
        if path is None:
            return None
        ident = _identity(os.fstat(raw.fileno()))
        filename = attrs.get("filename")
        by_name = bool(filename) and attrs.get("_exclusive_fp") is True
        return ("name" if by_name else "file", path, (ident, filename)) + shape
    except Exception:  # a stream or an image that cannot say: not reopened
        return None


def reopens(value):
    try:
        return is_image_file(value) and not single_frame(value) \
            and reopen_args(value) is not None
    except Exception:
        return False


def live_stream(obj):
    with contextlib.suppress(Exception):  # detached, or a stream that cannot say
        if is_a(obj, io.BytesIO):
            return not obj.closed
        if is_a(obj, io.IOBase):
            return not is_a(obj, io.StringIO) and not obj.closed and obj.readable()
        if holdings.is_native_handle(obj) or holdings.sqlite_path(obj) is not None:
            return holdings.file_kind(obj) is not None
    return False


def stream_name(stream, img=None):
    """``open file frames.tif``: no repr."""
    with contextlib.suppress(Exception):
        name = (instance_dict(img) or {}).get("filename") if img is not None else None
        if not name:
            raw = holdings.raw_file(stream)
            name = getattr(raw if raw is not None else stream, "name", None)
        if isinstance(name, (str, bytes)) and name:
            return "open file %s" % os.path.basename(os.fsdecode(name))
        if is_a(stream, io.BytesIO):
            return "in-memory stream"
    return "open file"


# Containers whose own pickling keeps everything they hold.
_CONTAINER_MODULES = frozenset({"builtins", "collections", "functools", "types"})


def pickles_itself(obj, table):
    """Whether ``obj``'s pickle is its own (or ``table``'s), not its attributes'."""
    try:
        return type(obj) in table or _own_pickling(type(obj))
    except Exception:  # an unhashable class, or a metaclass that raises
        return False


@functools.lru_cache(maxsize=4096)
def _own_pickling(cls):
    if getattr(cls, "__module__", None) in _CONTAINER_MODULES:
        return False
    default_state = getattr(object, "__getstate__", None)  # Python 3.11 and later
    return (cls.__reduce_ex__ is not object.__reduce_ex__
            or cls.__reduce__ is not object.__reduce__
            or getattr(cls, "__getstate__", None) is not default_state)


# Methods that do not set an attribute again where the pickle arrives (but
# ``__init__`` where the class's own ``__reduce__`` calls the class).
_SETUP = frozenset({"__init__", "__new__", "__init_subclass__", "__getstate__",
                    "__reduce__", "__reduce_ex__", "__copy__", "__deepcopy__",
                    "__del__", "__exit__", "close"})


def sets_again(obj, attribute):
    """Whether a method but ``_SETUP``'s stores not-None in ``attribute`` (read
    from the code, never run), or ``obj`` reopens per process: a lazy open."""
    try:
        return holdings.reopens_per_process(obj) or _sets_again(type(obj), attribute)
    except Exception:
        return False


@functools.lru_cache(maxsize=1024)
def _sets_again(cls, attribute):
    rebuilt_by_init = any(name in vars(klass) for klass in cls.__mro__[:-1]
                          if klass.__module__ != "builtins"
                          for name in ("__reduce__", "__reduce_ex__"))
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            continue
        for name, value in vars(klass).items():
            if name in _SETUP and not (name == "__init__" and rebuilt_by_init):
                continue
            if type(value) in (staticmethod, classmethod):
                value = value.__func__
            value = getattr(value, "__wrapped__", value)  # patches.datasets.MeasuredInit
            funcs = (value.fget, value.fset) if type(value) is property else (value,)
            if any(type(f) is types.FunctionType and _stores(f.__code__, attribute)
                   for f in funcs):
                return True
    return False


def _stores(code, attribute):
    """``self.<attribute> = <not None>`` anywhere in ``code`` (or code it nests)."""
    for nested in holdings.nested_code(code):
        ops = list(dis.get_instructions(nested))
        for i, ins in enumerate(ops):
            # ``x.a = None`` is LOAD_CONST None, LOAD_FAST x, STORE_ATTR a.
            if ins.opname == "STORE_ATTR" and ins.argval == attribute and not (
                    i >= 2 and ops[i - 2].opname == "LOAD_CONST" and ops[i - 2].argval is None):
                return True
    return False


def reached(obj, table):
    """The ids of what ``obj``'s pickle reaches, or None where it raises (the probe's to say)."""
    found = inventory.take(obj, table)
    return None if found.unpicklable or not found.complete else found.met


class _Search:
    def __init__(self, planned):
        self.planned = planned
        self.checked = {}  # id(owner) -> ids its pickle reaches, or None where it raised
        self.reported = {}  # id(object named) -> ProbeResult

    @functools.cached_property
    def table(self):  # made for the first file found: none, no cost
        return sent_table(self.planned)

    def run(self, parts):
        found, places = [], {}

        def stop(obj):
            if is_image_file(obj):
                found.append(obj)
                return True
            if holdings.is_file_object(obj):
                if live_stream(obj):
                    found.append(obj)
                return True
            return holdings.stop_at_threading(obj)

        for name, part in parts.items():
            if part is None:
                continue
            found.clear()
            places.clear()
            for here, obj, edge in objwalk.walk(part, name, stop=stop):
                places[id(obj)] = (here, edge)  # the edge keeps its child alive
            for obj in found:
                with contextlib.suppress(Exception):  # fail open: this object is skipped
                    self._candidate(obj, places)
        return list(self.reported.values())

    def _candidate(self, obj, places):
        chain = []  # (path, node, edge to the next node), from the root down
        if is_image_file(obj):
            held = image_stream(obj)
            if held is None:
                return
            chain.append((places[id(obj)][0], obj, Edge(obj, held[0], Edge.ATTR, held[1])))
            stream, image = held[1], obj
        else:
            stream, image = obj, None
        node = obj
        while (edge := places[id(node)][1]) is not None:
            node = edge.owner
            chain.insert(0, (places[id(node)][0], node, edge))
        top = next((i for i, (_path, node, _edge) in enumerate(chain)
                    if pickles_itself(node, self.table)), None)
        if top is None:
            return  # pickled by its attributes: the probe's, and the repairs', to judge
        if any(type(node) in self.planned for _path, node, _edge in chain[top:]):
            return  # a planned repair pickles it: its reducer makes the file again
        if image is not None and top == len(chain) - 1 and single_frame(image):
            return  # nothing above it pickles itself, and its pixels are all it reads
        owner = chain[top][1]
        if id(owner) not in self.checked and len(self.checked) < MAX_PICKLED:
            self.checked[id(owner)] = reached(owner, self.table)
        reached_ids = self.checked.get(id(owner))
        if reached_ids is None or id(stream) in reached_ids:
            return
        # The deepest it reached drops the next (a container is pickled in C
        # without a look: reached where its owner is).
        dropping = next((link for link in chain[top:] if type(link[2].child)
                         not in objwalk.CONTAINERS and id(link[2].child) not in reached_ids), None)
        if dropping is None or id(dropping[1]) in self.reported:
            return
        path, original, edge = dropping
        if is_image_file(original):
            if single_frame(original):
                return
            name, fix = stream_name(stream, original), IMAGE_FIX
            why = "PIL's pickle keeps one frame"
        elif edge.how == Edge.ATTR and sets_again(original, edge.key):
            return  # a lazy open: its methods set it again where it arrives
        else:
            name, why, fix = stream_name(stream), "its pickle drops %s" % edge.label(), FILE_FIX
        self.reported[id(original)] = ProbeResult(
            False, path, "pickles without its %s (%s)" % (name, why), original, fix=fix)


def unfaithful(parts, planned=None):
    """Failed ``ProbeResult``s for the objects of ``parts`` that pickle without an
    open file they hold, ``planned``'s reducers as if installed."""
    try:
        return _Search(planned or {}).run(parts)
    except Exception:
        return []
