"""Configuration from the environment and from ``configure()``.

Read at activation: cheap, and never raises. A malformed value gets one
warning line on stderr (the variable, the value, why it is refused, the
default taken) and the default, which the variable is then set to: workers
and child processes agree, and do not repeat the line.
"""

import contextlib
import os
import sys

ENV_SWITCH = "AUTOSAFE_TORCH"
ENV_MODE = "AUTOSAFE_TORCH_MODE"
ENV_DISABLE = "AUTOSAFE_TORCH_DISABLE"
ENV_LOG_FILE = "AUTOSAFE_TORCH_LOG_FILE"
ENV_QUIET = "AUTOSAFE_TORCH_QUIET"
ENV_DEBUG = "AUTOSAFE_TORCH_DEBUG"
ENV_AS = "AUTOSAFE_TORCH_AS"  # read by rehearsal.py
ENV_HANG_TIMEOUT = "AUTOSAFE_TORCH_HANG_TIMEOUT"
HANG_TIMEOUT_DEFAULT = 60.0

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
MODES = ("fix", "warn", "strict")


# Documented once here; the README's configuration table is built from it.
OPTIONS = (
    (ENV_SWITCH, "unset", "1/true/yes/on turns the .pth hook on; 0/false/no/off is a "
     "kill switch that wins even over `import autosafe_torch`"),
    (ENV_MODE, "fix", "fix: correct and log; warn: log what would be done, change "
     "nothing; strict: raise an error naming the rule and its fix (for CI)"),
    (ENV_DISABLE, "empty", "comma-separated rule codes (DL101) or groups "
     "(dataloader, amp, cv2, or * for all) that are left alone"),
    (ENV_LOG_FILE, "unset", "path of a JSON-lines file: one object per intervention "
     "(a missing directory, a directory or an unwritable one: the JSON log is off, "
     "the fixes still apply)"),
    (ENV_QUIET, "0", "1: no log lines on stderr (records, JSON sink and strict "
     "errors stay)"),
    (ENV_DEBUG, "0", "1: below each record its details (before and after, strategy, why), "
     "debug lines, and full tracebacks of internal errors"),
    (ENV_AS, "unset", "macos, windows or linux-py314: run as on that platform "
     "(its start method, and the platform the rules see: no fork rung on macOS or "
     "Windows); what `autosafe-torch run --as` sets"),
    (ENV_HANG_TIMEOUT, "60", "seconds without a batch, while every worker lives, before the "
     "workers are judged hung (DL211): the least the watchdog waits; it waits longer where "
     "batches were slow (10x the slowest wait seen), for a worker start (3x, at least 30 s), "
     "and never less than the loader's own timeout. 0 or off: no watchdog"),
)


def warn_line(message):
    """One plain line on stderr; used before logging is set up (start-up)."""
    with contextlib.suppress(Exception):
        sys.stderr.write("autosafe_torch: %s\n" % message)


def _parse(name, value, default, read, expected, taken, env):
    """``value`` of variable ``name`` as ``read`` takes its lower-cased word (None:
    malformed -> warning, ``default``, and in ``env`` the default taken: see the
    module docstring); unset or blank -> ``default``."""
    if value is None or not value.strip():
        return default
    parsed = read(value.strip().lower())
    if parsed is None:
        warn_line("%s=%r is not %s; using %s" % (name, value, expected, taken))
        if env is not None:
            env[name] = {"on": "1", "off": "0"}.get(taken, taken)
        return default
    return parsed


def _bool(word):
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


def parse_bool(name, value, default, env=None):
    return _parse(name, value, default, _bool, "one of %s (on) or %s (off)" % (
        "/".join(TRUE_WORDS), "/".join(FALSE_WORDS)), "on" if default else "off", env)


def parse_log_file(value, name=ENV_LOG_FILE, env=None):
    """The JSON-lines path, or None; a path that cannot be written -> one line,
    None. Checked without creating the file (a run with no intervention writes
    nothing); a failure at the first write is the report's."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        warn_line("%s=%r is not a path; the JSON log is off (default: unset), "
                  "the fixes still apply" % (name, value))
        return None
    path = os.fspath(value)
    if path.strip() == "":
        return None
    reason = None
    try:
        parent = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            reason = "it is a directory, not a file"
        elif not os.path.isdir(parent):
            reason = "its directory %s does not exist" % parent
        elif not os.access(path if os.path.exists(path) else parent, os.W_OK):
            reason = "it cannot be written (permission denied)"
    except (OSError, ValueError) as exc:
        reason = str(exc)
    if reason is None:
        return path
    warn_line("%s=%r: %s; the JSON log is off (default: unset), the fixes still "
              "apply" % (name, path, reason))
    if env is not None:
        env[name] = ""
    return None


def _mode(word):
    return word if word in MODES else None


def parse_mode(value, name=ENV_MODE, env=None):
    return _parse(name, value, "fix", _mode, "one of %s" % "/".join(MODES), "fix", env)


def _seconds(word):
    """``word`` as seconds >= 0 (0 and off: 0, "none"), or None: not such a number."""
    if word in FALSE_WORDS:
        return 0.0
    try:
        seconds = float(word)
    except ValueError:
        return None
    return seconds if 0 <= seconds != float("inf") else None


def parse_seconds(name, value, default, env=None):
    return _parse(name, value, default, _seconds,
                  "a number of seconds >= 0 (0 or off: none)", "%g" % default, env)


def parse_disable(value):
    """Tokens of AUTOSAFE_TORCH_DISABLE: upper-cased codes (``dl101`` is DL101),
    lower-cased groups, ``*``. Unknown ones are reported by ``validate_disabled``
    once the rule registry is loaded (not at interpreter start: cheap)."""
    if not value:
        return frozenset()
    tokens = set()
    for raw in value.replace(";", ",").replace(" ", ",").split(","):
        word = raw.strip()
        # Letters then digits (DL101) is a code, any other word a group: told
        # apart by shape (a new group or code needs no edit here), without
        # ``re``, which would cost every interpreter start.
        head = word.rstrip("0123456789")
        if word:
            code = head != word and head.isascii() and head.isalpha()
            tokens.add(word.upper() if code else word.lower())
    return frozenset(tokens)


class Config:
    """The settings in force. One instance, ``CONFIG``, updated in place."""

    __slots__ = ("mode", "disabled", "log_file", "quiet", "debug", "hang_timeout", "_validated")

    def __init__(self, mode="fix", disabled=frozenset(), log_file=None,
                 quiet=False, debug=False, hang_timeout=HANG_TIMEOUT_DEFAULT):
        self.mode = mode
        self.disabled = disabled
        self.log_file = log_file
        self.quiet = quiet
        self.debug = debug
        self.hang_timeout = hang_timeout
        self._validated = False

    @classmethod
    def from_env(cls, environ=None, settle_env=False):
        """The settings ``environ`` asks for. With ``settle_env``, a refused
        value is set to the default taken (see the module docstring)."""
        env = os.environ if environ is None else environ
        settle = env if settle_env else None
        return cls(
            mode=parse_mode(env.get(ENV_MODE), env=settle),
            disabled=parse_disable(env.get(ENV_DISABLE)),
            log_file=parse_log_file(env.get(ENV_LOG_FILE), env=settle),
            quiet=parse_bool(ENV_QUIET, env.get(ENV_QUIET), False, settle),
            debug=parse_bool(ENV_DEBUG, env.get(ENV_DEBUG), False, settle),
            hang_timeout=parse_seconds(ENV_HANG_TIMEOUT, env.get(ENV_HANG_TIMEOUT),
                                       HANG_TIMEOUT_DEFAULT, settle),
        )

    def load(self, other):
        for name in self.__slots__:
            setattr(self, name, getattr(other, name))

    def rule_enabled(self, code, group):
        d = self.disabled
        return not d or not ("*" in d or code in d or group in d)

    def validate_disabled(self, rules):
        """Warn once about tokens that name no rule and no group of ``rules``
        (the registry: code -> rule)."""
        if self._validated:
            return
        self._validated = True
        groups = sorted({r.group for r in rules.values()})
        unknown = sorted(t for t in self.disabled
                         if t not in rules and t not in groups and t != "*")
        if unknown:
            warn_line("%s: unknown rule code(s) %s ignored; accepted: rule codes "
                      "(see `autosafe-torch rules`), %s or *" % (
                          ENV_DISABLE, ", ".join(unknown), ", ".join(groups)))

    def as_dict(self):
        return dict({name: getattr(self, name) for name in self.__slots__ if name[0] != "_"},
                    disabled=sorted(self.disabled))


CONFIG = Config.from_env(settle_env=True)


def switch_state():
    """AUTOSAFE_TORCH as True (on), False (off) or None (unset/malformed)."""
    return parse_bool(ENV_SWITCH, os.environ.get(ENV_SWITCH), None)
