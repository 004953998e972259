"""Which Slack installation a request is for, and whether that installation still exists.

`Home` is what the bot serves: the workspace its bot token belongs to (`auth.test`), the
app that token is for (`app_id`, from `auth.test` or else `bots.info`), and any workspace
(team id, or Enterprise Grid org id) or app configured on top. Slack signs every request
with the app's one signing secret whatever workspace it is for, so a good signature does
not mean "ours": a request for another workspace or another app is acked and dropped
(issue 15, item 4). A person is *external* when their own team (Slack Connect: the
`user_team` of an event, the `user.team_id` of a click) is not one the bot serves.

`Installations` remembers workspaces where the app was uninstalled or its bot token
revoked (`app_uninstalled`, `tokens_revoked`): the Slack surface posts nothing there.
Key: `{ns}slack:revoked:{team}`, cleared when the bot starts with a token that works there.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import redis
import structlog
from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError

from bot.transport.payloads import dig, envelope_team
from worker.keys import Keys

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Home:
    own_teams: frozenset[str]  # from auth.test: the workspace (and org, for an org install)
    teams: frozenset[str]  # own_teams and the configured ones
    apps: frozenset[str]  # this app and the configured ones; empty: not checked

    @classmethod
    def learn(
        cls, client: WebClient, *, teams: Collection[str] = (), apps: Collection[str] = ()
    ) -> Home:
        auth = client.auth_test()
        own = {str(auth.get("team_id") or "")}
        if auth.get("is_enterprise_install"):
            own.add(str(auth.get("enterprise_id") or ""))
        own.discard("")
        app_id = str(auth.get("app_id") or "") or app_of_bot(client, auth.get("bot_id"))
        configured_apps = {a for a in apps if a}
        if not app_id and not configured_apps:
            log.warning("slack_app_unknown", hint="requests are not checked for their app id")
        home = cls(
            own_teams=frozenset(own),
            teams=frozenset(own | {t for t in teams if t}),
            apps=frozenset(configured_apps | ({app_id} if app_id else set())),
        )
        log.info("slack_home", teams=sorted(home.teams), apps=sorted(home.apps))
        return home

    def refusal(self, body: Mapping[str, Any]) -> str | None:
        """Why this request is not for us, or None when it is."""
        team, enterprise = envelope_team(body)
        if not team and not enterprise:
            return "no team"
        if team not in self.teams and enterprise not in self.teams:
            return "another team"
        app = body.get("api_app_id") or dig(body, "view", "app_id")
        if self.apps and isinstance(app, str) and app and app not in self.apps:
            return "another app"
        return None

    def is_external(self, team: str) -> bool:
        """A person whose own team is known and is not one we serve (Slack Connect)."""
        return bool(team) and team not in self.teams


def app_of_bot(client: WebClient, bot_id: Any) -> str:
    """The app id of our bot user (`bots.info`, scope users:read), or "" when unknown."""
    if not isinstance(bot_id, str) or not bot_id:
        return ""
    try:
        app_id = dig(client.bots_info(bot=bot_id).data, "bot", "app_id")
    except (SlackClientError, OSError) as exc:
        log.warning("slack_bots_info_failed", error=str(exc)[:200])
        return ""
    return app_id if isinstance(app_id, str) else ""


class Installations:
    def __init__(self, connection: redis.Redis, namespace: str = "sb:", ttl: int = 30 * 86400):
        self.redis = connection
        self.ns = namespace
        self.keys = Keys(namespace)
        self.ttl = ttl

    def revoke(self, team: str, why: str) -> None:
        self.redis.set(self.keys.slack_revoked(team), why, ex=self.ttl)

    def restore(self, team: str) -> None:
        self.redis.delete(self.keys.slack_revoked(team))

    def revoked(self, team: str) -> bool:
        return bool(team) and bool(self.redis.exists(self.keys.slack_revoked(team)))
