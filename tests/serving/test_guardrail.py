"""The guardrail stops a variant whose CTR is significantly worse — once, for every replica — and its
users leave the experiment; a variant that is merely different, or too small to judge, keeps running."""

from __future__ import annotations

import json

import pytest

from dinrec.events.schema import BehaviourEvent
from dinrec.experiments import open_state
from dinrec.experiments.guardrail import Guardrail, integrity_problems
from dinrec.experiments.running import Experiments
from dinrec.experiments.spec import Experiment
from dinrec.experiments.state_redis import RedisExperimentState
from dinrec.experiments.stats import VariantSums
from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.online.redis_store import RedisStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.metrics import ServiceMetrics
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN, wait_until
from tests.serving.conftest import live_server

EXPERIMENT = {"name": "risky", "status": "running", "seed": "g",
              "variants": [{"name": "control"}, {"name": "bad"}, {"name": "same"}]}


def buys(variant: str, users: int, each: int, prefix: str = "", value: float = 20.0) -> list[BehaviourEvent]:
    """``each`` buys by every one of ``users`` users of ``variant`` (as :func:`traffic` names them), after
    their exposure."""
    return [BehaviourEvent(event_id=f"buy-{prefix}{variant}-u{u}-{j}", event_type="buy",
                           user_id=f"{prefix}{variant}-u{u}", item_id=f"b{j}", ts=1.8e9 + 100 + j, value=value)
            for u in range(users) for j in range(each)]


def traffic(variant: str, users: int, shown: int, clicked: int, prefix: str = "",
            experiment: str = "risky") -> list[BehaviourEvent]:
    """``users`` users of ``variant``, each shown ``shown`` items in one request and clicking ``clicked``."""
    events = []
    for u in range(users):
        user, req = f"{prefix}{variant}-u{u}", f"{prefix}{variant}-r{u}"
        for p in range(shown):
            common = {"user_id": user, "item_id": f"i{p}", "ts": 1.8e9 + p, "request_id": req}
            events.append(BehaviourEvent(event_id=f"imp-{req}-{p}", event_type="impression", experiment=experiment,
                                         variant=variant, position=p, **common))
            if p < clicked or (p == clicked and u % 2):  # a little spread between users
                events.append(BehaviourEvent(event_id=f"clk-{req}-{p}", event_type="click", **common))
    return events


@pytest.mark.redis
def test_a_worse_variant_is_stopped_once_for_every_replica(redis_url, unique):
    store = RedisStore(redis_url, prefix=unique)
    experiments = Experiments([Experiment.model_validate(EXPERIMENT)])
    replica = RedisStore(redis_url, prefix=unique)  # another replica: its own connection and state
    one = Guardrail(open_state(store), experiments, min_users=100)
    two = Guardrail(RedisExperimentState(replica), experiments, min_users=100)
    store.write(traffic("control", 60, 10, 1) + traffic("bad", 60, 10, 0) + traffic("same", 60, 10, 1))
    assert one.check() == [] and open_state(store).stopped("risky") == {}  # 60 users an arm: too few to judge
    store.write(traffic("control", 300, 10, 1, "b") + traffic("bad", 300, 10, 0, "b")
                + traffic("same", 300, 10, 1, "b"))
    made = one.check()
    assert [d["variant"] for d in made] == ["bad"] and made[0]["cs_high"] < 0 < made[0]["users"]["variant"]
    assert two.check() == []  # the other replica finds the decision made and adopts it
    assert one.stopped("risky") == two.stopped("risky") == {"bad"}
    assert open_state(store).stopped("risky")["bad"]["at"] == made[0]["at"]  # the first decision stands
    store.flush_prefix()
    store.close()
    replica.close()


def test_the_service_stops_the_worse_arm_and_its_users_leave_the_experiment(tiny_run, tmp_path):
    path = tmp_path / "experiments.json"
    path.write_text(json.dumps({"experiments": [EXPERIMENT]}))
    store = MemoryStore()
    store.write(list(tiny_run[0].events()))
    exp = Experiments.load(path).get("risky")
    assert exp is not None
    bad_user = next(u for u in sorted(set(tiny_run[0].user_id.tolist()))
                    if (arm := exp.assign(u)) is not None and arm.name == "bad")
    settings = ServingSettings(bundle_dir=tiny_run[2], experiments_file=path, events_sink="store",
                               guardrail_interval_s=0.2, guardrail_min_users=50, score_precision="fp32")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        assert c.get("/recommend", params={"user_id": bad_user}).json()["variant"] == "bad"
        store.write(traffic("control", 200, 10, 1) + traffic("bad", 200, 10, 0) + traffic("same", 200, 10, 1))
        wait_until(lambda: c.get("/recommend", params={"user_id": bad_user}).json()["experiment"] is None,
                   timeout_s=20, what="the bad arm's user to leave the experiment")
        results = c.get("/experiments/risky/results").json()
        assert list(results["stopped"]) == ["bad"] and results["stopped"]["bad"]["reason"] == "guardrail"
        bad = [x for x in results["results"]["comparisons"] if x["variant"] == "bad"][0]
        assert bad["sequential"] == "worse" and bad["cs_high"] <= results["stopped"]["bad"]["cs_high"]  # it stands
        assert results["held"] == []
        same = [x for x in results["results"]["comparisons"] if x["variant"] == "same"][0]
        assert same["sequential"] == "inconclusive"  # equal CTR: left running


def test_a_replicas_other_workers_adopt_the_deciding_workers_decisions_and_write_nothing():
    store = MemoryStore()
    ramped = Experiment.model_validate({**EXPERIMENT, "ramp": [0.1, 0.5], "ramp_hold_s": 0})
    follower = Guardrail(open_state(store), Experiments([ramped]), min_users=50)
    leader = Guardrail(open_state(store), Experiments([ramped]), min_users=50)
    store.write(traffic("control", 300, 10, 1) + traffic("bad", 300, 10, 0) + traffic("same", 300, 10, 1)
                + traffic("ghost", 5, 10, 0))  # counts under a variant nobody declared: not to be trusted
    state = open_state(store)
    assert follower.check(decide=False) == []
    assert (state.stopped("risky"), state.ramp_log("risky"), state.timeline("risky")) == ({}, [], [])  # no writes
    assert follower.held("risky") == ["counts under undeclared variant 'ghost'"]  # it sees what the leader sees
    leader2 = Guardrail(open_state(store), Experiments([Experiment.model_validate(EXPERIMENT)]), min_users=50)
    made = leader2.check()  # without the ramp, so a stop can be made on clean counts...
    assert made == [] and leader2.held("risky")  # ...but these counts are held: nothing is decided on them
    store2 = MemoryStore()
    follower, leader = (Guardrail(open_state(store2), Experiments([ramped]), min_users=50) for _ in range(2))
    store2.write(traffic("control", 300, 10, 1) + traffic("bad", 300, 10, 0) + traffic("same", 300, 10, 1))
    assert [d["variant"] for d in leader.check() if d["reason"] == "guardrail"] == ["bad"]
    assert follower.check(decide=False) == []  # adopts the stop and the ramp step the leader recorded
    assert follower.stopped("risky") == leader.stopped("risky") == {"bad"}
    users = [f"user{i}" for i in range(2000)]
    assert [follower.assign(u) for u in users] == [leader.assign(u) for u in users]  # the same answer


def test_one_worker_of_a_replica_leads_and_another_takes_over_when_it_dies(tmp_path):
    from dinrec.serving.replica import ReplicaLead

    first, second = ReplicaLead(tmp_path, "guardrail"), ReplicaLead(tmp_path, "guardrail")
    assert first.holds() and not second.holds() and first.holds()
    first.close()  # what the kernel does when the leading worker dies
    assert second.holds() and not first.holds()
    second.close()
    assert ReplicaLead(None, "guardrail").holds()  # one process: it leads


def test_a_ramp_moves_up_only_when_held_and_green_and_never_moves_a_user():
    store = MemoryStore()
    ramp = {**EXPERIMENT, "name": "risky", "ramp": [0.1, 0.5], "ramp_hold_s": 0,
            "variants": [{"name": "control"}, {"name": "bad"}]}
    experiments = Experiments([Experiment.model_validate(ramp)])
    guard = Guardrail(open_state(store), experiments, min_users=50)
    users = [f"user{i}" for i in range(4000)]
    assert guard.check() == []  # step 0 recorded, nothing judged yet
    first = {u: a[1].name for u in users if (a := guard.assign(u))}
    assert 0.08 < len(first) / len(users) < 0.12  # 10 % of users
    store.write(traffic("control", 60, 10, 1) + traffic("bad", 60, 10, 1))  # judged, equal: green
    made = guard.check()
    assert [(d["reason"], d["step"], d["coverage"]) for d in made] == [("ramp", 1, 0.5)]
    second = {u: a[1].name for u in users if (a := guard.assign(u))}
    assert 0.45 < len(second) / len(users) < 0.55
    assert all(second[u] == v for u, v in first.items())  # everyone already in keeps their variant
    assert guard.check() == [] and len(open_state(store).ramp_log("risky")) == 2  # the last step: it stays


def test_a_ramp_holds_while_a_variant_is_stopped_or_the_step_is_young():
    store = MemoryStore()
    young = Experiment.model_validate({**EXPERIMENT, "name": "risky", "ramp": [0.1, 0.5], "ramp_hold_s": 3600})
    guard = Guardrail(open_state(store), Experiments([young]), min_users=50)
    guard.check()
    store.write(traffic("control", 300, 10, 1) + traffic("same", 300, 10, 1) + traffic("bad", 300, 10, 1))
    assert guard.check() == []  # green, but held for less than an hour
    store2 = MemoryStore()
    held = Experiment.model_validate({**EXPERIMENT, "name": "risky", "ramp": [0.1, 0.5], "ramp_hold_s": 0})
    guard2 = Guardrail(open_state(store2), Experiments([held]), min_users=50)
    store2.write(traffic("control", 300, 10, 1) + traffic("bad", 300, 10, 0) + traffic("same", 300, 10, 1))
    assert [d["reason"] for d in guard2.check()] == ["guardrail"]  # bad stopped; the ramp does not move
    assert [r["step"] for r in open_state(store2).ramp_log("risky")] == [0]


@pytest.mark.parametrize("users", ["anonymous", "trusted"])
def test_a_significant_winner_takes_the_alias_and_the_service_reloads_it(registry, tiny_run, tmp_path, users):
    """Where any client may name any user (the default without DINREC_USER_HEADER), bots could pick the
    winner: it is proposed, nothing moves until an operator approves it. With the clients trusted
    (DINREC_AUTO_PROMOTE=always, or verified users) the winner takes the alias by itself."""
    path = tmp_path / "experiments.json"
    path.write_text(json.dumps({"experiments": [
        {"name": "rollout", "status": "running", "seed": "w", "promote": "champion",
         "variants": [{"name": "control"}, {"name": "challenger", "model": "v2"}]}]}))
    store = MemoryStore()
    store.write(list(tiny_run[0].events()))
    settings = ServingSettings(registry=str(registry.root), reload_poll_s=0.1, admin_token=ADMIN_TOKEN,
                               experiments_file=path, events_sink="store", guardrail_interval_s=0.2,
                               guardrail_min_users=50, score_precision="fp32",
                               auto_promote="always" if users == "trusted" else "verified")
    exp = Experiments.load(path).get("rollout")
    assert exp is not None
    challenger_user = next(u for u in sorted(set(tiny_run[0].user_id.tolist()))
                           if (arm := exp.assign(u)) is not None and arm.name == "challenger")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        assert c.get("/admin/model", headers=ADMIN_HEADERS).json()["version"] == "v1"
        assert c.get("/recommend", params={"user_id": challenger_user}).json()["variant"] == "challenger"
        assert c.post("/admin/experiments/rollout/approve").status_code == 404  # nothing proposed yet
        store.write(traffic("control", 200, 10, 0, "w", "rollout") + traffic("challenger", 200, 10, 2, "w", "rollout"))
        if users == "anonymous":
            wait_until(lambda: c.get("/experiments/rollout/results").json()["proposed"] is not None, timeout_s=20,
                       what="the guardrail to propose the winner")
            proposed = c.get("/experiments/rollout/results").json()
            assert proposed["proposed"]["variant"] == "challenger" and proposed["winner"] is None
            assert registry.resolve("champion") == "v1"  # nothing moved by itself
            assert c.get("/recommend", params={"user_id": challenger_user}).json()["experiment"] == "rollout"
            approved = c.post("/admin/experiments/rollout/approve")
            assert approved.status_code == 200 and approved.json()["version"] == "v2", approved.text
        wait_until(lambda: c.get("/admin/model", headers=ADMIN_HEADERS).json()["version"] == "v2",
                   timeout_s=20, what="the service to serve the winner's version")
        assert registry.resolve("champion") == "v2"
        results = c.get("/experiments/rollout/results").json()
        assert results["winner"]["variant"] == "challenger" and results["winner"]["cs_low"] > 0
        assert results["winner"].get("approved", False) == (users == "anonymous") and results["proposed"] is None
        assert results["stopped"] == {}
        assert c.get("/recommend", params={"user_id": challenger_user}).json()["experiment"] is None  # it ended
        assert c.post("/admin/experiments/rollout/approve").status_code == 404  # decided


def test_an_arm_that_lifts_ctr_but_loses_buys_is_stopped_on_the_conversion_guardrail():
    """`bad` here clicks more (CTR +67 %) and buys less: CTR, the goal, says better; conversions per user,
    the default guardrail, says worse — and the guardrail stops it, naming the metric."""
    store = MemoryStore()
    guard = Guardrail(open_state(store), Experiments([Experiment.model_validate(EXPERIMENT)]), min_users=100)
    store.write(traffic("control", 400, 10, 1) + traffic("bad", 400, 10, 2) + traffic("same", 400, 10, 1))
    store.write(buys("control", 200, 1) + buys("bad", 40, 1) + buys("same", 200, 1))  # half of them buy; a tenth
    made = guard.check()
    assert [(d["variant"], d["metric"], d["reason"]) for d in made] == [("bad", "conversions_per_user", "guardrail")]
    assert made[0]["cs_high"] < 0 and made[0]["lift"] == pytest.approx(-0.8)
    results = open_state(store).sums("risky")
    assert results["bad"].clicks > 1.6 * results["control"].clicks  # its CTR did rise


def test_an_arm_that_wins_on_the_goal_but_loses_on_a_guardrail_is_stopped_not_promoted():
    """Guardrails are judged first: a challenger far better on CTR (the goal, with ``promote``) and worse on
    buys is stopped, and its model never takes the alias."""
    exp = {"name": "risky", "status": "running", "seed": "g", "promote": "champion",
           "variants": [{"name": "control"}, {"name": "bad", "model": "challenger"}]}
    store = MemoryStore()
    moved: list[tuple[str, str]] = []

    def promote(alias: str, model: str) -> str:
        moved.append((alias, model))
        return "v2"

    guard = Guardrail(open_state(store), Experiments([Experiment.model_validate(exp)]), min_users=100,
                      promote=promote)
    store.write(traffic("control", 400, 10, 1) + traffic("bad", 400, 10, 4))
    store.write(buys("control", 200, 1) + buys("bad", 40, 1))
    made = guard.check()
    assert [(d["variant"], d["reason"], d["metric"]) for d in made] == [("bad", "guardrail", "conversions_per_user")]
    assert moved == [] and open_state(store).conclusion("risky") is None
    assert guard.check() == [] and moved == []  # and stays so


@pytest.mark.parametrize("forgery", ["an undeclared variant", "a skewed split", "bots clicking in one arm",
                                     "bots buying in one arm"])
def test_counts_that_do_not_add_up_hold_the_guardrail_instead_of_stopping(forgery):
    """The same evidence that stops `bad` above, plus one sign the counters were fed: nothing is decided."""
    store = MemoryStore()
    experiments = Experiments([Experiment.model_validate(EXPERIMENT)])
    guard = Guardrail(open_state(store), experiments, min_users=100)
    events = traffic("control", 300, 10, 1) + traffic("bad", 300, 10, 0) + traffic("same", 300, 10, 1)
    if forgery == "an undeclared variant":
        events += traffic("intruder", 5, 10, 0)
    elif forgery == "a skewed split":  # control got twice its share of users
        events += traffic("control", 300, 10, 1, "extra")
    elif forgery == "bots buying in one arm":  # 3 invented users of `same` buying 100 times each
        store.write(events)
        events = buys("same", 3, 100)
    else:  # invented users in every arm (the split holds), clicking nearly all they are shown in control only
        events += [e for v in ("control", "bad", "same") for e in traffic(v, 300, 10, 9 if v == "control" else 0,
                                                                           "bot")]
    store.write(events)
    assert guard.check() == [] and open_state(store).stopped("risky") == {}
    (why,) = guard._standing["risky"].held
    assert {"an undeclared variant": "undeclared variant 'intruder'", "a skewed split": "sample ratio mismatch",
            "bots clicking in one arm": "control: 55% of what it shows is clicked",
            "bots buying in one arm": "same: buys concentrated in a few users"}[forgery] in why
    # What the DinrecGuardrailHeld alert reads (deploy/monitoring/alerts.yaml).
    metrics = ServiceMetrics()
    metrics.watch_guardrail(lambda: {"risky": float(len(guard.held("risky")))})
    assert 'dinrec_experiment_held{experiment="risky"} 1.0' in metrics.render().decode()


def test_clicks_beyond_impressions_or_a_stopped_arm_are_read_right():
    exp = Experiment.model_validate(EXPERIMENT)
    even = {v: VariantSums(300, 3000, 300, 30000, 300, 3000) for v in ("control", "bad", "same")}
    assert integrity_problems(exp, even, frozenset()) == []
    fed = {**even, "same": VariantSums(300, 3000, 3001, 30000, 40000, 40000)}
    assert integrity_problems(exp, fed, frozenset()) == ["same: 3001 clicks on 3000 impressions"]
    # A stopped arm's users stop growing while the others go on: that is no mismatch.
    after_stop = {**even, "bad": VariantSums(100, 1000, 0, 10000, 0, 0)}
    assert integrity_problems(exp, after_stop, frozenset({"bad"})) == []
    assert "sample ratio mismatch" in integrity_problems(exp, after_stop, frozenset())[0]
    # Bot-shaped: a click-through no audience has; a few users holding the clicks (5 users, 60 clicks each).
    script = {**even, "control": VariantSums(300, 3000, 2400, 30000, 24000, 24000)}
    assert integrity_problems(exp, script, frozenset()) == ["control: 80% of what it shows is clicked, over twice "
                                                            "another arm's rate"]
    few = {**even, "same": VariantSums(300, 3000, 300, 30000, 5 * 60**2, 3000)}
    assert integrity_problems(exp, few, frozenset()) == [
        "same: clicks concentrated in a few users (a click comes from a user with 60 clicks on average)"]
    # A real winner is neither: 25% against 5%.
    better = {**even, "control": VariantSums(300, 3000, 150, 30000, 150, 1500),
              "same": VariantSums(300, 3000, 750, 30000, 2250, 7500)}
    assert integrity_problems(exp, better, frozenset()) == []
