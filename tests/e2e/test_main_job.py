"""The main job on a real local Ray cluster: failover, resume, and the seed's bug for contrast.

Faults are declared up front (``KillPlan``) and each test asserts the fault really fired, so a
test cannot pass by not injecting anything.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import ray

from ledger import Ledger
from orchestrator.config import RunConfig
from orchestrator.control.driver import JobOptions, TrainingJob, run_job
from orchestrator.control.hooks import JobHooks
from orchestrator.control.provenance_recorder import prompt_ledger
from orchestrator.metric_keys import TRAIN_STALENESS_MAX_KEY as TRAIN_STALENESS_MAX

pytestmark = pytest.mark.usefixtures("ray_cluster")


def small_config(run_id: str, **overrides) -> RunConfig:
    fields = dict(
        run_id=run_id, num_rollout=10, rollout_batch_size=8, n_samples_per_prompt=4,
        save_interval=100, heartbeat_timeout_s=5.0,
    )
    fields.update(overrides)
    return RunConfig(**fields)


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def committed_versions(ledger: Ledger, run_id: str) -> list[int]:
    return [e.version for e in ledger.events(run_id) if e.kind == "weight_committed"]


@dataclass
class KillPlan:
    """Kill the publisher's worker process with ``sig`` after training step ``at_step``."""

    at_step: int
    sig: int = signal.SIGKILL
    fired: list[tuple[int, str, int]] = field(default_factory=list)  # (step, cell, pid)

    def __call__(self, job: TrainingJob, step: int) -> None:
        if step != self.at_step or self.fired:
            return
        publisher = job.ledger.head(job.run_id).publisher_cell
        pid = ray.get(job.cells.actor(publisher).pid.remote())
        os.kill(pid, self.sig)
        self.fired.append((step, publisher, pid))


def test_killing_the_publisher_mid_run_fails_over_without_a_gap(tmp_path: Path):
    plan = KillPlan(at_step=3)
    result = run_job(small_config("kill-publisher"),
                     JobOptions(runs_dir=tmp_path, progress=False, plot=False, on_step=plan))

    assert plan.fired, "the publisher was never killed"
    killed_step, killed_cell, _ = plan.fired[0]
    with Ledger.open(result.ledger_url, readonly=True) as ledger:
        events = list(ledger.events("kill-publisher"))
        versions = committed_versions(ledger, "kill-publisher")
        report = ledger.verify("kill-publisher")
    promotions = [e for e in events if e.kind == "cell_promoted"]
    assert [p.payload["reason"] for p in promotions] == ["start", "failover"]
    assert promotions[1].cell_id != killed_cell
    assert promotions[1].payload["previous_cell"] == killed_cell
    errored = [e for e in events if e.kind == "cell_state" and e.payload["state"] == "errored"]
    assert [e.cell_id for e in errored] == [killed_cell]
    assert versions == list(range(1, len(versions) + 1))
    assert len(versions) >= 10  # the run went on to the end after the kill
    metrics = read_metrics(result.metrics_path)
    assert len(metrics) == 10
    assert all(m["rollout/fully_async/negative_staleness_total"] == 0 for m in metrics)
    assert all(lag >= 0 for m in metrics
               for lag in map(int, m["rollout/fully_async/staleness_hist"]))
    assert [m["weight_version"] for m in metrics] == sorted(m["weight_version"] for m in metrics)
    assert report.ok, report.problems
    assert result.ok


def test_resume_from_a_checkpoint_older_than_the_head_continues_at_head_plus_one(
    tmp_path: Path,
):
    first = run_job(small_config("resumable", num_rollout=8, save_interval=3),
                    JobOptions(runs_dir=tmp_path, progress=False, plot=False))
    with Ledger.open(first.ledger_url, readonly=True) as ledger:
        head_before = ledger.head("resumable")
        checkpoints = [e for e in ledger.events("resumable") if e.kind == "checkpoint_saved"]
        prompts_before = prompt_ledger(ledger.events("resumable"))
    newest_checkpoint = checkpoints[-1].payload
    assert newest_checkpoint["version"] < head_before.version  # older than the head

    second = run_job(small_config("resumable", num_rollout=10, save_interval=3),
                     JobOptions(runs_dir=tmp_path, progress=False, plot=False, resume=True))

    with Ledger.open(second.ledger_url, readonly=True) as ledger:
        events = list(ledger.events("resumable", start_seq=head_before.seq + 1))
        versions = committed_versions(ledger, "resumable")
        report = ledger.verify("resumable")
    resumed = next(e for e in events if e.kind == "run_resumed")
    assert resumed.payload == {
        "checkpoint_step": newest_checkpoint["train_step"],
        "checkpoint_version": newest_checkpoint["version"],
        "head_version": head_before.version,
        # The prompt stream continues where the ledger says the first job stopped.
        "ledger_step": 8,
        "next_prompt_index": prompts_before.next_index,
        "prompts_carried_over": len(prompts_before.in_flight),
    }
    promotion = next(e for e in events if e.kind == "cell_promoted")
    assert promotion.payload["reason"] == "resume" and promotion.epoch == head_before.epoch + 1
    first_new_commit = next(e for e in events if e.kind == "weight_committed")
    assert first_new_commit.version == head_before.version + 1
    assert versions == list(range(1, len(versions) + 1))
    assert report.ok, report.problems
    steps = [m["step"] for m in read_metrics(second.metrics_path)]
    assert steps[-(10 - newest_checkpoint["train_step"]):] == list(
        range(newest_checkpoint["train_step"] + 1, 11)
    )


class InMemoryVersionCounter:
    """Test double of the seed's bug: each cell counts its own versions from 0, and the
    rollout side takes whatever the newest publisher says (miles only warned under indep-dp)."""

    def __init__(self) -> None:
        self.per_cell: dict[str, int] = {}
        self.rollout_version = 0
        self.history: list[int] = []

    def publish(self, cell_id: str) -> None:
        self.per_cell[cell_id] = self.per_cell.get(cell_id, 0) + 1
        self.rollout_version = self.per_cell[cell_id]
        self.history.append(self.rollout_version)


def test_the_same_kill_sends_an_in_memory_counter_backwards_but_not_the_ledger(
    tmp_path: Path,
):
    plan = KillPlan(at_step=4)
    counter = InMemoryVersionCounter()
    ledger_versions: list[int] = []

    def observe(job: TrainingJob, step: int) -> None:
        head = job.ledger.head(job.run_id)
        counter.publish(head.publisher_cell)  # one publish per step, by the ledger's publisher
        ledger_versions.append(head.version)
        plan(job, step)

    run_job(small_config("contrast", num_rollout=9),
            JobOptions(runs_dir=tmp_path, progress=False, plot=False, on_step=observe))

    assert plan.fired
    drops = [(a, b) for a, b in zip(counter.history, counter.history[1:]) if b < a]
    assert drops, counter.history  # e.g. 5 -> 1 after the failover: negative staleness
    assert ledger_versions == sorted(ledger_versions)
    assert len(set(ledger_versions)) == len(ledger_versions)


def test_the_default_job_learns_and_leaves_ledger_metrics_and_plot(tmp_path: Path):
    config = RunConfig(run_id="learns", num_rollout=60)  # the defaults of `make run`, shorter

    result = run_job(config, JobOptions(runs_dir=tmp_path, progress=False))

    assert result.ok, result.audit_problems
    assert result.reward_last >= result.reward_first + 0.2, (result.reward_first,
                                                            result.reward_last)
    assert result.head_version == 60
    metrics = read_metrics(result.metrics_path)
    assert len(metrics) == 60
    assert result.plot_path is not None and result.plot_path.read_bytes()[:4] == b"\x89PNG"
    _assert_steps_are_timed_phase_by_phase(metrics)
    # The loss sees the drained batch one version later at most (it was prefetched while the
    # step before published), and fully-async does train on data a version old.
    for line in metrics:
        drained, trained = line["rollout/fully_async/staleness_max"], line[TRAIN_STALENESS_MAX]
        assert drained <= trained <= drained + 1, line
    assert any(line[TRAIN_STALENESS_MAX] >= 1 for line in metrics)
    # Batched rollout traffic: 16 groups a step reach 2 engines in a few calls, not 16.
    calls = sorted(m["rollout/fully_async/engine_calls"] for m in metrics[5:])
    assert calls[len(calls) // 2] <= 4, calls
    assert all(0.0 < m["rollout/fully_async/manager_cpu_share"] < 2.0 for m in metrics[5:])
    assert result.ledger_url == f"sqlite:///{tmp_path / 'learns' / 'ledger.db'}"


def _assert_steps_are_timed_phase_by_phase(metrics: list[dict]) -> None:
    """Every step's phases are on its line and add up to no more than the step; the update
    is split into its own steps; the control plane is the step less train and drain wait."""
    # The default swap is in flight: no pause step; load is the engines staging the weights
    # while they generate. The swap and stamp and engines_stamped run on the publisher's
    # update tail beside the next train step: only the next update's wait for it is timed.
    update_steps = ("started", "stage", "load", "commit", "hand_over")
    for line in metrics:
        phases = [line[f"time/{name}_s"] for name in ("drain_wait", "begin_step", "train",
                                                       "provenance", "evaluate", "end_step")]
        phases.append(line.get("time/update_weights_s", 0.0))
        assert sum(phases) <= line["step_s"] + 0.002, line  # each phase is rounded to 0.1 ms
        if "time/update_weights_s" in line:
            parts = [line[f"time/update/{name}_s"] for name in update_steps]
            assert "time/update/pause_s" not in line, line
            assert "time/update/stamp_s" not in line, line
            parts.append(line.get("time/update/tail_wait_s", 0.0))
            assert sum(parts) <= line["time/update_weights_s"] + 0.002, line
        expected = line["step_s"] - line["time/drain_wait_s"] - line["time/train_s"]
        assert abs(line["time/control_plane_s"] - expected) < 0.003, line
    # The next update waits for the last one's tail, unless a checkpoint did so first.
    waited = [line["step"] for line in metrics if "time/update/tail_wait_s" in line]
    assert waited and metrics[0]["step"] not in waited, waited


class SlowUpdateTails(JobHooks):
    """Every weight update's tail is held for ``DELAY_S`` after the stamp, before
    ``engines_stamped``: what must wait for the tail (an evaluation, the end of the run) is
    seen to wait, by the order of the ledger's events."""

    def before_publish(self, job: TrainingJob) -> None:
        publisher = job.ledger.head(job.run_id).publisher_cell
        ray.get(job.supervisor.cells.actor(publisher).arm_update_fault.remote(
            "after-finalize", "delay"))


def test_the_run_ends_once_the_last_updates_engines_are_stamped(tmp_path: Path):
    result = run_job(small_config("slow-tails", num_rollout=3),
                     JobOptions(runs_dir=tmp_path, progress=False, plot=False,
                                hooks=SlowUpdateTails()))

    with Ledger.open(result.ledger_url, readonly=True) as ledger:
        events = list(ledger.events("slow-tails"))
    kinds = [event.kind for event in events]
    stamped = [event.payload["version"] for event in events if event.kind == "engines_stamped"]
    assert stamped == [1, 2, 3] and result.head_version == 3
    assert kinds.index("run_finished") > max(
        index for index, kind in enumerate(kinds) if kind == "engines_stamped")
    assert result.ok and not result.audit_problems


def test_orchestrator_run_prints_where_everything_is(tmp_path: Path, capsys):
    from orchestrator.cli import main

    main(["run", "--run-id", "cli-run", "--num-rollout", "4", "--rollout-batch-size", "4",
          "--runs-dir", str(tmp_path), "--no-progress"])  # returns: exit code 0

    out = capsys.readouterr().out
    run_dir = tmp_path / "cli-run"
    for artefact in ("ledger.db", "metrics.jsonl", "run.png"):
        assert (run_dir / artefact).is_file()
        assert artefact in out
    assert "clean" in out


def test_an_engine_dying_during_a_publish_is_restarted_and_gets_the_new_version(
    tmp_path: Path,
):
    published: list[tuple[int, list[dict]]] = []

    def kill_engine_then_publish(job: TrainingJob, step: int) -> None:
        if step != 3 or published:
            return
        # The step's own update is finished first (its tail stamps the engines beside the
        # next step), so the engine dies during this publish, not during that one's stamp.
        job.publisher.settle()
        victim = job.engines["engine-1"]
        os.kill(ray.get(victim.pid.remote()), signal.SIGKILL)
        version = job.publisher.publish_weights().version  # 1st attempt meets the dead engine
        health = ray.get([engine.health.remote() for engine in job.engines.values()])
        published.append((version, health))

    result = run_job(small_config("engine-dies", num_rollout=6),
                     JobOptions(runs_dir=tmp_path, progress=False, plot=False,
                                on_step=kill_engine_then_publish))

    assert published, "the engine was never killed"
    version, health = published[0]
    assert [h["version"] for h in health] == [version, version]
    with Ledger.open(result.ledger_url, readonly=True) as ledger:
        events = list(ledger.events("engine-dies"))
        report = ledger.verify("engine-dies")
    assert sum(e.kind == "weight_update_aborted" for e in events) == 1
    stamp = next(e for e in events if e.kind == "engines_stamped"
                 and e.payload["version"] == version)
    assert stamp.payload["engine_ids"] == ["engine-0", "engine-1"]
    assert report.ok, report.problems
    assert result.ok and result.steps == 6
