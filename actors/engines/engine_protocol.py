"""The rollout engine interface the rest of the system relies on, as a ``typing.Protocol``.

Every engine (the built-in :class:`~actors.engines.rollout_engine.RolloutEngine`, a vLLM engine, a
benchmark double) is a plain class made a Ray actor where it is allocated. The control plane
calls the control methods through Ray handles; the rollout manager calls :meth:`generate`
(or :meth:`generate_batch`, many groups in one call) through an
:class:`~orchestrator.rollout.types.EnginePool`. Nothing here imports Ray.

Samples (what :meth:`RolloutEngineProtocol.generate` returns)
------------------------------------------------------------
One :class:`~orchestrator.rollout.types.Sample` per response, ``group_index`` set, and:

* ``response_tokens``: the generated token ids (an EOS included if one was sampled);
* ``rollout_log_probs``: one float per response token, ``log_softmax(logits / temperature)``
  of the chosen token, under the weights that produced THAT token (the loss uses it for the
  per-token importance ratio, so it must come from the producing weights, not the final ones);
* ``token_versions``: one int per response token, the weight version that produced it;
* ``weight_versions``: the distinct versions the sample ran under, in the order they were
  first used. It always holds the version current when the call started (so a sample with no
  token is still stamped), then every version its tokens add. Its minimum equals
  ``min(token_versions)`` whenever there are tokens;
* ``status``: COMPLETED (EOS), TRUNCATED (token budget or context), ABORTED (see below);
* ``reward``: the task's reward (0 for ABORTED).

Versions are plain ints (0 = the weights the engine was launched with); the engine never
invents a version, it only uses what :meth:`update_weight_version` stamped.

The weight update (DESIGN section 5) and the two pause modes
-------------------------------------------------------------
The publisher at epoch ``e`` calls, in order: :meth:`begin_update` (``e``), :meth:`load_weights`
(``e``), then, after the ledger committed ``v``, :meth:`update_weight_version` (``v``, ``e``)
and :meth:`continue_generation` (``e``). Every call from an epoch below the highest the engine
has seen raises ``StaleEpochError`` and changes nothing (the engines fence the tensors).

What ``begin_update`` does to generation in flight is the engine's *pause mode*, fixed when it
is built (``partial_rollout``, from ``RunConfig.partial_rollout``):

* ``abort`` (``partial_rollout=False``): in-flight calls stop at the next token boundary and
  return ABORTED samples (tokens so far, reward 0); the rollout path recycles or drops them.
* ``in_place`` (``partial_rollout=True``, miles ``--pause-generation-mode in_place``, verl
  ``partial_rollout``): in-flight calls stop at the next token boundary and WAIT, keeping what
  they generated. After ``continue_generation`` they go on under the new weights: later tokens
  carry the new version in ``token_versions`` and their log-probs come from the new weights.
  Such a sample spans versions; its staleness is ``current - min(token_versions)``, so it is
  bounded like any other and never negative. A call that stays parked longer than the engine's
  paused-wait timeout (a publisher that died mid-update and nobody resumed) comes back ABORTED,
  with its tokens so far.

In both modes ``begin_update`` returns only when no call is computing a token (aborted calls
have returned, in-place calls are parked), so ``load_weights`` never changes weights under a
running forward pass; new calls wait while the engine is paused.

In flight (``--weight-swap in-flight``, PipelineRL's in-flight updates) the publisher calls
:meth:`stage_weights` (``e``) instead of ``begin_update`` and ``load_weights``: the engine
checks the weights and holds them beside the serving ones while it keeps generating under the
old weights and label. After the commit, :meth:`swap_and_stamp` (``v``, ``e``) pauses at the
next token boundary (per the pause mode, exactly as ``begin_update`` would), loads the weights
staged at ``e``, stamps ``v`` and resumes, in one call. A swap without weights staged at its
epoch is refused and changes nothing; a newer stage replaces an older one.

Retry safety: ``begin_update`` twice is harmless; ``load_weights`` again overwrites with the
same tensors; ``update_weight_version`` with the same ``(v, e)`` is a no-op; ``continue_generation``
on a running engine is a no-op.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from orchestrator.rollout.types import GroupRequest, Prompt, Sample

__all__ = ["PAUSE_MODES", "RolloutEngineProtocol", "pause_mode"]

PAUSE_MODES: tuple[str, ...] = ("abort", "in_place")
"""The names of the pause modes: ``abort`` (no partial rollout) and ``in_place``."""


def pause_mode(partial_rollout: bool) -> str:
    """The pause mode name of an engine built with ``partial_rollout``."""
    return "in_place" if partial_rollout else "abort"


@runtime_checkable
class RolloutEngineProtocol(Protocol):
    """What an inference engine must offer (see the module docstring for the semantics).

    Thread-safety: :meth:`generate` may run in many threads (or coroutines) at once while
    control calls arrive; control calls must never queue behind a generate call that is
    parked by a pause (run them in their own concurrency group).
    """

    engine_id: str

    def generate(self, prompt: Prompt, n_samples: int, group_index: int,
                 max_new_tokens: int | None = None) -> list[Sample]:
        """Sample ``n_samples`` responses to ``prompt`` (see "Samples" above), at most
        ``max_new_tokens`` each (None: the engine's sampling parameters; evals pass theirs).

        Waits while the engine is paused (up to its paused-wait timeout, then ABORTED). A pause
        never raises here: aborted or timed-out work comes back as ABORTED samples.

        Raises:
            ValueError: ``n_samples < 1`` or the prompt leaves no room for a response.
        """
        ...

    def generate_batch(self, requests: list[GroupRequest]) -> list[list[Sample]]:
        """:meth:`generate` for every request at once, as if each were its own concurrent
        call; the samples in request order, returned when every request finished.

        Raises:
            The first request's error (in request order), after all finished.
        """
        ...

    def begin_update(self, epoch: int) -> dict[str, Any]:
        """Adopt ``epoch``, pause (per the engine's pause mode), wait until no call computes.

        Returns :meth:`health`.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
        """
        ...

    def load_weights(self, tensors: dict[str, Any], epoch: int, transport: str = "full") -> str:
        """Copy ``tensors`` (all, or LoRA adapters only) into the paused engine; returns the
        sha256 of what was received (:func:`actors.publishing.weight_sync.tensors_checksum`). The version
        label does not change.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
            EngineStateError: the engine is not paused, or a call is still computing.
            PolicyError: names or shapes do not match; nothing changes.
            ValueError: unknown transport.
        """
        ...

    def update_weight_version(self, version: int, epoch: int) -> str:
        """Label the loaded weights with the committed ``version``; returns ``engine_id``.
        Does not resume.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
            VersionLabelError: ``version`` is not an int >= 0.
        """
        ...

    def continue_generation(self, epoch: int | None = None) -> None:
        """Resume: waiting calls start, in-place parked calls continue under the new weights.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; the engine stays paused.
        """
        ...

    def stamp_and_resume(self, version: int, epoch: int) -> dict[str, Any]:
        """:meth:`update_weight_version`, then :meth:`continue_generation`, in one call (one
        round trip of a weight update's step 5). Returns ``{"engine_id": ..., "resume_error":
        None | str}``: a resume that failed after the stamp is reported, not raised.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
            VersionLabelError: ``version`` is not an int >= 0; nothing changes.
        """
        ...

    def stage_weights(self, tensors: dict[str, Any], epoch: int,
                      transport: str = "full") -> str:
        """Receive the next weights (all, or LoRA adapters only) beside the serving ones,
        without pausing; returns the sha256 of what was received. Nothing serves them until
        :meth:`swap_and_stamp`.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
            PolicyError: names or shapes do not match; nothing changes.
            ValueError: unknown transport.
        """
        ...

    def swap_and_stamp(self, version: int, epoch: int) -> dict[str, Any]:
        """At the next token boundary, load the weights staged at ``epoch``, stamp them
        ``version`` and resume; returns what :meth:`stamp_and_resume` returns.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
            VersionLabelError: ``version`` is not an int >= 0; nothing changes.
            EngineStateError: nothing staged at ``epoch``; nothing changes.
        """
        ...

    def weights_checksum(self, adapters_only: bool = False) -> str:
        """sha256 of the engine's tensors (all, or the LoRA adapters) in name order."""
        ...

    def health(self) -> dict[str, Any]:
        """A snapshot with at least: ``engine_id``, ``pid``, ``version``, ``epoch``,
        ``paused``, ``in_flight`` (calls not yet returned, parked ones included),
        ``pause_mode`` (``abort`` | ``in_place``), and the generate calls received and not
        yet answered: ``calls``, the most it runs at once ``max_calls``, and their groups
        ``groups_in_flight`` (the engine pool gives up a call whose groups its engine does
        not hold: :mod:`orchestrator.control.engine_pool.ray_pool`)."""
        ...

    def pid(self) -> int:
        """The engine's process id (drills and tests kill it from outside)."""
        ...
