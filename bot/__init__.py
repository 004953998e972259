"""Switchboard's Slack surface, laid out by what it does:

- `transport`: how Slack's requests arrive and are read (the servers, signature, envelope,
  payloads, ids, the slash command's text);
- `listeners`: every Bolt handler, each thin: parse, ask the use-case layer
  (worker.service), render the answer;
- `render`: pure Block Kit and text builders (cards, the batch card, the Edit form, modals,
  App Home, event text, mrkdwn, every string in `messages`);
- `outbound`: `SlackSurface`, what a run shows as it goes (status, cards, answers and their
  streams, reminder DMs);
- `state`: what the bot keeps about Slack (people's roles from their user groups, its
  installations, the threads it answered in).

Depends on worker/ (its use-case layer for everything a person asks), approvals/ and
tools/, never on switchboard/.
"""
