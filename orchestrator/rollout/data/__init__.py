"""Prompt data of a data-set task (``--prompt-data``): files in, a deterministic prompt stream out.

* ``prompt_files``: read and check local JSONL / Parquet rows (pyarrow); the data set's
  identity (files, row counts, content digest) that ``run_started`` records.
* ``tokenizer``: a local Hugging Face tokenizer behind the task's tokenizer interface.
* ``prompt_stream``: DatasetPrompts, stream position -> (epoch, row) -> Prompt (shuffle per
  epoch from the seed, chat template, ``too_long`` drops).

Imports no Ray, torch, control plane or actors (actors import it).
"""
