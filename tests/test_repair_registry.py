"""The registry of repairs (rules/repairs.py): one entry per kind of holder,
from which the plan's fields, the planner's order and DL201's words come."""

import types

from autosafe_torch.rules import repairs
from autosafe_torch.rules.pickling_plan import PicklingPlan
from autosafe_torch.rules.repairs import BY_FIELD, OFFERED, REPAIRS, what_dl201_says


def test_the_plan_has_one_field_per_repair_and_needs_one_where_any_is_held():
    plan = PicklingPlan()
    assert {r.field for r in REPAIRS} <= set(PicklingPlan.__slots__)
    assert not plan.needs_repair
    for repair in REPAIRS:
        plan = PicklingPlan()
        setattr(plan, repair.field, {"x": 1} if isinstance(repair.empty(), dict) else ["x"])
        assert plan.needs_repair, repair.field


def test_every_repair_dl201_says_has_its_words_and_its_fix():
    for repair in REPAIRS:
        if repair.code == "DL201":
            assert repair.said is not None and repair.fix_rank < 99, repair.field
        else:  # said by a rule of its own
            assert repair.said is None, repair.field


def test_the_planner_offers_a_failure_in_the_declared_order():
    assert [r.field for r in OFFERED] == ["by_value", "handlers", "files", "maps", "locks",
                                          "classes", "nested"]


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


def test_a_holder_is_one_entry():
    """A new kind of holder, registered, is planned from a failure and said by
    DL201 with nothing else changed."""
    held = types.SimpleNamespace()

    new = repairs.Repair(
        "widgets", "DL201", list, meets=lambda m: (m.failure.path, m.value)
        if m.value is held else None, said=lambda found, args: repairs.Said(
            {"widgets": [p for p, _v in found]}, ["a widget"], ["widgets made again"],
            ["make widgets again"], lambda a: None), fix="make widgets lazily", fix_rank=5,
        plan_rank=7)
    plan = types.SimpleNamespace(widgets=[], nested=None, classes={}, handlers=[], files=None,
                                 maps=None, locks=None, by_value={})
    meeting = repairs.Meeting(types.SimpleNamespace(path="dataset.w", error="no"), held,
                              type(held), "dataset", "dataset.w: no", {}, plan, lambda: None)
    saved = repairs.OFFERED
    try:
        repairs.OFFERED = (new,)
        planned = {}
        assert repairs.offer(plan, meeting, planned)
        assert plan.widgets == [("dataset.w", held)] and planned == {}
    finally:
        repairs.OFFERED = saved
    assert BY_FIELD["rebuilt"].runs_user_code
