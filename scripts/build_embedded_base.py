"""Rebuild the embedded base shipped in the package (``src/agentic_rl/models/embedded_base/``).

    make embedded-base                      # pretrain (about two CPU hours) and write the shipped folder + card
    .venv/bin/python scripts/build_embedded_base.py --check   # rebuild into runs/ only and compare with the shipped

Two phases, each the pretrain stage (resumable with ``--resume``: each run directory keeps its checkpoints):

1. ``configs/embedded-base.yaml`` from a new model, into ``runs/embedded-base/phase1``; its float16 copy (as it
   would ship) in ``runs/embedded-base/phase1-float16``;
2. ``configs/embedded-base-distractors.yaml`` from that copy, into ``runs/embedded-base/phase2``;

then :func:`ship`: float16 weights, tokenizer, and the card with the probe scores and the weights' sha256.
``--first-phase DIR`` starts the second phase from a first phase built before (its float16 folder), to check the
second phase alone (about 20 minutes).

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
#: The two phases' settings files, in order; the second continues from the first (``init_from``).
RECIPES = (ROOT / "configs" / "embedded-base.yaml", ROOT / "configs" / "embedded-base-distractors.yaml")


def ship(model_dir: str | Path, dest: str | Path, *, recipe: list[dict[str, Any]], command: str,
         first_phase_sha256: str | None = None) -> dict[str, Any]:
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
        "corpus_mix": BROAD_MIX,
        **({"first_phase_sha256": first_phase_sha256} if first_phase_sha256 else {}),
        "probes": run_probes(shipped, tokenizer),
    }
    (Path(dest) / CARD_FILE).write_text("---\n" + yaml.safe_dump(card, sort_keys=False) + "---\n\n" + _card_body(card),
                                        encoding="utf-8")
    return card


def _card_body(card: dict[str, Any]) -> str:
    from agentic_rl.train.probes import PROBES

    mix = ", ".join(f"{kind} {share:.1%}" for kind, share in card["corpus_mix"].items())
    phases = "\n".join(
        f"{i}. `{phase['file']}`: {phase['max_steps']} steps of {phase['batch_size']} blocks of {phase['seq_length']} "
        f"tokens on {phase['corpus_lines']} lines (seed {phase['seed']}), learning rate {phase['learning_rate']} "
        f"decaying to 0, fp32 on CPU"
        + (f"; a share {phase['distractors']} of its multiplication problems carry a sentence whose number the "
           f"answer does not use" if phase.get("distractors") else "")
        + ("; from phase 1's weights stored in float16" + (f" (sha256 `{card['first_phase_sha256']}`)"
                                                          if card.get("first_phase_sha256") else "")
           if i > 1 else "") + "."
        for i, phase in enumerate(card["recipe"], 1))
    probes = "\n".join(f"| {name} | {card['probes'][name]:.1%} |" for name in PROBES)
    return f"""# The agentic-rl embedded base

A {card['parameters'] / 1e6:.2f}M-parameter Qwen3-architecture causal LM with its own byte-level BPE tokenizer (one
token per digit, Qwen3's chat template, tool-call tokens), pretrained on a synthetic corpus only. It is the starting
point of every embedded preset (`model: embedded`), as a released checkpoint is for real runs. It knows no facts:
its corpus is arithmetic, templated word problems with their worked steps and calculator calls, whole calculator and
search episodes in the chat layout, number lists and fictional worlds.

- Corpus mix: {mix}.
- Training, in two phases (the pretrain stage with each file's settings):

{phases}

- Stored in float16 ({card['weights_bytes'] / 1e6:.1f} MB).
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
    parser.add_argument("--output-dir", default="runs/embedded-base", help="folder of the two pretraining runs")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted pretraining run")
    parser.add_argument("--check", action="store_true", help="compare with the shipped base instead of replacing it")
    parser.add_argument("--first-phase", metavar="DIR",
                        help="start the second phase from this float16 first phase (an earlier build's "
                             "OUTPUT_DIR/phase1-float16) instead of pretraining it")
    args = parser.parse_args(argv)
    root = Path(args.output_dir)
    first_float16 = Path(args.first_phase) if args.first_phase else root / "phase1-float16"
    phases = [yaml.safe_load(path.read_text(encoding="utf-8")) for path in RECIPES]
    try:  # both configurations checked before anything runs
        configs = [config_from_dict(PretrainConfig, {**values, "output_dir": str(root / f"phase{i}"),
                                                     "resume": args.resume}, where=str(path))
                   for i, (values, path) in enumerate(zip(phases, RECIPES), 1)]
        if args.first_phase and not (first_float16 / WEIGHTS_FILE).is_file():
            raise AgenticRLError(f"--first-phase {first_float16}: no {WEIGHTS_FILE} there")
        recipe = [{"file": str(path.relative_to(ROOT)), **values} for path, values in zip(RECIPES, phases)]
        if not args.first_phase:
            if not (root / "phase1" / "stage.json").is_file():
                run_pretrain(configs[0])
            if not (first_float16 / WEIGHTS_FILE).is_file():
                ship(root / "phase1" / "model", first_float16, recipe=recipe[:1], command="make embedded-base")
        configs[1].init_from = str(first_float16)
        if not (root / "phase2" / "stage.json").is_file():
            run_pretrain(configs[1])
        dest = root / "shipped" if args.check else EMBEDDED_DIR
        card = ship(root / "phase2" / "model", dest, recipe=recipe, command="make embedded-base",
                    first_phase_sha256=file_sha256(first_float16 / WEIGHTS_FILE))
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
