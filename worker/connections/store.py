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

Compatibility: the previous release reads these values with `Grant(**value)` (and so for
flows and pending grants), which refuses a field it does not know, and it shares Redis with
this one during a rolling upgrade and after a rollback. So no field is added to them: what
more a grant needs (the redirect URI it was issued through) is a key of its own beside it,
and this release reads only the fields it knows, so the next one may add some.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import LockError

from tools.exceptions import scope_tokens
from worker.keys import Keys

if TYPE_CHECKING:  # imported where used: only processes with connection keys load it (~6 MiB)
    from cryptography.fernet import MultiFernet

FLOW_SECONDS = 600  # a started flow must reach the callback within this
PENDING_SECONDS = 600  # a finished flow must be confirmed in Slack within this
MAX_CONFIRM_ATTEMPTS = 5  # wrong finishing codes a person may enter per PENDING_SECONDS
REKEY_LOCK = 15.0  # seconds rekey waits for (and holds) a grant's refresh lock
MAX_VALUE_CHARS = 64_000  # a provider's token response, bounded before it is stored
WANTED_SECONDS = 86_400  # scopes a service asked for are asked for by Connect within this
MAX_WANTED_CHARS = 1_000  # of them together (a Slack button's URL holds 3,000 characters)


# KEYS: a value.  ARGV: what it was read as ('' = absent), what to write instead.
# 1: written; 0: it changed since it was read (nothing written).
_SWAP = """
local now = redis.call('GET', KEYS[1])
if (now == false and ARGV[1] == '') or now == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  return 1
end
return 0
"""


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
    from cryptography.fernet import Fernet, MultiFernet

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
    """What `rekey` rewrote; how many values none of the configured keys opens (sealed with
    a key already removed: they cannot be read, and are left as they are); and how many
    grants were being refreshed throughout (not rewritten: run it again)."""

    grants: int
    clients: int
    unreadable_grants: int
    unreadable_clients: int
    busy: int


class ConnectionStore:
    def __init__(self, conn: redis.Redis, namespace: str, keys: Sequence[str]) -> None:
        self.redis = conn
        self.keys = Keys(namespace)
        self.fernet = fernet_of(keys)
        self._swap = conn.register_script(_SWAP)

    # -- sealing ---------------------------------------------------------------------------
    def _seal(self, value: dict[str, Any]) -> bytes:
        return self.fernet.encrypt(json.dumps(value, separators=(",", ":")).encode())

    def _open(self, raw: bytes | None) -> dict[str, Any] | None:
        """The value, or None when absent or sealed with a key no longer configured."""
        from cryptography.fernet import InvalidToken

        if raw is None:
            return None
        try:
            value = json.loads(self.fernet.decrypt(raw))
        except (InvalidToken, ValueError):
            return None
        return value if isinstance(value, dict) else None

    # -- grants ----------------------------------------------------------------------------
    def put(self, team: str, user: str, grant: Grant, issuer: str | None = None) -> None:
        """Store a grant; `issuer`: the redirect URI it was issued through when it is not the
        public callback (the console's loopback one), whose client alone may refresh it
        ("": the public callback; None: as it was)."""
        key = self.keys.connection(team, user, grant.provider)
        with self.redis.pipeline() as pipe:
            pipe.set(key, self._seal(asdict(grant)))
            if issuer:  # with the grant's connection time: it names that grant and no other
                side = f"{grant.connected_at!r}|{issuer}"
                pipe.set(self.keys.connection_issuer(team, user, grant.provider), side)
            elif issuer is not None:
                pipe.delete(self.keys.connection_issuer(team, user, grant.provider))
            pipe.sadd(self.keys.connections_of(team, user), grant.provider)
            pipe.sadd(self.keys.connected_people(team), user)
            pipe.execute()

    def issuer(self, team: str, user: str, grant: Grant) -> str:
        """The redirect URI `grant` was issued through, if not the public callback."""
        return _issuer(
            self.redis.get(self.keys.connection_issuer(team, user, grant.provider)), grant
        )

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
        """Drop one grant (and any more access wanted for it); return what it was."""
        return self.take(team, user, provider)[0]

    def take(self, team: str, user: str, provider: str) -> tuple[Grant | None, str]:
        """Drop one grant (and any more access wanted for it); return what it was and the
        redirect URI it was issued through (to revoke it at the provider)."""
        with self.redis.pipeline() as pipe:  # one transaction: a confirm lands before or after
            pipe.getdel(self.keys.connection(team, user, provider))
            pipe.getdel(self.keys.connection_issuer(team, user, provider))
            pipe.srem(self.keys.connections_of(team, user), provider)
            pipe.delete(self.keys.oauth_wanted(team, user, provider))
            raw, side, *_ = pipe.execute()
        value = self._open(raw)
        grant = _grant(value) if value is not None else None
        return grant, _issuer(side, grant) if grant is not None else ""

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

    def rekey(self, wait: float = REKEY_LOCK) -> Rekeyed:
        """Encrypt every grant, registered client and wanted scope with the first key (after
        a rotation), so the other keys can be removed. A client left under a removed key
        could not be read: discovery would register another, and the grants issued to the
        first could no longer be refreshed. Each value is rewritten only if it is still what
        was read (a refresh or a connect meanwhile wrote it with the first key already), a
        grant under its refresh lock. Flows and finished connections live ten minutes: they
        are left to expire."""
        grants = self._rekey(self.keys.connection("*", "*", "*"), wait=wait)
        clients = self._rekey(self.keys.oauth_client("*"))  # each redirect URI's too
        self._rekey(self.keys.oauth_wanted("*", "*", "*"))  # unreadable: gone within a day
        return Rekeyed(grants[0], clients[0], grants[1], clients[1], grants[2])

    def _rekey(self, pattern: str, *, wait: float = 0.0) -> tuple[int, int, int]:
        """(values rewritten, values no configured key opens, grants whose refresh lock
        stayed taken `wait` seconds; 0: values with no lock)"""
        from cryptography.fernet import InvalidToken

        count = unreadable = busy = 0
        for key in self.redis.scan_iter(match=pattern, count=500):
            name = key.decode()
            if name.endswith(":refreshing"):
                continue  # a refresh's lock, not a grant
            lock = (
                self.redis.lock(name + ":refreshing", timeout=REKEY_LOCK, blocking_timeout=wait)
                if wait
                else contextlib.nullcontext()
            )
            try:
                with lock:
                    raw = self.redis.get(key)
                    if raw is None:
                        continue
                    try:
                        rotated = self.fernet.rotate(raw)
                    except InvalidToken:
                        unreadable += 1
                        continue
                    count += int(self._swap(keys=[key], args=[raw, rotated]))
            except LockError:
                busy += 1
        return count, unreadable, busy

    # -- flows -----------------------------------------------------------------------------
    def start(self, state: str, flow: Flow, scopes: Sequence[str] = ()) -> None:
        """`scopes`: what the authorization URL asks for, kept beside the flow (see
        Compatibility above): the grant's scope if the token answer names none."""
        key = self.keys.oauth_flow(digest(state))
        with self.redis.pipeline() as pipe:
            pipe.set(key, self._seal(asdict(flow)), ex=FLOW_SECONDS)
            pipe.set(key + ":scopes", " ".join(scopes), ex=FLOW_SECONDS)
            pipe.execute()

    def take_flow(self, state: str) -> tuple[Flow, str] | None:
        """The flow `state` names and the scopes it asked for, once: a second take (a
        replay) finds nothing."""
        key = self.keys.oauth_flow(digest(state))
        with self.redis.pipeline() as pipe:
            pipe.getdel(key)
            pipe.getdel(key + ":scopes")
            raw, scopes = pipe.execute()
        value = self._open(raw)
        if value is None:
            return None
        flow = Flow(**_known(Flow, value))
        if flow.expires_at <= time.time():
            return None
        return flow, scopes.decode() if scopes else ""

    def hold(self, finish_code: str, pending: Pending) -> None:
        value = asdict(pending)
        self.redis.set(
            self.keys.oauth_pending(digest(finish_code)), self._seal(value), ex=PENDING_SECONDS
        )

    def take_pending(self, finish_code: str) -> Pending | None:
        value = self._open(self.redis.getdel(self.keys.oauth_pending(digest(finish_code))))
        if value is None:
            return None
        pending = Pending(**{**_known(Pending, value), "grant": _grant(value["grant"])})
        return pending if pending.expires_at > time.time() else None

    def hold_issuer(self, finish_code: str, issuer: str) -> None:
        """The redirect URI a held grant was issued through, when not the public callback
        (beside the held grant: see Compatibility above)."""
        key = self.keys.oauth_pending(digest(finish_code)) + ":issuer"
        self.redis.set(key, issuer, ex=PENDING_SECONDS)

    def take_issuer(self, finish_code: str) -> str:
        raw = self.redis.getdel(self.keys.oauth_pending(digest(finish_code)) + ":issuer")
        return raw.decode() if raw else ""

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
        MAX_WANTED_CHARS of them, the newest first, so the Connect link stays a link Slack
        shows)."""
        merged: list[str] = []
        for scope in scope_tokens(" ".join([*scopes, *self.wanted(team, user, provider)])):
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
    # One for the public callback (the key every release has used) and one for each other
    # redirect URI (the console's loopback callbacks): a console connect never replaces the
    # client the public callback's grants were issued to.
    def client(self, provider: str, redirect_uri: str = "") -> tuple[bytes | None, Any]:
        """The client registered for `redirect_uri` ("": the public callback), as stored and
        as read (None when there is none, or no configured key opens it)."""
        raw = self.redis.get(self._client_key(provider, redirect_uri))
        return raw, self._open(raw)

    def put_client(
        self, provider: str, redirect_uri: str, info: dict[str, Any], replacing: bytes | None
    ) -> Any:
        """Store `info` unless another process stored a client since `replacing` was read
        (then that one stands: two processes registering at once must not go on with two
        clients); returns the client stored."""
        key = self._client_key(provider, redirect_uri)
        if self._swap(keys=[key], args=[replacing or b"", self._seal(info)]) == 1:
            return info
        return self._open(self.redis.get(key)) or info

    def _client_key(self, provider: str, redirect_uri: str) -> str:
        return self.keys.oauth_client(provider, digest(redirect_uri) if redirect_uri else "")


def _issuer(side: bytes | None, grant: Grant) -> str:
    """The redirect URI an issuer side key names, if it was written for `grant` (a side key
    left by a grant the previous release replaced without knowing of it names nothing)."""
    connected, _, uri = (side or b"").decode().partition("|")
    return uri if connected == repr(grant.connected_at) else ""


def _grant(value: dict[str, Any]) -> Grant:
    return Grant(**_known(Grant, value))


def _known(kind: Any, value: dict[str, Any]) -> dict[str, Any]:
    """The fields of `value` that `kind` (a dataclass) has: a later release may add some."""
    names = {f.name for f in fields(kind)}
    return {k: v for k, v in value.items() if k in names}
