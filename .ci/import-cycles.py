#!/usr/bin/env python3
"""Import-cycle check between the .rs files of a Rust crate (Python 3, standard library only).

    python3 .ci/import-cycles.py <crate-src-dir> [<crate-src-dir> ...] [--folder <relative-folder>]
    python3 .ci/import-cycles.py --self-test   (a planted two-file cycle must be found)
    e.g.  python3 .ci/import-cycles.py src ha/src        python3 .ci/import-cycles.py src --folder ownership

Nodes are the crate's non-test .rs files; an edge A -> B means "A names something that file B defines". Every
strongly connected component (Tarjan, iterative) must be a single file. Acyclic: one line per dir (files,
edges, "no cycle"), exit 0. Else, per cycle: its files, a shortest concrete cycle with the line behind each
edge, the pairs of files importing each other; exit 1. Exit 2 on a usage error or a dir/folder without .rs
files. `--folder F` keeps only the files under <dir>/F (and <dir>/F.rs) and the edges between them.

Rules:
- Files: walked from lib.rs, main.rs, bin/*.rs through `mod x;` (`x.rs` / `x/mod.rs`; `#[path = ".."]`
  relative to the declaring file's dir); inline `mod x { .. }` is a module inside its file. Files reached by no
  declaration are listed as "unreached" and ignored.
- Test code is skipped: items under a `#[cfg(..)]` false whenever `test` is off (`cfg(test)`, `cfg(all(test,
  ..))`, not `cfg(any(test, feature = ".."))`): `#[cfg(test)] [#[path = "x_tests.rs"]] mod x;` (counted as
  "test files excluded"), inline `#[cfg(test)] mod tests { .. }`, `#[cfg(test)] fn/impl/use` (brace-balanced
  skip), `#![cfg(test)]` files. Comments (so intra-doc links), strings, chars and attributes are not read.
- References: each leaf of each `use` (`pub use`, `pub(crate) use`, nested groups, `self`, `as`, globs,
  multi-line) and each path of 2+ segments in code (`crate::a::f()`, `super::super::T`, `self::a::b`) whose
  first segment is `crate`, `self`, `super`, a child module (2018 uniform paths) or a name bound by a `use` of
  the module (`use super::mirror; .. mirror::X`). Anything else (std, tokio, the crate's own name) is
  external. Neither `mod x;` nor `pub(in crate::x)` is an edge.
- Resolution: `crate`/`self`/`super` relative to the file's (or inline block's) module; then the longest
  prefix that is a known module M, and for the next segment N:
    * N defined in M (fn/struct/enum/union/trait/type/const/static/macro_rules/inline mod) -> edge to M's file;
    * N bound in M by a `use` (a facade's `pub use sub::N`; a private `use` a child reaches as `super::N`)
      -> follow it and resolve again: re-exports land on the defining file; an external name makes no edge;
    * N found through a glob `use sub::*` of M -> follow the glob;  otherwise -> edge to M's file.
  So a child's `use super::X` makes an edge to mod.rs only when mod.rs defines X, while mod.rs's own `pub use
  child::X` is an edge mod.rs -> child. A path naming just a module (`use crate::a::b;`) makes no edge, its
  uses (`b::Item`) do. `use m::*` makes edges for the names of m the file mentions (all for `pub use m::*`).
"""
import argparse
import os
import re
import sys
from collections import defaultdict, deque

ITEM_KW = {"fn", "mod", "impl", "struct", "enum", "union", "trait", "const", "static", "type", "use", "async",
           "unsafe", "extern", "macro_rules", "let"}
DEF_KW = {"fn", "struct", "enum", "union", "trait", "type", "const", "static"}
PAIRS = {"(": ")", "[": "]", "{": "}"}
TOKEN = re.compile(r"""(?P<ws>\s+) | (?P<lc>//[^\n]*) | (?P<bc>/\*) | (?P<raw>[bc]?r(?P<h>\#*)")
    | (?P<str>[bc]?"(?:\\.|[^"\\])*") | (?P<chr>b?'(?:\\(?:u\{[0-9a-fA-F]+\}|x..|.)|[^\\'])')
    | (?P<life>'[A-Za-z_]\w*) | (?P<id>(?:r\#)?[A-Za-z_]\w*) | (?P<num>\d\w*) | (?P<p>::|.)""", re.S | re.X)


def lex(text):
    """[(kind, value, line)] with kind 'id', 'str' or 'p'; comments, chars, numbers and lifetimes dropped."""
    toks, i, line, n = [], 0, 1, len(text)
    while i < n:
        m = TOKEN.match(text, i)
        kind, end = m.lastgroup, m.end()
        if kind == "bc":                               # block comments nest
            depth = 1
            while end < n and depth:
                step = text[end:end + 2]
                depth += (step == "/*") - (step == "*/")
                end += 2 if step in ("/*", "*/") else 1
        elif kind == "raw":
            close = text.find('"' + m.group("h"), end)
            end = n if close < 0 else close + 1 + len(m.group("h"))
            toks.append(("str", text[m.end():close if close >= 0 else n], line))
        elif kind == "str":
            toks.append(("str", m.group()[m.group().index('"') + 1:-1], line))
        elif kind in ("id", "p"):
            toks.append((kind, m.group().removeprefix("r#"), line))
        line += text.count("\n", i, end)
        i = end
    return toks


def cfg_false(toks):
    """Is the cfg predicate (tokens inside `cfg(..)`) surely false when `test` is off? (3-valued logic)"""
    def pred(i):
        name = toks[i][1]
        if i + 1 < len(toks) and toks[i + 1][1] == "(":
            args, i = [], i + 2
            while toks[i][1] != ")":
                value, i = pred(i)
                args.append(value)
                i += toks[i][1] == ","
            if name in ("all", "any"):
                stop = name == "any"                   # all(): one False decides; any(): one True does
                return (stop if stop in args else (not stop) if None not in args else None), i + 1
            return (None if name != "not" or args[0] is None else not args[0]), i + 1
        if i + 1 < len(toks) and toks[i + 1][1] == "=":
            return None, i + 3
        return (False if name == "test" else None), i + 1
    try:
        return pred(0)[0] is False
    except IndexError:
        return False


class Crate:
    def __init__(self, src):
        self.modules = {}               # module path (tuple, first item is the root's label) -> file
        self.defs = defaultdict(set)    # module path -> names defined in it
        self.binds = defaultdict(dict)  # module path -> {name: path as written} bound by its `use`s
        self.globs = defaultdict(list)  # module path -> [path as written] of its `use x::*`
        self.refs = []                  # (file, module path, path as written, line, glob: 0 / 1 / 2 if pub)
        self.idents, self.lines, self.tests, self.files = {}, {}, set(), []
        roots = [("crate", "lib.rs"), ("main", "main.rs")]
        if os.path.isdir(os.path.join(src, "bin")):
            roots += [("bin:" + f, os.path.join("bin", f if f.endswith(".rs") else f + "/main.rs"))
                      for f in sorted(os.listdir(os.path.join(src, "bin")))]
        todo = [((label,), os.path.join(src, f), True) for label, f in roots if os.path.isfile(os.path.join(src, f))]
        while todo:
            modpath, path, dir_owner = todo.pop()
            self.modules[modpath] = path = os.path.normpath(path)
            if path not in self.lines:
                self.parse(modpath, path, dir_owner, todo)

    def parse(self, modpath, path, dir_owner, todo):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        toks = lex(text)
        n = len(toks)
        self.files.append(path)
        self.lines[path] = text.splitlines()
        self.idents[path] = {v for k, v, _ in toks if k == "id"}
        scopes = [(modpath, 0, os.path.dirname(path) if dir_owner else os.path.splitext(path)[0])]
        depth, attrs, i = 0, [], 0      # attrs: pending `#[path]` strings, None for a test-only cfg

        def is_p(j, *vals):
            return 0 <= j < n and toks[j][0] == "p" and toks[j][1] in vals

        def close(j):                   # index just past the bracket matching the opener at j
            opener, d = toks[j][1], 0
            while j < n:
                d += is_p(j, opener) - is_p(j, PAIRS[opener])
                j += 1
                if d == 0:
                    break
            return j

        while i < n:
            kind, val, line = toks[i]
            mp, sdepth, sdir = scopes[-1]
            word = val if kind == "id" else None
            if is_p(i, "#") and (is_p(i + 1, "[") or is_p(i + 1, "!") and is_p(i + 2, "[")):
                inner = is_p(i + 1, "!")
                j = close(i + 1 + inner)
                body = toks[i + 2 + inner:j - 1]
                if len(body) > 3 and body[0][1] == "cfg" and cfg_false(body[2:-1]):
                    if inner and depth == 0:    # #![cfg(test)]: the whole file is test code
                        self.files.remove(path)
                        self.tests.add(path)
                        return
                    attrs.append(None)
                elif len(body) == 3 and body[0][1] == "path" and body[2][0] == "str":
                    attrs.append(body[2][1])
                i = j
            elif word == "pub" and is_p(i + 1, "("):
                i = close(i + 1)                # pub(crate), pub(in crate::a): not a reference
            elif None in attrs and word in ITEM_KW:     # a test-only item: skip it
                if word == "mod" and is_p(i + 2, ";"):
                    self.tests.add(self.child_file(toks[i + 1][1], sdir, path, attrs, len(scopes) > 1) or path)
                while i < n and not is_p(i, ";", "{", "}"):
                    i = close(i) if is_p(i, "(", "[") else i + 1
                i, attrs = close(i) if is_p(i, "{") else i + is_p(i, ";"), []
            elif word == "mod" and i + 2 < n and toks[i + 1][0] == "id" and is_p(i + 2, ";", "{"):
                name = toks[i + 1][1]
                if is_p(i + 2, ";"):
                    f = self.child_file(name, sdir, path, attrs, len(scopes) > 1)
                    if f:
                        todo.append((mp + (name,), f, any(attrs) or os.path.basename(f) == "mod.rs"))
                else:
                    self.modules[mp + (name,)] = path
                    self.defs[mp].add(name)
                    depth += 1
                    scopes.append((mp + (name,), depth, os.path.join(sdir, name)))
                i, attrs = i + 3, []
            elif word == "use" and not is_p(i + 1, "<"):   # (`impl Trait + use<'a>` is not an import)
                public = is_p(i - 1, ")") or i > 0 and toks[i - 1][1] == "pub"
                j = i + 1
                while j < n and not is_p(j, ";"):
                    j += 1
                for segs, name, glob, ln in self.use_tree(toks[i + 1:j], ()):
                    if glob:
                        self.globs[mp].append(segs)
                    elif segs and name not in (None, "_", "crate", "self", "super"):
                        self.binds[mp].setdefault(name, segs)
                    self.refs.append((path, mp, segs, ln, glob and 1 + public))
                i, attrs = j + 1, []
            elif word and is_p(i + 1, "::") and i + 2 < n and toks[i + 2][0] == "id" and not is_p(i - 1, "::"):
                segs, i = [val], i + 1
                while is_p(i, "::") and i + 1 < n and toks[i + 1][0] == "id":
                    segs.append(toks[i + 1][1])
                    i += 2
                self.refs.append((path, mp, tuple(segs), line, 0))
            else:
                if depth == sdepth and i + 2 < n and word in DEF_KW | {"macro_rules"}:
                    self.defs[mp].add(toks[i + 1 + (word == "macro_rules")][1])
                if is_p(i, "{", "}"):
                    depth += 1 if val == "{" else -1
                    if len(scopes) > 1 and depth < sdepth:
                        scopes.pop()
                if is_p(i, ";", "{", "}"):
                    attrs = []
                i += 1

    @staticmethod
    def child_file(name, sdir, path, attrs, inline):
        explicit = [a for a in attrs if a]
        if explicit:
            f = os.path.normpath(os.path.join(sdir if inline else os.path.dirname(path), explicit[-1]))
            return f if os.path.isfile(f) else None
        cands = [os.path.join(sdir, name + ".rs"), os.path.join(sdir, name, "mod.rs")]
        return next((os.path.normpath(c) for c in cands if os.path.isfile(c)), None)

    def use_tree(self, toks, prefix):
        """Leaves of a use tree: [(path as written, bound name, is glob, line)]."""
        segs, name = list(prefix or (("::",) if toks and toks[0][1] == "::" else ())), None
        for i, (_, v, line) in enumerate(toks):
            if v == "{":
                out, d, start = [], 0, i + 1
                for j in range(i, len(toks)):
                    d += (toks[j][1] == "{") - (toks[j][1] == "}")
                    if d == 0 or d == 1 and toks[j][1] == ",":
                        out += self.use_tree(toks[start:j], tuple(segs)) if j > start else []
                        start = j + 1
                    if d == 0:
                        return out
            if v == "*":
                return [(tuple(segs), None, True, line)]
            if v == "as":
                name = toks[i + 1][1] if i + 1 < len(toks) else None
                break
            if v != "::":
                segs.append(v)
        if segs and segs[-1] == "self":
            segs.pop()
        return [(tuple(segs), name or (segs[-1] if segs else None), False, toks[-1][2])] if toks else []

    def absolute(self, mp, segs, seen=0):
        """A path as written in module mp -> absolute module path + rest, or None when external."""
        if not segs or seen > 20:
            return None
        first, rest = segs[0], tuple(segs[1:])
        if first == "crate":
            return mp[:1] + rest
        if first == "self":
            return self.absolute(mp, rest, seen + 1) if rest[:1] in (("super",), ("self",)) else mp + rest
        if first == "super":
            return None if len(mp) < 2 else self.absolute(mp[:-1], ("self",) + rest, seen + 1)
        if mp + (first,) in self.modules:     # a child module (2018 uniform paths)
            return mp + tuple(segs)
        if first in self.binds[mp]:           # a name some `use` of this module bound
            target = self.absolute(mp, self.binds[mp][first], seen + 1)
            return target + rest if target else None
        return None

    def locate(self, path, seen=0):
        """Absolute path -> the file that defines what it names; None for a bare module or an external name."""
        k = len(path)
        while k and path[:k] not in self.modules:
            k -= 1
        mod, rest = path[:k], path[k:]
        if not k or not rest or seen > 20:
            return None
        if rest[0] in self.defs[mod]:
            return self.modules[mod]
        if rest[0] in self.binds[mod]:        # imported or re-exported by M: follow the `use`
            target = self.absolute(mod, self.binds[mod][rest[0]])
            return self.locate(target + rest[1:], seen + 1) if target else None
        for g in map(lambda g: self.absolute(mod, g), self.globs[mod]):
            if g in self.modules and (rest[0] in self.defs[g] or rest[0] in self.binds[g]):
                return self.locate(g + rest, seen + 1)
        return self.modules[mod]              # seen defined nowhere (macro-made?): count it as M's own

    def graph(self):
        """{(from file, to file): line of the first reference making the edge}."""
        edges = {}
        for f, mp, segs, line, glob in self.refs:
            path = self.absolute(mp, segs)
            if path and glob and path in self.modules:
                names = self.defs[path] | set(self.binds[path])
                targets = {self.locate(path + (x,)) for x in (names if glob == 2 else names & self.idents[f])}
            else:
                targets = {self.locate(path)} if path else set()
            for t in targets - {None, f}:
                edges.setdefault((f, t), line)
        return edges


def tarjan(nodes, succ):
    """Strongly connected components (iterative Tarjan)."""
    index, low, stack, on_stack, comps = {}, {}, [], set(), []
    for root in nodes:
        work = [] if root in index else [(root, iter(succ[root]))]
        while work:
            v, children = work[-1]
            if v not in index:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            w = next(children, None)
            if w is not None and w not in index:
                work.append((w, iter(succ[w])))
            elif w is not None:
                low[v] = min(low[v], index[w]) if w in on_stack else low[v]
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = [stack.pop()]
                    while comp[-1] != v:
                        comp.append(stack.pop())
                    on_stack.difference_update(comp)
                    comps.append(sorted(comp))
    return comps


def shortest_cycle(start, succ, members):
    """A shortest start -> .. -> start path inside members (breadth-first)."""
    prev, queue = {start: None}, deque([start])
    while queue:
        v = queue.popleft()
        for w in succ[v]:
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if w in members and w not in prev:
                prev[w] = v
                queue.append(w)
    return []


def check(src, folder):
    crate = Crate(src)
    files, edges = sorted(crate.files), crate.graph()
    on_disk = {os.path.normpath(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs if f.endswith(".rs")}
    unreached = sorted(on_disk - set(files) - crate.tests)
    if folder:
        under = os.path.normpath(os.path.join(src, folder))
        inside = lambda f: f.startswith(under + os.sep) or f == under + ".rs"
        files, unreached = [f for f in files if inside(f)], [f for f in unreached if inside(f)]
        edges = {e: line for e, line in edges.items() if inside(e[0]) and inside(e[1])}
    if not files:
        print(f"{src}{' --folder ' + folder if folder else ''}: no .rs file found there", file=sys.stderr)
        return None
    succ = defaultdict(list)
    for a, b in sorted(edges):
        succ[a].append(b)
    cycles = [c for c in tarjan(files, succ) if len(c) > 1]
    print(f"{src}{' --folder ' + folder if folder else ''}: {len(files)} files, {len(edges)} edges, "
          f"{f'{len(cycles)} cycle(s)' if cycles else 'no cycle'}, {len(crate.tests)} test files excluded"
          + (f", unreached (ignored): {' '.join(unreached)}" if unreached else ""))
    for number, comp in enumerate(cycles, 1):
        print(f"  cycle {number}: {len(comp)} files: {' '.join(comp)}")
        path = min((shortest_cycle(f, succ, set(comp)) for f in comp), key=len)
        print(f"    shortest cycle ({len(path) - 1} edges):")
        for a, b in zip(path, path[1:]):
            print(f"      {a}:{edges[a, b]}: {crate.lines[a][edges[a, b] - 1].strip()}\n        -> {b}")
        mutual = [f"{a} <-> {b}" for a in comp for b in succ[a] if a < b and (b, a) in edges]
        if len(mutual) > (len(path) == 3):
            print(f"    files importing each other: {', '.join(mutual)}")
    return not cycles


def self_test():
    """The check fails on a planted cycle (a.rs and b.rs naming each other) and passes without it."""
    import contextlib, io, tempfile
    crates = {
        "cyclic": {"lib.rs": "pub mod a;\npub mod b;\n", "a.rs": "use crate::b::B;\npub struct A(pub B);\n",
                   "b.rs": "pub struct B;\npub fn make() -> crate::a::A { crate::a::A(B) }\n"},
        "acyclic": {"lib.rs": "pub mod a;\npub mod b;\n", "a.rs": "use crate::b::B;\npub struct A(pub B);\n",
                    "b.rs": "pub struct B;\n// crate::a::A in a comment is no edge\n"},
    }
    with tempfile.TemporaryDirectory() as tmp:
        got = {}
        for name, files in crates.items():
            os.makedirs(os.path.join(tmp, name))
            for f, text in files.items():
                with open(os.path.join(tmp, name, f), "w") as out:
                    out.write(text)
            with contextlib.redirect_stdout(io.StringIO()):
                got[name] = check(os.path.join(tmp, name), None)
    assert got == {"cyclic": False, "acyclic": True}, f"self-test: {got}"
    print("self-test: the planted cycle is found, the acyclic crate passes")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    ap = argparse.ArgumentParser(description="Fail when the .rs files of a Rust crate import each other in a cycle.")
    ap.add_argument("dirs", nargs="+", metavar="crate-src-dir")
    ap.add_argument("--folder", help="check only the files under this folder of each dir, e.g. ownership")
    args = ap.parse_args()
    for d in args.dirs:
        if not os.path.isdir(d):
            ap.error(f"not a directory: {d}")
    results = [check(os.path.normpath(d), args.folder) for d in args.dirs]
    return 2 if None in results else 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
