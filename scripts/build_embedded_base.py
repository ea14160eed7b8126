"""Rebuild the embedded base shipped in the package (``src/agentic_rl/models/embedded_base/``).

    make embedded-base                      # pretrain (tens of CPU minutes) and write the shipped folder + card
    .venv/bin/python scripts/build_embedded_base.py --check   # rebuild into runs/ only and compare with the shipped

1. ``agentic-rl pretrain --config configs/embedded-base.yaml --output-dir runs/embedded-base`` (resumable with
   ``--resume``: the run directory keeps its checkpoints);
2. :func:`agentic_rl.models.embedded.ship`: float16 weights, tokenizer, and the card with the probe scores and the
   weights' sha256.

Run it with ``OMP_NUM_THREADS=1`` for a bit-identical rebuild (the shipped weights were built that way: the order of
floating-point sums depends on the thread count). ``--check`` writes the candidate into ``runs/embedded-base/shipped``
and reports whether its sha256 equals the shipped one, or else whether its probe scores do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from agentic_rl.config import config_from_dict
from agentic_rl.errors import AgenticRLError
from agentic_rl.models.embedded import EMBEDDED_DIR, read_card, ship
from agentic_rl.train.pretrain import BROAD_MIX, PretrainConfig
from agentic_rl.train.pretrain import run as run_pretrain

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs" / "embedded-base.yaml"


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
