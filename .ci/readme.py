#!/usr/bin/env python3
"""Run README.md's shell blocks verbatim, as a new user types them.

Every ```sh block in README.md is preceded by one marker line:

    <!-- ci: run first: why -->   the first block; run before any other cargo command
    <!-- ci: run: why -->         run after the first block, in README order
    <!-- ci: not run: why -->     not run, and the reason (needs a GPU node, a cluster, ...)

`readme.py first` runs the block marked "run first", `readme.py rest` the blocks marked "run",
`readme.py list` prints every block with its marker. Each block runs in one `bash -euo pipefail`
(so an `export` reaches the commands after it), echoing every command with the seconds since
the block started; a block whose command fails fails the run. An unmarked ```sh block is an
error: the README is a tested document, and each block says whether and why it is run.
tests/readme.rs checks the same markers under `cargo test`.
"""

import re
import subprocess
import sys
import time
from pathlib import Path

MARKER = re.compile(r"^<!-- ci: (run first|run|not run): (.+) -->$")


def blocks(readme: Path):
    """(line number, marker kind, text) of each ```sh block, in order."""
    lines = readme.read_text().split("\n")
    found = []
    for i, line in enumerate(lines):
        if line != "```sh":
            continue
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        if marker is None:
            sys.exit(f"README.md:{i + 1}: a ```sh block without a `<!-- ci: ... -->` line above it")
        end = lines.index("```", i + 1)
        found.append((i + 1, marker.group(1), "\n".join(lines[i + 1 : end]) + "\n"))
    return found


def run(line: int, text: str) -> None:
    print(f"::: README.md:{line}: running\n{text}", flush=True)
    started = time.monotonic()
    script = "PS4='+ [${SECONDS}s] '\nset -x\n" + text
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script])
    took = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"::: README.md:{line}: failed (exit {done.returncode}) after {took:.0f} s")
    print(f"::: README.md:{line}: ok in {took:.0f} s", flush=True)


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "list"
    readme = Path(__file__).resolve().parent.parent / "README.md"
    found = blocks(readme)
    if not found or found[0][1] != "run first":
        sys.exit("README.md: the first ```sh block must be marked `<!-- ci: run first: ... -->`")
    if which == "list":
        for line, kind, text in found:
            print(f"README.md:{line}: {kind}: {text.splitlines()[0] if text.strip() else ''}")
        return
    wanted = {"first": "run first", "rest": "run"}.get(which)
    if wanted is None:
        sys.exit(f"usage: {sys.argv[0]} first|rest|list")
    for line, kind, text in found:
        if kind == wanted:
            run(line, text)


if __name__ == "__main__":
    main()
