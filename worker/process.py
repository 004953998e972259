"""A worker process: `concurrency` RQ worker loops in threads, plus Switchboard's sweeper.

A run spends almost all its working time waiting on the model's HTTP answer, so one process
carries many runs: each slot is an RQ `SimpleWorker` loop in its own thread, taking jobs from
the one RQ queue, so RQ stays the queue and the scheduler (a run's `advance` job skips RQ's
per-job registries: `SlotWorker.execute_job`). Chosen by measurement (bench/bench_latency.py):
the GIL is released on every socket wait and a step's CPU is milliseconds. Their limit, also
measured: CPU per run grows with the slots (the GIL handed over at every blocking call), so
one process carried 1,000 runs at 1.8x the time of four processes of 250 (bench/README.md).
By default the threads are gevent's greenlets (worker/pool.py): the same code, every wait a
hand-over on one event loop, and 1,000 runs in one process within 1.1-1.4x of four.

SimpleWorker runs jobs in the worker process instead of forking one per job: measured here,
two fork-per-job workers did ~74 no-op jobs/s and two SimpleWorkers ~370. Forking buys crash
isolation, but a run's state is in Redis and crashed runs are recovered by lease expiry and
the sweeper, so Switchboard does not need RQ to notice a dead work-horse.

Signals reach only the main thread, so it owns them: the first SIGINT/SIGTERM stops taking
jobs in every slot (idle slots are woken from their blocking dequeue, or get their turn to
wait in it, and leave, so none takes the job of a run just handed back) and asks every run
in flight to hand itself back to the queue at its next step (`Runtime.stopping`); runs still
busy when the grace period ends are recovered by the sweeper once their leases lapse. A
second signal stops at once.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import redis
import structlog
from rq import Queue, SimpleWorker
from rq.exceptions import DequeueTimeout, StopRequested
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.job_lifecycle import format_exc_info
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException
from rq.utils import now
from rq.worker import WorkerStatus

from tools.exceptions import brief
from worker import memory, pool, runtime
from worker.runtime import Runtime
from worker.sweeper import Sweeper
from worker.watchdog import WatchdogDeathPenalty

log = structlog.get_logger(__name__)

DEFAULT_GRACE_SECONDS = 25.0  # Kubernetes waits 30 s between SIGTERM and SIGKILL
SLOT_RESTART_SECONDS = 1.0  # a slot whose loop died (Redis went away) is started again after
HEARTBEAT_EVERY = 10.0  # a slot's RQ heartbeat is sent at most this often (SlotWorker.heartbeat)
SUSPENSION_CHECK_EVERY = 1.0  # s: how often a slot asks whether `rq suspend` paused the workers
# The job a slot runs with its own bookkeeping instead of RQ's (SlotWorker.execute_job): a
# run's `advance`, every job but the rare approval expiries.
LEAN_FUNC = "worker.jobs.advance"
DEQUEUERS = 8  # a process's idle slots that wait in Redis for a job at once (SlotQueue)


# What a blocking command answers when CLIENT UNBLOCK ... ERROR wakes it.
UNBLOCKED_BY_CLIENT = "UNBLOCKED client unblocked via CLIENT UNBLOCK"


class Turns:
    """The turns a process's idle slots take to wait in Redis for a job (`SlotQueue`)."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._changed = threading.Condition()

    def take(self, timeout: float, stopping: threading.Event) -> bool:
        """Wait up to `timeout` seconds for a turn. False if none came, or once `stopping`
        is set (`wake_all` then ends the wait)."""
        with self._changed:
            self._changed.wait_for(lambda: self._free > 0 or stopping.is_set(), timeout)
            if self._free == 0 or stopping.is_set():
                return False
            self._free -= 1
            return True

    def give_back(self) -> None:
        with self._changed:
            self._free += 1
            self._changed.notify()

    def wake_all(self) -> None:
        """Every slot waiting for a turn looks at its process's `stopping` again."""
        with self._changed:
            self._changed.notify_all()


class SlotQueue(Queue):
    """RQ's queue, as the slots of one process dequeue from it. Made per process by
    `slot_queue_class`.

    Once the process is stopping, a slot leaves RQ's loop instead of waiting for another job
    (RQ itself looks at its stop flag only between jobs).

    At most DEQUEUERS of a process's idle slots wait in Redis for a job at once (RQ's
    blocking BLMOVE, each on a connection of its own); the others wait in the process for a
    turn, which a slot gives back as soon as Redis has answered it. So a burst is taken
    DEQUEUERS jobs a round trip, and each job is then read by the slot that took it, outside
    its turn. Before, every idle slot held a connection blocked in Redis: at 1,000 idle
    slots, on a worker just started, its RSS was 126.3 MiB against 113.0 now and Redis's
    memory 18.6 MiB against 5.3 (bench/README.md, "Sixteenth session"). The price: should
    those few connections hang without an answer (a network that drops packets silently),
    the process takes no job until the socket timeout ends their wait (60 s,
    switchboard/redisconn.py), where before the slots that became free still did."""

    stopping: ClassVar[threading.Event] = threading.Event()
    turns: ClassVar[Turns] = Turns(DEQUEUERS)

    @classmethod
    def dequeue_any(cls, *args: Any, **kwargs: Any) -> tuple[Job, Queue] | None:
        if cls.stopping.is_set():
            raise StopRequested
        return super().dequeue_any(*args, **kwargs)

    @classmethod
    def lmove(cls, connection: Any, queue_key: str, timeout: int | None) -> Any:
        """RQ's pop on Redis 6.2 and later (BLMOVE), in a turn when it blocks."""
        if timeout is None:  # answered at once (a burst worker's): nothing to wait for
            return super().lmove(connection, queue_key, timeout)
        with cls._turn(timeout, [queue_key]) as left:
            return super().lmove(connection, queue_key, left)

    @classmethod
    def lpop(cls, queue_keys: Any, timeout: int | None, connection: Any = None) -> Any:
        """RQ's pop on an older Redis (BLPOP), in a turn when it blocks."""
        if timeout is None:
            return super().lpop(queue_keys, timeout, connection)
        with cls._turn(timeout, list(queue_keys)) as left:
            return super().lpop(queue_keys, left, connection)

    @classmethod
    @contextlib.contextmanager
    def _turn(cls, timeout: int, keys: list[str]) -> Iterator[int]:
        """A turn to wait in Redis, and how long to wait there: what is left of `timeout` (RQ's
        loop heartbeats between dequeues), in whole seconds as RQ gives it (BLPOP before Redis 6
        takes no fraction), at least one."""
        began = time.monotonic()
        if not cls.turns.take(timeout, cls.stopping):
            if cls.stopping.is_set():
                raise StopRequested
            raise DequeueTimeout(timeout, keys)
        try:
            yield max(1, math.ceil(timeout - (time.monotonic() - began)))
        finally:
            cls.turns.give_back()


def _is_lean(job: Job) -> bool:
    try:
        return job.func_name == LEAN_FUNC
    except Exception:  # a job this release cannot read: RQ's path fails it, as it would
        return False


def slot_queue_class(stopping: threading.Event) -> type[SlotQueue]:
    """A queue class for slots that `stopping` stops and that share their turns to wait in
    Redis: one per worker process (`serve`)."""
    return type("SlotQueue", (SlotQueue,), {"stopping": stopping, "turns": Turns(DEQUEUERS)})


class SlotWorker(SimpleWorker):
    """One slot of a worker process: RQ's SimpleWorker loop, run in a thread."""

    # RQ's default job timeout uses SIGALRM, which only the main thread can receive.
    death_penalty_class = WatchdogDeathPenalty

    def __init__(
        self, *args: Any, slot: int = 0, stopping: threading.Event | None = None, **kwargs: Any
    ) -> None:
        self.slot = slot
        self.stopping = stopping or threading.Event()
        self._beat_at = self._beat_until = float("-inf")  # no heartbeat sent yet
        self._suspension_checked = float("-inf")
        super().__init__(*args, **kwargs)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """A stopping process takes no new job in any slot. RQ checks its stop flag only
        between jobs, and an idle slot waits in a blocking dequeue: without this, the job of
        a run just handed back went to the next idle slot, which handed it back again, once
        per slot (31 `handed_back` events for one run at concurrency 32). The job goes back to
        the front of the queue, untouched, for another process."""
        try:
            result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        except redis.ResponseError as exc:  # woken by `unblock_idle_slots`: it took nothing
            if not str(exc).startswith(UNBLOCKED_BY_CLIENT):
                raise
            if self._stop_requested or self.stopping.is_set():
                return None
            # another process with this pid (another host) is stopping: wait again
            return self.dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        if result is None or not (self._stop_requested or self.stopping.is_set()):
            return result
        job, queue = result
        pipe = self.connection.pipeline()  # MULTI: the job is in exactly one of the two lists
        pipe.lrem(IntermediateQueue.get_intermediate_queue_key(queue.key), 1, job.id)
        queue.push_job_id(job.id, pipeline=pipe, at_front=True)
        pipe.execute()
        self._stop_requested = True
        log.debug("worker_slot_gave_back_job", slot=self.slot, job_id=job.id)
        return None  # RQ's loop then ends, as after an idle timeout

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's heartbeat (HSET last_heartbeat and two EXPIREs), left out when one sent less
        than HEARTBEAT_EVERY ago already keeps the registration alive as long, less that
        interval: RQ beats before and after every dequeue, after every job and at every
        suspension check, four to six times for a job that takes milliseconds (15 of a
        four-call run's 167 Redis commands). Liveness is read with 75 s of slack
        (worker/fleet.py), a busy slot is told by its state, and a job's start, which asks
        for the job's longer time to live, still beats unless one just sent covers it: what
        reads the registration sees no change. Sent on its own, its three commands go in one
        round trip (RQ sends each alone)."""
        ttl = timeout or self.worker_ttl + 60
        now = time.monotonic()
        recent = now - self._beat_at < HEARTBEAT_EVERY
        if recent and self._beat_until >= now + ttl - HEARTBEAT_EVERY:
            return
        if pipeline is None:
            pipe = self.connection.pipeline(transaction=False)
            super().heartbeat(timeout, pipe)
            pipe.execute()
        else:
            super().heartbeat(timeout, pipeline)
        self._beat_at, self._beat_until = now, now + ttl

    def execute_job(self, job: Job, queue: Queue) -> None:
        """An `advance` job, run with the bookkeeping it needs instead of RQ's (~41 Redis
        commands in 9 round trips a job: an execution record, the started and finished
        registries, the result stream, job counters, dependents; bench_redis_commands.py).
        A run's state, its recovery and its exactly-once guarantees are Switchboard's (the
        lease, the due set, the sweeper), none of them RQ's registries': a job whose worker
        dies is not looked for in RQ's started registry, the sweeper queues its run again
        once the lease lapses. What is kept: the job leaves the intermediate queue (else
        RQ's maintenance would fail it as stuck there after a minute), the slot reads busy
        and its registration outlives the job, the job's timeout, the job's key bounded by
        that timeout (a worker killed mid-job leaves nothing for good), and a job that
        raises is handled as RQ does (logged, kept in the failed registry). One round trip
        before the job, one after it, 5 commands and the state writes. Other jobs take
        RQ's path, untouched. `Runtime.enqueue_advance` gives the job no dependents,
        callbacks, retries or repeats, which this path would not honour."""
        if not _is_lean(job):
            super().execute_job(job, queue)
            return
        try:
            ttl = self.get_heartbeat_ttl(job)
            pipe = self.connection.pipeline(transaction=False)
            # in this order: a pipeline applied only in part (a connection lost, a
            # failover) leaves the job's key bounded, or the job in the intermediate queue
            pipe.expire(job.key, ttl)
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            self.heartbeat(ttl, pipeline=pipe)
            pipe.execute()
        except Exception as exc:  # not taken, not run. Its run stays due, and the sweeper
            # queues it again once no job of the run is queued; a job left in the
            # intermediate queue is recorded by RQ's maintenance, a minute later, as stuck
            # there (failed). The slot's loop goes on (its next command says whether Redis
            # is back).
            log.warning("worker_slot_job_not_taken", job_id=job.id, error=brief(exc))
            return
        succeeded = False
        try:  # as in RQ's `perform_job`, whatever fails here fails the job, not the slot's loop
            job.started_at = now()
            timeout = job.timeout or self.queue_class.DEFAULT_TIMEOUT
            with self.death_penalty_class(timeout, JobTimeoutException, job_id=job.id):
                job.perform()
            succeeded = True
        except Exception:
            job.ended_at = now()
            exc_info = sys.exc_info()
            self.handle_exception(job, *exc_info)
            # logs, never raises: a Redis that refuses the record leaves the job to expire
            self.handle_job_failure(job, queue, exc_string=format_exc_info(exc_info))
        try:
            pipe = self.connection.pipeline(transaction=False)
            if succeeded:  # its result is not read: the run's state is in its document
                pipe.delete(job.key)
            self.set_state(WorkerStatus.IDLE, pipeline=pipe)
            pipe.execute()
        except Exception as exc:  # the key expires with the job's timeout; the loop goes on
            log.warning("worker_slot_job_not_closed", job_id=job.id, error=brief(exc))

    def check_for_suspension(self, burst: bool) -> None:
        """RQ asks Redis whether the workers are suspended (`rq suspend`) before every job (a
        MULTI/EXISTS/EXEC); a slot asks at most every SUSPENSION_CHECK_EVERY seconds."""
        at = time.monotonic()
        if at - self._suspension_checked < SUSPENSION_CHECK_EVERY:
            return
        super().check_for_suspension(burst)
        self._suspension_checked = time.monotonic()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        """RQ's state write, left out when the slot is in that state already (RQ sets `idle`
        twice between two jobs)."""
        if pipeline is None and state == self.get_state():
            return
        super().set_state(state, pipeline)

    def _install_signal_handlers(self) -> None:
        """The process's main thread owns the signals (see `serve`)."""

    # RQ's per-worker command channel (`rq.command.send_shutdown_command`...) is not used:
    # a worker process is stopped by its signals. Subscribing costs a thread and a Redis
    # connection per slot, and joining that thread ~0.2 s per burst worker.
    def subscribe(self) -> None:
        """Not subscribed: see above."""

    def unsubscribe(self) -> None:
        """Not subscribed: see above."""

    # Registry cleaning: once per process, not per slot.
    @property
    def should_run_maintenance_tasks(self) -> bool:
        return self.slot == 0 and bool(super().should_run_maintenance_tasks)


# Workers made without a name (`switchboard eval`, tests: one burst at a time) are still named
# HOST.PID.N, as slots are: RQ names its connection after its worker, and the embedded Redis
# is stopped at exit only when it can tell every connection's process (switchboard/redisconn).
_UNNAMED = itertools.count(10_000)


def make_worker(
    rt: Runtime,
    slot: int = 0,
    name: str | None = None,
    queue_class: type[SlotQueue] | None = None,
) -> SlotWorker:
    """A slot's RQ worker. `queue_class` (`slot_queue_class`) is its process's, shared by its
    slots; without one, the worker waits in Redis on its own turn."""
    return SlotWorker(
        [rt.queue.name],  # built by RQ as a SlotQueue, the class it must be
        connection=rt.redis,
        serializer=JSONSerializer,
        name=name or f"{socket.gethostname()}.{os.getpid()}.{next(_UNNAMED)}",
        slot=slot,
        stopping=rt.stopping,
        queue_class=queue_class or slot_queue_class(rt.stopping),
        # RQ's own liveness bookkeeping; Switchboard's recovery does not wait for it.
        worker_ttl=60,
        maintenance_interval=60,
    )


class Slot:
    """A worker loop in a thread; started again if its loop ends while the process runs."""

    def __init__(
        self, rt: Runtime, index: int, burst: bool, queue_class: type[SlotQueue] | None = None
    ) -> None:
        self.rt, self.index, self.burst = rt, index, burst
        self.queue_class = queue_class or slot_queue_class(rt.stopping)
        name = f"{socket.gethostname()}.{os.getpid()}.{index}"
        self.worker = make_worker(rt, index, name=name, queue_class=self.queue_class)
        self.thread = threading.Thread(target=self._work, name=f"slot-{index}", daemon=True)
        self.ended_at: float | None = None

    def start(self) -> None:
        self.thread.start()

    def _work(self) -> None:
        try:
            self.worker.work(burst=self.burst, logging_level="WARNING")
        except Exception:  # the thread boundary: log it; the process starts the slot again
            log.exception("worker_slot_failed", slot=self.index)
        finally:
            self.ended_at = time.monotonic()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    @property
    def busy(self) -> bool:
        return self.alive and self.worker.get_state() == WorkerStatus.BUSY

    def request_stop(self) -> None:
        self.worker._stop_requested = True  # RQ's own flag: leave the loop after this job

    def restarted(self) -> Slot:
        return Slot(self.rt, self.index, self.burst, self.queue_class)


def serve(
    rt: Runtime,
    *,
    concurrency: int | None = None,
    burst: bool = False,
    grace: float = DEFAULT_GRACE_SECONDS,
    on_tick: Callable[[bool], object] | None = None,
) -> None:
    """Work the queue with `concurrency` slots until stopped (or, with `burst`, until the queue
    is empty). RQ's scheduler runs in the sweeper thread (see worker/sweeper.py).
    `on_tick(busy)` is told at every turn of the main loop whether any slot is busy; by default
    the process gives its free memory back each time it goes idle, and its collector leaves
    what start-up made alone (worker/memory.py)."""
    runtime.install(rt)
    memory.limit_arenas()  # before the slots' threads allocate (each would get an arena)
    tick = on_tick or memory.IdleHook().observe
    count = max(1, concurrency or rt.settings.concurrency)
    signals = Signals(on_hangup=rt.policy_watcher.wake if rt.policy_watcher else None)
    if rt.policy_watcher is not None:
        rt.policy_watcher.start()  # a changed policy file, within its interval or on SIGHUP
    sweeper = Sweeper(rt)
    queue_class = slot_queue_class(rt.stopping)  # the slots share their turns (SlotQueue)
    slots = [Slot(rt, i, burst, queue_class) for i in range(count)]
    sweeper.start()
    for slot in slots:
        slot.start()
    # what start-up made, out of the collector's sight: the process's memory is the default
    # tick's to look after (a caller's own `on_tick` takes that over, a test's process too)
    frozen = memory.settle_collector() if on_tick is None else 0
    log.info(
        "worker_started",
        queue=rt.queue.name,
        concurrency=count,
        pool=pool.active(),
        gc_frozen=frozen,
    )
    try:
        while not signals.stop.wait(0.2):
            if burst and not any(s.alive for s in slots):
                return
            tick(any(s.busy for s in slots))
            if not burst:
                slots = [_replace_ended(s) for s in slots]
        log.info("worker_stopping", in_flight=len(rt.leases.held()), grace=grace)
        drain(rt, slots, grace)
    finally:
        signals.restore()
        if rt.policy_watcher is not None:
            rt.policy_watcher.stop()
        sweeper.stop()
        for slot in slots:
            if slot.alive:  # idle in RQ's blocking dequeue: it goes with the process
                slot.worker.register_death()
        log.info("worker_stopped", still_held=len(rt.leases.held()))


def drain(rt: Runtime, slots: list[Slot], grace: float) -> None:
    """Take no new jobs; runs in flight hand themselves back at their next step. Returns when
    no slot is busy or after `grace` seconds."""
    rt.stopping.set()
    for slot in slots:
        slot.request_stop()
    unblock_idle_slots(rt)
    for queue_class in {slot.queue_class for slot in slots}:
        queue_class.turns.wake_all()  # those waiting for a turn leave too
    deadline = time.monotonic() + grace
    while any(s.busy for s in slots) and time.monotonic() < deadline:
        time.sleep(0.05)


def unblock_idle_slots(rt: Runtime) -> int:
    """Wake this process's slots from RQ's blocking dequeue (CLIENT UNBLOCK ... ERROR: the
    command fails with UNBLOCKED, which `SlotWorker` takes as "nothing taken"), so they leave
    RQ's loop now (`SlotQueue`) rather than take the job of a run just handed back. Not the
    TIMEOUT form: Redis 7.0 (Debian 12's 7.0.15) crashes on it when the dequeue is held back
    by CLIENT PAUSE WRITE, as during an operator's failover (found by the chaos soak: a
    worker stopped during a failover took the primary down). This process's connections are
    named after it (`switchboard-PID`, or RQ's worker name `HOST.PID.SLOT`); a process on
    another host with the same pid (containers: often 1) is woken too, harmlessly: its
    slots, not stopping, just wait again. A Redis that refuses CLIENT commands leaves the
    slots blocked; a job one of them takes then goes back to the queue untouched
    (`dequeue_job_and_maintain_ttl`)."""
    pid, host = os.getpid(), re.escape(socket.gethostname())
    mine = re.compile(rf"switchboard-{pid}|{host}\.{pid}\.\d+")
    try:
        clients = rt.redis.client_list()
        blocked = [
            c["id"]
            for c in clients
            if c.get("cmd") in ("blmove", "blpop") and mine.fullmatch(c.get("name", ""))
        ]
        for client_id in blocked:
            rt.redis.client_unblock(int(client_id), error=True)
    except redis.RedisError as exc:
        log.warning("worker_unblock_failed", error=brief(exc))
        return 0
    return len(blocked)


def _replace_ended(slot: Slot) -> Slot:
    if slot.alive or slot.ended_at is None:
        return slot
    if time.monotonic() - slot.ended_at < SLOT_RESTART_SECONDS:
        return slot
    log.warning("worker_slot_restarted", slot=slot.index)
    fresh = slot.restarted()
    fresh.start()
    return fresh


class Signals:
    """SIGINT/SIGTERM: the first asks for a graceful stop, the second stops at once."""

    def __init__(self, on_hangup: Callable[[], None] | None = None) -> None:
        self.stop = threading.Event()
        self.main = pool.current()  # the thread (or greenlet) that stops the process
        self.previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._on_signal)
            if on_hangup is not None:  # SIGHUP: look at the policy file now
                self.previous[signal.SIGHUP] = signal.signal(
                    signal.SIGHUP, lambda _signum, _frame: on_hangup()
                )

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop.is_set():
            try:  # said if it can be: the handler may interrupt a write to stderr of its own
                log.warning("worker_stop_now", signal=signal.Signals(signum).name)
            finally:  # thread, which a second write may refuse (a reentrant call): it stops
                # Raised here in the main thread. Under gevent (worker/pool.py) the handler
                # runs in whichever greenlet holds the thread, a slot's say, where SystemExit
                # would end that greenlet only: it is thrown into the main one, where it
                # waits (a Redis reply, a sleep).
                if threading.current_thread() is threading.main_thread():
                    raise SystemExit(1)
                if pool.active() == "gevent":
                    pool.interrupt(self.main, SystemExit(1))
        self.stop.set()

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
