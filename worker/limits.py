"""Per-person limits: runs in flight, runs per minute, model cost per day.

Runs in flight are also what keeps the queue fair: one person's burst of questions waits in
their own line (`sb:user:{id}:waiting`) instead of the shared RQ queue, so someone else's
question is not stuck behind thirty of theirs. A run counts as in flight from submission until
it first suspends for a person or ends; the next one in that person's line is then admitted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import redis
import structlog

from approvals import WAKE_LUA
from tools.exceptions import brief
from worker.eventlog import APPEND_LUA, MAX_EVENTS_PER_RUN, said_full
from worker.keys import Keys

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Limits:
    """0 means no limit."""

    runs_in_flight: int = 0
    runs_per_minute: int = 0
    cost_per_day: float = 0.0


class CallStart(NamedTuple):
    """What `PersonLimits.begin_call` decided about a model call."""

    over: str | None  # the day's spend in words when the call may not start; else None
    reserved: bool  # started under a cap: `end_call` charges it, even if the cap is gone by then
    held: bool = False  # its place in flight written (a reservation of more than nothing)


LINES_A_PASS = 200  # people's lines the sweeper looks at in one pass


class LimitExceeded(Exception):
    """Said to the person who asked; the question is not queued."""


# KEYS: the minute's count, the day's spend.  ARGV: questions a minute (0: no limit), spend
# a day (0: no cap).  Returns the minute's count with this question (0: not counted) and the
# day's spend. The count's time to live is set by the question that begins it (one command
# fewer than an EXPIRE with every question).
_CHECK = """
local count = 0
if tonumber(ARGV[1]) > 0 then
  count = redis.call('INCR', KEYS[1])
  if count == 1 then redis.call('EXPIRE', KEYS[1], 120) end
end
local spent = '0'
if tonumber(ARGV[2]) > 0 then spent = redis.call('GET', KEYS[2]) or '0' end
return {count, spent}
"""

# KEYS: active zset, waiting list, the set of people with a line.  ARGV: run id, limit, now,
# stale cutoff, user id.
# 1: admitted now; 0: waits in the person's line (and the person is listed for the sweeper).
# Places gone stale (a worker that died holding one) are dropped only when they would keep
# the run out (and by a release, before it admits from the line): while there is room they
# change no decision.
_ADMIT = """
local limit = tonumber(ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= limit then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[4])
  if redis.call('ZCARD', KEYS[1]) >= limit then
    redis.call('RPUSH', KEYS[2], ARGV[1])
    redis.call('SADD', KEYS[3], ARGV[5])
    return 0
  end
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
"""

# A run stops counting against its person (`run_id`; '': none, the sweeper draining the
# line) and the runs admitted from the line in its place are returned, each marked due first,
# so the sweeper queues it even if this process stops before it does. `limit` 0: none (when
# draining: all are admitted, none holding a place, as `admit` gives none without a limit).
# With nobody in line, nothing more is read (the sweeper's pass unlists the person); with
# someone, stale places are dropped first (an admission drops them only when full), so they
# keep nobody in line out. Run by `_RELEASE` alone, and by the save that ends or suspends the
# run (worker/store.py).
RELEASE_LUA = (
    WAKE_LUA
    + """
local function release(active, waiting, due, lines, run_id, limit_text, now, stale, user)
  -- a run holds a place in flight or one in line, never both (admitted: popped from the line)
  if run_id ~= '' and redis.call('ZREM', active, run_id) == 0 then
    redis.call('LREM', waiting, 0, run_id)
  end
  local admitted = {}
  if redis.call('LLEN', waiting) == 0 then
    if run_id == '' then redis.call('SREM', lines, user) end
    return admitted
  end
  local limit = tonumber(limit_text)
  if limit > 0 then redis.call('ZREMRANGEBYSCORE', active, 0, stale) end
  while limit == 0 or redis.call('ZCARD', active) < limit do
    local next = redis.call('LPOP', waiting)
    if not next then break end
    if limit > 0 then redis.call('ZADD', active, now, next) end
    wake(due, next)
    table.insert(admitted, next)
  end
  return admitted
end
"""
)

# KEYS: active zset, waiting list, due set, the set of people with a line.  ARGV: run id,
# limit, now, stale cutoff, user id.
_RELEASE = (
    RELEASE_LUA
    + "return release(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4],"
    + " ARGV[5])\n"
)


class Release(NamedTuple):
    """A run's place in flight given back, and who waits in line admitted: written alone
    (`_RELEASE`), or by the save that ends or suspends the run, in its round trip."""

    keys: list[str]  # the person's places in flight, their line, the due set, the lines' set
    run_id: str  # '': none (the sweeper draining the line)
    limit: int
    now: float
    stale: float  # places taken before this are stale
    user_id: str

    def args(self) -> list[str | int | float]:
        """As `_RELEASE` reads them after its keys (the save reads all but the run id)."""
        return [self.run_id, self.limit, self.now, self.stale, self.user_id]


# KEYS: the day's spend, the calls in flight (hash: run id -> "started|estimate"), the
# day's largest call, the run's event log (when there are events), the task library's usage
# counts (when demonstrations are counted).  ARGV: cap (0: none), run id, now, stale cutoff,
# the most events the log keeps, the log's time to live should these events begin it (0:
# none), how many demonstrations the call shows for the first time, their ids, then events
# to append when the call may start. The demonstrations are counted as shown when it may.
# 0: the cap is reached, or the calls already in flight are expected to reach it (this one
# would pass it); nothing is written then. Else the call may start, its events are in the log,
# and the answer adds: 2 when the log was full and its newest events were dropped; 4 when the
# call holds a place in flight, at the largest call's cost. It holds none when that is
# nothing (no priced call today): such a place would change no decision, and not writing it
# spares its HSET, the hash's EXPIRE and the HDEL that ends it (issue 28).
_BEGIN_CALL = (
    APPEND_LUA
    + """
local answer = 1
local cap = tonumber(ARGV[1])
if cap > 0 then
  local read = redis.call('MGET', KEYS[1], KEYS[3])  -- one command for the two counters
  local spent = tonumber(read[1] or '0')
  if spent >= cap then return 0 end
  -- places are held at the day's largest call, which only grows: none is held while it is
  -- nothing, and the hash is not read (issue 28)
  local estimate = read[2] or '0'
  local entries = {}
  if tonumber(estimate) > 0 then entries = redis.call('HGETALL', KEYS[2]) end
  local reserved = 0
  local kept = 0
  for i = 1, #entries, 2 do
    local started, estimate = string.match(entries[i + 1], '^([^|]+)|([^|]+)$')
    if not started or tonumber(started) < tonumber(ARGV[4]) then
      redis.call('HDEL', KEYS[2], entries[i])
    else
      kept = kept + 1
      if entries[i] ~= ARGV[2] then reserved = reserved + tonumber(estimate) end
    end
  end
  if reserved > 0 and spent + reserved >= cap then return 0 end
  if tonumber(estimate) > 0 then
    redis.call('HSET', KEYS[2], ARGV[2], ARGV[3] .. '|' .. estimate)
    -- a hash that kept an entry still has the time to live it was made with
    if kept == 0 then redis.call('EXPIRE', KEYS[2], 172800) end
    answer = answer + 4
  end
end
local shown = tonumber(ARGV[7])
for i = 8, 7 + shown do redis.call('HINCRBY', KEYS[5], ARGV[i], 1) end
if #ARGV > 7 + shown and append(KEYS[4], 8 + shown, tonumber(ARGV[6]), tonumber(ARGV[5])) then
  answer = answer + 2
end
return answer
"""
)

# A model call's cost added to its person's day (and kept as the day's largest call, if it
# is), and its place in flight ended (`ends`: the run id; '' when it held none). The day's
# spend gets its time to live from the spend that begins it, not from every spend (issue 28):
# the one whose total is its own cost. Redis keeps 17 decimals of the total, so "is" means
# within 1e-12 (a spend after less than that much is given the TTL again: no harm). Run by
# `_SPEND` alone, and by the step's save that charges the call (worker/store.py).
SPEND_LUA = """
local function spend(day, calls, largest, cost_text, ends)
  local cost = tonumber(cost_text)
  if cost > 0 then
    local total = tonumber(redis.call('INCRBYFLOAT', day, cost_text))
    if total - cost < 1e-12 then redis.call('EXPIRE', day, 172800) end
    if cost > tonumber(redis.call('GET', largest) or '0') then
      redis.call('SET', largest, cost_text, 'EX', 172800)
    end
  end
  if ends ~= '' then redis.call('HDEL', calls, ends) end
end
"""

# KEYS: the day's spend, the calls in flight, the day's largest call.  ARGV: cost, the run
# id whose call is over ('': it held no place).
_SPEND = SPEND_LUA + "spend(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])\nreturn 1\n"


class Charge(NamedTuple):
    """A model call's cost for its person's day, and the place in flight it ends: written
    alone (`_SPEND`), or by the run's next save, in the same round trip (issue 28)."""

    keys: list[str]  # the day's spend, its calls in flight, its largest call
    cost: str  # as Redis reads a number ("0": nothing to add)
    ends: str  # the run whose place in flight ends ("": none held)


class PersonLimits:
    def __init__(self, connection: redis.Redis, namespace: str, limits: Limits, stale: float):
        self.redis = connection
        self.ns = namespace
        self.keys = Keys(namespace)
        self.limits = limits
        self.stale = stale  # an admitted run not seen ending within this long stops counting
        self._check = connection.register_script(_CHECK)
        self._admit = connection.register_script(_ADMIT)
        self._release = connection.register_script(_RELEASE)
        self._begin_call = connection.register_script(_BEGIN_CALL)
        self._spend = connection.register_script(_SPEND)
        # run id -> its model call's charge, not written yet, while this process holds the
        # run (`hold_charges`): the step's save writes it. One thread works a run at a time.
        self._charges: dict[str, Charge | None] = {}

    def _cost_key(self, user_id: str, what: str = "cost", day: str = "") -> str:
        day = day or time.strftime("%Y%m%d", time.gmtime())
        return self.keys.person(user_id, what + ":" + day)

    def _call_keys(self, user_id: str) -> list[str]:
        """The day's spend, its calls in flight and its largest call: of one day, UTC (read
        once: at midnight the three keys would otherwise be of two days)."""
        day = time.strftime("%Y%m%d", time.gmtime())
        return [self._cost_key(user_id, what, day) for what in ("cost", "calls", "largest")]

    def begin_call(
        self,
        user_id: str,
        run_id: str,
        log_key: str = "",
        events: Sequence[str] = (),
        log_ttl: int = 0,
        shown: tuple[str, Sequence[str]] = ("", ()),
    ) -> CallStart:
        """Just before a model call of `run_id`: whether it may go ahead (with a cap, it is
        then held as in flight, at the cost of the person's largest call today when that is
        more than nothing, until `end_call`), or the day's spend in words. Calls of the
        person's other runs in flight count as spent: when they are expected to reach the
        cap, this one would pass it and does not start, so concurrent runs too spend at most
        one call past the cap (as long as no call costs more than the largest one before it).

        `events` (encoded by EventLog) go to the run's log at `log_key` when the call may
        start, in the same script, cap or no cap: the call is on record as started as it is
        reserved, in one round trip. `log_ttl`: the log's time to live if they begin it.
        `shown`: the task library's usage counts (their key) and the demonstrations the call
        shows for the first time, counted in the same script when it may start (with
        `events`, which say they were selected)."""
        counts_key, demos = shown
        if demos and not events:  # the counts go with the events that say they were selected
            raise ValueError("demonstrations are counted with the call's events")
        per_day = self.limits.cost_per_day  # read once: a policy reload may change it
        if not per_day and not events:
            return CallStart(None, reserved=False)
        now = time.time()
        stale = now - self.stale  # a worker that died mid-call stops holding its place
        keys = self._call_keys(user_id)
        args = [per_day, run_id, now, stale, MAX_EVENTS_PER_RUN, log_ttl, len(demos), *demos]
        if events:
            keys.append(log_key)
            args += events
        if demos:
            keys.append(counts_key)
        started = int(self._begin_call(keys=keys, args=args))
        if started:
            if started & 2:
                said_full(run_id)
            return CallStart(None, reserved=per_day > 0, held=bool(started & 4))
        over = self.over_spend(user_id) or (
            f"your questions running now are expected to use the rest of today's "
            f"${per_day:.2f} of model time (UTC)."
        )
        return CallStart(over, reserved=False)

    def spend(self, user_id: str, cost: float, *, reserved: bool) -> None:
        """Add what a failed attempt cost to the day's spend (and to the largest call, if it
        is), while its call goes on; as `end_call`, for a call `reserved` under a cap even if
        the cap is gone since."""
        if (reserved or self.limits.cost_per_day) and cost > 0:
            self._write(Charge(self._call_keys(user_id), repr(cost), ""))

    def end_call(
        self, user_id: str, run_id: str, cost: float, *, reserved: bool, held: bool
    ) -> None:
        """The model call of `run_id` is over: what its answer cost is added to the day's
        spend (and is the largest call, if it is) as it stops counting as in flight (when it
        `held` a place), in one write: the run's next save, when this process holds the
        run's charges (`hold_charges`), else a script of its own. A call `begin_call`
        `reserved` is charged and ended even if a policy reload removed the cap meanwhile:
        its place would otherwise count against the person until it went stale, should the
        cap come back."""
        if not (reserved or self.limits.cost_per_day) or (cost <= 0 and not held):
            return
        ends = run_id if held else ""
        charge = Charge(self._call_keys(user_id), repr(cost) if cost > 0 else "0", ends)
        if run_id not in self._charges:
            self._write(charge)
            return
        pending = self._charges[run_id]
        self._charges[run_id] = charge
        if pending is not None:  # no save since the run's last call: that one, alone
            self._write(pending)

    def hold_charges(self, run_id: str) -> None:
        """Keep the charge of `run_id`'s model calls for its next save (`take_charge`), until
        `settle`: the caller holds the run's lease and saves after every model call. The
        cost is on the person's day from that save, after the step's reads, not from the
        answer: meanwhile the call counts against the cap at the day's largest call (none,
        when it holds no place). A step whose save never reaches Redis (its worker killed,
        or Redis gone then) leaves its call uncharged; the next worker does the step again
        and charges its own call, as a worker killed during the call always did. Kept as it
        is when already held (another slot of this process took the run over)."""
        self._charges.setdefault(run_id, None)

    def take_charge(self, run_id: str) -> Charge | None:
        """The charge the run's save is to write (None: none), no longer kept here."""
        charge = self._charges.get(run_id)
        if charge is not None:
            self._charges[run_id] = None
        return charge

    def put_back(self, run_id: str, charge: Charge | None) -> None:
        """A charge `take_charge` gave for a save that Redis refused before running it."""
        if charge is not None and run_id in self._charges:
            self._charges[run_id] = charge

    def settle(self, run_id: str) -> None:
        """Stop holding the run's charges; one no save wrote (the step failed before its
        save, or Redis refused it unrun) is written now, alone. Never raises: a charge Redis
        refuses again is said in the log (`run_charge_unwritten`) and not kept."""
        charge = self._charges.pop(run_id, None)
        if charge is None:
            return
        try:
            self._write(charge)
        except redis.RedisError as exc:
            log.warning("run_charge_unwritten", run_id=run_id, cost=charge.cost, error=brief(exc))

    def _write(self, charge: Charge) -> None:
        self._spend(keys=charge.keys, args=[charge.cost, charge.ends])

    def check(self, user_id: str) -> None:
        """Before a question is accepted: the rate and the day's spend, in one script."""
        per_minute, per_day = self.limits.runs_per_minute, self.limits.cost_per_day
        if not (per_minute or per_day):
            return
        minute = self.keys.person(user_id, "minute:" + str(int(time.time() // 60)))
        keys = [minute, self._cost_key(user_id)]
        count, spent = self._check(keys=keys, args=[per_minute, per_day])
        if per_minute and int(count) > per_minute:
            raise LimitExceeded(
                f"You asked {int(count)} questions this minute; the limit is {per_minute} a "
                "minute. Please ask again in a minute."
            )
        over = _over(float(spent), per_day)
        if over is not None:
            raise LimitExceeded(
                over[0].upper() + over[1:] + " Please ask again tomorrow or ask an admin."
            )

    def over_spend(self, user_id: str) -> str | None:
        """Before every model call of a run (and when a question is asked): the day's spend
        in words when it has reached the cap, else None. Checked per call, not only when a
        question is accepted, so neither a run admitted later from the person's line nor a
        long run can spend past the cap by more than the one call that crossed it."""
        per_day = self.limits.cost_per_day
        if not per_day:
            return None
        return _over(float(self.redis.get(self._cost_key(user_id)) or 0), per_day)

    def admit(self, user_id: str, run_id: str) -> bool:
        """True when the run may be queued now; False when it waits in the person's line."""
        limit = self.limits.runs_in_flight
        if not limit:
            return True
        now = time.time()
        keys = [*self._line_keys(user_id), self.keys.lines]
        args = [run_id, limit, now, now - self.stale, user_id]
        return bool(self._admit(keys=keys, args=args))

    def _line_keys(self, user_id: str) -> list[str]:
        return [self.keys.person(user_id, "active"), self.keys.person(user_id, "waiting")]

    def release(self, user_id: str, run_id: str, due_key: str) -> list[str]:
        """The run stops counting; returns the runs of this person admitted in its place."""
        limit = self.limits.runs_in_flight
        if not limit:
            return []
        return self._released(user_id, run_id, limit, due_key)

    def drain(self, user_id: str, due_key: str) -> list[str]:
        """The sweeper's look at a person's line: the runs admitted from it now that there is
        room (places gone stale, a limit raised), all of them once there is no limit (a
        policy reload removed it: nothing else would ever admit them)."""
        return self._released(user_id, "", self.limits.runs_in_flight, due_key)

    def lines(self) -> list[str]:
        """People who may have questions waiting in their line (at most LINES_A_PASS)."""
        found = self.redis.srandmember(self.keys.lines, LINES_A_PASS)
        return [user.decode() for user in found or ()]

    def releasing(self, user_id: str, run_id: str, due_key: str) -> Release | None:
        """`release` as a save writes it (None: no limit, nothing to give back)."""
        limit = self.limits.runs_in_flight
        return self._releasing(user_id, run_id, limit, due_key) if limit else None

    def _releasing(self, user_id: str, run_id: str, limit: int, due_key: str) -> Release:
        keys = [*self._line_keys(user_id), due_key, self.keys.lines]
        now = time.time()
        return Release(keys, run_id, limit, now, now - self.stale, user_id)

    def _released(self, user_id: str, run_id: str, limit: int, due_key: str) -> list[str]:
        release = self._releasing(user_id, run_id, limit, due_key)
        return admitted(self._release(keys=release.keys, args=release.args()))

    def waiting(self, user_id: str) -> int:
        return int(self.redis.llen(self.keys.person(user_id, "waiting")))


def admitted(reply: list[bytes]) -> list[str]:
    """The run ids a release's script answered."""
    return [a.decode() for a in reply]


def _over(spent: float, per_day: float) -> str | None:
    """The day's spend in words when it has reached the cap (0: none), else None."""
    if not per_day or spent < per_day:
        return None
    return (
        f"your questions today have used ${spent:.2f} of model time; the limit is "
        f"${per_day:.2f} a day (UTC)."
    )
