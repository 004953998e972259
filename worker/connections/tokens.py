"""A process's connections: the store, the providers it knows, and the token for a call.

`token_for` is what a per-user tool's call asks (through ToolContext): the requester's own
access token, refreshed first when it has expired (one refresh at a time per grant). A
refresh the provider refuses (`invalid_grant`: revoked, expired) drops the grant, so the
person is asked to connect again; a provider that is down leaves the grant as it is and
the call fails for now. A service that answers 401 to a token (`refused`) gets the same
treatment: refreshed once, and dropped when that does not help.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import replace

import httpx2
import structlog

from tools.exceptions import NotConnected, ToolError
from worker.connections import oauth
from worker.connections.oauth import Provider, ProviderDown, ProviderRefused
from worker.connections.store import ConnectionStore, Grant

log = structlog.get_logger(__name__)

REFRESH_LOCK_SECONDS = 15.0
CALLBACK_PATH = "/oauth/callback"  # the public callback's path (bot/transport/oauth_callback.py)


class UnknownProvider(KeyError):
    pass


class Connections:
    def __init__(
        self,
        store: ConnectionStore,
        providers: Mapping[str, Provider],
        public_url: str = "",
        http: httpx2.Client | None = None,
    ) -> None:
        self.store = store
        self._providers = dict(providers)
        self.public_url = public_url.rstrip("/")
        self.http = http or httpx2.Client(timeout=oauth.TIMEOUT, follow_redirects=False)
        self._lock = threading.Lock()
        # (name, redirect URI) -> the provider with its discovered endpoints and client
        self._discovered: dict[tuple[str, str], Provider] = {}

    def names(self) -> list[str]:
        return sorted(self._providers)

    def add(self, provider: Provider) -> None:
        """Declare a provider (an MCP server entry's own OAuth, known at start-up)."""
        with self._lock:
            self._providers.setdefault(provider.name, provider)

    def label(self, name: str) -> str:
        found = self._providers.get(name)
        return found.label if found is not None else name

    @property
    def callback(self) -> str:
        """The public callback: the redirect URI of every connect but the console's."""
        return self.public_url + CALLBACK_PATH

    def provider(self, name: str, redirect_uri: str = "") -> Provider:
        """The provider, its endpoints and client discovered first for an MCP server's own
        OAuth (once per process and redirect URI, the public callback by default). The
        registration is kept, encrypted, in Redis: one for the public callback, one for
        each other redirect URI (ConnectionStore.client)."""
        with self._lock:
            found = self._providers.get(name)
        if found is None:
            raise UnknownProvider(name)
        if found.discovered or not found.discover_from:
            return found
        redirect_uri = redirect_uri or self.callback
        if not redirect_uri.startswith(("http://", "https://")):  # no public URL here
            raise ProviderDown(
                "SWITCHBOARD_PUBLIC_URL is not set where this runs, and the connection was "
                "made through it"
            )
        with self._lock:
            ready = self._discovered.get((name, redirect_uri))
        if ready is not None:
            return ready
        other = "" if redirect_uri == self.callback else redirect_uri  # the store's key
        raw, registered = self.store.client(name, other)
        discovered = oauth.discover(found.discover_from, redirect_uri, "Switchboard", registered)
        if discovered.client is not registered:
            kept = self.store.put_client(name, other, discovered.client, raw)
            if redirect_uri in kept.get("redirect_uris", []):  # another process's, if any
                discovered = replace(discovered, client=kept)
        ready = oauth.with_discovery(found, discovered)
        with self._lock:
            self._discovered[(name, redirect_uri)] = ready
        return ready

    def provider_of(self, team: str, user: str, grant: Grant) -> Provider:
        """The provider as the client a person's grant was issued to, the only one that may
        refresh and revoke it: the public callback's, or the console's loopback one's."""
        return self.provider(grant.provider, self.store.issuer(team, user, grant))

    def token_for(self, team: str, user: str, provider: str) -> str:
        """The access token of `user` for `provider`, refreshed if it expired; NotConnected
        when they have none (or it can no longer be refreshed)."""
        label = self.label(provider)
        grant = self.store.get(team, user, provider)
        if grant is None:
            raise NotConnected(provider, label)
        if not grant.expired(time.time()):
            return grant.access_token
        if not grant.refresh_token:
            self.store.delete(team, user, provider)
            raise NotConnected(provider, label, "the connection expired")
        return self._refreshed(team, user, grant, label)

    def refused(
        self, team: str, user: str, provider: str, token: str, *, refresh: bool = True
    ) -> str:
        """A service refused `token` (HTTP 401): it is no longer good. With `refresh`, the
        grant is refreshed and the new token returned (or the one another call got
        meanwhile); without, or when it cannot be refreshed, the grant is dropped and
        NotConnected raised, so the person connects again."""
        label = self.label(provider)
        grant = self.store.get(team, user, provider)
        why = "the service no longer accepts the connection"
        if grant is None:
            raise NotConnected(provider, label, why)
        if grant.access_token != token and not grant.expired(time.time()):
            return grant.access_token  # replaced since the call read it
        if refresh and grant.refresh_token:
            log.info("connection_token_refused", provider=provider, action="refresh")
            return self._refreshed(team, user, grant, label)
        self.store.delete(team, user, provider)
        log.info("connection_token_refused", provider=provider, action="drop")
        raise NotConnected(provider, label, why)

    def _refreshed(self, team: str, user: str, grant: Grant, label: str) -> str:
        with self.store.refresh_lock(team, user, grant.provider, REFRESH_LOCK_SECONDS):
            current = self.store.get(team, user, grant.provider)
            if current is None:
                raise NotConnected(grant.provider, label)
            if current != grant and not current.expired(time.time()):
                return current.access_token  # another call refreshed it meanwhile
            try:
                fresh = oauth.refresh(self.provider_of(team, user, current), self.http, current)
            except ProviderRefused as refused:
                self.store.delete(team, user, grant.provider)
                log.info("connection_refresh_refused", provider=grant.provider, error=refused.error)
                raise NotConnected(
                    grant.provider, label, "the connection was revoked or expired"
                ) from None
            except ProviderDown as down:
                log.warning("connection_refresh_failed", provider=grant.provider, why=str(down))
                raise ToolError(
                    f"Error: not run: {label} could not refresh the connection ({down}); "
                    "try again later"
                ) from None
            self.store.replace(team, user, current, fresh)
            log.info("connection_refreshed", provider=grant.provider)
            return fresh.access_token

    def drop(self, team: str, user: str, provider: str) -> bool:
        """Drop a grant, revoking it at the provider where it has a revocation endpoint."""
        grant, issuer = self.store.take(team, user, provider)
        if grant is None:
            return False
        try:
            found = self.provider(provider, issuer)
        except (UnknownProvider, ProviderDown):
            return True
        revoked = oauth.revoke(found, self.http, grant)
        log.info("connection_dropped", provider=provider, revoked_at_provider=revoked)
        return True
