"""`knowledge_lookup`: look up a course or policy by name in a YAML knowledge file.

The file is `SWITCHBOARD_KNOWLEDGE` or the shipped `tools/data/knowledge.yaml`;
it is read lazily and re-read when it changes (cached by path and mtime).
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field

from tools.context import ToolContext
from tools.declare import make_tool

ENV_VAR = "SWITCHBOARD_KNOWLEDGE"
DEFAULT_PATH = Path(__file__).resolve().parent.parent / "data" / "knowledge.yaml"
_FILE_KEYS = frozenset({"currency", "entries"})
_ENTRY_KEYS = frozenset(
    {"name", "kind", "fee", "currency", "prerequisites", "aliases", "description"}
)


class KnowledgeError(ValueError):
    """The knowledge file is missing or malformed."""


class EntryNotFound(LookupError):
    """No entry has the requested name; the message suggests close matches."""


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    description: str
    fee: int | float | None = None
    currency: str | None = None
    prerequisites: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fee": self.fee,
            "currency": self.currency if self.fee is not None else None,
            "prerequisites": list(self.prerequisites),
            "description": self.description,
        }


def knowledge_lookup(
    ctx: ToolContext,
    name: Annotated[str, Field(min_length=1, max_length=200)],
) -> dict[str, Any]:
    """Look up a course or policy by its name: fee, currency, prerequisites, description.

    Args:
        name: The course or policy name, e.g. "Django Fundamentals" or "Refund policy".
    """
    return knowledge_base(knowledge_path(ctx.settings)).find(name).to_json()


def knowledge_path(settings: Mapping[str, str]) -> Path:
    """The knowledge file in use: the `knowledge` setting (SWITCHBOARD_KNOWLEDGE), else the
    shipped catalog."""
    configured = settings.get("knowledge", "")
    return Path(configured).expanduser() if configured else DEFAULT_PATH


def normalize(name: str) -> str:
    """Case- and whitespace-insensitive key: "Django  rest APIs" -> "djangorestapis"."""
    return "".join(name.casefold().split())


class KnowledgeBase:
    """Entries from one knowledge file, indexed by normalized name and alias."""

    def __init__(self, entries: list[Entry], source: str) -> None:
        self.entries = tuple(entries)
        self.source = source
        self.index: dict[str, Entry] = {}
        for entry in entries:
            for label in (entry.name, *entry.aliases):
                key = normalize(label)
                taken = self.index.get(key)
                if taken is not None and taken is not entry:
                    raise KnowledgeError(
                        f"{source}: {label!r} names both {taken.name!r} and {entry.name!r}"
                    )
                self.index[key] = entry
        for entry in entries:
            missing = [p for p in entry.prerequisites if normalize(p) not in self.index]
            if missing:
                raise KnowledgeError(
                    f"{source}: prerequisites of {entry.name!r} name unknown entries: "
                    + ", ".join(repr(m) for m in missing)
                )

    @classmethod
    def load(cls, path: Path) -> KnowledgeBase:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise KnowledgeError(f"{path}: knowledge file not found ({ENV_VAR})") from None
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
            raise KnowledgeError(f"{path}: cannot read the knowledge file: {error}") from None
        return cls(_entries(data, str(path)), str(path))

    def find(self, name: str) -> Entry:
        entry = self.index.get(normalize(name))
        if entry is not None:
            return entry
        raise EntryNotFound(self._not_found(name))

    def _not_found(self, name: str) -> str:
        shown = name.strip()[:80]
        labels = {normalize(label): entry.name for label, entry in self._labels()}
        close = difflib.get_close_matches(normalize(name), list(labels), n=3, cutoff=0.6)
        suggestions = list(dict.fromkeys(labels[key] for key in close))
        if suggestions:
            return f"No entry named {shown!r}. Did you mean: " + ", ".join(suggestions) + "?"
        names = ", ".join(entry.name for entry in self.entries[:30])
        return f"No entry named {shown!r}. Known entries: {names}."

    def _labels(self) -> list[tuple[str, Entry]]:
        return [(label, entry) for entry in self.entries for label in (entry.name, *entry.aliases)]


_cache: dict[Path, tuple[tuple[int, ...], KnowledgeBase]] = {}
_cache_lock = threading.Lock()


def knowledge_base(path: Path = DEFAULT_PATH) -> KnowledgeBase:
    """The parsed knowledge file, re-read only when it changes (its time, its size, or the
    file a link leads to). Kept by its absolute path (`resolve()`, a system call per part of
    the path at every lookup, was 0.7 % of a worker's CPU in the default burst)."""
    path = path.absolute()
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise KnowledgeError(f"{path}: knowledge file not found ({ENV_VAR})") from None
    # the file itself too: a link moved to another file of the same time and size
    stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino, stat.st_dev)
    with _cache_lock:
        cached = _cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
    base = KnowledgeBase.load(path)
    with _cache_lock:
        _cache[path] = (stamp, base)
    return base


def _entries(data: object, source: str) -> list[Entry]:
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise KnowledgeError(f"{source}: expected a mapping with an 'entries' list")
    unknown = set(data) - _FILE_KEYS
    if unknown:
        raise KnowledgeError(
            f"{source}: unknown keys {sorted(unknown)} (allowed: currency, entries)"
        )
    currency = data.get("currency")
    if currency is not None and not isinstance(currency, str):
        raise KnowledgeError(f"{source}: currency must be a string like INR")
    return [_entry(item, index, source, currency) for index, item in enumerate(data["entries"])]


def _entry(item: object, index: int, source: str, currency: str | None) -> Entry:
    where = f"{source}: entry {index + 1}"
    if not isinstance(item, dict):
        raise KnowledgeError(f"{where} must be a mapping")
    unknown = set(item) - _ENTRY_KEYS
    if unknown:
        raise KnowledgeError(f"{where}: unknown keys {sorted(unknown)}")
    name, description = item.get("name"), item.get("description")
    if not isinstance(name, str) or not name.strip():
        raise KnowledgeError(f"{where}: name must be a non-empty string")
    if not isinstance(description, str):
        raise KnowledgeError(f"{where} ({name}): description must be a string")
    fee = item.get("fee")
    if fee is not None and (isinstance(fee, bool) or not isinstance(fee, int | float) or fee < 0):
        raise KnowledgeError(f"{where} ({name}): fee must be a non-negative number")
    return Entry(
        name=name.strip(),
        kind=str(item.get("kind", "entry")),
        description=description.strip(),
        fee=fee,
        currency=item.get("currency", currency),
        prerequisites=_strings(item.get("prerequisites"), f"{where} ({name}): prerequisites"),
        aliases=_strings(item.get("aliases"), f"{where} ({name}): aliases"),
    )


def _strings(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise KnowledgeError(f"{where} must be a list of strings")
    return tuple(v.strip() for v in value)


TOOLS = (make_tool(knowledge_lookup, effect="read", timeout=5.0),)
