"""Scripts that run a cluster of their own in a fresh process (an embedded Ray, so that its key
and settings are its own), for the encryption tests; and what such a script uses to watch the
UDP payloads on loopback (`SNIFFER`: a packet socket, root only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# defines frames (UDP payloads seen), stop (set it to end) and sniff() (run it in a thread)
SNIFFER = r"""
import socket, threading
frames, stop = [], threading.Event()

def sniff():
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
    s.bind(("lo", 0))
    s.settimeout(0.2)
    while not stop.is_set():
        try:
            frame = s.recv(70000)
        except socket.timeout:
            continue
        if frame[12:14] == b"\x08\x00" and frame[23] == 17:  # IPv4, UDP
            ihl = (frame[14] & 0x0F) * 4
            frames.append(frame[14 + ihl + 8:])
"""


def run_script(script: str, timeout: float) -> str:
    """The stdout of `script` run by this Python outside any Ray cluster (fails on an error)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=timeout, env=env, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout
