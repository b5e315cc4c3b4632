#!/usr/bin/env python3
"""Offline check of the relative links in the project's Markdown (Python 3, standard library only).

    python3 .ci/doc-links.py                   check README.md, CHANGELOG.md (if present), testserver/README.md
                                               and docs/*.md; exit 1 with `file:line: broken link ...` lines
    python3 .ci/doc-links.py FILE.md ...        check these files instead
    python3 .ci/doc-links.py --list-external   also print every external URL (http, https, mailto, ...), one
                                               per line as `file:line: URL`; they are never fetched
    python3 .ci/doc-links.py --self-test       a good page must pass; a planted broken file link and a planted
                                               broken anchor must be found, and nothing else

What is checked, per file:
- inline links and images `[text](path)`, `[text](path#anchor)`, `[text](#anchor)`, `<path>` destinations
  and titles included; reference definitions `[label]: path`; `<a href="path">` in HTML;
- a relative path must name an existing file or directory, resolved against the linking file's folder (a
  leading `/` against the repository root), and must stay inside the repository (no `../shared/...`);
- an `#anchor` on a Markdown file (or a directory's README.md) must be the slug of one of its headings, by
  GitHub's rules (the heading's text without markup, lowercased, every character other than a letter, digit,
  space, hyphen or underscore dropped, spaces become hyphens; the second heading with the same slug gets
  `-1`, the third `-2`, ...), or an explicit `<a id=...>` / `<a name=...>`.
Not read: fenced code blocks (``` and ~~~), inline code spans (also across a line break), HTML comments.
Indented code blocks are read as text (the docs use fences; a list's continuation lines look the same).
"""
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse

DEFAULT_FILES = ["README.md", "CHANGELOG.md", "testserver/README.md"]
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
REF_DEF = re.compile(r"^ {0,3}\[((?:[^\]\\]|\\.)+)\]:[ \t]*(<[^>\n]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s[^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
HTML_HREF = re.compile(r"<a\s[^>]*?\bhref\s*=\s*[\"']([^\"']+)[\"']", re.I)
AUTOLINK = re.compile(r"<((?:https?|mailto|ftp):[^>\s]+)>", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
COMMENT = re.compile(r"<!--.*?-->", re.S)


def blank_code_spans(text):
    """`text` with every inline code span (CommonMark: a run of N backticks up to the next run of exactly N)
    replaced by spaces, newlines kept, so offsets and line numbers stay as they were."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        if text[i] == "\\" and i + 1 < n:
            i += 2
            continue
        if text[i] != "`":
            i += 1
            continue
        j = i
        while j < n and text[j] == "`":
            j += 1
        ticks = j - i
        k = j
        close = -1
        while k < n:
            if text[k] == "`":
                m = k
                while m < n and text[m] == "`":
                    m += 1
                if m - k == ticks:
                    close = k
                    break
                k = m
            else:
                k += 1
        if close < 0:
            i = j  # an unmatched run is literal text
            continue
        for p in range(i, close + ticks):
            if out[p] != "\n":
                out[p] = " "
        i = close + ticks
    return "".join(out)


def heading_text_to_slug(raw):
    """GitHub's anchor for a heading whose Markdown source is `raw`."""
    text = re.sub(r"<[^>]+>", "", raw)                          # HTML tags (an `<a id>` in the heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)      # links and images: their text
    text = re.sub(r"!?\[([^\]]*)\]\[[^\]]*\]", r"\1", text)     # reference links: their text
    text = text.replace("`", "")
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)       # emphasis markers (`a_b` keeps its `_`)
    text = text.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"')
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


class Page:
    """What one Markdown file offers and asks: its anchors, its links (with lines), its external URLs."""

    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8") as f:
            self.text = f.read()
        self.anchors = set()
        self.links = []      # (line, destination, what) — what: the link as written, for the message
        self.external = []   # (line, url)
        self._read()

    def _read(self):
        lines = self.text.split("\n")
        # 1. blank fenced code blocks and comments, keep line structure
        prose = []
        fence = None
        for line in lines:
            m = FENCE.match(line)
            if fence is None:
                if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                    fence = m.group(1)
                    prose.append("")
                    continue
                prose.append(line)
            else:
                if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
                    fence = None
                prose.append("")
        text = COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), "\n".join(prose))
        # 2. headings (from the text with code spans intact: their content is part of the slug)
        counts = {}
        plines = text.split("\n")
        for i, line in enumerate(plines):
            raw = None
            m = ATX.match(line)
            if m:
                raw = re.sub(r"[ \t]+#+[ \t]*$", "", m.group(2) or "")
                if raw.strip("#").strip() == "":
                    raw = ""
            elif (i > 0 and SETEXT.match(line) and plines[i - 1].strip() and not ATX.match(plines[i - 1])
                  and not plines[i - 1].lstrip().startswith(("|", "-", "*", "+", ">"))
                  and not (line.strip().startswith("-") and len(line.strip()) < 2)):
                raw = plines[i - 1].strip()
            if raw is None:
                continue
            slug = heading_text_to_slug(raw)
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            self.anchors.add(slug if n == 0 else f"{slug}-{n}")
        # 3. links, from the text without code spans
        code_free = blank_code_spans(text)
        starts = [0]
        for m in re.finditer("\n", code_free):
            starts.append(m.end())

        def line_of(offset):
            lo, hi = 0, len(starts) - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if starts[mid] <= offset:
                    lo = mid
                else:
                    hi = mid - 1
            return lo + 1

        for m in HTML_ANCHOR.finditer(code_free):
            self.anchors.add(m.group(1))
        for i, line in enumerate(code_free.split("\n")):
            m = REF_DEF.match(line)
            if m:
                self._add(i + 1, m.group(2), f"[{m.group(1)}]: {m.group(2)}")
        for m in HTML_HREF.finditer(code_free):
            self._add(line_of(m.start()), m.group(1), m.group(0))
        for m in AUTOLINK.finditer(code_free):
            self.external.append((line_of(m.start()), m.group(1)))
        for m in re.finditer(r"\]\(", code_free):
            dest = self._destination(code_free, m.end())
            if dest is None:
                continue
            text_start = code_free.rfind("[", 0, m.start())
            shown = text[text_start if text_start >= 0 else m.start():m.end()] + dest + ")"
            self._add(line_of(m.start()), dest, " ".join(shown.split()))

    @staticmethod
    def _destination(s, i):
        """The link destination starting at s[i] (after `](`), or None when this is no link."""
        n = len(s)
        while i < n and s[i] in " \t\n":
            i += 1
        if i < n and s[i] == "<":
            j = s.find(">", i)
            return None if j < 0 else s[i + 1:j]
        depth, j = 0, i
        while j < n:
            c = s[j]
            if c == "\\":
                j += 2
                continue
            if c in " \t\n":
                break
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    break
                depth -= 1
            j += 1
        dest = s[i:j]
        k = j
        while k < n and s[k] in " \t\n":
            k += 1
        if k < n and s[k] in "\"'(":          # a title
            close = {"\"": "\"", "'": "'", "(": ")"}[s[k]]
            e = s.find(close, k + 1)
            if e < 0:
                return None
            k = e + 1
            while k < n and s[k] in " \t\n":
                k += 1
        if k >= n or s[k] != ")":
            return None
        return dest

    def _add(self, line, dest, what):
        if SCHEME.match(dest):
            self.external.append((line, dest))
        else:
            self.links.append((line, dest, what))


class Checker:
    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.pages = {}

    def page(self, path):
        path = os.path.realpath(path)
        if path not in self.pages:
            self.pages[path] = Page(path)
        return self.pages[path]

    def rel(self, path):
        return os.path.relpath(path, self.root)

    def check(self, files):
        """(problems, externals): `file:line: broken link ...` lines and `file:line: URL` lines."""
        problems, externals = [], []
        for f in files:
            page = self.page(f)
            name = self.rel(page.path)
            for line, url in sorted(page.external):
                externals.append(f"{name}:{line}: {url}")
            for line, dest, what in page.links:
                why = self.resolve(page, dest)
                if why:
                    problems.append(f"{name}:{line}: broken link {what}: {why}")
        return problems, externals

    def resolve(self, page, dest):
        """Why `dest`, linked from `page`, is broken; None when it resolves."""
        path, _, anchor = dest.partition("#")
        path = urllib.parse.unquote(path.split("?", 1)[0])
        anchor = urllib.parse.unquote(anchor)
        if path == "":
            target = page.path
        else:
            base = self.root if path.startswith("/") else os.path.dirname(page.path)
            target = os.path.realpath(os.path.join(base, path.lstrip("/")))
            if os.path.commonpath([target, self.root]) != self.root:
                return f"{path} is outside the repository"
            if not os.path.exists(target):
                return f"no file or directory {self.rel(target)}"
        if not anchor:
            return None
        if os.path.isdir(target):
            readme = os.path.join(target, "README.md")
            if not os.path.isfile(readme):
                return f"#{anchor} on a directory without README.md"
            target = readme
        if not target.lower().endswith((".md", ".markdown")):
            return None  # anchors in other files (line anchors, HTML) are not checked
        if anchor not in self.page(target).anchors:
            return f"no heading or anchor #{anchor} in {self.rel(target)}"
        return None


def default_files(root):
    files = [os.path.join(root, f) for f in DEFAULT_FILES if os.path.isfile(os.path.join(root, f))]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        files += [os.path.join(docs, f) for f in sorted(os.listdir(docs)) if f.endswith(".md")]
    return files


def self_test():
    pages = {
        "README.md": "# Top\n\nSee [the guide](docs/good.md#usage-1) and [docs](docs/) and "
                     "[home](https://example.org/).\n",
        "docs/good.md": (
            "# The guide: `kshard-dev demo`\n\n"
            "## Usage\n\nFirst.\n\n## Usage\n\nSecond: jump to [the first](#usage), [this](#usage-1), "
            "[the title](#the-guide-kshard-dev-demo), [a marked place](#here) and [the other page](bad.md).\n\n"
            "<a id=\"here\"></a>A place.\n\n"
            "```sh\n# not a heading\necho '[in a fence](missing.md#nowhere)'\n```\n\n"
            "Inline code is not a link: `[x](missing.md)`, nor across a line: `[y](\nmissing.md)`.\n\n"
            "[ref]: ../README.md#top\n"
        ),
        "docs/bad.md": (
            "# Bad\n\n"
            "A file that does not exist: [gone](gone.md).\n\n"
            "An anchor that does not exist: [nowhere](good.md#no-such-heading).\n"
        ),
    }
    slugs = {
        "The main job: `kshard-dev demo`": "the-main-job-kshard-dev-demo",
        "Sharding a kube-rs operator: `kube_shard::Controller`": "sharding-a-kube-rs-operator-kube_shardcontroller",
        "Memory per replica in server mode (replicas as processes)":
            "memory-per-replica-in-server-mode-replicas-as-processes",
        "`recovery`: every object needs a reconcile at once (the headline)":
            "recovery-every-object-needs-a-reconcile-at-once-the-headline",
        "Changing `S` or the key": "changing-s-or-the-key",
    }
    failures = [f"slug of {h!r}: {heading_text_to_slug(h)!r}, want {want!r}"
                for h, want in slugs.items() if heading_text_to_slug(h) != want]
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in pages.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)) or tmp, exist_ok=True)
            with open(os.path.join(tmp, rel), "w", encoding="utf-8") as out:
                out.write(text)
        checker = Checker(tmp)
        problems, externals = checker.check(default_files(tmp))
    want = ["docs/bad.md:3: broken link [gone](gone.md): no file or directory docs/gone.md",
            "docs/bad.md:5: broken link [nowhere](good.md#no-such-heading): "
            "no heading or anchor #no-such-heading in docs/good.md"]
    if problems != want:
        failures.append("found:\n  " + "\n  ".join(problems) + "\nwanted:\n  " + "\n  ".join(want))
    if externals != ["README.md:3: https://example.org/"]:
        failures.append(f"external links: {externals}")
    if failures:
        print("self-test FAILED:\n" + "\n".join(failures))
        return 1
    print("self-test: the planted broken file link and broken anchor are found and nothing else "
          "(the good page, a duplicate heading's -1 anchor, links in a code fence and in code spans pass)")
    return 0


def repo_root():
    try:
        return subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                              check=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    if "--self-test" in argv:
        return self_test()
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    list_external = "--list-external" in argv
    args = [a for a in argv if a != "--list-external"]
    unknown = [a for a in args if a.startswith("-")]
    if unknown:
        print(f"unknown option {unknown[0]} (see --help)", file=sys.stderr)
        return 2
    root = repo_root()
    files = [os.path.abspath(a) for a in args] if args else default_files(root)
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        print(f"no such file: {missing[0]}", file=sys.stderr)
        return 2
    problems, externals = Checker(root).check(files)
    if list_external:
        for e in externals:
            print(e)
    for p in problems:
        print(p)
    sys.stdout.flush()
    print(f"doc links: {len(problems)} broken in {len(files)} files" if problems
          else f"doc links: all relative links and anchors resolve in {len(files)} files", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
