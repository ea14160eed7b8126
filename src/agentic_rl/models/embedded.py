"""The embedded base model shipped inside the package: what ``model: embedded`` (``--model embedded``) loads.

One tokenizer (chat template, tool-call tokens) and one tiny Qwen3-architecture model, pretrained once by the
project's own command on the ``broad`` synthetic corpus, which holds what every embedded task builds on. Every
embedded preset starts from it, as real runs start from one released checkpoint: seeds vary fine-tuning and RL only.
It loads through the same code as a hub model (``models/loading.py``); only the weights differ.

The folder ``models/embedded_base/`` holds the ``save_pretrained`` files (weights stored in float16, loaded in the
stages' precision) and ``README.md``, the model card: its YAML header records the recipe, the corpus mix, the steps,
the probe scores (:mod:`agentic_rl.train.probes`) and the weights' sha256, which a test checks against the file.

Rebuild: ``make embedded-base`` (``scripts/build_embedded_base.py``: the pretrain stage with
``configs/embedded-base.yaml``, then again from its float16 copy with ``configs/embedded-base-distractors.yaml``,
then the float16 copy and its card).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from agentic_rl.errors import ModelLoadError

#: The model name that means the shipped base.
EMBEDDED = "embedded"
#: Where the shipped base lives inside the package.
EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded_base"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "README.md"


def embedded_base_dir() -> Path:
    """The shipped base's folder; a one-line error when the installation lacks it."""
    if not (EMBEDDED_DIR / WEIGHTS_FILE).is_file():
        raise ModelLoadError(f"the embedded base is missing from this installation ({EMBEDDED_DIR / WEIGHTS_FILE}); "
                             f"reinstall the package, or rebuild it with `make embedded-base`")
    return EMBEDDED_DIR


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_card(folder: str | Path = EMBEDDED_DIR) -> dict[str, Any]:
    """The YAML header of a model card (``README.md``)."""
    import yaml

    text = (Path(folder) / CARD_FILE).read_text(encoding="utf-8")
    if not text.startswith("---\n") or "\n---\n" not in text[4:]:
        raise ModelLoadError(f"{Path(folder) / CARD_FILE} has no YAML header")
    return yaml.safe_load(text[4:text.index("\n---\n", 4)])


def describe_base(model: str) -> dict[str, Any]:
    """What a report names as a run's base: ``{"base": "embedded" or the path/id, "sha256": ...}``, the digest of its
    ``model.safetensors`` when it is the shipped base or a local folder holding one."""
    described: dict[str, Any] = {"base": model}
    weights = (EMBEDDED_DIR if model == EMBEDDED else Path(model)) / WEIGHTS_FILE
    if weights.is_file():
        described["sha256"] = file_sha256(weights)
    return described
