"""A throwaway Pub/Sub emulator for tests (gcloud's, Java), on a free loopback port in a temp dir.

    with PubSubEmulator.start(tmp_dir) as ps:
        ps.create("topic", "sub", ack_deadline_s=10, dead_letter_max=100)
        ps.publish("topic", [b'{"k": 1}'])
        ps.leftover("sub")  # messages still delivered once their deadline passed

``pubsub_skip_reason`` says why it cannot be started (the install hint), so
tests skip with it rather than pass silently. Nothing is mocked: the client
talks gRPC to the real emulator. The test process sets nothing in its
environment; every client here is built for the emulator's address.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokerkit import _wait_until, free_port

PROJECT = "segue-test"
EMULATOR_DIR = Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator")
PUBSUB_HINT = (
    "install the Google Cloud CLI with its Pub/Sub emulator (Debian/Ubuntu: apt-get install "
    "google-cloud-cli google-cloud-cli-pubsub-emulator, or `gcloud components install "
    "pubsub-emulator`), a Java runtime, and google-cloud-pubsub (pip install 'segue[gcp]')"
)


def pubsub_skip_reason() -> str | None:
    try:
        import google.cloud.pubsub_v1  # noqa: F401
    except ImportError:
        return f"google-cloud-pubsub is not installed; {PUBSUB_HINT}"
    if shutil.which("gcloud") is None:
        return f"no gcloud found; {PUBSUB_HINT}"
    if not (EMULATOR_DIR / "bin" / "cloud-pubsub-emulator").exists():
        return f"gcloud's Pub/Sub emulator is not installed ({EMULATOR_DIR}); {PUBSUB_HINT}"
    if shutil.which("java") is None:
        return f"no java found for the Pub/Sub emulator; {PUBSUB_HINT}"
    return None


@dataclass
class PubSubEmulator:
    root: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, root: str | os.PathLike[str], timeout: float = 90) -> PubSubEmulator:
        emu = cls(Path(root), free_port())
        (emu.root / "data").mkdir(parents=True, exist_ok=True)
        log = open(emu.root / "emulator.log", "ab")
        emu.proc = subprocess.Popen(
            ["gcloud", "beta", "emulators", "pubsub", "start", f"--host-port={emu.host}",
             f"--data-dir={emu.root / 'data'}", "--quiet"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "CLOUDSDK_CONFIG": str(emu.root / "gcloud")},
        )
        log.close()
        _wait_until(emu._ready, emu.proc, emu.root / "emulator.log", "the Pub/Sub emulator", timeout)
        return emu

    def _ready(self) -> bool:
        from google.api_core import exceptions as gexc

        try:
            self.publisher().get_topic(request={"topic": self.topic_path("ready-probe")},
                                       timeout=2, retry=None)
        except gexc.NotFound:
            return True
        return True

    # -- clients -----------------------------------------------------------------
    def publisher(self) -> Any:
        import grpc
        from google.cloud import pubsub_v1
        from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

        transport = PublisherGrpcTransport(channel=grpc.insecure_channel(self.host))
        return pubsub_v1.PublisherClient(transport=transport)

    def subscriber(self) -> Any:
        import grpc
        from google.cloud import pubsub_v1
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        transport = SubscriberGrpcTransport(channel=grpc.insecure_channel(self.host))
        return pubsub_v1.SubscriberClient(transport=transport)

    def topic_path(self, topic: str) -> str:
        return f"projects/{PROJECT}/topics/{topic}"

    def sub_path(self, sub: str) -> str:
        return f"projects/{PROJECT}/subscriptions/{sub}"

    # -- setup and checks ----------------------------------------------------------
    def create(self, topic: str, sub: str, *, ack_deadline_s: int = 10,
               dead_letter_max: int | None = None, retention_s: int | None = None) -> str:
        """A topic and a subscription on it (with a dead-letter topic ``TOPIC-dl`` when
        ``dead_letter_max``); returns the subscription's path."""
        pub = self.publisher()
        pub.create_topic(request={"name": self.topic_path(topic)})
        req: dict[str, Any] = {"name": self.sub_path(sub), "topic": self.topic_path(topic),
                               "ack_deadline_seconds": ack_deadline_s}
        if dead_letter_max is not None:
            pub.create_topic(request={"name": self.topic_path(f"{topic}-dl")})
            req["dead_letter_policy"] = {"dead_letter_topic": self.topic_path(f"{topic}-dl"),
                                         "max_delivery_attempts": dead_letter_max}
        if retention_s is not None:
            req["message_retention_duration"] = {"seconds": retention_s}
        s = self.subscriber()
        s.create_subscription(request=req)
        s.close()
        return self.sub_path(sub)

    def publish(self, topic: str, datas: Any) -> list[str]:
        """Publish every payload (bytes or str) and wait for the emulator's message ids."""
        pub = self.publisher()
        futures = [pub.publish(self.topic_path(topic), d if isinstance(d, bytes) else d.encode())
                   for d in datas]
        return [f.result(timeout=60) for f in futures]

    def leftover(self, sub: str, wait_s: float) -> int:
        """How many messages are delivered again after ``wait_s`` (past every ack deadline):
        0 means every message was acknowledged. What this pulls is given back (deadline 0)."""
        from google.api_core import exceptions as gexc

        time.sleep(wait_s)
        s, seen = self.subscriber(), 0
        try:
            for _ in range(3):
                try:
                    got = s.pull(request={"subscription": self.sub_path(sub), "max_messages": 1000},
                                 timeout=3, retry=None)
                except gexc.DeadlineExceeded:
                    continue
                ids = [m.ack_id for m in got.received_messages]
                seen += len(ids)
                if ids:
                    s.modify_ack_deadline(request={"subscription": self.sub_path(sub),
                                                   "ack_ids": ids, "ack_deadline_seconds": 0})
        finally:
            s.close()
        return seen

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # gcloud and its java child: one group
            self.proc.wait(30)

    def __enter__(self) -> PubSubEmulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
