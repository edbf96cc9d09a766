"""The main job on vLLM: ``orchestrator run --engine vllm --backend hf`` learns (reward rises as
with the built-in engine) with an audit-clean ledger, and a kill-engine drill recovers with
vLLM engines (the dead one is replaced, starts from the directory's weights, and is brought to
the head version by the next publish)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from actors.policies.hf_policy import check_task_vocabulary  # noqa: E402
from actors.task import TOKENIZER  # noqa: E402
from ledger import EventKind, Ledger  # noqa: E402
from orchestrator.cli import main  # noqa: E402
from orchestrator.control.driver import TrainingJob  # noqa: E402
from orchestrator.control.engine_pool.vllm_launch import resolve_model  # noqa: E402
from orchestrator.drills import DrillOptions, plan_drills, run_drill  # noqa: E402

pytestmark = pytest.mark.ray

STEPS = 30
WINDOW = 5
# In-process, the same tiny Llama goes from ~0.02 to ~0.46 in 40 steps of 16x8 samples
# (measured); after 30 steps of the job the last window is far above the first.
MIN_GAIN = 0.15


def test_orchestrator_run_with_vllm_and_hf_learns(ray_cluster, tmp_path: Path, capsys) -> None:
    argv = ["run", "--engine", "vllm", "--backend", "hf", "--run-id", "vllm-learn",
            "--runs-dir", str(tmp_path), "--num-rollout", str(STEPS), "--num-cells", "1",
            "--num-engines", "1", "--rollout-batch-size", "16", "--n-samples-per-prompt", "8",
            "--no-progress", "--tracker", "tensorboard"]
    try:
        main(argv)
    except SystemExit as exited:  # only a failure exits; success returns
        pytest.fail(f"orchestrator run exited {exited.code}: {capsys.readouterr()}")
    out = capsys.readouterr().out
    print(out)

    assert "audit               clean" in out
    run_dir = tmp_path / "vllm-learn"
    check_task_vocabulary(run_dir / "model", TOKENIZER.symbols)  # made locally, cached
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [record["reward/mean"] for record in records]
    first, last = statistics.fmean(rewards[:WINDOW]), statistics.fmean(rewards[-WINDOW:])
    print(f"vllm+hf: mean reward first {WINDOW} steps {first:.3f}, last {WINDOW} {last:.3f}")
    assert len(records) == STEPS
    assert last >= first + MIN_GAIN, (first, last)
    ledger = Ledger.open(f"sqlite:///{run_dir / 'ledger.db'}", readonly=True)
    try:
        report = ledger.verify("vllm-learn")
        assert report.ok, report.problems
        assert ledger.head("vllm-learn").version == STEPS
        stamped = [e.payload for e in ledger.events("vllm-learn")
                   if e.kind == EventKind.ENGINES_STAMPED]
        assert stamped[-1]["version"] == STEPS and stamped[-1]["engine_ids"] == ["engine-0"]
    finally:
        ledger.close()
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


class VLLMJob(TrainingJob):
    """The drill's job with vLLM engines and a Hugging Face trainer."""

    def __init__(self, config, ledger, layout, options) -> None:
        config = config.model_copy(update={"engine": "vllm", "backend": "hf"})
        super().__init__(resolve_model(config, layout.run_dir), ledger, layout, options)


@pytest.mark.slow  # three vLLM start-ups (two engines, one replacement): make drills
def test_kill_engine_drill_recovers_with_vllm_engines(ray_cluster, tmp_path: Path) -> None:
    [plan] = plan_drills(["kill-engine"])
    result = run_drill(plan, DrillOptions(runs_dir=tmp_path / "runs", job_class=VLLMJob,
                                          deadline_s=900.0))

    assert result.passed, result.problems
    assert result.detail["engine_restarts"] == 1
    assert result.version_after > result.version_before >= 1
    assert result.negative_staleness == 0 and result.groups_lost == 0
