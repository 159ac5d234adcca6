"""Memory maps travel to spawn/forkserver workers by reference (DL218):
mapped again from the file in each worker, exact or not at all
(``remedies/memmaps.py``, ``remedies/mapped_tensors.py``,
``inspection/mappings.py``), for this loader's files only, never for workers
the ladder sent to fork or emulated (a forked worker inherits the map).
"""

import os
import sys

from ..inspection.parts import held_in_parts
from ..inspection.tensors import reference as tensor_reference
from ..rung import Rung
from . import IterContext, number_of, rule
from .fork_plan import spawning_workers
from .ladder import GROUP
from .pickling_plan import pickling_plan


@rule("DL218", "memmap-by-reference", GROUP,
      summary=("a numpy memmap, or a tensor mapped from a file (torch.load(mmap=True), "
               "UntypedStorage.from_file), in the dataset of spawn/forkserver workers: "
               "sent as file, offset and layout, and mapped again copy-on-write in each "
               "worker (a writable private copy of the same bytes), not copied into every "
               "worker start (a memmap) or into /dev/shm (a tensor); a mode='c' map or "
               "private map the process wrote to, a strided memmap view, a deleted file: "
               "pickled as before. Assumes the file does not change while the workers "
               "start; a worker that finds it changed or gone fails loudly"),
      prevents=("a memmap: no error, each worker start pickles the whole mapped file (a "
                "300 MiB memmap under spawn with 2 workers: 1.4 GiB and 15-16 s where "
                "mapping it in each worker takes 0.5 GiB and 13.6 s); a torch.load(mmap=True) "
                "tensor is copied into /dev/shm for its life (a 200 MB file: +191 MiB), and "
                "where /dev/shm is smaller (Docker's 64 MiB): 'RuntimeError: unable to "
                "allocate shared memory(shm) for file </torch_...>: No space left on device "
                "(28)'; a from_file tensor: 'OSError: [Errno 9] Bad file descriptor'"),
      fix=("open the np.memmap, or call torch.load(path, mmap=True), lazily in each "
           "worker (in __getitem__ or worker_init_fn), keeping only its path on the "
           "dataset"),
      example=(("class Images(Dataset):\n"
                "    def __init__(self, path, tokens_path):\n"
                "        # pickled whole into every spawn worker start\n"
                "        self.images = np.memmap(path, np.uint8, 'r', shape=(N, 3, 224, "
                "224))\n"
                "        # copied into /dev/shm before the workers start\n"
                "        self.tokens = torch.load(tokens_path, mmap=True)\n"
                "    def __getitem__(self, i):\n"
                "        return torch.from_numpy(self.images[i].copy()), self.tokens[i]"),
               ("class Images(Dataset):\n"
                "    def __init__(self, path, tokens_path):\n"
                "        self.path, self.images = path, None\n"
                "        self.tokens_path, self.tokens = tokens_path, None\n"
                "    def __getitem__(self, i):\n"
                "        if self.images is None:   # mapped in each worker\n"
                "            self.images = np.memmap(self.path, np.uint8, 'r',\n"
                "                                    shape=(N, 3, 224, 224))\n"
                "            self.tokens = torch.load(self.tokens_path, mmap=True)\n"
                "        return torch.from_numpy(self.images[i].copy()), self.tokens[i]")),
      versions=("every supported torch (torch.load's mmap=True from 2.1); spawn workers "
                "(macOS, Windows) and forkserver workers (Linux from Python 3.14). Maps "
                "are found through /proc/self/maps: on macOS and Windows they are pickled "
                "as before. A tensor sent by reference is each worker's private map, as a "
                "forked worker's is: a worker's writes to it stay its own, where torch's "
                "shared-memory copy would show them to the training process"),
      at="dataloader.iter",
      # it reads the start method the ladder chose and whether a check emulated the
      # workers; before DL209, whose worker step would change the parts it plans
      # for (the plan of the same parts is made once)
      after=("thread_pool_under_fork", "logging_config_to_workers"))
def memmap_by_reference(args, ctx: IterContext):
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if (numpy is None and torch is None) or not spawning_workers(args, ctx) \
            or any(f.rung is Rung.EMULATED for f in ctx.findings):
        return None
    plan = pickling_plan(args, ctx)
    if plan.failures or not {"array", "tensor"} & plan.met:
        return None  # the probe met no array and no tensor: nothing to look for
    arrays, tensors, kept = _mapped(args, numpy, torch)
    if not arrays and not tensors:
        return None
    from ..remedies import mapped_tensors, memmaps  # noqa: PLC0415 - mapped_tensors imports torch: the rules load at `import cv2`, before the program imports torch; memmaps: 0.3 ms at `import torch` (-X importtime: remedies.memmaps, inspection.mappings)

    workers = number_of(args["num_workers"], "worker")
    named = ["%s (a %s %s, %s)" % (path, what, os.path.basename(ref.path), memmaps.size_text(size))
             for what, found in (("numpy memmap of", arrays), ("tensor mapped from", tensors))
             for path, ref, size in found]
    shown = ", ".join(named[:3]) + (" and %d more" % (len(named) - 3) if len(named) > 3 else "")
    reasons, remedies, before = [], [], {}
    if arrays:
        reasons.append("pickling copies each memmap into every worker start")
        remedies.append(lambda args: memmaps.install_reducers())
        before["memmaps"] = [path for path, _ref, _size in arrays]
    if tensors:
        reasons.append("torch copies each file-mapped tensor into shared memory (/dev/shm) "
                       "for the tensor's life")
        files = {ref.file for _path, ref, _size in tensors}
        remedies.append(lambda args: mapped_tensors.install_reducers(files))
        before["tensors"] = [path for path, _ref, _size in tensors]
    why = "; ".join(reasons) + "; each worker maps the file again instead, copy-on-write (as " \
        "writable as the copy, and its own)"
    if kept:
        why += "; pickled as before: %s" % "; ".join("%s (%s)" % item for item in kept)
    into = "it" if not tensors else "shared memory" if not arrays else "it or shared memory"
    return memmap_by_reference.rule.finding(
        before, why=why, strategy="by reference", remedies=remedies,
        done="%s mapped again in each of %s instead of copied into %s" % (shown, workers, into))


def _mapped(args, numpy, torch):
    """``(arrays, tensors, kept)``: ``(path, reference, bytes)`` for each memmap
    and each file-mapped tensor that can go by reference, ``(path, why not)``
    for the others (one walk, one read of this process's maps)."""
    from ..inspection import mappings  # noqa: PLC0415 - 0.2 ms at `import torch` and at `import cv2`, where the rules load (-X importtime: inspection.mappings)

    # The types the reducers are registered for: a subclass pickles as it always did.
    memmap = numpy.memmap if numpy is not None else None
    plain = (torch.Tensor, torch.nn.Parameter) if torch is not None else ()
    arrays, tensors, kept, maps = [], [], [], None
    for here, obj in held_in_parts(args, lambda obj: type(obj) is memmap or type(obj) in plain):
        if maps is None:
            maps = mappings.Maps()  # mappings None: no /proc/self/maps
        array = type(obj) is memmap
        ref, why = (mappings.reference if array else tensor_reference)(obj, maps)
        if ref is not None and array:
            arrays.append((here, ref, obj.nbytes))
        elif ref is not None:
            tensors.append((here, ref, ref.nbytes))
        elif why is not None:  # None: a tensor in no file mapping
            kept.append((here, why))
    return arrays, tensors, kept
