"""Who is asking: the user, team and channel from Slack's signed payload, and their Slack
user groups (cached with an expiry) turned into policy roles."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import structlog
from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError

from tools import Policy
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

    def __init__(self, policy: Policy, groups: UserGroups) -> None:
        self.policy = policy
        self.groups = groups
        self.uses_groups = any(
            member.startswith("@") for members in policy.roles.values() for member in members
        )

    def roles(self, user_id: str) -> frozenset[str]:
        handles: Iterable[str] = self.groups.handles_of(user_id) if self.uses_groups else ()
        return self.policy.roles_for(user_id, handles)

    def requester(self, user_id: str, team_id: str, channel_id: str) -> Requester:
        return Requester(
            user_id=user_id,
            team_id=team_id,
            channel_id=channel_id,
            roles=sorted(self.roles(user_id)),
        )
