"""Who is asking: the user, team and channel from Slack's signed payload, and their Slack
user groups (cached, at most `GROUPS_TTL` old) turned into policy roles.

A person from another organisation (Slack Connect: their own team is not one the bot
serves, `bot.installations.Home`) gets the role `external` instead of `everyone` and the
roles the policy gives their user id by name; no user groups. By default an external
person may start nothing and decide nothing: starting needs a tool whose `allow` names
`external`, deciding needs an approver role they hold by name (`everyone` and `requester`
do not count for them).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable

import redis
import structlog
from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError

from bot.installations import Home
from tools import Policy
from tools.policy import EVERYONE, EXTERNAL, REQUESTER
from worker.roles import RolesUnavailable
from worker.run import Requester
from worker.runtime import Runtime

log = structlog.get_logger(__name__)

GROUPS_TTL = 60.0  # the most a group membership may be out of date before it is not used
RETRY_SECONDS = 5.0  # after Slack failed to answer, ask again no sooner than this
SHARED_MAX_BYTES = 16 * 1024 * 1024  # a cached membership map larger than this is not shared


class UserGroups:
    """`usergroups.list` (with members) for the whole workspace, cached with a bounded
    staleness: read again from Slack once half of `ttl` has passed, never used once `ttl`
    has. While Slack cannot be asked past that bound, `handles_of` raises RolesUnavailable
    (fail closed: a removed approver must not keep deciding because Slack is down).

    With `shared`, the map Slack sent is kept in Redis too, so every bot and worker process
    reads one copy instead of each asking Slack (`usergroups.list` is a Tier 2 method).
    """

    def __init__(
        self,
        client: WebClient,
        ttl: float = GROUPS_TTL,
        *,
        shared: redis.Redis | None = None,
        namespace: str = "sb:",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.ttl = ttl
        self.shared = shared
        self.key = f"{namespace}usergroups"
        self.clock = clock
        self._by_user: dict[str, frozenset[str]] = {}
        self._fetched_at = -math.inf  # when Slack gave the map we hold (wall clock)
        self._retry_at = -math.inf
        self._lock = threading.Lock()

    def handles_of(self, user_id: str) -> frozenset[str]:
        """The "@handle"s of the groups `user_id` belongs to. Raises RolesUnavailable."""
        with self._lock:
            return self._current().get(user_id, frozenset())

    def members_of(self, handle: str) -> frozenset[str]:
        """The users in the group "@handle" (for DMs to approvers). Raises RolesUnavailable."""
        with self._lock:
            return frozenset(u for u, handles in self._current().items() if handle in handles)

    def _current(self) -> dict[str, frozenset[str]]:
        """The map, read again when half the bound has passed; held under the lock."""
        now = self.clock()
        if now - self._fetched_at >= self.ttl / 2:
            self._load_shared()
        if now - self._fetched_at >= self.ttl / 2 and now >= self._retry_at:
            self._refresh(now)
        age = now - self._fetched_at
        if age > self.ttl:
            raise RolesUnavailable(
                "Slack's user groups could not be read (usergroups.list) for "
                f"{'ever' if math.isinf(age) else f'{age:.0f} s'}; the bound is "
                f"{self.ttl:.0f} s"
            )
        return self._by_user

    def _refresh(self, now: float) -> None:
        try:
            by_user = self._fetch()
        except (SlackClientError, OSError) as exc:
            log.warning("usergroups_unavailable", error=str(exc)[:300])
            self._retry_at = now + RETRY_SECONDS
            return
        self._by_user = {user: frozenset(handles) for user, handles in by_user.items()}
        self._fetched_at = now
        self._save_shared()

    def _load_shared(self) -> None:
        if self.shared is None:
            return
        try:
            raw = self.shared.get(self.key)
            if raw is None:
                return
            stored = json.loads(raw)
            fetched_at = float(stored["at"])
            if fetched_at <= self._fetched_at:
                return
            by_user = {str(u): frozenset(map(str, h)) for u, h in stored["users"].items()}
        except (redis.RedisError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("usergroups_shared_unreadable", error=str(exc)[:300])
            return
        self._by_user, self._fetched_at = by_user, fetched_at

    def _save_shared(self) -> None:
        if self.shared is None:
            return
        users = {user: sorted(handles) for user, handles in self._by_user.items()}
        raw = json.dumps({"at": self._fetched_at, "users": users}, separators=(",", ":"))
        if len(raw) > SHARED_MAX_BYTES:
            return
        try:
            self.shared.set(self.key, raw, px=max(1, int(self.ttl * 1000)))
        except redis.RedisError as exc:
            log.warning("usergroups_shared_unwritable", error=str(exc)[:300])

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


def user_groups(rt: Runtime, client: WebClient, ttl: float = GROUPS_TTL) -> UserGroups:
    """Slack user groups, cached in this process and in Redis for every other one."""
    return UserGroups(client, ttl=ttl, shared=rt.redis, namespace=rt.settings.namespace)


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
        workspace the request came from). Raises RolesUnavailable."""
        return self._roles(user_id, self.home is not None and self.home.is_external(team_id))

    def current_roles(self, requester: Requester) -> frozenset[str]:
        """The roles of a run's requester now (the worker's re-check before each step).
        Whether they are external was settled when the run started, from Slack's signed
        payload. Raises RolesUnavailable."""
        return self._roles(requester.user_id, EXTERNAL in requester.roles)

    def _roles(self, user_id: str, external: bool) -> frozenset[str]:
        if external:
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
