"""Whether the engine's scheduler still starts requests (issue 51: the wedges /health does not see).

SGLang #40809 (0.5.19: the engine stopped, /health 200 for about 15 minutes) and #28815 (an EAGLE verify
step skipped a broadcast on rank 0: a permanent deadlock, /health 200) stop the scheduler while the
HTTP front and its health check answer. The engines' own metrics say so: requests wait
(`num_queue_reqs`, vLLM's `num_requests_waiting`, the HTTP front's open requests), and neither tokens
nor finished requests move. Admissions are the `_count` of the engine's own histograms: queue time
(SGLang observes it when a request leaves the queue; vLLM when it ends) and time to first token. A
request that never starts is counted by neither, so their sums cannot show its wait: a frozen count
beside a waiting request is the evidence the verdict names, and the serving window is the threshold.

Progress is tokens or finished requests. A server that only prefills (one-token requests) moves no
decode token, yet finishes requests all the time: not a stall. Admissions alone are not progress: a
scheduler that still prefills new requests while its decode never ends (the simulator's
`serving_stall`) starts requests and finishes none, and that is a stall.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from probes.types import ServingObservation


@dataclass(frozen=True)
class Admissions:
    """The counts at the last scrape; None: the engine publishes no such family."""

    started: float | None = None  # requests that left the queue (the queue-time histogram's count)
    first_tokens: float | None = None  # requests that got a first token (the TTFT histogram's count)
    finished: float | None = None  # requests that ended (SGLang's num_requests_total, vLLM's request_success)


def admissions(sv: ServingObservation | None) -> Admissions | None:
    """The scrape's admissions; None when there was no usable scrape."""
    if sv is None or not sv.available:
        return None
    return Admissions(sv.started_total, sv.first_tokens_total, sv.num_requests_total)


def moved(before: Admissions, now: Admissions) -> bool:
    """Requests finished since the last scrape (a first reading is movement, as for tokens); admissions
    alone are not (the module's docstring)."""
    return now.finished is not None and now.finished != before.finished


def never_started(sv: ServingObservation, adm: Admissions) -> str:
    """The reason's words for requests the engine accepted and did not start: queued with none running
    (`num_queue_reqs`, vLLM's `num_requests_waiting`), and the admissions count, frozen, where known."""
    out = ""
    queued = sv.queue_reqs or 0
    if queued > 0 and (sv.running_reqs or 0) <= 0:
        one = queued == 1
        out = f"; {queued:.0f} accepted request{'' if one else 's'} wait{'s' if one else ''} and none runs"
    if adm.started is not None and (queued > 0 or (sv.active_requests or 0) > 0):
        out += f"; none started since (the queue-time count stays {adm.started:.0f})"
    return out


def figures(adm: Admissions) -> tuple[tuple[str, float], ...]:
    figs: list[tuple[str, float]] = []
    if adm.started is not None:
        figs.append(("started_total", adm.started))
    if adm.first_tokens is not None:
        figs.append(("first_tokens_total", adm.first_tokens))
    return tuple(figs)
