"""This process's file mappings, as ``/proc/self/maps`` and ``/proc/self/smaps``
show them: what memmaps.py (numpy memmaps, ``mmap.mmap``) and
mapped_tensors.py (tensors over a mapped file) send to workers by reference.

The platform the rules see decides (``autosafe-torch run --as macos``): a
rehearsed Mac has no ``/proc/self/maps``.
"""

import os
import stat

from .. import rehearsal

MAPS = "/proc/self/maps"
SMAPS = "/proc/self/smaps"
# What /proc/self/maps names shared anonymous memory by ("... (deleted)").
_ANONYMOUS = ("/dev/zero", "/memfd:", "/SYSV")


class MappedFileChanged(RuntimeError):
    """In a worker: the file a memmap was sent by reference from is gone or changed."""


class Mapping:
    """One line of ``/proc/self/maps``: an address range of a file (``perms``:
    ``r--s``, ``rw-p``...; ``shared``: its fourth letter is ``s``)."""

    __slots__ = ("start", "end", "perms", "offset", "device", "inode", "path")

    def __init__(self, start, end, perms, offset, device, inode, path):
        self.start, self.end, self.perms = start, end, perms
        self.offset, self.device, self.inode, self.path = offset, device, inode, path

    @property
    def shared(self):
        return self.perms[3:4] == "s"


def file_mappings():
    """The file mappings of this process, or None where there is no
    ``/proc/self/maps`` (or the platform the rules see has none)."""
    if not rehearsal.platform().startswith("linux"):
        return None
    try:
        with open(MAPS) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue  # anonymous, heap, stack, [vdso]
        try:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            major, minor = (int(x, 16) for x in fields[3].split(":"))
            found.append(Mapping(start, end, fields[1], int(fields[2], 16),
                                 os.makedev(major, minor), int(fields[4]), fields[5]))
        except ValueError:
            continue
    return found


def mapped_file(address, nbytes, mappings):
    """``(Mapping, os.stat_result, None)`` for the file mapping that holds the
    ``nbytes`` at ``address``, a regular file still at its path, long enough;
    else ``(None, None, why not)``."""
    where = next((m for m in mappings if m.start <= address < m.end), None)
    if where is None:
        return None, None, "its data are not in a file mapping"
    if address + nbytes > where.end:
        return None, None, "its data span more than one mapping"
    if where.path.endswith(" (deleted)"):
        return None, None, ("an anonymous map" if where.path.startswith(_ANONYMOUS)
                            else "its file was deleted")
    try:
        st = os.stat(where.path)
    except OSError as exc:
        return None, None, "its file is gone (%s)" % type(exc).__name__
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (where.device, where.inode):
        return None, None, "the file at its path is not the one mapped"
    if where.offset + (address - where.start) + nbytes > st.st_size:
        return None, None, "the file is shorter than the map"
    return where, st, None


def written_pages(where):
    """Kilobytes of the mapping ``where`` that this process wrote (copied
    from the file: ``Anonymous`` in ``/proc/self/smaps``); None if unknown."""
    header = "%x-%x " % (where.start, where.end)
    try:
        with open(SMAPS) as f:
            inside = False
            for line in f:
                if inside and line.startswith("Anonymous:"):
                    return int(line.split()[1])
                if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    inside = line.startswith(header)
    except (OSError, ValueError, IndexError):
        pass
    return None
