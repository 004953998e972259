"""Who is asking: the user, team and channel from Slack's signed payload, and their Slack
user groups (cached with an expiry) turned into policy roles.

A person from another organisation (Slack Connect: their own team is not one the bot
serves, `bot.installations.Home`) gets the role `external` instead of `everyone` and the
roles the policy gives their user id by name; no user groups. By default an external
person may start nothing and decide nothing: starting needs a tool whose `allow` names
`external`, deciding needs an approver role they hold by name (`everyone` and `requester`
do not count for them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import structlog
from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError

from bot.installations import Home
from tools import Policy
from tools.policy import EVERYONE, EXTERNAL, REQUESTER
from worker.run import Requester

log = structlog.get_logger(__name__)

GROUPS_TTL = 300.0  # user group membership is read again after five minutes
FAILURE_TTL = 60.0  # after an error (e.g. a missing usergroups:read scope), retry a minute later


class UserGroups:
    """`usergroups.list` (with members) for the whole workspace, cached in memory."""

    def __init__(self, client: WebClient, ttl: float = GROUPS_TTL) -> None:
        self.client = client
        self.ttl = ttl
        self._by_user: dict[str, frozenset[str]] = {}
        self._expires = 0.0
        self._lock = threading.Lock()

    def handles_of(self, user_id: str) -> frozenset[str]:
        """The "@handle"s of the groups `user_id` belongs to."""
        with self._lock:
            if time.monotonic() >= self._expires:
                self._refresh()
            return self._by_user.get(user_id, frozenset())

    def members_of(self, handle: str) -> frozenset[str]:
        """The users in the group "@handle" (for DMs to approvers)."""
        with self._lock:
            if time.monotonic() >= self._expires:
                self._refresh()
            return frozenset(u for u, handles in self._by_user.items() if handle in handles)

    def _refresh(self) -> None:
        try:
            by_user = self._fetch()
        except (SlackClientError, OSError) as exc:
            log.warning("usergroups_unavailable", error=str(exc)[:300])
            self._expires = time.monotonic() + FAILURE_TTL
            return
        self._by_user = {user: frozenset(handles) for user, handles in by_user.items()}
        self._expires = time.monotonic() + self.ttl

    def _fetch(self) -> dict[str, set[str]]:
        response = self.client.usergroups_list(include_users=True)
        by_user: dict[str, set[str]] = {}
        for group in response.get("usergroups") or []:
            handle = "@" + str(group.get("handle", "")).lower()
            if handle == "@" or group.get("date_delete"):
                continue
            users = group.get("users")
            if users is None:  # some workspaces omit members: ask per group
                users = self.client.usergroups_users_list(usergroup=group["id"]).get("users", [])
            for user in users:
                by_user.setdefault(str(user), set()).add(handle)
        return by_user


class Identity:
    """Builds the Requester for a verified Slack user."""

    def __init__(self, policy: Policy, groups: UserGroups, home: Home | None = None) -> None:
        self.policy = policy
        self.groups = groups
        self.home = home
        self.uses_groups = any(
            member.startswith("@") for members in policy.roles.values() for member in members
        )

    def roles(self, user_id: str, team_id: str = "") -> frozenset[str]:
        """The policy roles of `user_id`, whose own team is `team_id` ("" = unknown: the
        workspace the request came from)."""
        if self.home is not None and self.home.is_external(team_id):
            named = self.policy.roles_for(user_id) - {EVERYONE}
            return frozenset({EXTERNAL, *named})
        handles: Iterable[str] = self.groups.handles_of(user_id) if self.uses_groups else ()
        return self.policy.roles_for(user_id, handles)

    def requester(self, user_id: str, team_id: str, channel_id: str) -> Requester:
        return Requester(
            user_id=user_id,
            team_id=team_id,
            channel_id=channel_id,
            roles=sorted(self.roles(user_id, team_id)),
        )

    def may_start(self, roles: Iterable[str]) -> bool:
        """May someone with these roles start a run? Everyone may, except external people
        while no tool's `allow` names `external`."""
        if EXTERNAL not in roles:
            return True
        names = self.policy.registry.names()
        return any(EXTERNAL in self.policy.rule(name).allow for name in names)

    def may_decide(
        self,
        tool: str,
        requester_id: str,
        decider_id: str,
        roles: frozenset[str],
        *,
        escalated: bool = False,
    ) -> bool:
        """The policy's answer, and for an external decider an approver role they hold by
        name: `everyone` and `requester` (self-approval) are not enough."""
        if not self.policy.may_decide(tool, requester_id, decider_id, roles, escalated=escalated):
            return False
        if EXTERNAL not in roles:
            return True
        try:
            rule = self.policy.rule(tool)
        except KeyError:
            return False
        named = set(rule.approvers) | (set(rule.escalate_to) if escalated else set())
        approvers = named - {EVERYONE, REQUESTER}
        return not approvers.isdisjoint(roles - {EVERYONE})
