"""MONAI: a Dataset and a CacheDataset with random dictionary transforms,
MONAI's DataLoader (2 workers) and ThreadDataLoader, 2 epochs; healthy and
with a lambda stored inside a MONAI transform (Lambdad), under fork and as
on macOS.

MONAI imports cv2 when OpenCV is installed (the test extra installs it), so
CV401/CV402 act in every run, healthy or not: the healthy runs must record
no DataLoader intervention.
"""

import pytest

from runner import START_METHODS, line_of, plain_run, run, script_text, site_re

FRAMEWORK = "monai"
NAME = "monai_train.py"
MISTAKE = [("func=invert)", "func=lambda x: 1 - x)")]


def healthy(tmp_path, method):
    return plain_run(tmp_path, NAME, method).batches()


def _no_loader_interventions(run_):
    assert run_.codes("DL") == [] and run_.codes("AMP") == [], run_
    assert set(run_.codes()) <= {"CV401", "CV402"}, run_


@pytest.mark.parametrize("method", START_METHODS)
def test_healthy_pipeline_same_batches_no_loader_intervention(tmp_path, method):
    batches = healthy(tmp_path, method)
    shim = run(tmp_path, NAME, script_text(NAME), True, method)
    assert shim.rc == 0 and shim.batches() == batches, shim
    _no_loader_interventions(shim)


def test_lambda_in_a_transform_under_fork_runs_as_is(tmp_path):
    text = script_text(NAME, MISTAKE)
    plain = run(tmp_path, NAME, text, False, "fork")
    assert plain.rc == 0 and plain.batches() == healthy(tmp_path, "fork"), plain
    shim = run(tmp_path, NAME, text, True, "fork")
    assert shim.rc == 0 and shim.batches() == plain.batches(), shim
    _no_loader_interventions(shim)


def test_lambda_in_a_transform_as_on_macos(tmp_path):
    text = script_text(NAME, MISTAKE)
    plain = run(tmp_path, NAME, text, False, "spawn")
    assert plain.rc != 0 and "Can't pickle local object 'main.<locals>.<lambda>'" \
        in plain.stderr, plain
    shim = run(tmp_path, NAME, text, True, "spawn")
    assert shim.rc == 0, shim
    # The same batches as the healthy run: MONAI seeds each transform per worker.
    assert shim.batches() == healthy(tmp_path, "spawn"), shim
    assert shim.codes("DL") == ["DL202"], shim  # the lambda goes by value
    record = next(r for r in shim.records if r["code"] == "DL202")
    assert "transform" in str(record["before"]) + str(record["why"]), record
    assert record["strategy"] == "by-value", record
    assert site_re(tmp_path / NAME, line_of(text, "for batch in loader:")).match(
        record["call_site"]), record
