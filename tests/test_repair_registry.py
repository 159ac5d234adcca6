"""The registry of repairs (rules/repairs.py): one entry per kind of holder,
from which the plan's fields, the planner's order and DL201's words come."""

import pytest

from autosafe_torch.rules import RULES, load_all, repairs
from autosafe_torch.rules.pickling_plan import PicklingPlan
from autosafe_torch.rules.repairs import REPAIRS, by_rank, what_dl201_says
from support import json_log, logged, run_script


def test_the_plan_has_one_field_per_repair_and_needs_one_where_any_is_held():
    plan = PicklingPlan()
    assert all(hasattr(plan, r.field) for r in REPAIRS)
    assert not plan.needs_repair
    for repair in REPAIRS:
        plan = PicklingPlan()
        setattr(plan, repair.field, {"x": 1} if isinstance(repair.empty(), dict) else ["x"])
        # DL219's loggers pickle as they are: carried, not repaired
        assert plan.needs_repair is not repair.carried, repair.field


def test_every_repair_dl201_says_has_its_words_and_its_fix():
    load_all()
    rule = RULES["DL201"]
    for repair in REPAIRS:
        if repair.code == "DL201":
            assert repair.said is not None and repair.fix_rank < 99, repair.field
            assert repair.summary in rule.summary and repair.prevents in rule.prevents
        else:  # said by a rule of its own
            assert repair.said is None and not repair.summary, repair.field


def test_the_planner_tries_them_in_the_declared_order():
    assert [r.field for r in by_rank("looks")] == ["pools", "forwarders", "images", "loggers"]
    assert [r.field for r in by_rank("looks") if r.looks_when_met] == ["pools", "forwarders"]
    # the rebuild last: it runs the user's code, where no fork rung is safe
    assert [r.field for r in by_rank("meets")] == ["by_value", "handlers", "files", "maps",
                                                  "locks", "classes", "nested", "rebuilt"]


def test_only_the_rebuild_runs_the_users_code():
    assert [r.field for r in REPAIRS if r.runs_user_code] == ["rebuilt"]


def _said(**held):
    """A plan holding ``held``."""
    plan = PicklingPlan()
    for field, value in held.items():
        setattr(plan, field, value)
    return plan


def test_the_fix_is_the_first_present_by_rank(monkeypatch):
    monkeypatch.setattr(repairs, "REPAIRS", tuple(  # each says its field's name
        r._replace(said=lambda found, args, f=r.field: repairs.Said(
            {f: 1}, [f], [f], [f], lambda a: None)) if r.said else r for r in REPAIRS))
    args = {"num_workers": 2}
    cases = [
        ({"files": ("p", "e", None), "rebuilt": ["d"]}, None),  # reopened by path: no fix
        ({"images": ["i"], "handlers": ["h"]}, repairs.REBUILD_FIX),
        ({"images": ["i"]}, None),  # its own (read where said)
        ({"locks": ("p", "e", []), "forwarders": {int: "p"}}, repairs.FORWARDER_FIX),
        ({"locks": ("p", "e", [])}, repairs.LOCK_FIX),
    ]
    for held, fix in cases:
        said = what_dl201_says(_said(**held), args)
        if "images" in held and len(held) == 1:
            assert said["fix"].startswith("open the image lazily"), said
        else:
            assert said["fix"] == fix, (held, said["fix"])
        # said in the registry's order, one strategy
        assert said["strategy"].startswith("repair: ") and said["done"].endswith("2 workers")
    assert what_dl201_says(_said(by_value={"collate_fn": (None, "why")}), args) is None


# A kind of holder the shim does not know: one entry, appended in the program.
NEW_KIND = """
    import torch
    from torch.utils.data import DataLoader, Dataset


    class Latch:
        \"\"\"A lock of the program's own: it does not pickle.\"\"\"

        def __init__(self, scale):
            self.scale = scale

        def __reduce_ex__(self, protocol):
            raise TypeError("cannot pickle 'Latch' object")


    def made_again(scale):  # in each worker
        return Latch(scale)


    def reduce_latch(latch):
        return made_again, (latch.scale,)


    class Scaled(Dataset):
        def __init__(self):
            self.latch = Latch(3)

        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.tensor([i * self.latch.scale])


    if __name__ == "__main__":
        from autosafe_torch.inspection.parts import PARTS
        from autosafe_torch.rules import repairs
        from autosafe_torch.rules.pickling_plan import plan_pickling

        repairs.REPAIRS.append(repairs.Repair(
            "latches", "DL201", list, plan_rank=7, fix="make latches lazily", fix_rank=5,
            meets=lambda m: (m.failure.path, m.value) if isinstance(m.value, Latch) else None,
            reducers=lambda found: {Latch: reduce_latch},
            said=lambda found, args: repairs.Said(
                {"latches": [path for path, _latch in found]}, ["a latch does not pickle"],
                ["%s made again" % found[0][0]], ["make latches again"])))
        dataset = Scaled()
        parts = {**dict.fromkeys(PARTS), "dataset": dataset}
        print("PLANNED", [path for path, _latch in plan_pickling(parts).latches])
        digest(DataLoader(dataset, batch_size=2, num_workers=0))  # the known-safe batches
        digest(DataLoader(dataset, batch_size=2, num_workers=2))
"""


@pytest.mark.rule("DL201")
def test_a_holder_is_one_entry(tmp_path):
    """A kind of holder the shim does not know, one entry appended to the
    registry by the program: the probe meets it, the plan holds it, DL201 says
    it in its words with its fix, and spawned workers give the batches of no
    workers."""
    log = tmp_path / "log.jsonl"
    run = run_script(tmp_path, NEW_KIND, activation="env", start_method="spawn",
                     env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert run.rc == 0, run
    assert "PLANNED ['dataset.latch']" in run.stdout, run
    safe, workers = [line.split()[1] for line in run.stdout.splitlines()
                     if line.startswith("BATCHES ")]
    assert workers == safe
    (record,) = [r for r in json_log(log) if r["code"] == "DL201"]
    assert record["before"] == {"latches": ["dataset.latch"]} and record["action"] == "fixed"
    assert record["strategy"] == "repair: make latches again in each worker", record
    assert record["done"] == "dataset.latch made again in each of 2 workers", record
    (said,) = logged(run.stderr, "DL201")
    assert said.fix == record["fix"] == "make latches lazily", said
