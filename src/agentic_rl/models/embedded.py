"""The embedded base model shipped inside the package: what ``model: embedded`` (``--model embedded``) loads.

One tokenizer (chat template, tool-call tokens) and one tiny Qwen3-architecture model, pretrained once by the
project's own command on the ``broad`` synthetic corpus, which holds what every embedded task builds on. Every
embedded preset starts from it, as real runs start from one released checkpoint: seeds vary fine-tuning and RL only.
It loads through the same code as a hub model (``models/loading.py``); only the weights differ.

The folder ``models/embedded_base/`` holds the ``save_pretrained`` files (weights stored in float16, loaded in the
stages' precision) and ``README.md``, the model card: its YAML header records the recipe, the corpus mix, the steps,
the probe scores (:mod:`agentic_rl.models.probes`) and the weights' sha256, which a test checks against the file.

Rebuild: ``make embedded-base`` (``scripts/build_embedded_base.py``: the pretrain stage with
``configs/embedded-base.yaml``, then :func:`ship`).
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
    """What a report names as a run's base: ``{"base": "embedded" or the path/id, "sha256": ... when known}``."""
    from agentic_rl.models.loading import resolve_model_path

    described: dict[str, Any] = {"base": model}
    try:
        folder = Path(resolve_model_path(model))
    except ModelLoadError:
        return described
    weights = folder / WEIGHTS_FILE
    if weights.is_file():
        described["sha256"] = file_sha256(weights)
    return described


def ship(model_dir: str | Path, dest: str | Path, *, recipe: dict[str, Any], command: str) -> dict[str, Any]:
    """Write the pretrained model in ``model_dir`` into ``dest`` as the shipped base: float16 weights, the tokenizer,
    and a card with the probe scores measured on the float16 weights as they will load, and their sha256."""
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentic_rl.models.loading import save_model_atomically
    from agentic_rl.models.probes import run_probes

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = model.to(torch.float16)
    dest = save_model_atomically(model, tokenizer, dest)
    shipped = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32)  # exactly what `embedded` loads
    n_params = sum(p.numel() for p in shipped.parameters())
    card = {
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "architecture": "Qwen3ForCausalLM",
        "parameters": n_params,
        "weights_dtype": "float16",
        "weights_bytes": (Path(dest) / WEIGHTS_FILE).stat().st_size,
        "sha256": file_sha256(Path(dest) / WEIGHTS_FILE),
        "command": command,
        "recipe": recipe,
        "probes": run_probes(shipped, tokenizer),
    }
    (Path(dest) / CARD_FILE).write_text("---\n" + yaml.safe_dump(card, sort_keys=False) + "---\n\n" + _card_body(card),
                                        encoding="utf-8")
    return card


def _card_body(card: dict[str, Any]) -> str:
    from agentic_rl.models.probes import PROBES

    recipe = card["recipe"]
    mix = ", ".join(f"{kind} {share:.1%}" for kind, share in recipe.get("corpus_mix", {}).items())
    probes = "\n".join(f"| {name} | {card['probes'][name]:.1%} |" for name in PROBES)
    return f"""# The agentic-rl embedded base

A {card['parameters'] / 1e6:.2f}M-parameter Qwen3-architecture causal LM with its own byte-level BPE tokenizer (one
token per digit, Qwen3's chat template, tool-call tokens), pretrained on a synthetic corpus only. It is the starting
point of every embedded preset (`model: embedded`), as a released checkpoint is for real runs. It knows no facts:
its corpus is arithmetic, templated word problems, number lists and fictional worlds.

- Corpus mix ({recipe.get('corpus_lines')} lines): {mix}.
- Training: {recipe.get('max_steps')} steps of {recipe.get('batch_size')} blocks of {recipe.get('seq_length')} tokens,
  learning rate {recipe.get('learning_rate')}, fp32 on CPU; stored in float16 ({card['weights_bytes'] / 1e6:.1f} MB).
- Rebuild: `{card['command']}`.
- Weights sha256: `{card['sha256']}`.

## Probes (greedy, held-out; `agentic_rl.models.probes`)

| probe | score |
|---|---|
{probes}
"""
