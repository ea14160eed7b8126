"""``rl_training``: the training stages as one tool an agent framework can call.

    tool = RLTrainingTool(workspace="runs/agent")
    tool.run({"action": "load_dataset", "source": "synthetic", "split": "train", "name": "arith"})
    tool.run({"action": "create_reward", "rewards": ["accuracy:1.0", "format:0.2", "length(alpha=0.002):0.5"],
              "name": "mix"})
    tool.run({"action": "train", "algorithm": "sft", "model": "runs/base", "dataset": "arith", "learning_rate": 2e-4,
              "lora_r": 16, "max_steps": 200})
    tool.run({"action": "train", "algorithm": "grpo", "model": "sft_1", "dataset": "arith", "rewards": "mix",
              "beta": 0.04, "num_generations": 8})
    tool.run({"action": "evaluate", "model": "grpo_2", "dataset": "arith", "max_samples": 200})
    tool.run({"action": "status"})

Every call returns a JSON string: the action's result, or ``{"error": "..."}`` (unknown action, unknown or mistyped
key, missing file, ...) — the tool never raises into the agent loop.

Actions and their parameters (besides ``action``):

* ``train`` — ``algorithm`` (``sft`` or ``grpo``), optional ``name``, and *any field* of the stage's config
  (:class:`agentic_rl.train.sft.SFTConfig` / :class:`agentic_rl.train.grpo.GRPOConfig`: learning rate, LoRA settings,
  β, group size, rewards, lengths, epochs, batch size, ...). The values are mapped onto the dataclass with
  :func:`agentic_rl.config.config_from_dict`, so an unknown key is an error naming it (with a suggestion), and the
  stage's own ``run(config)`` trains. ``model`` and ``dataset`` may name an earlier run / loaded dataset; ``rewards``
  may name a reward created with ``create_reward`` (or list specs and names). The run directory defaults to
  ``<workspace>/runs/<name>``; its ``config.yaml`` holds every resolved setting.
* ``load_dataset`` — ``source`` and ``split`` plus any keyword of :func:`agentic_rl.data.custom.load_task_dataset`
  (column mapping, ``max_samples``, ``seed``, synthetic knobs) and optional ``name``. The canonical rows are saved
  as ``<workspace>/datasets/<name>/<split>.jsonl`` so later ``train`` / ``evaluate`` calls read exactly them.
* ``create_reward`` — ``rewards`` (a spec or a list: ``"accuracy:1.0"``, ``"length(alpha=0.01):0.5"``,
  ``"my_pkg.rewards:brevity:0.3"``), optional ``name``; built once with :func:`agentic_rl.rewards.build_rewards` to
  check it. Optional ``completions`` (+ ``ground_truth``) scores sample texts with each component.
* ``evaluate`` — ``model`` (or ``models``) plus any field of :class:`agentic_rl.eval.evaluate.EvalConfig`; returns
  every metric (accuracy strict/lenient, pass@k, numeric error, format rate, average reward / tokens / steps,
  truncation, per difficulty bucket, error categories).
* ``status`` — runs so far (algorithm, model directory, resolved key settings, metrics), datasets and rewards;
  ``name`` shows one run.

Numbers in results are numbers (0.57, not "57.00%"). When the ``hello-agents`` package is installed the class
subclasses its ``Tool`` base, so ``ToolRegistry().register_tool(RLTrainingTool())`` works; its registry passes
``{"input": "<text>"}``, which is read as a JSON object of the parameters above.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
import traceback
import typing
from pathlib import Path
from typing import Any

from agentic_rl.errors import AgenticRLError, ConfigError

try:  # optional integration: hello-agents (pip install 'agentic-rl[hello-agents]')
    from hello_agents.tools.base import Tool as _ToolBase
    from hello_agents.tools.base import ToolParameter

    HELLO_AGENTS = True
except ImportError:  # a plain class without it
    _ToolBase = object  # type: ignore[assignment,misc]
    ToolParameter = None  # type: ignore[assignment,misc]
    HELLO_AGENTS = False

ACTIONS = ("train", "load_dataset", "create_reward", "evaluate", "status")
ALGORITHMS = {"sft": ("agentic_rl.train.sft", "SFTConfig"), "grpo": ("agentic_rl.train.grpo", "GRPOConfig")}
DATASET_OPTIONS = ("source", "split", "question_field", "answer_field", "prompt_field", "completion_field",
                   "ground_truth_field", "max_samples", "seed", "numeric_ground_truth", "keep_annotations",
                   "hub_config", "synthetic_train_size", "synthetic_test_size", "kind", "min_steps", "max_steps",
                   "max_operand", "max_factor", "max_answer", "ops", "digits")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

DESCRIPTION = (
    "Train and evaluate LLMs with reinforcement learning (agentic-rl). Actions: "
    "train (algorithm sft|grpo, any hyper-parameter of that stage, e.g. learning_rate, lora_r, beta, "
    "num_generations, rewards, max_steps), load_dataset (source, split, column mapping), create_reward "
    "(reward specs like 'accuracy:1.0' or 'module:function:0.5'), evaluate (model, dataset, max_samples; returns "
    "all metrics), status (runs and their metrics). Input: a JSON object with 'action' and its parameters.")


def _stage_class(algorithm: str):
    import importlib

    module_name, class_name = ALGORITHMS[algorithm]
    module = importlib.import_module(module_name)
    return module, getattr(module, class_name)


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
            data = json.loads(state.read_text())
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
            if action is None:
                raise ConfigError(f"'action' is required: one of {', '.join(ACTIONS)}")
            if action not in ACTIONS:
                raise ConfigError(f"unknown action {action!r}; actions are {', '.join(ACTIONS)}")
            result = getattr(self, f"_{action}")(params)
            return json.dumps(_jsonable({"action": action, **result}))
        except AgenticRLError as exc:
            return json.dumps({"error": str(exc), "action": action})
        except Exception as exc:  # the agent gets a message, the console the traceback
            from agentic_rl.utils import warn

            warn(f"rl_training {action}: {traceback.format_exc()}")
            return json.dumps({"error": f"{type(exc).__name__}: {exc}", "action": action})

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
            "algorithm": ("string", "train: sft or grpo"),
            "name": ("string", "name of the run, dataset or reward to create (status: the run to show)"),
            "model": ("string", "train/evaluate: a model directory, hub id, or an earlier run's name"),
            "models": ("array", "evaluate: several models"),
            "dataset": ("string", "train/evaluate: a dataset source or a name from load_dataset"),
            "rewards": ("array", "create_reward/train: reward specs or a name from create_reward"),
            "source": ("string", "load_dataset: synthetic, gsm8k, a hub id, a local file/folder or module:function"),
            "split": ("string", "load_dataset/train/evaluate: dataset split"),
            "completions": ("array", "create_reward: sample completions to score"),
            "ground_truth": ("string", "create_reward: reference answer(s) for the sample completions"),
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
        """An earlier run's name -> its model directory; anything else unchanged."""
        if isinstance(model, str) and model in self.runs:
            path = self.runs[model].get("model_dir")
            if not path:
                raise ConfigError(f"run {model!r} has no model (it is an evaluation or did not finish)")
            return path
        return model

    def _dataset_source(self, params: dict[str, Any]) -> None:
        """A dataset name from load_dataset -> its folder (custom column names were already mapped there)."""
        name = params.get("dataset")
        if isinstance(name, str) and name in self.datasets:
            params["dataset"] = self.datasets[name]["path"]

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
        from agentic_rl.config import config_from_dict, config_to_dict

        algorithm = params.pop("algorithm", None)
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"train needs 'algorithm': one of {', '.join(ALGORITHMS)}; got {algorithm!r}")
        name = self._new_name(params.pop("name", None), algorithm, self.runs)
        module, cls = _stage_class(algorithm)
        if "reward" in params and "rewards" not in params:  # the CLI flag's spelling
            params["rewards"] = params.pop("reward")
        if "rewards" in params:
            if not any(f.name == "rewards" for f in dataclasses.fields(cls)):
                raise ConfigError(f"algorithm '{algorithm}' takes no rewards (they belong to grpo)")
            params["rewards"] = self._reward_specs(params["rewards"])
        if "model" in params:
            params["model"] = self._model_path(params["model"])
        self._dataset_source(params)
        params.setdefault("output_dir", str(self.workspace / "runs" / name))
        config = config_from_dict(cls, params, from_string=True, where=f"rl_training train ({algorithm})")

        started = time.time()
        record: dict[str, Any] = {"name": name, "kind": "train", "algorithm": algorithm, "status": "running",
                                  "output_dir": config.output_dir, "config": config_to_dict(config)}
        self.runs[name] = record
        try:
            result = module.run(config)
        except BaseException:
            record["status"] = "failed"
            self._save_state()
            raise
        result = _jsonable(result if isinstance(result, dict) else {"model_dir": result})
        record.update(status="finished", model_dir=result.get("model_dir"), wall_time_s=round(time.time() - started, 1),
                      metrics=_training_metrics(result, Path(config.output_dir)), result=result)
        self._save_state()
        return {"run": name, "algorithm": algorithm, "model_dir": record["model_dir"],
                "output_dir": config.output_dir, "metrics": record["metrics"], "wall_time_s": record["wall_time_s"],
                "config": record["config"], "result": result}

    def _load_dataset(self, params: dict[str, Any]) -> dict[str, Any]:
        from agentic_rl.data.custom import load_task_dataset
        from agentic_rl.utils import write_jsonl

        name_given = params.pop("name", None)
        unknown = [k for k in params if k not in DATASET_OPTIONS]
        if unknown:
            raise ConfigError(f"unknown load_dataset key '{unknown[0]}'; keys are name, {', '.join(DATASET_OPTIONS)}")
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
        folder = self.workspace / "datasets" / name
        # 'answer' is written in our format (steps, then "Final Answer: N"), so the file reads back into the very
        # same canonical rows whatever the original columns were (GSM8K's "#### N", a ground-truth-only column).
        write_jsonl(folder / f"{split}.jsonl", [{**row, "answer": row["solution"]} for row in rows])
        entry = self.datasets.setdefault(name, {"name": name, "source": source, "path": str(folder), "splits": {},
                                                "options": params})
        steps = [r.get("num_steps") for r in rows if isinstance(r.get("num_steps"), int)]
        entry["splits"][split] = {"num_rows": len(rows), "file": str(folder / f"{split}.jsonl"),
                                  "avg_steps": sum(steps) / len(steps) if steps else None}
        self._save_state()
        example = {k: rows[0].get(k) for k in ("question", "solution", "ground_truth")} if rows else {}
        return {"dataset": name, "path": str(folder), "split": split, "num_rows": len(rows),
                "columns": sorted(rows[0]) if rows else [], "avg_steps": entry["splits"][split]["avg_steps"],
                "example": example}

    def _create_reward(self, params: dict[str, Any]) -> dict[str, Any]:
        from agentic_rl.rewards import build_rewards

        name_given = params.pop("name", None)
        specs_value = params.pop("rewards", params.pop("reward", params.pop("spec", None)))
        completions = params.pop("completions", None)
        truth = params.pop("ground_truth", None)
        if params:
            raise ConfigError(f"unknown create_reward key '{next(iter(params))}'; keys are rewards, name, "
                              "completions, ground_truth")
        if specs_value is None:
            raise ConfigError("create_reward needs 'rewards': a spec like 'accuracy:1.0' or a list of specs")
        specs = self._reward_specs(specs_value)
        funcs, weights = build_rewards(specs)
        names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
        name = self._new_name(name_given, "reward", self.rewards)
        self.rewards[name] = {"name": name, "specs": specs, "weights": weights, "functions": names}
        self._save_state()
        out: dict[str, Any] = {"reward": name, "specs": specs, "functions": names, "weights": weights}
        if completions is not None:
            out["scores"] = _score(funcs, weights, names, completions, truth)
        return out

    def _evaluate(self, params: dict[str, Any]) -> dict[str, Any]:
        from agentic_rl.config import config_from_dict
        from agentic_rl.eval.evaluate import EvalConfig
        from agentic_rl.eval.evaluate import run as run_eval

        name = self._new_name(params.pop("name", None), "eval", self.runs)
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
        self._dataset_source(params)
        params.setdefault("output_dir", str(self.workspace / "evals" / name))
        config = config_from_dict(EvalConfig, params, from_string=True, where="rl_training evaluate")

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
        return {"run": name, "output_dir": result["output_dir"], "dataset": config.dataset, "split": config.split,
                "metrics": single if single is not None else metrics}

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
    log_file = out / "metrics.jsonl"
    if log_file.is_file():
        rows = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
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
    """Create the tool and register it in a hello-agents ``ToolRegistry`` (its global registry by default)."""
    if not HELLO_AGENTS:
        raise ImportError("hello-agents is not installed: pip install 'agentic-rl[hello-agents]'")
    if registry is None:
        from hello_agents.tools.registry import global_registry as registry
    tool = RLTrainingTool(**kwargs)
    registry.register_tool(tool)
    return tool
