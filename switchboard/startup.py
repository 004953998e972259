"""What a long-running process (the bot, a worker) checks once at start-up, after its
runtime is built: checks that warn, for what may come up later, and never stop it."""

from __future__ import annotations

from worker.model import ModelClient
from worker.runtime import Runtime


def check_model(rt: Runtime) -> bool:
    """One request to the model server (GET /models): a warning naming its host when it
    cannot be reached, refuses, or does not list the configured model. False then."""
    if isinstance(rt.model, ModelClient):
        return rt.model.check()
    return True


def load_connections_sdk(rt: Runtime) -> None:
    """With per-user connections configured, the SDK their OAuth steps use is imported now
    (~0.4 s), not inside the first connect click or token refresh; commands that only read
    (`runs list`...) do not pay it."""
    if rt.connections is not None:
        from worker.connections.oauth import load_sdk

        load_sdk()
