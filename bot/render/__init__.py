"""Pure builders of what Slack shows: Block Kit for messages, cards, the batch card, the
Edit form, modals, App Home, event text, mrkdwn, and every string (`messages`)."""
