"""Stage 1 of the training recipe: the corpus (CPython standard library sources) and its train / held-out split.

`build` walks a Python installation's Lib folder (default: this interpreter's, os.path.dirname(os.__file__)),
keeps the UTF-8 `.py` files outside test folders, site-packages and machine-generated files, splits them by a
hash of their relative path, packs them (and Lib's LICENSE.txt, the PSF license) into a deterministic
`corpus.tar.gz` under the work folder, and writes the committed manifest `tools/train/corpus_manifest.txt`.
`check` verifies an archive against the manifest; `load()` is what later stages call.

    python3 tools/train/corpus.py build [--lib DIR] [--write-manifest]
    python3 tools/train/corpus.py check
"""

import argparse
import gzip
import hashlib
import io
import os
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import HELDOUT_PERCENT, HERE, fail, log, sha256_bytes, work  # noqa: E402

MANIFEST = os.path.join(HERE, "corpus_manifest.txt")
ARCHIVE_NAME = "corpus.tar.gz"
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "lib-dynload", "__pycache__"}
SKIP_DIR_PREFIXES = ("config-",)  # config-3.11-x86_64-linux-gnu: the build's own makefiles and scripts
SKIP_FILE_PREFIXES = ("_sysconfigdata_",)  # generated at build time, holds this machine's build paths


def split_of(relpath):
    """'heldout' for about HELDOUT_PERCENT % of files, chosen by a hash of the relative path; else 'train'."""
    h = int.from_bytes(hashlib.sha256(relpath.encode("utf-8")).digest()[:8], "big")
    return "heldout" if h % 100 < HELDOUT_PERCENT else "train"


def collect(lib):
    """Sorted [(relpath, raw bytes)] of the kept files, and the count of non-UTF-8 files skipped."""
    out, not_utf8 = [], 0
    for dirpath, dirnames, filenames in os.walk(lib):
        dirnames[:] = sorted(
            d for d in dirnames if d not in SKIP_DIRS and not d.startswith(SKIP_DIR_PREFIXES)
        )
        for fn in sorted(filenames):
            if not fn.endswith(".py") or fn.startswith(SKIP_FILE_PREFIXES):
                continue
            path = os.path.join(dirpath, fn)
            with open(path, "rb") as f:
                raw = f.read()
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                not_utf8 += 1
                continue
            rel = os.path.relpath(path, lib).replace(os.sep, "/")
            out.append((rel, raw))
    out.sort(key=lambda x: x[0])
    return out, not_utf8


def manifest_lines(files, lib_version):
    lines = [
        "# TensorFold training corpus: the Python files of the CPython standard library (Lib/), one line a file:",
        "# path<TAB>sha256<TAB>bytes<TAB>split. Written by tools/train/corpus.py; the files themselves travel in",
        "# carry/train/corpus.tar.gz (git-ignored), which also holds Lib/LICENSE.txt.",
        f"# Source: CPython {lib_version} Lib, without test folders (test, tests, idle_test), site-packages,",
        "# lib-dynload, config-*/ and the generated _sysconfigdata_*; every kept file is UTF-8.",
        f"# Split: held out when int(sha256(path)[:8 bytes]) % 100 < {HELDOUT_PERCENT}.",
        "# License: Python Software Foundation License Version 2 (PSF-2.0), copyright the Python Software",
        "# Foundation; the full text is Lib/LICENSE.txt, packed in the archive as LICENSE.txt.",
    ]
    for rel, raw in files:
        lines.append(f"{rel}\t{sha256_bytes(raw)}\t{len(raw)}\t{split_of(rel)}")
    return lines


def read_manifest(path=MANIFEST):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            rel, sha, n, split = line.rstrip("\n").split("\t")
            rows.append((rel, sha, int(n), split))
    return rows


def write_archive(path, members):
    """A byte-for-byte reproducible tar.gz: fixed order, mtime, owner and mode; gzip header mtime 0."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name, raw in members:
                ti = tarfile.TarInfo(name)
                ti.size, ti.mtime, ti.mode, ti.uid, ti.gid = len(raw), 0, 0o644, 0, 0
                ti.uname = ti.gname = ""
                tar.addfile(ti, io.BytesIO(raw))
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def build(lib, archive, write_manifest, smoke=False):
    import platform

    files, not_utf8 = collect(lib)
    if not files:
        fail(f"no .py files under {lib}")
    if smoke:  # a handful of files of both splits
        tr = [f for f in files if split_of(f[0]) == "train"][:40]
        ho = [f for f in files if split_of(f[0]) == "heldout"][:4]
        files = sorted(tr + ho)
    lic_path = os.path.join(lib, "LICENSE.txt")
    license_raw = open(lic_path, "rb").read() if os.path.isfile(lic_path) else b""
    if not license_raw:
        fail(f"{lic_path} is missing: the corpus ships with its license")
    lines = manifest_lines(files, platform.python_version())
    manifest_text = "\n".join(lines) + "\n"
    if write_manifest:
        with open(MANIFEST, "w", encoding="utf-8") as f:
            f.write(manifest_text)
        log(f"wrote {MANIFEST}")
    members = [("LICENSE.txt", license_raw), ("MANIFEST.txt", manifest_text.encode())]
    members += [(f"{split_of(rel)}/{rel}", raw) for rel, raw in files]
    write_archive(archive, members)
    n_ho = sum(1 for rel, _ in files if split_of(rel) == "heldout")
    b_ho = sum(len(raw) for rel, raw in files if split_of(rel) == "heldout")
    b_all = sum(len(raw) for _, raw in files)
    log(
        f"corpus: {len(files)} files ({len(files) - n_ho} train, {n_ho} held out), {b_all} bytes "
        f"({b_all - b_ho} train, {b_ho} held out); {not_utf8} non-UTF-8 skipped; archive {archive} "
        f"{os.path.getsize(archive)} bytes"
    )


def load(archive=None, check_manifest=True):
    """{'train': [(relpath, text)], 'heldout': [...]} from the archive, sorted by path; checked against the
    archive's own MANIFEST.txt (and the committed manifest unless check_manifest is False or it differs
    in file set, as in smoke mode)."""
    archive = archive or work(ARCHIVE_NAME)
    if not os.path.isfile(archive):
        fail(f"{archive} not found: run `python3 tools/train/corpus.py build` first")
    out = {"train": [], "heldout": []}
    with tarfile.open(archive, "r:gz") as tar:
        inner = tar.extractfile("MANIFEST.txt").read().decode()
        rows = {}
        for line in inner.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            rel, sha, n, split = line.split("\t")
            rows[rel] = (sha, int(n), split)
        for m in tar.getmembers():
            if m.name in ("LICENSE.txt", "MANIFEST.txt"):
                continue
            split, rel = m.name.split("/", 1)
            raw = tar.extractfile(m).read()
            sha, n, want_split = rows[rel]
            if sha256_bytes(raw) != sha or len(raw) != n or split != want_split or split != split_of(rel):
                fail(f"archive member {m.name} does not match its manifest row")
            out[split].append((rel, raw.decode("utf-8")))
    if len(out["train"]) + len(out["heldout"]) != len(rows):
        fail("archive and its manifest list different files")
    if check_manifest and os.path.isfile(MANIFEST):
        committed = {r[0]: (r[1], r[2], r[3]) for r in read_manifest()}
        if committed != rows:
            fail(f"{archive} differs from {MANIFEST}; rebuild it or pass check_manifest=False")
    for k in out:
        out[k].sort(key=lambda x: x[0])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["build", "check"])
    ap.add_argument("--lib", default=os.path.dirname(os.__file__), help="the Lib folder to read")
    ap.add_argument("--archive", default=work(ARCHIVE_NAME))
    ap.add_argument("--write-manifest", action="store_true", help="(re)write tools/train/corpus_manifest.txt")
    ap.add_argument("--smoke", action="store_true", help="a few dozen files only (never with --write-manifest)")
    a = ap.parse_args()
    if a.cmd == "build":
        if a.smoke and a.write_manifest:
            fail("--smoke and --write-manifest do not go together")
        build(a.lib, a.archive, a.write_manifest, smoke=a.smoke)
    corpus = load(a.archive, check_manifest=not a.smoke)
    log(f"archive ok: {len(corpus['train'])} train files, {len(corpus['heldout'])} held-out files")


if __name__ == "__main__":
    main()
