"""The leader's answer to a member about to launch (supervisor/group/joining.py), and the
fingerprint it compares (supervisor/group/fingerprint.py)."""

from __future__ import annotations

from supervisor.config.settings import settings_from_mapping
from supervisor.group.fingerprint import argv_print, differing, fingerprint
from supervisor.group.joining import answer_join, formed, lacking
from supervisor.group.verdict import MemberView, NodeReport

FP = {"nnodes": "2", "tp-size": "2", "ladder": "base"}


def view(instance: str, reachable: bool = True) -> MemberView:
    r = NodeReport(1, "ready", "serving", 9, "base", None, "", (), (), 0.1, 1.0, instance=instance)
    return MemberView(1, "h1:8900", reachable, r)


def test_the_leader_gives_its_own_rung_while_its_server_is_up_else_wait() -> None:
    for state in ("starting", "ready", "degraded"):
        a = answer_join(1, "a" * 32, FP, FP, (), state, "second")
        assert (a.verdict, a.rung) == ("launch", "second")
    for state in ("restarting", "stopped", "failed", "hung"):
        a = answer_join(1, "a" * 32, FP, FP, (), state, "base")
        assert a.verdict == "wait" and state in a.reason and a.rung is None


def test_a_member_asking_after_node_0s_group_formed_waits_for_the_group_to_relaunch() -> None:
    """It came back without the server node 0's group was formed with: a new one could never join."""
    assert not formed("starting", "spawning") and not formed("starting", "initializing")
    assert formed("starting", "loading_weights") and formed("ready", "serving") and formed("degraded", None)
    assert not formed("restarting", "serving") and not formed("starting", None)
    a = answer_join(1, "a" * 32, FP, FP, (), "degraded", "base", group_formed=True)
    assert (a.verdict, a.rung, a.rejoin) == ("wait", None, True)
    assert "a new node 1 cannot join it" in a.reason and "relaunched together on rung base" in a.reason
    # check-config --group asks about the config only; a differing config is refused all the same
    assert answer_join(1, "a" * 32, FP, FP, (), "ready", "base", check=True, group_formed=True).verdict == "launch"
    theirs = {**FP, "tp-size": "4"}
    assert answer_join(1, "a" * 32, theirs, FP, (), "ready", "base", group_formed=True).verdict == "refused"


def test_a_differing_config_is_refused_naming_each_key_with_both_values() -> None:
    theirs = {**FP, "tp-size": "4", "ladder": "base,safe"}
    a = answer_join(1, "a" * 32, theirs, FP, (), "ready", "base")
    assert a.verdict == "refused"
    assert a.differs == ("ladder (leader base, this node base,safe)", "tp-size (leader 2, this node 4)")
    a = answer_join(1, "a" * 32, {k: v for k, v in FP.items() if k != "tp-size"}, FP, (), "ready", "base")
    assert a.differs == ("tp-size (leader 2, this node none)",)


def test_a_second_daemon_on_one_node_rank_is_refused_by_name() -> None:
    a = answer_join(1, "b" * 32, FP, FP, (view("a" * 32),), "ready", "base")
    assert a.verdict == "refused" and "node_rank 1 is already the daemon at h1:8900 (pid 9)" in a.reason
    # the same daemon again (a retry), or one whose old self no longer answers: admitted
    assert answer_join(1, "a" * 32, FP, FP, (view("a" * 32),), "ready", "base").verdict == "launch"
    assert answer_join(1, "b" * 32, FP, FP, (view("a" * 32, reachable=False),), "ready", "base").verdict == "launch"


def test_the_fingerprint_leaves_out_the_nodes_own_flags_only() -> None:
    base = ["python", "-m", "sglang.launch_server", "--tp-size", "2", "--nnodes", "2"]
    a = argv_print([*base, "--node-rank", "0", "--host", "0.0.0.0", "--port", "30000"])
    b = argv_print([*base, "--node-rank=1", "--port", "30001"])
    assert a == b
    assert argv_print([*base, "--disable-cuda-graph"]) != argv_print(base)

    def node(rank: int, **args: object) -> dict[str, str]:
        data = {
            "server": {"command": ["sglang"], "args": {"tp-size": 2, "nnodes": 2, "node-rank": rank, **args}},
            "fallback": [{"name": "safe", "args": {"disable-cuda-graph": True}}],
            "group": {"nnodes": 2, "node_rank": rank, "leader": "h0:1", "members": ["h1:1"]},
        }
        return fingerprint(settings_from_mapping(data))

    assert differing(node(0), node(1)) == []
    assert [d.split(" ")[0] for d in differing(node(0), node(1, **{"tp-size": 4}))] == [
        "rung.base", "rung.safe", "tp-size",
    ]  # fmt: skip


def test_a_rung_a_member_lacks_is_named_with_its_ladder_and_one_all_have_is_not() -> None:
    def member(node: int, fp: dict[str, str] | None) -> MemberView:
        r = NodeReport(node, "ready", "serving", 9, "base", None, "", (), (), 0.1, 1.0, fingerprint=fp or {})
        return MemberView(node, f"h{node}:8900", True, r)

    both = {"ladder": "base,safe", "rung.base": "aa", "rung.safe": "bb"}
    short = {"ladder": "base", "rung.base": "aa"}
    assert lacking("safe", (member(1, both), member(2, both))) is None
    why = lacking("safe", (member(1, both), member(2, short)))
    assert why is not None and why.startswith("node 2 (h2:8900) has no rung 'safe' (its ladder: base)")
    assert "node 1" not in why and "nothing was stopped" in why
    assert lacking("base", (member(2, short),)) is None
    # A member with no report, or one whose report carries no fingerprint, cannot be judged here.
    assert lacking("safe", (MemberView(1, "h1:8900", False, None), member(2, None))) is None


# ---- issue 54: one identity per node_rank, kept across the group's stops and launches ----

ME, TWIN = "1" * 32, "2" * 32


def ident_view(identity: str | None, instance: str = "a" * 32, reachable: bool = True) -> MemberView:
    if identity is None:  # the report dropped at a group stop or launch: the address still answers
        return MemberView(1, "h1:8900", reachable, None)
    r = NodeReport(1, "ready", "serving", 9, "base", None, "", (), (), 0.1, 1.0, instance=instance, identity=identity)
    return MemberView(1, "h1:8900", reachable, r)


def test_a_second_identity_is_refused_naming_both_even_after_the_reports_were_dropped() -> None:
    a = answer_join(1, "b" * 32, FP, FP, (ident_view(None),), "ready", "base", identity=TWIN, holder=ME,
                    address="10.0.0.9:8911")  # fmt: skip
    assert a.verdict == "refused", a
    assert "node_rank 1 is already the daemon at h1:8900" in a.reason and f"state directory id {ME[:12]}" in a.reason
    assert f"this daemon (at 10.0.0.9:8911, state directory id {TWIN[:12]}) claims it too" in a.reason
    # with the report there: named by its pid too
    a = answer_join(1, "b" * 32, FP, FP, (ident_view(ME),), "ready", "base", identity=TWIN)
    assert a.verdict == "refused" and "(pid 9, state directory id" in a.reason


def test_the_same_identity_is_admitted_a_restarted_daemon_is_the_same_node() -> None:
    """Its successor has a new life (instance) and the same state directory: not a second daemon,
    even while the leader's last report still shows its predecessor."""
    a = answer_join(1, "b" * 32, FP, FP, (ident_view(ME, "a" * 32),), "ready", "base", identity=ME, holder=ME)
    assert a.verdict == "launch"
    # the node_rank's address no longer answers: a replacement with a state of its own is admitted
    gone = ident_view(ME, reachable=False)
    assert answer_join(1, "b" * 32, FP, FP, (gone,), "ready", "base", identity=TWIN, holder=ME).verdict == "launch"
    # the address answers a new identity (the node replaced, reported): that one is the holder
    assert answer_join(1, "b" * 32, FP, FP, (ident_view(TWIN),), "ready", "base", identity=TWIN, holder=ME).verdict == (
        "launch"
    )


def test_the_leader_keeps_each_addresses_identity_across_its_stops_and_launches() -> None:
    from typing import Any

    from supervisor.config.settings import GroupSettings
    from supervisor.group.credentials import GroupKeys
    from supervisor.group.judging import judge
    from supervisor.group.members import answer_join_request
    from supervisor.group.runtime import GroupRuntime
    from supervisor.policy.watchdog import Verdict

    events: list[tuple[str, dict[str, Any]]] = []

    def rec(event: str, level: str = "info", /, **fields: Any) -> None:
        events.append((event, fields))

    class Leader:
        _views = (ident_view(ME),)

        def views(self) -> tuple[MemberView, ...]:
            return self._views

    g = GroupRuntime(
        GroupSettings(nnodes=2, node_rank=0, members=("h1:8900",)), None, GroupKeys(0, b"s" * 16, b"k" * 32)
    )
    g.leader = Leader()  # type: ignore[assignment]
    g.fingerprint, g.own_state, g.own_rung, g.own_phase = FP, "ready", "base", "serving"
    judge(
        g, Verdict("ready", reason="healthy", phase="serving"), "ready", rec
    )  # a poll: node 1's address answers with ME
    g.leader._views = (ident_view(None),)  # type: ignore[union-attr]  # the group relaunched: reports dropped
    ans = answer_join_request(g, 1, "b" * 32, FP, False, rec, TWIN, "127.0.0.1:9")
    assert ans.verdict == "refused"
    refused = [f for e, f in events if e == "group_join_refused"]
    assert len(refused) == 1 and "127.0.0.1:9" in refused[0]["reason"] and "h1:8900" in refused[0]["reason"]
