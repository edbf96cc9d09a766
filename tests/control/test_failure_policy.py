"""FailurePolicy: the one retry loop and the restart budget, on plain objects."""

from __future__ import annotations

import pickle

import pytest

from orchestrator.control.supervision.failure_policy import FailurePolicy, RestartBudget
from orchestrator.errors import (
    OrchestratorError,
    PublisherLostError,
    RetryableFailure,
    StepFailedError,
    SupervisionLimitError,
)


class Flaky:
    """Fails as sorted out (RetryableFailure) ``failures`` times, then answers; the attempts
    numbered in ``recovered`` fail as recovered (what failed was failed over or replaced)."""

    def __init__(self, failures: int, recovered: frozenset[int] = frozenset()) -> None:
        self.failures = failures
        self.recovered = recovered
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise RetryableFailure(ConnectionError(f"attempt {self.calls} lost its cell"),
                                   recovered=self.calls in self.recovered)
        return "done"


def test_run_returns_the_first_success_after_sorted_out_failures():
    operation = Flaky(failures=2)

    assert FailurePolicy(max_attempts=3).run(operation, "train step failed") == "done"
    assert operation.calls == 3


def test_run_gives_up_after_max_attempts_naming_the_operation_and_the_last_cause():
    operation = Flaky(failures=10)

    with pytest.raises(StepFailedError, match=r"^train step failed after 3 attempts; "
                                              r"last error: attempt 3 lost its cell$") as failed:
        FailurePolicy(max_attempts=3).run(operation, "train step failed")

    assert operation.calls == 3
    assert isinstance(failed.value.__cause__, ConnectionError)


def test_recovered_failures_do_not_use_up_the_attempts():
    """Chaos seed 14: three overlapping faults in one weight update (the publisher killed after
    its commit, the next one killed mid-transfer, an engine killed), each recovered, used up
    the update's 3 attempts and ended the run."""
    operation = Flaky(failures=4, recovered=frozenset({1, 2, 3}))

    assert FailurePolicy(max_attempts=3).run(operation, "weight update failed") == "done"
    assert operation.calls == 5


def test_unrecovered_failures_still_end_the_operation_between_recovered_ones():
    operation = Flaky(failures=10, recovered=frozenset({2, 4}))

    with pytest.raises(StepFailedError, match=r"^train step failed after 5 attempts; "):
        FailurePolicy(max_attempts=3).run(operation, "train step failed")
    assert operation.calls == 5  # attempts 1, 3 and 5 were not recovered


def test_recovered_failures_are_bounded_too():
    operation = Flaky(failures=100, recovered=frozenset(range(1, 101)))

    with pytest.raises(StepFailedError, match=r"after 5 attempts"):
        FailurePolicy(max_attempts=3, max_restarts=2).run(operation, "weight update failed")
    assert operation.calls == 5  # max_attempts + max_restarts: never a loop


def test_a_retryable_failure_keeps_whether_it_was_recovered_across_processes():
    failure = pickle.loads(pickle.dumps(RetryableFailure(ConnectionError("x"), recovered=True)))

    assert failure.recovered and isinstance(failure.cause, ConnectionError)


def test_run_lets_an_error_that_was_not_sorted_out_through_at_once():
    calls = []

    def broken() -> None:
        calls.append(1)
        raise KeyError("a bug, not a loss")

    with pytest.raises(KeyError):
        FailurePolicy(max_attempts=5).run(broken, "weight update failed")
    assert calls == [1]


def test_the_restart_budget_refuses_one_more_replacement_than_max_restarts():
    budget = RestartBudget(FailurePolicy(max_restarts=2, restart_window_s=600))
    budget.charge("restarting engine engine-0")
    budget.charge("restarting engine engine-1")

    with pytest.raises(SupervisionLimitError, match="engine-0.*more than 2 replacements"):
        budget.charge("restarting engine engine-0 again")
    assert budget.total == 2


def test_replacements_older_than_the_window_are_forgotten():
    budget = RestartBudget(FailurePolicy(max_restarts=1, restart_window_s=0.0))
    budget.charge("healing cell cell-1")
    budget.charge("healing cell cell-1")  # the first is outside the (empty) window

    assert budget.total == 2


def test_every_wait_grows_with_the_heartbeat_timeout():
    short, long = FailurePolicy(heartbeat_timeout_s=1), FailurePolicy(heartbeat_timeout_s=20)

    for name in ("step_timeout_s", "probe_timeout_s", "transfer_timeout_s"):
        assert getattr(short, name) < getattr(long, name)
    assert short.probe_timeout_s > short.step_timeout_s  # a busy engine is not a dead one


def test_errors_that_cross_ray_pickle_with_their_fields():
    lost = pickle.loads(pickle.dumps(PublisherLostError("cell-0", TimeoutError("silent"))))
    retry = pickle.loads(pickle.dumps(RetryableFailure(ValueError("x"))))

    assert (lost.cell_id, str(lost.cause)) == ("cell-0", "silent")
    assert isinstance(retry.cause, ValueError)
    assert isinstance(lost, OrchestratorError) and isinstance(retry, OrchestratorError)
