"""Start and stop a private ``redis-server`` on a loopback port, for tests and benchmarks.

Motivation: the Redis backend is tested against a real server, and the fault tests kill it with
SIGKILL and start it again on the same data. The server binds 127.0.0.1 only, keeps its data in
the given directory with an append-only file fsynced on every write (``appendfsync always``), and
is stopped by whoever started it.

Invariants:
1. A missing ``redis-server`` raises ``StoreUnavailableError`` naming ``scripts/redis.sh`` (the
   Redis tests fail on it, they never skip) (enforced).
2. ``start`` returns only once the server answers PING (enforced, with a time limit).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis

from seqkv.store.errors import StoreUnavailableError

_START_SECONDS = 20.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 with AOF (``appendfsync always``)."""

    def __init__(self, directory: str | os.PathLike[str], port: int | None = None,
                 binary: str = "redis-server") -> None:
        found = shutil.which(binary)
        if found is None:
            raise StoreUnavailableError(
                f"{binary} is not installed: run scripts/redis.sh install "
                "(apt-get install -y redis-server)")
        self._binary = found
        # NOTE: absolute: redis-server changes into --dir before it opens --logfile, so a
        # relative directory named a log file it could not open and it exited at once.
        self._dir = Path(directory).resolve()
        self._dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> RedisServer:
        args = [self._binary, "--bind", "127.0.0.1", "--port", str(self.port),
                "--dir", str(self._dir), "--appendonly", "yes", "--appendfsync", "always",
                "--save", "", "--protected-mode", "yes", "--daemonize", "no",
                "--logfile", str(self._dir / "redis.log")]
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + _START_SECONDS
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.RedisError:
                    pass
                if self._process.poll() is not None or time.monotonic() > deadline:
                    log = (self._dir / "redis.log")
                    tail = log.read_text()[-500:] if log.exists() else ""
                    self.stop()
                    raise StoreUnavailableError(f"redis-server did not start: {tail}")
                time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server (what a crash does), and reap it."""
        if self._process is not None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait()
            self._process = None

    def stop(self) -> None:
        """Stop the server: SIGTERM, then SIGKILL after 10 s."""
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def __enter__(self) -> RedisServer:
        return self.start() if self._process is None else self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
