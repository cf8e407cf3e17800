#!/usr/bin/env python3
"""Check that every repository path the Markdown files cite exists (receipts, raw logs, docs, tools, sources).

Usage: python3 tools/receipts/check_links.py [--verbose] [--uncited] [FILE.md ...]

With no files, it reads README.md and every tracked `*.md` under docs/ and tools/. A cited path is a word that either
  * starts with a top-level entry of the repository (`docs/`, `tools/`, `crates/`, `models/`, `tests/`, `.ci/`,
    `README.md`, ...) and stands in backticks, a link target or a code block (prose such as "tests/examples" is
    not a citation), resolved from the repository root; or
  * starts with `docs/receipts/`, or names a dated receipt file or folder (`2026-11-30-…`, optionally behind one
    folder such as `2026-11-30-cuda-staged-pdl/` or `unindexed/`), anywhere in the text, resolved from the citing
    file's folder, then from docs/receipts/.
Patterns count as cited paths too: `{a,b}` is expanded, and `*`, `<name>` and `…` match any run of characters
within one path part; a pattern must match at least one file. Machine paths (`/tmp/…`, `$OUT/…`, `carry/…`)
and paths relative to some other folder (`cuda/device.rs`) are not checked.

--verbose prints every path checked; --uncited also lists the raw files under docs/receipts/ that no checked file
cites (by name or by a pattern), which the receipts index must account for.

Exit status: 0 when every cited path exists, 1 when any is missing (each printed as FILE:LINE: PATH), 2 on a usage
error. Standard library only (Python 3.8 or later); no third-party modules.
"""

import os
import re
import subprocess
import sys

# A word made of path characters, with `{a,b}` groups allowed inside it.
WORD = re.compile(r"(?:[A-Za-z0-9_.\-/*<>…~+]|\{[^{}\s`]*\})+")
# A receipt file or folder, optionally behind one folder (a receipt's, or `unindexed/`).
DATED = re.compile(r"^(?:[A-Za-z0-9_.\-]+/)?\d{4}-\d\d-\d\d-(?:\S*\.(?:md|log|txt|json)|[A-Za-z0-9_.\-]+/)$")
DATED_PATTERN = re.compile(r"^(?:[A-Za-z0-9_.\-]+/)?\d{4}-\d\d-\d\d-\S*[*<…{]")
TRAILING = ".,:;)"


def repo_root():
    """The repository root: the folder two levels above this script."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tracked_files(root):
    """Every path git tracks, plus untracked files that are not ignored (so a fresh move counts)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout
    return sorted({p for p in out.splitlines() if os.path.exists(os.path.join(root, p))})


def expand_braces(word):
    """`a{b,c}d` -> [`abd`, `acd`], recursively; a word without braces is returned alone."""
    m = re.search(r"\{([^{}]*)\}", word)
    if not m:
        return [word]
    head, tail = word[: m.start()], word[m.end():]
    out = []
    for alt in m.group(1).split(","):
        out.extend(expand_braces(head + alt + tail))
    return out


def to_glob(word):
    """Placeholders (`<commit>`) and ellipses (`…`) become `*`, so a cited pattern is a glob."""
    return re.sub(r"<[^<>]*>", "*", word).replace("…", "*")


def glob_regex(pattern):
    """A repository-relative glob as a compiled regex: `*` is any run of characters within one path part."""
    pattern = os.path.normpath(pattern).replace(os.sep, "/")
    return re.compile("".join("[^/]*" if c == "*" else re.escape(c) for c in pattern) + r"\Z")


def matches(pattern, files, dirs):
    """Whether a repository-relative glob names at least one tracked file or folder."""
    rx = glob_regex(pattern)
    return any(rx.match(f) for f in files) or any(rx.match(d) for d in dirs)


def quoted_ranges(text):
    """Character ranges of the text that quote code: fenced and indented code blocks, backtick spans (which may
    run over a line break, as in Markdown) and link targets."""
    ranges, pos, in_fence, prose = [], 0, False, []
    for line in text.splitlines(keepends=True):
        fence = line.lstrip().startswith("```")
        if in_fence or fence or (line.startswith("    ") and not line.lstrip().startswith(("-", "*", "|"))):
            ranges.append((pos, pos + len(line)))
            prose.append(" " * (len(line) - 1) + "\n")  # blanked, so its backticks pair with nothing
        else:
            prose.append(line)
        if fence:
            in_fence = not in_fence
        pos += len(line)
    # A backtick span may run over a line break, not over a blank line (a paragraph's end).
    for m in re.finditer(r"`(?:[^`\n]|\n(?![ \t]*\n))+`|\]\([^)\s]+\)", "".join(prose)):
        ranges.append(m.span())
    return ranges


def cited_words(text):
    """(line number, word, quoted) for every word of the text that may be a path; quoted says whether it stands
    in code (backticks, a link target, a code block)."""
    ranges = quoted_ranges(text)
    for m in WORD.finditer(text):
        word = m.group(0).rstrip(TRAILING)
        if word.startswith("./"):
            word = word[2:]
        if not word:
            continue
        lineno = text.count("\n", 0, m.start()) + 1
        quoted = any(a <= m.start() < b for a, b in ranges)
        yield lineno, word, quoted


def candidates(word, quoted, md_dir, tops):
    """The repository-relative globs a cited word may mean, or [] when it is not a repository path."""
    if word.startswith("docs/receipts/"):
        return [word]
    first = word.split("/", 1)[0]
    if quoted and first in tops and ("/" in word or "." in word):
        return [word]  # a bare folder name ("tools", "docs") is a word, not a citation
    if DATED.match(word) or DATED_PATTERN.match(word):
        return [os.path.join(md_dir, word), os.path.join("docs/receipts", word)]
    return []


def check(root, md_files, verbose, uncited=False):
    """Print each missing path (and, with uncited, each raw receipt file no cited path names); return how many
    are missing."""
    files = set(tracked_files(root))
    dirs = {os.path.dirname(f) for f in files}
    dirs |= {d for f in list(dirs) for d in _parents(f)}
    tops = {f.split("/", 1)[0] for f in files}
    missing = checked = 0
    raw = {f for f in files if f.startswith("docs/receipts/") and not f.endswith(".md")}
    named = set()
    for md in md_files:
        with open(os.path.join(root, md), encoding="utf-8") as fh:
            text = fh.read()
        md_dir = os.path.dirname(md)
        for lineno, word, quoted in cited_words(text):
            alts = candidates(word, quoted, md_dir, tops)
            if not alts:
                continue
            checked += 1
            globs = [to_glob(p) for alt in alts for p in expand_braces(alt)]
            ok = any(matches(g, files, dirs) for g in globs)
            if uncited:
                named.update(f for f in raw for g in globs if glob_regex(g).match(f))
            if not ok:
                missing += 1
                print(f"{md}:{lineno}: {word}")
            elif verbose:
                print(f"ok {md}:{lineno}: {word}")
    if uncited:
        for f in sorted(raw - named):
            print(f"uncited: {f}")
    print(f"check_links: {checked} cited paths in {len(md_files)} files, {missing} missing")
    return missing


def _parents(path):
    """Every ancestor folder of a repository-relative path."""
    while path:
        yield path
        path = os.path.dirname(path)


def main(argv):
    verbose = "--verbose" in argv
    uncited = "--uncited" in argv
    args = [a for a in argv if a not in ("--verbose", "--uncited")]
    if any(a.startswith("-") for a in args):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    root = repo_root()
    if args:
        md_files = [os.path.relpath(os.path.abspath(a), root) for a in args]
    else:
        md_files = [
            f for f in tracked_files(root)
            if f.endswith(".md") and (f == "README.md" or f.startswith(("docs/", "tools/")))
        ]
    return 1 if check(root, md_files, verbose, uncited) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
