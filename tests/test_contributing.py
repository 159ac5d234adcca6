"""CONTRIBUTING.md's map of the tree, checked against the tree.

The map is the fenced block that begins ``autosafe_torch/``: an entry is a
line whose first words are file or folder names (``x.py``, ``x/``), indented
two spaces per level below the folder that holds it; the rest of the line,
and the lines indented further under it, describe it. A folder with no
entries beneath it names its modules in its description, as a list
(``inspection/ ...: parts (...), naming (...), inventory (...)``).

Read from the text and the sources' syntax (nothing imported, no process):

- every entry exists, and every path the document names (``rules/ladder.py``,
  ``tests/test_layers.py``, ``docs/rules.md``) exists;
- every module and folder of the package is in the map (``__init__.py`` is
  its folder's; ``_site/``'s files are installed at site-packages' root, not
  modules of the package), and a folder's list names only its modules;
- every dotted name of ours (``engine.settle``, ``Watch.delivered_by``,
  ``OutcomeContext.said``), in backticks or in a plain fenced block, is
  defined where it says; a bare name in backticks (``REPAIRS``,
  ``EMULATED_ATTRIBUTES``, ``summary``) occurs in the package's or the
  tests' source.
"""

import ast
import functools
import re

from support import ROOT

DOC = ROOT / "CONTRIBUTING.md"
PACKAGE = ROOT / "autosafe_torch"
TESTS = ROOT / "tests"
THIS = "test_contributing.py"
NOT_MODULES = ("_site",)  # installed at site-packages' root (pyproject.toml)
# What the text calls a value of ours by: a check's context (``ctx.found``).
ALIASES = {"ctx": "Context"}
# Paths the document names that are not this repository's, and why.
FOREIGN = {"test/test_dataloader.py": "PyTorch's own, run by make conformance"}

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
NAME = re.compile(r"[\w.-]+(?:\.py|/)")
PATH = re.compile(r"(?<![\w./-])(\.?[A-Za-z_][\w.-]*(?:/[\w.-]+)*/?)")
DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
PATH_SUFFIXES = (".py", ".md", ".toml")


def _text():
    return DOC.read_text()


# -- the map --------------------------------------------------------------------

def _tree(text):
    """``({path: description}, tree block)``: each entry of the map by its
    path below autosafe_torch/ (a folder ends in ``/``), with its words."""
    block = next(body for info, body in FENCE.findall(text)
                 if body.startswith("autosafe_torch/\n"))
    entries, stack, current = {}, [""], []
    for line in block.splitlines()[1:]:
        indent = len(line) - len(line.lstrip(" "))
        words = line.split()
        names = []
        for word in words:
            if not NAME.fullmatch(word):
                break
            names.append(word)
        depth = indent // 2
        if names and indent % 2 == 0 and 1 <= depth <= len(stack):
            del stack[depth:]
            current = [" ".join(words[len(names):])]
            for name in names:
                entries[stack[-1] + name] = current
            if len(names) == 1 and names[0].endswith("/"):
                stack.append(stack[-1] + names[0])
        else:
            current.append(line.strip())
    return {path: " ".join(words) for path, words in entries.items()}, block


def _strip_parentheses(text):
    depth, kept = 0, []
    for char in text:
        depth += char == "("
        if not depth:
            kept.append(char)
        depth -= char == ")" and depth > 0
    return "".join(kept)


def _listed(description):
    """The single names a folder's description lists outside parentheses."""
    items = re.split(r"\s*(?:[,;:]|\band\b)\s*", _strip_parentheses(description))
    return [item.strip() for item in items if re.fullmatch(r"[A-Za-z_]\w*", item.strip())]


def _modules():
    """The package's module files and folders, relative to autosafe_torch/."""
    files = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
             if "__pycache__" not in p.parts}
    folders = {f.rsplit("/", 1)[0] + "/" for f in files if "/" in f}
    for folder in list(folders):  # a folder of folders
        parts = folder.rstrip("/").split("/")
        folders.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
    return files, folders


def _missing_entries(text):
    entries, _block = _tree(text)
    return [path for path in entries if not (PACKAGE / path).exists()
            or path.endswith("/") != (PACKAGE / path).is_dir()]


def _unmapped(text):
    """``(modules and folders not in the map, names a folder lists that are
    not its modules)``."""
    entries, _block = _tree(text)
    files, folders = _modules()
    prose = {folder: words for folder, words in entries.items() if folder.endswith("/")
             and not any(p != folder and p.startswith(folder) for p in entries)}
    unnamed = sorted(folder for folder in folders if folder not in entries)
    for path in sorted(files):
        folder, _slash, name = path.rpartition("/")
        folder += "/" if folder else ""
        if path in entries or name == "__init__.py" or folder.split("/")[0] in NOT_MODULES:
            continue
        if folder in prose and name[:-3] in _listed(prose[folder]):
            continue
        unnamed.append(path)
    extra = sorted(folder + name
                   for folder, words in prose.items() if folder.split("/")[0] not in NOT_MODULES
                   for name in _listed(words)
                   if not (PACKAGE / folder / (name + ".py")).is_file()
                   and not (PACKAGE / folder / name).is_dir())
    return unnamed, extra


def test_every_entry_of_the_map_exists():
    missing = _missing_entries(_text())
    assert not missing, "CONTRIBUTING's map names what the tree lacks:\n  " + "\n  ".join(
        "autosafe_torch/" + m for m in missing)


def test_every_module_is_in_the_map():
    unnamed, extra = _unmapped(_text())
    assert not unnamed and not extra, "CONTRIBUTING's map against the tree:\n%s%s" % (
        "".join("  not in the map: autosafe_torch/%s\n" % p for p in unnamed),
        "".join("  in the map, not a module: autosafe_torch/%s\n" % e for e in extra))


# -- the names and paths the text gives --------------------------------------------

def _outside_fences(text):
    return FENCE.sub("", text)


def _spans(text):
    """The inline code of the text outside fenced blocks."""
    return re.findall(r"`([^`\n]+)`", _outside_fences(text))


def _a_path(token):
    """A file's name (``x.py``, ``docs/x.md``), or a path below a folder of
    ours (``tests/platform_sim``, ``recovery/``); not ``shm/fd``."""
    first = token.split("/")[0]
    return token.endswith(PATH_SUFFIXES) or "/" in token and (
        (ROOT / first).exists() or (PACKAGE / first).exists())


def _resolves_as_path(token):
    candidates = [ROOT / token, PACKAGE / token]
    if "/" not in token:
        candidates.append(TESTS / token)
    return any(c.exists() or c.with_name(c.name + ".py").is_file() for c in candidates)


def _missing_paths(text):
    entries, block = _tree(text)
    # The map's entries are checked above (relative to their folder); its
    # descriptions, like the rest of the text, name paths from a root.
    words = text.replace(block, "\n".join(entries.values()))
    named = {token.rstrip(".") for token in PATH.findall(words)}
    return sorted(token for token in named if _a_path(token)
                  and token not in FOREIGN and not _resolves_as_path(token))


def test_every_path_named_exists():
    missing = _missing_paths(_text())
    assert not missing, "paths CONTRIBUTING names that do not exist:\n  " + "\n  ".join(missing)


class _Index:
    """Our modules (the package's and the tests') by dotted name, with what
    each defines at its top level and in its classes, read from its syntax."""

    def __init__(self):
        self.modules = {}
        ours = sorted(PACKAGE.rglob("*.py"))
        tests = [p for p in sorted(TESTS.rglob("*.py")) if p.name != THIS]  # not its own words
        for path in ours + [p for p in tests if p.parent == TESTS]:
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            self.modules[".".join(parts)] = ast.parse(path.read_text(), str(path))
        self.package_source = "\n".join(p.read_text() for p in ours)
        self.source = self.package_source + "\n".join(p.read_text() for p in tests)
        self.stems = {name.rsplit(".", 1)[-1] for name in self.modules}
        self.defined = {}  # the package's own names (a test's helper is not one)
        for module, tree in self.modules.items():
            if not module.startswith("autosafe_torch"):
                continue
            for defined, node in self._names(tree.body).items():
                if not isinstance(node, (ast.Import, ast.ImportFrom)):  # its own, not a library's
                    self.defined.setdefault(defined, []).append(node)

    @staticmethod
    def _names(body):
        """``{name: node}`` bound by the statements ``body`` (and its ifs and trys)."""
        found = {}
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            found[leaf.id] = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    found[(alias.asname or alias.name).split(".")[0]] = node
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                inner = node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
                for handler in getattr(node, "handlers", ()):
                    inner += handler.body
                found.update(_Index._names(inner))
        return found

    def _members(self, cls, seen=()):
        """What a class defines: its body, ``self.x`` its methods set, its
        ``__slots__``, and its bases' (those of ours)."""
        found = dict(self._names(cls.body))
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                found.setdefault(node.attr, node)
        slots = found.get("__slots__")
        if isinstance(slots, ast.Assign):
            for leaf in ast.walk(slots.value):
                if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str):
                    found.setdefault(leaf.value, slots)
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id not in seen:
                for node in self.defined.get(base.id, ()):
                    if isinstance(node, ast.ClassDef):
                        found = {**self._members(node, (*seen, base.id)), **found}
        return found

    def _attributes(self, node, rest):
        if not rest:
            return True
        if not isinstance(node, ast.ClassDef):
            return False
        member = self._members(node).get(rest[0])
        return member is not None and self._attributes(member, rest[1:])

    def ours(self, name):
        head = name.split(".")[0]
        head = ALIASES.get(head, head)
        return head == "autosafe_torch" or head in self.stems or head in self.defined

    def resolves(self, name):
        """Whether dotted ``name`` is defined where it says: a module of ours
        (by its full name or its last parts), then what it defines."""
        parts = name.split(".")
        parts[0] = ALIASES.get(parts[0], parts[0])
        for cut in range(len(parts), 0, -1):
            prefix = ".".join(parts[:cut])
            modules = [tree for module, tree in self.modules.items()
                       if module == prefix or module.endswith("." + prefix)]
            for tree in modules:
                if cut == len(parts):
                    return True
                node = self._names(tree.body).get(parts[cut])
                if node is not None and self._attributes(node, parts[cut + 1:]):
                    return True
            if modules:
                return False
        return any(self._attributes(node, parts[1:]) for node in self.defined.get(parts[0], ()))

    def hook(self, name):
        """A name given as a string of ours (a hook: ``dataloader.iter``)."""
        return '"%s"' % name in self.package_source or "'%s'" % name in self.package_source

    def occurs(self, word):
        return re.search(r"(?<!\w)%s(?!\w)" % re.escape(word), self.source) is not None


@functools.cache
def _index():
    return _Index()


def _undefined(text):
    """``(dotted names of ours not defined where they say, bare names in
    no source of ours)``."""
    index = _index()
    dotted, bare = set(), set()
    for span in _spans(text):
        span = span[:-2] if span.endswith("()") else span
        if not IDENTIFIER.fullmatch(span) or span.endswith(PATH_SUFFIXES):
            continue
        (dotted if "." in span else bare).add(span)
    for info, body in FENCE.findall(text):
        if not info:  # the map and the diagrams, not a code example
            dotted.update(n for n in DOTTED.findall(body) if not n.endswith(PATH_SUFFIXES))
    undefined = sorted(name for name in dotted if index.ours(name)
                       and not index.resolves(name) and not index.hook(name))
    return undefined, sorted(name for name in bare if not index.occurs(name))


def test_every_name_of_ours_is_defined():
    undefined, unknown = _undefined(_text())
    assert not undefined and not unknown, "names in CONTRIBUTING the code lacks:\n%s%s" % (
        "".join("  not defined where it says: %s\n" % n for n in undefined),
        "".join("  in no source of ours: %s\n" % n for n in unknown))


# -- the checks themselves, on a map that breaks them ------------------------------

STALE = """\
```
autosafe_torch/
  rung.py gone.py   words
  rules/          checks (`engine.settle`, `rules/nope.py`)
    ladder.py       the ladder
  inspection/     what is seen: parts (one), nothing, probe
```
`Context.said`, `OutcomeContext.said`, `ForkRecord`, `recovery.watch.record_held`,
`Watch.delivered_by`, `engine.no_such_function`, `dataloader.iter`, `tests/warm.py`
"""


def test_the_checks_see_what_a_stale_map_says():
    entries, _block = _tree(STALE)
    assert set(entries) == {"rung.py", "gone.py", "rules/", "rules/ladder.py", "inspection/"}
    assert _missing_entries(STALE) == ["gone.py"]
    unnamed, extra = _unmapped(STALE)
    assert extra == ["inspection/nothing"]
    assert {"rules/repairs.py", "inspection/naming.py", "remedies/"} <= set(unnamed)
    assert "inspection/probe.py" not in unnamed and "rules/ladder.py" not in unnamed
    assert _missing_paths(STALE) == ["rules/nope.py"]
    assert _undefined(STALE) == (["Context.said", "engine.no_such_function"], ["ForkRecord"])
