"""``rl_training``: the training stages as one tool an agent framework can call (hello-agents' ``Tool``).

    tool = RLTrainingTool(workspace="runs/agent")
    tool.run({"action": "load_dataset", "dataset": "synthetic", "split": "train", "name": "arith"})
    tool.run({"action": "create_reward", "rewards": ["accuracy:1.0", "format:0.2", "length(alpha=0.002):0.5"],
              "name": "mix"})
    tool.run({"action": "train", "algorithm": "sft", "model": "Qwen/Qwen3-0.6B", "dataset": "arith",
              "learning_rate": 2e-4, "lora_r": 16, "max_steps": 200})
    tool.run({"action": "train", "algorithm": "grpo", "model": "sft_1", "dataset": "arith", "rewards": "mix",
              "beta": 0.04, "num_generations": 8, "max_steps": 100})
    tool.run({"action": "evaluate", "model": "grpo_2", "dataset": "arith", "max_samples": 200})
    tool.run({"action": "status"})

Every call returns a JSON string: the action's result, or ``{"error": "..."}`` (unknown action, unknown or mistyped
key, missing file, ...) — the tool never raises into the agent loop. ``tool.register(registry)`` registers it in a
hello-agents ``ToolRegistry`` (the same as ``registry.register_tool(tool)``).

Actions and their parameters (besides ``action``):

* ``train`` — ``algorithm`` (``sft``, ``grpo`` or ``rloo``: the GRPO stage with ``GRPOConfig.algorithm`` set to
  ``rloo``, TRL's RLOOTrainer), optional ``name``, and *any field* of the stage's config
  (:class:`agentic_rl.train.sft.SFTConfig` / :class:`agentic_rl.train.grpo.GRPOConfig`: learning rate, LoRA settings,
  β, group size, rewards, lengths, epochs, batch size, ...). The values are mapped onto the dataclass with
  :func:`agentic_rl.config.config_from_dict`, so an unknown key is an error naming it (with a suggestion), and the
  stage's own ``run(config)`` trains. ``model`` and ``dataset`` may name an earlier run / loaded dataset; ``rewards``
  may name a reward created with ``create_reward`` (or list specs and names). The run directory defaults to
  ``<workspace>/runs/<name>``; a relative ``output_dir`` is a folder inside the workspace (an absolute one is used
  as given); its ``config.yaml`` holds every resolved setting. GRPO on a dataset the tool holds, with the size of
  the held-out slice (``eval_samples``) left to the preset, holds out at most a fifth of the rows for its periodic
  checks, and none when that is fewer than 8 problems (a small dataset trains on every row) unless ``heldout_every``
  asks for the checks (then at least one); one line says which.
* ``load_dataset`` — ``dataset`` (also called ``source``: synthetic, gsm8k, a hub id, a file or folder,
  ``module:function``, or a dataset loaded before, whose source and options are then reused for another split),
  ``split``, any keyword of :func:`agentic_rl.data.custom.load_task_dataset` (column mapping, ``max_samples``,
  ``seed``, synthetic knobs) and optional ``name``. The canonical rows are saved as
  ``<workspace>/datasets/<name>/<split>.jsonl`` so later ``train`` / ``evaluate`` calls read exactly them; a split
  they ask for that was not loaded yet is loaded from the same source (``evaluate`` on the test split of a dataset
  loaded for training); rows handed over with ``register_dataset`` are one split, which ``evaluate`` reads unless
  another is asked for.
* ``create_reward`` — ``rewards`` (a spec or a list: ``"accuracy:1.0"``, ``"length(alpha=0.01):0.5"``,
  ``"my_pkg.rewards:brevity:0.3"``), optional ``name``; built once with :func:`agentic_rl.rewards.build_rewards` to
  check it. Optional ``completions`` (+ ``ground_truth``) scores sample texts with each component.
* ``evaluate`` — ``model`` (or ``models``) plus any field of :class:`agentic_rl.eval.evaluate.EvalConfig`; returns
  every metric (accuracy strict/lenient, pass@k, numeric error, format rate, average reward / tokens / steps,
  truncation, per difficulty bucket, error categories).
* ``status`` — runs so far (algorithm, model directory, resolved key settings, metrics), datasets and rewards;
  ``name`` shows one run.

**The book's calls work as the Hello-Agents book writes them.** A call written for hello-agents' own ``rl_training``
tool runs unchanged: ``model_name``, ``num_epochs``, ``use_lora``, ``batch_size``, ``max_samples``, ``output_dir``,
``dataset``, ``custom_dataset``, ``custom_reward``, ``use_wandb``, ``use_tensorboard``, ``wandb_project``,
``lora_rank``, ``kl_coef``, ``clip_range``, ``max_new_tokens``, ``reward_type`` / ``reward_config`` and ``eval_steps``
for ``train``; ``format``, ``split``, ``max_samples``, ``model_name`` for ``load_dataset``; ``reward_type``,
``penalty_weight``, ``max_length``, ``step_bonus`` for ``create_reward``; ``model_path``, ``max_samples``, ``use_lora``,
``metrics``, ``k``, ``return_details`` for ``evaluate``; the methods :meth:`RLTrainingTool.register_dataset` /
:meth:`RLTrainingTool.register_reward_function`; and the book's helper functions :func:`train_with_sft`,
:func:`train_with_grpo`, :func:`load_dataset`, :func:`create_reward_function` and :func:`evaluate_model`. A call without
``action`` is a ``train`` call, as in the book. A call that uses one of the book's own keys (or trains on a dataset
handed over with ``register_dataset``) gets the book's defaults for the keys it leaves out (``algorithm`` sft,
``model_name`` Qwen/Qwen2-0.5B-Instruct, ``dataset`` gsm8k, 3 epochs, batch size 4, LoRA, TensorBoard; for GRPO the
reward registered under the dataset's name, else accuracy; 100 GSM8K test problems and 128 new tokens for ``evaluate``),
except ``output_dir``: the book's ``"./output"`` would leave the workspace, so the run directory stays there. The book
names a trained model by the ``output_dir`` it gave, so ``model_path`` / ``model_name`` equal to an earlier run's
``output_dir`` is that run's model; a train result also has the book's ``model_path``, ``num_samples``, ``final_loss``
(and ``average_reward`` for GRPO), an evaluate result its ``accuracy``, ``average_reward``, ``average_length``,
``average_steps``, ``format_correctness``, ``accuracy_at_k``, ``details`` and ``errors``. Each book key maps onto one of
our settings (:data:`BOOK_KEYS` says which); giving both spellings of one setting is an error, and so is a key neither
API knows. Every result has ``status`` (``success`` or ``error``); an error also has ``error`` and the book's
``message`` (the same text).

Numbers in results are numbers (0.57, not "57.00%"). When the ``hello-agents`` package is installed the class
subclasses its ``Tool`` base; its registry passes ``{"input": "<text>"}``, which is read as a JSON object of the
parameters above, and its agents' ``key=value`` calls (numbers and true/false as text) are read too.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import time
import traceback
import types
import typing
import uuid
from pathlib import Path
from typing import Any

from agentic_rl.errors import AgenticRLError, ConfigError, DataError

try:  # optional integration: hello-agents (pip install 'agentic-rl[hello-agents]')
    from hello_agents.tools.base import Tool as _ToolBase
    from hello_agents.tools.base import ToolParameter

    HELLO_AGENTS = True
except ImportError:  # a plain class without it
    _ToolBase = object  # type: ignore[assignment,misc]
    ToolParameter = None  # type: ignore[assignment,misc]
    HELLO_AGENTS = False

ACTIONS = ("train", "load_dataset", "create_reward", "evaluate", "status")
TRAIN_KEYS = ("algorithm", "name", "rewards", "reward")  # the tool's own train keys besides the config fields
#: The book's keys per action -> the setting of ours they map to (how, where it is not a rename, in the docstring).
BOOK_KEYS: dict[str, dict[str, str]] = {
    "train": {"model_name": "model", "num_epochs": "epochs (sft) / max_steps from the data size (grpo)",
              "use_lora": "full = not use_lora", "batch_size": "batch_size", "max_samples": "max_train_samples",
              "output_dir": "output_dir", "dataset": "dataset",
              "custom_dataset": "dataset (registered first)", "custom_reward": "rewards (registered first)",
              "use_wandb": "report_to", "use_tensorboard": "report_to",
              "wandb_project": "WANDB_PROJECT during the run", "lora_rank": "lora_r",
              "kl_coef": "beta (grpo)", "clip_range": "epsilon (grpo)",
              "max_new_tokens": "max_completion_length (grpo)",
              "reward_type": "rewards (grpo), as create_reward builds them",
              "reward_config": "reward_type 'combined': the weighted sum of its components",
              "eval_steps": "heldout_every (grpo); sft evaluates no validation slice in between, as in the book"},
    "load_dataset": {"format": "the example's row format (sft/rl)", "split": "split", "max_samples": "max_samples",
                     "model_name": "renders the rl example with this tokenizer's chat template"},
    "create_reward": {"reward_type": "rewards", "penalty_weight": "length(alpha=penalty_weight/max_length)",
                      "max_length": "length(target_length=max_length)", "step_bonus": "step(beta=step_bonus)"},
    "evaluate": {"model_path": "model", "max_samples": "eval_samples",
                 "use_lora": "read from the model directory (an adapter loads with its base model)",
                 "metrics": "the metrics the result must hold (it holds all of them)",
                 "k": "num_samples = k (sampled at temperature 0.7 unless given), accuracy_at_k = pass@k",
                 "return_details": "the result's details (every completion) and errors (the wrong ones)"},
}
#: Keys only the book uses: one of them in a call turns on the book's defaults for that action.
BOOK_ONLY = {"train": {"model_name", "num_epochs", "use_lora", "custom_dataset", "custom_reward", "use_wandb",
                       "use_tensorboard", "wandb_project", "lora_rank", "kl_coef", "clip_range", "max_new_tokens",
                       "reward_type", "reward_config", "eval_steps"},
             "load_dataset": {"format", "model_name"},
             "create_reward": {"reward_type", "penalty_weight", "max_length", "step_bonus"},
             "evaluate": {"model_path", "use_lora", "metrics", "k", "return_details"}}
BOOK_DEFAULTS = {"train": {"algorithm": "sft", "model_name": "Qwen/Qwen2-0.5B-Instruct", "dataset": "gsm8k",
                           "num_epochs": 3, "use_lora": True, "batch_size": 4, "use_wandb": False,
                           "use_tensorboard": True},
                 "load_dataset": {"format": "sft", "split": "train", "max_samples": 100, "source": "gsm8k"},
                 "create_reward": {"reward_type": "accuracy", "penalty_weight": 0.001, "max_length": 1024,
                                   "step_bonus": 0.1},
                 "evaluate": {"eval_samples": 100, "dataset": "gsm8k", "split": "test", "max_new_tokens": 128}}
#: Rewards handed over as Python callables (``custom_reward``, ``register_reward_function``): reachable as
#: ``agentic_rl.integrations.hello_agents:IN_PROCESS_REWARDS.<key>`` specs, so the stages load them like any user
#: reward.
IN_PROCESS_REWARDS = types.SimpleNamespace()
#: The tool's ``algorithm`` -> the stage that trains it. The key shadows ``GRPOConfig.algorithm``, so the GRPO stage's
#: own policy updates are offered here by name and passed on as that field.
TRAIN_ALGORITHMS = {"sft": "sft", "grpo": "grpo", "rloo": "grpo"}
DATASET_OPTIONS = ("source", "split", "question_field", "answer_field", "prompt_field", "completion_field",
                   "ground_truth_field", "max_samples", "seed", "numeric_ground_truth", "keep_annotations",
                   "hub_config", "synthetic_train_size", "synthetic_test_size", "kind", "min_steps", "max_steps",
                   "max_operand", "max_factor", "max_answer", "ops", "digits")
#: A GRPO run on a dataset the tool holds (registered, loaded, or a ``custom_dataset``) whose held-out settings the
#: call leaves to the preset holds out at most this fraction of the rows for its periodic checks ...
HELDOUT_FRACTION = 0.2
#: ... and none when that would be fewer problems than this (a held-out accuracy on fewer says little).
MIN_HELDOUT = 8
NUMERIC_DATASET_OPTIONS = {"max_samples", "seed", "synthetic_train_size", "synthetic_test_size", "min_steps",
                           "max_steps", "max_operand", "max_factor", "max_answer", "digits"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

DESCRIPTION = (
    "Train and evaluate LLMs with reinforcement learning (agentic-rl). Actions: "
    "train (algorithm sft|grpo|rloo, any hyper-parameter of that stage, e.g. learning_rate, lora_r, beta, "
    "num_generations, rewards, max_steps), load_dataset (source, split, column mapping), create_reward "
    "(reward specs like 'accuracy:1.0' or 'module:function:0.5'), evaluate (model, dataset, max_samples; returns "
    "all metrics), status (runs and their metrics). The parameter names of hello-agents' own rl_training tool "
    "(model_name, num_epochs, use_lora, format, reward_type, model_path, ...) work too. Input: a JSON object with "
    "'action' and its parameters.")


def _stage_class(algorithm: str):
    import importlib

    from agentic_rl.stages import get_stage

    stage = get_stage(algorithm)
    return importlib.import_module(stage.module), stage.config_class


def _jsonable(value: Any) -> Any:
    """Plain JSON values: numbers stay numbers (numpy/torch scalars converted, NaN/inf -> null)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return _jsonable(value.item())
        except (TypeError, ValueError):
            pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    return str(value)


_BOOK_SFT_PROMPT = re.compile(r"^Question: (.*?)\n\nLet's solve this step by step:\s*$", re.DOTALL)


def _task_rows(origin: str, dataset: Any) -> list[dict[str, Any]]:
    """Canonical task rows from an in-memory dataset (a ``datasets.Dataset`` or a list of dicts)."""
    from agentic_rl.data.custom import task_row

    raw = dataset.to_list() if hasattr(dataset, "to_list") else dataset
    if not isinstance(raw, (list, tuple)) or not raw or not all(isinstance(r, dict) for r in raw):
        raise ConfigError(f"{origin}: give a datasets.Dataset or a non-empty list of dicts, got "
                          f"{type(dataset).__name__}")
    rows = []
    for i, row in enumerate(raw):
        prompt = row.get("prompt")
        match = _BOOK_SFT_PROMPT.match(prompt) if isinstance(prompt, str) and "question" not in row else None
        if match:  # the book's SFT rows wrap the question in its own prompt text
            row = {**row, "question": match.group(1)}
        rows.append(task_row(row, f"{origin} row {i + 1}"))
    return rows


class _BookReward:
    """A reward written for the book's tool, which hands rewards plain completion strings (its prompts are strings);
    our prompts are conversational, so TRL passes message lists: this gives the function their text instead."""

    def __init__(self, func: Any, name: str):
        self.func = func
        self.__name__ = name

    def __call__(self, completions: Any, **kwargs: Any) -> list[float]:
        from agentic_rl.rewards import completion_text

        return self.func([completion_text(c) for c in completions], **kwargs)


def _pop_renamed(params: dict[str, Any], book_key: str, our_key: str) -> None:
    """Move the book's ``book_key`` to our ``our_key``; both spellings at once is an error."""
    if book_key in params:
        if our_key in params:
            raise ConfigError(f"give '{book_key}' (the book's name) or '{our_key}', not both")
        params[our_key] = params.pop(book_key)


def _flag(params: dict[str, Any], key: str, default: bool) -> bool:
    value = params.pop(key, default)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):  # an agent's key=value text
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise ConfigError(f"'{key}' must be true or false, got {value!r}")
    return value


def _number(value: Any) -> Any:
    """A number given as text (an agent's ``num_epochs=2``) as that number; anything else unchanged."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() else number
    return value


def _yaml_number(value: float) -> str:
    """A float as text that a reward spec's YAML reads back as the same float (``1e-06`` would be a string)."""
    text = repr(float(value))
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text


class RLTrainingTool(_ToolBase):  # type: ignore[misc,valid-type]
    """One tool, five actions (see the module docstring). State (runs, datasets, rewards) lives in the instance and
    in ``<workspace>/rl_training_state.json``, so a new instance on the same workspace sees earlier runs."""

    def __init__(self, workspace: str | Path = "runs/rl_training", *, name: str = "rl_training",
                 description: str = DESCRIPTION):
        if HELLO_AGENTS:
            super().__init__(name=name, description=description)
        else:
            self.name, self.description, self.expandable = name, description, False
        self.workspace = Path(workspace)
        self.runs: dict[str, dict[str, Any]] = {}
        self.datasets: dict[str, dict[str, Any]] = {}
        self.rewards: dict[str, dict[str, Any]] = {}
        state = self.workspace / "rl_training_state.json"
        if state.is_file():
            from agentic_rl.utils import read_json

            try:
                data = read_json(state)
            except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
                raise DataError(f"{state}: not valid JSON ({exc}); move it away to start this workspace afresh") \
                    from None
            self.runs, self.datasets, self.rewards = data.get("runs", {}), data.get("datasets", {}), \
                data.get("rewards", {})

    # -----------------------------------------------------------------------------------------------------------
    # Entry point
    # -----------------------------------------------------------------------------------------------------------

    def run(self, parameters: dict[str, Any] | str) -> str:
        """Run one action; always returns a JSON string (``{"error": ...}`` on failure)."""
        action = None
        try:
            params = self._parameters(parameters)
            action = params.pop("action", None)
            for key in ("algorithm", "format", "reward_type"):  # the book lower-cases these ("SFT" works)
                if isinstance(params.get(key), str):
                    params[key] = params[key].lower()
            action = action.lower() if isinstance(action, str) else action
            if action is None and params:
                action = "train"  # the book's default action
            if action is None:
                raise ConfigError(f"'action' is required: one of {', '.join(ACTIONS)}")
            if action not in ACTIONS:
                raise ConfigError(f"unknown action {action!r}; actions are {', '.join(ACTIONS)}")
            result = getattr(self, f"_{action}")(params)
            return json.dumps(_jsonable({"status": "success", "action": action, **result}))
        except AgenticRLError as exc:
            return json.dumps({"status": "error", "error": str(exc), "message": str(exc), "action": action})
        except Exception as exc:  # the agent gets a message, the console the traceback
            from agentic_rl.utils import warn

            warn(f"rl_training {action}: {traceback.format_exc()}")
            message = f"{type(exc).__name__}: {exc}"
            return json.dumps({"status": "error", "error": message, "message": message, "action": action})

    def register(self, registry: Any = None) -> RLTrainingTool:
        """Register this tool in a hello-agents ``ToolRegistry`` (its global registry by default) and return it:
        ``RLTrainingTool(workspace).register(registry)`` is ``registry.register_tool(tool)``."""
        if registry is None:
            if not HELLO_AGENTS:
                raise ConfigError("hello-agents is not installed (pip install 'agentic-rl[hello-agents]'); give the "
                                  "registry to register in")
            from hello_agents.tools.registry import global_registry as registry
        if not callable(getattr(registry, "register_tool", None)):
            raise ConfigError(f"cannot register rl_training in a {type(registry).__name__}: a registry needs "
                              "register_tool(tool), as hello-agents' ToolRegistry has")
        registry.register_tool(self)
        return self

    # -----------------------------------------------------------------------------------------------------------
    # The book's registration methods
    # -----------------------------------------------------------------------------------------------------------

    def register_dataset(self, name: str, dataset: Any) -> dict[str, Any]:
        """Make ``dataset`` the training data called ``name`` (``train`` with ``dataset=name``), as in the book.

        ``dataset`` is a ``datasets.Dataset`` or a list of dicts in any form the loaders read: ``question`` and
        ``answer`` (GSM8K), the book's SFT rows (``prompt`` "Question: ...", ``completion`` "... Final Answer: N") or
        its RL rows (``question``, ``ground_truth``). Rows are checked and saved as ``<workspace>/datasets/<name>/
        train.jsonl``; registering a name again replaces it. Raises :class:`ConfigError` / ``DataError``.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"dataset name {name!r} must be 1-64 letters, digits, '_', '-' or '.'")
        rows = _task_rows(name, dataset)
        self.datasets.pop(name, None)
        entry = self._store_dataset(name, "train", rows, source="registered", options={})
        from agentic_rl.utils import log

        log(f"rl_training: registered dataset '{name}' ({len(rows)} rows) in {entry['path']}")
        return {"dataset": name, "path": entry["path"], "num_rows": len(rows)}

    def register_reward_function(self, name: str, reward_fn: Any) -> dict[str, Any]:
        """Make ``reward_fn(completions, **kwargs) -> list[float]`` a reward called ``name``, as in the book.

        Usable as ``rewards=name`` or ``custom_reward=name`` in ``train`` (GRPO), and — the book's rule — used by a
        GRPO ``train`` on a dataset of the same name when no reward is given. The function receives completion
        strings and the dataset columns (``ground_truth``, ``question``, ...). It lives in this process only.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"reward name {name!r} must be 1-64 letters, digits, '_', '-' or '.'")
        if not callable(reward_fn):
            raise ConfigError(f"reward_fn for '{name}' must be callable, got {type(reward_fn).__name__}")
        spec = self._register_reward(name, reward_fn)
        self._save_state()
        return {"reward": name, "specs": [spec]}

    def _register_reward(self, name: str, reward_fn: Any) -> str:
        key = f"{re.sub(r'[^0-9A-Za-z_]', '_', name)}_{uuid.uuid4().hex[:8]}"
        setattr(IN_PROCESS_REWARDS, key, _BookReward(reward_fn, name))
        spec = f"{__name__}:IN_PROCESS_REWARDS.{key}"
        self.rewards[name] = {"name": name, "specs": [spec], "weights": [1.0], "functions": [name],
                              "registered": True}
        return spec

    @staticmethod
    def _parameters(parameters: Any) -> dict[str, Any]:
        """A dict of parameters; a JSON string (or hello-agents' ``{"input": "<json>"}``) is decoded."""
        if isinstance(parameters, dict) and set(parameters) == {"input"} and isinstance(parameters["input"], str):
            parameters = parameters["input"]
        if isinstance(parameters, str):
            try:
                parameters = json.loads(parameters)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"parameters must be a JSON object like {{\"action\": \"status\"}}; could not "
                                  f"parse the input ({exc.msg} at position {exc.pos})") from None
        if not isinstance(parameters, dict):
            raise ConfigError(f"parameters must be a JSON object, got {type(parameters).__name__}")
        return dict(parameters)

    def get_parameters(self) -> list:
        """The parameter schema (hello-agents ``ToolParameter`` objects, or dicts without it): the tool's own keys,
        then every field of the SFT, GRPO and evaluation configs with its help text."""
        specs: dict[str, tuple[str, str]] = {
            "action": ("string", f"one of {', '.join(ACTIONS)}"),
            "algorithm": ("string", "train: sft, grpo or rloo (the grpo stage with TRL's RLOOTrainer update)"),
            "name": ("string", "name of the run, dataset or reward to create (status: the run to show)"),
            "model": ("string", "train/evaluate: a model directory, hub id, or an earlier run's name"),
            "models": ("array", "evaluate: several models"),
            "dataset": ("string", "train/evaluate: a dataset source or a name from load_dataset"),
            "rewards": ("array", "create_reward/train: reward specs or a name from create_reward"),
            "source": ("string", "load_dataset: synthetic, gsm8k, a hub id, a local file/folder or module:function"),
            "split": ("string", "load_dataset/train/evaluate: dataset split"),
            "completions": ("array", "create_reward: sample completions to score"),
            "ground_truth": ("string", "create_reward: reference answer(s) for the sample completions"),
            # The book's names (hello-agents' rl_training tool), accepted as they are:
            "model_name": ("string", "train: the model (the book's name for 'model'); load_dataset: render the "
                                     "example prompt with this model's chat template"),
            "num_epochs": ("number", "train: passes over the data (book; default 3)"),
            "use_lora": ("boolean", "train: LoRA (true, the default) or full fine-tuning (false) (book)"),
            "use_wandb": ("boolean", "train: log to Weights & Biases (book)"),
            "use_tensorboard": ("boolean", "train: log to TensorBoard (book; default true)"),
            "wandb_project": ("string", "train: Weights & Biases project (book)"),
            "custom_reward": ("string", "train (grpo): a reward registered with register_reward_function (book)"),
            "format": ("string", "load_dataset: show the rows as sft or rl rows (book)"),
            "reward_type": ("string", "create_reward, train (grpo): accuracy, length_penalty or step; train also "
                                      "combined (book)"),
            "reward_config": ("object", "train (grpo): the reward_type's parameters; for combined, 'components': "
                                        "[{'type': ..., 'weight': ...}, ...] (book)"),
            "lora_rank": ("integer", "train: LoRA rank (the book's name for 'lora_r')"),
            "metrics": ("array", "evaluate: metrics the result must hold: accuracy, accuracy_at_k, average_length, "
                                 "average_steps, format_correctness, average_reward (book)"),
            "k": ("integer", "evaluate: answers sampled per problem for accuracy_at_k (book)"),
            "return_details": ("boolean", "evaluate: also return every completion (details) and the wrong ones "
                                          "(errors) (book)"),
            "kl_coef": ("number", "train (grpo): KL coefficient (the book's name for 'beta')"),
            "clip_range": ("number", "train (grpo): clipping range (the book's name for 'epsilon')"),
            "eval_steps": ("integer", "train (grpo): held-out checks every N steps (the book's name for "
                                      "'heldout_every')"),
            "penalty_weight": ("number", "create_reward (length_penalty): penalty weight (book; default 0.001)"),
            "max_length": ("integer", "create_reward (length_penalty): length in characters beyond which the "
                                      "penalty starts (book; default 1024); train (sft): token limit"),
            "step_bonus": ("number", "create_reward (step): bonus per reasoning step (book; default 0.1)"),
            "model_path": ("string", "evaluate: the model to evaluate (the book's name for 'model')"),
            "max_samples": ("integer", "load_dataset: rows to draw; train: at most this many training rows (book); "
                                       "evaluate: problems to evaluate on (book)"),
        }
        for algorithm in ("sft", "grpo", "evaluate"):
            try:
                cls = self._config_class(algorithm)
            except ImportError:  # a stage not installed: its keys are simply not listed
                continue
            hints = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                if f.name not in specs:
                    specs[f.name] = (_schema_type(hints[f.name]), f"{algorithm}: {f.metadata.get('help', '')}")
        if not HELLO_AGENTS:
            return [{"name": k, "type": t, "description": d, "required": k == "action"}
                    for k, (t, d) in specs.items()]
        return [ToolParameter(name=k, type=t, description=d, required=k == "action") for k, (t, d) in specs.items()]

    # -----------------------------------------------------------------------------------------------------------
    # Helpers
    # -----------------------------------------------------------------------------------------------------------

    @staticmethod
    def _config_class(algorithm: str):
        if algorithm == "evaluate":
            from agentic_rl.eval.evaluate import EvalConfig

            return EvalConfig
        return _stage_class(algorithm)[1]

    def _save_state(self) -> None:
        from agentic_rl.utils import write_json

        write_json(self.workspace / "rl_training_state.json",
                   {"runs": self.runs, "datasets": self.datasets, "rewards": self.rewards})

    def _new_name(self, given: Any, prefix: str, taken: dict[str, Any]) -> str:
        if given is not None:
            if not isinstance(given, str) or not _NAME.match(given):
                raise ConfigError(f"name {given!r} must be 1-64 letters, digits, '_', '-' or '.'")
            if given in taken:
                raise ConfigError(f"name {given!r} is already used; choose another (status lists them)")
            return given
        n = len(taken) + 1
        while f"{prefix}_{n}" in taken:
            n += 1
        return f"{prefix}_{n}"

    def _model_path(self, model: Any) -> Any:
        """An earlier run's name, or the ``output_dir`` it was given (the book names a trained model by it) -> its
        model directory; a relative path that exists inside the workspace -> that path; anything else unchanged."""
        if not isinstance(model, str):
            return model
        if model not in self.runs:
            path = Path(model).expanduser()
            if not path.is_absolute() and (self.workspace / path).exists():
                path = self.workspace / path
            if not path.exists():
                return model  # a hub id, or a path the stage reports as missing
            given = next((name for name, run in self.runs.items() if run.get("kind") == "train"
                          and run.get("output_dir") and Path(run["output_dir"]).resolve() == path.resolve()), None)
            if given is None:
                return str(path)
            model = given
        path = self.runs[model].get("model_dir")
        if not path:
            raise ConfigError(f"run {model!r} has no model (it is an evaluation or did not finish)")
        return path

    def _output_dir(self, params: dict[str, Any], default: Path) -> None:
        """``output_dir`` as the stage gets it: ``default`` when not given; a relative path (the book's
        ``"./output/sft"``) is a folder inside the workspace, never beside it; an absolute path is used as given."""
        value = params.get("output_dir")
        if value is None:
            params["output_dir"] = str(default)
            return
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"'output_dir' must be a folder name, got {value!r}")
        path = Path(value).expanduser()
        if not path.is_absolute():
            inside = (self.workspace / path).resolve()
            if not inside.is_relative_to(self.workspace.resolve()):
                raise ConfigError(f"output_dir {value!r} leaves the workspace {self.workspace}; give a folder inside "
                                  f"it or an absolute path")
            path = self.workspace / path
        params["output_dir"] = str(path)

    def _dataset_source(self, params: dict[str, Any]) -> str | None:
        """A dataset name from load_dataset -> its folder (custom column names were already mapped there). Returns
        the name (None: ``dataset`` is no dataset of the tool)."""
        name = params.get("dataset")
        if not (isinstance(name, str) and name in self.datasets):
            return None
        params["dataset"] = self.datasets[name]["path"]
        return name

    def _ensure_split(self, name: str | None, split: str) -> None:
        """Make the tool's dataset ``name`` hold ``split``: a split not loaded yet comes from the same source with
        the same options (``evaluate`` on the ``test`` split of a dataset loaded for training). Rows handed over in
        memory have no other split."""
        if name is None or split in self.datasets[name]["splits"]:
            return
        entry = self.datasets[name]
        if entry["source"] in ("registered", "custom_dataset"):
            held = next(iter(entry["splits"]))
            raise ConfigError(f"dataset {name!r} holds only the rows handed to it (split '{held}'): give split "
                              f"'{held}', or load a '{split}' split under this name with load_dataset")
        from agentic_rl.data.custom import load_task_dataset
        from agentic_rl.utils import log

        options = {k: v for k, v in entry.get("options", {}).items() if k not in ("max_samples", "seed")}
        rows = load_task_dataset(entry["source"], split, **options).to_list()
        self._store_dataset(name, split, rows, source=entry["source"], options=entry.get("options", {}))
        log(f"rl_training: loaded the {split} split of dataset '{name}' ({len(rows)} rows of {entry['source']})")

    def _fit_heldout(self, config: Any, rows: int, checks_asked: bool) -> dict[str, Any]:
        """GRPO's held-out slice for a training split of ``rows`` rows when the call left its size to the preset: at
        most :data:`HELDOUT_FRACTION` of the rows, and none (no periodic checks) when that is fewer than
        :data:`MIN_HELDOUT` problems, unless the call asked for the checks (``heldout_every``): then at least one.
        Returns the settings to change (empty: the preset's slice fits)."""
        carved = (config.eval_samples and config.heldout_every and config.heldout_split == config.split
                  and config.heldout_dataset in (None, config.dataset))
        if not carved:
            return {}
        fitted = min(config.eval_samples, int(rows * HELDOUT_FRACTION))
        if fitted == config.eval_samples:
            return {}
        from agentic_rl.utils import log

        if checks_asked:
            fitted = max(1, fitted)
        elif fitted < MIN_HELDOUT:
            log(f"rl_training: the dataset has {rows} rows, too few to hold some out: no periodic held-out checks "
                f"(give eval_samples and heldout_every to choose)")
            return {"eval_samples": 0, "heldout_every": 0}
        log(f"rl_training: the dataset has {rows} rows: {fitted} held out for the periodic checks (eval_samples), "
            f"{rows - fitted} to train on")
        return {"eval_samples": fitted}

    def _store_dataset(self, name: str, split: str, rows: list[dict[str, Any]], *, source: str,
                       options: dict[str, Any]) -> dict[str, Any]:
        """Save canonical rows as ``<workspace>/datasets/<name>/<split>.jsonl`` and record them under ``name``."""
        from agentic_rl.utils import write_jsonl

        folder = self.workspace / "datasets" / name
        # 'answer' is written in our format (steps, then "Final Answer: N"), so the file reads back into the very
        # same canonical rows whatever the original columns were (GSM8K's "#### N", a ground-truth-only column).
        write_jsonl(folder / f"{split}.jsonl", [{**row, "answer": row["solution"]} for row in rows])
        entry = self.datasets.setdefault(name, {"name": name, "source": source, "path": str(folder), "splits": {},
                                                "options": options})
        steps = [r.get("num_steps") for r in rows if isinstance(r.get("num_steps"), int)]
        entry["splits"][split] = {"num_rows": len(rows), "file": str(folder / f"{split}.jsonl"),
                                  "avg_steps": sum(steps) / len(steps) if steps else None}
        self._save_state()
        return entry

    def _reward_specs(self, value: Any) -> list[str]:
        """Reward names from create_reward and plain specs -> one list of specs."""
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
            raise ConfigError("'rewards' must be a reward spec, a reward name from create_reward, or a list of them")
        specs: list[str] = []
        for item in items:
            specs.extend(self.rewards[item]["specs"] if item in self.rewards else [item])
        return specs

    # -----------------------------------------------------------------------------------------------------------
    # Actions
    # -----------------------------------------------------------------------------------------------------------

    def _train(self, params: dict[str, Any]) -> dict[str, Any]:
        import os

        from agentic_rl.config import config_from_dict, config_to_dict
        from agentic_rl.utils import world_size

        registered = self.datasets.get(params.get("dataset")) if isinstance(params.get("dataset"), str) else None
        # the book's keys, or a dataset handed over with the book's register_dataset: the book's rules and defaults
        book = bool(params.keys() & BOOK_ONLY["train"]) or bool(registered and registered["source"] == "registered")
        if book:
            params.setdefault("algorithm", BOOK_DEFAULTS["train"]["algorithm"])
        algorithm = params.pop("algorithm", None)
        if algorithm not in TRAIN_ALGORITHMS:
            raise ConfigError(f"train needs 'algorithm': one of {', '.join(TRAIN_ALGORITHMS)}; got {algorithm!r}")
        stage = TRAIN_ALGORITHMS[algorithm]
        name = self._new_name(params.pop("name", None), algorithm, self.runs)
        module, cls = _stage_class(stage)
        known = [f.name for f in dataclasses.fields(cls)] + list(TRAIN_KEYS) + list(BOOK_KEYS["train"])
        for key in params:
            if key.replace("-", "_") not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(f"unknown train key '{key}' for {algorithm}{hint}; keys are the fields of its "
                                  f"config, {', '.join(TRAIN_KEYS)}, and the book's {', '.join(BOOK_KEYS['train'])}")
        custom_rows, book_info = self._book_train(stage, params) if book else (None, {})
        if "reward" in params and "rewards" not in params:  # the CLI flag's spelling
            params["rewards"] = params.pop("reward")
        if "rewards" in params:
            if not any(f.name == "rewards" for f in dataclasses.fields(cls)):
                raise ConfigError(f"algorithm '{algorithm}' takes no rewards (they belong to grpo)")
            params["rewards"] = self._reward_specs(params["rewards"])
        if "model" in params:
            params["model"] = self._model_path(params["model"])
        dataset_name = self._dataset_source(params)
        if stage == "grpo":  # the GRPO stage's own algorithm field: grpo or rloo
            params["algorithm"] = algorithm
        self._output_dir(params, self.workspace / "runs" / name)
        where = f"rl_training train ({algorithm})"
        config = config_from_dict(cls, params, from_string=True, where=where)
        if stage == "grpo" and "eval_samples" not in params:
            rows = len(custom_rows) if custom_rows is not None else (
                self.datasets[dataset_name]["splits"].get(config.split, {}).get("num_rows") if dataset_name else None)
            fitted = self._fit_heldout(config, rows, "heldout_every" in params) if rows is not None else {}
            if fitted:
                params.update(fitted)
                config = config_from_dict(cls, params, from_string=True, where=where)

        # Side effects only now that the settings are valid: the dataset's files, then the data-sized steps.
        self._ensure_split(dataset_name, config.split)
        if custom_rows is not None:
            self._store_dataset(book_info["custom_dataset"], "train", custom_rows, source="custom_dataset", options={})
        num_epochs = book_info.get("num_epochs")
        if stage == "grpo" and num_epochs is not None:
            # TRL's GRPO runs for max_steps; the book's epochs over P prompts take P x G completions each, and an
            # optimizer step consumes batch_size x gradient_accumulation_steps of them (per device).
            prompts = len(module.load_data(config)[0])
            per_step = config.batch_size * config.gradient_accumulation_steps * world_size()
            steps = max(1, math.ceil(num_epochs * prompts * config.num_generations * config.num_iterations / per_step))
            config = config_from_dict(cls, {**params, "max_steps": steps}, from_string=True, where=where)
            book_info["dataset_size"] = prompts

        started = time.time()
        record: dict[str, Any] = {"name": name, "kind": "train", "algorithm": algorithm, "status": "running",
                                  "output_dir": config.output_dir, "config": config_to_dict(config)}
        self.runs[name] = record
        project = book_info.get("wandb_project")
        previous_project = os.environ.get("WANDB_PROJECT")
        try:
            if project:  # the book's wandb_project, for this run only
                os.environ["WANDB_PROJECT"] = project
            result = module.run(config)
        except BaseException:
            record["status"] = "failed"
            self._save_state()
            raise
        finally:
            if project:
                if previous_project is None:
                    os.environ.pop("WANDB_PROJECT", None)
                else:
                    os.environ["WANDB_PROJECT"] = previous_project
        result = _jsonable(result if isinstance(result, dict) else {"model_dir": result})
        record.update(status="finished", model_dir=result.get("model_dir"), wall_time_s=round(time.time() - started, 1),
                      metrics=_training_metrics(result, Path(config.output_dir)), result=result)
        self._save_state()
        out = {"run": name, "algorithm": algorithm, "model_dir": record["model_dir"],
               "output_dir": config.output_dir, "metrics": record["metrics"], "wall_time_s": record["wall_time_s"],
               "config": record["config"], "result": result}
        if book:  # the keys of the book's result
            rows = book_info.get("dataset_size", (result.get("metrics") or {}).get("train_rows"))
            epochs = num_epochs if num_epochs is not None else getattr(config, "epochs", None)
            named = {k: v for k, v in book_info.items() if k in ("custom_dataset", "custom_reward", "wandb_project")}
            last = record["metrics"].get("last_logged", {})
            loss = next((last[k] for k in ("train/loss", "loss", "train_loss") if k in last),
                        record["metrics"].get("final_loss"))
            out.update(model=config.model, num_epochs=epochs, dataset_size=rows, num_samples=rows,
                       model_path=record["model_dir"], final_loss=loss, **named)
            if stage == "grpo":
                out["average_reward"] = last.get("grpo/reward")
        return out

    def _book_train(self, algorithm: str, params: dict[str, Any]) -> tuple[list | None, dict[str, Any]]:
        """The book's train keys -> ours, in place (the mapping is :data:`BOOK_KEYS`); the book's defaults for the
        keys left out. Returns the rows of an in-memory ``custom_dataset`` (stored once the config is valid) and
        what is applied later (``num_epochs`` for GRPO, ``wandb_project``, generated names)."""
        defaults = BOOK_DEFAULTS["train"]
        info: dict[str, Any] = {}
        _pop_renamed(params, "model_name", "model")
        params.setdefault("model", defaults["model_name"])
        _pop_renamed(params, "lora_rank", "lora_r")
        grpo_only = {"kl_coef": "beta", "clip_range": "epsilon", "max_new_tokens": "max_completion_length"}
        for book_key, our_key in grpo_only.items():
            if book_key in params:
                if algorithm == "sft":
                    raise ConfigError(f"'{book_key}' belongs to algorithm grpo ({our_key})")
                _pop_renamed(params, book_key, our_key)
        eval_steps = params.pop("eval_steps", None)
        if eval_steps is not None and algorithm != "sft":  # SFT: no validation slice in between, as in the book
            params.setdefault("heldout_every", eval_steps)
        reward_type, reward_config = params.pop("reward_type", None), params.pop("reward_config", None)
        if reward_type is not None or reward_config is not None:
            if algorithm == "sft":
                raise ConfigError("'reward_type' belongs to algorithm grpo: sft learns from demonstrations, without a "
                                  "reward")
            if params.keys() & {"rewards", "reward", "custom_reward"}:
                raise ConfigError("give 'reward_type' (the book's way) or 'rewards' / 'custom_reward', not both")
            params["rewards"] = _book_train_rewards(reward_type, reward_config)

        rows = None
        custom = params.pop("custom_dataset", None)
        if custom is not None:
            if "dataset" in params:
                raise ConfigError("give 'dataset' or 'custom_dataset', not both")
            if isinstance(custom, str):
                params["dataset"] = custom
            else:
                rows = _task_rows("custom_dataset", custom)
                info["custom_dataset"] = self._new_name(None, "custom_dataset", self.datasets)
                params["dataset"] = str(self.workspace / "datasets" / info["custom_dataset"])
        params.setdefault("dataset", defaults["dataset"])

        custom_reward = params.pop("custom_reward", None)
        if algorithm == "sft":
            if custom_reward is not None:
                raise ConfigError("'custom_reward' belongs to algorithm grpo: sft learns from demonstrations, "
                                  "without a reward")
        elif custom_reward is not None:
            if "rewards" in params or "reward" in params:
                raise ConfigError("give 'custom_reward' or 'rewards', not both")
            if callable(custom_reward):
                info["custom_reward"] = self._new_name(None, "custom_reward", self.rewards)
                self._register_reward(info["custom_reward"], custom_reward)
                params["rewards"] = info["custom_reward"]
            else:
                params["rewards"] = custom_reward
        elif "rewards" not in params and "reward" not in params:
            dataset = params["dataset"]  # the book's rule: a reward registered under the dataset's name is used
            same_name = isinstance(dataset, str) and self.rewards.get(dataset, {}).get("registered")
            params["rewards"] = dataset if same_name else ["accuracy:1.0"]

        num_epochs = _number(params.pop("num_epochs", None))
        if num_epochs is None and "epochs" not in params and "max_steps" not in params:
            num_epochs = defaults["num_epochs"]
        if num_epochs is not None:
            if (isinstance(num_epochs, bool) or not isinstance(num_epochs, (int, float)) or num_epochs <= 0
                    or not math.isfinite(num_epochs)):
                raise ConfigError(f"'num_epochs' must be a positive number, got {num_epochs!r}")
            clash = [k for k in ("epochs", "max_steps") if k in params]
            if clash:
                raise ConfigError(f"give 'num_epochs' or '{clash[0]}', not both")
            if algorithm == "sft":
                params["epochs"] = float(num_epochs)
            info["num_epochs"] = num_epochs

        if "use_lora" in params:
            if "full" in params:
                raise ConfigError("give 'use_lora' (the book's name) or 'full', not both")
            params["full"] = not _flag(params, "use_lora", defaults["use_lora"])
        params.setdefault("batch_size", defaults["batch_size"])
        _pop_renamed(params, "max_samples", "max_train_samples")

        if "report_to" in params:
            if params.keys() & {"use_wandb", "use_tensorboard"}:
                raise ConfigError("give 'use_wandb'/'use_tensorboard' (the book's names) or 'report_to', not both")
        else:
            backends = [b for b, on in (("tensorboard", _flag(params, "use_tensorboard", defaults["use_tensorboard"])),
                                        ("wandb", _flag(params, "use_wandb", defaults["use_wandb"]))) if on]
            backends = backends or ["none"]
            params["report_to"] = backends
        project = params.pop("wandb_project", None)
        if project is not None:
            if not isinstance(project, str) or not project.strip():
                raise ConfigError(f"'wandb_project' must be a project name, got {project!r}")
            info["wandb_project"] = project
        return rows, info

    def _load_dataset(self, params: dict[str, Any]) -> dict[str, Any]:
        from agentic_rl.data.custom import load_task_dataset

        name_given = params.pop("name", None)
        book = bool(params.keys() & BOOK_ONLY["load_dataset"])
        unknown = [k for k in params if k not in DATASET_OPTIONS and k not in BOOK_KEYS["load_dataset"]
                   and k != "dataset"]
        if unknown:
            raise ConfigError(f"unknown load_dataset key '{unknown[0]}'; keys are name, dataset, "
                              f"{', '.join(DATASET_OPTIONS)} and the book's {', '.join(BOOK_KEYS['load_dataset'])}")
        if "dataset" in params:  # train's and evaluate's name for the same thing
            if "source" in params:
                raise ConfigError("give 'dataset' or 'source' (two names of one setting), not both")
            params["source"] = params.pop("dataset")
        source_given = params.get("source")
        held = self.datasets.get(source_given) if isinstance(source_given, str) else None
        if held is not None:  # a dataset of the tool: another split of its source, with its options, under its name
            if held["source"] in ("registered", "custom_dataset"):
                raise ConfigError(f"dataset {held['name']!r} holds only the rows handed to it; load_dataset reads a "
                                  f"source (synthetic, gsm8k, a hub id, a file or folder)")
            if name_given not in (None, held["name"]):
                raise ConfigError(f"dataset {held['name']!r} is loaded under its own name; leave out name "
                                  f"{name_given!r} or give its source")
            name_given = held["name"]
            options = {k: v for k, v in held.get("options", {}).items() if k not in ("max_samples", "seed")}
            params = {**options, **params, "source": held["source"]}
        if book:
            for key, value in BOOK_DEFAULTS["load_dataset"].items():
                params.setdefault(key, value)
        for key in NUMERIC_DATASET_OPTIONS & params.keys():  # an agent's key=value text
            params[key] = _number(params[key])
        row_format = params.pop("format", None)
        tokenizer_name = params.pop("model_name", None)
        if row_format not in (None, "sft", "rl"):
            raise ConfigError(f"'format' must be sft or rl, got {row_format!r}")
        source = params.pop("source", "synthetic")
        split = params.pop("split", "train")
        if not isinstance(source, str) or not isinstance(split, str) or not _NAME.match(split):
            raise ConfigError("'source' and 'split' must be strings (split: letters, digits, _ - .)")
        # A second split of an already loaded dataset goes into the same folder (train + test, say).
        existing = self.datasets.get(name_given) if isinstance(name_given, str) else None
        if existing and split not in existing["splits"] and existing["source"] == source:
            name = name_given
        else:
            name = self._new_name(name_given, "dataset", self.datasets)
        dataset = load_task_dataset(source, split, **params)
        rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
        formatted = None
        if row_format is not None and rows:  # the rows as the stage sees them: SFT or RL (GRPO, evaluation) rows
            from agentic_rl.data import to_rl_dataset, to_sft_dataset

            formatted = (to_sft_dataset if row_format == "sft" else to_rl_dataset)(rows[:1]).to_list()[0]
        prompt_text = None
        if tokenizer_name is not None and formatted is not None:  # the prompt as this model's chat template renders it
            from agentic_rl.data.formats import render_prompt
            from agentic_rl.models.loading import load_tokenizer

            prompt_text = render_prompt(load_tokenizer(str(tokenizer_name)), formatted["prompt"])

        entry = self._store_dataset(name, split, rows, source=source, options=params)
        example = {k: rows[0].get(k) for k in ("question", "solution", "ground_truth")} if rows else {}
        out = {"dataset": name, "path": entry["path"], "split": split, "num_rows": len(rows),
               "columns": sorted(rows[0]) if rows else [], "avg_steps": entry["splits"][split]["avg_steps"],
               "example": example}
        if row_format is not None:  # the keys of the book's result
            out.update(format=row_format, dataset_size=len(rows), sample_keys=list(formatted or {}),
                       formatted_example=formatted)
            if prompt_text is not None:
                out["prompt_text"] = prompt_text
        return out

    def _create_reward(self, params: dict[str, Any]) -> dict[str, Any]:
        from agentic_rl.rewards import build_rewards

        name_given = params.pop("name", None)
        specs_value = params.pop("rewards", params.pop("reward", params.pop("spec", None)))
        completions = params.pop("completions", None)
        truth = params.pop("ground_truth", None)
        book = {k: params.pop(k) for k in BOOK_KEYS["create_reward"] if k in params}
        if params:
            raise ConfigError(f"unknown create_reward key '{next(iter(params))}'; keys are rewards, name, "
                              f"completions, ground_truth, and the book's {', '.join(BOOK_KEYS['create_reward'])}")
        described: dict[str, Any] = {}
        if book:
            if specs_value is not None:
                raise ConfigError("give 'reward_type' (the book's way) or 'rewards', not both")
            specs_value, described = _book_reward_spec(book)
        if specs_value is None:
            raise ConfigError("create_reward needs 'rewards': a spec like 'accuracy:1.0' or a list of specs")
        specs = self._reward_specs(specs_value)
        funcs, weights = build_rewards(specs)
        names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
        name = self._new_name(name_given, "reward", self.rewards)
        self.rewards[name] = {"name": name, "specs": specs, "weights": weights, "functions": names}
        self._save_state()
        out: dict[str, Any] = {"reward": name, "specs": specs, "functions": names, "weights": weights, **described}
        if completions is not None:
            out["scores"] = _score(funcs, weights, names, completions, truth)
        return out

    def _evaluate(self, params: dict[str, Any]) -> dict[str, Any]:
        from agentic_rl.config import config_from_dict
        from agentic_rl.eval.evaluate import EvalConfig
        from agentic_rl.eval.evaluate import run as run_eval

        name = self._new_name(params.pop("name", None), "eval", self.runs)
        book = bool(params.keys() & BOOK_ONLY["evaluate"])
        _pop_renamed(params, "max_samples", "eval_samples")
        details, k, split_given = False, None, "split" in params
        if book:
            _flag(params, "use_lora", True)  # whether the model is an adapter is read from its directory
            details = _flag(params, "return_details", False)
            k = _book_eval_k(params)
            _pop_renamed(params, "model_path", "model")
            for key, value in BOOK_DEFAULTS["evaluate"].items():
                params.setdefault(key, value)
        if "model" in params and "models" in params:
            raise ConfigError("give 'model' or 'models', not both")
        models = params.pop("models", None)
        if "model" in params:
            models = [params.pop("model")]
        if isinstance(models, str):
            models = [models]
        if not models:
            raise ConfigError("evaluate needs 'model': a model directory, hub id or an earlier run's name")
        if not isinstance(models, list):
            raise ConfigError("'models' must be a list of model directories or run names")
        params["models"] = [self._model_path(m) for m in models]
        if "reward" in params and "rewards" not in params:
            params["rewards"] = params.pop("reward")
        if "rewards" in params:
            params["rewards"] = self._reward_specs(params["rewards"])
        dataset_name = self._dataset_source(params)
        handed = self.datasets[dataset_name] if dataset_name else None
        if handed and handed["source"] in ("registered", "custom_dataset") and not split_given:
            params["split"] = next(iter(handed["splits"]))  # rows handed over have one split: those rows
            from agentic_rl.utils import log

            log(f"rl_training: evaluating on the rows handed over as dataset '{dataset_name}' (its "
                f"{params['split']} split)")
        self._output_dir(params, self.workspace / "evals" / name)
        config = config_from_dict(EvalConfig, params, from_string=True, where="rl_training evaluate")
        self._ensure_split(dataset_name, config.split)

        started = time.time()
        result = run_eval(config)
        metrics = {model: {k: v for k, v in m.items() if k not in ("predictions", "config")}
                   for model, m in result["results"].items()}
        record = {"name": name, "kind": "evaluate", "status": "finished", "models": config.models,
                  "dataset": config.dataset, "split": config.split, "output_dir": result["output_dir"],
                  "wall_time_s": round(time.time() - started, 1), "metrics": _jsonable(metrics)}
        self.runs[name] = record
        self._save_state()
        single = next(iter(metrics.values())) if len(metrics) == 1 else None
        out = {"run": name, "output_dir": result["output_dir"], "dataset": config.dataset, "split": config.split,
               "metrics": single if single is not None else metrics}
        if book:  # the keys of the book's result (numbers, not "57.00%" strings)
            from agentic_rl.models.loading import resolve_device

            out.update(model_path=config.models[0], num_samples=single["num_prompts"],
                       accuracy=single["accuracy_strict"], average_reward=single["avg_reward"],
                       average_length=single["avg_tokens"], average_steps=single["avg_steps"],
                       format_correctness=single["format_rate"], device=resolve_device(None))
            if k is not None:
                out["accuracy_at_k"] = single.get(f"pass@{k}")
            predictions = Path(result["output_dir"]) / "predictions.jsonl"
            if details and predictions.is_file():  # per completion: the book's detail rows; the wrong ones its errors
                from agentic_rl.utils import read_jsonl

                rows = [{"question": r["question"], "prediction": r["completion"], "ground_truth": r["ground_truth"],
                         "correct": bool(r["correct_strict"]), "ground_truth_steps": r["reference_steps"],
                         "category": r["category"]} for r in read_jsonl(predictions)]
                out.update(details=_jsonable(rows), errors=_jsonable([r for r in rows if not r["correct"]]))
        return out

    def _status(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params.pop("name", None)
        if params:
            raise ConfigError(f"unknown status key '{next(iter(params))}'; status takes only 'name'")
        if name is not None:
            if name not in self.runs:
                raise ConfigError(f"no run named {name!r}; runs are {', '.join(self.runs) or '(none yet)'}")
            return {"run": self.runs[name]}
        runs = [{k: v for k, v in r.items() if k not in ("config", "result")} for r in self.runs.values()]
        return {"workspace": str(self.workspace), "runs": runs, "datasets": list(self.datasets.values()),
                "rewards": list(self.rewards.values())}


# ---------------------------------------------------------------------------------------------------------------
# Module helpers
# ---------------------------------------------------------------------------------------------------------------

def _schema_type(tp: Any) -> str:
    """JSON-schema type of a config field's annotation (``int | None`` -> integer)."""
    import types
    import typing

    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        tp = args[0]
    origin = typing.get_origin(tp) or tp
    return {list: "array", dict: "object", bool: "boolean", int: "integer", float: "number"}.get(origin, "string")


def _training_metrics(result: dict[str, Any], out: Path) -> dict[str, Any]:
    """Numbers a training run ends with: the trainer's summary, the last logged row, the held-out results."""
    metrics: dict[str, Any] = {}
    for key in ("metrics", "train_metrics"):  # SFT returns "metrics", GRPO the trainer's "train_metrics"
        if isinstance(result.get(key), dict):
            metrics.update({k: v for k, v in result[key].items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)})
    from agentic_rl.utils import read_jsonl

    log_file = out / "metrics.jsonl"
    if log_file.is_file():
        rows = read_jsonl(log_file)
        last: dict[str, Any] = {}
        for row in rows:  # the latest value of every logged metric
            last.update({k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
        metrics["last_logged"] = last
    for key in ("best_heldout_accuracy", "best_step", "steps", "heldout_accuracy", "final_loss"):
        if result.get(key) is not None:
            metrics[key] = result[key]
    heldout = result.get("heldout")
    if isinstance(heldout, list) and heldout:
        metrics["heldout_last"] = heldout[-1]
    return _jsonable(metrics)


def _book_reward_spec(book: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The book's ``reward_type`` and its parameters -> our reward spec, and the keys of the book's result.

    ``accuracy``: our strict accuracy. ``length_penalty``: the book's r = max(0, r_acc - w (L - L_max) / L_max) for
    L > L_max characters is exactly our ``length`` reward with alpha = w / L_max, target_length = L_max, characters.
    ``step``: our ``step`` reward with beta = step_bonus and the book's cap of 0.5 on the bonus (max_steps =
    0.5 / step_bonus); it counts reasoning lines with an equation (not every newline) and rewards correct answers
    only, so steps cannot be farmed.
    """
    defaults = BOOK_DEFAULTS["create_reward"]
    reward_type = book.get("reward_type", defaults["reward_type"])
    uses = {"accuracy": set(), "length_penalty": {"penalty_weight", "max_length"}, "step": {"step_bonus"}}
    if reward_type not in uses:
        raise ConfigError(f"reward_type must be one of {', '.join(uses)}; got {reward_type!r}")
    extra = sorted(set(book) - {"reward_type"} - uses[reward_type])
    if extra:
        raise ConfigError(f"'{extra[0]}' does not apply to reward_type {reward_type!r}")
    values = {k: _number(book.get(k, defaults[k])) for k in uses[reward_type]}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
            raise ConfigError(f"'{key}' must be a number >= 0, got {value!r}")
    if reward_type == "accuracy":
        return ["accuracy:1.0"], {"reward_type": reward_type, "description": "accuracy: 1.0 when the final answer "
                                                                             "equals the ground truth, else 0.0"}
    if reward_type == "length_penalty":
        weight, limit = float(values["penalty_weight"]), values["max_length"]
        if not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"'max_length' must be a positive integer (characters), got {limit!r}")
        spec = f"length(alpha={_yaml_number(weight / limit)},target_length={limit})"
        return [spec], {"reward_type": reward_type, "penalty_weight": weight, "max_length": limit,
                        "description": f"accuracy - {weight:g} * (length - {limit}) / {limit} for completions longer "
                                       f"than {limit} characters, never below 0"}
    bonus = float(values["step_bonus"])
    cap = max(1, math.floor(0.5 / bonus + 1e-9)) if bonus > 0 else 1
    spec = f"step(beta={_yaml_number(bonus)},max_steps={cap})"
    return [spec], {"reward_type": reward_type, "step_bonus": bonus,
                    "description": f"accuracy + {bonus:g} * reasoning steps (at most {cap} steps) for correct answers"}


#: The metrics a book evaluate call may ask for (the result holds them all).
BOOK_EVAL_METRICS = ("accuracy", "accuracy_at_k", "average_length", "average_steps", "format_correctness",
                     "average_reward")


def _book_eval_k(params: dict[str, Any]) -> int | None:
    """The book's evaluate ``metrics`` (checked) and ``k`` (-> ``num_samples`` and ``pass_at_k``), in place."""
    wanted = params.pop("metrics", None)
    if wanted is not None:
        if isinstance(wanted, str):
            wanted = [wanted]
        bad = [m for m in wanted if m not in BOOK_EVAL_METRICS] if isinstance(wanted, list) else [wanted]
        if bad:
            raise ConfigError(f"unknown metric {bad[0]!r}; metrics are {', '.join(BOOK_EVAL_METRICS)}")
    k = _number(params.pop("k", None))
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"'k' must be a positive integer, got {k!r}")
    if "num_samples" in params:
        raise ConfigError("give 'k' (the book's name) or 'num_samples', not both")
    params["num_samples"] = k
    params.setdefault("pass_at_k", sorted({1, k}))
    if k > 1:
        params.setdefault("temperature", 0.7)  # k greedy answers would be one answer k times
    return k


def _book_train_rewards(reward_type: Any, reward_config: Any) -> list[str]:
    """A train call's ``reward_type`` (with ``reward_config``: that type's parameters) -> reward specs, built as
    ``create_reward`` builds them. ``combined`` is the weighted sum of ``reward_config["components"]``, each a
    ``{"type": ..., "weight": ...}`` with that type's parameters (``target_length`` is ``max_length``)."""
    if reward_config is not None and not isinstance(reward_config, dict):
        raise ConfigError(f"'reward_config' must be a mapping, got {type(reward_config).__name__}")
    config = dict(reward_config or {})
    kind = (reward_type or ("combined" if "components" in config else "accuracy"))
    kind = kind.lower() if isinstance(kind, str) else kind

    def spec(component: dict[str, Any], where: str) -> str:
        params = {("max_length" if k == "target_length" else k): v for k, v in component.items()}
        try:
            specs, _ = _book_reward_spec(params)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        return specs[0]

    if kind != "combined":
        return [spec({"reward_type": kind, **config}, "reward_config")]
    components = config.pop("components", None)
    if config:
        raise ConfigError(f"reward_config for reward_type 'combined' takes 'components', not '{next(iter(config))}'")
    if not isinstance(components, list) or not components or not all(isinstance(c, dict) for c in components):
        raise ConfigError("reward_type 'combined' needs reward_config {'components': [{'type': 'accuracy', "
                          "'weight': 1.0}, ...]}")
    specs = []
    for i, component in enumerate(components):
        component = dict(component)
        weight = _number(component.pop("weight", 1.0))
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(f"reward_config component {i + 1}: 'weight' must be a number, got {weight!r}")
        base = spec({"reward_type": component.pop("type", None), **component}, f"reward_config component {i + 1}")
        specs.append(f"{base.removesuffix(':1.0')}:{_yaml_number(weight)}")
    return specs


def _score(funcs, weights, names, completions: Any, truth: Any) -> list[dict[str, Any]]:
    if isinstance(completions, str):
        completions = [completions]
    if not isinstance(completions, list) or not all(isinstance(c, str) for c in completions):
        raise ConfigError("'completions' must be a string or a list of strings")
    truths = truth if isinstance(truth, list) else [truth] * len(completions)
    if len(truths) != len(completions):
        raise ConfigError(f"'ground_truth' has {len(truths)} values for {len(completions)} completions")
    columns = {"ground_truth": [None if t is None else str(t) for t in truths]}
    messages = [[{"role": "assistant", "content": c}] for c in completions]
    scores = [{"completion": c, "total": 0.0, "components": {}} for c in completions]
    for fn, weight, name in zip(funcs, weights, names):
        values = fn(completions=messages, **columns)
        for score, value in zip(scores, values):
            value = 0.0 if value is None else float(value)
            score["components"][name] = value
            score["total"] += weight * value
    return scores


def register(registry: Any = None, **kwargs: Any) -> RLTrainingTool:
    """Create the tool (``kwargs``: its ``workspace``, ``name``, ...) and register it in a hello-agents
    ``ToolRegistry`` (its global registry by default)."""
    return RLTrainingTool(**kwargs).register(registry)


# ---------------------------------------------------------------------------------------------------------------
# The book's helper functions: one call each, on a tool for ``workspace``
# ---------------------------------------------------------------------------------------------------------------

def train_with_sft(model_name: str = "Qwen/Qwen2-0.5B-Instruct", max_samples: int | None = 100, num_epochs: int = 3,
                   output_dir: str = "./output/sft", *, workspace: str | Path = "runs/rl_training",
                   **settings: Any) -> str:
    """SFT as the book's ``train_with_sft`` runs it (``settings``: any further ``train`` key, e.g. ``dataset``)."""
    return RLTrainingTool(workspace).run({"action": "train", "algorithm": "sft", "model_name": model_name,
                                          "max_samples": max_samples, "num_epochs": num_epochs,
                                          "output_dir": output_dir, **settings})


def train_with_grpo(model_name: str = "Qwen/Qwen2-0.5B-Instruct", max_samples: int | None = 100, num_epochs: int = 3,
                    output_dir: str = "./output/grpo", *, workspace: str | Path = "runs/rl_training",
                    **settings: Any) -> str:
    """GRPO as the book's ``train_with_grpo`` runs it (``settings``: any further ``train`` key)."""
    return RLTrainingTool(workspace).run({"action": "train", "algorithm": "grpo", "model_name": model_name,
                                          "max_samples": max_samples, "num_epochs": num_epochs,
                                          "output_dir": output_dir, **settings})


def load_dataset(format_type: str = "sft", split: str = "train", max_samples: int = 100, *,
                 workspace: str | Path = "runs/rl_training", **options: Any) -> str:
    """The book's ``load_dataset`` (``options``: any further ``load_dataset`` key, e.g. ``dataset``)."""
    return RLTrainingTool(workspace).run({"action": "load_dataset", "format": format_type, "split": split,
                                          "max_samples": max_samples, **options})


def create_reward_function(reward_type: str = "accuracy", *, workspace: str | Path = "runs/rl_training",
                           **kwargs: Any) -> str:
    """The book's ``create_reward_function`` (``kwargs``: ``penalty_weight``, ``max_length``, ``step_bonus``)."""
    return RLTrainingTool(workspace).run({"action": "create_reward", "reward_type": reward_type, **kwargs})


def evaluate_model(model_path: str, max_samples: int = 100, *, workspace: str | Path = "runs/rl_training",
                   **settings: Any) -> str:
    """The book's ``evaluate_model`` (``settings``: any further ``evaluate`` key, e.g. ``dataset``)."""
    return RLTrainingTool(workspace).run({"action": "evaluate", "model_path": model_path,
                                          "max_samples": max_samples, **settings})
