"""``make install-vllm`` warms vLLM's model-inspection cache, so that a run's first engines do
not each inspect the model in a subprocess of their own (:mod:`actors.engines.vllm.warm_cache`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from actors.engines.vllm import warm_cache  # noqa: E402


def test_warming_fills_the_cache_the_engines_read(tmp_path: Path) -> None:
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}

    done = subprocess.run([sys.executable, "-m", "actors.engines.vllm.warm_cache"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "vLLM's model-inspection cache is warm for LlamaForCausalLM"
    cached = list((tmp_path / "vllm-cache" / "modelinfos").glob("*LlamaForCausalLM.json"))
    assert len(cached) == 1


def test_a_failed_inspection_is_one_line_and_exit_1(monkeypatch, capsys) -> None:
    def broken(work_dir: Path) -> str:
        raise RuntimeError("no such architecture")

    monkeypatch.setattr(warm_cache, "warm_model_inspection", broken)

    assert warm_cache.main() == 1
    assert capsys.readouterr().err == ("vLLM could not inspect the task model: RuntimeError: "
                                       "no such architecture\n")
