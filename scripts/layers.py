#!/usr/bin/env python3
"""The layer check: imports point down only, and no two files import each other.

Reads the layer table of ARCHITECTURE.md ("## Layers"), finds which source file imports which
(in the library, src/**/*.rs, the dashboard, web/src/**/*.rs, and the operator CLI,
rq/src/**/*.rs, each crate on its own),
and fails (exit 1) with a list when

  - a file imports a file of a higher layer (an import points up),
  - two files import each other (a cycle of two),
  - a source file is in no layer of the table, or in two, or a row names no file,
  - two source files have the same name (but `mod.rs`),
  - the diagram in ARCHITECTURE.md is not the one the imports give (`--write-diagram`
    writes it).

A longer cycle among files of one layer is printed as a warning, and so is a file that no `mod`
reaches. Imports within a layer are allowed otherwise.

An import is a path that names an item of another file: `use crate::...`, `use super::...`,
`use self::...`, a `use` of a child module (`use entry::Entry;` in `core/mod.rs`), and the
same paths written inline in code (`crate::metrics::depth(...)`). A path is mapped to a file by
its longest prefix that is a module (`crate::engine::sled::record::Op` ->
`src/engine/sled/record.rs`; `crate::engine::postgres` -> `src/engine/postgres/mod.rs`); when
the next name is one the module itself imports (a re-export, such as `crate::Store` in
`lib.rs` or `crate::core::Entry` in `core/mod.rs`), the path is followed to the file that
defines it. Names re-exported from other crates are not imports of a file.

Not imports: a parent declaring its children (`mod x;`), comments and doc links, string
literals, and the code under `#[cfg(test)]`, `#[cfg(all(test, ...))]` or `#[cfg(doc)]` when
that code is an inline module (`mod tests { ... }`) or a `use`: unit tests and doc-only
imports may reach anywhere. A file that is itself test-only (`#[cfg(test)] mod x;`) is checked
like any other. Not seen: methods that an `impl` block in another file adds to a type (calling
them needs no import).

Python 3.11 standard library only. Run from anywhere: `python3 scripts/layers.py`
(`-v` lists every import).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE_DOC = "ARCHITECTURE.md"
TABLE_HEADING = "## Layers"
# Each crate: its source folder and its root file (`crate::` paths start there).
CRATES = [("src", "src/lib.rs"), ("web/src", "web/src/lib.rs"), ("rq/src", "rq/src/main.rs")]


# ---------------------------------------------------------------------------------------------
# The table


def glob_regex(pattern: str) -> re.Pattern[str]:
    """`*` and `?` stay within one path component; `**` crosses them."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def read_table(problems: list[str]) -> list[tuple[int, list[str], str]]:
    """The rows of the table: (layer, patterns, role)."""
    text = (ROOT / TABLE_DOC).read_text(encoding="utf-8")
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == TABLE_HEADING)
    except StopIteration:
        problems.append(f'{TABLE_DOC} has no "{TABLE_HEADING}" section')
        return []
    rows = []
    for n, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("## "):
            break
        if not line.lstrip().startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not cells or not cells[0].isdigit():
            continue  # the header row and its rule
        if len(cells) < 2:
            problems.append(f"{TABLE_DOC}:{n}: a layer row needs a files cell")
            continue
        patterns = re.findall(r"`([^`]+)`", cells[1])
        if not patterns:
            problems.append(f"{TABLE_DOC}:{n}: layer {cells[0]} names no files (in backticks)")
        rows.append((int(cells[0]), patterns, cells[2] if len(cells) > 2 else ""))
    if not rows:
        problems.append(f'{TABLE_DOC}: no table rows under "{TABLE_HEADING}"')
    return rows


# ---------------------------------------------------------------------------------------------
# Reading Rust


RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]*\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")


def strip_rust(src: str) -> str:
    """The source with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(src)

    def blank(s: str) -> str:
        return re.sub(r"[^\n]", " ", s)

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(src[i:j]))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(src[i:j]))
            i = j
        elif (m := RAW_STRING.match(src, i)) and (
            i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")
        ):
            close = '"' + m.group(1)
            j = src.find(close, m.end())
            j = n if j < 0 else j + len(close)
            out.append(blank(src[i:j]))
            i = j
        elif c == '"' or (c == "b" and src.startswith('b"', i) and not _ident_before(src, i)):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(blank(src[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime / label ('a).
            m = CHAR.match(src, i)
            if m:
                out.append(blank(m.group(0)))
                i = m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident_before(src: str, i: int) -> bool:
    return i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_")


def matching_brace(text: str, open_at: int) -> int:
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


CFG_SKIP = re.compile(r"#\[cfg\((?:test|doc|all\(\s*test\s*,[^\]]*)\)\]")
ATTR = re.compile(r"\s*#\[[^\]]*\]")
VIS = r"(?:pub(?:\s*\([^)]*\))?\s+)?"


def drop_test_code(text: str) -> str:
    """Blanks inline modules and `use`s under a test-only or doc-only cfg."""
    pos = 0
    while m := CFG_SKIP.search(text, pos):
        j = m.end()
        while a := ATTR.match(text, j):  # further attributes on the same item
            j = a.end()
        item = re.compile(r"\s*" + VIS + r"(mod\s+\w+\s*\{|use\b)").match(text, j)
        if not item:
            pos = m.end()
            continue
        if item.group(1).startswith("mod"):
            end = matching_brace(text, item.end() - 1) + 1
        else:
            end = text.find(";", item.end()) + 1 or len(text)
        text = text[: m.start()] + re.sub(r"[^\n]", " ", text[m.start() : end]) + text[end:]
        pos = end
    return text


# ---------------------------------------------------------------------------------------------
# Modules, `use` trees and paths

Module = tuple[str, ...]


class Crate:
    """One crate's files, its module tree and what each module imports under which name."""

    def __init__(self, src: str, root: str) -> None:
        self.src = src
        self.root = root
        self.files: list[str] = []
        self.modules: dict[Module, str] = {}  # module path -> file (inline modules included)
        # module -> name -> what it imports under that name (a path from the crate root,
        # or None for another crate's item)
        self.bindings: dict[Module, dict[str, Module | None]] = {}
        self.texts: dict[str, str] = {}
        self.module_of: dict[str, Module] = {}  # file -> its module

    def load(self) -> None:
        self.files = sorted(
            p.relative_to(ROOT).as_posix() for p in (ROOT / self.src).rglob("*.rs")
        )
        for f in self.files:
            self.texts[f] = drop_test_code(strip_rust((ROOT / f).read_text(encoding="utf-8")))
        self._walk(self.root, ())

    def _file_for(self, parent_file: str, name: str) -> str | None:
        """The file of `mod name;` declared in `parent_file`, if it exists."""
        p = Path(parent_file)
        if p.name in ("mod.rs", "lib.rs", "main.rs") or parent_file == self.root:
            base = p.parent
        else:
            base = p.parent / p.stem
        for cand in (base / f"{name}.rs", base / name / "mod.rs"):
            rel = cand.as_posix()
            if rel in self.texts:
                return rel
        return None

    def _walk(self, file: str, module: Module) -> None:
        """Registers `file` as `module`, its inline modules, and recurses into `mod x;`."""
        self.modules[module] = file
        self.module_of[file] = module
        text = self.texts[file]
        for mod_path, kind, name, at in scopes_and_mods(text, module):
            if kind == "inline":
                self.modules.setdefault(mod_path + (name,), file)
            elif mod_path == module:
                child = self._file_for(file, name)
                if child is not None:
                    self._walk(child, mod_path + (name,))

    # Paths ------------------------------------------------------------------------------

    def absolute(self, segments: list[str], module: Module) -> Module | None:
        """A path as written in `module`, from the crate root; None for another crate's."""
        if not segments:
            return None
        head = segments[0]
        if head == "crate":
            return tuple(segments[1:])
        if head in ("self", "super"):
            base = module
            rest = segments
            while rest and rest[0] in ("self", "super"):
                if rest[0] == "super":
                    base = base[:-1]
                rest = rest[1:]
            return base + tuple(rest)
        if module + (head,) in self.modules:  # a child module, named from its parent
            return module + tuple(segments)
        bound = self.bindings.get(module, {}).get(head, ())
        if bound != ():
            return None if bound is None else bound + tuple(segments[1:])
        return None  # std, another crate, a local name

    def file_of(self, path: Module, depth: int = 0) -> str | None:
        """The file that defines what `path` names (following imports that re-export it)."""
        if depth > 20:
            return None
        for k in range(len(path), -1, -1):
            if path[:k] in self.modules:
                break
        prefix, rest = path[:k], path[k:]
        if rest:
            bound = self.bindings.get(prefix, {}).get(rest[0], ())
            if bound is None:
                return None  # re-exported from another crate
            if bound != () and bound != path[: k + 1]:
                return self.file_of(bound + rest[1:], depth + 1)
        return self.modules[prefix]

    def read_bindings(self) -> None:
        for file in self.files:
            module = self.module_of_file(file)
            if module is None:
                continue
            for scope, tree, _ in use_statements(self.texts[file], module):
                for segments, name in expand_use(tree):
                    if name is None or name == "_":
                        continue
                    target = self.absolute_for_binding(segments, scope)
                    self.bindings.setdefault(scope, {})[name] = target

    def absolute_for_binding(self, segments: list[str], scope: Module) -> Module | None:
        head = segments[0]
        if head in ("crate", "self", "super") or scope + (head,) in self.modules:
            return self.absolute(segments, scope)
        return None  # `use` of another crate (bindings of bindings are not followed)

    def module_of_file(self, file: str) -> Module | None:
        return self.module_of.get(file)

    def imports(self) -> list[tuple[str, str, int, str]]:
        """(importer, imported, line, path as written), one per pair of files: the first."""
        found: dict[tuple[str, str], tuple[int, str]] = {}
        for file in self.files:
            module = self.module_of_file(file)
            if module is None:
                continue
            text = self.texts[file]
            refs: list[tuple[Module, list[str], int]] = []
            for scope, tree, at in use_statements(text, module):
                for segments, _ in expand_use(tree):
                    refs.append((scope, segments, at))
            for scope, segments, at in inline_paths(text, module, self):
                refs.append((scope, segments, at))
            for scope, segments, at in refs:
                path = self.absolute(segments, scope)
                if path is None:
                    continue
                target = self.file_of(path)
                if target is None or target == file:
                    continue
                key = (file, target)
                line = text.count("\n", 0, at) + 1
                if key not in found or line < found[key][0]:
                    found[key] = (line, "::".join(segments))
        return [(a, b, line, p) for (a, b), (line, p) in sorted(found.items())]


def walk_mods(text: str, module: Module):
    """Walks the braces and `mod` items of `text`; yields ("mod", enclosing module, "inline" or
    "file", name, offset) for each `mod` item and ("scope", module, offset) wherever the
    enclosing (inline) module changes."""
    stack: list[tuple[Module, int]] = [(module, 0)]
    depth = 0
    token = re.compile(r"\bmod\s+(\w+)\s*([{;])|[{}]")
    for m in token.finditer(text):
        s = m.group(0)
        if s == "{":
            depth += 1
        elif s == "}":
            depth -= 1
            if len(stack) > 1 and depth < stack[-1][1]:
                stack.pop()
                yield "scope", stack[-1][0], m.end()
        else:
            current = stack[-1][0]
            if m.group(2) == "{":
                depth += 1
                yield "mod", current, "inline", m.group(1), m.start()
                stack.append((current + (m.group(1),), depth))
                yield "scope", stack[-1][0], m.end()
            else:
                yield "mod", current, "file", m.group(1), m.start()


def scopes_and_mods(text: str, module: Module):
    """Yields (enclosing module, "inline"|"file", name, offset) for each `mod` item."""
    for event in walk_mods(text, module):
        if event[0] == "mod":
            yield event[1:]


def scope_at(text: str, module: Module):
    """A function from an offset to the (inline) module that encloses it."""
    marks: list[tuple[int, Module]] = [(0, module)]
    for event in walk_mods(text, module):
        if event[0] == "scope":
            marks.append((event[2], event[1]))

    def at(offset: int) -> Module:
        scope = module
        for start, mod in marks:
            if start > offset:
                break
            scope = mod
        return scope

    return at


USE = re.compile(r"(?<![\w$])use\s+([^;]*);")


def use_statements(text: str, module: Module):
    """Yields (enclosing module, use tree text, offset) for each `use` item."""
    at = scope_at(text, module)
    for m in USE.finditer(text):
        yield at(m.start()), m.group(1), m.start()


def expand_use(tree: str) -> list[tuple[list[str], str | None]]:
    """The paths of a use tree, each with the name it binds (None for a glob)."""
    tokens = re.findall(r"::|[{},*]|\bas\b|[A-Za-z_][A-Za-z0-9_]*", tree)
    pos = 0
    out: list[tuple[list[str], str | None]] = []

    def parse(prefix: list[str]) -> None:
        nonlocal pos
        segments = list(prefix)
        if pos < len(tokens) and tokens[pos] == "::":
            pos += 1  # a leading `::`: another crate
            segments.append("::")
        while pos < len(tokens):
            t = tokens[pos]
            if t == "{":
                pos += 1
                while pos < len(tokens) and tokens[pos] != "}":
                    parse(segments)
                    if pos < len(tokens) and tokens[pos] == ",":
                        pos += 1
                pos += 1
                return
            if t == "*":
                pos += 1
                out.append((segments, None))
                return
            if t in (",", "}"):
                break
            if t == "::":
                pos += 1
                continue
            pos += 1
            if t == "self" and segments and segments[-1] != "::" and prefix == segments:
                name = segments[-1]
                if pos + 1 < len(tokens) and tokens[pos] == "as":
                    name = tokens[pos + 1]
                    pos += 2
                out.append((segments, name))
                return
            segments = segments + [t]
            if pos < len(tokens) and tokens[pos] == "as":
                out.append((segments, tokens[pos + 1] if pos + 1 < len(tokens) else None))
                pos += 2
                return
        if segments != prefix:
            out.append((segments, segments[-1]))

    parse([])
    return [(s, n) for s, n in out if "::" not in s]


PATH = re.compile(r"(?<![\w$:])((?:[A-Za-z_][A-Za-z0-9_]*::)+[A-Za-z_][A-Za-z0-9_]*)")


def inline_paths(text: str, module: Module, crate: Crate):
    """Paths written in code (not in a `use`) that start in this crate."""
    at = scope_at(text, module)
    blanked = USE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    for m in PATH.finditer(blanked):
        segments = m.group(1).split("::")
        head = segments[0]
        scope = at(m.start())
        if head in ("crate", "self", "super") or scope + (head,) in crate.modules:
            yield scope, segments, m.start()


# ---------------------------------------------------------------------------------------------
# The check


def main() -> int:
    verbose = "-v" in sys.argv[1:]
    problems: list[str] = []
    warnings: list[str] = []
    rows = read_table(problems)

    crates = []
    for src, root in CRATES:
        c = Crate(src, root)
        c.load()
        c.read_bindings()
        crates.append(c)

    files = [f for c in crates for f in c.files]
    layer_of: dict[str, int] = {}
    for layer, patterns, _ in rows:
        for pattern in patterns:
            rx = glob_regex(pattern)
            matched = [f for f in files if rx.match(f)]
            if not matched:
                problems.append(f"table: `{pattern}` (layer {layer}) names no source file")
            for f in matched:
                if f in layer_of and layer_of[f] != layer:
                    problems.append(f"table: {f} is in layers {layer_of[f]} and {layer}")
                layer_of.setdefault(f, layer)
    for c in crates:
        for f in c.files:
            if c.module_of_file(f) is None:
                warnings.append(
                    f"warning: {f}: no `mod` declaration reaches it from {c.root}; "
                    f"its imports are not checked"
                )
    by_name: dict[str, list[str]] = {}
    for f in files:
        name = f.rpartition("/")[2]
        if name not in ("mod.rs", "lib.rs", "main.rs"):
            by_name.setdefault(name, []).append(f)
    for name, same in sorted(by_name.items()):
        if len(same) > 1:
            problems.append(f"{', '.join(same)}: two source files named {name}")
    for f in files:
        if f not in layer_of:
            problems.append(f"{f}: in no layer of the table ({TABLE_DOC}, {TABLE_HEADING})")

    edges: list[tuple[str, str, int, str]] = []
    for c in crates:
        edges.extend(c.imports())
    pairs = {(a, b) for a, b, _, _ in edges}
    for a, b, line, path in edges:
        if verbose:
            print(f"{a}:{line} -> {b}  ({path})")
        la, lb = layer_of.get(a), layer_of.get(b)
        if la is not None and lb is not None and lb > la:
            problems.append(
                f"{a}:{line}: imports {b} ({path}), up from layer {la} to layer {lb}"
            )
        if (b, a) in pairs and a < b:
            other = next(line2 for x, y, line2, _ in edges if (x, y) == (b, a))
            problems.append(f"{a}:{line} and {b}:{other} import each other (a cycle of two)")

    for cycle in longer_cycles(pairs):
        warnings.append("warning: a cycle of imports: " + " -> ".join(cycle + [cycle[0]]))

    drawn = diagram(rows, layer_of, edges)
    doc_path = ROOT / TABLE_DOC
    doc = doc_path.read_text()
    begin, end = doc.find(DIAGRAM_BEGIN), doc.find(DIAGRAM_END)
    if begin < 0 or end < begin:
        problems.append(f"{TABLE_DOC}: no diagram between `{DIAGRAM_BEGIN}` and `{DIAGRAM_END}`")
    else:
        current = doc[begin + len(DIAGRAM_BEGIN) : end]
        if "--write-diagram" in sys.argv[1:]:
            doc_path.write_text(doc[: begin + len(DIAGRAM_BEGIN)] + drawn + doc[end:])
            print(f"layers: wrote the diagram into {TABLE_DOC}")
        elif current != drawn:
            problems.append(
                f"{TABLE_DOC}: the diagram is not the one the imports give: "
                f"run `python3 scripts/layers.py --write-diagram`"
            )

    for w in warnings:
        print(w)
    if problems:
        print(f"layers: {len(problems)} problem(s):")
        for p in problems:
            print(f"  {p}")
        return 1
    print(
        f"layers: ok: {len(files)} files, {len(edges)} imports between files, "
        f"{len({layer for layer, _, _ in rows})} layers; no import points up, no two files "
        f"import each other"
    )
    return 0


DIAGRAM_BEGIN = "<!-- diagram: written by `scripts/layers.py --write-diagram`; checked in CI -->"
DIAGRAM_END = "<!-- end of diagram -->"


def diagram(
    rows: list[tuple[int, list[str], str]],
    layer_of: dict[str, int],
    edges: list[tuple[str, str, int, str]],
) -> str:
    """The layers top down, each with its files (one line a folder) and the lower layers its
    files import, from the imports found: the picture ARCHITECTURE.md shows."""
    out = ["", "```"]
    for layer, _, role in sorted(rows, key=lambda r: -r[0]):
        files = sorted(f for f, l in layer_of.items() if l == layer)
        folders: dict[str, list[str]] = {}
        for f in files:
            folder, _, name = f.rpartition("/")
            folders.setdefault(folder, []).append(name.removesuffix(".rs"))
        below: dict[int, int] = {}
        for a, b, _, _ in edges:
            la, lb = layer_of.get(a), layer_of.get(b)
            if la == layer and lb is not None and lb < layer:
                below[lb] = below.get(lb, 0) + 1
        title = role.split(":")[0]
        out.append(f"{layer:>2} {title}")
        for folder, names in folders.items():
            listed = names[0] if len(names) == 1 else "{" + ",".join(names) + "}"
            out.append(f"     {folder}/{listed}.rs")
        if below:
            reach = ", ".join(f"{l} ({n})" for l, n in sorted(below.items(), reverse=True))
            out.append(f"     imports from layers {reach}")
        out.append("      |")
    out[-1] = "```"
    out.append("")
    return "\n".join(out)


def longer_cycles(pairs: set[tuple[str, str]]) -> list[list[str]]:
    """For each group of three files or more that reach each other, one shortest cycle of
    three files or more through its first file (breadth first over simple paths)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(pairs):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    cycles = []
    for group in strongly_connected(graph):
        if len(group) < 3:
            continue
        members = set(group)
        start = group[0]
        paths = [[start]]
        found = None
        while paths and found is None:
            longer = []
            for path in paths:
                for w in graph[path[-1]]:
                    if w == start and len(path) >= 3:
                        found = path
                        break
                    if w in members and w not in path:
                        longer.append(path + [w])
                if found:
                    break
            paths = longer[:10000]
        cycles.append(found or group)
    return cycles


def strongly_connected(graph: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            groups.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


if __name__ == "__main__":
    sys.exit(main())
