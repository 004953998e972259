"""DMs to the people who may decide a pending approval: a reminder (`remind_after`) or an
escalation (`escalate_to` after `escalate_after`), with a link to the card.

Called from the worker (worker.reminders) through `SlackSurface.approval_reminder`. The
people are the members of the roles the policy names: Slack user ids, and the members of
`@usergroup` handles (read with `usergroups.list`). The requester is told only when they
may decide their own call (self-approval).
"""

from __future__ import annotations

import structlog
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from approvals import ApprovalRequest
from bot.render import messages as m
from bot.render.mrkdwn import date, escape, mention
from bot.state.identity import UserGroups
from bot.transport import ids
from worker.roles import RolesUnavailable
from worker.service.approvals import Deciders

log = structlog.get_logger(__name__)

MAX_DMS = 50  # people told about one request, at most


def recipients(deciders: Deciders, groups: UserGroups, requester: str) -> list[str]:
    """Who to DM: the people the policy names, and the members of its user groups."""
    people = set(deciders.users)
    for group in deciders.groups:
        try:
            people |= groups.members_of(group)
        except RolesUnavailable as exc:  # a reminder is best effort; the card stands
            log.warning("reminder_group_unavailable", group=group, error=str(exc))
    if deciders.not_requester:
        people.discard(requester)
    return sorted(p for p in people if ids.shaped(ids.USER, p))[:MAX_DMS]


def card_link(client: WebClient, request: ApprovalRequest) -> str:
    for card in request.cards:
        try:
            found = client.chat_getPermalink(channel=card["channel"], message_ts=card["ts"])
        except SlackApiError as exc:
            log.info("card_link_unavailable", error=exc.response.get("error"))
            continue
        link = str(found.get("permalink") or "")
        if link.startswith("https://") and not any(c in link for c in "<>|"):
            return link
    return ""


def remind(
    client: WebClient,
    deciders: Deciders,
    groups: UserGroups,
    request: ApprovalRequest,
    *,
    escalated: bool,
) -> list[str]:
    """Send the DMs; returns who was told."""
    people = recipients(deciders, groups, request.requester)
    if not people:
        return []
    link = card_link(client, request)
    where = m.REMIND_LINK.format(link=link) if link else m.REMIND_NO_LINK
    template = m.ESCALATED_DM if escalated else m.REMIND_DM
    text = template.format(
        user=mention(request.requester),
        tool=escape(request.tool),
        expires=date(request.expires_at),
        where=where,
    )
    told = []
    for person in people:
        try:
            client.chat_postMessage(channel=person, text=text, unfurl_links=False)
            told.append(person)
        except SlackApiError as exc:  # one person unreachable must not stop the rest
            log.info("reminder_not_sent", user=person, error=exc.response.get("error"))
    log.info("approval_reminder_sent", approval_id=request.id, escalated=escalated, told=len(told))
    return told
