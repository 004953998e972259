"""Input schemas that arguments cannot be checked against safely, found when a tool is
declared, so start-up refuses them instead of every call failing later.

jsonschema validates recursively: a `$ref` loop that consumes nothing of the arguments
(`a` -> `b` -> `a`, or `a` -> `allOf: [a]`) recurses until RecursionError on every call, and
so does a long enough chain of subschemas (measured here: 600 nested `allOf`s raise it in a
bare interpreter; jsonschema spends about two Python frames on each). A `$ref` to a URL
would be fetched by jsonschema's fallback resolver, and one to nothing fails on every call.
So a schema is refused when it

- nests subschemas more than MAX_SCHEMA_DEPTH levels deep (or any JSON deeper than
  MAX_JSON_DEPTH, e.g. in a `default`);
- has a `$ref` that is not a pointer into the schema itself (`#/...`), or that points at
  nothing; or `$dynamicRef`/`$recursiveRef`, or an `$id` below the root (they change what
  a reference means);
- has `$ref`s (with `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else`,
  `dependentSchemas`) that loop back without going into a property or an item. A loop
  through `properties` or `items` (a tree of nodes) is fine: each turn goes one level
  deeper into arguments, whose depth the decoder bounds (tools/decode.py, MAX_DEPTH);
- could take more than MAX_CHECK_LEVELS nested subschemas to check arguments that deep.

Every walk here is iterative, so no schema can make this check itself recurse.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import unquote

from tools.decode import MAX_DEPTH

MAX_SCHEMA_DEPTH = 32
MAX_JSON_DEPTH = 2 * MAX_SCHEMA_DEPTH + 8  # a property is two levels of JSON
MAX_CHECK_LEVELS = 200  # about 400 frames: well inside the default limit of 1000

Pointer = tuple[str, ...]
Applies = Literal["here", "deeper", "not"]

# How a keyword's subschemas apply: to the same value, to a part of it, or not at all
# (`$defs`: only through a `$ref`).
_ONE: tuple[tuple[str, Applies], ...] = (
    *(("not", "here"), ("if", "here"), ("then", "here"), ("else", "here")),
    *(("items", "deeper"), ("additionalProperties", "deeper"), ("contains", "deeper")),
    *(("propertyNames", "deeper"), ("unevaluatedItems", "deeper")),
    ("unevaluatedProperties", "deeper"),
)
_LISTS: tuple[tuple[str, Applies], ...] = (
    *(("allOf", "here"), ("anyOf", "here"), ("oneOf", "here"), ("prefixItems", "deeper")),
)
_MAPS: tuple[tuple[str, Applies], ...] = (
    *(("dependentSchemas", "here"), ("properties", "deeper"), ("patternProperties", "deeper")),
    *(("$defs", "not"), ("definitions", "not")),
)
_DYNAMIC = ("$dynamicRef", "$recursiveRef")


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why arguments cannot be checked against `schema` safely, in a few words; or None."""
    here: dict[Pointer, list[Pointer]] = {}
    deeper: dict[Pointer, list[Pointer]] = {}
    stack: list[tuple[Pointer, dict[str, Any], int]] = [((), schema, 1)]
    while stack:
        pointer, node, depth = stack.pop()
        if pointer in here:
            continue
        if depth > MAX_SCHEMA_DEPTH:
            return f"nests subschemas more than {MAX_SCHEMA_DEPTH} levels deep"
        same, into = here.setdefault(pointer, []), deeper.setdefault(pointer, [])
        for keyword in _DYNAMIC:
            if keyword in node:
                return f"uses `{keyword}` at {_show(pointer)}, which is not supported"
        if pointer and "$id" in node:
            return f"sets `$id` at {_show(pointer)}, below the root, which is not supported"
        for child, child_node, applies in _children(pointer, node):
            stack.append((child, child_node, depth + 1))
            if applies == "here":
                same.append(child)
            elif applies == "deeper":
                into.append(child)
        if "$ref" in node:
            target = _resolve(schema, node["$ref"])
            if isinstance(target, str):
                return f"has a `$ref` at {_show(pointer)} that {target}"
            stack.append((target[0], target[1], depth + 1))
            same.append(target[0])
    if json_depth_exceeds(schema, MAX_JSON_DEPTH):
        return f"is nested more than {MAX_JSON_DEPTH} levels deep"
    loop, order = _find_loop(here)
    if loop:
        path = " → ".join(_show(p) for p in loop)
        return f"has `$ref`s that loop without going into any argument ({path})"
    if _check_levels(order, here, deeper) > MAX_CHECK_LEVELS:
        return (
            f"could take more than {MAX_CHECK_LEVELS} nested subschemas to check one argument "
            "(`$ref`s and `allOf`/`anyOf`/`oneOf` chained too long)"
        )
    return None


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """True if dicts and lists in `value` nest deeper than `limit` (iterative)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _children(
    pointer: Pointer, node: dict[str, Any]
) -> list[tuple[Pointer, dict[str, Any], Applies]]:
    found: list[tuple[Pointer, dict[str, Any], Applies]] = []
    for keyword, applies in _ONE:
        value = node.get(keyword)
        if isinstance(value, dict):
            found.append(((*pointer, keyword), value, applies))
    for keyword, applies in _LISTS:
        value = node.get(keyword)
        if isinstance(value, list):
            found.extend(
                ((*pointer, keyword, str(i)), item, applies)
                for i, item in enumerate(value)
                if isinstance(item, dict)
            )
    for keyword, applies in _MAPS:
        value = node.get(keyword)
        if isinstance(value, dict):
            found.extend(
                ((*pointer, keyword, str(name)), item, applies)
                for name, item in value.items()
                if isinstance(item, dict)
            )
    return found


def _resolve(root: dict[str, Any], ref: object) -> tuple[Pointer, dict[str, Any]] | str:
    """The schema a local `$ref` points at, with its pointer; or what is wrong with it."""
    if not isinstance(ref, str):
        return "is not a string"
    if ref != "#" and not ref.startswith("#/"):
        return "is not a pointer into the schema itself (`#/...`)"
    parts: Pointer = ()
    if ref != "#":
        parts = tuple(
            unquote(part).replace("~1", "/").replace("~0", "~") for part in ref[2:].split("/")
        )
    target: Any = root
    for part in parts:
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return f"points at nothing ({ref[:80]})"
    if not isinstance(target, dict):
        return f"points at something that is not a schema ({ref[:80]})"
    return parts, target


def _find_loop(
    edges: dict[Pointer, list[Pointer]],
) -> tuple[list[Pointer] | None, list[Pointer]]:
    """A cycle of in-place edges, as the path that closes it (or None); and every node in
    post-order (each after everything it leads to)."""
    done: set[Pointer] = set()
    order: list[Pointer] = []
    for start in edges:
        if start in done:
            continue
        path, on_path = [start], {start}
        iterators = [iter(edges.get(start, ()))]
        while iterators:
            following = next(iterators[-1], None)
            if following is None:
                iterators.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                order.append(finished)
            elif following in on_path:
                return [*path[path.index(following) :], following], order
            elif following not in done:
                path.append(following)
                on_path.add(following)
                iterators.append(iter(edges.get(following, ())))
    return None, order


def _check_levels(
    order: list[Pointer], here: dict[Pointer, list[Pointer]], deeper: dict[Pointer, list[Pointer]]
) -> int:
    """The most nested subschemas checking arguments MAX_DEPTH deep can go through, from the
    root: the longest path on which in-place edges are free and each step into a property
    or an item spends one level of the arguments."""
    previous: dict[Pointer, int] = {}
    for budget in range(MAX_DEPTH + 1):
        current: dict[Pointer, int] = {}
        for pointer in order:  # what a node leads to in place comes before it
            best = max((current[m] for m in here.get(pointer, ())), default=0)
            if budget:
                best = max(best, max((previous[m] for m in deeper.get(pointer, ())), default=0))
            current[pointer] = best + 1
        previous = current
    return previous.get((), 0)


def _show(pointer: Pointer) -> str:
    text = "#" + "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in pointer)
    return text[:120]
