"""`switchboard chat`: the terminal console over the real queue and a worker process."""

from __future__ import annotations

import io

import pytest

from switchboard.console import Console
from tests.fakes.openai_server import Turn
from tests.support.processes import WorkerProcess, worker_env
from tests.support.runtime import make_runtime
from tools.builtin.tickets import TicketStore

pytestmark = pytest.mark.slow

TICKET = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Mouse broken"})])


@pytest.fixture
def worker(redis_url, model_server, tmp_path, monkeypatch):
    monkeypatch.setenv("SWITCHBOARD_TICKETS_DB", str(tmp_path / "tickets.sqlite3"))
    process = WorkerProcess(worker_env(redis_url, model_server.url, tmp_path), tmp_path / "w.log")
    yield process
    process.stop()


def test_console_shows_steps_and_takes_a_decision(redis_conn, model_server, worker, tmp_path):
    model_server.route("Mouse", [TICKET, "Opened ticket #1 for the broken mouse."])
    rt = make_runtime(redis_conn, model_server.url)
    out = io.StringIO()
    console = Console(
        rt, user_id="UCON", stdin=io.StringIO("Mouse is broken, file it\ny\n"), stdout=out
    )
    assert console.loop() == 0
    text = out.getvalue()
    assert "Approval needed: create_ticket" in text and '"title": "Mouse broken"' in text
    assert "approved by UCON" in text
    assert "Opened ticket #1 for the broken mouse." in text
    assert "[completed;" in text and text.rstrip().endswith("bye")
    assert TicketStore(tmp_path / "tickets.sqlite3").count_executions("create_ticket") == 1


def test_console_ends_cleanly_when_input_ends_at_a_decision(redis_conn, model_server, worker):
    model_server.route("Mouse", [TICKET, "never"])
    rt = make_runtime(redis_conn, model_server.url)
    out = io.StringIO()
    console = Console(rt, user_id="UCON", stdin=io.StringIO("Mouse again, file it\n"), stdout=out)
    assert console.loop() == 0
    assert "waiting for a decision" in out.getvalue()
    [pending] = rt.approvals.pending()
    assert pending.requester == "UCON"


def test_console_rejects_with_a_reason(redis_conn, model_server, worker):
    model_server.route("Mouse", [TICKET, "OK, not filed."])
    rt = make_runtime(redis_conn, model_server.url)
    out = io.StringIO()
    stdin = io.StringIO("Mouse third time\nmaybe\nn already reported\n\n")
    assert Console(rt, user_id="UCON", stdin=stdin, stdout=out).loop() == 0
    text = out.getvalue()
    assert "Type y to approve" in text
    assert "rejected by UCON: already reported" in text
