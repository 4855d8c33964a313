"""The autoscaling policy alone (tailcut.pool._autoscale), fed the counters of
a simulated ring: a host of W trainers stepping together (synchronous DDP)
with a compute of c s per step, and loaders that make r batches per second
each. Fast and deterministic: no process, no clock but the one fed."""

import logging
import math
import os

import pytest

from tailcut.pool import _autoscale
from tailcut.pool._autoscale import Autoscale, Window, compute_seconds, need


def step_waits(step, c, ranks):
    """The waits of the ranks in a step of a starving pool (the module's model)."""
    return [max(0.0, k * step / ranks - c) for k in range(1, ranks + 1)]


# ---- The model -------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
@pytest.mark.parametrize("c", [0.0, 0.01, 0.03, 0.1])
def test_compute_seconds_recovers_the_compute_of_a_step_from_the_waits(ranks, c):
    step = 0.2
    got = compute_seconds(step, sum(step_waits(step, c, ranks)), ranks)
    assert got == pytest.approx(c, abs=1e-9)


def test_compute_seconds_of_waits_past_what_ranks_in_step_allow_is_zero():
    # Four ranks each waiting 150 ms of a 200 ms step: more than ranks in step wait with any
    # compute (the first steps of a pool, or ranks not in step): too small to tell.
    assert compute_seconds(0.2, 4 * 0.15, 4) == 0.0
    assert compute_seconds(0.2, 0.5, 4) == 0.0  # T (W + 1) / 2: c = 0 exactly
    assert compute_seconds(0.2, 0.15, 1) == pytest.approx(0.05)  # one rank: c = T - A
    assert compute_seconds(0.0, 0.0, 4) == 0.0


def window(loaders, rate, c, ranks, span=0.5):
    """A window of a starving sync host: steps paced by the loaders."""
    step = ranks / (loaders * rate)
    steps = span / step
    return Window(span=span, trainers=ranks, steps=steps,
                  wait=steps * sum(step_waits(step, c, ranks)),
                  published=loaders * rate * span, loader_busy=loaders * span, idle=0.0,
                  ready=0, num_slots=24)


def test_need_is_the_count_that_feeds_the_demand_with_headroom():
    # 4 ranks of 30 ms per step take 133 batches/s; a loader makes 20: 6.7 loaders.
    loaders, rate, demand = need(window(1, 20.0, 0.03, 4), published=1e6, busy=1e6 / 20.0)
    assert rate == pytest.approx(20.0) and demand == pytest.approx(4 / 0.03)
    assert loaders == math.ceil(_autoscale.HEADROOM * (1 + 1e-3) * 4 / 0.03 / 20.0) == 8
    # Few batches measured: more headroom (a short window misses the rare slow batch).
    few, _, _ = need(window(1, 20.0, 0.03, 4))  # 10 batches
    assert few > loaders
    # Nothing published or no step: the window cannot tell.
    assert need(window(1, 20.0, 0.03, 4)._replace(published=0))[0] is None
    assert need(window(1, 20.0, 0.03, 4)._replace(steps=0))[0] is None
    # Trainers that never compute between batches take any count.
    assert need(window(2, 20.0, 0.0, 1))[0] == math.inf


# ---- The policy on a simulated ring ----------------------------------------------------------


class SimulatedHost:
    """A ring's counters (BatchRing.stats()) for W trainers in step with a
    compute of c s and loaders of `rate` batches/s each; `join` s after an
    add, a loader joins the ring."""

    def __init__(self, ranks, c, rate, loaders=1, join=0.1, num_slots=24):
        self.ranks, self.c, self.rate, self.join, self.num_slots = ranks, c, rate, join, num_slots
        self.now = 100.0
        self.ended = 0
        self.trainers = [dict(slot=i, pid=os.getpid() if i == 0 else 10 ** 6 + i, role="trainer",
                              popped=0.0, wait=0.0, published=0, joined=self.now)
                         for i in range(ranks)]
        self.loaders = []
        self.add(loaders, at=self.now)

    def add(self, n, at=None):
        for _ in range(n):
            slot = self.ranks + len(self.loaders)
            self.loaders.append(dict(slot=slot, pid=2 * 10 ** 6 + slot, role="loader",
                                     popped=0, wait=0.0, published=0.0,
                                     joined=self.now + self.join if at is None else at,
                                     leaving=False))

    def working(self):
        return [x for x in self.loaders if x["joined"] <= self.now and not x["leaving"]]

    def advance(self, dt):
        self.now += dt
        n = len(self.working())
        made = n * self.rate  # batches per second
        step = max(self.c, self.ranks / made) if made else math.inf
        if math.isfinite(step):
            waits = step_waits(step, self.c, self.ranks)
            for t in self.trainers:
                t["popped"] += dt / step
                t["wait"] += dt / step * sum(waits) / self.ranks
        else:
            for t in self.trainers:
                t["wait"] += dt
        taken = self.ranks / step if math.isfinite(step) else 0.0
        for x in self.working():
            x["published"] += dt * taken / n
            x["wait"] += dt * (1 - taken / made)  # a full ring: the rest of its time waiting

    def stats(self):
        rows = [dict(slot=x["slot"], pid=x["pid"], alive=x["joined"] <= self.now, role=x["role"],
                     popped=int(x["popped"]), published=int(x["published"]),
                     wait_seconds=x["wait"], waiting_seconds=0.0,
                     joined_ns=int(x["joined"] * 1e9))
                for x in self.trainers + self.loaders if not x.get("leaving")]
        return dict(now_ns=int(self.now * 1e9), clients=rows,
                    published=int(sum(x["published"] for x in self.loaders)),
                    ready=0, num_slots=self.num_slots, ended_through=self.ended)


class FakePool:
    """What the policy uses of a PooledLoader."""

    def __init__(self, host, local_world_size=None):
        self.host = host
        self.name = "sim.pool"
        self.local_world_size = local_world_size or host.ranks
        self._leaving = set()

    def live_loaders(self):
        return [x for x in self.host.loaders if not x["leaving"]]

    def add_loaders(self, n):
        self.host.add(n)

    def remove_loaders(self, n):
        for x in self.live_loaders()[-n:]:
            x["leaving"] = True
            self._leaving.add(x["pid"])


def run(policy, pool, seconds, every=0.1):
    """Feeds the policy a read of the ring every `every` s (what look() does)."""
    for _ in range(int(round(seconds / every))):
        pool.host.advance(every)
        policy.observe(pool, pool.host.stats(), pool.host.now)


def test_a_starving_pool_reaches_the_need_in_one_decision_within_a_second(monkeypatch):
    monkeypatch.delenv(_autoscale.CPUS_ENV, raising=False)
    host = SimulatedHost(ranks=4, c=0.03, rate=20.0)  # needs 6.7 loaders
    policy, pool = Autoscale(1, 16, cpus=16), FakePool(host)
    run(policy, pool, 1.0)
    assert len(policy.decisions) == 1, policy.decisions
    first = policy.decisions[0]
    assert first["action"] == "add" and 7 <= first["loaders"] <= 10, first
    assert first["at"] <= 1.0
    # Fed from then on: no other add; what the headroom for a short window's measure
    # added past the need may go back, never below the need.
    run(policy, pool, 10.0)
    later = policy.decisions[1:]
    assert all(d["action"] == "remove" and d["loaders"] >= 7 for d in later), later


def test_a_pool_fed_at_max_or_by_its_loaders_decides_nothing(monkeypatch):
    monkeypatch.delenv(_autoscale.CPUS_ENV, raising=False)
    host = SimulatedHost(ranks=4, c=0.03, rate=20.0, loaders=7)
    policy = Autoscale(1, 8, cpus=8)
    run(policy, FakePool(host), 10.0)
    assert policy.decisions == []


def test_the_cpu_limit_stops_the_pool_at_cores_less_ranks_unless_told(monkeypatch, caplog):
    monkeypatch.delenv(_autoscale.CPUS_ENV, raising=False)
    caplog.set_level(logging.INFO, logger="tailcut.pool")
    monkeypatch.setattr(_autoscale.os, "sched_getaffinity", lambda pid: set(range(8)))
    host = SimulatedHost(ranks=4, c=0.03, rate=20.0)
    policy = Autoscale(1, 16)
    run(policy, FakePool(host), 5.0)
    # 8 CPUs less 4 local ranks: 4 loaders, in one decision, then one warning naming the fix.
    assert [(d["action"], d["loaders"]) for d in policy.decisions] == [("add", 4)]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert "starving at the CPU limit of 4 loaders (8 CPUs less 4 local ranks)" in warned[0]
    assert "Autoscale(min, max, cpus=N) or $TAILCUT_LOADER_CPUS=N" in warned[0]
    # Told by the environment: past the CPUs, to the need.
    monkeypatch.setenv(_autoscale.CPUS_ENV, "12")
    host = SimulatedHost(ranks=4, c=0.03, rate=20.0)
    policy = Autoscale(1, 16)
    run(policy, FakePool(host), 1.0)
    assert policy.decisions[-1]["loaders"] >= 7
    # Never below min, however few the CPUs.
    monkeypatch.delenv(_autoscale.CPUS_ENV)
    assert Autoscale(3, 8).cpu_limit(local_ranks=8)[0] == 3
    assert Autoscale(1, 8, cpus=2).cpu_limit(local_ranks=4) == (2, "the CPU limit of 2 (cpus=)")
    monkeypatch.setenv(_autoscale.CPUS_ENV, "many")
    with pytest.raises(ValueError, match=r"\$TAILCUT_LOADER_CPUS must be an int >= 1"):
        Autoscale(1, 8)


def test_windows_with_an_epoch_end_or_a_gap_decide_nothing(monkeypatch):
    monkeypatch.delenv(_autoscale.CPUS_ENV, raising=False)
    host = SimulatedHost(ranks=4, c=0.03, rate=20.0)
    policy, pool = Autoscale(1, 16, cpus=16), FakePool(host)
    for _ in range(20):  # an epoch ends in every window: 2 s of starving, no decision
        host.ended += 1
        run(policy, pool, 0.3)
    assert policy.decisions == []
    # Rank 0 away from the ring for 3 s (an evaluation) after steps of 50 ms, while the
    # loaders wait on a full ring: a gap, and the window starts again after it. Taken as a
    # window, it would look like a pool with a loader to spare (full_for=0: at once).
    host = SimulatedHost(ranks=1, c=0.05, rate=20.0, loaders=2)
    policy, pool = Autoscale(1, 16, cpus=16, full_for=0.0), FakePool(host)
    run(policy, pool, 2.3)
    assert policy.decisions == []
    host.now += 3.0
    for loader in host.loaders:
        loader["wait"] += 3.0
    policy.observe(pool, host.stats(), host.now)
    assert policy.decisions == [] and policy._start["at"] == pytest.approx(host.now)
    run(policy, pool, 2.0)
    assert policy.decisions == []


def test_an_over_provisioned_pool_gives_back_what_it_does_not_need(monkeypatch):
    monkeypatch.delenv(_autoscale.CPUS_ENV, raising=False)
    host = SimulatedHost(ranks=1, c=0.02, rate=20.0, loaders=8)  # needs 2.5
    policy = Autoscale(1, 8, cpus=8, full_for=1.0)
    run(policy, FakePool(host), 10.0)
    made = [(d["action"], d["loaders"]) for d in policy.decisions]
    assert made and all(a == "remove" for a, _ in made), made
    assert 3 <= made[-1][1] <= 4, made  # about one loader's worth of spare time kept
