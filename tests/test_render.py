"""Terminal text: Slack markup in answers is shown as plain text."""

from __future__ import annotations

import pytest

from switchboard.render import plain


@pytest.mark.parametrize(
    ("slack", "terminal"),
    [
        ("Hello <@console:root>, done.", "Hello @console:root, done."),
        ("Ask <@U0ALICE|alice> or <!subteam^S1|@support>.", "Ask @alice or @support."),
        ("In <#C0001|general> and <#C0002>.", "In #general and #C0002."),
        (
            "<!here> read <https://x.io/a|the docs> or <https://y.io>",
            "@here read the docs (https://x.io/a) or https://y.io",
        ),
        ("Mail <mailto:a@b.io|a@b.io>", "Mail a@b.io"),
        ("*INR 4998* and _soon_, ~not~ **Markdown**", "INR 4998 and soon, not Markdown"),
        ("a &lt;b&gt; &amp; c", "a <b> & c"),
        (
            "create_ticket, 2*3*4 and snake_case_names stay",
            "create_ticket, 2*3*4 and snake_case_names stay",
        ),
        ("`<@U1> *x*` is code", "`<@U1> *x*` is code"),
        ("x < y and <not markup>", "x < y and <not markup>"),
    ],
)
def test_slack_markup_reads_as_plain_text(slack, terminal):
    assert plain(slack) == terminal
