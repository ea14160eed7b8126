"""``python -m agentic_rl COMMAND ...`` (also what ``accelerate launch -m agentic_rl`` runs)."""

import sys

from agentic_rl.cli import main

sys.exit(main())
