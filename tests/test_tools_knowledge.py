"""The `knowledge_lookup` built-in over the shipped catalog and custom files."""

import json
import os
from pathlib import Path

import pytest

from tools import ToolContext
from tools.builtin import knowledge
from tools.builtin.knowledge import EntryNotFound, KnowledgeError, knowledge_lookup
from tools.execute import execute

SHIPPED = ToolContext(user_id="U1")  # no `knowledge` setting: the shipped catalog


def using(path: Path) -> ToolContext:
    """A call whose operator set SWITCHBOARD_KNOWLEDGE to `path`."""
    return ToolContext(user_id="U1", settings={"knowledge": str(path)})


@pytest.mark.parametrize(
    ("name", "fee", "prerequisites"),
    [
        ("Python Basics", 1999, []),
        ("SQL Basics", 2499, []),
        ("Django Fundamentals", 2999, ["Python Basics"]),
        ("Django REST APIs", 3499, ["Django Fundamentals", "SQL Basics"]),
    ],
)
def test_the_course_catalog(name: str, fee: int, prerequisites: list[str]) -> None:
    entry = knowledge_lookup(SHIPPED, name)
    assert entry["name"] == name
    assert entry["fee"] == fee
    assert entry["currency"] == "INR"
    assert entry["prerequisites"] == prerequisites
    assert entry["description"]


@pytest.mark.parametrize(
    "name", ["django rest apis", "  DJANGO   REST  APIS ", "djangorestapis", "DRF"]
)
def test_matching_ignores_case_and_spaces_and_knows_aliases(name: str) -> None:
    assert knowledge_lookup(SHIPPED, name)["name"] == "Django REST APIs"


def test_policies_have_no_fee() -> None:
    assert knowledge_lookup(SHIPPED, "refund policy") == {
        "name": "Refund policy",
        "fee": None,
        "currency": None,
        "prerequisites": [],
        "description": knowledge_lookup(SHIPPED, "Refunds")["description"],
    }


def test_a_miss_suggests_close_matches() -> None:
    with pytest.raises(
        EntryNotFound, match=r"No entry named 'Pyton Basics'\. Did you mean: Python Basics"
    ):
        knowledge_lookup(SHIPPED, "Pyton Basics")
    with pytest.raises(EntryNotFound, match="Known entries: Python Basics, SQL Basics"):
        knowledge_lookup(SHIPPED, "Kubernetes for Cats")


def test_the_tool_returns_json_and_errors_as_observations() -> None:
    tool = knowledge.TOOLS[0]
    ctx = ToolContext(user_id="U1")
    found = execute(tool, ctx, {"name": "SQL Basics"})
    assert found.ok
    assert json.loads(found.text)["fee"] == 2499
    assert '"fee":2499' in found.text
    missed = execute(tool, ctx, {"name": "Djngo Fundamentals"})
    assert not missed.ok
    assert missed.text.startswith("Error: EntryNotFound: No entry named 'Djngo Fundamentals'.")
    assert "Django Fundamentals" in missed.text


def test_env_var_points_at_another_file_which_is_reloaded_when_changed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kb.yaml"
    path.write_text(
        "currency: USD\nentries:\n  - {name: Go Basics, fee: 10, description: Go.}\n",
        encoding="utf-8",
    )
    ctx = using(path)
    assert knowledge_lookup(ctx, "go basics")["fee"] == 10
    assert knowledge_lookup(ctx, "go basics")["currency"] == "USD"
    path.write_text(
        "currency: USD\nentries:\n  - {name: Go Basics, fee: 12, description: 'Go, updated.'}\n",
        encoding="utf-8",
    )
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert knowledge_lookup(ctx, "go basics")["fee"] == 12
    with pytest.raises(EntryNotFound):
        knowledge_lookup(ctx, "Python Basics")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a list\n", "expected a mapping with an 'entries' list"),
        ("entries:\n  - {name: A}\n", "description must be a string"),
        ("entries:\n  - {name: A, description: x, fee: -1}\n", "fee must be a non-negative number"),
        ("entries:\n  - {name: A, description: x, colour: red}\n", "unknown keys ['colour']"),
        (
            "entries:\n  - {name: A, description: x, prerequisites: [B]}\n",
            "prerequisites of 'A' name unknown entries: 'B'",
        ),
        (
            "entries:\n  - {name: A, description: x}\n  - {name: ' a ', description: y}\n",
            "names both 'A' and 'a'",
        ),
        ("entries: [\n", "cannot read the knowledge file"),
    ],
)
def test_malformed_files_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "kb.yaml"
    path.write_text(text, encoding="utf-8")
    ctx = using(path)
    with pytest.raises(KnowledgeError) as caught:
        knowledge_lookup(ctx, "A")
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    ctx = using(tmp_path / "absent.yaml")
    with pytest.raises(KnowledgeError, match="knowledge file not found"):
        knowledge_lookup(ctx, "A")


def test_a_link_moved_to_another_file_of_the_same_time_and_size_is_read_again(
    tmp_path: Path,
) -> None:
    """Releases switched by a link, with fixed times (reproducible builds, Nix), an edit that
    keeps the size: the parse is kept by the file, not only by its time and size."""
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    for version, fee in (("v1", 10), ("v2", 20)):
        written = tmp_path / version / "kb.yaml"
        written.write_text(
            f"currency: USD\nentries:\n  - {{name: Go Basics, fee: {fee}, description: Go.}}\n",
            encoding="utf-8",
        )
        os.utime(written, ns=(1_000_000_000, 1_000_000_000))
    current = tmp_path / "current"
    current.symlink_to(tmp_path / "v1" / "kb.yaml")
    assert knowledge_lookup(using(current), "go basics")["fee"] == 10
    moved = tmp_path / "moved"
    moved.symlink_to(tmp_path / "v2" / "kb.yaml")
    moved.replace(current)  # the link switched in one step, as a release does
    assert knowledge_lookup(using(current), "go basics")["fee"] == 20
