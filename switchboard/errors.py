"""Configuration problems, worded for the operator, all in one place.

Every one is a single line, `switchboard: <what is wrong> (<where>); <how to fix>`, printed
by the command line without a traceback (`--debug` shows it) and exit status 2; 75 for a
Redis that did not answer a service's wait (`RedisUnavailable`), which a restart may mend.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError

from switchboard import sentinel_url
from tools.exceptions import OperatorError

SLACK_SECTION = "README.md, 'In Slack'"

# How to fix a bad value, per environment variable; others get "unset it for the default".
HINTS = {
    "REDIS_URL": (
        "use redis://HOST:6379/0, rediss://HOST:6380/0, unix:///path/to/redis.sock or "
        "redis+sentinel://HOST:26379,HOST2:26379/SERVICE/0, or unset it for the embedded Redis"
    ),
    "SWITCHBOARD_PRICES": (
        'set it to JSON such as {"gpt-4.1-mini": [0.4, 1.6]} (USD per 1M input and output '
        "tokens) or to the path of a file holding it, or unset it for the built-in table"
    ),
    "SWITCHBOARD_LOG_FORMAT": "use console or json",
    "SWITCHBOARD_DEMOS_AS": "use messages or text",
    "SWITCHBOARD_DEMO_SELECTOR": "use bm25 or embeddings",
}
_SECRET_PARTS = ("TOKEN", "SECRET", "KEY", "PASSWORD")


class CliError(OperatorError):
    """A problem the operator can fix; printed without a traceback."""


class ConfigError(OperatorError):
    """One configuration problem: what is wrong, where, and how to fix it."""

    def __init__(self, what: str, where: str, fix: str) -> None:
        super().__init__(f"{what} ({where}); {fix}")


CONFIG_EXIT = 2  # main()'s exit status for a configuration problem: no restart mends it
UNAVAILABLE_EXIT = 75  # EX_TEMPFAIL: Redis did not answer; a restart may find it back


class RedisUnavailable(ConfigError):
    """A Redis that did not answer within the bot's or a worker's start-up wait (nothing
    listening, no answer, no primary named): said as the others, but with exit status 75
    (EX_TEMPFAIL), since it may answer later: `worker --processes` and `dev` restart such a
    child with back-off, where exit status 2 stops them all. Not for what no wait mends (a
    refused password, a certificate not trusted), nor for a command that does not wait."""


def settings_errors(exc: ValidationError, defaults: dict[str, Any]) -> list[str]:
    """One line per invalid environment variable, naming it (pydantic's `loc` is the alias)."""
    lines = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "the configuration"
        message = str(error["msg"]).removeprefix("Value error, ")
        message = message[:1].lower() + message[1:]
        value = shown(name, error.get("input"))
        default = defaults.get(name)
        fix = HINTS.get(name) or (
            f"unset it to use the default ({default})" if default not in (None, "") else "fix it"
        )
        lines.append(f"switchboard: {name}={value} is not valid: {message} ({origin(name)}); {fix}")
    return lines


def origin(name: str) -> str:
    """Where a setting came from: the environment wins over a .env file."""
    if name in os.environ or not Path(".env").is_file():
        return "environment"
    return f".env in {Path.cwd()}"


def shown(name: str, value: Any) -> str:
    """A value as it may be printed: never a credential, never a password inside a URL."""
    if any(part in name.upper() for part in _SECRET_PARTS):
        return "[hidden]"
    text = str(value)
    return redact_url(text) if "://" in text else repr(text) if " " in text else text


def redact_url(url: str) -> str:
    """The URL with its password (in the address, or a `password=` of the query) as ***."""
    if sentinel_url.is_sentinel(url):
        try:
            return sentinel_url.parse(url).redacted()
        except ValueError:
            return "[a URL that does not parse]"
    try:
        parts = urlsplit(url)
        password, port = parts.password, parts.port
    except ValueError:  # not a URL that splits (a bad port...): show nothing of it
        return "[a URL that does not parse]"
    shown = parts
    if password is not None:
        host = parts.hostname or ""
        netloc = f"{parts.username or ''}:***@{host}" + (f":{port}" if port else "")
        shown = shown._replace(netloc=netloc)
    if parts.query:
        query = [
            f"{key}=***" if key.lower() == "password" else f"{key}={value}" if sep else key
            for key, sep, value in (field.partition("=") for field in parts.query.split("&"))
        ]
        shown = shown._replace(query="&".join(query))
    if shown == parts:
        return url
    text = urlunsplit(shown)
    if not shown.netloc and url.startswith(f"{parts.scheme}://"):  # unix:///path keeps its //
        text = f"{parts.scheme}://" + text.removeprefix(f"{parts.scheme}:")
    return text


# -- Redis ---------------------------------------------------------------------------------


def redis_unreachable(url: str, reason: str, *, temporary: bool = False) -> ConfigError:
    """`temporary`: a service waited for it (`RedisUnavailable`); the embedded Redis failing
    to start is lasting."""
    where = f"REDIS_URL={redact_url(url)}" if url else "the embedded Redis"
    fix = (
        "start Redis there or fix REDIS_URL; unset REDIS_URL to use the embedded Redis"
        if url
        else "check that the data directory is writable (XDG_DATA_HOME)"
    )
    kind = RedisUnavailable if temporary and url else ConfigError
    return kind(f"cannot reach Redis: {reason}", where, fix)


def redis_no_primary(url: str, reason: str, *, temporary: bool = False) -> ConfigError:
    kind = RedisUnavailable if temporary else ConfigError
    return kind(
        f"no Sentinel names a primary: {reason}",
        f"REDIS_URL={redact_url(url)}",
        "check the Sentinels' addresses and the service name after them (the name of their "
        "`sentinel monitor NAME HOST PORT QUORUM` line), and their password "
        "(`?sentinel_password=`)",
    )


def redis_replica(url: str, reason: str, *, temporary: bool = False) -> ConfigError:
    kind = RedisUnavailable if temporary else ConfigError
    return kind(
        f"Redis is a replica, not the primary: {reason}",
        f"REDIS_URL={redact_url(url)}",
        "point REDIS_URL at the primary (a managed Redis's primary endpoint, not its reader "
        "endpoint), or at its Sentinels (redis+sentinel://HOST:26379/SERVICE/0) so that a "
        "failover is followed",
    )


def redis_url_required() -> ConfigError:
    return ConfigError(
        "REDIS_URL is not set, and SWITCHBOARD_REQUIRE_REDIS_URL refuses the embedded Redis",
        "environment",
        "set REDIS_URL to the Redis every process shares (redis://:PASSWORD@HOST:6379/0); an "
        "embedded Redis is one per machine, so bots and workers would not see each other",
    )


def redis_no_database(url: str, databases: int | None) -> ConfigError:
    have = f"0 to {databases - 1}" if databases else "0 to 15 by default"
    return ConfigError(
        "Redis has no such database number",
        f"REDIS_URL={redact_url(url)}",
        f"use a database from {have} (the number after the last / of a redis:// URL, or "
        "?db= of a unix:// one)",
    )


def redis_refused(url: str, reason: str) -> ConfigError:
    return ConfigError(
        f"Redis refused the connection: {reason}",
        f"REDIS_URL={redact_url(url)}",
        "put the right user and password in the URL: redis://USER:PASSWORD@HOST:6379/0",
    )


def redis_not_permitted(url: str, reason: str) -> ConfigError:
    return ConfigError(
        f"Redis refused a command to this user: {reason}",
        f"REDIS_URL={redact_url(url)}",
        "let the URL's user run every command on every key and channel: "
        "ACL SETUSER USER on >PASSWORD ~* &* +@all (Switchboard and RQ use strings, lists, "
        "sorted sets, hashes, scripts and pub/sub)",
    )


# -- Slack -----------------------------------------------------------------------------------


def slack_missing(names: list[str]) -> ConfigError:
    return ConfigError(
        "the Slack bot needs " + " and ".join(names),
        "environment or .env",
        f"set them as {SLACK_SECTION} shows, or use `switchboard chat` without Slack",
    )


def example_placeholder(names: list[str]) -> ConfigError:
    verb = "is" if len(names) == 1 else "are"
    return ConfigError(
        f"{' and '.join(names)} {verb} still the example placeholder from .env.example",
        origin(names[0]),
        f"put the real {'value' if len(names) == 1 else 'values'} in, as {SLACK_SECTION} shows",
    )


def slack_token_shape(name: str, prefix: str, value: str) -> ConfigError:
    other = {
        "SLACK_BOT_TOKEN": "the app-level xapp- token goes in SLACK_APP_TOKEN",
        "SLACK_APP_TOKEN": "the bot's xoxb- token goes in SLACK_BOT_TOKEN",
    }[name]
    return ConfigError(
        f"{name} does not look like a {prefix} token (it starts with {value[:5]!r})",
        "environment or .env",
        f"copy the {prefix} token as {SLACK_SECTION} shows; {other}",
    )


def slack_rejected(name: str, error: str) -> ConfigError:
    fix = {
        "SLACK_BOT_TOKEN": "copy the Bot User OAuth Token (xoxb-) from the app's OAuth & "
        "Permissions page, and reinstall the app if it was revoked",
        "SLACK_APP_TOKEN": "create an app-level token (xapp-) with connections:write under "
        "Basic Information, and turn Socket Mode on",
    }[name]
    return ConfigError(
        f"Slack rejected {name}: {error}", "environment or .env", f"{fix} (see {SLACK_SECTION})"
    )


def slack_unreachable(url: str, reason: str) -> ConfigError:
    return ConfigError(
        f"cannot reach Slack: {reason}",
        f"SLACK_API_URL={url}",
        "check the network, or unset SLACK_API_URL for Slack's own",
    )


# -- processes -------------------------------------------------------------------------------


def child_failed(name: str) -> str:
    return (
        f"switchboard: {name} stopped with a configuration error (its message is above); "
        "stopping everything: fix it and start again"
    )


def worker_failed(code: int, last_line: str) -> ConfigError:
    return ConfigError(
        f"the console's worker stopped (exit {code}): {last_line or 'no message'}",
        "its log",
        "fix what it says and run `switchboard chat` again",
    )
