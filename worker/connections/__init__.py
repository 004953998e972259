"""Per-user connections: a person's own OAuth grant for a provider, so a tool acts as them.

- `store`: grants and flows in Redis, encrypted at rest (`cryptography`'s MultiFernet: the
  first key encrypts, every key decrypts, so keys rotate without a migration).
- `oauth`: the OAuth 2.1 authorization-code flow with PKCE against a provider: the
  authorization URL, the code exchange, refresh, revocation, and the discovery and dynamic
  registration a remote MCP server that requires OAuth publishes.

The use cases (connect, complete, confirm, list, revoke, the token for a call) are
worker/service/connections.py.
"""

from worker.connections.oauth import Provider, ProviderDown, ProviderRefused
from worker.connections.store import ConnectionStore, Flow, Grant, Pending

__all__ = [
    "ConnectionStore",
    "Flow",
    "Grant",
    "Pending",
    "Provider",
    "ProviderDown",
    "ProviderRefused",
]
