"""Reading an operator's YAML file node by node, so every problem names its line (the policy
file, the MCP servers file). Each reader collects all problems, then raises one error."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

import yaml

Node = yaml.Node
STR, BOOL, NULL = "tag:yaml.org,2002:str", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"
INT = "tag:yaml.org,2002:int"


DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class Invalid(Exception):
    """A problem that stops reading one entry; it is already recorded in `errors`."""


def compose(text: str, source: str, error: type[Exception]) -> Node | None:
    """The document's node tree; a YAML syntax error raises `error` naming the line."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f" line {mark.line + 1}" if mark else ""
        raise error(f"{source}{line}: invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{source}: invalid YAML: {exc}") from None


class NodeReader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.errors: list[tuple[int, str]] = []
        self._constructor = yaml.SafeLoader("")

    def raise_errors(self, error: type[Exception]) -> None:
        """Every problem found, one line each in file order, as one `error`."""
        if self.errors:
            ordered = sorted(self.errors, key=lambda found: found[0])
            raise error("\n".join(message for _, message in ordered))

    def mapping(
        self, node: Node, where: str, keys: tuple[str, ...] | None = None
    ) -> dict[str, tuple[Node, Node]]:
        """String keys to (key node, value node); unknown and repeated keys are problems."""
        if not isinstance(node, yaml.MappingNode):
            raise self.invalid(node, f"{where} must be a mapping of key: value entries")
        entries: dict[str, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            if not (isinstance(key_node, yaml.ScalarNode) and key_node.tag == STR):
                self.error(key_node, f"{where}: keys must be strings")
                continue
            key = key_node.value
            if key in entries:
                self.error(key_node, f"{where}: duplicate key {key!r}")
            elif keys is not None and key not in keys:
                self.error(key_node, self.unknown_key(where, key, keys))
            else:
                entries[key] = (key_node, value_node)
        return entries

    def unknown_key(self, where: str, key: str, keys: tuple[str, ...]) -> str:
        return f"{where}: unknown key {key!r}{suggest(key, keys)} (allowed: {', '.join(keys)})"

    def error(self, node: Node | None, message: str) -> None:
        line = node.start_mark.line + 1 if node is not None else 1
        self.errors.append((line, f"{self.source} line {line}: {printable(message)}"))

    def invalid(self, node: Node, message: str) -> Invalid:
        self.error(node, message)
        return Invalid(message)

    def strings(self, node: Node, where: str, example: str) -> list[tuple[str, Node]]:
        if is_null(node):
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise self.invalid(node, f"{where} must be a list, e.g. {example}")
        items: list[tuple[str, Node]] = []
        for item in node.value:
            if isinstance(item, yaml.ScalarNode) and item.tag == STR:
                items.append((item.value.strip(), item))
            else:
                self.error(item, f"{where}: each entry must be a string")
        return items

    def duration(self, node: Node, where: str) -> float:
        """Seconds: a number, or a string like "90s", "30m", "4h", "2d"."""
        value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value)
        match = DURATION.match(value.strip()) if isinstance(value, str) else None
        if match is None:
            raise self.invalid(
                node, f"{where} must be a duration: seconds, or like 90s, 30m, 4h or 2d"
            )
        return float(match.group(1)) * UNIT[match.group(2)]

    def boolean(self, node: Node, where: str) -> bool:
        if not (isinstance(node, yaml.ScalarNode) and node.tag == BOOL):
            raise self.invalid(node, f"{where} must be true or false")
        return bool(self.scalar(node))

    def scalar(self, node: Node) -> Any:
        return self._constructor.construct_object(node, deep=True)


def suggest(word: str, choices: Iterable[str]) -> str:
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def printable(text: str) -> str:
    """`text` with control characters escaped: an operator's key or a server's tool name
    must not break a one-line-per-problem message into several."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def is_null(node: Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == NULL
