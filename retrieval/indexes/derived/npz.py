"""An index's arrays as one .npz file, written a slice at a time and read back mapped.

`np.savez` and `np.load` would do, for a small index: at 1M chunks the BM25 postings are
~800 MB, which `np.load` reads into the process's memory (all of it resident in every
search process) and `np.savez` reads through a mapped array's every page at once.
Here the file is the same format (a zip of .npy members, stored, not compressed: what
`np.savez` writes and `np.load` reads), but:

- `write_npz` writes each member a slice at a time, handing a mapped array's pages
  back after each (`retrieval.indexes.derived.spill.release`);
- `read_npz` maps the large members straight from the file (read-only `np.memmap`s at
  the member's offset), so a search faults in only the pages it reads, shared with
  every other process reading the same index through the page cache; small members
  are read into memory.

A mapped member skips the zip's CRC check that `np.load` makes, so `write_npz` also
stores the xxh3-64 of every member's data (member `CHECKSUMS`), and `read_npz` checks
each mapped member against it with plain reads (which leave no page of it mapped): a
garbled index is a ValueError, rebuilt by its store, not a wrong answer or a crash.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path
from typing import IO, Final

import numpy as np
import xxhash

from retrieval.indexes.derived.spill import release

#: Bytes written between two hand-backs of a mapped array's pages.
WRITE_SLICE_BYTES: Final = 16 << 20
#: Members at least this large are mapped by `read_npz`; smaller ones are read.
MAP_MIN_BYTES: Final = 1 << 20

#: The member holding the xxh3-64 of every other member's data, in order.
CHECKSUMS: Final = "_xxh3"
_READ_BYTES: Final = 1 << 24

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # a zip member's local file header


def write_npy(f: IO[bytes] | _At, array: np.ndarray) -> int:
    """Write `array` to `f` as an .npy file (the header at `f`'s position, the data
    64-byte aligned in `f`), a slice at a time, handing a mapped array's pages back
    after each; returns the xxh3-64 of the data."""
    a = np.asanyarray(array)
    f.write(_npy_header(a, f.tell()))
    flat = np.ascontiguousarray(a).reshape(-1)  # a view when it already is
    step = max(1, WRITE_SLICE_BYTES // max(a.dtype.itemsize, 1))
    digest = xxhash.xxh3_64()
    for at in range(0, len(flat), step):
        data = np.ascontiguousarray(flat[at : at + step]).view(np.uint8).data
        digest.update(data)
        f.write(data)
        release(a)
    return digest.intdigest()


def write_npz(f: IO[bytes], arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` to the seekable binary file `f` as an uncompressed .npz."""
    digests: list[int] = []
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED,
                         allowZip64=True) as zf:
        for name, array in arrays.items():
            with zf.open(name + ".npy", mode="w", force_zip64=True) as member:
                # The member's local header is written: its data starts at f.tell().
                digests.append(write_npy(_At(member, f), array))
        with zf.open(CHECKSUMS + ".npy", mode="w") as member:
            np.lib.format.write_array(member, np.array(digests, dtype=np.uint64))


class _At:
    """A zip member being written, telling the position in the file it goes to."""

    def __init__(self, member: IO[bytes], f: IO[bytes]) -> None:
        self.member, self.start, self.written = member, f.tell(), 0

    def tell(self) -> int:
        return self.start + self.written

    def write(self, data: bytes | memoryview) -> int:
        self.written += len(data)
        return self.member.write(data)


def _npy_header(a: np.ndarray, at: int) -> bytes:
    """An .npy (2.0) header for `a`, padded so that the data after it starts 64-byte
    aligned in the file when the header starts at offset `at`: a mapped member is then
    as aligned as an array numpy allocates (an unaligned one takes numpy's slow paths)."""
    body = repr({"descr": np.lib.format.dtype_to_descr(a.dtype), "fortran_order": False,
                 "shape": tuple(int(s) for s in a.shape)}).encode("latin1")
    pad = -(at + 12 + len(body) + 1) % 64  # 12: magic (6), version (2), length (4)
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(body) + pad + 1) + body \
        + b" " * pad + b"\n"


def read_npz(path: Path, *, map_min_bytes: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of the .npz at `path`: members of at least `map_min_bytes`
    (`MAP_MIN_BYTES`) as read-only maps of the file, the others in memory. Raises what
    reading a damaged file raises (zipfile.BadZipFile, ValueError, OSError)."""
    if map_min_bytes is None:
        map_min_bytes = MAP_MIN_BYTES
    out: dict[str, np.ndarray] = {}
    mapped: list[tuple[int, int, int]] = []  # (member number, data offset, bytes)
    with path.open("rb") as fh, zipfile.ZipFile(fh) as zf:
        for number, info in enumerate(zf.infolist()):
            name = info.filename.removesuffix(".npy")
            if info.compress_type != zipfile.ZIP_STORED or info.file_size < map_min_bytes \
                    or name == CHECKSUMS:
                with zf.open(info) as member:
                    out[name] = np.lib.format.read_array(member, allow_pickle=False)
                continue
            fh.seek(info.header_offset)
            header = _LOCAL_HEADER.unpack(fh.read(_LOCAL_HEADER.size))
            if header[0] != b"PK\x03\x04":
                raise zipfile.BadZipFile(f"{path}: no local header for {info.filename}")
            fh.seek(info.header_offset + _LOCAL_HEADER.size + header[-2] + header[-1])
            start = fh.tell()
            version = np.lib.format.read_magic(fh)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(fh)
            if dtype.hasobject or fortran:
                raise ValueError(f"{path}: {info.filename} is not a plain C-order array")
            offset = fh.tell()
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if offset - start + nbytes > info.file_size:
                raise ValueError(f"{path}: {info.filename} is truncated")
            mapped.append((number, offset, nbytes))
            out[name] = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
        sums = out.get(CHECKSUMS)
        if mapped and sums is not None:  # None: an older file, which its reader rejects
            for number, offset, nbytes in mapped:
                if number >= len(sums) \
                        or _checksum(fh, offset, nbytes) != int(sums[number]):
                    raise ValueError(f"{path}: member {number} fails its checksum")
    out.pop(CHECKSUMS, None)
    return out


def _checksum(fh: IO[bytes], offset: int, nbytes: int) -> int:
    """xxh3-64 of `nbytes` of `fh` from `offset`, read (not mapped)."""
    digest = xxhash.xxh3_64()
    fh.seek(offset)
    while nbytes > 0:
        data = fh.read(min(nbytes, _READ_BYTES))
        if not data:
            raise ValueError("the file ends inside a member")
        digest.update(data)
        nbytes -= len(data)
    return digest.intdigest()


def read_npy_checked(path: Path, dtype: np.dtype, checksum: int) -> np.ndarray:
    """The 1-d array of `dtype` in the .npy file at `path`, mapped read-only, once its
    data's xxh3-64 (plain reads, which leave no page mapped) is `checksum`, the value
    `write_npy` returned when it wrote it. Raises ValueError naming the file when it is
    truncated, of another shape or type, or its data differs by one bit; OSError (and
    FileNotFoundError) when it cannot be read."""
    with path.open("rb") as fh:
        version = np.lib.format.read_magic(fh)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, found = read_header(fh)
        if found != dtype or fortran or len(shape) != 1:
            raise ValueError(f"{path} holds {found}{list(shape)}, not a {dtype} array")
        offset = fh.tell()
        nbytes = int(shape[0]) * found.itemsize
        if path.stat().st_size != offset + nbytes:
            raise ValueError(f"{path} is {path.stat().st_size} bytes, not {offset + nbytes}")
        if _checksum(fh, offset, nbytes) != checksum:
            raise ValueError(f"{path} fails its checksum")
    if not nbytes:  # an empty file cannot be mapped
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
