#!/usr/bin/env python3
"""No review ID in code, comments, test names, file names or docs (Python 3, standard library only).

    python3 .ci/review-ids.py               check every file git tracks (exit 1 on a hit, naming each)
    python3 .ci/review-ids.py --self-test   a planted ID must be found, an allow-listed line must pass

Review findings (F9, H5, T8, N3, H-C, `f17_...`, `review-ha.md`) name documents that are not in the
repository, so a reader cannot resolve them: code and docs name the rule instead. A line that matches the
pattern without being a review ID (a test's time origin `T0`) is listed in `.ci/review-ids.allow` as
`<path>:<regex the line matches>`. Data that is not prose (the fuzz corpus) is skipped.
"""
import os
import re
import subprocess
import sys
import tempfile

PATTERN = re.compile(r"\b[FHTN][0-9]{1,2}[A-Z]?\b|\b[fhtn][0-9]{1,2}[a-z]?_|\bH-[A-O]\b|review-[a-z0-9-]+\.md")
FILE_NAME = re.compile(r"(^|/)[fhtn][0-9]{1,2}[a-z]?_[^/]*$")
# the fuzz corpus is data; this check and its allow-list name the pattern they look for
SKIP = ("fuzz/corpus/", "Cargo.lock", ".ci/review-ids.py", ".ci/review-ids.allow")


def load_allow(path):
    allow = []
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            line = line.strip()
            if line and not line.startswith("#"):
                file, _, regex = line.partition(":")
                allow.append((file, re.compile(regex)))
    return allow


def hits(root, files, allow):
    out = []
    for f in files:
        if f.startswith(SKIP) or f.endswith(SKIP):
            continue
        if FILE_NAME.search(f):
            out.append(f"{f}: the file name carries a review ID")
        try:
            text = open(os.path.join(root, f), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if PATTERN.search(line) and not any(a == f and r.search(line) for a, r in allow):
                out.append(f"{f}:{n}: {line.strip()[:120]}")
    return out


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        files = {"a.rs": "// a stuck source is re-granted (F9)\n", "b.rs": "    const T0: u64 = 0;\n",
                 "fixtures/f01_history.json": "{}\n", "c.md": "the rule, named\n"}
        for f, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, f)) or tmp, exist_ok=True)
            with open(os.path.join(tmp, f), "w", encoding="utf-8") as out:
                out.write(text)
        found = hits(tmp, sorted(files), [("b.rs", re.compile(r"const T0"))])
    want = ["a.rs:1: // a stuck source is re-granted (F9)", "fixtures/f01_history.json: the file name carries a review ID"]
    assert found == want, f"self-test: {found}"
    print("self-test: the planted IDs (a comment, a file name) are found, the allow-listed line passes")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    found = hits(root, files, load_allow(os.path.join(root, ".ci", "review-ids.allow")))
    for h in found:
        print(h)
    print(f"review IDs: {len(found)} hit(s) in {len(files)} tracked files" if found
          else f"review IDs: none in {len(files)} tracked files")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
