#!/usr/bin/env python3
"""Checks the repository's Markdown (README, the book in docs/, RELIABILITY.md, ...):

- every relative link points at a file or directory that exists, and every #anchor at a
  heading of its target (GitHub's and mdBook's slugs);
- every code block says its language (an untagged block would be compiled as Rust by rustdoc,
  or shown unhighlighted);
- every file with Rust blocks is compiled somewhere: a crate includes it with include_str!
  (as doc tests, or as excerpts checked against an example); `rust,ignore` marks a sketch
  with a placeholder the reader fills in (their own crate's name), which cannot compile.

Prints each problem as FILE:LINE: what, and exits 1 if there is any.
"""
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(\s*)(```+|~~~+)(.*)$")


def tracked(pattern):
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", pattern],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    return [ROOT / p for p in out.split()]


def slug(heading):
    """GitHub's anchor for a heading (mdBook's is the same for these texts)."""
    text = re.sub(r"`|\*\*|__", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    kept = "".join(
        c for c in text
        if c in " -_" or unicodedata.category(c)[0] in "LN"
    )
    return kept.replace(" ", "-")


def scan(path):
    """(lines outside code blocks with their numbers, anchors, blocks: (line, language))."""
    prose, anchors, blocks, seen = [], set(), [], {}
    fence = None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(2)
                blocks.append((n, m.group(3).strip()))
                continue
            if m.group(2).startswith(fence) and not m.group(3).strip():
                fence = None
                continue
        if fence is not None:
            continue
        prose.append((n, line))
        h = re.match(r"^#{1,6}\s+(.*)$", line)
        if h:
            s = slug(h.group(1))
            k = seen.get(s, 0)
            seen[s] = k + 1
            anchors.add(s if k == 0 else f"{s}-{k}")
    return prose, anchors, blocks


def main():
    files = [p for p in tracked("*.md") if "target" not in p.relative_to(ROOT).parts]
    scanned = {p: scan(p) for p in files}
    compiled = set()
    for rs in tracked("*.rs"):
        for inc in re.findall(r'include_str!\("([^"]+\.md)"\)', rs.read_text(encoding="utf-8")):
            compiled.add((rs.parent / inc).resolve())
    problems = []
    for path, (prose, _, blocks) in scanned.items():
        rel = path.relative_to(ROOT)
        for n, line in prose:
            line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # http:, https:, mailto:
                file, _, anchor = target.partition("#")
                dest = (path.parent / file).resolve() if file else path
                if not dest.exists():
                    problems.append(f"{rel}:{n}: link to {target}: no such file")
                    continue
                if anchor and dest.suffix == ".md":
                    anchors = scanned.get(dest, scan(dest))[1]
                    if anchor not in anchors:
                        problems.append(f"{rel}:{n}: link to {target}: no such heading")
        for n, lang in blocks:
            if not lang:
                problems.append(f"{rel}:{n}: a code block without a language (```text, ```sh, ...)")
        # `rust,ignore`: a sketch with a placeholder the reader fills in (their crate's name).
        rust = [lang for _, lang in blocks if lang.split(",")[0] == "rust" and "ignore" not in lang]
        if rust and path not in compiled:
            problems.append(f"{rel}: has Rust blocks, and no crate compiles them (include_str!)")
    for p in problems:
        print(p)
    if problems:
        print(f"check-docs: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"check-docs: {len(files)} Markdown files, links, anchors and code blocks fine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
