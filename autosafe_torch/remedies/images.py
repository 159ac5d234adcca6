"""PIL images held open, reopened where they arrive, at the same frame (DL201).

PIL's pickle keeps the current frame's pixels and drops the open file, so a
spawned worker's multi-frame TIFF (GIF, PNG, WebP...) cannot seek
(``inspection/dropped.py``). An image sent (``image_reducers``) or copied for
an emulated worker (``copy_of``) is opened again, as a forked worker's, in
the same format at the parent's frame: from the parent's file (a changed file
or frame fails loudly where it is opened), or from a copy of the bytes it was
read from. One frame travels as PIL pickles it. Edits in memory to the frame
are lost, as the parent's next ``seek`` loses them.
"""

import io
import os

from ..inspection.failures import RemedyFailed
from ..inspection.dropped import (_identity, image_file_class, image_stream, reopen_args,
                                    single_frame)
from .pickling import PROTOCOL


class ImageFileChanged(RemedyFailed):
    """Where an image arrives: its file (device, inode, size, mtime) is not the
    one the parent had open."""


def reopened(how, source, check, fmt, mode, size, frame):
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
    args = reopen_args(img)
    if args is None:
        raise ValueError("its file cannot be opened again by path")
    return reopened(*args)


def image_reducers():
    """For PIL's image file classes (its plugins loaded so far)."""
    found, stack = {}, [image_file_class()]
    while stack:
        cls = stack.pop()
        if cls is not None and cls not in found:
            found[cls] = _reduce_image
            stack.extend(cls.__subclasses__())
    return found
