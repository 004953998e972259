"""Every Redis key Switchboard writes, in one map, under one namespace (default `sb:`).

The approval keys come from `approvals.keys` (that package sits below this one); RQ's own
keys (`rq:*`) are RQ's. Each store takes its keys from here, so a key's shape is written once.
"""

from __future__ import annotations

from approvals.keys import ApprovalKeys
from worker.run import RunStatus


class Keys(ApprovalKeys):
    # -- a run -----------------------------------------------------------------------------
    def run(self, run_id: str) -> str:
        """String: the run document (JSON)."""
        return f"{self.ns}run:{run_id}"

    def lease(self, run_id: str) -> str:
        """The worker that holds the run (a fencing token) and until when."""
        return f"{self.ns}run:{run_id}:lease"

    def queued(self, run_id: str) -> str:
        """The id of the RQ job that will advance the run (the sweeper checks it exists)."""
        return f"{self.ns}run:{run_id}:queued"

    def cancel(self, run_id: str) -> str:
        """Who asked to cancel the run."""
        return f"{self.ns}run:{run_id}:cancel"

    def untold(self, run_id: str) -> str:
        """Set as the run is saved as ended; gone once the person was told (the lease's
        release drops it): a worker that finds the run ended with it still there says it."""
        return f"{self.ns}run:{run_id}:untold"

    def untold_hold(self, run_id: str) -> str:
        """Set while a worker says a run late (`RunStore.claim_untold`); lapses on its own."""
        return f"{self.ns}run:{run_id}:untold:hold"

    def recovered(self, run_id: str) -> str:
        """Counter: how many times the sweeper queued the run again (its worker stopped, or
        Redis failed, under it)."""
        return f"{self.ns}run:{run_id}:recovered"

    def events(self, run_id: str) -> str:
        """List: the run's append-only event log."""
        return f"{self.ns}run:{run_id}:events"

    # -- indexes of runs -------------------------------------------------------------------
    def status(self, status: RunStatus) -> str:
        return f"{self.ns}runs:status:{status.value}"

    def user_runs(self, user_id: str) -> str:
        return f"{self.ns}runs:user:{user_id}"

    @property
    def all_runs(self) -> str:
        return f"{self.ns}runs:all"

    @property
    def due(self) -> str:
        """Sorted set: runs to queue now (woken by a decision, admitted from a line)."""
        return f"{self.ns}runs:due"

    # -- people ----------------------------------------------------------------------------
    def person(self, user_id: str, what: str) -> str:
        """Per-person limits: `active`, `waiting`, `rate`, `spend:{day}`."""
        return f"{self.ns}user:{user_id}:{what}"

    @property
    def lines(self) -> str:
        """Set: people who may have questions waiting in their line (the sweeper drains them,
        and drops those whose line is empty)."""
        return f"{self.ns}users:waiting"

    def reminders_sent(self, approval_id: str) -> str:
        """Counter: reminders sent for the card whose first request this is."""
        return f"{self.ns}reminded:{approval_id}"

    # -- the task library ------------------------------------------------------------------
    @property
    def demos_stored(self) -> str:
        return f"{self.ns}demos:stored"

    @property
    def demos_usage(self) -> str:
        return f"{self.ns}demos:usage"

    @property
    def demos_version(self) -> str:
        return f"{self.ns}demos:version"

    def embedding(self, digest: str) -> str:
        return f"{self.ns}emb:{digest}"

    # -- MCP servers -----------------------------------------------------------------------
    def mcp_listing(self, server: str) -> str:
        """The first listing of an MCP server (by its key in the servers file), fixed for the
        deployment: each tool's name and a digest of its schema and annotations (JSON)."""
        return f"{self.ns}mcp:{server}:listing"

    def mcp_changed(self, server: str) -> str:
        """Set once a listing of the server differed: which tools, and how (JSON)."""
        return f"{self.ns}mcp:{server}:changed"

    # -- Slack -----------------------------------------------------------------------------
    def slack_event(self, event_id: str) -> str:
        """One delivery per Slack event id."""
        return f"{self.ns}slack:event:{event_id}"

    def slack_thread(self, channel: str, thread_ts: str) -> str:
        """The last run answered in a thread."""
        return f"{self.ns}slack:thread:{channel}:{thread_ts}"

    def slack_assistant(self, channel: str, thread_ts: str) -> str:
        return f"{self.ns}slack:assistant:{channel}:{thread_ts}"

    def slack_revoked(self, team: str) -> str:
        """A workspace whose installation is gone (tokens_revoked, app_uninstalled)."""
        return f"{self.ns}slack:revoked:{team}"

    def slack_answer(self, run_id: str) -> str:
        """The message an answer is streaming into (retired by the next worker if left)."""
        return f"{self.ns}slack:answer:{run_id}"

    @property
    def usergroups(self) -> str:
        """The cached map of Slack user groups (shared by every process)."""
        return f"{self.ns}usergroups"

    # -- per-user connections (worker/connections/store.py) --------------------------------
    def connection(self, team: str, user: str, provider: str) -> str:
        """String: one person's grant for one provider, encrypted."""
        return f"{self.ns}conn:{team}:{user}:{provider}"

    def connection_issuer(self, team: str, user: str, provider: str) -> str:
        """String: the redirect URI a person's grant was issued through, when it is not the
        public callback (the client registered for it alone may refresh the grant)."""
        return f"{self.ns}conn-issuer:{team}:{user}:{provider}"

    def connections_of(self, team: str, user: str) -> str:
        """Set: the providers a person has connected."""
        return f"{self.ns}conns:{team}:{user}"

    def connected_people(self, team: str) -> str:
        """Set: the people of a workspace with a connection (to drop them on uninstall)."""
        return f"{self.ns}conns:{team}"

    def oauth_flow(self, state_digest: str) -> str:
        """String with a TTL: a started flow, by the digest of its `state`, encrypted."""
        return f"{self.ns}oauth:flow:{state_digest}"

    def oauth_pending(self, code_digest: str) -> str:
        """String with a TTL: a finished flow waiting for its person, encrypted."""
        return f"{self.ns}oauth:pending:{code_digest}"

    def oauth_wanted(self, team: str, user: str, provider: str) -> str:
        """String with a TTL: scopes a service asked a person's connection for (step-up),
        for their next Connect to ask for too, encrypted."""
        return f"{self.ns}oauth:wanted:{team}:{user}:{provider}"

    def oauth_attempts(self, team: str, user: str) -> str:
        """Counter with a TTL: finishing codes a person entered."""
        return f"{self.ns}oauth:attempts:{team}:{user}"

    def resumed(self, run_id: str) -> str:
        """String with a TTL: the run that waited for a connection was resumed (SET NX)."""
        return f"{self.ns}run:{run_id}:resumed"

    def oauth_client(self, provider: str, redirect_digest: str = "") -> str:
        """String: the client an MCP server's authorization server registered us as,
        encrypted: for the public callback (the key every release has used), or for another
        redirect URI (the console's loopback one), by its digest."""
        if not redirect_digest:
            return f"{self.ns}oauth:client:{provider}"
        return f"{self.ns}oauth:client:{provider}:{redirect_digest}"
