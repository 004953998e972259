"""ApprovalStore.decide, the atomic pending -> decided step every surface's decision goes
through: what it returns, what it writes, and that of concurrent decisions exactly one wins.

Written before the decision script began returning the request it decided (instead of the
store reading it again after, and before, in round trips of their own: issue 28, resume
latency); these pin what a caller sees and what lands in Redis, which did not change.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from approvals import ApprovalNotFound, ApprovalStatus
from approvals.request import binding_hash
from approvals.store import ApprovalStore, new_request

DUE = "sb:runs:due"
ARGS = {"project": "IT", "title": "Printer jam"}


@pytest.fixture
def store(redis_conn: redis.Redis) -> ApprovalStore:
    return ApprovalStore(redis_conn, due_key=DUE)


def asked(ttl: float = 3600, run_id: str = "r1", approval_id: str | None = None) -> dict[str, Any]:
    """What a worker creates a request of `run_id` with."""
    return dict(
        approval_id=approval_id,
        run_id=run_id,
        call_id="call_1",
        tool="create_ticket",
        args=dict(ARGS),
        requester="UASKER",
        team_id="T1",
        channel_id="C1",
        policy_version="v1",
        ttl=ttl,
    )


def pending(store: ApprovalStore, ttl: float = 3600, run_id: str = "r1") -> str:
    return store.create(**asked(ttl, run_id)).id


def redis_now(conn: redis.Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1_000_000


def test_the_winner_gets_the_request_as_decided_and_stored(
    store: ApprovalStore, redis_conn: redis.Redis
) -> None:
    approval_id = pending(store)
    store.add_card(approval_id, {"channel": "C1", "ts": "1.000100"})
    before = redis_now(redis_conn)

    decision = store.decide(approval_id, ApprovalStatus.APPROVED, "UAPPROVER", "  looks fine ")

    after = redis_now(redis_conn)
    assert decision.won
    assert decision.request == store.get(approval_id)  # every field, cards included
    request = decision.request
    assert (request.status, request.decided_by) == (ApprovalStatus.APPROVED, "UAPPROVER")
    assert request.reason == "  looks fine "  # as given: trimming is the caller's
    assert before <= request.decided_at <= after  # Redis's clock, in the decision step
    assert request.cards == [{"channel": "C1", "ts": "1.000100"}]
    assert request.original_args is None and request.args == ARGS
    assert redis_conn.zscore(store.keys.pending, approval_id) is None
    assert redis_conn.zscore(store.keys.owed_cards, approval_id) == pytest.approx(
        request.decided_at
    )
    woken = redis_conn.zscore(DUE, "r1")  # the run is due again, in milliseconds
    assert woken is not None and before * 1000 - 1 <= woken <= after * 1000 + 1


def test_the_wake_stamp_only_goes_up(store: ApprovalStore, redis_conn: redis.Redis) -> None:
    """A run already due later than now gets a later stamp, never an earlier one."""
    approval_id = pending(store)
    ahead = (redis_now(redis_conn) + 60) * 1000
    redis_conn.zadd(DUE, {"r1": ahead})
    store.decide(approval_id, ApprovalStatus.APPROVED, "UAPPROVER")
    assert redis_conn.zscore(DUE, "r1") == ahead + 1


class Counting(redis.Redis):
    """A connection that counts the commands it sends (a script call is one)."""

    sent = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent += 1
        return super().execute_command(*args, **options)


def test_a_decision_as_proposed_is_one_round_trip(store: ApprovalStore, redis_url: str) -> None:
    """Before: three (read the request, decide, read it again), each between an Approve
    click and the approved tool starting."""
    counting = ApprovalStore(Counting.from_url(redis_url), due_key=DUE)
    counting.decide(pending(store), ApprovalStatus.APPROVED, "UAPPROVER")  # loads the script
    approval_id = pending(store, run_id="r2")
    counting.redis.sent = 0
    decision = counting.decide(approval_id, ApprovalStatus.APPROVED, "UAPPROVER")
    assert counting.redis.sent == 1
    assert decision.won and decision.request == store.get(approval_id)


def test_a_later_decision_loses_and_gets_the_winners(
    store: ApprovalStore, redis_conn: redis.Redis
) -> None:
    approval_id = pending(store)
    first = store.decide(approval_id, ApprovalStatus.REJECTED, "UFIRST", "no")
    redis_conn.delete(DUE)

    second = store.decide(approval_id, ApprovalStatus.APPROVED, "USECOND")

    assert first.won and not second.won
    assert second.request == first.request == store.get(approval_id)
    assert (second.request.status, second.request.decided_by) == (
        ApprovalStatus.REJECTED,
        "UFIRST",
    )
    assert redis_conn.zscore(DUE, "r1") is None  # a lost decision wakes nothing


def test_deciding_a_request_that_does_not_exist_raises_and_writes_nothing(
    store: ApprovalStore, redis_conn: redis.Redis
) -> None:
    with pytest.raises(ApprovalNotFound):
        store.decide("ap_missing", ApprovalStatus.APPROVED, "UAPPROVER")
    with pytest.raises(ApprovalNotFound):
        store.decide("ap_missing", ApprovalStatus.APPROVED, "U1", edited_args={"title": "x"})
    assert redis_conn.keys("*") == []


def test_approving_after_the_request_expired_records_an_expiry(
    store: ApprovalStore, redis_conn: redis.Redis
) -> None:
    approval_id = pending(store, ttl=-1)
    decision = store.decide(approval_id, ApprovalStatus.APPROVED, "UAPPROVER", "ok")
    assert decision.won
    assert decision.request == store.get(approval_id)
    assert (decision.request.status, decision.request.decided_by) == (ApprovalStatus.EXPIRED, "")
    assert decision.request.reason == "nobody decided before it expired"


def test_approving_with_edits_rebinds_the_request_to_them(store: ApprovalStore) -> None:
    approval_id = pending(store)
    edited = {"project": "IT", "title": "Printer jam, floor 2"}

    decision = store.decide(approval_id, ApprovalStatus.APPROVED, "UAPPROVER", edited_args=edited)

    request = decision.request
    assert decision.won and request == store.get(approval_id)
    assert request.args == edited and request.original_args == ARGS
    assert request.binding == binding_hash("create_ticket", edited, "UASKER", "v1")
    assert request.covers("create_ticket", edited, "UASKER")
    assert not request.covers("create_ticket", ARGS, "UASKER")


def test_edits_go_only_with_an_approval_and_instructions_only_with_a_rejection(
    store: ApprovalStore,
) -> None:
    rejected = pending(store)
    decision = store.decide(
        rejected,
        ApprovalStatus.REJECTED,
        "UAPPROVER",
        "wrong project",
        edited_args={"project": "OPS", "title": "x"},
        instructions="file it under OPS",
    )
    assert decision.request == store.get(rejected)
    assert decision.request.args == ARGS and decision.request.original_args is None
    assert decision.request.instructions == "file it under OPS"

    approved = pending(store, run_id="r2")
    decision = store.decide(approved, ApprovalStatus.APPROVED, "UAPPROVER", instructions="hi")
    assert decision.request.instructions == ""


def test_expire_and_withdraw_are_decisions_too(
    store: ApprovalStore, redis_conn: redis.Redis
) -> None:
    expired, withdrawn = pending(store), pending(store, run_id="r2")
    by_timer = store.expire(expired)
    by_cancel = store.withdraw(withdrawn, "the run was cancelled")
    assert by_timer.won and by_cancel.won
    assert by_timer.request == store.get(expired)
    assert by_cancel.request == store.get(withdrawn)
    assert (by_timer.request.status, by_timer.request.reason) == (
        ApprovalStatus.EXPIRED,
        "nobody decided in time",
    )
    assert (by_cancel.request.status, by_cancel.request.reason) == (
        ApprovalStatus.WITHDRAWN,
        "the run was cancelled",
    )
    assert redis_conn.zscore(DUE, "r1") is not None and redis_conn.zscore(DUE, "r2") is not None
    assert not store.decide(expired, ApprovalStatus.APPROVED, "UAPPROVER").won


def test_of_concurrent_decisions_exactly_one_wins_and_all_see_it(
    store: ApprovalStore, redis_url: str
) -> None:
    approval_id = pending(store)
    start = threading.Barrier(12)
    seen: dict[str, tuple[bool, str, ApprovalStatus]] = {}

    def decide(user: str) -> None:
        own = ApprovalStore(redis.Redis.from_url(redis_url), due_key=DUE)
        approve = user.endswith(("0", "2", "4"))
        status = ApprovalStatus.APPROVED if approve else ApprovalStatus.REJECTED
        start.wait(10)
        decision = own.decide(approval_id, status, user)
        seen[user] = (decision.won, decision.request.decided_by, decision.request.status)

    threads = [threading.Thread(target=decide, args=(f"U{i:02d}",)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)

    winners = [user for user, (won, _, _) in seen.items() if won]
    assert len(seen) == 12 and len(winners) == 1
    final = store.get(approval_id)
    assert final.decided_by == winners[0]
    assert {(by, status) for _, by, status in seen.values()} == {(final.decided_by, final.status)}
    assert time.time() - final.decided_at < 60


def test_cards_recorded_at_once_all_stay_and_one_after_the_decision_is_owed(
    store: ApprovalStore, redis_conn: redis.Redis
) -> None:
    approval_id = pending(store)
    cards = [
        {"channel": f"C{n}", "ts": f"1.{n:06d}", "batch": "bt_x" if n % 2 else ""}
        for n in range(12)
    ]
    start = threading.Barrier(len(cards))
    pending_then: list[bool] = []

    def record(card: dict[str, str]) -> None:
        start.wait()
        pending_then.append(store.add_card(approval_id, card))

    threads = [threading.Thread(target=record, args=(card,)) for card in cards]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert pending_then == [True] * 12  # pending: nothing owed
    kept = store.get(approval_id).cards
    assert sorted(kept, key=lambda c: c["channel"]) == sorted(cards, key=lambda c: c["channel"])
    assert store.owed_cards(older_than=0) == []

    decision = store.decide(approval_id, ApprovalStatus.REJECTED, "UAPPROVER", "no")
    owed_since = redis_conn.zscore(store.keys.owed_cards, approval_id)
    assert owed_since is not None
    late = {"channel": "CLATE", "ts": "2.000001"}
    assert store.add_card(approval_id, late) is False  # posted while the decider redraws
    assert store.get(approval_id).cards[-1] == late
    assert redis_conn.zscore(store.keys.owed_cards, approval_id) == owed_since  # not later
    store.card_shown(approval_id, drawn=len(decision.request.cards))  # the twelve it knew of
    assert store.owed_cards(older_than=0) == [approval_id]  # the late one is still owed
    store.card_shown(approval_id, drawn=13)  # its poster redrew it too
    assert store.owed_cards(older_than=0) == []
    with pytest.raises(ApprovalNotFound):
        store.add_card("ap_missing", late)


def test_a_request_a_second_worker_writes_after_the_first_leaves_the_first_ones_card(
    store: ApprovalStore,
) -> None:
    """Two workers driving one run at once (its lease lapsed under a stalled Redis) both
    create its request. Both found none; the later write put an empty list of cards back
    over the card the other had posted and recorded, and the decision was never drawn on
    it (found by the chaos soak, seed 62). The write is made only where none is."""
    kept = asked(approval_id="ap_both")
    store.create(**kept)  # the first worker's request
    card = {"channel": "C1", "ts": "1.000001"}
    store.add_card("ap_both", card)  # ... its card, posted and recorded
    # the second worker found no request before that, and writes its own now
    assert store._write_new(new_request(**kept), 3600) is False
    assert store.get("ap_both").cards == [card]
    assert store.create(**kept).cards == [card]  # found, not written again
    assert [request.id for request in store.pending()] == ["ap_both"]
