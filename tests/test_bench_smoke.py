"""The benchmark driver runs and writes its table (no timing asserted here:
timings belong to `make bench`, not to tests)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "benchmarks" / "run.py"


@pytest.mark.heavy  # make heavy (CI): the benchmarks' own run, not a behaviour
@pytest.mark.skipif(not DRIVER.exists(), reason="no benchmarks/run.py")
def test_bench_quick_writes_a_table(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSAFE_TORCH")}
    env["BENCH_QUICK"] = "1"
    proc = subprocess.run(
        [sys.executable, str(DRIVER), "--only", "3,4,6", "--out", str(tmp_path), "--no-readme"],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "RESULTS.md").read_text()
    assert "| figure | budget | measured (median, min – max) | verdict | note |" in text
    assert "Machine:" in text and "torch" in text
    rows = [line for line in text.splitlines() if line.startswith("| 3a") or line.startswith("| 4a")
            or line.startswith("| 6a")]
    assert len(rows) == 3, text
    for row in rows:
        assert any(v in row for v in ("| ok |", "| over budget |", "| n/a |")), row
    assert (tmp_path / "results.json").exists()
    assert "| figure |" in proc.stdout
