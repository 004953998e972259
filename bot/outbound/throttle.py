"""At most one update per key per interval; the latest update that was held back is sent
when the interval is over, so the last word always shows (Slack's `chat.update` limits)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger(__name__)

Send = Callable[[], None]
MAX_SLOTS = 1000
IDLE_SECONDS = 600.0


@dataclass
class _Slot:
    last: float = float("-inf")
    pending: Send | None = None
    timer: threading.Timer | None = None
    closed: bool = False
    sending: threading.Lock = field(default_factory=threading.Lock)


class Throttle:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()

    def offer(self, key: str, send: Send) -> None:
        """Send now if the interval has passed, else keep `send` as the one to send later."""
        with self._lock:
            if len(self._slots) > MAX_SLOTS:
                self._forget_idle()
            slot = self._slots.setdefault(key, _Slot())
            slot.closed = False
            wait = slot.last + self.interval - time.monotonic()
            if wait > 0 or slot.timer is not None:
                slot.pending = send
                if slot.timer is None:
                    slot.timer = threading.Timer(max(wait, 0.0), self._fire, args=(key, slot))
                    slot.timer.daemon = True
                    slot.timer.start()
                return
            slot.last = time.monotonic()
        self._send(slot, send)

    def touch(self, key: str) -> None:
        """Something was just sent for `key` outside `offer` (e.g. the first post)."""
        with self._lock:
            self._slots.setdefault(key, _Slot()).last = time.monotonic()

    def close(self, key: str) -> threading.Lock | None:
        """Drop what is held back for `key`. Returns the slot's send lock (held by the caller
        while it sends a final update, so a late timer cannot overwrite it), or None."""
        with self._lock:
            slot = self._slots.pop(key, None)
            if slot is None:
                return None
            slot.closed = True
            slot.pending = None
            if slot.timer is not None:
                slot.timer.cancel()
                slot.timer = None
        return slot.sending

    def close_all(self) -> None:
        for key in list(self._slots):
            self.close(key)

    def _forget_idle(self) -> None:
        """Runs that suspended here and resumed in another process leave a slot behind."""
        cutoff = time.monotonic() - IDLE_SECONDS
        for key in [k for k, s in self._slots.items() if s.timer is None and s.last < cutoff]:
            del self._slots[key]

    def _fire(self, key: str, slot: _Slot) -> None:
        with self._lock:
            send, slot.pending, slot.timer = slot.pending, None, None
            if send is None or slot.closed:
                return
            slot.last = time.monotonic()
        self._send(slot, send)

    @staticmethod
    def _send(slot: _Slot, send: Send) -> None:
        with slot.sending:
            if slot.closed:
                return
            send()
