"""PIL images held open, reopened where they arrive, at the same frame (DL201).

PIL pickles an image read from a file as the current frame's pixels and the
file's name, dropping the open file: a spawned worker's copy of a multi-page
TIFF (a GIF, PNG, WebP...) cannot move to another frame (``'TiffImageFile'
object has no attribute '_min_frame'``). An image sent by ``image_reducers``
or copied for an emulated worker (``copy_of``) is, as a forked worker's,
opened again (``Image.open``, the same format) from the file the parent has
open, then moved to the parent's frame.

- The file is reached by a path that names it now (``dropped.reopen_args``)
  and checked where it is opened (device, inode, size, mtime): a file
  replaced or changed meanwhile, or a frame whose mode or size is not the
  parent's, fails loudly (``ImageFileChanged``), never read in its place.
- An image opened by name is opened by name (PIL then closes the file); one
  from a file object, from a file object; one read from memory, from a copy
  of those bytes.
- An image of one frame travels as PIL pickles it (``dropped.single_frame``).
- Edits made in memory to the current frame are not carried: the parent's
  own next ``seek`` discards them too.
"""

import io
import os

from ..inspection.failures import RemedyFailed
from ..inspection.dropped import (_identity, image_file_class, image_stream, reopen_args,
                                    single_frame)
from .pickling import PROTOCOL


class ImageFileChanged(RemedyFailed):
    """Where an image arrives: its file is not the one the parent had open."""


def reopened(how, source, check, fmt, mode, size, frame):
    """Runs where the image arrives: the image opened again and moved to ``frame``."""
    from PIL import Image  # noqa: PLC0415 - optional dependency

    if how == "memory":
        img = Image.open(io.BytesIO(source), formats=[fmt])
        name = "an in-memory image"
    else:
        (ident, filename), name = check, source
        try:
            f = open(source, "rb")  # noqa: SIM115 - the image returned reads it; closed on error
        except OSError as exc:
            raise ImageFileChanged("%s cannot be opened again in this worker (DL201): %s"
                                   % (source, exc.strerror or exc)) from exc
        try:
            if _identity(os.fstat(f.fileno())) != tuple(ident):
                raise ImageFileChanged(
                    "%s changed after the training process opened it (DL201): this worker "
                    "cannot reopen the image it was sent" % source)
            img = Image.open(f, formats=[fmt])
        except BaseException:
            f.close()
            raise
        if how == "name":  # as Image.open(path) left the parent's: PIL closes it
            img.filename, img._exclusive_fp = filename, True
    try:
        if frame:
            img.seek(frame)
        if (img.mode, img.size) != (mode, tuple(size)):
            raise ImageFileChanged(
                "%s is not the image the training process had open (DL201): frame %d is %s "
                "%dx%d there" % (name, frame, mode, size[0], size[1]))
    except BaseException:
        img.close()
        raise
    return img


def _reduce_image(img):
    if single_frame(img) or image_stream(img) is None:
        return img.__reduce_ex__(PROTOCOL)  # its pixels are all it has, as without us
    args = reopen_args(img)
    if args is not None:
        return reopened, args
    raise TypeError("a %s of several frames cannot be sent: its file cannot be opened "
                    "again by path, and PIL's pickle keeps one frame" % type(img).__name__)


def copy_of(img):
    """An emulated worker's own ``img``: opened again, at its frame (``reopened``)."""
    args = reopen_args(img)
    if args is None:
        raise ValueError("its file cannot be opened again by path")
    return reopened(*args)


def _classes():
    """PIL's image file classes (its plugins loaded so far), where PIL is imported."""
    base = image_file_class()
    found, stack = [], [base] if base is not None else []
    while stack:
        cls = stack.pop()
        if cls not in found:
            found.append(cls)
            stack.extend(cls.__subclasses__())
    return found


def image_reducers():
    """``{class: reducer}`` for PIL's image file classes."""
    return {cls: _reduce_image for cls in _classes()}
