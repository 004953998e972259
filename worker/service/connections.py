"""Connecting a person's own account, so per-user tools act as them.

The flow, and how it knows who finishes it (the "user verifier"):

1. `connect_url`: a person asks to connect from Slack (a Connect button: Slack tells us who
   clicked) or the console. A flow is stored under a random `state` (bound to their team,
   user and the provider, with the PKCE verifier, for FLOW_SECONDS) and the provider's
   authorization URL is returned.
2. `complete`: the provider sends the browser back to /oauth/callback with `code` and
   `state`. The flow is taken once (a replayed or forged `state` finds nothing), the code is
   exchanged (with the verifier), and the tokens are held, encrypted, under a short
   finishing code shown on the page. Nothing is connected yet: the browser is not a Slack
   identity, and a link forwarded to someone else would connect *their* account to the
   person who started.
3. `confirm`: the person enters the finishing code in Slack (Slack signs who they are). Only
   the person who started the flow may finish it: anyone else's code is refused and the held
   tokens dropped. Then the grant is stored and the person's runs that waited for it go on
   (worker/service/resuming.py).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from urllib.parse import quote_plus

from tools.exceptions import bounded, scope_tokens
from worker.connections import oauth
from worker.connections.oauth import ProviderDown, ProviderRefused
from worker.connections.store import FLOW_SECONDS, PENDING_SECONDS, Flow, Pending
from worker.connections.tokens import CALLBACK_PATH as CALLBACK_PATH  # the bot serves it
from worker.connections.tokens import Connections, UnknownProvider
from worker.run import Run
from worker.runtime import Runtime
from worker.service import resuming

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I
CODE_LENGTH = 10  # 50 bits, and at most MAX_CONFIRM_ATTEMPTS guesses per person
MAX_PARAMETER_CHARS = 2_000  # of `state`, `code`, `error` from the callback


class ConnectRefused(Exception):
    """Why a connection could not be made, in words for the person."""


@dataclass(frozen=True)
class Connection:
    """A person's connection as they may see it: never its tokens."""

    provider: str
    label: str
    connected_at: float
    expires_at: float | None
    scope: str


@dataclass(frozen=True)
class Finished:
    """The provider sent the person back: they confirm `code` in Slack within `seconds`."""

    code: str
    label: str
    seconds: int


@dataclass(frozen=True)
class Connected:
    team: str
    user: str
    provider: str
    label: str
    resumed: tuple[Run, ...] = ()  # the person's runs that waited for it, going on now


def _connections(rt: Runtime) -> Connections:
    if rt.connections is None:
        raise ConnectRefused(
            "Connections are not set up here: the operator has to set "
            "SWITCHBOARD_CONNECTION_KEYS and SWITCHBOARD_PUBLIC_URL."
        )
    return rt.connections


def redirect_uri(rt: Runtime) -> str:
    return _connections(rt).callback


def label(rt: Runtime, provider: str) -> str:
    """A provider's name for people ("GitHub")."""
    return rt.connections.label(provider) if rt.connections is not None else provider


def providers(rt: Runtime) -> list[str]:
    return [] if rt.connections is None else rt.connections.names()


def connect_url(
    rt: Runtime, team: str, user: str, provider: str, *, callback: str | None = None
) -> str:
    """Start connecting `user`'s account for `provider`; the URL to open in a browser.
    `callback`: another redirect URI (the console's local port). The URL asks for
    `scopes_to_ask`."""
    connections = _connections(rt)
    back = callback or redirect_uri(rt)
    try:
        found = connections.provider(provider, back)
    except UnknownProvider:
        raise ConnectRefused(f"There is no provider named {bounded(provider, 60)!r}.") from None
    except ProviderDown as down:
        raise ConnectRefused(
            f"{connections.label(provider)} cannot be reached now ({down})."
        ) from None
    found = replace(found, scopes=scopes_to_ask(connections, found.scopes, team, user, provider))
    state = secrets.token_urlsafe(32)
    challenge = oauth.pkce()
    connections.store.start(
        state,
        Flow(
            team=team,
            user=user,
            provider=provider,
            verifier=challenge.code_verifier,
            redirect_uri=back,
            expires_at=time.time() + FLOW_SECONDS,
        ),
        found.scopes,
    )
    return oauth.authorization_url(found, back, state, challenge.code_challenge)


MAX_ASKED_CHARS = 1_500  # of the scopes a Connect asks for, URL-encoded (Slack's: 3,000)


def scopes_to_ask(
    connections: Connections, configured: Sequence[str], team: str, user: str, provider: str
) -> tuple[str, ...]:
    """What a person's Connect asks for: the configured scopes, those a service asked their
    connection for (`ConnectionStore.want`: the MCP authorization spec's step-up), and those
    their connection gives (connecting again loses no access another tool uses; a provider
    that writes them comma-separated, as GitHub does, read as such); in that order, once
    each, MAX_ASKED_CHARS at most as the URL carries them."""
    held = connections.store.get(team, user, provider)
    given = held.scope.replace(",", " ") if held is not None else ""
    wanted = connections.store.wanted(team, user, provider)
    asked: list[str] = []
    for scope in scope_tokens(" ".join([*configured, *wanted, given])):
        if len(quote_plus(" ".join([*asked, scope]))) > MAX_ASKED_CHARS:
            break
        asked.append(scope)
    return tuple(asked)


def complete(
    rt: Runtime, state: str, code: str = "", error: str = "", description: str = ""
) -> Finished:
    """The provider's callback. ConnectRefused (no stored grant changes) for a missing,
    tampered, replayed or expired `state`, a provider's error, or a token endpoint that
    is down."""
    connections = _connections(rt)
    if not state or len(state) > MAX_PARAMETER_CHARS or len(code) > MAX_PARAMETER_CHARS:
        raise ConnectRefused("This link is not a connection Switchboard started.")
    taken = connections.store.take_flow(state)
    if taken is None:
        raise ConnectRefused(
            "This connection link was already used, has expired, or was not made by "
            "Switchboard. Start again from the Connect button in Slack."
        )
    flow, asked = taken
    label = connections.label(flow.provider)
    if error:
        why = bounded(description or error, 200)
        raise ConnectRefused(f"{label} did not connect your account: {why}. Nothing was changed.")
    if not code:
        raise ConnectRefused(f"{label} sent no authorization code. Nothing was changed.")
    try:
        provider = connections.provider(flow.provider, flow.redirect_uri)
        # what the URL asked for: the grant's scope when the answer names none
        grant = oauth.exchange(
            provider, connections.http, code, flow.verifier, flow.redirect_uri, asked
        )
    except ProviderRefused as refused:
        raise ConnectRefused(
            f"{label} refused to connect your account ({refused.error}). Nothing was changed; "
            "start again from Slack."
        ) from None
    except (ProviderDown, UnknownProvider) as down:
        raise ConnectRefused(
            f"{label} could not be reached to finish connecting ({down}). Nothing was changed; "
            "try again later."
        ) from None
    finishing = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
    if flow.redirect_uri != connections.callback:  # the console's: its client refreshes it
        connections.store.hold_issuer(finishing, flow.redirect_uri)
    connections.store.hold(
        finishing,
        Pending(
            team=flow.team,
            user=flow.user,
            provider=flow.provider,
            grant=grant,
            expires_at=time.time() + PENDING_SECONDS,
        ),
    )
    return Finished(code=finishing, label=label, seconds=PENDING_SECONDS)


def confirm(rt: Runtime, team: str, user: str, finishing_code: str) -> Connected:
    """The person who started the flow confirms it (the user verifier). A code that is not
    theirs is refused and its held tokens dropped; too many wrong codes are refused too."""
    connections = _connections(rt)
    if not connections.store.confirm_attempt(team, user):
        raise ConnectRefused("Too many codes tried; wait ten minutes and connect again.")
    cleaned = "".join(ch for ch in finishing_code.upper() if ch.isalnum())[: CODE_LENGTH + 1]
    pending = connections.store.take_pending(cleaned) if len(cleaned) == CODE_LENGTH else None
    if pending is None:
        raise ConnectRefused("That code is not valid (or it expired). Connect again from Slack.")
    if (pending.team, pending.user) != (team, user):
        raise ConnectRefused(
            "That connection was started by someone else, so it cannot connect your account. "
            "Nothing was connected; start your own from the Connect button."
        )
    connections.store.put(team, user, pending.grant, connections.store.take_issuer(cleaned))
    connections.store.unwant(team, user, pending.provider)
    label = connections.label(pending.provider)
    resumed = resuming.resume_waiting(rt, team, user, pending.provider, label)
    return Connected(team, user, pending.provider, label, tuple(resumed))


def listing(rt: Runtime, team: str, user: str) -> list[Connection]:
    """The person's connections, without their tokens."""
    if rt.connections is None:
        return []
    found = []
    for name in rt.connections.store.providers(team, user):
        grant = rt.connections.store.get(team, user, name)
        if grant is not None:
            found.append(
                Connection(
                    provider=name,
                    label=rt.connections.label(name),
                    connected_at=grant.connected_at,
                    expires_at=grant.expires_at,
                    scope=grant.scope,
                )
            )
    return found


def revoke(rt: Runtime, team: str, user: str, provider: str) -> bool:
    """Disconnect: drop the grant and revoke it at the provider where it can be."""
    return rt.connections is not None and rt.connections.drop(team, user, provider)


def token_for(rt: Runtime, team: str, user: str, provider: str) -> str:
    """The person's access token (refreshed if needed); NotConnected without one."""
    return _connections(rt).token_for(team, user, provider)


def drop_person(rt: Runtime, team: str, user: str) -> int:
    """A person left (deactivated): drop every grant they had."""
    if rt.connections is None:
        return 0
    return sum(
        rt.connections.drop(team, user, name) for name in rt.connections.store.providers(team, user)
    )


def drop_workspace(rt: Runtime, team: str) -> int:
    """The app was uninstalled: drop every grant of the workspace."""
    if rt.connections is None:
        return 0
    dropped = sum(drop_person(rt, team, user) for user in rt.connections.store.people(team))
    rt.redis.delete(rt.connections.store.keys.connected_people(team))
    return dropped
