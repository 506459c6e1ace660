#!/usr/bin/env python3
"""Passes `cargo test` output through unchanged and times each test binary.

Reads cargo's output (stdout and stderr merged) on stdin and echoes every line as it comes.
A binary starts at cargo's `Running <target> (<path>)` or `Doc-tests <crate>` line and ends at
the next one, or at the end of the input. Appends one `<seconds>\t<binary>` line per binary to
the file named by the first argument, for `scripts/test.sh` to print as one table at its end.
"""
import re
import sys
import time

START = re.compile(r"^\s*(Running (.+?)(?: \((\S+)\))?|Doc-tests (\S+))\s*$")


def main() -> int:
    out = open(sys.argv[1], "a", encoding="utf-8")
    current, since = None, time.monotonic()

    def close(now: float) -> None:
        if current is not None:
            out.write(f"{now - since:.1f}\t{current}\n")
            out.flush()

    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        m = START.match(line)
        if m:
            now = time.monotonic()
            close(now)
            if m.group(4):
                current = f"doc-tests {m.group(4)}"
            else:
                # `tests/conformance.rs (target/debug/deps/conformance-3f2a...)`: the crate's
                # directory is not in the line, the binary's name is.
                path = m.group(3) or m.group(2)
                binary = re.sub(r"-[0-9a-f]{16}$", "", path.rsplit("/", 1)[-1])
                current = f"{binary}: {m.group(2)}"
            since = now
    close(time.monotonic())
    return 0


if __name__ == "__main__":
    sys.exit(main())
