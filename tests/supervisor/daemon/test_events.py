"""Events recorded once (supervisor.daemon.events): the bus calls every listener and the listeners
of one name, and the counters an event implies are fed from its one record."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from supervisor.daemon.events import Event, EventBus, counting_subscriptions
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.status.snapshot import StatusSnapshot


def test_every_listener_hears_every_event_and_a_named_one_only_its_own() -> None:
    bus = EventBus()
    every: list[str] = []
    named: list[str] = []
    bus.subscribe(lambda e: every.append(e.name))
    bus.subscribe(lambda e: named.append(e.name), "incident")
    for name in ("server_launched", "incident", "server_ready"):
        bus.notify(Event(name, "info", {}))
    assert every == ["server_launched", "incident", "server_ready"] and named == ["incident"]


def test_an_event_for_one_channel_goes_to_that_one() -> None:
    assert Event("x", "info", {}).goes_to("journal") and Event("x", "info", {}).goes_to("log")
    assert Event("x", "info", {}, "journal").goes_to("journal") and not Event("x", "info", {}, "journal").goes_to("log")
    assert Event("x", "info", {}, "log").goes_to("log") and not Event("x", "info", {}, "log").goes_to("journal")


def test_the_counters_follow_the_events_that_imply_them() -> None:
    registry = CollectorRegistry()
    metrics = SupervisorMetrics(registry, lambda: StatusSnapshot(state="ready"))
    bus = EventBus()
    for name, count in counting_subscriptions(metrics).items():
        bus.subscribe(count, name)
    bus.notify(Event("incident", "warning", {"cause": "startup_stall"}, "log"))  # the log line: not counted
    bus.notify(Event("incident", "info", {"cause": "startup_stall", "hang_class": "idle_deadlock"}, "journal"))
    bus.notify(Event("incident", "info", {"cause": "exited", "hang_class": None}, "journal"))
    bus.notify(Event("spec_regression", "info", {"reason": "r", "rung": "base"}, "journal"))
    bus.notify(Event("gpu_xid", "error", {"gpu": 0, "uuid": "GPU-1", "xid": 79, "action": "reset_gpu", "text": "t"}))
    bus.notify(Event("log_keeper_replaced", "warning", {"pid": 1}))
    text = generate_latest(registry).decode()
    assert 'cause="startup_stall",hang_class="idle_deadlock"} 1.0' in text
    assert 'cause="exited",hang_class="none"} 1.0' in text
    assert 'cause="spec_regression",hang_class="none"} 1.0' in text
    assert 'gpu="0",uuid="GPU-1",xid="79"' in text
