"""The checkpoint manifest: its schema, its JSON form, and its version rules.

The serialized JSON is the schema; these dataclasses only type it. ``MANIFEST.json``
is the commit marker of a checkpoint: it lists every file with its size and
xxh3_128 hash, and carries its own checksum, so a flipped byte anywhere in a
checkpoint, the manifest included, is caught. Bump :data:`VERSION` on any change a
reader of the old version would misread; readers refuse newer versions.

Version 1 keeps every file inside the checkpoint directory. Version 2 stores data
in content-addressed blobs shared by every checkpoint of a storage root: ``files``
keys are then paths relative to the storage root, and each array names the
tensor it is inside its file (see docs/checkpoint-format.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import xxhash

from ..errors import CheckpointError, CheckpointFormatError

FORMAT = "segue.checkpoint"
VERSION = 2
READABLE_VERSIONS = (1, 2)
MANIFEST_NAME = "MANIFEST.json"


class ManifestFormatError(CheckpointFormatError):
    """The manifest bytes do not hold a well-formed manifest (readers report it as
    :class:`~segue.errors.CheckpointCorruptError` of the checkpoint)."""


@dataclass(frozen=True)
class FileEntry:
    """One file of the checkpoint, relative to the checkpoint directory."""

    size: int
    xxh3_128: str


@dataclass(frozen=True)
class ArrayEntry:
    """One array: where it is stored and how to rebuild it exactly.

    ``dtype`` is the numpy ``dtype.str`` of the array as saved; ``stored_as`` is the
    safetensors dtype name in ``file`` (``U8`` raw bytes for dtypes safetensors cannot
    name). ``meta`` holds framework details (``framework``, torch ``dtype``, ``device``).
    """

    file: str
    dtype: str
    shape: tuple[int, ...]
    stored_as: str
    meta: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    """v2: the tensor's name inside ``file``; v1 files name tensors by their ref."""


@dataclass(frozen=True)
class OpaqueEntry:
    """One pickled value (only with allow_pickle): a byte range of ``file``."""

    file: str
    offset: int
    size: int
    type: str


@dataclass(frozen=True)
class Manifest:
    created_at: str
    meta: dict[str, Any]
    versions: dict[str, str]
    tree: Any
    arrays: dict[str, ArrayEntry]
    files: dict[str, FileEntry]
    opaque: dict[str, OpaqueEntry] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    format: str = FORMAT
    version: int = VERSION

    def file_path(self, ckpt_path: str, name: str) -> str:
        """Where file ``name`` of this manifest lives, relative to the storage root."""
        return f"{ckpt_path}/{name}" if self.version == 1 else name

    def tensor_name(self, ref: str) -> str:
        return self.arrays[ref].name or ref

    def _body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "format": self.format,
            "version": self.version,
            "created_at": self.created_at,
            "meta": self.meta,
            "versions": self.versions,
            "files": {k: {"size": v.size, "xxh3_128": v.xxh3_128} for k, v in self.files.items()},
            "arrays": {
                k: {
                    "file": a.file,
                    "dtype": a.dtype,
                    "shape": list(a.shape),
                    "stored_as": a.stored_as,
                    "meta": a.meta,
                    **({"name": a.name} if self.version >= 2 else {}),
                }
                for k, a in self.arrays.items()
            },
            "tree": self.tree,
        }
        if self.opaque:
            body["opaque"] = {
                k: {"file": o.file, "offset": o.offset, "size": o.size, "type": o.type}
                for k, o in self.opaque.items()
            }
        if self.tags:
            body["tags"] = list(self.tags)
        return body

    def to_json(self) -> str:
        # One line per top-level field: readable with `head`, and without indent= the
        # C encoder does the work (indented JSON is 10x slower for large trees). Each
        # field is encoded once: the checksum's compact text is the same fields joined
        # by commas (what _checksum encodes whole), so a large tree is not encoded twice.
        fields = [f"{json.dumps(k)}:{_compact(v)}" for k, v in self._body().items()]
        digest = xxhash.xxh3_128_hexdigest(("{" + ",".join(fields) + "}").encode())
        return "{\n" + ",\n".join([*fields, f'"checksum":{json.dumps(digest)}']) + "\n}\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Parse and check a manifest.

        Raises :class:`ManifestFormatError` for anything malformed, and
        :class:`~segue.errors.CheckpointError` for a newer format version.
        """
        try:
            body = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ManifestFormatError(f"not JSON: {e}") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ManifestFormatError(f"not a {FORMAT} manifest")
        version = body.get("version")
        if type(version) is not int or version < 1:
            raise ManifestFormatError("version is not an int >= 1")
        if version > VERSION and not _is_readable_version_flipped(body):
            raise CheckpointError(
                f"checkpoint format version {version} is newer than this segue reads "
                f"(up to {VERSION}); upgrade segue to load it"
            )
        stored = body.pop("checksum", None)
        if stored != _checksum(body):
            raise ManifestFormatError("manifest checksum mismatch")
        try:
            return cls(
                created_at=body["created_at"],
                meta=body["meta"],
                versions=body["versions"],
                tree=body["tree"],
                files={k: FileEntry(**v) for k, v in body["files"].items()},
                arrays={
                    k: ArrayEntry(
                        file=a["file"],
                        dtype=a["dtype"],
                        shape=tuple(a["shape"]),
                        stored_as=a["stored_as"],
                        meta=a["meta"],
                        name=a["name"] if version >= 2 else "",
                    )
                    for k, a in body["arrays"].items()
                },
                opaque={k: OpaqueEntry(**o) for k, o in body.get("opaque", {}).items()},
                tags=tuple(str(t) for t in body.get("tags", ())),
                format=body["format"],
                version=version,
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ManifestFormatError(f"missing or malformed field: {e}") from None


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _checksum(body: dict[str, Any]) -> str:
    # Compact JSON in insertion order (not sorted like _canon.canonical_json): the
    # tree's dict order is part of the state, and parsing preserves it, so the
    # reader re-serializes to exactly these bytes.
    return xxhash.xxh3_128_hexdigest(_compact(body).encode())


def _is_readable_version_flipped(body: dict[str, Any]) -> bool:
    # A byte flipped in "version" must read as corruption, not as "upgrade segue":
    # if the checksum matches with a version we read, the version field rotted.
    stored = body.get("checksum")
    for v in range(1, VERSION + 1):
        probe = {k: (v if k == "version" else x) for k, x in body.items() if k != "checksum"}
        if stored == _checksum(probe):
            return True
    return False
