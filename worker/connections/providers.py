"""The named OAuth providers file (SWITCHBOARD_OAUTH_PROVIDERS), e.g. a GitHub OAuth app:

    providers:
      github:
        label: GitHub
        authorize_url: https://github.com/login/oauth/authorize
        token_url: https://github.com/login/oauth/access_token
        revoke_url: ""                       # GitHub revokes with a different API: leave out
        client_id: ${GITHUB_CLIENT_ID}
        client_secret: ${GITHUB_CLIENT_SECRET}
        scopes: [repo, read:user]

`${VAR}` comes from the environment (an unset one is an error). Every problem is reported
at once, naming the provider and the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from tools.exceptions import OperatorError
from tools.mcp.config import expand
from worker.connections.oauth import Provider

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
REQUIRED = ("authorize_url", "token_url", "client_id")
KNOWN = (*REQUIRED, "label", "client_secret", "revoke_url", "scopes", "resource")


class ProvidersError(OperatorError, ValueError):
    """The providers file is invalid; the message lists every problem."""


def read_providers(text: str, source: str, environ: Mapping[str, str]) -> dict[str, Provider]:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ProvidersError(f"{source}: not YAML ({error})") from None
    entries = document.get("providers") if isinstance(document, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise ProvidersError(f"{source}: add a `providers:` mapping of name -> provider")
    problems: list[str] = []
    found: dict[str, Provider] = {}
    for name, entry in entries.items():
        where = f"{source}: providers.{name}"
        if not isinstance(name, str) or not NAME.match(name):
            problems.append(f"{where}: use 1-40 lower-case letters, digits, '_' or '-'")
            continue
        if not isinstance(entry, dict):
            problems.append(f"{where} must be a mapping")
            continue
        values: dict[str, Any] = {}
        for key, value in entry.items():
            if key not in KNOWN:
                problems.append(f"{where}.{key} is not a provider key (known: {', '.join(KNOWN)})")
            elif key == "scopes":
                if not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
                    problems.append(f"{where}.scopes must be a list of text")
                else:
                    values["scopes"] = tuple(value)
            elif not isinstance(value, str):
                problems.append(f"{where}.{key} must be text")
            else:
                text_value, missing = expand(value, environ)
                if missing:
                    problems.append(f"{where}.{key} uses ${{{missing[0]}}}, which is not set")
                values[key] = text_value
        absent = [key for key in REQUIRED if not values.get(key)]
        if absent:
            problems.append(f"{where} needs {', '.join(absent)}")
            continue
        for key in ("authorize_url", "token_url", "revoke_url"):
            if values.get(key) and not str(values[key]).startswith(("https://", "http://")):
                problems.append(f"{where}.{key} must be an http(s) URL")
        values.setdefault("label", name)
        found[name] = Provider(name=name, **values)
    if problems:
        raise ProvidersError("\n".join(problems))
    return found
