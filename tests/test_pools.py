"""DL208: a thread pool held by the dataset, rebuilt in each worker."""


import pytest

from autosafe_torch.inspection import holdings
from autosafe_torch.remedies import pools
from support import json_log, one_of, run_scenario


@pytest.mark.rule("DL208")
@pytest.mark.parametrize("method", one_of(("fork", "spawn", "forkserver"), "fork"))
def test_a_used_pool_hangs_or_fails_without_and_runs_with(tmp_path, method):
    ref = run_scenario(tmp_path, "thread_pool.py", args=("0",))
    assert ref.rc == 0, ref
    bad = run_scenario(tmp_path, "thread_pool.py", start_method=method, args=("2",))
    assert bad.rc != 0
    assert ("timed out" in bad.stderr) if method == "fork" else ("pickle" in bad.stderr), bad
    log = tmp_path / "log.jsonl"
    good = run_scenario(tmp_path, "thread_pool.py", start_method=method, activation="env",
                        args=("2",), env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert good.rc == 0 and good.batches == ref.batches, good
    records = json_log(log)
    warm = [("DL209", "warm forkserver")] if method == "spawn" else []  # repaired for spawn
    assert [(r["code"], r["strategy"]) for r in records] == \
        [("DL208", "new pool per worker")] + warm
    assert "create the pool lazily" in records[0]["fix"]


def test_rebuild_keeps_the_size_and_replaces_in_place():
    from concurrent.futures import ThreadPoolExecutor

    class Holder:
        pass

    h = Holder()
    h.pool = ThreadPoolExecutor(3, thread_name_prefix="decode")
    h.pool.submit(int).result()
    old = h.pool
    assert pools.rebuild_pools(h) == ["dataset.pool"]
    assert h.pool is not old and h.pool._max_workers == 3
    assert not holdings.thread_pool_in_use(h.pool)
    old.shutdown()
