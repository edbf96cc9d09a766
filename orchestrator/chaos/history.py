"""The history checker: a whole chaos campaign judged from its ledger, Jepsen-style.

The nemesis acts on real processes; afterwards this module reads only what was recorded (the
run's events, the audit's problems, and the few facts the campaign measured outside the
ledger) and says whether the history is legal. Every breach names the fault it followed: the
newest ``fault_injected`` recorded before it, so a violation that shows up three steps into a
recovery is pinned on the fault that started it.

The checks, each independent of the code that wrote the history:

* ``audit``: what :meth:`ledger.Ledger.verify` reported (invariants 1-6 of DESIGN section 4);
* ``versions``: each commit is exactly the head + 1 at that moment, across every failover and
  resume, and a resume records the head the ledger had;
* ``fencing``: every publisher event comes from the newest promoted cell at its epoch, and
  epochs only grow;
* ``stamps``: each engine's stamped versions never go back, and none is above the head;
* ``staleness``: no trained batch saw a negative staleness, and the run counted none;
* ``prompts``: every prompt issued is trained exactly once, dropped once with a reason, or in
  flight at the end (invariant 7), and none is trained that was never issued;
* ``liveness``: the run reached its steps, within the deadline, without a silent gap (a hang);
* ``learning``: the final reward is within the tolerance of a fault-free run of the same seed;
  a breach is placed at the step where the reward fell below that bound before its 5-step mean
  stayed there, so it names the fault before the fall, not the last fault of the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from statistics import fmean

from ledger import Event, EventKind
from ledger.events import PUBLISHER_KINDS
from ledger.id_ranges import expand

__all__ = ["REWARD_WINDOW", "Breach", "CampaignFacts", "HistoryVerdict", "InjectedFault",
           "check_history", "fell_below", "first_low_step"]

REWARD_WINDOW = 5  # steps whose mean reward is a run's reward at a step, and its final reward


@dataclass(frozen=True)
class InjectedFault:
    """A fault as the ledger recorded it when it fired."""

    seq: int
    at: datetime
    index: int | None
    kind: str
    step: int | None

    def describe(self) -> str:
        where = f" at step {self.step}" if self.step is not None else ""
        number = f"fault {self.index} " if self.index is not None else "fault "
        return f"{number}({self.kind}{where}, seq {self.seq})"


@dataclass(frozen=True)
class Breach:
    """One violation: the check, what was seen, where, and the fault it followed."""

    check: str
    message: str
    seq: int | None = None
    after: InjectedFault | None = None

    def __str__(self) -> str:
        where = f" at seq {self.seq}" if self.seq is not None else ""
        cause = f", after {self.after.describe()}" if self.after else ", before any fault"
        return f"{self.check}{where}: {self.message}{cause}"


@dataclass(frozen=True)
class CampaignFacts:
    """What the campaign knows besides the ledger: its targets and its own measurements.

    ``audit_problems`` are ``(check, seq, message)`` triples from :meth:`ledger.Ledger.verify`.
    ``hang_after_s`` is the longest silence (no event recorded) a live run may have;
    ``elapsed_s`` the campaign's own launch-to-end time (None: first to last event).
    ``rewards`` is the run's mean reward per step, in step order from step 1 (its metrics):
    where it fell is where a learning breach is placed.
    """

    target_steps: int
    deadline_s: float | None = None
    elapsed_s: float | None = None
    hang_after_s: float | None = None
    final_reward: float | None = None
    baseline_reward: float | None = None
    reward_tolerance: float = 0.1
    audit_problems: Sequence[tuple[str, int | None, str]] = ()
    rewards: Sequence[float] = ()


@dataclass
class HistoryVerdict:
    """The checker's answer: the breaches (none for a legal history) and the faults it saw."""

    breaches: list[Breach] = field(default_factory=list)
    faults: list[InjectedFault] = field(default_factory=list)
    steps_trained: int = 0
    recovery_s: dict[int, float | None] = field(default_factory=dict)  # fault seq -> seconds

    @property
    def ok(self) -> bool:
        return not self.breaches


class _Walk:
    """The state the checker keeps while it walks the events in seq order."""

    def __init__(self, verdict: HistoryVerdict) -> None:
        self.verdict = verdict
        self.head = 0
        self.epoch = 0
        self.publisher: str | None = None
        self.last_seq = 0
        self.stamped: dict[str, int] = {}
        self.trained: dict[int, int] = {}  # prompt id -> train step
        self.dropped: dict[int, str] = {}  # prompt id -> reason
        self.step_seqs: dict[int, int] = {}  # train step -> seq of its batch_trained
        self.issued = 0
        self.first_event: Event | None = None
        self.last_event: Event | None = None

    def breach(self, check: str, message: str, seq: int | None) -> None:
        self.verdict.breaches.append(Breach(check, message, seq, self._fault_before(seq)))

    def _fault_before(self, seq: int | None) -> InjectedFault | None:
        faults = [f for f in self.verdict.faults if seq is None or f.seq < seq]
        return faults[-1] if faults else None

    def apply(self, event: Event) -> None:
        if event.seq != self.last_seq + 1:
            self.breach("audit", f"seq {event.seq} follows seq {self.last_seq}", event.seq)
        self.last_seq = event.seq
        kind = event.kind
        if kind in PUBLISHER_KINDS:
            self._fence(event)
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, event)
        self.first_event = self.first_event or event
        self.last_event = event

    def _fence(self, event: Event) -> None:
        if event.epoch != self.epoch or event.cell_id != self.publisher:
            self.breach("fencing", f"{event.kind} accepted from {event.cell_id} at epoch "
                        f"{event.epoch}; the publisher was {self.publisher} at epoch "
                        f"{self.epoch}", event.seq)

    def promoted(self, event: Event) -> None:
        epoch = event.epoch or 0
        if epoch <= self.epoch:
            self.breach("fencing", f"promotion to epoch {epoch} after epoch {self.epoch}",
                        event.seq)
        self.epoch, self.publisher = max(epoch, self.epoch), event.cell_id

    def committed(self, event: Event) -> None:
        version = event.version or 0
        if version != self.head + 1:
            what = "reused" if version <= self.head else "skipped ahead"
            self.breach("versions", f"version {version} committed at head {self.head} "
                        f"({what}; expected {self.head + 1})", event.seq)
        self.head = max(self.head, version)
        for fault in self.verdict.faults:
            if self.verdict.recovery_s.get(fault.seq) is None and fault.seq < event.seq:
                self.verdict.recovery_s[fault.seq] = (event.recorded_at - fault.at).total_seconds()

    def resumed(self, event: Event) -> None:
        recorded = event.payload.get("head_version")
        if recorded != self.head:
            self.breach("versions", f"run_resumed recorded head {recorded}, the ledger's head "
                        f"was {self.head}", event.seq)
        position = event.payload.get("next_prompt_index")
        if isinstance(position, int):
            self.issued = max(self.issued, position)

    def stamped_engines(self, event: Event) -> None:
        version = int(event.payload.get("version", -1))
        if version > self.head:
            self.breach("stamps", f"engines stamped with v{version} above head {self.head}",
                        event.seq)
        for engine in event.payload.get("engine_ids", []):
            before = self.stamped.get(engine)
            if before is not None and version < before:
                self.breach("stamps", f"engine {engine} stamped v{version} after v{before}",
                            event.seq)
            self.stamped[engine] = max(version, before or version)

    def trained_batch(self, event: Event) -> None:
        payload = event.payload
        step = int(payload.get("train_step", 0))
        self.verdict.steps_trained = max(self.verdict.steps_trained, step)
        self.step_seqs.setdefault(step, event.seq)
        staleness_min = payload.get("staleness", {}).get("min", 0)
        if staleness_min < 0:
            self.breach("staleness", f"step {step} trained at staleness {staleness_min}",
                        event.seq)
        prompts = payload.get("prompts", {})
        for prompt in expand(prompts.get("trained", [])):
            self._settle(prompt, f"trained at step {step}", event.seq)
            self.trained[prompt] = step
        for reason, ids in prompts.get("dropped", {}).items():
            for prompt in expand(ids):
                self._settle(prompt, f"dropped ({reason}) at step {step}", event.seq)
                self.dropped[prompt] = reason
        self.issued = max(self.issued, int(prompts.get("next_index", 0)))

    def _settle(self, prompt: int, how: str, seq: int) -> None:
        if prompt in self.trained:
            self.breach("prompts", f"prompt {prompt} {how}, already trained at step "
                        f"{self.trained[prompt]}", seq)
        elif prompt in self.dropped:
            self.breach("prompts", f"prompt {prompt} {how}, already dropped "
                        f"({self.dropped[prompt]})", seq)

    def finished(self, event: Event) -> None:
        negative = int(event.payload.get("negative_staleness_total", 0))
        if negative:
            self.breach("staleness", f"the run counted {negative} negative staleness values",
                        event.seq)
        unaccounted = int(event.payload.get("prompts_unaccounted", 0))
        if unaccounted:
            self.breach("prompts", f"the run counted {unaccounted} prompts unaccounted for",
                        event.seq)

    def failed(self, event: Event) -> None:
        self.breach("liveness", f"the run failed: {event.payload.get('reason')}", event.seq)


_HANDLERS = {
    EventKind.CELL_PROMOTED: _Walk.promoted,
    EventKind.WEIGHT_COMMITTED: _Walk.committed,
    EventKind.RUN_RESUMED: _Walk.resumed,
    EventKind.ENGINES_STAMPED: _Walk.stamped_engines,
    EventKind.BATCH_TRAINED: _Walk.trained_batch,
    EventKind.RUN_FINISHED: _Walk.finished,
    EventKind.RUN_FAILED: _Walk.failed,
}


def _injected(event: Event) -> InjectedFault:
    fault = event.payload.get("fault") or {}
    return InjectedFault(seq=event.seq, at=event.recorded_at, index=fault.get("index"),
                         kind=str(fault.get("kind") or event.payload.get("scenario")),
                         step=fault.get("step", event.payload.get("step")))


def check_history(events: Iterable[Event], facts: CampaignFacts) -> HistoryVerdict:
    """Judge one campaign's recorded history (its events in seq order) against ``facts``."""
    verdict = HistoryVerdict()
    walk = _Walk(verdict)
    previous: Event | None = None
    for event in events:
        if event.kind == EventKind.FAULT_INJECTED:
            verdict.faults.append(_injected(event))
        if (previous is not None and facts.hang_after_s is not None
                and (silence := (event.recorded_at - previous.recorded_at).total_seconds())
                > facts.hang_after_s):
            walk.breach("liveness", f"nothing recorded for {silence:.1f} s (a hang; the limit "
                        f"is {facts.hang_after_s:g} s)", event.seq)
        walk.apply(event)
        previous = event
    for check, seq, message in facts.audit_problems:
        walk.breach("audit", f"{check}: {message}", seq)
    _judge_end(walk, facts)
    return verdict


def _judge_end(walk: _Walk, facts: CampaignFacts) -> None:
    verdict = walk.verdict
    end_seq = walk.last_event.seq if walk.last_event else None
    if verdict.steps_trained < facts.target_steps:
        walk.breach("liveness", f"the run trained {verdict.steps_trained} of "
                    f"{facts.target_steps} steps", end_seq)
    never_issued = sorted(p for p in [*walk.trained, *walk.dropped] if p >= walk.issued)
    if never_issued:
        walk.breach("prompts", f"{len(never_issued)} prompts settled that were never issued "
                    f"(first {never_issued[0]}; {walk.issued} issued)", end_seq)
    elapsed = facts.elapsed_s
    if elapsed is None and walk.first_event is not None and walk.last_event is not None:
        elapsed = (walk.last_event.recorded_at - walk.first_event.recorded_at).total_seconds()
    if facts.deadline_s is not None and elapsed is not None and elapsed > facts.deadline_s:
        walk.breach("liveness", f"the run took {elapsed:.0f} s, past its deadline of "
                    f"{facts.deadline_s:g} s", end_seq)
    if (facts.final_reward is not None and facts.baseline_reward is not None
            and facts.final_reward < facts.baseline_reward - facts.reward_tolerance):
        bound = facts.baseline_reward - facts.reward_tolerance
        fell = fell_below(facts.rewards, bound)
        first_low = None if fell is None else first_low_step(facts.rewards, bound, fell)
        where = ("" if fell is None else f"; its reward fell below {bound:.3f} at step "
                 f"{first_low}, and its {REWARD_WINDOW}-step mean stayed below from step {fell}")
        walk.breach("learning", f"final reward {facts.final_reward:.3f} against "
                    f"{facts.baseline_reward:.3f} fault-free (tolerance "
                    f"{facts.reward_tolerance:g}){where}",
                    walk.step_seqs.get(first_low) if first_low is not None else None)


def fell_below(rewards: Sequence[float], bound: float,
               window: int = REWARD_WINDOW) -> int | None:
    """The step (from 1) from which the mean of the last ``window`` rewards stays below
    ``bound`` to the end of ``rewards``; None if it ends at or above ``bound`` (or is empty)."""
    fell = None
    for index in range(len(rewards) - 1, -1, -1):
        if fmean(rewards[max(0, index + 1 - window):index + 1]) >= bound:
            break
        fell = index + 1
    return fell


def first_low_step(rewards: Sequence[float], bound: float, fell: int,
                   window: int = REWARD_WINDOW) -> int:
    """Where the fall that :func:`fell_below` dates to ``fell`` began: the first step of the run
    of steps below ``bound`` that ends at ``fell``, looking back at most ``window - 1`` steps
    (the mean lags the steps that pulled it down; the fall began in its window)."""
    first = fell
    while first - 1 >= max(1, fell - window + 1) and rewards[first - 2] < bound:
        first -= 1
    return first
