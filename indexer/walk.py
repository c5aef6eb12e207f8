"""List the files of a repository worth indexing, and read them.

Two steps, so that re-walking an unchanged repository stays cheap:

- `walk_repo` decides from names and `stat` alone (ignore rules, lock files, binary
  extensions, assets such as SVG and data files (`indexer.assets`), size) and never
  opens a file, so it can run on every sync.
- `read_source` reads one file once and applies the checks that need its bytes
  (binary, UTF-8, minified, generated, a notebook's JSON), returning the text with its
  xxh3-128 digest.
  The stat cache (`indexer.statcache`) decides which files need this at all.
"""

from __future__ import annotations

import codecs
import functools
import os
import posixpath
import re
import stat as stat_mod
import time
from dataclasses import dataclass

import xxhash

from indexer import assets
from indexer.dir_handles import DirHandles
from indexer.ignore import ALWAYS_SKIPPED, VENV_MARKER, IgnoreRules
from indexer.notebook import NotebookError, parse_notebook
from indexer.skip_reasons import SkipReason

DEFAULT_MAX_FILE_BYTES = 1_000_000
# Directories above a file, at most: the store protocol carries a file's ancestors (the
# root and each directory) and accepts 256 of them (sync.wire.Limits.max_depth).
DEFAULT_MAX_DEPTH = 255

LOCK_FILE_NAMES = frozenset(
    {
        "package-lock.json",
        "npm-shrinkwrap.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "poetry.lock",
        "Cargo.lock",
        "Gemfile.lock",
        "composer.lock",
        "go.sum",
        "uv.lock",
        "Pipfile.lock",
        "packages.lock.json",
    }
)
LOCK_EXTENSIONS = frozenset({"lock", "lockb", "lockfile"})

# Skipped by name without reading: the content check would reject them anyway, but
# reading a 50 MB video to find a NUL byte is a waste.
_BINARY_EXTENSION_GROUPS = {
    "images": "png jpg jpeg gif bmp ico icns tif tiff webp psd heic heif avif xcf",
    "audio and video": "mp3 mp4 m4a m4v wav ogg oga flac aac opus avi mov mkv webm wmv flv",
    "archives and packages": "zip tar gz tgz bz2 xz lz lzma lz4 zst 7z rar jar war ear whl egg "
    "apk deb rpm dmg iso img msi cab",
    "compiled code": "so dll dylib exe bin o a obj lib ko class pyc pyo pyd wasm dex elc beam",
    "documents and fonts": "pdf doc docx xls xlsx ppt pptx odt ods odp woff woff2 ttf otf eot",
    "data and models": "sqlite sqlite3 db mdb npy npz pkl pickle pt pth ckpt onnx safetensors "
    "h5 hdf5 parquet arrow feather tfrecord",
}
BINARY_EXTENSIONS = frozenset(
    ext for group in _BINARY_EXTENSION_GROUPS.values() for ext in group.split()
)

MINIFIED_SUFFIXES = (".min.js", ".min.mjs", ".min.css", ".js.map", ".css.map")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", ".pb.go", ".pb.cc", ".pb.h")
_GENERATED_STEMS = ("_pb2", "_pb2_grpc")

# Content checks. Minified code is noise to an embedding model; one long line per file
# defeats the line-based chunker too.
MINIFIED_CHECK_EXTENSIONS = frozenset({"js", "mjs", "cjs", "css", "json", "map"})
MINIFIED_MAX_LINE = 5_000
MINIFIED_MAX_AVERAGE_LINE = 300

# A generated-code marker counts only in a comment line near the top, so that code or
# docs that merely mention "DO NOT EDIT" are still indexed.
GENERATED_SCAN_LINES = 20
_GENERATED_MARKER = re.compile(r"@generated\b|\bDO NOT EDIT\b")
_COMMENT_STARTS = ("#", "//", "/*", "*", "--", "<!--", ";", "%", "(*", "{-")

_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)  # UTF-32 LE starts like UTF-16 LE


# FileStat and WalkEntry are built once per file on every walk. They are not frozen:
# frozen dataclasses are several times slower to construct, which adds up at 100k files.


@dataclass(slots=True)
class FileStat:
    """The part of `stat` that tells whether a file changed."""

    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def from_os(cls, st: os.stat_result) -> FileStat:
        return cls(st.st_size, st.st_mtime_ns, st.st_ino)


@dataclass(slots=True)
class WalkEntry:
    """A candidate file: repo-relative POSIX path and the stat it had when walked."""

    path: str
    stat: FileStat


@dataclass(frozen=True, slots=True)
class Skipped:
    """A file (or symlinked directory) left out, and why.

    `stat` and `read_ns` are set only when `read_source` rejected the file's contents,
    so that the stat cache can remember the verdict and not read the file again.
    """

    path: str
    reason: SkipReason
    detail: str = ""
    stat: FileStat | None = None
    read_ns: int = 0

    def __str__(self) -> str:
        return f"{self.path}: {self.describe()}"

    def describe(self) -> str:
        """The reason as shown to a user, e.g. "unreadable: Permission denied"."""
        return f"{self.reason}: {self.detail}" if self.detail else str(self.reason)


@dataclass(slots=True)
class WalkResult:
    """Candidate files sorted by path, and the non-ignored files that were left out."""

    files: list[WalkEntry]
    skipped: list[Skipped]
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # the limit the walk applied


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A file's decoded text (exactly its bytes, no newline translation) and digest."""

    path: str
    text: str
    digest: bytes  # xxh3-128 of the raw bytes
    stat: FileStat  # from the open file, so it describes the bytes that were read
    read_ns: int  # wall clock just before reading; the stat cache's racy-clean check


_EXTENSION_REASONS = (
    dict.fromkeys(LOCK_EXTENSIONS, SkipReason.LOCK_FILE)
    | dict.fromkeys(BINARY_EXTENSIONS, SkipReason.BINARY)
    | dict.fromkeys(assets.SVG_EXTENSIONS, SkipReason.SVG)
    | dict.fromkeys(assets.DATA_EXTENSIONS, SkipReason.DATA)
    | dict.fromkeys(assets.TRANSLATION_EXTENSIONS, SkipReason.TRANSLATIONS)
)


def name_skip_reason(name: str) -> SkipReason | None:
    """The reason to skip a file from its name alone, or None."""
    if name in LOCK_FILE_NAMES:
        return SkipReason.LOCK_FILE
    stem, _, ext = name.rpartition(".")
    if not stem:  # no extension, or a dotfile such as `.bashrc`
        return None
    reason = _EXTENSION_REASONS.get(ext.lower())
    if reason is not None:
        return reason
    # Most names have one extension and no `_pb2` stem: done without lower-casing.
    if "." not in stem and not stem.endswith(_GENERATED_STEMS):
        return None
    lower = name.lower()
    if lower.endswith(MINIFIED_SUFFIXES):
        return SkipReason.MINIFIED
    if lower.endswith(GENERATED_SUFFIXES) or ".generated." in lower:
        return SkipReason.GENERATED
    return None


def default_skip_reason(
    rel: str, name: str, flags: int, rules: IgnoreRules
) -> tuple[SkipReason, str] | None:
    """Why the walk leaves out file `rel` by default, judged without a stat, or None.

    `flags` are the asset flags of its folder (`indexer.assets.flags_for`). A
    `.codeveilignore` negation that names the file itself (`!docs/logo.svg`,
    `!fixtures/**`) brings back what is skipped here; one that only re-includes a
    folder does not, so that a file is never brought back by accident.
    """
    reason = name_skip_reason(name)
    found = (reason, "") if reason is not None else assets.place_reason(name, flags)
    if found is None or rules.keeps(rel, is_dir=False):
        return None
    return found


def _is_utf8_name(name: str) -> bool:
    # os.scandir decodes undecodable bytes to lone surrogates, which UTF-8 refuses.
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


# One directory still to list: absolute path, repo-relative prefix ending in "/", the
# rules above it, whether an ignore file kept it explicitly, and its asset flags.
_Dir = tuple[str, str, IgnoreRules, bool, int]


class _Walker:
    """One walk: an explicit stack instead of recursion, results appended to lists."""

    def __init__(self, root: str, max_file_bytes: int, max_depth: int) -> None:
        self.root = root
        self.root_real = os.path.realpath(root)
        self.max_file_bytes = max_file_bytes
        self.max_depth = max_depth
        self.files: list[WalkEntry] = []
        self.skipped: list[Skipped] = []

    def run(self) -> WalkResult:
        stack: list[_Dir] = [(self.root, "", IgnoreRules.for_root(self.root), True, 0)]
        while stack:
            abs_dir, prefix, rules, kept, flags = stack.pop()
            entries = self._list(abs_dir, prefix)
            if entries is None:
                continue
            names = {entry.name for entry in entries}
            if VENV_MARKER in names and not kept:
                continue  # a virtualenv, and no ignore file asked for it
            rules = rules.enter(abs_dir, prefix, names)
            for entry in entries:
                child = self._visit(entry, prefix, rules, flags)
                if child is not None:
                    stack.append(child)
        self.files.sort(key=lambda f: f.path)
        self.skipped.sort(key=lambda s: s.path)
        return WalkResult(self.files, self.skipped, self.max_file_bytes)

    def _list(self, abs_dir: str, prefix: str) -> list[os.DirEntry[str]] | None:
        try:
            with os.scandir(abs_dir) as it:
                return list(it)
        except OSError as exc:
            if not prefix:
                raise  # the root itself: the caller's mistake, not a file to skip
            self._skip(prefix.rstrip("/"), SkipReason.UNREADABLE, exc.strerror or str(exc))
            return None

    def _visit(
        self, entry: os.DirEntry[str], prefix: str, rules: IgnoreRules, flags: int
    ) -> _Dir | None:
        """Record a file entry, or return a directory entry to descend into."""
        name = entry.name
        rel = prefix + name
        if not _is_utf8_name(name):
            self._skip(rel.encode("utf-8", "backslashreplace").decode(), SkipReason.BAD_NAME)
            return None
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError as exc:
            self._skip(rel, SkipReason.UNREADABLE, exc.strerror or str(exc))
            return None
        if is_dir:
            return self._visit_dir(entry, rel, rules, flags)
        if rules.skips_file(rel, name):
            return None
        skip = default_skip_reason(rel, name, flags, rules)
        if skip is not None:
            self._skip(rel, *skip)
            return None
        if entry.is_symlink():
            self._add_symlink(entry.path, rel, rules)
            return None
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as exc:  # vanished since the directory was listed
            self._skip(rel, SkipReason.UNREADABLE, exc.strerror or str(exc))
            return None
        self._add_file(rel, st, rules)
        return None

    def _visit_dir(
        self, entry: os.DirEntry[str], rel: str, rules: IgnoreRules, flags: int
    ) -> _Dir | None:
        name = entry.name
        skip, kept = rules.skips_dir(rel, name)
        if skip:
            return None
        if rel.count("/") + 1 > self.max_depth:
            self._skip(rel, SkipReason.TOO_DEEP,
                       f"more than {self.max_depth} directories above its files")
            return None
        if assets.is_vendored_dir(name) and not rules.keeps(rel, is_dir=True):
            self._skip(rel, SkipReason.VENDORED, "folder")
            return None
        return entry.path, rel + "/", rules, kept, assets.dir_flags(flags, name)

    def _add_symlink(self, link: str, rel: str, rules: IgnoreRules) -> None:
        try:
            st = os.stat(link)
        except OSError as exc:  # dangling, or a loop of links
            self._skip(rel, SkipReason.UNREADABLE, f"broken symlink ({exc.strerror or exc})")
            return
        if stat_mod.S_ISDIR(st.st_mode):
            self._skip(rel, SkipReason.SYMLINK_DIR)
            return
        try:
            target = os.path.realpath(link)
        except OSError as exc:  # the link was removed or replaced since the stat above
            detail = f"symlink changed while read ({exc.strerror or exc})"
            self._skip(rel, SkipReason.UNREADABLE, detail)
            return
        if not _is_inside(target, self.root_real):
            self._skip(rel, SkipReason.SYMLINK_OUTSIDE)
        elif not ALWAYS_SKIPPED.isdisjoint(target[len(self.root_real) :].split(os.sep)):
            return  # a way into .git/ (remote URLs, hooks): as ignored as .git itself
        else:
            self._add_file(rel, st, rules)

    def _add_file(self, rel: str, st: os.stat_result, rules: IgnoreRules) -> None:
        if not stat_mod.S_ISREG(st.st_mode):
            self._skip(rel, SkipReason.NOT_REGULAR)
        elif st.st_size > self.max_file_bytes:
            self._skip(rel, SkipReason.TOO_LARGE, f"{st.st_size} bytes")
        elif (large := self._large_data(rel, st.st_size, rules)) is not None:
            self._skip(rel, *large)
        else:
            self.files.append(WalkEntry(rel, FileStat(st.st_size, st.st_mtime_ns, st.st_ino)))

    @staticmethod
    def _large_data(rel: str, size: int, rules: IgnoreRules) -> tuple[SkipReason, str] | None:
        found = assets.size_reason(rel.rpartition("/")[2], size)
        return None if found is None or rules.keeps(rel, is_dir=False) else found

    def _skip(self, rel: str, reason: SkipReason, detail: str = "") -> None:
        self.skipped.append(Skipped(rel, reason, detail))


def walk_repo(
    root: str | os.PathLike[str],
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> WalkResult:
    """List the indexable files under `root` from names and stat alone.

    Ignored paths are left out silently; other files left out (too large, lock file,
    binary or minified or generated by name, assets and vendored folders (see
    `default_skip_reason`), symlinks leading out of the repository or to directories,
    unreadable entries) are listed in `skipped`. Symlinked directories
    are never followed; a symlinked file is listed under the link's path if its target
    lies inside `root`. A directory more than `max_depth` levels down is skipped whole.
    Never opens a file other than ignore files.
    """
    return _Walker(os.fspath(root), max_file_bytes, max_depth).run()


class _Rejected(Exception):
    """A file that can be opened but is not a candidate after all."""

    def __init__(self, reason: SkipReason, detail: str = "") -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail


# O_NONBLOCK: a FIFO that replaced a file since the walk must not hang the reader.
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _read_bytes(path: str, max_file_bytes: int) -> tuple[bytes, os.stat_result]:
    """The file's bytes and its stat taken from the open descriptor.

    Raises OSError if it cannot be read and `_Rejected` if it is not a regular file or
    is larger than `max_file_bytes` (it may have changed since the walk).
    """
    return _read_fd(os.open(path, _READ_FLAGS), max_file_bytes)


def _read_fd(fd: int, max_file_bytes: int) -> tuple[bytes, os.stat_result]:
    """`_read_bytes` of an open descriptor, which it closes."""
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise _Rejected(SkipReason.NOT_REGULAR)
        if st.st_size > max_file_bytes:
            raise _Rejected(SkipReason.TOO_LARGE, f"{st.st_size} bytes")
        chunks = []
        remaining = max_file_bytes + 1  # the file may have grown since fstat
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_file_bytes:
        raise _Rejected(SkipReason.TOO_LARGE, f"over {max_file_bytes} bytes")
    return data, st


@functools.lru_cache(maxsize=64)
def _real_root(root: str) -> str:
    return os.path.realpath(root)


def _check_inside(root: str, path: str, opened: os.stat_result) -> None:
    """Raise `_Rejected` unless the file read is one that lies inside the repo.

    The walk checks a symlink's target, but the read follows links itself: a link (or a
    directory on the way) swapped between the two would get an outside file indexed.
    So after the read, the path is resolved again and the file found there must be the
    very one that was read (same device and inode). A link flipped before the read
    resolves outside; one flipped back after it names another inode: refused either way.
    """
    full = os.path.join(root, path)
    if not os.path.islink(full) and os.path.realpath(os.path.dirname(full)) == os.path.join(
        _real_root(root), os.path.dirname(path)
    ).rstrip(os.sep):
        real = full  # the common case: a plain file under real directories
    else:
        real = os.path.realpath(full)
        root_real = _real_root(root)
        if not _is_inside(real, root_real) or not ALWAYS_SKIPPED.isdisjoint(
            real[len(root_real) :].split(os.sep)
        ):
            raise _Rejected(SkipReason.SYMLINK_OUTSIDE, "its target changed while it was read")
    try:
        now = os.stat(real, follow_symlinks=False)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
        raise _Rejected(SkipReason.SYMLINK_OUTSIDE, "the file changed while it was read")


def _is_minified(path: str, text: str) -> bool:
    ext = posixpath.splitext(path)[1][1:].lower()
    if ext not in MINIFIED_CHECK_EXTENSIONS or not text:
        return False
    lines = text.count("\n") + (not text.endswith("\n"))
    if len(text) / lines > MINIFIED_MAX_AVERAGE_LINE:
        return True
    if len(text) <= MINIFIED_MAX_LINE:
        return False
    return max(map(len, text.split("\n"))) > MINIFIED_MAX_LINE


def _has_generated_marker(text: str) -> bool:
    head_text = text[:8192]
    # Most files: two substring scans, no split (the regex alone took 80 us a file).
    if "@generated" not in head_text and "DO NOT EDIT" not in head_text:
        return False
    head = head_text.split("\n", GENERATED_SCAN_LINES)[:GENERATED_SCAN_LINES]
    for line in head:
        stripped = line.lstrip()
        if stripped.startswith(_COMMENT_STARTS) and _GENERATED_MARKER.search(stripped):
            return True
    return False


def decode_source(path: str, data: bytes) -> tuple[str, None] | tuple[None, SkipReason]:
    """Decode and check a file's bytes: (text, None) if indexable, else (None, reason)."""
    if data.startswith(_UTF16_BOMS):
        return None, SkipReason.NOT_UTF8
    # The whole buffer, not only the first 8 KiB as Git does: it is in memory already
    # and memchr is fast; a NUL anywhere means the text model would see garbage.
    if b"\0" in data:
        return None, SkipReason.BINARY
    try:
        # Strict UTF-8 and a kept BOM: the text must match the bytes on disk exactly,
        # because chunk hashes are re-checked against the file later.
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, SkipReason.NOT_UTF8
    if path.endswith(".ipynb"):
        try:
            parse_notebook(text)
        except NotebookError:
            return None, SkipReason.BAD_NOTEBOOK
        return text, None  # outputs make long lines; only the cells are indexed
    if _is_minified(path, text):
        return None, SkipReason.MINIFIED
    if _has_generated_marker(text):
        return None, SkipReason.GENERATED
    return text, None


def read_source(
    root: str | os.PathLike[str], path: str, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    dirs: DirHandles | None = None,
) -> SourceFile | Skipped:
    """Read the repo-relative `path` once: its text and digest, or why it is skipped.

    Never raises for a bad file: unreadable, vanished, binary, non-UTF-8, minified or
    generated files come back as `Skipped`. With `dirs` (`indexer.dir_handles`, open on
    the same `root`), a file reached through no symlink is opened beneath its
    directory's descriptor and needs no check that it lies inside the repo.
    """
    read_ns = time.time_ns()
    try:
        fd = dirs.open_beneath(path, _READ_FLAGS) if dirs is not None else None
        if fd is not None:
            data, st = _read_fd(fd, max_file_bytes)
        else:
            data, st = _read_bytes(os.path.join(root, path), max_file_bytes)
            _check_inside(os.fspath(root), path, st)
    except OSError as exc:
        return Skipped(path, SkipReason.UNREADABLE, exc.strerror or str(exc))
    except _Rejected as rejected:
        return Skipped(path, rejected.reason, rejected.detail)
    stat = FileStat.from_os(st)
    text, reason = decode_source(path, data)
    if reason is not None:
        return Skipped(path, reason, stat=stat, read_ns=read_ns)
    assert text is not None
    return SourceFile(path, text, xxhash.xxh3_128_digest(data), stat, read_ns)
