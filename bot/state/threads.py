"""What the bot remembers about Slack in Redis: deliveries it has seen, and the threads it
answered in (so a reply continues that conversation).

Keys: `{ns}slack:event:{event_id}` (one delivery per event, 1 h),
`{ns}slack:thread:{channel}:{thread_ts}` (the thread's last run id),
`{ns}slack:assistant:{channel}:{thread_ts}` (an assistant thread).
"""

from __future__ import annotations

import redis

from worker.keys import Keys

EVENT_TTL = 3600  # Slack retries for about 5 minutes; an hour covers redeliveries too


class Threads:
    def __init__(self, connection: redis.Redis, namespace: str = "sb:", ttl: int = 30 * 86400):
        self.redis = connection
        self.ns = namespace
        self.keys = Keys(namespace)
        self.ttl = ttl

    def claim_event(self, event_id: str) -> bool:
        """True for the first delivery of an event, False for every retry or repeat."""
        return bool(self.redis.set(self.keys.slack_event(event_id), 1, nx=True, ex=EVENT_TTL))

    def release_event(self, event_id: str) -> None:
        """Give a claimed event back: its question could not be started, so a redelivery
        of it may start it."""
        self.redis.delete(self.keys.slack_event(event_id))

    def remember(self, channel: str, thread_ts: str, run_id: str) -> None:
        self.redis.set(self.keys.slack_thread(channel, thread_ts), run_id, ex=self.ttl)

    def last_run(self, channel: str, thread_ts: str) -> str | None:
        value = self.redis.get(self.keys.slack_thread(channel, thread_ts))
        return value.decode() if isinstance(value, bytes) else value

    def mark_assistant(self, channel: str, thread_ts: str) -> None:
        self.redis.set(self.keys.slack_assistant(channel, thread_ts), 1, ex=self.ttl)

    def is_assistant(self, channel: str, thread_ts: str) -> bool:
        return bool(self.redis.exists(self.keys.slack_assistant(channel, thread_ts)))
