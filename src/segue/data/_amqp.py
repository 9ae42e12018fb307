"""The one place segue.data imports pika: a blocking AMQP connection from a URL, errors in one line.

Imported by the RabbitMQ source only when it connects, so ``import segue.data``
never needs pika installed. A refusal that a retry cannot fix (credentials,
a virtual host, a queue that does not exist) is a :class:`DataError`; a
broker that cannot be reached is :class:`BrokerUnreachable`, which the engine
retries with backoff once a run is going (a broker restarting), while
``segue run``'s probe refuses it (exit 2).
"""

from __future__ import annotations

from typing import Any

from ..errors import DataError
from ._urls import redact

EXTRA_HINT = "pip install 'segue[amqp]'"


class BrokerUnreachable(ConnectionError):
    """No AMQP connection could be opened (refused, timed out, lost while opening)."""

    segue_retryable = True


def _pika(what: str) -> Any:
    try:
        import pika
    except ImportError:
        raise ImportError(f"{what} needs pika, which is not installed: {EXTRA_HINT}") from None
    return pika


def connect(url: str, what: str) -> Any:
    """A ``pika.BlockingConnection`` to ``url`` (``amqp://user:password@host:port/vhost``)."""
    pika = _pika(what)
    exc_mod = pika.exceptions
    try:
        params = pika.URLParameters(url)
    except Exception as exc:  # noqa: BLE001 - pika raises ValueError and friends on a bad URL
        raise DataError(f"{what}: {redact(url)!r} is not an AMQP URL ({exc})") from None
    try:
        return pika.BlockingConnection(params)
    except (exc_mod.ProbableAuthenticationError, exc_mod.AuthenticationError):
        raise DataError(
            f"the AMQP broker at {redact(url)} refused the login; check the user and password"
        ) from None
    except exc_mod.ProbableAccessDeniedError:
        raise DataError(
            f"the AMQP broker at {redact(url)} refused access to its virtual host; check the "
            f"vhost in the URL and the user's permissions"
        ) from None
    except exc_mod.AMQPConnectionError as exc:
        why = str(exc) or type(exc).__name__
        raise BrokerUnreachable(
            f"cannot reach the AMQP broker at {redact(url)} ({why}); check the host and port"
        ) from None


def check_queue(conn: Any, url: str, queue: str) -> int:
    """The ready-message count of ``queue`` (a passive declare), or DataError if there is none."""
    pika = _pika("RabbitMQSource")
    ch = conn.channel()
    try:
        ok = ch.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            raise DataError(
                f"queue {queue!r} does not exist at {redact(url)}; check the name, or declare "
                f"it (durable) before the run"
            ) from None
        raise
    if ch.is_open:
        ch.close()
    return int(ok.method.message_count)


def probe(url: str, queue: str) -> None:
    """Connect, look the queue up, disconnect: what ``segue run`` checks before creating a run."""
    conn = connect(url, "RabbitMQSource")
    try:
        check_queue(conn, url, queue)
    finally:
        if conn.is_open:
            conn.close()
