"""Signing secrets, more than one while one is rotated, and Bolt's check of them.

`SLACK_SIGNING_SECRET` is the current secret; `SLACK_SIGNING_SECRET_PREVIOUS` (one, or
several comma-separated) are accepted too until they are removed. Bolt's own
`RequestVerification` takes a single secret, so the app is built with it off and with
`SecretsVerification` instead: the same check (`bot.transport.signature`, every secret),
still on. It runs after Bolt's built-in middleware (authorization reads only the cached
`auth.test`); in HTTP mode the server has checked the raw body before Bolt sees it anyway
(`bot.transport.http_server`). Socket Mode requests carry no signature and are skipped, as
Bolt does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slack_bolt.middleware.request_verification import RequestVerification
from slack_bolt.request import BoltRequest
from slack_bolt.response import BoltResponse

from bot.transport import signature


@dataclass(frozen=True)
class SigningSecrets:
    """The secrets a request may be signed with, the current one first."""

    all: tuple[str, ...]

    @classmethod
    def of(cls, secrets: str | Sequence[str]) -> SigningSecrets:
        given = (secrets,) if isinstance(secrets, str) else tuple(secrets)
        return cls(tuple(s for s in given if s))

    @property
    def current(self) -> str:
        return self.all[0] if self.all else ""

    def middleware(self) -> SecretsVerification:
        return SecretsVerification(self.all)


class SecretsVerification(RequestVerification):
    """Bolt's RequestVerification, accepting a request signed with any of `secrets`."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__(secrets[0] if secrets else "")
        self.secrets = tuple(secrets)

    def process(
        self,
        *,
        req: BoltRequest,
        resp: BoltResponse,
        next: Callable[[], BoltResponse],
    ) -> BoltResponse:
        if self._can_skip(req.mode, req.body):
            return next()
        unsigned = signature.problem(
            self.secrets,
            req.headers.get("x-slack-request-timestamp", []),
            req.headers.get("x-slack-signature", []),
            req.raw_body.encode("utf-8"),
        )
        if unsigned is None:
            return next()
        return self._build_error_response()
