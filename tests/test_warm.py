"""A run forked from the warm interpreter (tests/warm.py) is the process a
fresh ``python`` would have started, as far as a script can tell.

The probe prints what a script sees of its start, before and after it
imports torch; the same probe runs fresh and warm, and every line must match.
"""

import json
import re
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
atexit.register(lambda: print("exit: the script's; last", getattr(sys, "last_type", None),
                              flush=True))
import torch
facts("torch")
print("spec", torch.__spec__.name, type(torch.__loader__).__name__, flush=True)
print("cpus", len(os.sched_getaffinity(0)), "threads", torch.get_num_threads(), flush=True)
print("the script's filter at", [i for i, f in enumerate(warnings.filters)
                                  if f[0] == "error" and f[2] is DeprecationWarning], flush=True)
# What a real script does next: a model, an optimizer, a step (torch._dynamo's import).
import logging
import tempfile


def dynamo(when):
    print("dynamo", when, "torch._dynamo" in sys.modules, hasattr(torch, "_dynamo"),
          os.environ.get("TORCHINDUCTOR_CACHE_DIR"), hasattr(torch.manual_seed, "__wrapped__"),
          tempfile.tempdir, sum(n.startswith("torch._dynamo")
                                for n in logging.Logger.manager.loggerDict), flush=True)


dynamo("before the seed")
torch.manual_seed(0)  # torch._dynamo's import wraps it: a seed alone imports nothing
dynamo("before the step")
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(2, 3)).sum().backward()
optimizer.step()
import hashlib
torch_modules = sorted(m for m in sys.modules if m.partition(".")[0] == "torch")
dynamo("after the step")
print("after the step", "torch._dynamo" in sys.modules, len(torch_modules),
      hashlib.sha256(" ".join(torch_modules).encode()).hexdigest()[:12],
      os.environ.get("TORCHINDUCTOR_CACHE_DIR"), len(warnings.filters), flush=True)


class Held:
    """Held by the failing frame: freed when the interpreter drops sys.last_traceback."""

    def __del__(self):
        os.write(1, b"held: freed\n")


def fail():
    held = Held()  # noqa: F841  (kept by the frame)
    raise ValueError("as asked")


if sys.argv[1:] == ["fail"]:
    fail()
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
'''


def both(tmp_path, args, activation=None, early=()):
    """The probe's (rc, stdout, stderr), fresh and warm, with the env activation's
    variables where asked, and the variables read at start in ``early``."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = support.clean_env({"AUTOSAFE_TEST_START_METHOD": "spawn",
                              "SCENARIO_TMP": str(tmp_path)})
    env["PYTHONPATH"] = str(support.PLATFORM_SIM)
    env.update(early)
    if activation == "env":
        env["AUTOSAFE_TORCH"] = "1"
    cmd = [sys.executable, str(script), *args]
    fresh = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                           timeout=120)
    server = support.warm_server(early)
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
    # torch's import puts its own filters in front of the script's (six of them on 2.0
    # and on 2.13), so a server that imported torch first must give the same order
    position = re.search(r"the script's filter at \[(\d+)\]", fresh[1])
    assert position and int(position.group(1)) > 0
    if args == ("fail",):  # the failing frame lives until the interpreter ends, after atexit
        assert fresh[1].endswith("exit: the script's; last <class 'ValueError'>\nheld: freed\n")


def test_the_env_activation_runs_where_the_pth_line_would(tmp_path):
    fresh, warmed = both(tmp_path, (), activation="env")
    assert warmed == fresh
    assert "activated after" not in fresh[2]  # the shim saw torch imported after it


def test_a_variable_read_at_start_has_a_server_of_its_own(tmp_path):
    """AUTOSAFE_TEST_CPUS=1: the simulator narrows the CPUs before torch's OpenMP
    counts them, in the server as at a fresh start."""
    fresh, warmed = both(tmp_path, (), early=(("AUTOSAFE_TEST_CPUS", "1"),))
    assert warmed == fresh
    assert "cpus 1 threads 1" in fresh[1], fresh


def test_a_variable_read_at_start_means_a_fresh_interpreter():
    server_env = {"PATH": "/bin", "PYTHONUNBUFFERED": "1"}
    assert warm.eligible(dict(server_env, AUTOSAFE_TORCH="1", PYTHONPATH="/x"), server_env)
    assert not warm.eligible(dict(server_env, OMP_NUM_THREADS="1"), server_env)
    # not from a server started without it: from one of its own (the test above)
    assert not warm.eligible(dict(server_env, AUTOSAFE_TEST_CPUS="1"), server_env)
    assert not warm.eligible({"PATH": "/bin"}, server_env)


# A warm run's spawned processes are forked from its zygote: what each sees of
# its start, before it imports torch, must be what a freshly started one sees.
SPAWNED = r'''
import json, multiprocessing, os, resource, signal, sys

def facts(parent, tag):
    out = {
        "tag": tag, "argv": sys.argv, "orig argv": getattr(sys, "orig_argv", None),
        "path": sys.path[:3], "cwd": os.getcwd(), "fds": sorted(os.listdir("/proc/self/fd")),
        "parent": os.getppid() == parent,
        "parent process": multiprocessing.parent_process().pid == parent,
        "torch": "torch" in sys.modules, "main": sys.modules["__main__"].__name__,
        "mp main": sorted(sys.modules["__mp_main__"].__dict__)[:3],
        "env": {k: os.environ.get(k) for k in ("SCENARIO_LATE", "HOME")},
        "umask": oct(os.umask(0)),
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "ignored": sorted(int(s) for s in signal.valid_signals()
                          if s not in (signal.SIGKILL, signal.SIGSTOP)
                          and signal.getsignal(s) is signal.SIG_IGN),
        "sigint": str(signal.getsignal(signal.SIGINT)),
        "cpus": sorted(os.sched_getaffinity(0)),
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "dont write bytecode": sys.flags.dont_write_bytecode,
        "name": multiprocessing.current_process().name,
    }
    import torch
    out["torch after"] = torch.tensor([1, 2]).sum().item()
    print(json.dumps(out, sort_keys=True), flush=True)
    # What the test reads apart: whether this process was forked warm.
    print("forked:", tag, "warm.py" in open("/proc/self/cmdline").read(), flush=True)
    sys.exit(7)

if __name__ == "__main__":
    os.umask(0o027)
    os.environ["SCENARIO_LATE"] = "set by the script"
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    for method in ("spawn", "forkserver"):
        child = multiprocessing.get_context(method).Process(target=facts,
                                                            args=(os.getpid(), method))
        child.start()
        child.join(120)
        print(method, "exit code", child.exitcode, flush=True)
    slow = multiprocessing.get_context("spawn").Process(target=__import__("time").sleep,
                                                         args=(60,))
    slow.start()
    slow.terminate()
    slow.join(120)
    print("terminated:", slow.exitcode, flush=True)
'''


def test_a_warm_runs_spawned_processes_are_what_a_fresh_start_gives(tmp_path):
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    env = support.clean_env({})
    cmd = [sys.executable, str(script)]
    fresh = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                           timeout=240)
    server = support.warm_server()
    warmed = server.run(cmd, tmp_path, env, 240)

    def seen(run):
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        return ([line for line in lines if not line.startswith("forked:")],
                sorted(line for line in lines if line.startswith("forked:")))

    assert seen(warmed)[0] == seen(fresh)[0]
    assert seen(fresh)[1] == ["forked: forkserver False", "forked: spawn False"]
    # The spawned process and the forkserver came from the run's zygote.
    assert seen(warmed)[1] == ["forked: forkserver True", "forked: spawn True"]
    assert "spawn exit code 7" in fresh.stdout and "terminated: -15" in fresh.stdout
    facts = [json.loads(line) for line in fresh.stdout.splitlines() if line.startswith("{")]
    assert all(f["parent"] or f["tag"] == "forkserver" for f in facts)
    assert all(f["parent process"] and not f["torch"] for f in facts)
    assert warmed.stderr == fresh.stderr


def test_a_spawn_with_a_variable_read_at_start_starts_fresh():
    server_env = {"PATH": "/bin"}
    assert warm.eligible(dict(server_env, TORCHINDUCTOR_CACHE_DIR="/tmp/x"), server_env)
    assert not warm.eligible(dict(server_env, LD_LIBRARY_PATH="/x"), server_env)
