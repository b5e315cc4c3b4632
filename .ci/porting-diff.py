#!/usr/bin/env python3
"""Count the port of the example operator: the Rust lines that differ between
examples/document-operator-plain.rs and examples/document-operator-sharded.rs (`diff -w`, blank and comment
lines aside), production and test code apart (the test code starts at `#[cfg(test)]`). Fails above the
budget (30 lines added plus removed). `--self-test` plants an extra changed line and must see it counted."""

import subprocess
import sys

PLAIN = "examples/document-operator-plain.rs"
SHARDED = "examples/document-operator-sharded.rs"
BUDGET = 30


def counted(line: str) -> bool:
    s = line[1:].strip()
    return bool(s) and not s.startswith("//")


def test_start(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip() == "#[cfg(test)]":
                return n
    return 10**9


def count(plain: str, sharded: str) -> dict:
    out = subprocess.run(
        ["diff", "-w", "--unchanged-line-format=", "--old-line-format=-%dn %L",
         "--new-line-format=+%dn %L", plain, sharded],
        capture_output=True, text=True, check=False,
    ).stdout
    tests = {"-": test_start(plain), "+": test_start(sharded)}
    counts = {"production": 0, "test": 0}
    for raw in out.splitlines():
        sign, rest = raw[0], raw[1:]
        num, _, text = rest.partition(" ")
        if not counted(sign + text):
            continue
        counts["test" if int(num) >= tests[sign] else "production"] += 1
    return counts


def main() -> int:
    if "--self-test" in sys.argv:
        import tempfile
        with open(SHARDED, encoding="utf-8") as f:
            text = f.read()
        with tempfile.NamedTemporaryFile("w", suffix=".rs", delete=False) as t:
            t.write(text.replace("fn count_words(", "fn count_words_planted(", 1))
        before, after = count(PLAIN, SHARDED), count(PLAIN, t.name)
        if after["production"] != before["production"] + 2:
            print(f"porting-diff self-test: a planted change was not counted ({before} -> {after})")
            return 1
        print("porting-diff self-test: a planted changed line is counted")
        return 0
    c = count(PLAIN, SHARDED)
    total = c["production"] + c["test"]
    print(f"the port: {total} Rust lines added + removed "
          f"({c['production']} production, {c['test']} test; budget {BUDGET})")
    return 0 if total <= BUDGET else 1


if __name__ == "__main__":
    sys.exit(main())
