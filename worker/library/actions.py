"""Whether a question asks for what a write tool does: a demonstration that writes is shown
only to a question that asks for its action, so a model is never shown how to open a ticket
when it was asked what a course costs (it copies what it is shown).

The action of a tool is read from its name: the first known verb in it (`create_ticket`
creates, `git_commit` commits, `cancel_order` cancels), else its first word
(`frobnicate_widget` frobnicates). A question asks for it when it has one of the verb's
words as written, in its plain form: "open a ticket", "please close ticket 23", "can you
update the priority". Not: "I opened one yesterday" (past) or "any open tickets?" (a word
that is a noun or an adjective as often, like "open", asks only when an article or a
pronoun follows: "open a", "open me one").
"""

from __future__ import annotations

import re

# A verb of tool names -> the words that ask for it.
ACTIONS: dict[str, frozenset[str]] = {
    verb: frozenset(words.split())
    for verb, words in {
        "create": "create open raise file log submit make",
        "open": "open create raise file log submit",
        "add": "add create insert",
        "close": "close resolve",
        "resolve": "resolve close",
        "update": "update change edit set modify bump raise lower escalate rename reassign move",
        "edit": "edit change update modify",
        "set": "set change update",
        "delete": "delete remove purge drop",
        "remove": "remove delete drop",
        "cancel": "cancel abort withdraw stop",
        "send": "send post email notify reply",
        "post": "post send",
        "assign": "assign reassign",
        "approve": "approve accept",
        "reject": "reject decline deny",
        "book": "book reserve schedule",
        "schedule": "schedule book",
        "order": "order buy purchase",
        "buy": "buy order purchase",
        "pay": "pay",
        "refund": "refund",
        "transfer": "transfer move",
        "invite": "invite add",
        "grant": "grant",
        "revoke": "revoke remove",
        "enable": "enable",
        "disable": "disable",
        "restart": "restart reboot",
        "deploy": "deploy release",
        "commit": "commit",
        "push": "push",
        "merge": "merge",
        "reset": "reset",
        "checkout": "checkout switch",
        "archive": "archive",
        "restore": "restore",
    }.items()
}
# Words that are nouns or adjectives as often as verbs ("any open tickets?", "my order", "add
# up"): they ask only when an article or a pronoun follows ("open a", "order me one").
_AMBIGUOUS_WORDS = "open file log order post set book drop add make switch"
_AMBIGUOUS = frozenset(_AMBIGUOUS_WORDS.split())
_DETERMINER_WORDS = (
    "a an the one me us him her them it this that these those another new my our your some"
)
_DETERMINERS = frozenset(_DETERMINER_WORDS.split())
_WORD = re.compile(r"[a-z]+")
_NAME_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def action_words(tool: str) -> frozenset[str]:
    """The words a question uses to ask for what `tool` does (see the module's docstring)."""
    parts = [p.lower() for p in _NAME_PART.findall(tool)]
    verb = next((p for p in parts if p in ACTIONS), None)  # cancel_order: cancel, not order
    return ACTIONS[verb] if verb else frozenset(parts[:1])


def asks_for(question: str, tool: str) -> bool:
    """Whether `question` asks for what `tool` does."""
    wanted = action_words(tool)
    words = _WORD.findall(question.lower()[:4000])
    for n, word in enumerate(words):
        if word not in wanted:
            continue
        following = words[n + 1] if n + 1 < len(words) else ""
        if word not in _AMBIGUOUS or following in _DETERMINERS:
            return True
    return False
