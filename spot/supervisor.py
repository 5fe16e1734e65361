"""`dinrec spot run`: keep a training job going on spot until it is done.

launch → wait → on an interruption relaunch (the next instance type first, then another zone) →
until the agent reports the job done, it fails, the budget is spent, the relaunch limit is hit, or
someone cancels it. Every decision is written to the job store before it is acted on the next
time round, so a supervisor that is itself restarted (``dinrec spot run --job-id …``) picks up the
same job, including an attempt still running.

One supervisor per job: it holds the job's lease (``lease.json`` in the job store, storage.Lease —
S3's conditional writes) while it supervises, so a second one started on the same job (a second
operator, a restarted pod beside a live one) raises :class:`storage.LeaseHeld` before it launches
anything; a supervisor that dies frees the job ``lease_s`` after its last renewal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dinrec.spot.backends import PROFILE_NOT_READY, Backend, Liveness
from dinrec.spot.catalog import InstanceType
from dinrec.spot.job import FINAL, Attempt, JobSpec, JobState, JobStatus, Outcome, now
from dinrec.spot.jobstore import JobStore
from dinrec.storage import CloudError, Lease

LEASE = "lease.json"

log = logging.getLogger(__name__)

SPEC, STATE, CANCEL = "job.json", "state.json", "cancel"


def load_state(store: JobStore) -> JobState:
    doc = store.get_json(STATE)
    return JobState.model_validate(doc) if doc is not None else JobState()


def request_cancel(store: JobStore) -> None:
    store.put_json(CANCEL, {"requested": now().isoformat()})


class Supervisor:
    def __init__(self, store: JobStore, spec: JobSpec, backend: Backend, catalog: dict[str, InstanceType],
                 spot_prices: dict[str, float] | None = None, *, poll_s: float = 15.0, lease_s: float = 60.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        unknown = [t for t in spec.instance_types if t not in catalog]
        if unknown:
            raise ValueError(f"unknown instance type(s) {unknown}")
        self.store, self.spec, self.backend, self.catalog = store, spec, backend, catalog
        self.spot_prices, self.poll_s, self.sleep = spot_prices or {}, poll_s, sleep
        self.state = load_state(store)
        self.lease = Lease(store, LEASE, ttl_s=lease_s)

    def save(self) -> None:
        """The state, as the lease's holder: fenced (storage.Lease.fenced_put_json), so a supervisor that
        stalled past its lease cannot overwrite its successor's. Without the lease (an operator's cancel)
        it is written as it is."""
        self.state.updated = now()
        doc = self.state.model_dump(mode="json")
        if self.lease.held:
            self.lease.fenced_put_json(self.store, STATE, doc)
            self.state.fence = self.lease.token
        else:
            self.store.put_json(STATE, doc)

    def _may_act(self) -> None:
        """Before terminating or cleaning up: a supervisor that lost the job (LeaseLost) touches nothing."""
        if self.lease.held:
            self.lease.check()

    def _finish(self, status: JobStatus, reason: str | None = None) -> JobState:
        self.state.status, self.state.reason = status, reason
        self.save()  # as the holder: checks the lease (fenced), so a lost job is not cleaned up below
        try:
            self.backend.cleanup(self.spec)
        except CloudError as exc:  # the job's outcome stands; leftovers are only reported
            log.warning("job %s: cleanup failed: %s", self.spec.job_id, exc)
        log.warning("job %s: %s%s", self.spec.job_id, status, f" ({reason})" if reason else "")
        return self.state

    def _candidates(self) -> tuple[list[InstanceType], str | None]:
        """After an interruption on type T in zone Z, try the other types first (T last), away from Z."""
        types = list(self.spec.instance_types)
        last = self.state.attempts[-1] if self.state.attempts else None
        if last is not None and last.outcome in ("interrupted", "lost") and last.instance_type in types:
            types.remove(last.instance_type)
            types.append(last.instance_type)
        return [self.catalog[t] for t in types], (last.zone if last is not None else None)

    def _stop_current(self, outcome: Outcome) -> None:
        current = self.state.current
        if current is not None:
            self._may_act()
            self.backend.terminate(current)  # the trainer checkpoints on the way down: resumable later
            current.ended, current.outcome = now(), outcome

    def _over_budget(self) -> str | None:
        spent, budget = self.state.spent_usd(), self.spec.budget_usd
        return f"${spent:.2f} of ${budget:.2f}" if budget is not None and spent >= budget else None

    def cancel(self) -> JobState:
        """Stop the current attempt and end the job (a supervisor running elsewhere stops at its next
        poll: it sees the cancel marker)."""
        request_cancel(self.store)
        if self.state.status in FINAL:
            return self.state
        self._stop_current("cancelled")
        return self._finish("cancelled", "cancel requested")

    def start(self) -> JobState:
        """Launch the first attempt unless one is running; return without supervising (raises LeaseHeld
        while another supervisor has the job)."""
        with self.lease:
            self.state = load_state(self.store)  # as the last holder left it
            if self.state.current is None and self.state.status not in FINAL:
                self._launch()
        return self.state

    def _launch(self) -> None:
        self.lease.check()  # a supervisor that lost the job (stalled past its lease) launches nothing
        n = len(self.state.attempts) + 1
        types, avoid_zone = self._candidates()
        launched = self.backend.launch(self.spec, n, types, avoid_zone)
        it = self.catalog.get(launched.instance_type, types[0])
        price = self.spot_prices.get(it.name, it.spot_usd) if launched.market == "spot" else it.on_demand_usd
        self.state.attempts.append(Attempt(n=n, backend_id=launched.backend_id, instance_type=launched.instance_type,
                                           market=launched.market, zone=launched.zone, price_usd_per_h=price,
                                           on_demand_usd_per_h=it.on_demand_usd))
        self.state.status = "running"
        self.save()
        log.warning("job %s: attempt %d on %s (%s, %s)", self.spec.job_id, n, launched.instance_type,
                    launched.market, launched.zone)

    def _settle(self, current: Attempt, live: Liveness) -> Outcome | None:
        """The attempt's outcome once it is over (None while it runs): the agent's report wins;
        a backend that knows the outcome itself (SageMaker) comes next; a vanished attempt without
        a report was reclaimed (spot) or lost."""
        report = self.store.get_json(f"attempts/{current.n}/status.json") or {}
        state = report.get("state")
        reported: Outcome | None = state if state in ("done", "interrupted", "failed") else None
        if reported is None and live.alive:
            return None
        if reported is None:
            reported = live.final_status or ("interrupted" if live.spot_reclaimed else "lost")
        if live.alive:
            self._may_act()
            self.backend.terminate(current)  # finished: stop paying now (the boot script also powers off)
        current.ended, current.outcome = now(), reported
        if live.billable_s is not None:
            current.billable_s = live.billable_s
        self.save()
        return reported

    def run(self) -> JobState:
        """Supervise the job to its end, holding its lease (raises LeaseHeld while another supervisor has it)."""
        with self.lease:
            self.state = load_state(self.store)  # as the last holder left it
            return self._supervise()

    def _supervise(self) -> JobState:
        if self.state.status in FINAL:
            return self.state
        failed_launches = 0
        while True:
            current = self.state.current
            if self.store.get_json(CANCEL) is not None:
                self._stop_current("cancelled")
                return self._finish("cancelled", "cancel requested")
            over_budget = self._over_budget()
            if current is None:
                relaunches = max(len(self.state.attempts) - 1, 0)
                if self.state.attempts and relaunches >= self.spec.max_relaunches:
                    return self._finish("retries_exhausted", f"{relaunches} relaunches")
                if over_budget:
                    return self._finish("budget_spent", over_budget)
                try:
                    self._launch()
                    failed_launches = 0
                except CloudError as exc:
                    if exc.code not in ("InsufficientInstanceCapacity", "SpotMaxPriceTooLow", "Unsupported",
                                        PROFILE_NOT_READY):
                        raise
                    failed_launches += 1  # no capacity now: wait and retry, but not forever
                    if failed_launches > self.spec.max_relaunches:
                        return self._finish("retries_exhausted", f"no capacity after {failed_launches} tries: {exc}")
                    log.warning("job %s: %s; retrying", self.spec.job_id, exc)
            elif over_budget:
                self._stop_current("cancelled")
                return self._finish("budget_spent", over_budget)
            else:
                outcome = self._settle(current, self.backend.poll(current))
                if outcome == "done":
                    return self._finish("done")
                if outcome in ("failed", "cancelled"):
                    return self._finish(outcome, f"attempt {current.n} {outcome}")
                if outcome is not None:
                    log.warning("job %s: attempt %d %s; relaunching", self.spec.job_id, current.n, outcome)
                    continue
            self.sleep(self.poll_s)


def cost_report(spec: JobSpec, state: JobState) -> dict:
    """Instance-hours by type and market, interruptions, spot $ vs the same hours on-demand."""
    by: dict[tuple[str, str], dict] = {}
    for a in state.attempts:
        row = by.setdefault((a.instance_type, a.market), {"instance_type": a.instance_type, "market": a.market,
                                                          "hours": 0.0, "usd": 0.0, "on_demand_usd": 0.0,
                                                          "attempts": 0})
        row["hours"] += a.hours()
        row["usd"] += a.cost()
        row["on_demand_usd"] += a.hours() * a.on_demand_usd_per_h
        row["attempts"] += 1
    spent = sum(r["usd"] for r in by.values())
    on_demand = sum(r["on_demand_usd"] for r in by.values())
    return {"job_id": spec.job_id, "status": state.status, "reason": state.reason,
            "attempts": len(state.attempts),
            "interruptions": sum(1 for a in state.attempts if a.outcome in ("interrupted", "lost")),
            "by_instance": sorted(by.values(), key=lambda r: -r["usd"]),
            "spent_usd": spent, "on_demand_usd": on_demand,
            "saved_pct": 100 * (1 - spent / on_demand) if on_demand > 0 else None}
