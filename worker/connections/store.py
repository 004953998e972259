"""Grants and flows in Redis, every value encrypted with a key from the environment.

A grant (a person's tokens for one provider) is one Redis string per team + user + provider,
its value a Fernet token (AES-128-CBC with HMAC-SHA256, from `cryptography`): nothing of
it is readable in Redis, a dump or a backup without the key. `MultiFernet` takes the keys in
order: the first encrypts, any of them decrypts, so an operator rotates by putting a new key
first and keeping the old one until `rekey` has rewritten every value (or they expire).

A flow (started by `connect`, finished at the provider's callback) and a pending grant
(finished, waiting for the person to confirm it in Slack) are short-lived keys with a TTL,
each taken at most once with GETDEL, so a replayed `state` or finishing code finds nothing.
Their keys are digests of the secret, never the secret itself.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from tools.exceptions import scope_tokens
from worker.keys import Keys

FLOW_SECONDS = 600  # a started flow must reach the callback within this
PENDING_SECONDS = 600  # a finished flow must be confirmed in Slack within this
MAX_CONFIRM_ATTEMPTS = 5  # wrong finishing codes a person may enter per PENDING_SECONDS
MAX_VALUE_CHARS = 64_000  # a provider's token response, bounded before it is stored
WANTED_SECONDS = 86_400  # scopes a service asked for are asked for by Connect within this
MAX_WANTED_CHARS = 1_000  # of them together (a Slack button's URL holds 3,000 characters)


class KeysMissing(ValueError):
    """No usable encryption key: connections cannot be stored."""


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Grant:
    """A person's tokens for one provider."""

    provider: str
    access_token: str = field(repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    expires_at: float | None = None  # epoch seconds; None: the provider gave no expiry
    scope: str = ""
    connected_at: float = 0.0
    # The redirect URI the person connected through: an MCP server's own OAuth registers a
    # client per redirect URI, and only the client a grant was issued to may refresh or
    # revoke it. "": the public callback (grants stored before this was kept).
    redirect_uri: str = ""

    def expired(self, now: float, margin: float = 60.0) -> bool:
        return self.expires_at is not None and self.expires_at - margin <= now


@dataclass(frozen=True)
class Flow:
    """A connection a person started: who, for which provider, and the PKCE verifier."""

    team: str
    user: str
    provider: str
    verifier: str = field(repr=False)
    redirect_uri: str
    expires_at: float
    scopes: str = ""  # what the authorization URL asked for (a grant given no scope has them)


@dataclass(frozen=True)
class Pending:
    """A flow finished at the provider, waiting for the person who started it to confirm."""

    team: str
    user: str
    provider: str
    grant: Grant
    expires_at: float


def fernet_of(keys: Sequence[str]) -> MultiFernet:
    """The keys (urlsafe base64 of 32 bytes, as `Fernet.generate_key()` makes), first
    encrypting; KeysMissing says what is wrong with them, never what they are."""
    usable = [key.strip() for key in keys if key.strip()]
    if not usable:
        raise KeysMissing(
            "no key to encrypt connections with: set SWITCHBOARD_CONNECTION_KEYS to a key made "
            'with python -c "from cryptography.fernet import Fernet; '
            'print(Fernet.generate_key().decode())"'
        )
    fernets = []
    for position, key in enumerate(usable, 1):
        try:
            fernets.append(Fernet(key))
        except ValueError:
            raise KeysMissing(
                f"SWITCHBOARD_CONNECTION_KEYS: key {position} is not a Fernet key (32 bytes, "
                "urlsafe base64)"
            ) from None
    return MultiFernet(fernets)


@dataclass(frozen=True)
class Rekeyed:
    """What `rekey` rewrote, and how many values none of the configured keys opens (sealed
    with a key already removed: they cannot be read, and are left as they are)."""

    grants: int
    clients: int
    unreadable: int


class ConnectionStore:
    def __init__(self, conn: redis.Redis, namespace: str, keys: Sequence[str]) -> None:
        self.redis = conn
        self.keys = Keys(namespace)
        self.fernet = fernet_of(keys)

    # -- sealing ---------------------------------------------------------------------------
    def _seal(self, value: dict[str, Any]) -> bytes:
        return self.fernet.encrypt(json.dumps(value, separators=(",", ":")).encode())

    def _open(self, raw: bytes | None) -> dict[str, Any] | None:
        """The value, or None when absent or sealed with a key no longer configured."""
        if raw is None:
            return None
        try:
            value = json.loads(self.fernet.decrypt(raw))
        except (InvalidToken, ValueError):
            return None
        return value if isinstance(value, dict) else None

    # -- grants ----------------------------------------------------------------------------
    def put(self, team: str, user: str, grant: Grant) -> None:
        key = self.keys.connection(team, user, grant.provider)
        with self.redis.pipeline() as pipe:
            pipe.set(key, self._seal(asdict(grant)))
            pipe.sadd(self.keys.connections_of(team, user), grant.provider)
            pipe.sadd(self.keys.connected_people(team), user)
            pipe.execute()

    def get(self, team: str, user: str, provider: str) -> Grant | None:
        value = self._open(self.redis.get(self.keys.connection(team, user, provider)))
        return _grant(value) if value is not None else None

    def replace(self, team: str, user: str, old: Grant, new: Grant) -> bool:
        """Store `new` (a refresh's tokens) only if the grant is still `old`: a Disconnect
        or a newer refresh between reading and writing wins."""
        key = self.keys.connection(team, user, old.provider)
        with self.redis.pipeline() as pipe:
            try:
                pipe.watch(key)
                current = self._open(pipe.get(key))
                if current is None or _grant(current) != old:
                    return False
                pipe.multi()
                pipe.set(key, self._seal(asdict(new)))
                pipe.execute()
                return True
            except redis.WatchError:
                return False

    def delete(self, team: str, user: str, provider: str) -> Grant | None:
        """Drop one grant (and any more access wanted for it); return what it was (to
        revoke it at the provider)."""
        raw = self.redis.getdel(self.keys.connection(team, user, provider))
        self.redis.srem(self.keys.connections_of(team, user), provider)
        self.unwant(team, user, provider)
        value = self._open(raw)
        return _grant(value) if value is not None else None

    def providers(self, team: str, user: str) -> list[str]:
        return sorted(m.decode() for m in self.redis.smembers(self.keys.connections_of(team, user)))

    def people(self, team: str) -> list[str]:
        return sorted(m.decode() for m in self.redis.smembers(self.keys.connected_people(team)))

    def refresh_lock(self, team: str, user: str, provider: str, seconds: float) -> Any:
        """One refresh at a time per grant (providers rotate refresh tokens: two refreshes
        with the same one would lose the grant)."""
        return self.redis.lock(
            self.keys.connection(team, user, provider) + ":refreshing",
            timeout=seconds,
            blocking_timeout=seconds,
        )

    def rekey(self) -> Rekeyed:
        """Encrypt every grant, registered client and wanted scope with the first key (after
        a rotation), so the other keys can be removed. A client left under a removed key
        could not be read: discovery would register another, and the grants issued to the
        first could no longer be refreshed. Flows and finished connections live ten minutes:
        they are left to expire."""
        grants, unreadable = self._rekey(self.keys.connection("*", "*", "*"))
        clients, more = self._rekey(self.keys.oauth_client("*"))  # each redirect URI's too
        _, rest = self._rekey(self.keys.oauth_wanted("*", "*", "*"))
        return Rekeyed(grants, clients, unreadable + more + rest)

    def _rekey(self, pattern: str) -> tuple[int, int]:
        """(values rewritten, values no configured key opens)"""
        count = unreadable = 0
        for key in self.redis.scan_iter(match=pattern, count=500):
            raw = self.redis.get(key)
            if raw is None:
                continue
            try:
                self.redis.set(key, self.fernet.rotate(raw), xx=True, keepttl=True)
            except InvalidToken:
                unreadable += 1
                continue
            count += 1
        return count, unreadable

    # -- flows -----------------------------------------------------------------------------
    def start(self, state: str, flow: Flow) -> None:
        self.redis.set(
            self.keys.oauth_flow(digest(state)), self._seal(asdict(flow)), ex=FLOW_SECONDS
        )

    def take_flow(self, state: str) -> Flow | None:
        """The flow `state` names, once: a second take (a replay) finds nothing."""
        value = self._open(self.redis.getdel(self.keys.oauth_flow(digest(state))))
        if value is None:
            return None
        flow = Flow(**value)
        return flow if flow.expires_at > time.time() else None

    def hold(self, finish_code: str, pending: Pending) -> None:
        value = asdict(pending)
        self.redis.set(
            self.keys.oauth_pending(digest(finish_code)), self._seal(value), ex=PENDING_SECONDS
        )

    def take_pending(self, finish_code: str) -> Pending | None:
        value = self._open(self.redis.getdel(self.keys.oauth_pending(digest(finish_code))))
        if value is None:
            return None
        pending = Pending(**{**value, "grant": _grant(value["grant"])})
        return pending if pending.expires_at > time.time() else None

    def confirm_attempt(self, team: str, user: str) -> bool:
        """Count one finishing code entered by this person; False past the limit."""
        key = self.keys.oauth_attempts(team, user)
        with self.redis.pipeline() as pipe:
            pipe.set(key, 0, ex=PENDING_SECONDS, nx=True)  # the window starts at the first
            pipe.incr(key)
            _, count = pipe.execute()
        return int(count) <= MAX_CONFIRM_ATTEMPTS

    # -- more access a service asked for (step-up) ------------------------------------------
    def want(self, team: str, user: str, provider: str, scopes: Sequence[str]) -> None:
        """A service refused a call for want of `scopes`: the person's next Connect for
        `provider` asks for them too (with those wanted before, for WANTED_SECONDS; at most
        MAX_WANTED_CHARS of them, so the Connect link stays a link Slack shows)."""
        merged: list[str] = []
        for scope in scope_tokens(" ".join([*self.wanted(team, user, provider), *scopes])):
            if sum(len(s) + 1 for s in merged) + len(scope) > MAX_WANTED_CHARS:
                break
            merged.append(scope)
        self.redis.set(
            self.keys.oauth_wanted(team, user, provider),
            self._seal({"scopes": list(merged)}),
            ex=WANTED_SECONDS,
        )

    def wanted(self, team: str, user: str, provider: str) -> tuple[str, ...]:
        value = self._open(self.redis.get(self.keys.oauth_wanted(team, user, provider)))
        scopes = value.get("scopes") if value is not None else None
        if not isinstance(scopes, list):
            return ()
        return scope_tokens(" ".join(s for s in scopes if isinstance(s, str)))

    def unwant(self, team: str, user: str, provider: str) -> None:
        self.redis.delete(self.keys.oauth_wanted(team, user, provider))

    # -- dynamically registered clients (an MCP server's own OAuth) --------------------------
    # One per redirect URI: the console's loopback callback gets a client of its own, and
    # never replaces the one the public callback's grants were issued to.
    def client(self, provider: str, redirect_uri: str) -> dict[str, Any] | None:
        """The client registered for `redirect_uri`; else the one registered before clients
        were kept per redirect URI (discovery uses it only if it lists `redirect_uri`)."""
        found = self._open(self.redis.get(self.keys.oauth_client(provider, digest(redirect_uri))))
        if found is None:
            found = self._open(self.redis.get(self.keys.oauth_client(provider)))
        return found

    def put_client(self, provider: str, redirect_uri: str, info: dict[str, Any]) -> None:
        self.redis.set(self.keys.oauth_client(provider, digest(redirect_uri)), self._seal(info))


def _grant(value: dict[str, Any]) -> Grant:
    return Grant(**value)
