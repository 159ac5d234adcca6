"""Facts: CPUs usable under a cgroup CPU quota, start methods, injection."""

import sys

from autosafe_torch import facts


def test_cgroup_v2_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert facts.cgroup_cpu_limit(str(tmp_path)) == 2  # 1.5 CPUs: round up
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert facts.cgroup_cpu_limit(str(tmp_path)) is None


def test_cgroup_v1_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert facts.cgroup_cpu_limit(str(tmp_path)) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert facts.cgroup_cpu_limit(str(tmp_path)) is None


def test_no_cgroup_files(tmp_path):
    assert facts.cgroup_cpu_limit(str(tmp_path)) is None


def test_cpus_usable_takes_the_smaller_of_affinity_and_quota(monkeypatch):
    monkeypatch.setattr(facts, "cgroup_cpu_limit", lambda: 1)
    assert facts.cpus_usable() == 1
    monkeypatch.setattr(facts, "cgroup_cpu_limit", lambda: None)
    assert facts.cpus_usable() >= 1


def test_default_start_methods_per_platform():
    assert facts.default_start_method("darwin") == "spawn"
    assert facts.default_start_method("win32") == "spawn"
    expected = "forkserver" if sys.version_info >= (3, 14) else "fork"
    assert facts.default_start_method("linux") == expected


def test_effective_start_method_of_a_context():
    import multiprocessing

    assert facts.effective_start_method("spawn") == "spawn"
    assert facts.effective_start_method(multiprocessing.get_context("forkserver")) == "forkserver"


def test_override_is_what_rules_see():
    injected = facts.Facts(platform="darwin", start_method="spawn", cpus_usable=3)
    facts.override(injected)
    try:
        assert facts.current() is injected
    finally:
        facts.override(None)
    assert facts.current() is not injected
