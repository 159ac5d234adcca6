"""``autosafe-torch``: run a script with the shim, inspect the platform, list and
explain rules.

``run`` executes the script in this very process, as ``python script.py``
would (``sys.argv``, ``sys.path[0]``, ``__main__``; its exit code and
signals), with the settings exported to the environment for workers and
child processes. Our options come first; everything after the script or
``-m module`` is the program's (``autosafe-torch run -m torch.distributed.run
--nproc-per-node 2 train.py`` needs no ``--``).
"""

import argparse
import builtins
import json
import os
import runpy
import sys
import types

from . import activation, codemod, config, rehearsal
from .rehearsal import ENV_AS, PLATFORMS


def _parser():
    p = argparse.ArgumentParser(prog="autosafe-torch", description=(
        "Run legacy PyTorch scripts safely on any platform, without editing them."))
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a script (or -m module) with autosafe_torch on")
    run.add_argument("--mode", choices=config.MODES, help="fix (default), warn or strict")
    run.add_argument("--disable", action="append", default=[], metavar="CODE_OR_GROUP",
                     help="leave a rule code (DL101) or group (dataloader, amp, cv2, *) "
                          "alone; repeatable or comma-separated")
    run.add_argument("--log-file", help="JSON-lines file, one object per intervention")
    run.add_argument("--quiet", action="store_true", help="no log lines on stderr")
    run.add_argument("--as", dest="rehearse", choices=sorted(PLATFORMS), metavar="PLATFORM",
                     help="run as on %s: that platform's start method, and the platform "
                          "the rules see (no fork rung on macos or windows)"
                          % ", ".join(sorted(PLATFORMS)))
    run.add_argument("-m", dest="module", help="run a library module as a script")
    run.add_argument("target", nargs=argparse.REMAINDER,
                     help="script.py and its arguments (or the module's arguments)")

    doctor = sub.add_parser("doctor", help="what this platform means for DataLoader, AMP, cv2")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")

    rules = sub.add_parser("rules", help="the rule table")
    rules.add_argument("--format", choices=("text", "markdown", "json"), default="text")

    explain = sub.add_parser("explain", help="what a rule fixes, why, an example, the "
                             "permanent fix and the torch versions it concerns")
    explain.add_argument("code", metavar="CODE", help="a rule code (DL201) or slug")

    codemod.add_parser(sub)
    return p


def split_run_args(argv, run_parser):
    """(our options, module or None, the program's arguments) of ``run``'s argv,
    scanned as ``python`` does: our options (with their values) until ``-m
    MODULE``, ``--`` or the first word that is not an option (the script). An
    unknown option before the script is left to argparse, to say so."""
    takes_value = {opt: action.nargs != 0 for action in run_parser._actions
                   for opt in action.option_strings}
    ours, i = [], 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return ours, None, argv[i + 1:]
        if word == "-m" or (word.startswith("-m") and not word.startswith("--")):
            module = word[2:] or (argv[i + 1] if i + 1 < len(argv) else None)
            if module is None:
                ours.append(word)  # argparse: "-m: expected one argument"
                return ours, None, []
            return ours, module, argv[i + (1 if word[2:] else 2):]
        if not word.startswith("-") or word == "-":
            return ours, None, argv[i:]
        name = word.split("=", 1)[0]
        ours.append(word)
        if takes_value.get(name) and "=" not in word and i + 1 < len(argv):
            ours.append(argv[i + 1])
            i += 1
        i += 1
    return ours, None, []


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if argv and argv[0] == "run":
        run_parser = parser._subparsers._group_actions[0].choices["run"]
        ours, module, target = split_run_args(argv[1:], run_parser)
        args = parser.parse_args(["run"] + ours)
        args.module, args.target = module, target
        return _run(args)
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args)
    activation.deactivate()  # importing the package activated us: report the platform as it is
    if args.command == "doctor":
        from .doctor import report_text, report

        print(json.dumps(report(), indent=2, default=repr) if args.json else report_text())
        return 0
    if args.command == "explain":
        from .rules import find_rule

        rule = find_rule(args.code)
        if rule is None:
            sys.stderr.write("autosafe-torch explain: no rule %r (`autosafe-torch rules` "
                             "lists them)\n" % args.code)
            return 2
        print(explanation(rule))
        return 0
    if args.command == "fix":
        return codemod.main(args)
    from .readme import rules_markdown
    from .rules import load_all

    if args.format == "markdown":
        print(rules_markdown())
    elif args.format == "json":
        print(json.dumps([r.as_dict() for _code, r in sorted(load_all().items())], indent=2))
    else:
        for _code, r in sorted(load_all().items()):
            print("%s %s [%s]\n    fixes:    %s\n    prevents: %s\n    fix:      %s" % (
                r.code, r.slug, r.group, r.summary, r.prevents, r.fix))
    return 0


def explanation(rule_, width=79):
    """``autosafe-torch explain CODE``: the rule's declaration, its example and
    the torch versions it concerns, as ruff's ``rule`` command shows a rule."""
    import textwrap

    def para(text, indent="    "):
        return textwrap.fill(" ".join(str(text).split()), width, initial_indent=indent,
                             subsequent_indent=indent, break_on_hyphens=False)

    before, after = (textwrap.indent(code, " " * 8) for code in rule_.example or ("", ""))
    out = ["%s %s" % (rule_.code, rule_.slug), "",
           "What it fixes", para(rule_.summary), "",
           "Why: what happens without it", para(rule_.prevents), "",
           "Example", "    This fails:", before, "",
           "    The permanent fix:", after, "",
           "Permanent fix", para(rule_.fix)]
    if rule_.notebook_fix:
        out += ["    In a notebook:", para(rule_.notebook_fix, "        ")]
    if rule_.clause_of:
        out += ["", "In the log", para("a clause of the line of the fix it makes fast (%s), "
                                       "not a line of its own; its record stays in the JSON "
                                       "log" % ", ".join(rule_.clause_of))]
    out += ["", "autosafe-torch fix"]
    if rule_.rewrite is not None:
        out += [para("rewrites the code at the logged line: %s." % rule_.rewrite.does),
                para("Left as a comment (the permanent fix) where %s." % rule_.rewrite.not_where)]
    elif rule_.serves():
        out.append(para("rewrites nothing: once the repair it served (%s) is in the code, it "
                        "is not needed." % ", ".join(rule_.serves())))
    else:
        out.append(para("does not rewrite it: it writes the permanent fix as a comment at the "
                        "logged line."))
    out += ["", "Torch versions", para(rule_.versions or "every supported torch"), "",
            "Where it checks: %s (group %s). Leave it alone: AUTOSAFE_TORCH_DISABLE=%s"
            % (", ".join(rule_.hooks), rule_.group, rule_.code)]
    return "\n".join(out)


def _run(args):
    target = list(args.target)
    if args.module is None and not target:
        sys.stderr.write("autosafe-torch run: name a script or -m module\n")
        return 2
    if config.switch_state() is not False:  # AUTOSAFE_TORCH=0 still wins
        os.environ[config.ENV_SWITCH] = "1"
    log_file = None
    if args.log_file:  # checked here, to name the option in the one line it may need
        log_file = config.parse_log_file(os.path.abspath(args.log_file), "--log-file") or ""
    activation.configure(mode=args.mode, disable=",".join(args.disable) or None,
                         log_file=log_file, quiet=True if args.quiet else None)
    activation.activate("cli")
    if args.rehearse:
        os.environ[ENV_AS] = args.rehearse  # workers and children see the same platform
        rehearsal.apply()
    if args.module is not None:
        sys.argv = [args.module] + target
        _name, spec, code = runpy._get_module_details(args.module)
        sys.argv[0] = spec.origin
        _exec_as_main(code, __file__=spec.origin, __cached__=spec.cached,
                      __loader__=spec.loader, __package__=spec.parent, __spec__=spec)
        return 0
    script = target[0]
    if not os.path.exists(script):
        sys.stderr.write("autosafe-torch run: no such file: %s\n" % script)
        return 2
    sys.argv = target
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    if not os.path.isfile(script):  # a directory or zip with __main__.py
        runpy.run_path(script, run_name="__main__")
        return 0
    with open(script, "rb") as f:
        code = compile(f.read(), script, "exec")
    _exec_as_main(code, __file__=script, __cached__=None)  # a new module's loader, spec: None
    return 0


def _exec_as_main(code, **attributes):
    """Run ``code`` as ``python`` runs a script: in a new ``__main__`` module that
    ``__mp_main__`` names too. multiprocessing, imported before us (a
    sitecustomize, a .pth), aliased our own ``__main__``: the batches of a
    class defined in the script, which spawned workers pickle as
    ``__mp_main__.X``, could not be found when they come back."""
    main = types.ModuleType("__main__")
    main.__dict__.update(attributes, __builtins__=builtins)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = main
    exec(code, main.__dict__)
