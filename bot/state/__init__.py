"""What the bot keeps about Slack: who people are (user groups into roles), which
workspaces it serves and is installed in, which thread holds which run."""
