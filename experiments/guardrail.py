"""The guardrail: a variant significantly worse than control on the experiment's goal metric or on any of
its guardrail metrics (``Experiment.metrics``: CTR the goal and conversions per user a guardrail by
default) is stopped by itself; a ramp moves up only while nothing is worse; a winner on the goal metric
takes its registry alias. (Each check also records a snapshot of the counts: the results' effect over time.)

Every ``interval_s`` one worker per replica analyses its running experiments from the shared counters
(experiments.state; serving runs the loop and picks that worker) and decides; the replica's other
workers ``check(decide=False)``: they read the same counters and decisions and act on them, writing
nothing. A
treatment is stopped when the always-valid confidence sequence for its relative effect on one of those
metrics (CUPED-adjusted where the pre-exposure covariate explains something: experiments.metrics) lies
wholly on the worse side of zero (``experiments.stats``: looking every interval does not inflate false alarms,
which a fixed-horizon test would) and both arms have at least ``min_users``. The decision is
written to the ledger once (the first replica's stands: HSETNX in Redis), so every replica reads the
same list; its users then leave the experiment — they get the default experience (no variant
overrides) and their lists are logged outside it, so the stopped arm's numbers freeze and control's
stay clean.

A safe rollout (``Experiment.ramp``) starts at its first coverage step and moves to the next once the
step has been held ``ramp_hold_s`` with every arm at ``min_users`` and no arm stopped; each step is
recorded once, like a stop. An experiment with ``promote`` ends when a treatment that serves its own
model is significantly *better* under the same sequential test: the winner is recorded once and that
replica moves the alias (e.g. ``champion``) to the winner's version — every replica's model watcher
then hot-reloads it — and everyone leaves the experiment. That happens by itself only where the users
are verified (``auto_promote``: the service sets it with DINREC_USER_HEADER): where any client may name
any user, bots could pick the winner, so the winner is *proposed* — recorded once, shown on the results
— and :meth:`Guardrail.approve` (an operator, ``POST /admin/experiments/{name}/approve``) promotes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from dinrec.experiments.metrics import METRICS, compare_metric
from dinrec.experiments.running import Experiments
from dinrec.experiments.spec import Experiment, Variant
from dinrec.experiments.state import ExperimentState
from dinrec.experiments.stats import VariantSums, corrected, intersect, srm_p_value, verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Standing:
    """What requests need to know of one experiment between checks."""

    stopped: frozenset[str] = frozenset()
    coverage: float | None = None  # the ramp step in force (None: the experiment's own coverage)
    concluded: bool = False  # a winner was promoted: nobody is in the experiment any more
    held: tuple[str, ...] = ()  # why the counts are not trusted to act on (integrity), if they are not


# Bot-shaped arms. A click drawn at random comes, on average, from a user with c2/c clicks in the
# experiment: people click a few times, a script hundreds. And people click a fraction of what they are
# shown; "everything shown" is a script's rate.
BOT_CLICKS_PER_CLICKER = 50.0  # c2 / c above this (with at least MIN_CLICKS_JUDGED clicks): a few users click it all
BOT_CTR = 0.5  # an arm clicking half of what it is shown, twice another arm's rate
MIN_CLICKS_JUDGED = 100
# Buys likewise: a buy drawn at random comes from a user with b2/b buys in the experiment — a person's
# handful, or a script's hundreds (each capped at ab_user_cap).
BOT_BUYS_PER_BUYER = 20.0
MIN_BUYS_JUDGED = 50
MIN_IMPRESSIONS_JUDGED = 500


def integrity_problems(exp: Experiment, sums: dict[str, VariantSums], stopped: frozenset[str], *,
                       srm_alpha: float = 0.001) -> list[str]:
    """Why ``exp``'s counts should not be acted on: clicks beyond impressions in an arm, counts under a
    variant the experiment does not declare (forged or stale names), a sample-ratio mismatch among
    the arms still running (users did not split as the weights say: logging or assignment is broken,
    or someone is feeding the counters), or a bot-shaped arm — its clicks or buys concentrated in a few
    users, or a click-through rate no audience has (half of what is shown, twice another arm's). Empty: the
    counts look like an experiment's."""
    problems = []
    declared = {v.name for v in exp.variants}
    rates = {name: s.clicks / s.impressions for name, s in sums.items()
             if name in declared and s.impressions >= MIN_IMPRESSIONS_JUDGED}
    for name, s in sorted(sums.items()):
        if name not in declared:
            problems.append(f"counts under undeclared variant {name!r}")
        elif s.clicks > s.impressions:
            problems.append(f"{name}: {s.clicks:.0f} clicks on {s.impressions:.0f} impressions")
        elif s.clicks >= MIN_CLICKS_JUDGED and s.clicks_sq / s.clicks > BOT_CLICKS_PER_CLICKER:
            problems.append(f"{name}: clicks concentrated in a few users (a click comes from a user with "
                            f"{s.clicks_sq / s.clicks:.0f} clicks on average)")
        elif name in rates and rates[name] >= BOT_CTR and any(r * 2 <= rates[name] for r in rates.values()):
            problems.append(f"{name}: {100 * rates[name]:.0f}% of what it shows is clicked, over twice another "
                            "arm's rate")
        elif s.buys >= MIN_BUYS_JUDGED and s.buys_sq / s.buys > BOT_BUYS_PER_BUYER:
            problems.append(f"{name}: buys concentrated in a few users (a buy comes from a user with "
                            f"{s.buys_sq / s.buys:.0f} buys on average)")
    live = [v.name for v in exp.variants if v.name not in stopped]
    weights = exp.weights
    p = srm_p_value([sums.get(v, VariantSums.empty()).users for v in live], [weights[v] for v in live])
    if p < srm_alpha:
        problems.append(f"sample ratio mismatch (p={p:.2g}): users per arm "
                        + ", ".join(f"{v} {sums.get(v, VariantSums.empty()).users}" for v in live))
    return problems


def _step_in_force(reached: list[dict], steps: list[float]) -> int:
    """The index of the ramp step in force, given the steps recorded (-1: none yet); a step past the
    list's end (the list was shortened since) is its last."""
    return min(len(reached), len(steps)) - 1


class Guardrail:
    def __init__(self, state: ExperimentState, experiments: Experiments, *, alpha: float = 0.05, min_users: int = 100,
                 interval_s: float = 30.0, promote: Callable[[str, str], str] | None = None,
                 auto_promote: bool = True) -> None:
        """``promote(alias, model)`` moves a registry alias to the version ``model`` (an alias or a
        version) names and returns that version; ``auto_promote=False``: a winner is proposed, and
        promoted when an operator approves it."""
        self.state, self.experiments = state, experiments
        self.alpha, self.min_users, self.interval_s = alpha, min_users, interval_s
        self.promote, self.auto_promote = promote, auto_promote
        self._standing: dict[str, Standing] = {}  # read by requests: replaced whole, never mutated
        # the running intersection of each arm's confidence sequence, per metric
        self._sequences: dict[tuple[str, str, str], tuple[float, float]] = {}

    def stopped(self, experiment: str) -> frozenset[str]:
        return self._standing.get(experiment, Standing()).stopped

    def held(self, experiment: str) -> list[str]:
        """Why the last check did not act on ``experiment``'s counts (empty: it could)."""
        return list(self._standing.get(experiment, Standing()).held)

    def assign(self, user_id: str) -> tuple[Experiment, Variant] | None:
        """The user's experiment and variant as the decisions stand: ramp coverage applied, stopped
        variants and concluded experiments left (their users get the default experience)."""
        standing = self._standing
        coverage = {name: s.coverage for name, s in standing.items() if s.coverage is not None}
        assigned = self.experiments.assign(user_id, coverage)
        if assigned is None:
            return None
        s = standing.get(assigned[0].name)
        if s is not None and (s.concluded or assigned[1].name in s.stopped):
            return None
        return assigned

    def check(self, decide: bool = True) -> list[dict]:
        """Analyse every running experiment once; stop what is significantly worse, move ramps, promote
        winners. Returns the decisions this call recorded (a replica that finds one recorded adopts it).
        ``decide=False``: only adopt what is recorded (stops, ramp steps, a winner) and see whether the
        counts can be trusted — what a replica's other workers do while one of them decides."""
        made: list[dict] = []
        standing = dict(self._standing)
        for exp in self.experiments.all:
            if exp.status != "running":
                continue
            if self.state.conclusion(exp.name) is not None:  # decided: the numbers stay as they were
                standing[exp.name] = Standing(concluded=True)
                continue
            sums = self.state.sums(exp.name)
            if not decide:
                stopped = frozenset(self.state.stopped(exp.name))
                standing[exp.name] = Standing(stopped, self._ramp_reached(exp),
                                              held=tuple(integrity_problems(exp, sums, stopped)))
                continue
            now = time.time()
            declared = {v.name for v in exp.variants}  # a forged name does not grow the dashboard's timeline
            self.state.snapshot(exp.name, int(now // self.interval_s), {  # one per interval, whoever is first
                "t": now, "variants": {v: asdict(s) for v, s in sums.items() if v in declared}})  # the effect then
            stopped = frozenset(self.state.stopped(exp.name))
            held = integrity_problems(exp, sums, stopped)
            if held:  # nothing is stopped, promoted or ramped on counts that do not add up: an operator looks
                log.error("guardrail holds %s: its counts are not trusted to act on: %s", exp.name, "; ".join(held))
                coverage = self._ramp(exp, now, green=False, made=made) if exp.ramp else None  # no step up
                standing[exp.name] = Standing(stopped, coverage, held=tuple(held))
                continue
            control = sums.get(exp.control_name, VariantSums.empty())
            concluded = False
            judged = min((sums.get(v.name, VariantSums.empty()).users for v in exp.variants),
                         default=0) >= self.min_users
            judgeable = [v for v in exp.variants if v.name != exp.control_name and v.name in sums
                         and min(control.users, sums[v.name].users) >= self.min_users]
            stopping = set(stopped)  # and those this check stops
            # Guardrail metrics first: an arm worse on one is stopped before the goal could promote it.
            for use in sorted((m for m in exp.metrics if m.role != "secondary"), key=lambda m: m.role == "goal"):
                metric = METRICS[use.name]
                # Several treatments: each acts only at Holm's level over all of them (experiments.stats.corrected).
                results = corrected([compare_metric(metric, control, sums[v.name], v.name, alpha=self.alpha)[0]
                                     for v in judgeable], self.alpha)
                for variant, r in zip(judgeable, results, strict=True):
                    if variant.name in stopping:
                        continue  # stopped before, or on an earlier metric of this check
                    treated = sums[variant.name]
                    low, high = self._sequences[(exp.name, variant.name, use.name)] = intersect(
                        self._sequences.get((exp.name, variant.name, use.name)), r.cs_low, r.cs_high)
                    evidence = {"metric": use.name, "lift": r.lift, "cs_low": low, "cs_high": high,
                                "users": {"control": control.users, "variant": treated.users}}
                    sequential = verdict(low, high, higher_is_better=use.direction == "higher") \
                        if r.sequential != "inconclusive" or len(results) == 1 else "inconclusive"
                    if sequential == "worse":
                        decision = {"experiment": exp.name, "variant": variant.name, "at": now,
                                    "reason": "guardrail", **evidence}
                        stopping.add(variant.name)  # by this call, or by another replica's first
                        if self.state.stop(exp.name, variant.name, decision):
                            log.warning("guardrail stopped %s/%s: %s lift %+.1f%% (always-valid CI %+.1f%% .. "
                                        "%+.1f%%)", exp.name, variant.name, use.name, 100 * r.lift, 100 * low,
                                        100 * high)
                            made.append(decision)
                    elif sequential == "better" and use.role == "goal" and exp.promote and variant.model \
                            and self.promote is not None and not concluded:
                        if not self.auto_promote:
                            made += self._propose(exp, variant, now, evidence)
                            continue
                        made += self._conclude(exp, variant, now, evidence)
                        concluded = True  # by this replica, or by another first: a winner stands either way
            stopped = frozenset(self.state.stopped(exp.name))  # with this check's stops
            coverage = self._ramp(exp, now, green=judged and not stopped, made=made) if exp.ramp else None
            standing[exp.name] = Standing(stopped, coverage, concluded)
        self._standing = standing
        return made

    @staticmethod
    def _winner(exp: Experiment, variant: Variant, now: float, reason: str, evidence: dict) -> dict:
        """The decision that ``variant`` wins ``exp`` (``reason``: winner, or proposed)."""
        return {"experiment": exp.name, "variant": variant.name, "at": now, "reason": reason,
                "model": variant.model, "alias": exp.promote, **evidence}

    def _propose(self, exp: Experiment, variant: Variant, now: float, evidence: dict) -> list[dict]:
        decision = self._winner(exp, variant, now, "proposed", evidence)
        if not self.state.propose(exp.name, decision):
            return []  # proposed already (the first proposal stands until approved)
        log.warning("experiment %s: %s would win (%s lift %+.1f%%, always-valid CI %+.1f%% .. %+.1f%%); users are "
                    "not verified, so it waits for an operator: POST /admin/experiments/%s/approve",
                    exp.name, variant.name, evidence.get("metric", "ctr"), 100 * evidence["lift"],
                    100 * evidence["cs_low"], 100 * evidence["cs_high"], exp.name)
        return [decision]

    def approve(self, experiment: str) -> dict:
        """Promote the winner proposed for ``experiment`` (an operator's call); returns the decision (with
        ``version`` once the alias moved). Raises LookupError when there is nothing to approve."""
        exp = self.experiments.get(experiment)
        proposal = self.state.proposal(experiment)
        if exp is None or proposal is None:
            raise LookupError(f"no winner proposed for experiment {experiment!r}")
        if self.state.conclusion(experiment) is not None:
            raise LookupError(f"experiment {experiment!r} has a winner already")
        variant = next((v for v in exp.variants if v.name == proposal["variant"]), None)
        if variant is None or self.promote is None or not exp.promote or not variant.model:
            raise LookupError(f"experiment {experiment!r} no longer promotes {proposal['variant']!r}")
        evidence = {k: proposal[k] for k in ("metric", "lift", "cs_low", "cs_high", "users") if k in proposal}
        made = self._conclude(exp, variant, time.time(), {**evidence, "approved": True})
        if not made:
            raise LookupError(f"experiment {experiment!r} has a winner already")
        self._standing = {**self._standing, experiment: Standing(concluded=True)}
        return made[0]

    def _conclude(self, exp: Experiment, variant: Variant, now: float, evidence: dict) -> list[dict]:
        decision = self._winner(exp, variant, now, "winner", evidence)
        if not self.state.conclude(exp.name, decision):
            return []  # another replica promoted it
        try:
            if self.promote is None or not exp.promote or not variant.model:  # checked by every caller
                raise LookupError(f"experiment {exp.name!r} does not promote {variant.name!r}")
            version = self.promote(exp.promote, variant.model)
        except Exception as exc:  # noqa: BLE001 - recorded once: an operator must finish it by hand
            log.error("experiment %s: %s won but moving alias %s to its model %s failed: %s",
                      exp.name, variant.name, exp.promote, variant.model, exc)
            return [decision]
        log.warning("experiment %s: %s won (%s lift %+.1f%%, always-valid CI %+.1f%% .. %+.1f%%); alias %s -> %s",
                    exp.name, variant.name, evidence.get("metric", "ctr"), 100 * evidence["lift"],
                    100 * evidence["cs_low"], 100 * evidence["cs_high"], exp.promote, version)
        return [{**decision, "version": version}]

    def _ramp_reached(self, exp: Experiment) -> float | None:
        """The coverage step recorded for ``exp`` (its first while none is: the decider records it)."""
        if not exp.ramp:
            return None
        return exp.ramp[max(_step_in_force(self.state.ramp_log(exp.name), exp.ramp), 0)]

    def _ramp(self, exp: Experiment, now: float, *, green: bool, made: list[dict]) -> float:
        """The coverage step in force, after moving to the next one if this one has been held long
        enough with every arm judged and none stopped."""
        steps = exp.ramp or []
        reached = self.state.ramp_log(exp.name)
        if not reached:
            self.state.ramp(exp.name, 0, {"step": 0, "coverage": steps[0], "at": now})
            reached = self.state.ramp_log(exp.name)
        at = _step_in_force(reached, steps)
        if green and at + 1 < len(steps) and now - reached[at]["at"] >= exp.ramp_hold_s:
            record = {"step": at + 1, "coverage": steps[at + 1], "at": now}
            if self.state.ramp(exp.name, at + 1, record):
                log.info("experiment %s: ramp to %.0f%% of users", exp.name, 100 * steps[at + 1])
                made.append({"experiment": exp.name, "reason": "ramp", **record})
            at += 1
        return steps[at]
