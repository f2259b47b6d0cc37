"""What a user would pick instead of scopecast, run by the harness on the same workloads.

One module per peer, each with a `send` and a `receive` role speaking the harness's line protocol
(`procs`); `stream` holds what they share. `server(name, ...)` starts and stops the peer's server
process (Redis, NATS) for a suite; ZeroMQ needs none (the publisher binds) and the Ray peer uses the
harness's own Ray cluster.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

PEERS = {"redis": "benchmarks.peers.redis_peer", "nats": "benchmarks.peers.nats_peer",
         "zmq": "benchmarks.peers.zmq_peer", "ray": "benchmarks.peers.ray_peer"}
SERVERS = {"redis": "redis-server", "nats": "nats-server"}
START_TIMEOUT = 20.0


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing(name: str) -> str | None:
    """Why peer `name` cannot run here (its server or client library is not installed), or None."""
    import importlib.util

    server = SERVERS.get(name)
    if server and shutil.which(server) is None:
        return f"{server} is not installed (apt-get install {server})"
    client = {"redis": "redis", "nats": "nats", "zmq": "zmq", "ray": "ray"}[name]
    if importlib.util.find_spec(client) is None:
        return f"the Python package for {client!r} is not installed (pip install -e '.[bench]')"
    return None


@contextmanager
def server(name: str, log_dir: Path):
    """The peer's server for a suite, on a free port of 127.0.0.1: yields the port (None for a
    peer without a server); the process is stopped afterwards, whatever happened."""
    if name not in SERVERS:
        yield None
        return
    import importlib

    port = free_tcp_port()
    argv = importlib.import_module(PEERS[name]).server_argv(port)
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}-server.log", "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
        try:
            _await_port(proc, port, name)
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _await_port(proc: subprocess.Popen, port: int, name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} server exited with code {proc.returncode} at start")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} server did not listen on port {port} within "
                                   f"{START_TIMEOUT:.0f}s") from None
            time.sleep(0.05)
