"""Rebuild the embedded base shipped in the package (``src/agentic_rl/models/embedded_base/``).

    make embedded-base                      # pretrain (tens of CPU minutes) and write the shipped folder + card
    .venv/bin/python scripts/build_embedded_base.py --check   # rebuild into runs/ only and compare with the shipped

1. ``agentic-rl pretrain --config configs/embedded-base.yaml --output-dir runs/embedded-base`` (resumable with
   ``--resume``: the run directory keeps its checkpoints);
2. :func:`ship`: float16 weights, tokenizer, and the card with the probe scores and the weights' sha256.

Run it with ``OMP_NUM_THREADS=1`` for a bit-identical rebuild (the shipped weights were built that way: the order of
floating-point sums depends on the thread count). ``--check`` writes the candidate into ``runs/embedded-base/shipped``
and reports whether its sha256 equals the shipped one, or else whether its probe scores do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from agentic_rl.config import config_from_dict
from agentic_rl.errors import AgenticRLError
from agentic_rl.models.embedded import CARD_FILE, EMBEDDED_DIR, WEIGHTS_FILE, file_sha256, read_card
from agentic_rl.train.pretrain import BROAD_MIX, PretrainConfig
from agentic_rl.train.pretrain import run as run_pretrain

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs" / "embedded-base.yaml"


def ship(model_dir: str | Path, dest: str | Path, *, recipe: dict[str, Any], command: str) -> dict[str, Any]:
    """Write the pretrained model in ``model_dir`` into ``dest`` as the shipped base: float16 weights, the tokenizer,
    and a card with the probe scores measured on the float16 weights as they will load, and their sha256."""
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentic_rl.models.loading import save_model_atomically
    from agentic_rl.train.probes import run_probes

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
    from agentic_rl.train.probes import PROBES

    recipe = card["recipe"]
    mix = ", ".join(f"{kind} {share:.1%}" for kind, share in recipe.get("corpus_mix", {}).items())
    probes = "\n".join(f"| {name} | {card['probes'][name]:.1%} |" for name in PROBES)
    return f"""# The agentic-rl embedded base

A {card['parameters'] / 1e6:.2f}M-parameter Qwen3-architecture causal LM with its own byte-level BPE tokenizer (one
token per digit, Qwen3's chat template, tool-call tokens), pretrained on a synthetic corpus only. It is the starting
point of every embedded preset (`model: embedded`), as a released checkpoint is for real runs. It knows no facts:
its corpus is arithmetic, templated word problems with their worked steps and calculator calls, whole calculator and
search episodes in the chat layout, number lists and fictional worlds.

- Corpus mix ({recipe.get('corpus_lines')} lines): {mix}.
- Training: {recipe.get('max_steps')} steps of {recipe.get('batch_size')} blocks of {recipe.get('seq_length')} tokens,
  learning rate {recipe.get('learning_rate')}, fp32 on CPU; stored in float16 ({card['weights_bytes'] / 1e6:.1f} MB).
- Rebuild: `{card['command']}`.
- Weights sha256: `{card['sha256']}`.

## Probes (greedy, held-out; `agentic_rl.train.probes`)

The first six in plain text, the `tool_` ones in the chat layout a rollout's context has.

| probe | score |
|---|---|
{probes}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--output-dir", default="runs/embedded-base", help="the pretraining run directory")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted pretraining run")
    parser.add_argument("--check", action="store_true", help="compare with the shipped base instead of replacing it")
    args = parser.parse_args(argv)
    values = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    config = config_from_dict(PretrainConfig, {**values, "output_dir": args.output_dir, "resume": args.resume},
                              where=str(RECIPE))
    try:
        run_dir = Path(args.output_dir)
        if not (run_dir / "stage.json").is_file():
            run_pretrain(config)
        recipe = {**values, "corpus_mix": BROAD_MIX}
        dest = run_dir / "shipped" if args.check else EMBEDDED_DIR
        card = ship(run_dir / "model", dest, recipe=recipe, command="make embedded-base")
    except AgenticRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {dest}: sha256 {card['sha256']}, probes {card['probes']}")
    if args.check:
        shipped = read_card()
        same_file = shipped["sha256"] == card["sha256"]
        same_probes = shipped["probes"] == card["probes"]
        print(f"shipped sha256 {shipped['sha256']}: {'identical' if same_file else 'different'}; "
              f"probes {'equal' if same_probes else 'different: ' + str(shipped['probes'])}")
        return 0 if same_file or same_probes else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
