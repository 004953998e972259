"""REDIS_URL=redis+sentinel://...: the primary the Sentinels name, for the bot, the workers,
RQ and its scheduler alike (worker processes on it: the chaos soak, tests/test_chaos.py); a
failover with approvals pending loses none of them and runs no write twice. Against
Debian's redis-server and redis-sentinel (skipped where absent)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from switchboard import errors, sentinel_url
from switchboard.redisconn import AnyServerScript, connect
from switchboard.settings import Config
from tests.fakes.openai_server import Turn
from tests.support import sentinel_group
from tests.support.runtime import ALICE, approve_first, make_runtime, work
from tools.builtin.tickets import TicketStore
from worker import service
from worker.run import RunStatus

SENTINEL_PASSWORD = "s3cret-sentinel"
hosts = st.lists(
    st.tuples(
        st.from_regex(r"[a-z0-9][a-z0-9.-]{0,20}", fullmatch=True),
        st.integers(1, 65535),
    ),
    min_size=1,
    max_size=5,
)
secrets = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=30)


@given(
    hosts,
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
    st.integers(0, 15),
    secrets,
    secrets,
)
def test_a_sentinel_url_parses_back_to_its_parts_and_shows_no_password(
    addresses, service_name, db, password, sentinel_password
):
    from urllib.parse import quote

    listed = ",".join(f"{h}:{p}" for h, p in addresses)
    url = (
        f"redis+sentinel://:{quote(password, safe='')}@{listed}/{service_name}/{db}"
        f"?sentinel_password={quote(sentinel_password, safe='')}"
    )
    parsed = sentinel_url.parse(url)
    assert parsed.sentinels == tuple(addresses)
    assert (parsed.service, parsed.db) == (service_name, db)
    assert (parsed.password, parsed.sentinel_password) == (password, sentinel_password)
    shown = errors.redact_url(url)
    assert sentinel_url.parse(shown) == replace(parsed, password="***", sentinel_password="***")


@given(st.text(max_size=300))
def test_any_text_after_the_scheme_parses_or_is_refused_with_a_reason(tail):
    try:
        parsed = sentinel_url.parse("redis+sentinel://" + tail)
    except ValueError as exc:
        assert str(exc)
    else:
        assert 1 <= len(parsed.sentinels) <= sentinel_url.MAX_SENTINELS
        assert all(0 < port < 65536 for _, port in parsed.sentinels)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h:26379", "service"),
        ("redis+sentinel://h:99999/sb", "port"),
        ("redis+sentinel://h:26379/sb/x", "not a number"),
        ("redis+sentinel://h:26379/sb?tls=1", "unknown option"),
        ("redis+sentinel://" + ",".join(["h:1"] * 17) + "/sb", "at most 16"),
    ],
)
def test_the_settings_refuse_a_bad_sentinel_url_at_start_up(url, says, monkeypatch):
    monkeypatch.setenv("REDIS_URL", url)
    with pytest.raises(ValueError, match=says):
        Config()


def test_a_port_left_out_is_sentinels_own():
    assert sentinel_url.parse("redis+sentinel://a,b:5000/sb").sentinels == (
        ("a", 26379),
        ("b", 5000),
    )


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sentinel_group.SentinelGroup]:
    reason = sentinel_group.missing()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("sentinel")
    started = sentinel_group.SentinelGroup(folder, sentinel_password=SENTINEL_PASSWORD).start()
    yield started
    started.stop()


def test_a_sentinel_url_reaches_the_primary_and_names_a_missing_service(group):
    conn = connect(group.url)
    conn.set("where", "primary")
    assert group.primary().client().get("where") == b"primary"
    assert isinstance(conn.register_script("return 1"), AnyServerScript)  # failovers: NOSCRIPT
    assert conn.connection_pool.connection_kwargs.get("password") is None
    wrong = group.url.replace(f"/{sentinel_group.SERVICE}/", "/nosuch/")
    with pytest.raises(errors.ConfigError, match="no Sentinel names a primary"):
        connect(wrong)


def test_a_failover_with_approvals_pending_loses_none_and_runs_no_write_twice(
    group, model_server, tickets_db: Path
):
    conn = connect(group.url)
    conn.flushdb()
    model_server.route(
        "failover",
        [Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Disk"})]), "filed"],
    )
    rt = make_runtime(conn, model_server.url)
    runs = [service.submit(rt, f"failover {i}", ALICE) for i in range(6)]
    work(rt)
    assert all(rt.store.load(r.id).status == RunStatus.AWAITING_APPROVAL for r in runs)
    approve_first(rt, runs[0].id)  # one write runs before the failover...
    work(rt)
    assert rt.store.load(runs[0].id).status == RunStatus.COMPLETED
    old = group.primary().port

    took = group.failover()

    assert group.primary().port != old
    assert len(rt.approvals.pending()) == 5  # ...none of the others is lost
    for r in runs[1:]:
        approve_first(rt, r.id)  # on connections opened before the failover
    work(rt)
    assert all(rt.store.load(r.id).answer == "filed" for r in runs)
    assert TicketStore(tickets_db).count_executions("create_ticket") == 6  # once each
    print(f"failover with 5 approvals pending: {took:.1f} s")


def test_two_failovers_in_a_row_both_happen(group):
    """The chaos soak runs failovers back to back (seed 27: two, 1.8 s apart). For a while
    after `failover()` returned, a Sentinel refuses another: one in progress ("INPROG", seed
    29's soak) or no replica it has seen following ("NOGOODSLAVE", here): the second waits
    until it would accept, as an operator would."""
    first = group.primary().port
    group.failover()
    second = group.primary().port
    group.failover()
    assert first != second and group.primary().port == first


def test_the_sentinels_own_password_is_sent_to_them_and_never_logged(group, capsys):
    protected = group.watchers[-1]
    url = f"redis+sentinel://127.0.0.1:{protected.port}/{sentinel_group.SERVICE}/0"
    assert connect(f"{url}?sentinel_password={SENTINEL_PASSWORD}").ping()
    assert SENTINEL_PASSWORD not in capsys.readouterr().err
    started = time.monotonic()
    with pytest.raises(errors.ConfigError) as refused:  # no wait mends it: said at once
        connect(f"{url}?sentinel_password=wrong-one", wait=60)
    assert time.monotonic() - started < 15
    assert not isinstance(refused.value, errors.RedisUnavailable)  # exit status 2, not 75
    assert "wrong-one" not in str(refused.value)
    assert "sentinel_password=***" in str(refused.value)
