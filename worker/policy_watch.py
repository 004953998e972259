"""Live policy: a long-running process (bot, worker) picks up a changed policy file.

Every `interval` seconds, and at once on `wake` (SIGHUP), the file is read and compared by
the hash of its content, not by its modification time: in Kubernetes a mounted ConfigMap is
replaced by swapping a symlink (`..data`), which leaves the old file's inode and mtime as
they were. A changed file is parsed and checked exactly as at start-up; a bad one is refused
in one logged line (`policy_reload_refused`) and the policy in force stays. A good one is
handed to `apply` (the composition root swaps `Runtime.policy` and whatever hangs off it)
and its version logged (`policy_reloaded`). A policy is replaced whole, by one assignment, so
a step sees either the old policy or the new one, never a mix within one lookup.

The MCP servers file is watched too, but not reloaded: its tools are listed at start-up and
the policy is checked against them, so a change is logged (`mcp_config_changed`) as needing
a restart.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

import structlog

from tools.exceptions import OperatorError
from tools.policy import Policy

log = structlog.get_logger(__name__)

CHECK_SECONDS = 5.0
MAX_POLICY_BYTES = 1_000_000  # a policy file is a few kB; anything this big is a mistake


class PolicyWatcher:
    def __init__(
        self,
        path: Path,
        load: Callable[[str], Policy],
        apply: Callable[[Policy], None],
        current: Callable[[], Policy],
        *,
        interval: float = CHECK_SECONDS,
        mcp_path: Path | None = None,
        seen: str | None = None,
    ) -> None:
        self.path = path
        self.load = load  # parse and check the text; raises OperatorError (one per problem line)
        self.apply = apply
        self.current = current
        self.interval = interval
        self.mcp_path = mcp_path
        # The hash of the content last looked at: `seen`, taken (`digest`) before the policy
        # in force was read, so a change in between is not missed; None: parse it once.
        self._digest: str | None = seen
        self._refused: str | None = None  # the content last refused: logged once
        self._mcp_digest: str | None = _digest(mcp_path) if mcp_path else None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one check at a time (the thread, SIGHUP, tests)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="policy-watch", daemon=True)
            self._thread.start()
            log.info("policy_watch_started", source=str(self.path), interval=self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def wake(self) -> None:
        """Check now (SIGHUP); safe from a signal handler: it only sets an event."""
        self._wake.set()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval or None)  # 0: only when woken (SIGHUP)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.check()
            except Exception:  # the thread boundary: a failed check must not end the watch
                log.exception("policy_check_failed", source=str(self.path))

    def check(self) -> Policy | None:
        """Look at the file now; returns the new policy when one was applied."""
        with self._lock:
            self._check_mcp()
            try:
                data = _read(self.path)
            except OperatorError as exc:
                self._refuse(f"file:{exc}", str(exc))
                return None
            digest = hashlib.sha256(data).hexdigest()
            if digest == self._digest:
                return None
            self._digest = digest
            try:
                policy = self.load(data.decode("utf-8"))
            except UnicodeDecodeError as exc:
                self._refuse(digest, f"{self.path}: cannot read the policy file: {exc}")
                return None
            except OperatorError as exc:
                self._refuse(digest, str(exc))
                return None
            previous = self.current()
            if _same(policy, previous):  # reformatted, comments: nothing changed
                return None
            self.apply(policy)
            log.info(
                "policy_reloaded",
                source=str(self.path),
                version=policy.version,
                previous=previous.version,
            )
            return policy

    def _refuse(self, digest: str, error: str) -> None:
        """Log a bad file once per content (not every `interval`); the old policy stays."""
        if digest == self._refused:
            return
        self._refused = digest
        self._digest = digest
        log.error(
            "policy_reload_refused",
            source=str(self.path),
            error=one_line(error),
            keeping=self.current().version,
        )

    def _check_mcp(self) -> None:
        if self.mcp_path is None:
            return
        digest = _digest(self.mcp_path)
        if digest != self._mcp_digest:
            self._mcp_digest = digest
            log.warning(
                "mcp_config_changed",
                source=str(self.mcp_path),
                action="restart the bot and the workers to use it: MCP servers are "
                "connected and their tools listed at start-up only",
            )


def _same(policy: Policy, other: Policy) -> bool:
    """The same rules: the version (a hash of the rules, roles and profiles) and what the
    version leaves out (per-person `limits:`, which entries set high_risk themselves)."""
    return (
        policy.version == other.version
        and dict(policy.limits) == dict(other.limits)
        and policy.high_risk_entries == other.high_risk_entries
    )


def one_line(error: str) -> str:
    """A policy error lists every problem, one a line: the first, and how many more."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else error
    return f"{lines[0]} (and {len(lines) - 1} more; `switchboard tools check` lists them)"


def _read(path: Path) -> bytes:
    """The file's bytes, bounded; OperatorError when it cannot be read."""
    try:
        with path.open("rb") as handle:  # follows the symlinks of a ConfigMap mount each time
            data = handle.read(MAX_POLICY_BYTES + 1)
    except FileNotFoundError:
        raise OperatorError(f"{path}: policy file not found (SWITCHBOARD_POLICY)") from None
    except OSError as exc:
        raise OperatorError(f"{path}: cannot read the policy file: {exc}") from None
    if len(data) > MAX_POLICY_BYTES:
        raise OperatorError(f"{path}: the policy file is over {MAX_POLICY_BYTES:,} bytes")
    return data


def digest(path: Path) -> str | None:
    """The hash the watcher compares; None when the file cannot be read."""
    return _digest(path)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(_read(path)).hexdigest()
    except OperatorError:
        return None
