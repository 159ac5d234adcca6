"""A fingerprint of what an object holds: two builds of a dataset, the training
process's and a spawned worker's, hold the same values when their fingerprints
agree (``remedies/rebuild.py``). It is the object's pickle by the C pickler,
hashed (an ImageNet index of 1.28M tuples: under a second), nothing capped.

What the pickle would not say the same way in both processes, or cannot say,
stands in (``persistent_id``, asked before the pickler's own fast paths): code
by module and name (a spawned worker's main is ``__mp_main__``), sets by
their sorted items (their order follows per-process string hashes), payloads
and handles by what they are, what does not pickle at all (a pyarrow reader)
by its type: which file it reads is the kernel's to say (``inspection/opened.py``).
No user code runs but what torch's own pickling of the dataset for a worker would run.
"""

import contextlib
import copyreg
import hashlib
import mmap
import os
import pickle
import sys
import types

from . import holdings
from .objwalk import is_a
from .slots import attributes

PROTOCOL = 4
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray, tuple,
                    list, dict})


class _Hasher:
    __slots__ = ("h", "size", "kept")

    def __init__(self, keep=False):
        self.h = hashlib.blake2b(digest_size=20)
        self.size = 0
        self.kept = [] if keep else None  # the stream itself, where it is wanted

    def write(self, data):
        self.h.update(data)
        self.size += len(data)
        if self.kept is not None:
            self.kept.append(bytes(data))
        return len(data)


def main_name(module):
    """A spawned worker's main module is ``__mp_main__``: named as the training process's."""
    return "__main__" if module == "__mp_main__" else module


def _module(obj):
    return main_name(getattr(obj, "__module__", None) or "")


def _bytes_hash(buffer):
    return hashlib.blake2b(buffer, digest_size=20).hexdigest()


class _Pickler(pickle.Pickler):
    def __init__(self, sink):
        super().__init__(sink, PROTOCOL)
        torch = sys.modules.get("torch")  # tensor types, array type: of the modules imported
        self._payload = ((torch.Tensor,) if hasattr(torch, "Tensor") else (),
                         holdings.loaded("numpy", "ndarray"))
        self.plain = True  # nothing met but what the plain pickler writes the same way
        self.stood_in = False  # the stream is a plain pickle of the object

    def persistent_id(self, obj):
        cls = type(obj)
        if cls in _PLAIN:
            return None
        found = self._stand_in(obj, cls)
        if found is not None:
            self.stood_in = True
            if found[0] not in ("set", "array"):
                self.plain = False  # a tensor, a handle, or code by name (may not import)
        return found

    def _stand_in(self, obj, cls):
        if cls is set or cls is frozenset:
            return ("set", cls.__name__, tuple(sorted(digest(item) for item in obj)))
        if cls is types.FunctionType:
            return ("function", _module(obj), obj.__qualname__, _code_hash(obj.__code__))
        if is_a(obj, type):
            return ("class", _module(obj), getattr(obj, "__qualname__", ""))
        if cls is types.ModuleType:
            return ("module", obj.__name__)
        if cls is types.BuiltinFunctionType:
            return ("builtin", _module(obj), getattr(obj, "__qualname__", ""))
        tensor_types, array_type = self._payload
        if tensor_types and is_a(obj, tensor_types):
            return _tensor(obj)
        if array_type is not None and is_a(obj, array_type) and not obj.dtype.hasobject:
            import numpy  # noqa: PLC0415 - optional dependency

            return ("array", obj.dtype.str, obj.shape,
                    _bytes_hash(numpy.ascontiguousarray(obj).view(numpy.uint8).data))
        if holdings.is_file_object(obj) or cls is mmap.mmap:
            return ("file",) + _file_state(obj)
        kind = holdings.threading_kind(obj)
        if kind is not None and kind != "thread":
            return ("lock", kind, holdings.held(obj))
        if cls is types.GeneratorType:
            frame = obj.gi_frame
            return ("generator", obj.gi_code.co_name,
                    frame.f_lasti if frame is not None else "done")
        return None

    def reducer_override(self, obj):
        reducer = copyreg.dispatch_table.get(type(obj))
        try:
            return reducer(obj) if reducer is not None else obj.__reduce_ex__(PROTOCOL)
        except Exception:  # a handle that does not pickle: its kind, nothing more (never loaded)
            self.plain, self.stood_in = False, True
            cls = type(obj)
            return str, ("%s.%s" % (_module(cls), cls.__qualname__),)


def _code_hash(code, depth=0):
    """A code object's fingerprint: its bytecode, names and constants, nested
    code by its own (a nested code object's repr holds its address, and a
    frozenset constant's its process's string hashes)."""
    h = hashlib.blake2b(code.co_code, digest_size=20)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            h.update(_code_hash(const, depth + 1).encode() if depth < 16 else b"deep")
        elif isinstance(const, frozenset):
            h.update(repr(sorted(map(repr, const))).encode())
        else:
            h.update(repr(const)[:2000].encode())
    return h.hexdigest()


def _tensor(t):
    t = t.detach()
    head = ("tensor", str(t.dtype), tuple(t.shape), t.device.type, str(t.layout))
    torch = sys.modules["torch"]
    if t.layout != torch.strided or t.device.type == "meta" or t.is_quantized:
        return head
    flat = t.cpu().contiguous().reshape(-1)
    return head + (_bytes_hash(flat.view(torch.uint8).numpy().data) if flat.numel() else "",)


def _file_state(f):
    parts = []
    # ``lambda: f.tell()``, not ``f.tell``: a file without ``tell`` fails inside the try
    for read in (lambda: getattr(f, "name", None), lambda: getattr(f, "mode", None),
                 lambda: f.closed, lambda: f.tell()):  # noqa: PLW0108
        try:
            value = read()
            parts.append(value if type(value) in (str, int, bool, type(None)) else repr(value))
        except Exception:
            parts.append("?")
    with contextlib.suppress(Exception):
        st = os.fstat(f.fileno())
        parts += [st.st_size, st.st_mtime_ns]
    return tuple(parts)


def digest(obj):
    """A hex string; raises what pickling raises that is no failure to pickle a
    handle (a RecursionError: too deep)."""
    return measured(obj)[0]


def measured(obj, keep=False):
    """``(digest(obj), plain, size, pickled)`` in one pass: ``plain`` where it
    holds nothing but what the plain pickler writes whole (no tensor, handle,
    or code by name, which may not import: a lambda), its pickle's size here
    (an array's stands in), and with ``keep`` that pickle where nothing stood
    in (a plain pickle of ``obj``, protocol 4), else None."""
    sink = _Hasher(keep)
    pickler = _Pickler(sink)
    pickler.dump(obj)
    pickled = b"".join(sink.kept) if keep and not pickler.stood_in else None
    return sink.h.hexdigest(), pickler.plain, sink.size, pickled


def attribute_digests(obj):
    return {name: digest(value) for name, value in attributes(obj)}
