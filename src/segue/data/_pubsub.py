"""The one place segue.data imports google-cloud-pubsub: a subscriber client, errors in one line.

Imported by the Pub/Sub source only when it connects, so ``import segue.data``
never needs the library installed. A refusal that a retry cannot fix (a
subscription that does not exist, no credentials, no permission) is a
:class:`DataError`; an endpoint that cannot be reached is
:class:`PubSubUnreachable`, which the engine retries with backoff once a run
is going, while ``segue run``'s probe refuses it (exit 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import DataError

EXTRA_HINT = "pip install 'segue[gcp]'"
PROBE_TIMEOUT_S = 10.0
_FULL = re.compile(r"^projects/([^/]+)/subscriptions/([^/]+)$")


class PubSubUnreachable(ConnectionError):
    """The Pub/Sub endpoint (or emulator) did not answer."""

    segue_retryable = True


@dataclass(frozen=True)
class SubscriptionInfo:
    """What the source needs to know of its subscription (read once per attempt)."""

    ack_deadline_s: int
    retention_s: float
    dead_letter_max: int | None  # the dead-letter policy's max_delivery_attempts, None: no policy


def _lib(what: str) -> Any:
    try:
        from google.cloud import pubsub_v1
    except ImportError:
        raise ImportError(
            f"{what} needs google-cloud-pubsub, which is not installed: {EXTRA_HINT}"
        ) from None
    return pubsub_v1


def subscription_path(subscription: str, project: str | None) -> str:
    """``projects/P/subscriptions/S`` from a full path, or from a short name and ``project``."""
    if _FULL.match(subscription):
        return subscription
    if "/" in subscription or not subscription:
        raise DataError(
            f"{subscription!r} is not a subscription: give projects/PROJECT/subscriptions/NAME, "
            f"or NAME with project="
        )
    if not project:
        raise DataError(f"subscription {subscription!r} needs project= (or give its full path)")
    return f"projects/{project}/subscriptions/{subscription}"


def where(emulator_host: str | None) -> str:
    return f"the Pub/Sub emulator at {emulator_host}" if emulator_host else "Pub/Sub"


def client(emulator_host: str | None, what: str = "PubSubSource") -> Any:
    """A ``SubscriberClient``: on the emulator at ``emulator_host`` (insecure, no credentials),
    else the library's own choice ($PUBSUB_EMULATOR_HOST, or Google's default credentials)."""
    pubsub_v1 = _lib(what)
    if emulator_host is None:
        try:
            return pubsub_v1.SubscriberClient()
        except Exception as exc:  # noqa: BLE001 - google.auth's DefaultCredentialsError and kin
            raise DataError(
                f"{what}: no Google credentials for Pub/Sub ({type(exc).__name__}: {exc}); run "
                f"`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"
            ) from None
    import grpc
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

    channel = grpc.insecure_channel(target=emulator_host)
    return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))


def translate(exc: BaseException, path: str, emulator_host: str | None) -> BaseException:
    """The one-line error for a failed call on ``path`` (the caller raises it ``from None``)."""
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.NotFound):
        return DataError(
            f"subscription {path!r} does not exist at {where(emulator_host)}; check the name, "
            f"or create it before the run"
        )
    if isinstance(exc, gexc.PermissionDenied | gexc.Unauthenticated):
        return DataError(
            f"{where(emulator_host)} refused access to subscription {path!r} "
            f"({type(exc).__name__}); check the credentials' roles (roles/pubsub.subscriber)"
        )
    if isinstance(exc, gexc.InvalidArgument):
        return DataError(f"{where(emulator_host)} refused subscription {path!r} ({exc.message})")
    why = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    why = why.splitlines()[0]
    if emulator_host:
        return PubSubUnreachable(
            f"cannot reach the Pub/Sub emulator at {emulator_host} ({type(exc).__name__}: "
            f"{why}); check the host and port"
        )
    return PubSubUnreachable(f"cannot reach Pub/Sub ({type(exc).__name__}: {why})")


def describe(sub: Any, path: str, emulator_host: str | None, timeout: float) -> SubscriptionInfo:
    """The subscription's ack deadline, retention and dead-letter policy (one call)."""
    from google.api_core import exceptions as gexc

    try:
        got = sub.get_subscription(
            request={"subscription": path}, timeout=timeout, retry=None
        )
    except gexc.GoogleAPIError as exc:
        raise translate(exc, path, emulator_host) from None
    retention = got.message_retention_duration
    seconds = retention.total_seconds() if retention else 7 * 86400.0  # Pub/Sub's default
    dlp = got.dead_letter_policy
    has_dl = bool(dlp and dlp.dead_letter_topic)
    return SubscriptionInfo(
        ack_deadline_s=int(got.ack_deadline_seconds or 10),
        retention_s=float(seconds),
        dead_letter_max=int(dlp.max_delivery_attempts or 5) if has_dl else None,
    )


def probe(path: str, emulator_host: str | None) -> None:
    """Look the subscription up and close: what ``segue run`` checks before creating a run."""
    sub = client(emulator_host)
    try:
        describe(sub, path, emulator_host, PROBE_TIMEOUT_S)
    finally:
        sub.close()
