"""A Lightning Trainer (CPU, 2 epochs), healthy and with prefetch_factor and
persistent_workers on a loader with no workers, under fork and as on macOS.

Lightning runs the user's ``*_dataloader`` hooks with DataLoader.__init__
wrapped by its own wrapper, and re-creates the predict loader from the saved
arguments (``lightning/fabric/utilities/data.py``): the log must name the
user's lines, never Lightning's.
"""

import os

import pytest

from runner import START_METHODS, line_of, plain_run, run, script_text, site_re

FRAMEWORK = "lightning"
NAME = "lightning_train.py"
MISTAKE = [("num_workers=NUM_WORKERS)",
            "num_workers=0, prefetch_factor=4, persistent_workers=True)")]


def healthy(tmp_path, method):
    plain = plain_run(tmp_path, NAME, method)
    return plain.batches(), plain.batches("PREDICT")


@pytest.mark.parametrize("method", START_METHODS)
def test_healthy_trainer_same_batches_no_intervention(tmp_path, method):
    batches, predict = healthy(tmp_path, method)
    shim = run(tmp_path, NAME, script_text(NAME), True, method)
    assert shim.rc == 0, shim
    assert shim.batches() == batches and shim.batches("PREDICT") == predict, shim
    assert shim.records == [], shim


@pytest.mark.parametrize("method", START_METHODS)
def test_prefetch_without_workers_fixed_at_the_users_lines(tmp_path, method):
    text = script_text(NAME, MISTAKE)
    plain = run(tmp_path, NAME, text, False, method)
    assert plain.rc != 0 and "prefetch_factor option could only be specified" in plain.stderr
    shim = run(tmp_path, NAME, text, True, method)
    assert shim.rc == 0, shim
    batches, predict = healthy(tmp_path, method)
    assert shim.batches() == batches and shim.batches("PREDICT") == predict, shim
    script = str(tmp_path / NAME)
    train = line_of(text, "return DataLoader(Squares(), batch_size=8")
    pred = line_of(text, "return DataLoader(Squares(16)")
    assert shim.codes() == ["DL101", "DL102"], shim
    # call_site is as the stderr line shows it; cwd resolves a relative path
    sites = {(r["code"], os.path.join(r["cwd"], r["call_site"])) for r in shim.records}
    assert sites == {(code, "%s:%d" % (script, line))
                     for code in ("DL101", "DL102") for line in (train, pred)}, shim
    # The predict loader Lightning re-made from the user's arguments counts
    # at the user's line: 3 fixes (train, predict, its re-creation), 2 sites.
    assert "summary: fixed DL101 x3 (2 call sites), DL102 x3 (2 call sites)" in shim.stderr
    assert "lightning/" not in "".join(r["call_site"] for r in shim.records)
    assert all(site_re(script, train).match(r["call_site"]) or
               site_re(script, pred).match(r["call_site"]) for r in shim.records)
