"""DMs to the people who may decide pending approvals: a reminder (`remind_after`) or an
escalation (`escalate_to` after `escalate_after`), with a link to the card.

Called from the worker (worker.reminders) through `SlackSurface.approval_reminders`, once per
card: each person gets one DM naming the calls of that card they may decide, not one per
call. The people are the members of the roles the policy names: Slack user ids, and the
members of `@usergroup` handles (read with `usergroups.list`). The requester is told only
when they may decide their own call (self-approval). On top of that, `may_tell` caps the
DMs per person (SlackSurface: one reminder and one escalation per person a minute), so
however many cards one person makes the bot post, an approver is not flooded; what the cap
holds back is sent as one digest when the minute is over
(`bot.outbound.slack_surface.send_digest`, an RQ job).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from approvals import ApprovalRequest
from bot.render import messages as m
from bot.render.mrkdwn import cut, date, escape, mention
from bot.state.identity import UserGroups
from bot.transport import ids
from worker.roles import RolesUnavailable
from worker.service.approvals import Deciders

log = structlog.get_logger(__name__)

MAX_DMS = 50  # people told about one card, at most
DIGEST_CARDS = 5  # cards a digest links to; the rest are counted (App Home lists them all)
DIGEST_HELD = 200  # requests held for one person's digest, at most
# seconds: at most one reminder DM and one escalation DM per person in this long, however many
# cards wait for them (App Home lists them all)
REMINDER_INTERVAL = 60


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
    deciders_of: Callable[[ApprovalRequest], Deciders],
    groups: UserGroups,
    requests: list[ApprovalRequest],
    *,
    escalated: bool,
    may_tell: Callable[[str], bool] = lambda person: True,
    hold: Callable[[str, list[ApprovalRequest]], None] = lambda person, requests: None,
) -> list[str]:
    """Send the DMs for the requests of one card: one per person, naming the calls that
    person may decide; when `may_tell(person)` is False (capped), the calls are passed to
    `hold` for that person's next digest instead. Returns who was told."""
    if not requests:
        return []
    theirs: dict[str, list[ApprovalRequest]] = {}
    for request in requests:
        for person in recipients(deciders_of(request), groups, request.requester):
            theirs.setdefault(person, []).append(request)
    if not theirs:
        return []
    link = card_link(client, requests[0])
    where = m.REMIND_LINK.format(link=link) if link else m.REMIND_NO_LINK
    told, capped = [], 0
    for person in sorted(theirs)[:MAX_DMS]:
        if not may_tell(person):
            capped += 1
            hold(person, theirs[person])
            continue
        try:
            client.chat_postMessage(
                channel=person, text=dm_text(theirs[person], where, escalated), unfurl_links=False
            )
            told.append(person)
        except SlackApiError as exc:  # one person unreachable must not stop the rest
            log.info("reminder_not_sent", user=person, error=exc.response.get("error"))
    log.info(
        "approval_reminder_sent",
        approval_id=requests[0].id,
        calls=len(requests),
        escalated=escalated,
        told=len(told),
        capped=capped,
    )
    return told


def dm_text(requests: list[ApprovalRequest], where: str, escalated: bool) -> str:
    first = requests[0]
    expires = date(min(r.expires_at for r in requests))
    if len(requests) == 1:
        template = m.ESCALATED_DM if escalated else m.REMIND_DM
        return template.format(
            user=mention(first.requester), tool=escape(first.tool), expires=expires, where=where
        )
    names = list(dict.fromkeys(r.tool for r in requests))
    template = m.ESCALATED_DM_CALLS if escalated else m.REMIND_DM_CALLS
    return template.format(
        user=mention(first.requester),
        count=len(requests),
        tools=cut(escape(", ".join(names)), 300),
        expires=expires,
        where=where,
    )


def digest_text(client: WebClient, requests: list[ApprovalRequest], escalated: bool) -> str:
    """One DM for the calls held back from a person by the cap: each card once, with a link."""
    by_card: dict[str, list[ApprovalRequest]] = {}
    for request in requests:
        card = request.cards[0] if request.cards else {}
        by_card.setdefault(f"{card.get('channel')}:{card.get('ts')}", []).append(request)
    lines = []
    for group in list(by_card.values())[:DIGEST_CARDS]:
        link = card_link(client, group[0])
        names = ", ".join(dict.fromkeys(r.tool for r in group))
        lines.append(
            m.DIGEST_LINE.format(
                count=len(group),
                tools=cut(escape(names), 200),
                user=mention(group[0].requester),
                where=m.REMIND_LINK.format(link=link) if link else m.REMIND_NO_LINK,
            )
        )
    if len(by_card) > DIGEST_CARDS:
        lines.append(m.DIGEST_MORE.format(count=len(by_card) - DIGEST_CARDS))
    head = m.DIGEST_ESCALATED if escalated else m.DIGEST_HEAD
    return head.format(count=len(requests)) + "\n" + "\n".join(lines)
