"""How a :class:`~actors.engines.vllm.engine.VLLMEngine` maps samples onto vLLM requests: one
request per sample (a :class:`Track`), vLLM's sampling parameters, the delivery of each
``step()``'s new tokens stamped with the version the engine held during that step, and the
finished tracks as rows for :func:`actors.engines.sampling.build_samples`.

Pure bookkeeping: no lock is taken here; the engine holds its locks around every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from actors.engines.sampling import DecodedRow, SamplingParams
from orchestrator.rollout.types import SampleStatus

__all__ = ["Track", "deliver", "request_params", "track_rows"]


@dataclass
class Track:
    """One sample in flight: one vLLM request."""

    request_id: str
    start_version: int
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort" once finished


def request_params(sampling: SamplingParams, eos_id: int, max_tokens: int) -> Any:
    """vLLM's ``SamplingParams`` for one sample: delta outputs, one log-prob (the sampled
    token's), no detokenizing, stop at ``eos_id``."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VLLMSamplingParams(
        n=1, max_tokens=max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
        logprobs=0, detokenize=False, stop_token_ids=[eos_id],
        output_kind=RequestOutputKind.DELTA,
    )


def deliver(tracks: dict[str, Track], outputs: Sequence[Any], version: int) -> int:
    """Append each request's new tokens to its track, stamped with ``version``; returns how
    many tokens were delivered. Outputs of unknown or finished tracks are ignored."""
    delivered = 0
    for output in outputs:
        track = tracks.get(output.request_id)
        if track is None or track.finish_reason is not None:
            continue
        completion = output.outputs[0]
        for index, token in enumerate(completion.token_ids):
            track.tokens.append(int(token))
            track.log_probs.append(float(completion.logprobs[index][token].logprob))
            track.token_versions.append(version)
        delivered += len(completion.token_ids)
        if completion.token_ids and version not in track.versions:
            track.versions.append(version)
        if output.finished:
            track.finish_reason = completion.finish_reason or "stop"
    return delivered


def track_rows(tracks: Sequence[Track], eos_id: int) -> list[DecodedRow]:
    """Finished tracks as rows: ABORTED (aborted), COMPLETED (ends in EOS), else TRUNCATED."""
    return [DecodedRow(list(track.tokens), list(track.log_probs), list(track.token_versions),
                       list(track.versions),
                       SampleStatus.ABORTED if track.finish_reason == "abort"
                       else SampleStatus.COMPLETED if track.tokens and track.tokens[-1] == eos_id
                       else SampleStatus.TRUNCATED)
            for track in tracks]
