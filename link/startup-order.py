#!/usr/bin/env python3
"""Turn code-page traces (link/trace-code-pages.c) into a symbol ordering file for rust-lld.

usage: startup-order.py BINARY TRACE... > ORDER

Every function of BINARY that has a byte on a traced page is listed, pages in the order they
were first run, functions by address within a page. Mangled names, as lld matches them.
"""
import subprocess
import sys

PAGE = 4096


def code_segment(binary):
    """(file offset, virtual address) of the executable LOAD segment."""
    headers = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True, check=True)
    for line in headers.stdout.splitlines():
        fields = line.split()
        if fields and fields[0] == "LOAD" and "E" in fields[6:8]:
            return int(fields[1], 16), int(fields[2], 16)
    sys.exit(f"{binary}: no executable LOAD segment")


def functions_by_page(binary):
    nm = subprocess.run(["nm", "-S", binary], capture_output=True, text=True, check=True)
    pages = {}
    for line in nm.stdout.splitlines():
        fields = line.split()
        if len(fields) != 4 or fields[2] not in "tTwW":
            continue
        address, size, name = int(fields[0], 16), max(int(fields[1], 16), 1), fields[3]
        for page in range(address // PAGE, (address + size - 1) // PAGE + 1):
            pages.setdefault(page, []).append((address, name))
    return pages


def main():
    binary, traces = sys.argv[1], sys.argv[2:]
    offset, vaddr = code_segment(binary)
    first_run = []
    seen = set()
    for trace in traces:
        with open(trace) as lines:
            for line in lines:
                page = (int(line, 16) - offset + vaddr) // PAGE
                if page not in seen:
                    seen.add(page)
                    first_run.append(page)
    by_page = functions_by_page(binary)
    listed = set()
    for page in first_run:
        for _, name in sorted(by_page.get(page, [])):
            if name not in listed:
                listed.add(name)
                print(name)
    print(f"{len(first_run)} code pages run, {len(listed)} functions listed", file=sys.stderr)


main()
