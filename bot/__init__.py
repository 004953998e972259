"""Switchboard's Slack surface: the Bolt app (`bot.serve`), its listeners, Block Kit
rendering and `SlackSurface`, the worker's view of Slack. Depends on worker/, approvals/ and
tools/, never on switchboard/."""
