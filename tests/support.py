"""Run scripts in real subprocesses, with and without autosafe_torch.

Every behavioural test goes through ``run_script``: a fresh interpreter,
real DataLoader workers, the start method forced from outside the script
(tests/platform_sim/sitecustomize.py), and one of the four activations.
Scripts print ``BATCHES <sha256>`` through ``PRELUDE.digest`` so that a
test can compare every batch, in order, with a known-safe reference run.
"""

import atexit
import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import warm as warm_module

ROOT = Path(__file__).resolve().parent.parent
PLATFORM_SIM = ROOT / "tests" / "platform_sim"
TEMPLATE_DIR = ROOT / "sitecustomize_template"
SCENARIOS = ROOT / "tests" / "scenarios"

START_METHODS = ("fork", "spawn", "forkserver")
ACTIVATIONS = ("import", "env", "sitecustomize", "cli")

# Pasted at the top of test scripts (after an activation import, if any).
PRELUDE = textwrap.dedent('''
    import hashlib as _hashlib

    def digest(loader, epochs=1):
        """Print and return a sha256 over every batch, in order."""
        import torch
        h = _hashlib.sha256()
        def feed(obj):
            if isinstance(obj, torch.Tensor):
                h.update(("%s %s %s" % (obj.device, obj.dtype, tuple(obj.shape))).encode())
                h.update(obj.detach().cpu().contiguous().numpy().tobytes())
            elif isinstance(obj, dict):
                for k in sorted(obj):
                    h.update(repr(k).encode()); feed(obj[k])
            elif isinstance(obj, (list, tuple)):
                h.update(b"[")
                for x in obj:
                    feed(x)
                h.update(b"]")
            else:
                h.update(repr(obj).encode())
        for _ in range(epochs):
            for batch in loader:
                feed(batch)
        print("BATCHES", h.hexdigest(), flush=True)
        return h.hexdigest()
''')


# What the shim writes on stderr: its records, ``path:line: CODE slug: what was
# done`` with ``  fix: ...`` below (its continuation lines indented further),
# and its own lines, ``autosafe_torch: ...`` (continued by indented lines).
RECORD = re.compile(r"^(?P<site>\S.*?): (?P<code>[A-Z]+[0-9]{3}) "
                    r"(?P<slug>[a-z0-9]+(?:-[a-z0-9]+)*): (?P<done>.*)$")
FIX, FIX_MORE = "  fix: ", "       "
READABLE_BEYOND_PATH = 200
ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


class Logged:
    """One record as stderr shows it: ``site``, ``code``, ``slug``, ``done`` (the
    first line after the slug), ``fix`` (its lines joined), ``line`` (the first line)."""

    def __init__(self, found):
        self.site, self.code, self.slug, self.done = found.group("site", "code", "slug", "done")
        self.line = found.group(0)
        self.fix = None

    def __repr__(self):
        return "%s\n  fix: %s" % (self.line, self.fix)


def logged(stderr, code=None):
    """The records on ``stderr`` (of rule ``code``), in order."""
    out = []
    for line in stderr.splitlines():
        found = RECORD.match(line)
        if found:
            out.append(Logged(found))
        elif out and line.startswith(FIX) and out[-1].fix is None:
            out[-1].fix = line[len(FIX):]
        elif out and line.startswith(FIX_MORE) and out[-1].fix is not None:
            out[-1].fix += " " + line.strip()
    return [r for r in out if code is None or r.code == code]


def shim_lines(stderr):
    """Every line of stderr that the shim wrote."""
    lines, in_block = [], False
    for line in stderr.splitlines():
        if RECORD.match(line) or line.startswith("autosafe_torch"):
            in_block = True
            lines.append(line)
        elif in_block and line.startswith("  "):
            lines.append(line)
        else:
            in_block = False
    return lines


PATH = re.compile(r"/[^\s'\":]+")


def unreadable_lines(stderr):
    """Shim lines a person should not have to read: over 200 characters beyond
    the user's path (a record's site; in another line, the paths it names,
    which the user gave), or holding a memory address."""
    bad = []
    for line in shim_lines(stderr):
        found = RECORD.match(line)
        paths = [found.group("site")] if found else PATH.findall(line)
        beyond = len(line) - sum(len(p) for p in paths)
        if beyond > READABLE_BEYOND_PATH or ADDRESS.search(line):
            bad.append(line)
    return bad


def assert_readable(stderr, env=None):
    """Every test run with the shim checks what it wrote (except under
    AUTOSAFE_TORCH_DEBUG=1, whose details are for the JSON log's readers)."""
    if (env or {}).get("AUTOSAFE_TORCH_DEBUG") in ("1", "true", "yes", "on"):
        return
    bad = unreadable_lines(stderr)
    assert not bad, "shim lines too long, or with an address:\n" + "\n".join(bad)


def cannot_pickle(kind):
    """A regular expression for pickle's refusal of an ``_io`` object of ``kind``
    ('BufferedReader'): "cannot pickle '_io.BufferedReader' object", and from
    Python 3.13 "cannot pickle 'BufferedReader' instances"."""
    return r"cannot pickle '(_io\.%s' object|%s' instances)" % (kind, kind)


# Python 3.13 words these two of pickle's errors otherwise: "Can't get local object"
# and the child's built-in __main__ named by its loader.
LOCAL_OBJECT = r"Can't (pickle|get) local object"
CHILD_MAIN = r"<module '__main__' \((built-in|<class '_frozen_importlib\.BuiltinImporter'>)\)>"


class Result:
    def __init__(self, proc):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    @property
    def batches(self):
        lines = [line.split()[1] for line in self.stdout.splitlines()
                 if line.startswith("BATCHES ")]
        return lines[-1] if lines else None

    @property
    def output(self):
        return self.stdout + self.stderr

    def __repr__(self):
        return "Result(rc=%s)\n--- stdout\n%s\n--- stderr\n%s" % (
            self.rc, self.stdout[-3000:], self.stderr[-5000:])


def json_log(path):
    """The records of a JSON-lines log (``AUTOSAFE_TORCH_LOG_FILE``); [] where
    none was written (a run that recorded nothing)."""
    if path is None or not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def once_per_run(tmp_path_factory, name, compute):
    """``compute()``, a JSON value (a reference run's batches), computed once in
    the whole pytest run: under pytest-xdist the first worker to ask computes it
    and leaves it beside the workers' temporary directories, and another that
    asks meanwhile waits for it; a compute that fails leaves nothing (the next
    to ask runs it again). ``name`` says what it is, arguments included."""
    import fcntl

    worker, base = os.environ.get("PYTEST_XDIST_WORKER"), tmp_path_factory.getbasetemp()
    if not worker or not base.name.endswith(worker):  # not an xdist worker (its popen-gwN)
        return compute()
    root = base.parent  # this run's, shared by its workers
    path = root / ("once-%s-%s.json" % (re.sub(r"[^\w.-]+", "_", name)[:80],
                                        hashlib.sha256(name.encode()).hexdigest()[:12]))
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return json.loads(path.read_text())
        value = compute()
        path.write_text(json.dumps(value))
        return value


def result_once_per_run(tmp_path_factory, name, run):
    """``once_per_run`` for ``run()``'s Result: its exit status and output, and
    what a test set on it."""
    result = Result.__new__(Result)
    result.__dict__.update(once_per_run(tmp_path_factory, name, lambda: vars(run())))
    return result


def rotated(names, choices=START_METHODS):
    """pytest parameters ``(name, choice)`` for every pair; those off the rotation
    (one choice per name, turning with the name's index) are marked ``heavy``:
    ``make test`` meets every name and every choice, ``make heavy`` every pair."""
    import pytest

    params = []
    for i, name in enumerate(names):
        for j, choice in enumerate(choices):
            marks = () if j == i % len(choices) else (pytest.mark.heavy,)
            params.append(pytest.param(name, choice, marks=marks, id="%s-%s" % (name, choice)))
    return params


def one_of(choices, kept):
    """pytest parameters for ``choices``; all but ``kept`` are marked ``heavy``."""
    import pytest

    return [pytest.param(c, marks=() if c == kept else (pytest.mark.heavy,)) for c in choices]


# Set in os.environ by torch itself (building an optimizer imports torch._dynamo):
# an in-process test of this pytest worker leaves it, a fresh shell has none.
SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)


# Whether the running test's children may see a GPU: only a test marked ``gpu``
# (tests/conftest.py sets it per test). Every other test was written for a machine
# without one, and pins that in its children, so that the suite means the same where
# CUDA is (make gpu); a behaviour that differs with CUDA has a gpu test of its own.
GPU_VISIBLE = False


def clean_env(extra=None):
    """The environment of a child as a fresh shell would start it: none of ours,
    none that torch set in this process; no GPU unless the test is marked gpu."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AUTOSAFE_TORCH") and k not in SET_BY_TORCH}
    env.pop("PYTHONPATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    if not GPU_VISIBLE:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


def write_script(tmp_path, body, name="train.py", activation=None):
    """The script file; ``import autosafe_torch`` heads it for that activation."""
    head = "import autosafe_torch\n" if activation == "import" else ""
    path = Path(tmp_path) / name
    path.write_text(head + PRELUDE + "\n" + textwrap.dedent(body))
    return path


def run_scenario(tmp_path, name, activation=None, start_method=None, env=None, args=(),
                 timeout=180, cli_args=(), python=None):
    """Run the scenario file ``tests/scenarios/<name>`` as it is (activation "env"
    or "cli", or None); its data files go to ``tmp_path`` (SCENARIO_TMP)."""
    assert activation in (None, "env", "cli"), activation
    extra = dict(env or {}, SCENARIO_TMP=str(tmp_path))
    return _run(tmp_path, SCENARIOS / name, activation, start_method, extra, args, timeout,
                cli_args, python)


def run_script(tmp_path, body, activation=None, start_method=None, env=None,
               args=(), timeout=180, name="train.py", cli_args=(), python=None):
    """Run ``body`` as a script; ``activation`` None means without autosafe_torch;
    ``python``: another interpreter than this one (a virtual environment's)."""
    assert activation in (None,) + ACTIVATIONS, activation
    script = write_script(tmp_path, body, name, activation)
    return _run(tmp_path, script, activation, start_method, env, args, timeout, cli_args,
                python)


def run_file(tmp_path, script, activation=None, start_method=None, env=None, args=(),
             timeout=180, cli_args=()):
    """Run an existing script file as it is (activation "env" or "cli", or None):
    one that a test changes between runs (``run_script`` writes its own)."""
    assert activation in (None, "env", "cli"), activation
    return _run(tmp_path, Path(script), activation, start_method, env, args, timeout, cli_args)


def _run(tmp_path, script, activation, start_method, env, args, timeout, cli_args,
         python=None):
    pythonpath = [str(PLATFORM_SIM), str(SCENARIOS)]  # scenario modules import each other
    extra = dict(env or {})
    if start_method:
        extra["AUTOSAFE_TEST_START_METHOD"] = start_method
    if activation == "env":
        extra.setdefault("AUTOSAFE_TORCH", "1")
    if activation == "sitecustomize":
        # The template activates, then chains to the platform simulator's.
        pythonpath.insert(0, str(TEMPLATE_DIR))
    full_env = clean_env(extra)
    full_env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    python = str(python or sys.executable)
    if activation == "cli":
        cmd = [python, "-m", "autosafe_torch", "run", *cli_args, str(script), *args]
    else:
        cmd = [python, str(script), *args]
    proc = run_command(cmd, tmp_path, full_env, timeout)  # another Python starts fresh
    assert_readable(proc.stderr, full_env)
    return Result(proc)


_warm = {}


def warm_server(early=()):
    """This test process's warm interpreter (``tests/warm.py``) for runs that set
    the variables read at start (``warm.EARLY_VARIABLES``) as ``early`` (name,
    value) pairs do, started at its first use; or None where
    AUTOSAFE_TEST_WARM=0 asks every run to start a fresh one."""
    if os.environ.get("AUTOSAFE_TEST_WARM", "1") == "0":
        return None
    env = clean_env(dict(early))
    env.pop("PYTHONPATH", None)
    server = _warm.get(early)
    if server is not None and warm_module.read_early(env, server.env):
        server.close()  # a test changed this process's environment: start from it now
        server = None
    if server is None:
        server = _warm[early] = warm_module.Server(sys.executable, env)
        atexit.register(server.close)
    return server


def _warm_for(cmd, env):
    """The warm server where it may start ``cmd`` with ``env`` as this Python
    would (a script, ``-m`` or ``-c``; an environment it started alike), else None."""
    if len(cmd) < 2 or str(cmd[0]) != sys.executable:
        return None
    if str(cmd[1]).startswith("-") and str(cmd[1]) not in ("-m", "-c"):
        return None
    server = warm_server(tuple((name, env[name]) for name in warm_module.EARLY_VARIABLES
                               if name in env))
    return server if server is not None and warm_module.eligible(env, server.env) else None


def run_command(cmd, cwd, env, timeout):
    """``subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
    timeout=timeout)``, forked from the warm interpreter where it may be."""
    server = _warm_for(cmd, env)
    if server is not None:
        return server.run(cmd, cwd, env, timeout)
    return subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout)


def popen(cmd, cwd, env, start_new_session=False):
    """``subprocess.Popen(cmd, cwd=cwd, env=env, stdout=PIPE, stderr=PIPE,
    text=True)``, forked from the warm interpreter where it may be."""
    server = _warm_for(cmd, env)
    if server is not None:
        return server.popen(cmd, cwd, env, start_new_session)
    return subprocess.Popen(cmd, cwd=str(cwd), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            start_new_session=start_new_session)


def site_dirs():
    """Where this Python finds its installed packages (torch): its own
    site-packages, then those a ``--system-site-packages`` venv adds."""
    import sysconfig

    dirs = [sysconfig.get_paths()["purelib"]]
    dirs += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")
             and p not in dirs]
    return dirs


def venv_with(root, modules):
    """A virtual environment under ``root`` that sees this one's packages (torch,
    autosafe_torch) and has ``modules`` ({file name: source}) installed in its own
    site-packages, where an installed library lies; its python."""
    venv = Path(root) / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"], check=True,
                               capture_output=True, text=True).stdout.strip())
    # As --system-site-packages would, but for this environment's packages.
    (site / "_this_venv.pth").write_text(
        "".join("import site; site.addsitedir(%r)\n" % d for d in site_dirs()))
    for name, source in modules.items():
        (site / name).write_text(textwrap.dedent(source))
    return python


def line_of(tmp_path, text, name="train.py"):
    """The line number (1-based) of the first line of a script holding ``text``."""
    for number, line in enumerate((Path(tmp_path) / name).read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError("%r not in %s" % (text, name))
