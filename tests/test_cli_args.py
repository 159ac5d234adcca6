"""``autosafe-torch run`` passes the program's arguments through, as python does."""

import sys

from support import clean_env, run_command

ARGV_MODULE = "import sys\nprint('ARGV', sys.argv[1:])\n"


def _run(tmp_path, *args):
    return run_command([sys.executable, "-m", "autosafe_torch", "run", *args], tmp_path,
                       clean_env({"PYTHONPATH": str(tmp_path)}), 120)


def test_module_options_pass_through_without_double_dash(tmp_path):
    """The torchrun shape: options of the module (ours too: --mode, -m) after -m MODULE."""
    (tmp_path / "launcher.py").write_text(ARGV_MODULE)
    proc = _run(tmp_path, "--quiet", "-m", "launcher", "--nproc-per-node", "2", "train.py",
                "--mode", "x", "-m", "y")
    assert proc.returncode == 0, proc.stderr
    assert "ARGV ['--nproc-per-node', '2', 'train.py', '--mode', 'x', '-m', 'y']" in proc.stdout
    proc = _run(tmp_path, "-mlauncher", "--log-file")  # python's own -mMODULE spelling
    assert proc.returncode == 0 and "ARGV ['--log-file']" in proc.stdout, proc.stderr


def test_script_options_pass_through(tmp_path):
    (tmp_path / "train.py").write_text(ARGV_MODULE)
    proc = _run(tmp_path, "--mode", "warn", "train.py", "--disable", "DL101", "--quiet", "--")
    assert proc.returncode == 0, proc.stderr
    assert "ARGV ['--disable', 'DL101', '--quiet', '--']" in proc.stdout
    proc = _run(tmp_path, "--", "train.py", "-m", "z")  # an explicit -- still works
    assert proc.returncode == 0 and "ARGV ['-m', 'z']" in proc.stdout, proc.stderr


def test_unknown_option_before_the_script_is_an_error(tmp_path):
    (tmp_path / "train.py").write_text(ARGV_MODULE)
    proc = _run(tmp_path, "--bogus", "train.py")
    assert proc.returncode == 2 and "unrecognized arguments: --bogus" in proc.stderr
    assert "ARGV" not in proc.stdout
