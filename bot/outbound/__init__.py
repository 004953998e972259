"""What a run shows in Slack as it goes (`worker.surface.Surface` for Slack): status,
cards, answers and their streams, reminder DMs, the update throttle."""
