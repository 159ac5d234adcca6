"""HF Accelerate (Accelerator(cpu=True), prepare, autocast), healthy and with
two ordinary mistakes: a lambda as the dataset's transform, and no
``if __name__ == "__main__":`` guard; under fork and as on macOS.

``prepare`` builds a new DataLoader around the user's dataset inside
``accelerate/data_loader.py`` and iterates it from there: the log must name
the user's DataLoader line, with Accelerate's frame second.
"""

import pytest

from runner import START_METHODS, line_of, plain_run, run, script_text, site_re

FRAMEWORK = "accelerate"
NAME = "accelerate_train.py"
MISTAKES = {
    "lambda-transform": [("Records(transform=scale)", "Records(transform=lambda x: x * 2 - 1)")],
    "unguarded-main": [('if __name__ == "__main__":\n    main()', "main()")],
}
PLAIN_ERROR = {
    "lambda-transform": "Can't pickle local object 'main.<locals>.<lambda>'",
    "unguarded-main": "current process has finished its bootstrapping phase",
}
EXPECTED = {"lambda-transform": "DL202", "unguarded-main": "DL204"}  # the lambda by value


def healthy(tmp_path, method):
    return plain_run(tmp_path, NAME, method).batches()


@pytest.mark.parametrize("method", START_METHODS)
def test_healthy_loop_same_batches_no_intervention(tmp_path, method):
    batches = healthy(tmp_path, method)
    shim = run(tmp_path, NAME, script_text(NAME), True, method)
    assert shim.rc == 0 and shim.batches() == batches, shim
    assert shim.records == [], shim


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_mistake_under_fork_runs_as_is(tmp_path, mistake):
    """Linux's fork neither pickles the dataset nor re-runs __main__: nothing to fix."""
    text = script_text(NAME, MISTAKES[mistake])
    plain = run(tmp_path, NAME, text, False, "fork")
    assert plain.rc == 0 and plain.batches() == healthy(tmp_path, "fork"), plain
    shim = run(tmp_path, NAME, text, True, "fork")
    assert shim.rc == 0 and shim.batches() == plain.batches(), shim
    assert shim.records == [], shim


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_mistake_as_on_macos_fixed_at_the_users_line(tmp_path, mistake):
    text = script_text(NAME, MISTAKES[mistake])
    plain = run(tmp_path, NAME, text, False, "spawn")
    assert plain.rc != 0 and PLAIN_ERROR[mistake] in plain.stderr, plain
    shim = run(tmp_path, NAME, text, True, "spawn")
    assert shim.rc == 0, shim
    assert shim.batches() == healthy(tmp_path, "spawn"), shim
    assert shim.codes("DL") == [EXPECTED[mistake]], shim
    record = next(r for r in shim.records if r["code"] == EXPECTED[mistake])
    assert record["strategy"], record
    # The loader iterated is the one prepare() built inside Accelerate; the
    # site is the user's DataLoader line, Accelerate's frame second.
    line = line_of(text, "loader = DataLoader(dataset")
    assert site_re(tmp_path / NAME, line, via="accelerate/data_loader.py").match(
        record["call_site"]), record
