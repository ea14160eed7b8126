"""Multi-turn rollouts: the model acts, the environment answers, until the episode is done.

One loop serves training (sampled, through TRL's ``rollout_func`` hook) and evaluation (greedy, or sampled for
pass@k)::

    prompt ─ generate turn 1 ─ env.step ─ tool-message tokens ─ generate turn 2 ─ env.step ─ ... ─ done

Everything after the prompt is one token sequence, ``completion_ids``, with a parallel ``env_mask``: 1 for tokens
the model generated (actions, trained on), 0 for tokens the environment inserted (tool responses or ``user``
feedback messages and the chat template around them, never trained on). A string returned by ``env.reset(task)``
is appended to the prompt's last user message before the prompt is tokenized, as TRL's ``environment_factory``
does; ``env.episode_metrics()`` is read once the episode is over and averaged by :func:`episode_stats`. Turns are
spliced at the token level (see
:class:`agentic_rl.agent.tool_format.ChatFormat`), so the sequence GRPO scores is exactly the sequence that was
sampled. The trajectory's return is the sum of its step rewards; each assistant turn's step reward and token span
(``turn_spans``) are kept for turn-level credit assignment (:mod:`agentic_rl.train.credit`).

An environment with a ``context_window`` of k turns (the memory environment) keeps only its latest turns in view:
turn t is generated from the prompt followed by turns t-k .. t-1 (each assistant turn with the observation that
answers it); the earlier turns leave the context. The kept part is a suffix of ``completion_ids`` starting at the first
token of turn t-k (``context_starts``, one per turn), so the model continues as if the earlier turns had never been
there, and nothing is re-tokenized. Training scores each turn's tokens in that same context
(:func:`context_views`: SFT examples per view, GRPO's log-prob passes per view in
:class:`agentic_rl.train.logprobs.FoldedContextScoring`).

TRL (1.16) consumes this as follows: ``rollout_func`` returns ``prompt_ids``, ``completion_ids``, ``logprobs`` and
extra fields; the extra field ``env_mask`` becomes the trainer's ``tool_mask`` (loss mask = completion mask ×
env mask); every other field (``trajectory_return``, ``step_rewards``, ``turn_spans``, ...) is passed to the reward
functions. With the reward ``trajectory_return`` the group-relative advantage (return − group mean [/ std]) multiplies
the log-probability of every action token of the trajectory; with ``credit_assignment: turn`` the trainer gives each
turn's tokens the advantage of that turn's return-to-go instead (:mod:`agentic_rl.train.credit`).

:func:`encode_episode` builds the same (ids, mask) from a written conversation: SFT demonstrations use it, so the
tokens a model is fine-tuned on are spliced exactly as at rollout time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.agent.env import Environment, trajectory_return
from agentic_rl.agent.tool_format import OBSERVATION_ROLES, ChatFormat
from agentic_rl.data.formats import last_message_index, task_with_data
from agentic_rl.errors import AgenticRLError, ConfigError, DataError


@dataclass
class RolloutSettings:
    """Generation settings of the multi-turn loop."""

    max_turn_tokens: int = 64  # new tokens per assistant turn
    max_completion_length: int = 256  # all tokens after the prompt (actions + tool responses)
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    tools_in_prompt: bool = True  # render the tools' JSON schemas into the prompt via the chat template
    chat_template_kwargs: dict[str, Any] = field(default_factory=lambda: {"enable_thinking": False})


@dataclass
class Trajectory:
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1 = model token (action), 0 = environment token
    step_rewards: list[float] = field(default_factory=list)  # one per assistant turn
    # (start, end) of each assistant turn's tokens in completion_ids, one per step reward (turn-level credit)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    # where each turn's context begins in completion_ids (0: the whole episode so far; see context_window)
    context_starts: list[int] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)  # assistant and observation messages, in order
    turns: int = 0
    tool_calls: int = 0  # tool-call blocks written (valid or not)
    tool_errors: int = 0  # calls answered with an error observation
    useful_tool_calls: int = 0  # valid calls that earned the tool reward (new and, for the calculator, grounded)
    answered: bool = False  # the episode ended with an answer turn (not cut by the token budget)
    correct: bool = False
    truncated: bool = False  # the token budget ran out before the episode was done
    retry_turns: list[int] = field(default_factory=list)  # turns (0-based) answered wrong with another try left
    metrics: dict[str, float] = field(default_factory=dict)  # env.episode_metrics() after the episode

    @property
    def total_return(self) -> float:
        return trajectory_return(self.step_rewards)

    @property
    def valid_tool_calls(self) -> int:
        return self.tool_calls - self.tool_errors

    def summary(self) -> dict[str, Any]:
        return {"return": self.total_return, "step_rewards": self.step_rewards, "turns": self.turns,
                "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
                "useful_tool_calls": self.useful_tool_calls, "correct": self.correct,
                "truncated": self.truncated, "metrics": self.metrics, "messages": self.messages}


# ---------------------------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------------------------

def generate_batch(model, contexts: list[list[int]], *, max_new_tokens: int, stop_ids: list[int], pad_id: int,
                   do_sample: bool, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                   turn_cache=None, cache_keys: list | None = None) -> list[list[int]]:
    """New tokens for each context, each cut just after its first stop token: the project's one decoding function
    (:func:`agentic_rl.models.generate.generate_token_ids`), greedy unless ``do_sample``; ``turn_cache`` and
    ``cache_keys`` are its own (the episodes' keys and values kept between turns)."""
    from agentic_rl.models.generate import generate_token_ids

    if do_sample and temperature <= 0:
        raise ValueError(f"sampling needs a temperature > 0, got {temperature}")
    return generate_token_ids(model, contexts, max_new_tokens=max_new_tokens, stop_ids=stop_ids, pad_id=pad_id,
                              temperature=temperature if do_sample else 0.0, top_p=top_p, top_k=top_k,
                              turn_cache=turn_cache, cache_keys=cache_keys)


def _decode_turn(tokenizer, ids: list[int], fmt: ChatFormat) -> str:
    body = [t for t in ids if t not in fmt.stop_ids and t != tokenizer.pad_token_id]
    return tokenizer.decode(body, skip_special_tokens=False)


# ---------------------------------------------------------------------------------------------------------------
# The episode loop
# ---------------------------------------------------------------------------------------------------------------

def reset_episode(env: Environment, task: dict[str, Any]) -> Any:
    """``env.reset(task)``, with an exception raised by the environment's own code turned into a one-line error that
    names its class and the task's columns (a user's environment is plugged in by name; its bug is not ours). The
    task's ``task_data`` columns are spread into it first (:func:`agentic_rl.data.formats.task_with_data`)."""
    task = task_with_data(task)
    try:
        return env.reset(task)
    except AgenticRLError:
        raise
    except Exception as exc:
        name = type(getattr(env, "obj", env)).__name__  # a TRL-shaped class is wrapped: name the user's class
        raise DataError(f"{name}.reset() raised {type(exc).__name__}: {exc} (task columns: "
                        f"{', '.join(map(str, task))})") from None


def prompt_with_observation(prompt: list[dict[str, Any]], observation: Any) -> list[dict[str, Any]]:
    """``prompt`` with a reset observation (a string) appended to its last user message, as TRL does; a new list
    (the task's prompt is not changed). None leaves the prompt as it is."""
    if observation is None:
        return prompt
    if not isinstance(observation, str):
        raise DataError(f"an environment's reset() must return a string or None, got {type(observation).__name__}")
    last_user = last_message_index(prompt)
    if last_user is None:
        raise DataError("the task prompt has no user message to append the environment's first observation to")
    message = prompt[last_user]
    return [*prompt[:last_user], {**message, "content": message["content"] + observation}, *prompt[last_user + 1:]]


def run_episodes(model, tokenizer, envs: list[Environment], tasks: list[dict[str, Any]],
                 prompts: list[list[dict[str, str]]], settings: RolloutSettings,
                 chat_format: ChatFormat | None = None, reuse_cache: bool = True,
                 starts: list[Trajectory | None] | None = None) -> list[Trajectory]:
    """Play one episode per (env, task, prompt), all in lock-step batches (one generate call per turn).

    Each episode's keys and values are kept from one turn to the next (``reuse_cache``,
    :class:`agentic_rl.models.generate.TurnCache`), so a turn prefills only the tokens added since the last one.
    ``starts``: per episode, None (a new episode: the environment is reset) or an episode already under way in its
    environment (:func:`replay_turns`), which the model continues."""
    if not (len(envs) == len(tasks) == len(prompts)):
        raise ValueError("run_episodes needs as many environments as tasks and prompts")
    starts = starts if starts is not None else [None] * len(envs)
    if len(starts) != len(envs):
        raise ValueError("run_episodes needs one start (or None) per environment")
    fmt = chat_format or ChatFormat(tokenizer, settings.chat_template_kwargs)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else fmt.end_of_turn_id
    trajectories = [start if start is not None else _new_episode(env, task, prompt, settings, fmt)
                    for env, task, prompt, start in zip(envs, tasks, prompts, starts)]

    windows = [context_window_of(env) for env in envs]
    active = list(range(len(trajectories)))
    turn_cache = None
    if reuse_cache:
        from agentic_rl.models.generate import TurnCache

        turn_cache = TurnCache.for_model(model)
    while active:
        budgets = [settings.max_completion_length - len(trajectories[i].completion_ids) for i in active]
        for i in active:
            traj = trajectories[i]
            traj.context_starts.append(context_start(traj.turn_spans, len(traj.turn_spans), windows[i]))
        new_ids = generate_batch(
            model, [trajectories[i].prompt_ids + trajectories[i].completion_ids[trajectories[i].context_starts[-1]:]
                    for i in active],
            max_new_tokens=max(1, min(settings.max_turn_tokens, max(budgets))), stop_ids=fmt.stop_ids,
            pad_id=pad_id, do_sample=settings.do_sample, temperature=settings.temperature, top_p=settings.top_p,
            top_k=settings.top_k, turn_cache=turn_cache, cache_keys=active)
        still_active = [i for i, ids, budget in zip(active, new_ids, budgets)
                        if _take_turn(trajectories[i], envs[i], ids[:max(1, min(settings.max_turn_tokens, budget))],
                                      tokenizer, fmt, settings)]
        if turn_cache is not None:
            turn_cache.forget(set(active) - set(still_active))
        active = still_active
    for traj, env in zip(trajectories, envs):
        traj.metrics = {key: float(value) for key, value in env.episode_metrics().items()}
    return trajectories


def _new_episode(env: Environment, task: dict[str, Any], prompt: list[dict[str, str]], settings: RolloutSettings,
                 fmt: ChatFormat) -> Trajectory:
    """A trajectory holding only the prompt of a new episode (the environment reset, its first observation added)."""
    prompt = prompt_with_observation(prompt, reset_episode(env, task))
    tools = env.tool_schemas() if settings.tools_in_prompt else None
    return Trajectory(prompt_ids=fmt.prompt_ids(prompt, tools))


def _take_turn(traj: Trajectory, env: Environment, ids: list[int], tokenizer, fmt: ChatFormat,
               settings: RolloutSettings) -> bool:
    """Play the assistant turn ``ids`` in ``env`` and record it in ``traj``: the turn's tokens, the environment's
    answer (step reward, counts) and, when the episode goes on, the observation's tokens and the next generation
    prompt. Returns whether the episode goes on."""
    ended = ids[-1] in fmt.stop_ids
    text = _decode_turn(tokenizer, ids, fmt)
    result = env.step(text)
    traj.turn_spans.append((len(traj.completion_ids), len(traj.completion_ids) + len(ids)))
    traj.completion_ids += ids
    traj.env_mask += [1] * len(ids)
    traj.step_rewards.append(float(result.reward))
    traj.messages.append({"role": "assistant", "content": text})
    traj.turns += 1
    traj.tool_calls += int(result.info.get("calls", 0))
    traj.tool_errors += int(result.info.get("errors", 0))
    traj.useful_tool_calls += int(result.info.get("useful", 0))
    if result.info.get("kind") == "retry":
        traj.retry_turns.append(traj.turns - 1)
    if result.done:
        traj.answered = True
        traj.correct = bool(result.info.get("correct", False))
        return False
    # Close a turn cut by the per-turn limit, then the observation messages and the next generation prompt.
    suffix = ([] if ended else [fmt.end_of_turn_id]) + fmt.observation_suffix_ids(result.observation)
    if len(traj.completion_ids) + len(suffix) >= settings.max_completion_length:
        traj.truncated = True  # no room left for another turn: the episode ends without an answer
        return False
    traj.completion_ids += suffix
    traj.env_mask += [0] * len(suffix)
    traj.messages += result.observation
    return True


def replay_turns(env: Environment, task: dict[str, Any], prompt: list[dict[str, str]], episode: Trajectory,
                 turns: int, tokenizer, fmt: ChatFormat, settings: RolloutSettings) -> Trajectory | None:
    """A new episode of ``task`` in ``env`` that has played the first ``turns`` assistant turns of ``episode`` (its
    tokens, sampled earlier), ready for the model to write the next turn: the environment is reset and stepped with
    those turns. None when the environment does not answer them as it answered ``episode`` (other observation
    tokens or step rewards: it is not deterministic) or the episode did not go on after them."""
    if not 0 < turns < len(episode.turn_spans):
        return None
    replay = _new_episode(env, task, prompt, settings, fmt)
    if replay.prompt_ids != episode.prompt_ids:
        return None
    for turn in range(turns):
        replay.context_starts.append(episode.context_starts[turn])
        start, end = episode.turn_spans[turn]
        if not _take_turn(replay, env, episode.completion_ids[start:end], tokenizer, fmt, settings):
            return None
    n = len(replay.completion_ids)
    if (replay.completion_ids != episode.completion_ids[:n] or replay.step_rewards != episode.step_rewards[:turns]
            or n != episode.turn_spans[turns][0]):
        return None
    return replay


def context_window_of(env: Any) -> int | None:
    """The environment's ``context_window`` (turns kept in view; None: all), checked."""
    window = getattr(env, "context_window", None)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(f"{type(env).__name__}.context_window must be an integer >= 1 or None, got {window!r}")
    return window


def context_start(turn_spans: list[tuple[int, int]], turn: int, window: int | None) -> int:
    """Where turn ``turn`` (0-based)'s context begins in the completion: the first token of turn ``turn - window``,
    or 0 (the whole episode so far) when ``window`` is None or no turn has left the context yet.

    >>> context_start([(0, 5), (9, 14), (20, 26)], 3, 2)
    9
    """
    if window is None or turn <= window:
        return 0
    return turn_spans[turn - window][0]


def context_views(turn_spans: list[tuple[int, int]], context_starts: list[int]) -> list[tuple[int, int, list[int]]]:
    """The contexts an episode's turns were generated in, as ``(start, end, turns)``: consecutive turns that share a
    context start form one view, whose tokens ``completion[start:end]`` (end: the last of its turns' end) follow
    the prompt; each turn's tokens are scored in its own view only.

    >>> context_views([(0, 5), (9, 14), (20, 26), (30, 33)], [0, 0, 0, 9])
    [(0, 26, [0, 1, 2]), (9, 33, [3])]
    """
    if len(turn_spans) != len(context_starts):
        raise ValueError(f"{len(turn_spans)} turn spans but {len(context_starts)} context starts")
    views: list[tuple[int, int, list[int]]] = []
    for turn, ((_, end), start) in enumerate(zip(turn_spans, context_starts)):
        if views and views[-1][0] == start:
            views[-1] = (start, end, views[-1][2] + [turn])
        else:
            views.append((start, end, [turn]))
    return views


def encode_episode(fmt: ChatFormat, prompt: list[dict[str, str]], messages: list[dict[str, Any]],
                   tools: list[dict] | None = None) -> tuple[list[int], list[int], list[int]]:
    """(prompt_ids, completion_ids, env_mask) of a written episode: assistant turns alternating with observations.

    Spliced exactly as :func:`run_episodes` splices a sampled episode: each assistant turn is its text plus the
    end-of-turn token (mask 1, or 0 when the message says ``"train": False``); each run of observation messages
    (``tool`` results, ``user`` feedback) is rendered by the chat template with the next generation prompt (mask 0).
    """
    prompt_ids, completion, mask, _ = encode_episode_turns(fmt, prompt, messages, tools)
    return prompt_ids, completion, mask


def encode_episode_turns(fmt: ChatFormat, prompt: list[dict[str, str]], messages: list[dict[str, Any]],
                         tools: list[dict] | None = None
                         ) -> tuple[list[int], list[int], list[int], list[tuple[int, int]]]:
    """:func:`encode_episode` plus the (start, end) span of each assistant turn in the completion."""
    prompt_ids = fmt.prompt_ids(prompt, tools)
    completion, mask, spans = [], [], []
    for role, run in _episode_pieces(messages):
        if role == "assistant":
            ids = fmt.turn_ids(run[0]["content"])
            spans.append((len(completion), len(completion) + len(ids)))
            completion += ids
            mask += [int(bool(run[0].get("train", True)))] * len(ids)
        else:
            ids = fmt.observation_suffix_ids(run)
            completion += ids
            mask += [0] * len(ids)
    return prompt_ids, completion, mask, spans


def episode_text(fmt: ChatFormat, prompt: list[dict[str, str]], messages: list[dict[str, Any]],
                 tools: list[dict] | None = None) -> str:
    """A written episode as one text, spliced as :func:`encode_episode` splices its ids (the layout a rollout's
    context has): the pretraining corpus writes episodes in the layout the stages read."""
    parts = [fmt.prompt_text(prompt, tools)]
    for role, run in _episode_pieces(messages):
        parts.append(run[0]["content"] + fmt.end_of_turn if role == "assistant" else fmt.observation_suffix_text(run))
    return "".join(parts)


def _episode_pieces(messages: list[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An episode's messages as ("assistant", [message]) and ("observation", [the run of observation messages])."""
    k = 0
    while k < len(messages):
        message = messages[k]
        if message["role"] == "assistant":
            yield "assistant", [message]
            k += 1
        elif message["role"] in OBSERVATION_ROLES:
            run = []
            while k < len(messages) and messages[k]["role"] in OBSERVATION_ROLES:
                run.append(messages[k])
                k += 1
            yield "observation", run
        else:
            raise DataError(f"episode message {k} has role '{message['role']}'; expected assistant, "
                            f"{' or '.join(OBSERVATION_ROLES)}")


# ---------------------------------------------------------------------------------------------------------------
# Statistics and the TRL hook
# ---------------------------------------------------------------------------------------------------------------

def episode_stats(trajectories: list[Trajectory]) -> dict[str, float]:
    """Tool-call rate (episodes with >= 1 valid call), tool error rate (errors / calls), turns, return, accuracy,
    and each key of the environment's ``episode_metrics`` averaged over the episodes that report it (a key that
    is also one of these names gets the prefix ``env_``)."""
    n = max(len(trajectories), 1)
    calls = sum(t.tool_calls for t in trajectories)
    stats = {
        "accuracy": sum(t.correct for t in trajectories) / n,
        "tool_call_rate": sum(t.valid_tool_calls > 0 for t in trajectories) / n,
        "tool_calls_per_episode": calls / n,
        "tool_error_rate": (sum(t.tool_errors for t in trajectories) / calls) if calls else 0.0,
        "useful_call_rate": (sum(t.useful_tool_calls for t in trajectories) / calls) if calls else 0.0,
        "turns_per_episode": sum(t.turns for t in trajectories) / n,
        "return": sum(t.total_return for t in trajectories) / n,
        "truncated_rate": sum(t.truncated for t in trajectories) / n,
    }
    reported: dict[str, list[float]] = {}
    for t in trajectories:
        for key, value in t.metrics.items():
            reported.setdefault(key, []).append(value)
    for key, values in reported.items():
        stats[f"env_{key}" if key in stats else key] = sum(values) / len(values)
    return stats


def prompt_key(prompt: list[dict[str, Any]]) -> tuple:
    return tuple((m["role"], m["content"]) for m in prompt)


def groups_of(prompts: list[list[dict[str, Any]]]) -> list[list[int]]:
    """The indices of each run of equal consecutive prompts: GRPO's groups (TRL repeats each prompt
    ``num_generations`` times in a row).

    >>> a, b = [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]
    >>> groups_of([a, a, b, b, a])
    [[0, 1], [2, 3], [4]]
    """
    groups: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if groups and prompt_key(prompts[groups[-1][0]]) == prompt_key(prompt):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def branch_after_wrong_answers(model, tokenizer, env_factory: Callable[[], Environment],
                               tasks: list[dict[str, Any]], prompts: list[list[dict[str, str]]],
                               trajectories: list[Trajectory], settings: RolloutSettings,
                               fmt: ChatFormat) -> dict[str, float]:
    """Retry groups: in each group whose episodes all answered wrong at first, the episodes go on from one shared
    wrong answer. The first episode with a retry turn (a wrong answer with another try left) keeps its own
    continuation; every other episode of the group is replaced by a new one that replays that episode up to the
    feedback on its wrong answer (:func:`replay_turns`) and is continued by the model. The group's episodes then
    differ only after the feedback, so its advantages (which sum to zero over the shared turns) compare what the
    model did with the feedback. A group with an episode right at its first answer is left as it is, and so is one
    whose environment answers the replayed turns otherwise (not deterministic). Replaces entries of ``trajectories``
    in place; returns ``retry_groups`` (the share of groups branched) and ``retry_groups_split`` (the share of those
    whose episodes' returns then differ)."""
    groups = [g for g in groups_of(prompts) if len(g) > 1]
    slots, envs, starts = [], [], []
    branched = []
    for group in groups:
        if any(trajectories[i].correct and not trajectories[i].retry_turns for i in group):
            continue
        anchor = next((i for i in group if trajectories[i].retry_turns), None)
        if anchor is None:
            continue
        turns = trajectories[anchor].retry_turns[0] + 1
        replays = []
        for i in group:
            if i == anchor:
                continue
            env = env_factory()
            start = replay_turns(env, tasks[i], prompts[i], trajectories[anchor], turns, tokenizer, fmt, settings)
            if start is None:
                break
            replays.append((i, env, start))
        else:
            branched.append(group)
            for i, env, start in replays:
                slots.append(i)
                envs.append(env)
                starts.append(start)
    if slots:
        continued = run_episodes(model, tokenizer, envs, [tasks[i] for i in slots], [prompts[i] for i in slots],
                                 settings, fmt, starts=starts)
        for i, traj in zip(slots, continued):
            trajectories[i] = traj
    split = sum(len({trajectories[i].total_return for i in group}) > 1 for group in branched)
    return {"retry_groups": len(branched) / max(len(groups), 1),
            "retry_groups_split": split / len(branched) if branched else 0.0}


def make_rollout_func(env_factory: Callable[[], Environment], tasks: list[dict[str, Any]],
                      settings: RolloutSettings, *, log_path=None, retry_groups: bool = False) -> Callable:
    """A ``rollout_func(prompts, trainer)`` for TRL's GRPOTrainer.

    ``tasks`` are the training rows (with ``prompt``): TRL hands the hook only the prompts, so each prompt is mapped
    back to its row. Sampling settings (temperature, top-p, top-k) are read from the trainer's config at call time.
    Per-batch agent metrics go into the trainer's logged metrics (``agent/...``) and, with ``log_path``, one JSONL
    line per generation batch (with two sample trajectories). ``retry_groups``: while training, groups whose
    episodes all answered wrong at first go on from one shared wrong answer (:func:`branch_after_wrong_answers`).
    """
    from agentic_rl.utils import append_jsonl

    by_prompt = {prompt_key(t["prompt"]): t for t in tasks}
    state: dict[str, Any] = {"fmt": None}

    def rollout_func(prompts: list[list[dict[str, str]]], trainer) -> dict[str, Any]:
        try:
            batch_tasks = [by_prompt[prompt_key(p)] for p in prompts]
        except KeyError:
            raise DataError("rollout_func got a prompt that is not in the training rows") from None
        tokenizer = trainer.processing_class
        if state["fmt"] is None:
            state["fmt"] = ChatFormat(tokenizer, settings.chat_template_kwargs)
        args = trainer.args
        run_settings = RolloutSettings(
            max_turn_tokens=settings.max_turn_tokens, max_completion_length=args.max_completion_length,
            do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k or 0,
            tools_in_prompt=settings.tools_in_prompt, chat_template_kwargs=settings.chat_template_kwargs)
        model = trainer.accelerator.unwrap_model(trainer.model)
        mode = "train" if trainer.model.training else "eval"
        start = time.time()
        envs = [env_factory() for _ in prompts]
        trajectories = run_episodes(model, tokenizer, envs, batch_tasks, prompts, run_settings, state["fmt"])
        branching = {}
        if retry_groups and mode == "train":
            branching = branch_after_wrong_answers(model, tokenizer, env_factory, batch_tasks, prompts, trajectories,
                                                   run_settings, state["fmt"])
        if any(context_window_of(env) is not None for env in envs):
            # Turns generated in a folded context are scored in it (agentic_rl.train.logprobs.FoldedContextScoring).
            hand_over = getattr(trainer, "set_rollout_contexts", None)
            if hand_over is None:
                raise ConfigError(f"{type(trainer).__name__} cannot train on episodes with a context_window")
            hand_over([(list(t.context_starts), list(t.turn_spans)) for t in trajectories])
        stats = {**episode_stats(trajectories), **branching}
        for key, value in stats.items():
            trainer._metrics[mode][f"agent/{key}"].append(value)
        if log_path is not None:
            append_jsonl(log_path, {"step": trainer.state.global_step, "mode": mode, **stats,
                                    "rollout_seconds": round(time.time() - start, 2),
                                    "samples": [t.summary() for t in trajectories[:2]]})
        return {
            "prompt_ids": [t.prompt_ids for t in trajectories],
            "completion_ids": [t.completion_ids for t in trajectories],
            "logprobs": None,
            "env_mask": [t.env_mask for t in trajectories],
            "trajectory_return": [t.total_return for t in trajectories],
            "step_rewards": [list(t.step_rewards) for t in trajectories],
            "turn_spans": [list(t.turn_spans) for t in trajectories],
            "context_starts": [list(t.context_starts) for t in trajectories],
            "correct": [t.correct for t in trajectories],
        }

    return rollout_func


def trajectory_return_reward(completions, trajectory_return=None, **kwargs) -> list[float]:
    """The GRPO reward of a multi-turn rollout: its return (sum of step rewards), computed during the rollout.

    >>> trajectory_return_reward([["..."]], trajectory_return=[1.1])
    [1.1]
    """
    if trajectory_return is None:
        raise ValueError("trajectory_return_reward needs the 'trajectory_return' field from the agent rollout_func")
    return [float(r) for r in trajectory_return]
