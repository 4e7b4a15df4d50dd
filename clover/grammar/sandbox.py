"""A pool of child processes that try-compile grammars under a time and a memory budget.

llguidance compiles some small grammars in exponential time and memory (an `allOf` of two dozen
`pattern`s: a minute and gigabytes), and neither its fuel limits nor a thread can stop that. So a
grammar is first compiled in a child process (`sandbox_child.py`) with an address-space limit;
the parent waits at most `time_s`, polling a cancel flag, and kills the child when the time is up,
the caller cancels, or the child dies of its memory limit; a fresh child replaces it. Only a
grammar that passed is then compiled in the server's own process. `check` is thread-safe and
blocking (call it off the event loop and off the engine thread). This module knows nothing
about requests or HTTP.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_CHILD = Path(__file__).with_name("sandbox_child.py")
_POLL_S = 0.05


class BudgetExceeded(ValueError):
    """A grammar went over a compile budget; `limit` is "time", "memory" or "size"."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class Cancelled(Exception):
    """The caller gave up (its client left) while the grammar was compiling."""


class _Child:
    """One child process, set up with the tokenizer and ready for `check` frames."""

    def __init__(self, setup: dict[str, Any], start_timeout_s: float = 60.0) -> None:
        self.proc = subprocess.Popen([sys.executable, str(_CHILD)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=os.environ | {"OMP_NUM_THREADS": "1"})
        self.send(setup)
        try:
            ready = self.receive(start_timeout_s, None)
        except TimeoutError:
            ready = None
        if ready is None:
            self.kill()
            raise RuntimeError("the grammar sandbox process did not start")

    def send(self, obj: dict) -> None:
        data = json.dumps(obj).encode("utf-8")
        self.proc.stdin.write(struct.pack(">I", len(data)) + data)
        self.proc.stdin.flush()

    def receive(self, timeout_s: float, cancel: threading.Event | None) -> dict | None:
        """The next frame, or None if the child died; TimeoutError, or Cancelled if asked."""
        fd, deadline = self.proc.stdout.fileno(), time.monotonic() + timeout_s
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], min(left, _POLL_S))
            if ready:
                return self._read_frame()

    def _read_frame(self) -> dict | None:
        head = self.proc.stdout.read(4)
        if len(head) < 4:
            return None
        (n,) = struct.unpack(">I", head)
        return json.loads(self.proc.stdout.read(n).decode("utf-8"))

    def died_of_memory(self) -> bool:
        try:
            code = self.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            return False
        return code in (-signal.SIGABRT, -signal.SIGSEGV, -signal.SIGKILL, 3, 134)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


class GrammarSandbox:
    """`workers` child processes; `check(grammar)` -> None or llguidance's error text."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_id: int, *,
                 memory_bytes: int, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"grammar sandbox workers must be >= 1 (got {workers})")
        self.memory_bytes = memory_bytes
        self._setup = {"tokenizer_json": tokenizer_json, "vocab_size": vocab_size,
                       "eos_id": eos_id, "memory_bytes": memory_bytes}
        self._idle: queue.Queue[_Child | None] = queue.Queue()
        for _ in range(workers):
            self._idle.put(None)  # a slot; the child starts on first use
        self._lock = threading.Lock()
        self._live: set[_Child] = set()
        self.num_checks = self.num_killed = 0  # compilations tried; children killed mid-way

    def check(self, grammar: str, time_s: float,
              cancel: threading.Event | None = None) -> str | None:
        """Compile `grammar` in a child within `time_s`; BudgetExceeded or Cancelled if not."""
        child = self._take(cancel)
        self.num_checks += 1
        try:
            child.send({"grammar": grammar})
            reply = child.receive(time_s, cancel)
        except Cancelled:
            self._discard(child)
            raise
        except TimeoutError:
            self._discard(child)
            raise BudgetExceeded("time", f"compiling the grammar took longer than the "
                                 f"{time_s:g} s budget (--grammar-time-budget)") from None
        except OSError:  # a broken pipe: the child is gone
            reply = None
        if reply is None:
            return self._died(child)
        self._idle.put(child)
        return reply["error"]

    def close(self) -> None:
        with self._lock:
            live, self._live = list(self._live), set()
        for child in live:
            child.kill()

    def _take(self, cancel: threading.Event | None) -> _Child:
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled
            try:
                child = self._idle.get(timeout=_POLL_S)
                break
            except queue.Empty:
                continue
        if child is not None and child.proc.poll() is None:
            return child
        try:
            child = _Child(self._setup)
        except Exception:
            self._idle.put(None)
            raise
        with self._lock:
            self._live.add(child)
        return child

    def _discard(self, child: _Child) -> None:
        self.num_killed += 1
        child.kill()
        with self._lock:
            self._live.discard(child)
        self._idle.put(None)

    def _died(self, child: _Child) -> None:
        memory = child.died_of_memory()
        self._discard(child)
        if memory:
            mib = self.memory_bytes / 2**20
            raise BudgetExceeded("memory", f"compiling the grammar needed more than the "
                                 f"{mib:g} MiB budget (--grammar-memory-budget)")
        raise BudgetExceeded("memory", "the grammar compiler failed on this grammar")
