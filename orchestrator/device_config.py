"""The device options of a run: ``--device``, ``--dtype``, GPUs per actor, vLLM's GPU memory.

A base class of :class:`orchestrator.config.RunConfig` (it inherits these fields, so each is a
flag and a config key like any other); kept in a module of its own so that the config module
stays small and the device rules are read in one place.

``auto`` and an unset GPU count are decided once the Ray cluster is known
(:func:`orchestrator.control.placement.devices.resolve_devices`, from Ray's resource view), and
the resolved values are what ``run_started`` records. A config that was never resolved (a
test that builds actors from ``RunConfig()``) asks for no GPU: it runs on CPU, as before.

Rules checked here, at load: ``--device cpu`` asks for no GPU; a GPU count above 1 is whole
(Ray's rule: a fraction is only allowed below one GPU, where actors share it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["DeviceOptions", "Device", "DType"]

Device = Literal["auto", "cpu", "cuda"]
DType = Literal["auto", "float32", "bfloat16"]


class DeviceOptions(BaseModel):
    """Where cells and engines compute, in which dtype, and the GPUs each asks Ray for."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    device: Device = Field(
        default="auto",
        description="where cells and engines compute: cuda, cpu, or auto (cuda when the Ray "
                    "cluster reports GPUs, else cpu)",
    )
    dtype: DType = Field(
        default="auto",
        description="compute dtype: cells run forward/backward under autocast in it (master "
                    "weights and optimizer stay float32), engines hold their weights in it; "
                    "auto: bfloat16 on cuda, float32 on cpu",
    )
    gpus_per_cell: float | None = Field(
        default=None, ge=0.0,
        description="GPUs each train cell asks Ray for, fractional below 1 (0.5: two cells "
                    "share a GPU); default on cuda: 1 when the cluster has a GPU for every "
                    "cell and engine, else an equal share (1/k of a GPU); 0 on cpu",
    )
    gpus_per_engine: float | None = Field(
        default=None, ge=0.0,
        description="GPUs each rollout engine asks Ray for, fractional below 1; default: the "
                    "same rule as for cells",
    )
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0.0, le=1.0,
        description="fraction of its GPU's memory a vLLM engine may take (vLLM's "
                    "gpu_memory_utilization); default 0.9 x the engine's GPU share",
    )

    @field_validator("gpus_per_cell", "gpus_per_engine")
    @classmethod
    def _check_gpu_count(cls, value: float | None) -> float | None:
        # Ray places a fractional request on one GPU; above one GPU only whole numbers exist.
        if value is not None and value > 1 and not float(value).is_integer():
            raise ValueError("must be a fraction below 1 or a whole number of GPUs")
        return value

    @model_validator(mode="after")
    def _check_cpu_asks_no_gpu(self) -> DeviceOptions:
        if self.device == "cpu":
            for name in ("gpus_per_cell", "gpus_per_engine"):
                if getattr(self, name):
                    raise ValueError(f"{name}: --device cpu asks Ray for no GPU (use --device "
                                     "cuda or auto)")
        return self
