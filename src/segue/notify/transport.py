"""One HTTP POST of a webhook: no redirects followed, a timeout on every request.

Standard library only (``http.client``), so a controller delivers without the
server extra. Environment proxies are not used: a webhook goes where its URL
says. A redirect is an answer, not a delivery: following it would send the
signed body to a place nobody configured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_READ = 64 * 1024  # of the receiver's answer: only its status matters


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no HTTP answer (refused, timed out, TLS failure...)
    error: str | None  # one line, for the outbox and the logs; None when delivered
    seconds: float

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def permanent(self) -> bool:
        """Trying again cannot help: a redirect, or a 4xx other than timeout and rate limits."""
        s = self.status
        return s is not None and (300 <= s < 400 or (400 <= s < 500 and s not in (408, 425, 429)))


def post(url: str, body: bytes, headers: dict[str, str], *, timeout_s: float) -> Answer:
    import http.client  # here, not at the top: it imports ssl, and `segue --help` need not

    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    t0 = time.monotonic()
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        import ssl

        conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=timeout_s,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        conn.request("POST", target, body=body, headers={**headers, "Content-Length": str(len(body))})
        resp = conn.getresponse()
        resp.read(MAX_READ)
        status = resp.status
    except (OSError, http.client.HTTPException) as exc:
        return Answer(None, f"{type(exc).__name__}: {exc}".strip(), time.monotonic() - t0)
    finally:
        conn.close()
    dt = time.monotonic() - t0
    if 200 <= status < 300:
        return Answer(status, None, dt)
    if 300 <= status < 400:
        return Answer(status, f"HTTP {status}: redirects are not followed; configure the final URL", dt)
    return Answer(status, f"HTTP {status}", dt)
