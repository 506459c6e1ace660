#!/usr/bin/env python3
"""Lists circles of imports between the files of each crate: a file that names an item of a
sibling file (`crate::a::X`, `super::a::X`), which names one of the first, directly or not.

Exit status 1 if there is one (but for the ones in ALLOWED, printed with their reason). A path
through a re-export (`crate::X`, where lib.rs has `pub use a::X`) counts as an import of the
file that defines X. A file's own submodules and ancestors do not count (a module declares its
children), nor do comments and `#[cfg(test)]` code.
Usage: scripts/import-cycles.py [crate dir ...]
"""
import os
import re
import sys

# Circles allowed to stay, (crate, frozenset of files) -> the reason. None today: lock-core's
# error <-> name went when the name rules moved to name_rules.rs.
ALLOWED = {}

PATH = re.compile(r"\b(crate|super)((?:::\w+)+|::\{[^;]*?\})")


def modules(src):
    """Module path (a tuple) -> file, for the .rs files under src."""
    out = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            parts = os.path.relpath(path, src)[:-3].split(os.sep)
            if parts[-1] in ("lib", "main", "mod"):
                parts = parts[:-1]
            out[tuple(parts)] = path
    return out


def code(path):
    text = open(path, encoding="utf-8").read()
    cut = text.find("#[cfg(test)]")
    if cut >= 0:
        text = text[:cut]
    return "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))


def named(module, path, text):
    """The paths (lists of names) a file's code refers to, made absolute."""
    is_dir_module = os.path.basename(path) in ("lib.rs", "main.rs", "mod.rs")
    for m in PATH.finditer(text):
        base = [] if m.group(1) == "crate" else list(module if is_dir_module else module[:-1])
        if m.group(1) == "super" and is_dir_module:
            base = base[:-1]
        rest = m.group(2)
        if rest.startswith("::{"):
            # `crate::{a::X, b::{Y, Z}}`: the first name of each top-level entry.
            inner, depth, entry = rest[3:-1], 0, ""
            entries = []
            for ch in inner:
                depth += ch == "{"
                depth -= ch == "}"
                if ch == "," and depth == 0:
                    entries.append(entry)
                    entry = ""
                else:
                    entry += ch
            entries.append(entry)
            for e in entries:
                yield base + [p for p in re.split(r"::", e.strip()) if re.fullmatch(r"\w+", p)]
        else:
            yield base + [p for p in rest.split("::") if p]


def reexports(mods):
    """Items a module re-exports (`pub use a::X;`, `pub use crate::a::{X, Y};`): (module,
    name) -> the module that defines it, so that a path through the re-export counts as an
    import of the file that holds the item."""
    out = {}
    for m, path in mods.items():
        is_dir_module = os.path.basename(path) in ("lib.rs", "main.rs", "mod.rs")
        for use in re.finditer(r"pub(?:\(crate\))? use ([\w:]+?)::(\{[^;]*\}|\w+);", code(path)):
            parts = use.group(1).split("::")
            if parts[0] == "crate":
                base = list(parts[1:])
            elif parts[0] == "super":
                base = list((m if is_dir_module else m[:-1])[:-1]) + parts[1:]
            elif parts[0] == "self":
                base = list(m) + parts[1:]
            else:
                base = list(m) + parts
            if tuple(base) not in mods:
                continue
            for name in re.findall(r"\w+", use.group(2)):
                out.setdefault((m, name), tuple(base))
    return out


def edges(mods):
    out = {m: set() for m in mods}
    again = reexports(mods)
    for m, path in mods.items():
        for target in named(m, path, code(path)):
            # A path through a re-export (`crate::X`, `crate::driver::Y`): the defining module.
            for _ in range(len(mods)):
                hop = next(
                    (n for n in range(len(target) - 1, -1, -1)
                     if (tuple(target[:n]), target[n]) in again),
                    None,
                )
                if hop is None:
                    break
                target = list(again[(tuple(target[:hop]), target[hop])]) + target[hop + 1 :]
            t = next(
                tuple(target[:n]) for n in range(len(target), -1, -1) if tuple(target[:n]) in mods
            )
            related = t[: len(m)] == m or m[: len(t)] == t
            if not related:
                out[m].add(t)
    return out


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return found


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    crates = sys.argv[1:] or sorted(
        os.path.join(root, d) for d in os.listdir(root) if os.path.isdir(os.path.join(root, d, "src"))
    )
    if not sys.argv[1:]:
        examples = os.path.join(root, "examples")
        crates += [os.path.join(examples, d) for d in sorted(os.listdir(examples))]
    bad = 0
    for crate in crates:
        src = os.path.join(crate, "src")
        if not os.path.isdir(src):
            continue
        graph = edges(modules(src))
        for comp in cycles(graph):
            names = sorted("/".join(m) for m in comp)
            reason = ALLOWED.get((os.path.basename(crate), frozenset(names)))
            if reason:
                print(f"{os.path.basename(crate)}: {' <-> '.join(names)} allowed: {reason}")
                continue
            bad += 1
            print(f"{os.path.basename(crate)}: circle of imports between {', '.join(names)}")
            for m in sorted(comp):
                for t in sorted(graph[m] & set(comp)):
                    print(f"    {'/'.join(m)} -> {'/'.join(t)}")
    if bad:
        sys.exit(1)
    print(f"no circle of imports between files ({len(crates)} crates)")


if __name__ == "__main__":
    main()
