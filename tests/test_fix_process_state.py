"""``autosafe-torch fix`` for DL220: what main() set, given to each worker by
the loader's ``worker_init_fn``.

End to end (tests/scenarios/fix_process_state/): a script whose main() sets
a module global and class attributes that ``__getitem__`` reads, and one
whose own ``worker_init_fn`` reads a seed main() set, run under the shim as
on macOS with a JSON log; ``fix --write`` patches them; the patched script
then runs plain under spawn (and forkserver), with warnings as errors, and
gives the batches of plain fork (the known-safe run), where the original
under plain spawn gives others. Run again under the shim, it logs DL220 again (the shim sets the
values before the dataset arrives, ahead of any worker_init_fn), and fix from
that log, or from the first (now stale), changes nothing.

Not exact, from real runs (tests/scenarios/process_state/ and
``kwargs_loader``): a library-wide setting, a library function the program
replaced, a value a ``__setstate__`` reads, a call given ``**options``: the
rule's fix as a comment at the loader, and nothing else changed.

Then edge cases in this process, from hand-written records.
"""

import re
import shutil

import pytest

from support import SCENARIOS, json_log, run_file
from test_fix import WARNINGS_AS_ERRORS, assert_kept, comments, fix, run_fix

from autosafe_torch import rules

HERE = SCENARIOS / "fix_process_state"
MACOS = {"AUTOSAFE_TORCH_AS": "macos"}
HELPER = "def set_main_state(state, worker_init_fn, worker_id):"
CALL_COMMENT = "# autosafe-torch DL220: worker_init_fn sets what main() set, in each worker"


def rule_fix():
    rules.load_all()
    return rules.RULES["DL220"].fix


def shimmed(tmp_path, script, log):
    """The script under the shim as on macOS (spawn workers), logging to ``log``."""
    return run_file(tmp_path, script, "env", "spawn",
                    env=dict(MACOS, AUTOSAFE_TORCH_LOG_FILE=str(log)))


def dl220(log):
    return [r for r in json_log(log) if r["code"] == "DL220"]


# scenario -> the values its record carries, the lines of it the rewrite changes,
# whether the test runs it under the shim again (once is enough: it costs a run), and
# the start method the patched script then runs plain under (the two rotate: each run
# costs a second of CPU for every worker's import)
REWRITTEN = {
    "stats_and_scale": (["SCALE", "Spectra.mean", "Spectra.std"], (), True, "forkserver"),
    "own_init": (["LABELS", "SEED"], ("worker_init_fn=seed_worker",), False, "spawn"),
}


@pytest.mark.rule("DL220")
@pytest.mark.parametrize("scenario", sorted(REWRITTEN))
def test_the_patched_script_gives_forks_batches_under_plain_spawn(tmp_path, scenario):
    labels, touched, again, method = REWRITTEN[scenario]
    script = tmp_path / "train.py"
    shutil.copyfile(HERE / ("%s.py" % scenario), script)
    original = script.read_text()
    fork = run_file(tmp_path, script, start_method="fork")
    assert fork.rc == 0 and fork.batches, fork
    spawn = run_file(tmp_path, script, start_method="spawn")
    assert spawn.rc == 0 and spawn.batches != fork.batches, spawn  # wrong, without a word

    log = tmp_path / "run.jsonl"
    shim = shimmed(tmp_path, script, log)
    assert shim.rc == 0 and shim.batches == fork.batches, shim
    (record,) = dl220(log)
    assert [c["label"] for c in record["after"]["carried"]] == labels, record

    fixed = fix(tmp_path, log, "--write")
    assert fixed.returncode == 0, fixed.stderr
    assert re.search(r"^train\.py:\d+: DL220 rewritten: %s set in each worker by "
                     r"set_main_state" % re.escape(", ".join(labels)), fixed.stderr, re.M), \
        fixed.stderr
    assert "left as a comment" not in fixed.stderr and "wrote train.py" in fixed.stderr
    patched = script.read_text()
    assert patched.count(HELPER) == 1 and CALL_COMMENT in patched, patched
    state = ", ".join('"%s": %s' % (n, n) for n in labels)
    own = "seed_worker" if scenario == "own_init" else "None"
    assert "worker_init_fn=functools.partial(set_main_state, {%s}, %s)" % (state, own) \
        in patched, patched
    assert_kept(original, patched, touched)

    # own_init: seed_worker still runs, or no rng
    plain = run_file(tmp_path, script, start_method=method,
                     env={"PYTHONWARNINGS": WARNINGS_AS_ERRORS})
    assert plain.rc == 0 and plain.batches == fork.batches, (method, plain)

    if not again:
        return
    # The shim still sets the values before the dataset arrives, so a later run
    # logs DL220 again: fix from its log, or from the first (stale), changes nothing.
    again_log = tmp_path / "again.jsonl"
    rerun = shimmed(tmp_path, script, again_log)
    assert rerun.rc == 0 and rerun.batches == fork.batches, rerun
    for stale_or_new in (log, again_log):
        second = fix(tmp_path, stale_or_new, "--write")
        assert second.returncode == 0 and "rewritten" not in second.stderr, second.stderr
        assert script.read_text() == patched
    assert "DL220 nothing to change: worker_init_fn gives set_main_state these values " \
           "already" in second.stderr, second.stderr


def comment_block(text, code="DL220"):
    """The text of the ``# autosafe-torch CODE: ...`` comment, its lines joined."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.strip().startswith("# autosafe-torch %s:" % code))
    block = [lines[start].strip()[len("# autosafe-torch "):]]
    for line in lines[start + 1:]:
        if not line.strip().startswith("#     "):
            break
        block.append(line.strip()[len("#     "):])
    return " ".join(block)


# scenario -> what the summary says (a regular expression)
NOT_EXACT_RUNS = [
    ("process_state/default_dtype.py", r"torch's default dtype is a library-wide setting"),
    ("process_state/replaced_function.py",
     r"colorsys\.rgb_to_hsv is a value of module colorsys, not of this file"),
    ("process_state/setstate_reads.py", r"VOCAB is read in __setstate__ \(line \d+\), as "
     r"the dataset arrives in a worker, before worker_init_fn"),
    ("fix_process_state/kwargs_loader.py", r"the call passes arguments by \* or \*\*"),
]


@pytest.mark.rule("DL220")
@pytest.mark.parametrize("scenario, reason", NOT_EXACT_RUNS,
                         ids=[s.split("/")[1][:-3] for s, _ in NOT_EXACT_RUNS])
def test_what_would_not_be_exact_is_left_as_the_rules_fix(tmp_path, scenario, reason):
    script = tmp_path / "train.py"
    shutil.copyfile(SCENARIOS / scenario, script)
    shutil.copyfile(SCENARIOS / "process_state" / "_loop.py", tmp_path / "_loop.py")
    original = script.read_text()
    log = tmp_path / "run.jsonl"
    shim = shimmed(tmp_path, script, log)
    assert shim.rc == 0 and len(dl220(log)) == 1, shim

    fixed = fix(tmp_path, log, "--write")
    assert fixed.returncode == 0, fixed.stderr
    assert re.search(r"^train\.py:\d+: DL220 left as a comment: %s" % reason, fixed.stderr,
                     re.M), fixed.stderr
    assert "1 left as a comment; wrote train.py" in fixed.stderr, fixed.stderr
    patched = script.read_text()
    assert comment_block(patched) == "DL220: " + rule_fix()
    added = [line for line in patched.splitlines() if line not in original.splitlines()]
    assert all(line.lstrip().startswith("# autosafe-torch DL220: ") or
               line.lstrip().startswith("#     ") for line in added), added
    assert "set_main_state" not in patched and "functools" not in patched


# -- in this process, from hand-written records -------------------------------------------


def value(tmp_path, name, line, module="__main__", setting=False, site=""):
    """One value of a record's ``after["carried"]``, read at ``line`` of train.py
    (``site``: another place, or None)."""
    label = name if module == "__main__" or setting else "%s.%s" % (module, name)
    if site == "":
        site = "%s:%d" % ((tmp_path / "train.py").resolve(), line)
    return {"label": label, "module": module, "name": name, "site": site,
            "setting": setting, "fingerprint": "0" * 40}


def line_of(text, fragment):
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


def record(line, *carried, refused=()):
    return {"code": "DL220", "line": line,
            "after": {"carried": list(carried), "refused": list(refused)}}


SCRIPT = '''\
"""Train."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

CONFIG = {"scale": 1.0}


class Spectra(Dataset):
    mean = 0.0

    def __getitem__(self, i):
        return i * CONFIG["scale"] - Spectra.mean


def main():
    CONFIG["scale"] = 2.0
    Spectra.mean = 0.5
    loader = DataLoader(Spectra(), num_workers=2)
    for batch in loader:
        pass
'''


def test_the_rewrite_as_a_user_reads_it(tmp_path):
    new, summary = run_fix(tmp_path, SCRIPT, [record(
        20, value(tmp_path, "CONFIG", 14), value(tmp_path, "Spectra.mean", 14))])
    assert new == SCRIPT.replace('''\
from torch.utils.data import DataLoader, Dataset
''', '''\
from torch.utils.data import DataLoader, Dataset
import functools


def set_main_state(state, worker_init_fn, worker_id):  # autosafe-torch DL220: what main() \
set, in each worker
    for name, value in state.items():
        owner, _, attribute = name.rpartition(".")
        if owner:
            setattr(globals()[owner], attribute, value)
        else:
            globals()[name] = value
    if worker_init_fn is not None:
        worker_init_fn(worker_id)

''').replace('''\
    loader = DataLoader(Spectra(), num_workers=2)
''', '''\
    # autosafe-torch DL220: worker_init_fn sets what main() set, in each worker
    loader = DataLoader(Spectra(), num_workers=2, worker_init_fn=functools.partial(\
set_main_state, {"CONFIG": CONFIG, "Spectra.mean": Spectra.mean}, None))
''')
    assert "train.py:20: DL220 rewritten: CONFIG, Spectra.mean set in each worker by " \
           "set_main_state, as its worker_init_fn" in summary
    compile(new, "train.py", "exec")


def test_the_record_at_the_line_that_iterates_the_loader(tmp_path):
    """The log names the line that iterates where the loop is in the loader's own
    function: the rewrite is at the call that made it."""
    new, summary = run_fix(tmp_path, SCRIPT, [record(21, value(tmp_path, "CONFIG", 14))])
    assert 'worker_init_fn=functools.partial(set_main_state, {"CONFIG": CONFIG}, None))' in new
    assert "DL220 rewritten" in summary


def test_own_function_name_and_module_names_of_the_file(tmp_path):
    """The loader's own worker_init_fn goes last in the partial; a file with a
    set_main_state of its own gets another name; its own name for functools is
    used; two loaders share one function."""
    text = ('import functools as ft\n'
            'from torch.utils.data import DataLoader\n'
            'SEED = 0\n'
            'def set_main_state():\n'
            '    pass\n'
            'def seed(worker_id):\n'
            '    return SEED + worker_id\n'
            'def main():\n'
            '    global SEED\n'
            '    SEED = 7\n'
            '    a = DataLoader(ds, num_workers=2, worker_init_fn=seed)\n'
            '    b = DataLoader(ds, num_workers=2)\n')
    new, summary = run_fix(tmp_path, text, [record(11, value(tmp_path, "SEED", 7)),
                                            record(12, value(tmp_path, "SEED", 7))])
    assert new.count("def set_main_state_2(state, worker_init_fn, worker_id):") == 1
    assert "import functools\n" not in new
    assert 'a = DataLoader(ds, num_workers=2, worker_init_fn=ft.partial(set_main_state_2, ' \
           '{"SEED": SEED}, seed))' in new
    assert 'b = DataLoader(ds, num_workers=2, worker_init_fn=ft.partial(set_main_state_2, ' \
           '{"SEED": SEED}, None))' in new
    assert summary.count("DL220 rewritten") == 2
    # after the imports, before the first statement that is not one (PEP 8's blank lines)
    assert "from torch.utils.data import DataLoader\n\n\ndef set_main_state_2(" in new
    assert "worker_init_fn(worker_id)\n\n\nSEED = 0\n" in new


def test_a_lambda_lifted_by_dl202_is_the_loaders_own(tmp_path):
    """DL202 lifts the lambda (given a partial for what it reads); DL220 wraps
    what DL202 made."""
    text = ('from torch.utils.data import DataLoader\n'
            'SCALE = 1\n'
            'def main(k):\n'
            '    global SCALE\n'
            '    SCALE = 2\n'
            '    loader = DataLoader(ds, num_workers=2, worker_init_fn=lambda i: print(i + k))\n'
            '    for x in loader:\n'
            '        pass\n')
    new, summary = run_fix(tmp_path, text, [
        {"code": "DL202", "line": 7, "before": {"worker_init_fn": "<lambda>"}},
        record(6, value(tmp_path, "SCALE", 2))])
    assert "worker_init_fn=functools.partial(set_main_state, {\"SCALE\": SCALE}, " \
           "functools.partial(worker_init_fn, k=k)))" in new, new
    assert "DL202 rewritten" in summary and "DL220 rewritten" in summary
    compile(new, "train.py", "exec")


def test_two_records_of_one_loader_give_it_one_dict(tmp_path):
    """Two lines of the log name one loader (where it is made, where it is
    iterated): one partial, with the values of both."""
    new, summary = run_fix(tmp_path, SCRIPT, [record(20, value(tmp_path, "CONFIG", 14)),
                                              record(21, value(tmp_path, "Spectra.mean", 14))])
    assert new.count("functools.partial(") == 1 and new.count(HELPER) == 1
    assert 'functools.partial(set_main_state, {"CONFIG": CONFIG, "Spectra.mean": ' \
           'Spectra.mean}, None)' in new
    assert "train.py:21: DL220 nothing to change: the loader's worker_init_fn sets these " \
           "values already" in summary


def test_a_script_run_by_a_relative_path_is_read_by_its_relative_site(tmp_path):
    new, summary = run_fix(tmp_path, SCRIPT, [record(
        20, value(tmp_path, "CONFIG", 14, site="train.py:14"))])
    assert "DL220 rewritten" in summary, summary


def test_again_from_a_new_log_only_what_the_dict_lacks_is_added(tmp_path):
    first, _ = run_fix(tmp_path, SCRIPT, [record(20, value(tmp_path, "CONFIG", 14))])
    line, read = line_of(first, "loader = "), line_of(first, "return i * CONFIG")
    same, summary = run_fix(tmp_path, first, [record(line, value(tmp_path, "CONFIG", read))])
    assert same == first
    assert "DL220 nothing to change: worker_init_fn gives set_main_state these values " \
           "already" in summary
    more, summary = run_fix(tmp_path, first, [record(
        line, value(tmp_path, "CONFIG", read), value(tmp_path, "Spectra.mean", read))])
    assert 'functools.partial(set_main_state, {"CONFIG": CONFIG, "Spectra.mean": ' \
           'Spectra.mean}, None)' in more
    assert more.count(HELPER) == 1 and more.count(CALL_COMMENT) == 1
    assert "DL220 rewritten: Spectra.mean added to what set_main_state sets" in summary


# text, line of the record, its carried values ({name: keywords of value()}), refused,
# the reason the summary gives
NOT_EXACT = [
    ("setting", SCRIPT, 20, {"torch's default dtype": {"module": "torch", "setting": True}},
     (), "torch's default dtype is a library-wide setting"),
    ("another module", SCRIPT, 20, {"loads": {"module": "json"}}, (),
     "json.loads is a value of module json, not of this file"),
    ("not carried", SCRIPT, 20, {"CONFIG": {}},
     ("DB (train.py:14) cannot be carried to a spawned worker: it does not pickle",),
     "DB (train.py:14) cannot be carried to a spawned worker: it does not pickle"),
    ("one of two", SCRIPT, 20, {"CONFIG": {}, "Spectra.mean": {"site": "/elsewhere/x.py:3"}},
     (), "Spectra.mean is read in another file (/elsewhere/x.py:3)"),
    ("no site", SCRIPT, 20, {"CONFIG": {"site": None}}, (),
     "CONFIG is read in another file (None)"),
    ("not bound here", SCRIPT, 20, {"OTHER": {}}, (),
     "OTHER is not bound at module level in this file"),
    ("nested class", SCRIPT, 20, {"Spectra.Inner.size": {}}, (),
     "Spectra.Inner.size is not a global or a class attribute of this file"),
    ("positional", SCRIPT.replace("Spectra(), num_workers=2",
                                  "Spectra(), 1, False, None, None, 2, None, False, False, 0, "
                                  "seed"), 20, {"CONFIG": {}}, (),
     "worker_init_fn is passed by position"),
    ("star", SCRIPT.replace("Spectra(), num_workers=2", "Spectra(), *rest"), 20,
     {"CONFIG": {}}, (), "the call passes arguments by * or **"),
    ("site in __setstate__",
     SCRIPT.replace("    def __getitem__", "    def __setstate__(self, state):\n"
                    "        self.k = CONFIG\n\n    def __getitem__"), 23, {"CONFIG": {}}, (),
     "CONFIG is read in __setstate__ (line 13), as the dataset arrives in a worker, "
     "before worker_init_fn"),
    ("a __setstate__ reads it too",
     SCRIPT.replace("    def __getitem__", "    def __setstate__(self, state):\n"
                    "        self.m = self.mean\n\n    def __getitem__"), 23,
     {"Spectra.mean": {"line": 17}}, (),
     "Spectra.mean is read in __setstate__ (line 13), as the dataset arrives in a worker, "
     "before worker_init_fn"),
    ("a local name there", SCRIPT.replace("def main():", "def main(CONFIG=CONFIG):"), 20,
     {"CONFIG": {}}, (), "CONFIG is a local name where the loader is made"),
    ("set again after",
     SCRIPT.replace("    for batch", "    Spectra.mean = 0.25\n    for batch"),
     20, {"Spectra.mean": {}}, (),
     "Spectra.mean is set again at line 21, after the loader is made"),
    ("set in a function named after",
     SCRIPT.replace("    for batch in loader:\n        pass\n",
                    "    train(loader, before_epoch=harder)\n\n"
                    "def harder(epoch):\n    global CONFIG\n    CONFIG = {'scale': epoch}\n"),
     20, {"CONFIG": {}}, (),
     "CONFIG is set in harder (line 25), which runs after the loader is made"),
]


@pytest.mark.parametrize("text, line, carried, refused, reason",
                         [case[1:] for case in NOT_EXACT], ids=[case[0] for case in NOT_EXACT])
def test_where_the_rewrite_would_not_be_exact_the_whole_record_is_a_comment(
        tmp_path, text, line, carried, refused, reason):
    values = [value(tmp_path, name, keywords.pop("line", 14), **keywords)
              for name, keywords in ((n, dict(k)) for n, k in carried.items())]
    new, summary = run_fix(tmp_path, text, [record(line, *values, refused=refused)])
    assert "train.py:%d: DL220 left as a comment: %s" % (line, reason) in summary, summary
    comment = "# autosafe-torch DL220: the permanent fix of DL220"
    assert comment in new
    assert [x for x in new.splitlines() if x.strip() != comment] == text.splitlines()


def test_values_set_before_the_loader_elsewhere_are_exact(tmp_path):
    """Set in a function main() calls before the loader, or in a loop before the
    loader it makes each time: the dict holds what fork's workers see."""
    text = SCRIPT.replace('    CONFIG["scale"] = 2.0\n',
                          "    configure()\n").replace(
        "def main():", "def configure():\n    global CONFIG\n    CONFIG = {'scale': 2.0}\n\n\n"
        "def main():")
    new, summary = run_fix(tmp_path, text, [record(line_of(text, "loader = "),
                                                   value(tmp_path, "CONFIG", 14))])
    assert "DL220 rewritten" in summary, summary
    assert comments(new).count(CALL_COMMENT) == 1
