"""Who is asking: the user, team and channel from Slack's signed payload, and their Slack
user groups (cached, at most `GROUPS_TTL` old) turned into policy roles.

A person from another organisation (Slack Connect: their own team is not one the bot
serves, `bot.state.installations.Home`) gets the role `external` instead of `everyone` and the
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

from bot.state.installations import Home
from tools.exceptions import brief
from tools.policy import EXTERNAL
from worker.keys import Keys
from worker.roles import RolesUnavailable
from worker.run import Requester
from worker.runtime import Runtime
from worker.service import Access

log = structlog.get_logger(__name__)

GROUPS_TTL = 60.0  # the most a group membership may be out of date before it is not used
RETRY_SECONDS = 5.0  # after Slack failed to answer, ask again no sooner than this
WAIT_SECONDS = 10.0  # how long a caller waits for Slack when what it holds is past the bound
SHARED_MAX_BYTES = 16 * 1024 * 1024  # a cached membership map larger than this is not shared
# Listener threads that may wait for Slack's groups at once (bot.transport.serve runs 8): the others
# stay free to acknowledge clicks, commands and modals within Slack's 3 s, however slowly
# Slack lists groups. A listener past this many waits no longer than what is cached allows.
WAITERS = 3
WAITER_QUEUE_SECONDS = 0.2  # how long a listener waits for one of those places
# A question is acknowledged before its listener runs, and its run re-checks the asker's
# roles before its first step (worker.roles): the listener waits this long at most, then
# records the roles the policy gives the user by id and lets the worker find the groups.
QUESTION_ROLES_WAIT = 0.5


class UserGroups:
    """`usergroups.list` (with members) for the whole workspace, cached with a bounded
    staleness: read again once half of `ttl` has passed, in a background thread (no caller
    waits on Slack while what it holds is within the bound, and no lock is held during the
    call), never used once `ttl` has. Past the bound a caller waits up to `wait` seconds for
    the read in flight; while Slack cannot be asked, `handles_of` raises RolesUnavailable
    (fail closed: a removed approver must not keep deciding because Slack is down).

    With `shared`, the map Slack sent is kept in Redis too, so every bot and worker process
    reads one copy instead of each asking Slack (`usergroups.list` is a Tier 2 method). Its
    age is read from the key's remaining time to live, Redis's clock, not the writer's.
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
        self.key = Keys(namespace).usergroups
        self.clock = clock
        self._by_user: dict[str, frozenset[str]] = {}
        self._fetched_at = -math.inf  # when the map we hold was asked of Slack (our clock)
        self._retry_at = -math.inf
        self._refreshing = False
        self._changed = threading.Condition()

    @property
    def reading(self) -> bool:
        """Is a read from Slack in flight (Slack slow rather than failing)?"""
        with self._changed:
            return self._refreshing

    def handles_of(self, user_id: str, *, wait: float = WAIT_SECONDS) -> frozenset[str]:
        """The "@handle"s of the groups `user_id` belongs to. Raises RolesUnavailable."""
        return self._current(wait).get(user_id, frozenset())

    def members_of(self, handle: str) -> frozenset[str]:
        """The users in the group "@handle" (for DMs to approvers). Raises RolesUnavailable."""
        current = self._current(WAIT_SECONDS)
        return frozenset(u for u, handles in current.items() if handle in handles)

    def _current(self, wait: float) -> dict[str, frozenset[str]]:
        """The map: within the bound, or read from Slack after this call began."""
        arrived = self.clock()
        deadline = time.monotonic() + wait
        with self._changed:
            while True:
                now = self.clock()
                if now - self._fetched_at >= self.ttl / 2:
                    self._load_shared(now)
                if (
                    now - self._fetched_at >= self.ttl / 2
                    and not self._refreshing
                    and now >= self._retry_at
                ):
                    self._refreshing = True
                    threading.Thread(target=self._refresh, name="usergroups", daemon=True).start()
                if now - self._fetched_at <= self.ttl or self._fetched_at >= arrived:
                    return self._by_user
                left = deadline - time.monotonic()
                if not self._refreshing or left <= 0:
                    age = now - self._fetched_at
                    raise RolesUnavailable(
                        "Slack's user groups could not be read (usergroups.list) for "
                        f"{'ever' if math.isinf(age) else f'{age:.0f} s'}; the bound is "
                        f"{self.ttl:.0f} s"
                    )
                self._changed.wait(left)

    def _refresh(self) -> None:
        """Ask Slack (in a background thread, no lock held), then publish what it said."""
        started = self.clock()
        by_user: dict[str, frozenset[str]] | None = None
        try:
            by_user = {user: frozenset(handles) for user, handles in self._fetch().items()}
        except (SlackClientError, OSError) as exc:
            log.warning("usergroups_unavailable", error=str(exc)[:300])
        except Exception:  # a thread of our own: nothing else would log it
            log.exception("usergroups_refresh_failed")
        with self._changed:
            if by_user is None:
                self._retry_at = self.clock() + RETRY_SECONDS
            elif started > self._fetched_at:
                self._by_user, self._fetched_at = by_user, started
            self._refreshing = False
            self._changed.notify_all()
        if by_user is not None:
            self._save_shared(by_user)

    def _load_shared(self, now: float) -> None:
        if self.shared is None:
            return
        try:
            pipe = self.shared.pipeline(transaction=False)
            pipe.get(self.key)
            pipe.pttl(self.key)
            raw, left_ms = pipe.execute()
            if raw is None or left_ms <= 0:
                return
            fetched_at = now - max(0.0, self.ttl - left_ms / 1000)
            if fetched_at <= self._fetched_at:
                return
            stored = json.loads(raw)
            by_user = {str(u): frozenset(map(str, h)) for u, h in stored["users"].items()}
        except (redis.RedisError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("usergroups_shared_unreadable", error=str(exc)[:300])
            return
        self._by_user, self._fetched_at = by_user, fetched_at

    def _save_shared(self, by_user: dict[str, frozenset[str]]) -> None:
        if self.shared is None or self.ttl <= 0:
            return
        users = {user: sorted(handles) for user, handles in by_user.items()}
        raw = json.dumps({"users": users}, separators=(",", ":"))
        if len(raw) > SHARED_MAX_BYTES:
            return
        try:
            self.shared.set(self.key, raw, px=int(self.ttl * 1000))
        except Exception as exc:  # only a cache: Slack's answer is already in use here
            log.warning("usergroups_shared_unwritable", error=brief(exc))

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
    """Builds the Requester for a verified Slack user: their roles (worker.service.Access)
    from their Slack user groups and whether they come from another organization."""

    def __init__(self, rt: Runtime, groups: UserGroups, home: Home | None = None) -> None:
        self.rt = rt
        self.groups = groups
        self.home = home
        self._waiters = threading.BoundedSemaphore(WAITERS)

    def roles(
        self, user_id: str, team_id: str = "", *, wait: float = WAIT_SECONDS
    ) -> frozenset[str]:
        """The policy roles of `user_id`, whose own team is `team_id` ("" = unknown: the
        workspace the request came from). Raises RolesUnavailable; `wait`: how long to wait
        for Slack when the cached groups are past their bound (a modal's answer must come
        within 3 s)."""
        external = self.home is not None and self.home.is_external(team_id)
        if external or not Access.of(self.rt).names_groups or wait <= 0:
            return self._roles(user_id, external, wait)
        if not self._waiters.acquire(timeout=WAITER_QUEUE_SECONDS):
            log.info("usergroups_waiters_full", user=user_id)
            return self._roles(user_id, external, 0.0)  # what is cached, or RolesUnavailable
        try:
            return self._roles(user_id, external, wait)
        finally:
            self._waiters.release()

    def current_roles(self, requester: Requester) -> frozenset[str]:
        """The roles of a run's requester now (the worker's re-check before each step).
        Whether they are external was settled when the run started, from Slack's signed
        payload. Raises RolesUnavailable."""
        return self._roles(requester.user_id, EXTERNAL in requester.roles, WAIT_SECONDS)

    def _roles(self, user_id: str, external: bool, wait: float) -> frozenset[str]:
        access = Access.of(self.rt)
        if external:  # only what the policy names them for: no user groups of ours
            return access.roles(user_id, external=True)
        handles: Iterable[str] = (
            self.groups.handles_of(user_id, wait=wait) if access.names_groups else ()
        )
        return access.roles(user_id, handles)

    def requester(self, user_id: str, team_id: str, channel_id: str) -> Requester:
        """Who asks a question. While Slack is slow to list groups (a read in flight), the
        roles the policy gives the user by id: nothing is authorised with them, since the
        run asks for the current roles before its first step (and stops when they cannot be
        confirmed). Raises RolesUnavailable when Slack cannot be asked."""
        try:
            roles = self.roles(user_id, team_id, wait=QUESTION_ROLES_WAIT)
        except RolesUnavailable:
            if not self.groups.reading:  # Slack said no: the asker is told now, as before
                raise
            log.info("question_roles_deferred", user=user_id)
            roles = Access.of(self.rt).roles(user_id)
        return Requester(
            user_id=user_id, team_id=team_id, channel_id=channel_id, roles=sorted(roles)
        )
