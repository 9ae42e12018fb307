"""Refuse, at submit, a ``--checkpoints`` location the run could not use.

A run's checkpoints and step outputs live where its ``checkpoints`` option
says (``segue.home.Home.storage``). A typo, a missing fsspec backend or
missing credentials would otherwise surface only at the first checkpoint,
after minutes of work; here they are one line at submit, and nothing is
written (the probe object is removed again).
"""

from __future__ import annotations

import os
import secrets

from ..errors import UsageError

CREDENTIALS_HINT = {
    "s3": "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and, for a non-AWS server, AWS_ENDPOINT_URL",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS",
    "az": "AZURE_STORAGE_CONNECTION_STRING",
    "abfs": "AZURE_STORAGE_CONNECTION_STRING",
}


def check_checkpoints(url: str) -> str:
    """The location, normalised (an absolute path, or a URL); UsageError if unusable."""
    url = url.strip()
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" not in url:
        if not os.path.isabs(os.path.expanduser(url)):
            raise UsageError(f"--checkpoints {url!r} must be an absolute path or a URL such as "
                             "s3://bucket/prefix (every host must find the same place)")
        url = os.path.abspath(os.path.expanduser(url))
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    import fsspec

    try:
        fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"--checkpoints {url!r}: {exc}".rstrip(".") +
                         (" (for s3:// install segue[s3])" if protocol == "s3" else "")) from None
    from ..home import storage_at

    probe = f".segue-probe-{secrets.token_hex(6)}"
    try:
        storage = storage_at(url)
        with storage.open_write(probe) as f:
            f.write(b"segue can write here\n")
        storage.remove(probe)
    except Exception as exc:  # noqa: BLE001 - every backend raises its own kinds
        hint = CREDENTIALS_HINT.get(protocol)
        more = f"; check the URL and the credentials ({hint})" if hint else "; check the path and its permissions"
        raise UsageError(f"cannot write checkpoints to {url}: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}{more}") from None
    return url


def shared_storage(location: str) -> bool:
    """Whether a run's ``checkpoints`` location is readable from every host (an fsspec
    URL other than a local file): only then may its controller move between hosts
    once it has progress (a local directory of a dead host is gone with it)."""
    return "://" in location and not location.startswith("file://")
