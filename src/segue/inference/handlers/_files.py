"""What identifies a model's files in the fingerprint: path and size, not contents (cheap)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import UsageError


def existing(path: str | os.PathLike[str], what: str, *, directory: bool = False) -> Path:
    """``path`` resolved, or a one-line UsageError if it is missing (or of the wrong kind)."""
    p = Path(path).expanduser().resolve()
    if directory and not p.is_dir():
        raise UsageError(f"{what} {str(path)!r} is not a directory; give the model's local directory "
                         f"(nothing is downloaded at run time)")
    if not directory and not p.is_file():
        raise UsageError(f"{what} {str(path)!r} does not exist or is not a file")
    return p


def files_identity(path: Path) -> dict[str, Any]:
    """Path and byte sizes of a model file or of a directory's files (sorted): a replaced
    model of another size changes the fingerprint; a resume then refuses the run."""
    if path.is_file():
        return {"path": str(path), "bytes": path.stat().st_size}
    sizes = {str(f.relative_to(path)): f.stat().st_size
             for f in sorted(path.rglob("*")) if f.is_file() and ".cache" not in f.parts}
    return {"path": str(path), "files": sizes}
