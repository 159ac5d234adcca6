"""AMP501, AMP502 (with AMP504), AMP503, AMP505: the AMP calls the run corrected
(what each writes: ``rules.amp``'s ``*_REWRITE``).

AMP501/AMP502 give the old positional arguments by the names the old signature
bound them to: ``autocast(False)`` was ``enabled=False``, and prepending
``"cuda"`` alone would make it the dtype.
"""

import libcst as cst

from .records import COVERED, NOT_EXACT, NotExact, REWRITTEN, per_record
from .source import (append_arg, both, find_arg, has_star, keyword_arg, keywords_for,
                     remove_arg, spaced_comma, string, unstarred)


# qualified name (torch.cuda.amp.X, and X's own module) -> (what it is, the device it is for)
LEGACY = {"torch.%s.amp.%s%s" % (area, module, kind): (kind, area)
          for kind, own, areas in (("autocast", "autocast_mode.", ("cuda", "cpu")),
                                   ("GradScaler", "grad_scaler.", ("cuda", "cpu")),
                                   ("custom_fwd", "autocast_mode.", ("cuda",)),
                                   ("custom_bwd", "autocast_mode.", ("cuda",)))
          for area in areas for module in ("", own)}
MODERN = {"torch.autocast": "autocast", "torch.amp.autocast": "autocast",
          "torch.amp.autocast_mode.autocast": "autocast", "torch.GradScaler": "GradScaler",
          "torch.amp.GradScaler": "GradScaler", "torch.amp.grad_scaler.GradScaler": "GradScaler"}

LEGACY_PARAMS = {"autocast": ("enabled", "dtype", "cache_enabled"),
                 "GradScaler": ("init_scale", "growth_factor", "backoff_factor",
                                "growth_interval", "enabled")}
MODERN_PARAMS = {"autocast": ("device_type", "dtype", "enabled", "cache_enabled"),
                 "GradScaler": ("device",) + LEGACY_PARAMS["GradScaler"]}
# Whether a device is here, as torch itself asks before it warns.
AVAILABLE = {"cuda": "%s.cuda.is_available()", "xpu": "%s.xpu.is_available()",
             "mps": "%s.backends.mps.is_available()"}


def _targets(source, line):
    """(node, qualified name) of the AMP calls and bare decorators at ``line``: a
    bare decorator's call is at its own line (Python 3.10 and later) or at that of
    the ``def`` it decorates (3.9)."""
    names = set(LEGACY) | set(MODERN)
    found = [(call, (source.qualified(call.func) & names).pop())
             for call in source.calls_at(line, names)]
    for decorator in source.nodes(cst.Decorator):
        expression, name = decorator.decorator, getattr(source.parent(decorator), "name", None)
        lines = {source.lines(n)[0] for n in (decorator, name) if n is not None}
        qualified = not isinstance(expression, cst.Call) and line in lines \
            and source.qualified(expression) & set(LEGACY)
        if qualified:
            found.append((decorator, qualified.pop()))
    return found


def rewrite(source, records):
    by_code = {r.code: r for r in records}
    targets = _targets(source, records[0].line)
    legacy = by_code.get("AMP501") or by_code.get("AMP502")
    if legacy is not None:  # the callee the log's ``api`` (torch.cuda.amp.autocast) names
        api = legacy.before.get("api")
        targets = [t for t in targets if t[1] in LEGACY and (
            not isinstance(api, str) or api == "torch.%s.amp.%s" % LEGACY[t[1]][::-1])]
    if len(targets) != 1:
        raise NotExact("several AMP calls at this line" if targets else "no AMP call at this line")
    node, qualified = targets[0]
    out = []
    if legacy is not None:
        out.append((legacy, REWRITTEN, _plan_modern(source, node, qualified, legacy)))
    kind = LEGACY[qualified][0] if qualified in LEGACY else MODERN[qualified]
    params = MODERN_PARAMS.get(kind) if (legacy or qualified in MODERN) else LEGACY_PARAMS.get(kind)
    device = by_code.get("AMP504")
    if device is not None:
        out.append((device, COVERED, "the device is the new GradScaler's first argument")
                   if legacy else (device, NOT_EXACT, "the old GradScaler stays"))

    @per_record
    def conditional(source, record):
        if not isinstance(node, cst.Call) or params is None:
            raise NotExact("not an autocast or GradScaler call")
        plan = _plan_unavailable if record.code == "AMP503" else _plan_unsupported
        return REWRITTEN, plan(source, node, params, record)
    return out + conditional(source, [by_code[c] for c in ("AMP503", "AMP505") if c in by_code])


# -- AMP501, AMP502 -------------------------------------------------------------------


def _plan_modern(source, node, qualified, record):
    kind, area = LEGACY[qualified]
    decorator = isinstance(node, cst.Decorator)  # a bare @torch.cuda.amp.custom_fwd
    device, rest = (None, node) if decorator else _split_device(node, kind)
    custom = kind in ("custom_fwd", "custom_bwd")
    if not decorator and custom and (has_star(node) or find_arg(node, "device_type")):
        raise NotExact("the call passes arguments by * or ** or names a device")
    if not decorator and not custom and keywords_for(rest, LEGACY_PARAMS[kind]) is None:
        raise NotExact("the call's arguments do not bind to %s's parameters" % kind)
    torch = source.module_name("torch")
    func = cst.parse_expression("%s.amp.%s" % (torch, kind))
    if decorator:
        new = cst.Call(func=func, args=[keyword_arg("device_type", string(area))])
        source.edit(node, lambda d: d.with_changes(decorator=new), order=10)
        done = "@%s" % source.code(new)
    elif custom:
        source.edit(node, lambda c: append_arg(c, keyword_arg("device_type", string(area)))
                    .with_changes(func=func), order=10)
        done = '%s.amp.%s(..., device_type="%s")' % (torch, kind, area)
    else:
        source.edit(node, lambda c: _to_modern(c, kind, area, func), order=10)
        done = '%s.amp.%s(%s, ...), positional arguments by name' % (
            torch, kind, source.code(device) if device is not None else '"%s"' % area)
    _forget_legacy_import(source, node)
    what = "for %s" % area.upper() if custom else "the old arguments by name"
    source.comment(node, "%s: torch.amp.%s, %s" % (record.code, kind, what))
    return done


def _split_device(call, kind):
    """(device expression, ``call`` without it) of an old GradScaler given one
    (AMP504: device= or a leading string), else (None, ``call``)."""
    found = find_arg(call, "device") if kind == "GradScaler" else None
    if found is None and kind == "GradScaler" and call.args and call.args[0].keyword is None \
            and not call.args[0].star and isinstance(call.args[0].value, cst.SimpleString):
        found = 0, call.args[0]
    return (None, call) if found is None else (found[1].value, remove_arg(call, found[0]))


def _to_modern(call, kind, area, func):
    device, call = _split_device(call, kind)
    call = keywords_for(call, LEGACY_PARAMS[kind])
    first = cst.Arg(value=device if device is not None else string(area),
                    comma=spaced_comma() if call.args else cst.MaybeSentinel.DEFAULT)
    return call.with_changes(func=func, args=[first, *call.args])


def _forget_legacy_import(source, node):
    """Once every use of a name imported ``from torch.cuda.amp`` is rewritten,
    the name leaves the import (and an import left empty goes)."""
    expression = node.decorator if isinstance(node, cst.Decorator) else node.func
    if not isinstance(expression, cst.Name):
        return
    rewritten = source.notes.setdefault("amp: rewritten names", set())
    rewritten.add(expression)
    for assignment in source.referents(expression):
        if isinstance(assignment.node, cst.ImportFrom) \
                and {access.node for access in assignment.references} <= rewritten:
            source.edit(source.statement_of(assignment.node),
                        lambda s, name=assignment.name: _without_name(s, name), order=90)


def _without_name(statement, name):
    if not isinstance(statement, cst.SimpleStatementLine):
        return statement
    body = []
    for small in statement.body:
        if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            names = [a for a in small.names if (a.evaluated_alias or a.evaluated_name) != name]
            if not names:
                continue
            if len(names) < len(small.names):
                names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                small = small.with_changes(names=names)
        body.append(small)
    if not body:
        commented = any(line.comment for line in statement.leading_lines) \
            or statement.trailing_whitespace.comment
        return statement if commented else cst.RemovalSentinel.REMOVE  # a comment stays
    return statement.with_changes(body=body)


# -- AMP503, AMP505 -------------------------------------------------------------------


def _device_of(record):
    device = record.before.get("device_type", record.before.get("device"))
    if not isinstance(device, str) or device not in AVAILABLE:
        raise NotExact("no availability check for device %r" % (device,))
    return device


def _conditional_enabled(source, node, params, condition, comment):
    """Plan ``enabled=<condition>`` (``enabled=<given> and <condition>``);
    ``condition``: its source, ``%s`` standing for the name of torch."""
    unstarred(node)
    condition = cst.parse_expression(condition % source.module_name("torch"))
    source.set_arg(node, "enabled", lambda given: condition if given is None
                   else both(given, condition), params, order=20)
    source.comment(node, comment)
    return "enabled=... %s" % source.code(condition)


def _plan_unavailable(source, node, params, record):
    changed = set(record.after) - {"enabled"}
    if changed or "enabled" not in record.after:
        raise NotExact("the run also changed %s" % ", ".join(sorted(changed)))
    device = _device_of(record)
    return _conditional_enabled(source, node, params, AVAILABLE[device],
                                "AMP503: AMP only where %s is" % device.upper())


def _plan_unsupported(source, node, params, record):
    after = record.after
    if set(after) == {"device_type"}:
        found = find_arg(node, "device_type", params)
        if found is None or not isinstance(after["device_type"], str):
            raise NotExact("the device type is not written at the call")
        value = found[1].value  # torch.device("cuda"): a call whose type is its string
        literal = isinstance(value, cst.Call) and "torch.device" in source.qualified(value.func) \
            and len(value.args) == 1 and isinstance(value.args[0].value, cst.SimpleString)
        new = string(after["device_type"]) if literal \
            else cst.Attribute(value=value, attr=cst.Name("type"))
        source.set_arg(node, "device_type", new, params, order=30)
        source.comment(node, "AMP505: the device type as a string")
        return "device_type %s" % source.code(new)
    if set(after) == {"enabled"} and _device_of(record) == "cuda" \
            and record.before.get("dtype") == "torch.bfloat16":
        return _conditional_enabled(source, node, params, "%s.cuda.is_bf16_supported()",
                                    "AMP505: bfloat16 only where the GPU can")
    raise NotExact("no condition in code for what this torch cannot autocast")
