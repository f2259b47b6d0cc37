"""Child processes of a benchmark case.

Each child runs in its own session (its own process group), speaks a line protocol on stdout
(`READY`, then `RESULT {json}`) and writes everything else to a per-process stderr log. A
`ChildGroup` kills every process group it started when it exits, whatever happened; children also
ask the kernel to kill them if the harness dies (`die_with_parent`), so nothing is left behind.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

READY = "READY"
RESULT = "RESULT "
REPO_ROOT = Path(__file__).resolve().parent.parent


class CaseError(RuntimeError):
    """A child process failed, said something unexpected, or missed its deadline."""


def child_env() -> dict[str, str]:
    """The harness's environment, with the repository importable and output unbuffered."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("RAY_ADDRESS", None)  # children get --address explicitly
    return env


def report(result: dict) -> None:
    """Print a case process's `RESULT {json}` line, with the network namespace it ran in (on
    several hosts, the harness can tell each host's processes apart)."""
    try:
        result["netns"] = os.readlink("/proc/self/ns/net")
    except OSError:
        pass
    print(RESULT + json.dumps(result), flush=True)


def module_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


class Child:
    """One child process, its stdout lines (read by a thread) and its stderr log."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.stderr_path = log_dir / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.other: list[str] = []  # stdout lines that are not protocol lines
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._stderr, cwd=REPO_ROOT, env=child_env(),
                                     start_new_session=True, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, name=f"bench-{name}-stdout",
                                        daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                self.lines.put(line.rstrip("\n"))
        except (OSError, ValueError):
            pass
        finally:
            self.lines.put(None)

    def expect(self, word: str, deadline: float) -> str:
        """Wait for a stdout line starting with `word`; other lines are kept for diagnosis."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CaseError(f"{self.name}: no {word.strip()!r} line in time{self.diagnostics()}")
            try:
                line = self.lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if line is None:
                code = self.proc.wait(5)
                raise CaseError(f"{self.name}: exited with code {code} before {word.strip()!r}"
                                f"{self.diagnostics()}")
            if line.startswith(word):
                return line
            self.other.append(line)

    def result(self, deadline: float) -> dict:
        """The process's `RESULT {json}` summary."""
        line = self.expect(RESULT, deadline)
        try:
            return json.loads(line[len(RESULT):])
        except ValueError as exc:
            raise CaseError(f"{self.name}: unreadable result {line[:200]!r}: {exc}") from None

    def wait(self, deadline: float) -> int:
        try:
            return self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise CaseError(f"{self.name}: did not exit in time{self.diagnostics()}") from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the child's whole process group (it may have started helpers)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._reader.join(2)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def diagnostics(self) -> str:
        tail = self.stderr_tail()
        other = "\n".join(self.other[-5:])
        parts = [p for p in (other, tail) if p]
        return ("; output:\n" + "\n".join(parts)) if parts else ""


class ChildGroup:
    """Processes of one case; all of them are killed on exit (normal, error or timeout)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[Child] = []

    def start(self, name: str, argv: list[str]) -> Child:
        child = Child(name, argv, self.log_dir)
        self.children.append(child)
        return child

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self.children]

    def __enter__(self) -> ChildGroup:
        return self

    def __exit__(self, *exc) -> None:
        for child in self.children:
            child.kill()


def die_with_parent(parent_pid: int | None) -> None:
    """In a child: ask the kernel for SIGKILL when the harness dies (Linux), else watch for it."""
    if parent_pid is None:
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(0.5)
            os._exit(3)

        threading.Thread(target=watch, name="bench-parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before we asked
        os._exit(3)


def role_parser(prog: str, description: str, sender: str, receiver: str, what: str):
    """The command line shared by the baseline's and scopecast's case processes: one sub-command
    per role, each with --parent-pid, the receiver with its measuring window options. Returns the
    parser and the two sub-parsers (sender, receiver) for the options of their own."""
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=description)
    sub = p.add_subparsers(dest="role", required=True)
    roles = {}
    for name in (receiver, sender):
        s = roles[name] = sub.add_parser(name)
        s.add_argument("--parent-pid", type=int, help="die when this process (the harness) dies")
    r = roles[receiver]
    r.add_argument("--warmup", type=float, default=0.5,
                   help=f"seconds after the first {what} before the window opens")
    r.add_argument("--timeout", type=float, default=120.0, help="stop after this long")
    s = roles[sender]
    s.add_argument("--size", type=int, required=True, help="payload bytes")
    s.add_argument("--seconds", type=float, required=True, help="send for this long")
    return p, s, r


def topic_names(topic: str, n: int, sep: str = "/") -> list[str]:
    """The topics of a case: T itself, or T/0 .. T/n-1 (`sep` for systems that split names
    otherwise, NATS's dots)."""
    return [topic] if n <= 1 else [f"{topic}{sep}{i}" for i in range(n)]


def run_role(parser, handlers: dict, argv: list[str] | None) -> int:
    """Parse, arrange to die with the harness, run the chosen role."""
    args = parser.parse_args(argv)
    die_with_parent(args.parent_pid)
    handlers[args.role](args)
    return 0

