"""Agent profiles: per-channel agents read from the policy file's `profiles:` section.

    profiles:
      it-help:
        channels: [C0ITHELP]          # DMs use the profile named `dm`, if there is one
        instructions: |               # or instructions_file: it-help.md
          You are Acme's IT help desk.
        tools: [create_ticket, "git_*"]
        model: gpt-4.1
        max_tokens: 1024              # the bound on one reply (SWITCHBOARD_MODEL_MAX_TOKENS)
        demos: it-demos.yaml

A profile only narrows: `tools` picks among the tools the asking user may call, it grants
nothing (`Profile.narrow`). Files (`instructions_file`, `demos`) resolve against the policy
file's folder. Problems are reported like every other policy problem: one line each, with
the file and the line.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from tools.registry import ToolRegistry
from tools.yaml_nodes import INT, STR, Invalid, is_null, suggest

DM = "dm"  # the profile direct messages use
PROFILE_KEYS = (
    "channels",
    "instructions",
    "instructions_file",
    "tools",
    "model",
    "max_tokens",
    "demos",
)
MAX_REPLY_TOKENS = 1_000_000  # a profile's `max_tokens`: more is a typo, not a model
MAX_INSTRUCTIONS_CHARS = 16_000  # an operator's text, sent with every model call

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_CHANNEL = re.compile(r"^[CGD][A-Z0-9]{2,}$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}$")
_GLOB_CHARS = frozenset("*?[")

Node = yaml.Node


@dataclass(frozen=True)
class Profile:
    """One per-channel agent. `tools` None: every tool the user may call."""

    name: str
    line: int = 0
    channels: tuple[str, ...] = ()
    instructions: str = ""
    tools: tuple[str, ...] | None = None  # tool names and shell-style patterns
    model: str | None = None
    max_tokens: int | None = None  # the bound on one reply; None: SWITCHBOARD_MODEL_MAX_TOKENS
    demos: Path | None = None
    demos_line: int = 0  # where `demos:` is, for problems found in that file

    def offers(self, tool_name: str) -> bool:
        """Does this profile keep the tool (if the user may call it at all)?"""
        return self.tools is None or any(
            fnmatch.fnmatchcase(tool_name, entry) for entry in self.tools
        )

    def narrow(self, allowed: Iterable[str]) -> list[str]:
        """Of the tools the user may call, those this profile keeps. Never adds one."""
        return [name for name in allowed if self.offers(name)]

    def to_json(self) -> dict[str, Any]:
        return {
            "channels": list(self.channels),
            "instructions": self.instructions,
            "tools": None if self.tools is None else list(self.tools),
            "model": self.model,
            "max_tokens": self.max_tokens,
            "demos": str(self.demos) if self.demos else None,
        }


class _Reader(Protocol):
    """What reading profiles needs of the policy file's reader (tools/policy_file.py)."""

    source: str
    registry: ToolRegistry

    def error(self, node: Node | None, message: str) -> None: ...

    def invalid(self, node: Node, message: str) -> Invalid: ...

    def mapping(
        self, node: Node, where: str, keys: tuple[str, ...] | None = None
    ) -> dict[str, tuple[Node, Node]]: ...

    def strings(self, node: Node, where: str, example: str) -> list[tuple[str, Node]]: ...

    def warn(self, line: int, message: str) -> None: ...


def read_profiles(reader: _Reader, node: Node) -> dict[str, Profile]:
    """The `profiles:` section; every problem is recorded on `reader`, naming its line."""
    profiles: dict[str, Profile] = {}
    claimed: dict[str, int] = {}  # channel id -> the line that first named it
    folder = Path(reader.source).parent
    for name, (key, value) in reader.mapping(node, "profiles").items():
        if not _NAME.match(name):
            reader.error(
                key, f"profile name {name!r} is invalid: use letters, digits, _ - . (up to 64)"
            )
            continue
        with suppress(Invalid):
            profile, channels = _profile(reader, name, key, value, folder)
            for channel, item in channels:
                if channel in claimed:
                    reader.error(
                        item,
                        f"profiles.{name}: channel {channel} is already named on line "
                        f"{claimed[channel]}; a channel belongs to one profile",
                    )
                else:
                    claimed[channel] = item.start_mark.line + 1
            profiles[name] = profile
    return profiles


def _profile(
    reader: _Reader, name: str, key: Node, node: Node, folder: Path
) -> tuple[Profile, list[tuple[str, Node]]]:
    where = f"profiles.{name}"
    entries = {} if is_null(node) else reader.mapping(node, where, PROFILE_KEYS)
    channels: list[tuple[str, Node]] = []
    fields: dict[str, Any] = {}
    for field, (_, value) in entries.items():
        with suppress(Invalid):
            if field == "channels":
                channels = _channels(reader, value, where, name)
                fields["channels"] = tuple(dict.fromkeys(c for c, _ in channels))
            elif field == "instructions":
                fields["instructions"] = _instructions(reader, value, f"{where}.instructions")
            elif field == "instructions_file":
                path = _file(reader, value, f"{where}.instructions_file", folder)
                fields["instructions"] = _instructions_file(reader, value, path, where)
            elif field == "tools":
                fields["tools"] = _tools(reader, value, where)
            elif field == "model":
                fields["model"] = _model(reader, value, where)
            elif field == "max_tokens":
                fields["max_tokens"] = _max_tokens(reader, value, where)
            elif field == "demos":
                fields["demos"] = _file(reader, value, f"{where}.demos", folder)
                fields["demos_line"] = value.start_mark.line + 1
    if "instructions" in entries and "instructions_file" in entries:
        reader.error(
            entries["instructions_file"][0],
            f"{where}: give instructions or instructions_file, not both",
        )
    if not channels and name != DM:
        reader.warn(
            key.start_mark.line + 1,
            f"{where}: names no channels, so only `--profile {name}` uses it (DMs use the "
            f"profile named '{DM}'); add channels: [C0123ABCD]",
        )
    return Profile(name=name, line=key.start_mark.line + 1, **fields), channels


def _text(reader: _Reader, node: Node, where: str, example: str) -> str:
    if not (isinstance(node, yaml.ScalarNode) and node.tag == STR) or not node.value.strip():
        raise reader.invalid(node, f"{where} must be a non-empty string, e.g. {example}")
    return str(node.value).strip()


def _channels(reader: _Reader, node: Node, where: str, name: str) -> list[tuple[str, Node]]:
    channels = []
    for channel, item in reader.strings(node, f"{where}.channels", "[C0123ABCD]"):
        if not _CHANNEL.match(channel):
            reader.error(
                item,
                f"{where}.channels: {channel!r} must be a Slack channel id like C0123ABCD, "
                f"not a #name" + (f" (DMs use the profile named '{DM}')" if name != DM else ""),
            )
        else:
            channels.append((channel, item))
    return channels


def _instructions(reader: _Reader, node: Node, where: str) -> str:
    text = _text(reader, node, where, "|\n    You are Acme's IT help desk.")
    if len(text) > MAX_INSTRUCTIONS_CHARS:
        raise reader.invalid(
            node,
            f"{where} is {len(text)} characters long; the limit is {MAX_INSTRUCTIONS_CHARS}",
        )
    return text


def _instructions_file(reader: _Reader, node: Node, path: Path, where: str) -> str:
    try:
        text = read_instructions(path)
    except InstructionsTooLong as exc:
        raise reader.invalid(node, f"{where}.instructions_file: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        message = f"{where}.instructions_file: cannot read {path}: {exc}"
        raise reader.invalid(node, message) from None
    return text


def _file(reader: _Reader, node: Node, where: str, folder: Path) -> Path:
    """A path relative to the policy file's folder (or absolute); it must exist."""
    value = _text(reader, node, where, "it-help.yaml")
    path = Path(value).expanduser()
    path = path if path.is_absolute() else folder / path
    if not path.is_file():
        raise reader.invalid(
            node, f"{where}: no such file: {path} (relative paths are read from {folder}/)"
        )
    return path


def _tools(reader: _Reader, node: Node, where: str) -> tuple[str, ...]:
    names = reader.registry.names()
    entries: list[str] = []
    for entry, item in reader.strings(node, f"{where}.tools", '[create_ticket, "git_*"]'):
        if not _GLOB_CHARS.isdisjoint(entry):
            if not any(fnmatch.fnmatchcase(name, entry) for name in names):
                reader.warn(
                    item.start_mark.line + 1,
                    f"{where}.tools: the pattern {entry!r} matches no registered tool",
                )
        elif reader.registry.get(entry) is None:
            reader.error(
                item,
                f"{where}.tools: unknown tool {entry!r}{suggest(entry, names)}; check the name "
                "or load its module",
            )
            continue
        entries.append(entry)
    return tuple(entries)


def _model(reader: _Reader, node: Node, where: str) -> str:
    model = _text(reader, node, f"{where}.model", "gpt-4.1")
    if not _MODEL.match(model):
        raise reader.invalid(node, f"{where}.model: {model!r} is not a model name")
    return model


def _max_tokens(reader: _Reader, node: Node, where: str) -> int:
    text = str(node.value) if isinstance(node, yaml.ScalarNode) and node.tag == INT else ""
    digits = text.isascii() and text.isdigit()  # not 0x10, 1_000, +5, nor `!!int ²`
    if not digits or not 1 <= int(text) <= MAX_REPLY_TOKENS:
        raise reader.invalid(
            node,
            f"{where}.max_tokens must be a whole number of tokens from 1 to "
            f"{MAX_REPLY_TOKENS:,}, e.g. 1024",
        )
    return int(text)


class InstructionsTooLong(ValueError):
    pass


def read_instructions(path: Path, limit: int = MAX_INSTRUCTIONS_CHARS) -> str:
    """An operator's instructions file, stripped; at most `limit` characters. Reads no more
    than the limit allows, so a wrong path (a log, a binary) fails fast and bounded."""
    with path.open("rb") as file:
        raw = file.read(4 * limit + 1)  # UTF-8: at most 4 bytes a character
    text = "" if len(raw) > 4 * limit else raw.decode("utf-8").strip()
    if len(raw) > 4 * limit or len(text) > limit:
        raise InstructionsTooLong(
            f"{path} is longer than {limit} characters; shorten it (it is sent with every "
            "model call)"
        )
    return text
