"""The OAuth 2.1 authorization-code flow with PKCE, against one provider.

Built on the `mcp` SDK's client auth where it fits: `PKCEParameters` (the verifier and its
S256 challenge), its token and metadata models (`OAuthToken`, `OAuthMetadata`,
`ProtectedResourceMetadata`) and its discovery and dynamic-registration helpers for a
remote MCP server that requires OAuth (RFC 9728 protected-resource metadata, RFC 8414
authorization-server metadata, RFC 7591 registration). The SDK's `OAuthClientProvider`
itself is an httpx auth flow that waits for the browser inside one request; a Slack
connection starts in one process and finishes in another minutes later, so the steps are
called one by one here, with httpx2 (the SDK's own HTTP client) for the requests.

The SDK is imported by the functions that use it, not with this module: every process reads
the providers, few connect anyone, and the SDK costs ~25 MiB a process.

Every request has a timeout and every answer is bounded (MAX_RESPONSE_BYTES). Errors come
in two kinds: `ProviderRefused` (the provider answered with an OAuth error: `invalid_grant`
for a revoked or expired refresh token, `access_denied`...) and `ProviderDown` (no answer,
a 5xx, an answer that is not a token response). Neither ever carries a token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import httpx2
from pydantic import AnyUrl, ValidationError

if TYPE_CHECKING:
    from mcp.client.auth import PKCEParameters
    from mcp.shared.auth import OAuthMetadata, OAuthToken

from tools.exceptions import bounded
from tools.mcp.loop import run_to_end
from worker.connections.store import Grant

TIMEOUT = httpx2.Timeout(10.0)
MAX_RESPONSE_BYTES = 64_000


class ProviderRefused(Exception):
    """The provider answered with an OAuth error."""

    def __init__(self, error: str, description: str = "") -> None:
        super().__init__(f"{error}: {description}" if description else error)
        self.error = bounded(error, 100)
        self.description = bounded(description, 300)


class ProviderDown(Exception):
    """The provider could not be reached, or did not answer as OAuth says."""


@dataclass(frozen=True)
class Provider:
    """Where and how to connect a person's account. `name` keys the grants ("github",
    "mcp:docs"); `label` is for people ("GitHub"). `resource` (RFC 8707) is the MCP server's
    URL, so its authorization server issues tokens for that server only."""

    name: str
    label: str
    authorize_url: str
    token_url: str
    client_id: str
    client_secret: str = field(default="", repr=False)
    revoke_url: str = ""
    scopes: tuple[str, ...] = ()
    resource: str = ""
    discover_from: str = ""  # an MCP server's URL: endpoints and client come from discovery

    @property
    def discovered(self) -> bool:
        return bool(self.authorize_url and self.token_url and self.client_id)


def load_sdk() -> None:
    """Import the SDK now (~0.4 s here): see switchboard/startup.py."""
    import mcp.client.auth.utils
    import mcp.shared.auth  # noqa: F401


def pkce() -> PKCEParameters:
    from mcp.client.auth import PKCEParameters

    return PKCEParameters.generate()


def authorization_url(provider: Provider, redirect_uri: str, state: str, challenge: str) -> str:
    query = {
        "response_type": "code",
        "client_id": provider.client_id,
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    if provider.scopes:
        query["scope"] = " ".join(provider.scopes)
    if provider.resource:
        query["resource"] = provider.resource
    joiner = "&" if "?" in provider.authorize_url else "?"
    return provider.authorize_url + joiner + urlencode(query)


def exchange(
    provider: Provider,
    http: httpx2.Client,
    code: str,
    verifier: str,
    redirect_uri: str,
    requested: str = "",
) -> Grant:
    """The tokens for an authorization code. `requested`: the scopes the authorization URL
    asked for, which are the grant's when the answer names none (RFC 6749 5.1: it may leave
    `scope` out when it granted what was asked)."""
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": redirect_uri,
        "code_verifier": verifier,
    }
    grant = _grant(provider, _token_request(provider, http, form), previous=None)
    return replace(grant, scope=grant.scope or requested)


def refresh(provider: Provider, http: httpx2.Client, grant: Grant) -> Grant:
    """New tokens for a grant whose access token expired (ProviderRefused `invalid_grant`:
    the refresh token was revoked or expired, so the person must connect again)."""
    if not grant.refresh_token:
        raise ProviderRefused("invalid_grant", "the provider gave no refresh token")
    form = {"grant_type": "refresh_token", "refresh_token": grant.refresh_token}
    return _grant(provider, _token_request(provider, http, form), previous=grant)


def revoke(provider: Provider, http: httpx2.Client, grant: Grant) -> bool:
    """Ask the provider to revoke the grant (RFC 7009), refresh token first (that ends the
    access tokens made from it too). False when it has no revocation endpoint or did not
    answer: the grant is dropped here either way."""
    if not provider.revoke_url:
        return False
    done = False
    for token, hint in (
        (grant.refresh_token, "refresh_token"),
        (grant.access_token, "access_token"),
    ):
        if not token:
            continue
        form = {"token": token, "token_type_hint": hint, **_client_auth(provider)}
        try:
            answer = http.post(provider.revoke_url, data=form, timeout=TIMEOUT)
        except httpx2.HTTPError:
            return done
        done = done or answer.status_code == 200
    return done


def _client_auth(provider: Provider) -> dict[str, str]:
    auth = {"client_id": provider.client_id}
    if provider.client_secret:
        auth["client_secret"] = provider.client_secret
    return auth


def _token_request(provider: Provider, http: httpx2.Client, form: dict[str, str]) -> OAuthToken:
    from mcp.shared.auth import OAuthToken

    if provider.resource:
        form["resource"] = provider.resource
    try:
        answer = http.post(
            provider.token_url,
            data={**form, **_client_auth(provider)},
            headers={"Accept": "application/json"},
            timeout=TIMEOUT,
        )
    except httpx2.HTTPError as error:
        raise ProviderDown(f"{provider.label} did not answer ({type(error).__name__})") from None
    body = answer.content[:MAX_RESPONSE_BYTES]
    if answer.status_code >= 500:
        raise ProviderDown(f"{provider.label} answered {answer.status_code}")
    try:
        payload: Any = answer.json() if len(answer.content) <= MAX_RESPONSE_BYTES else None
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        # GitHub answers errors with 200; RFC 6749 with 400
        raise ProviderRefused(payload["error"], str(payload.get("error_description") or ""))
    if answer.status_code != 200 or not isinstance(payload, dict):
        raise ProviderDown(
            f"{provider.label} answered {answer.status_code} with no token ({len(body)} bytes)"
        )
    try:
        return OAuthToken.model_validate(payload)
    except ValidationError:
        raise ProviderDown(f"{provider.label}'s token response is not OAuth's") from None


def _grant(provider: Provider, token: OAuthToken, previous: Grant | None) -> Grant:
    now = time.time()
    fresh = Grant(
        provider=provider.name,
        access_token=token.access_token,
        refresh_token=token.refresh_token,
        expires_at=now + token.expires_in if token.expires_in else None,
        scope=token.scope or "",
        connected_at=now,
    )
    if previous is None:
        return fresh
    # a refresh may leave out the refresh token (keep the old one) and keeps the connection date
    return replace(
        fresh,
        refresh_token=token.refresh_token or previous.refresh_token,
        connected_at=previous.connected_at,
        scope=token.scope or previous.scope,
    )


# -- a remote MCP server's own OAuth -----------------------------------------------------------


@dataclass(frozen=True)
class Discovered:
    metadata: OAuthMetadata
    client: dict[str, Any]  # the registration (client_id, client_secret, ...)


def discover(
    server_url: str, redirect_uri: str, client_name: str, registered: dict[str, Any] | None
) -> Discovered:
    """The authorization server of an MCP server (protected-resource metadata, then its
    metadata) and a client registered there (dynamic registration), unless `registered`
    already holds one for this redirect URI."""
    try:
        return run_to_end(_discover(server_url, redirect_uri, client_name, registered))
    except (httpx2.HTTPError, ValidationError, ValueError) as error:
        raise ProviderDown(
            f"could not discover the MCP server's authorization server ({type(error).__name__})"
        ) from None


async def _discover(
    server_url: str, redirect_uri: str, client_name: str, registered: dict[str, Any] | None
) -> Discovered:
    from mcp.client.auth.utils import (
        build_oauth_authorization_server_metadata_discovery_urls,
        build_protected_resource_metadata_discovery_urls,
        create_client_registration_request,
        create_oauth_metadata_request,
        extract_resource_metadata_from_www_auth,
        handle_auth_metadata_response,
        handle_protected_resource_response,
    )
    from mcp.shared.auth import OAuthClientMetadata

    async with httpx2.AsyncClient(timeout=TIMEOUT) as http:
        probe = await http.get(server_url)
        www = extract_resource_metadata_from_www_auth(probe) if probe.status_code == 401 else None
        auth_server = None
        for url in build_protected_resource_metadata_discovery_urls(www, server_url):
            prm = await handle_protected_resource_response(
                await http.send(create_oauth_metadata_request(url))
            )
            if prm is not None and prm.authorization_servers:
                auth_server = str(prm.authorization_servers[0])
                break
        metadata = None
        for url in build_oauth_authorization_server_metadata_discovery_urls(
            auth_server, server_url
        ):
            go_on, metadata = await handle_auth_metadata_response(
                await http.send(create_oauth_metadata_request(url))
            )
            if metadata is not None or not go_on:
                break
        if metadata is None:
            raise ProviderDown("the MCP server publishes no OAuth authorization server metadata")
        if registered and redirect_uri in registered.get("redirect_uris", []):
            return Discovered(metadata, registered)
        request = create_client_registration_request(
            metadata,
            OAuthClientMetadata(
                redirect_uris=[AnyUrl(redirect_uri)],
                token_endpoint_auth_method="client_secret_post",
                grant_types=["authorization_code", "refresh_token"],
                client_name=client_name,
            ),
            auth_server or server_url,
        )
        answer = await http.send(request)
        if answer.status_code not in (200, 201):
            raise ProviderDown(
                f"the authorization server refused to register us ({answer.status_code})"
            )
        client = answer.json()
        if not isinstance(client, dict) or not isinstance(client.get("client_id"), str):
            raise ProviderDown("the authorization server's registration has no client_id")
        return Discovered(metadata, client)


def with_discovery(provider: Provider, found: Discovered) -> Provider:
    """`provider` (declared by an MCP server entry) with what discovery found."""
    metadata = found.metadata
    return replace(
        provider,
        authorize_url=str(metadata.authorization_endpoint),
        token_url=str(metadata.token_endpoint),
        revoke_url=str(metadata.revocation_endpoint or ""),
        client_id=str(found.client["client_id"]),
        client_secret=str(found.client.get("client_secret") or ""),
        scopes=provider.scopes or tuple((found.client.get("scope") or "").split()),
    )
