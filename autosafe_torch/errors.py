"""Errors autosafe_torch raises for the user to read (besides torch's own)."""

import textwrap


class NoExactRung(RuntimeError):
    """No rung of the repair ladder gives the batches of the requested workers
    exactly (on macOS, emulated workers need a copy of each object the
    dataset holds, and this one has none): the loader is not run, rather
    than run with other batches. ``reason``: one line; ``fix``: the
    permanent fix."""

    def __init__(self, reason, fix=None):
        self.reason = reason
        self.fix = fix or FIX
        super().__init__("autosafe_torch: DataLoader not started: no rung gives the batches of "
                         "its workers exactly\n  %s\n%s" % (reason, textwrap.fill(
                             self.fix, 100, initial_indent="  fix: ",
                             subsequent_indent="       ", break_on_hyphens=False)))


FIX = ("open files, readers and connections lazily in __getitem__ or __iter__ (or in "
       "worker_init_fn), not in __init__; keep no generator or weak proxy on the dataset")
