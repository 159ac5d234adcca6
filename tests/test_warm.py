"""A run forked from the warm interpreter (tests/warm.py) is the process a
fresh ``python`` would have started, as far as a script can tell.

The probe prints what a script sees of its start, before and after it
imports torch; the same probe runs fresh and warm, and every line must match.
"""

import json
import subprocess
import sys

import pytest

import support
import warm

PROBE = r'''
import atexit, json, os, sys, warnings

def facts(when):
    import __main__
    out = {
        "when": when,
        "argv": sys.argv, "path": sys.path[:4], "cwd": os.getcwd(),
        "fds": sorted(os.listdir("/proc/self/fd")),
        "main": sorted(k for k in vars(__main__) if k.startswith("__")),
        "file": __main__.__file__, "spec": repr(__main__.__spec__),
        "torch": "torch" in sys.modules,
        "mp main": sys.modules.get("__mp_main__", __main__) is __main__,
        "mp dir": getattr(sys.modules.get("multiprocessing.process"), "ORIGINAL_DIR",
                          os.getcwd()) == os.getcwd(),
        "env": {k: os.environ.get(k)
                for k in ("AUTOSAFE_TEST_START_METHOD", "HOME", "SCENARIO_TMP")},
        "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
        "start method": __import__("multiprocessing").get_start_method(allow_none=True),
        "filters": [str(f[2].__name__) for f in warnings.filters][:3],
    }
    print(json.dumps(out, sort_keys=True), flush=True)

facts("start")
warnings.simplefilter("error", DeprecationWarning)  # torch's own filters go in front
atexit.register(lambda: print("exit: the script's", flush=True))
import torch
facts("torch")
print("spec", torch.__spec__.name, type(torch.__loader__).__name__, flush=True)
print("first filter", warnings.filters[0][2].__name__, warnings.filters[1][0], flush=True)
if sys.argv[1:] == ["fail"]:
    raise ValueError("as asked")
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
'''


def both(tmp_path, args, activation=None):
    """The probe's (rc, stdout, stderr), fresh and warm, with the env activation's
    variables where asked."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = support.clean_env({"AUTOSAFE_TEST_START_METHOD": "spawn",
                              "SCENARIO_TMP": str(tmp_path)})
    env["PYTHONPATH"] = str(support.PLATFORM_SIM)
    if activation == "env":
        env["AUTOSAFE_TORCH"] = "1"
    cmd = [sys.executable, str(script), *args]
    fresh = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                           timeout=120)
    server = support.warm_server()
    assert server is not None and not warm.read_early(env, server.env)
    warmed = server.run(cmd, tmp_path, env, 120)
    return ((p.returncode, p.stdout, p.stderr) for p in (fresh, warmed))


@pytest.mark.parametrize("args", [(), ("3",), ("fail",)])
def test_a_warm_run_is_what_a_fresh_interpreter_runs(tmp_path, args):
    fresh, warmed = both(tmp_path, args)
    assert warmed == fresh
    facts = [json.loads(line) for line in fresh[1].splitlines() if line.startswith("{")]
    assert [f["torch"] for f in facts] == [False, True]
    assert all(f["mp main"] and f["mp dir"] for f in facts)
    assert facts[0]["sitecustomize"].startswith(str(support.PLATFORM_SIM))
    assert facts[0]["start method"] == "spawn"
    assert "first filter Warning ignore" in fresh[1]  # torch's, in front of the script's


def test_the_env_activation_runs_where_the_pth_line_would(tmp_path):
    fresh, warmed = both(tmp_path, (), activation="env")
    assert warmed == fresh
    assert "activated after" not in fresh[2]  # the shim saw torch imported after it


def test_a_variable_read_at_start_means_a_fresh_interpreter():
    server_env = {"PATH": "/bin", "PYTHONUNBUFFERED": "1"}
    assert warm.eligible(dict(server_env, AUTOSAFE_TORCH="1", PYTHONPATH="/x"), server_env)
    assert not warm.eligible(dict(server_env, OMP_NUM_THREADS="1"), server_env)
    assert not warm.eligible(dict(server_env, AUTOSAFE_TEST_CPUS="1"), server_env)
    assert not warm.eligible({"PATH": "/bin"}, server_env)
