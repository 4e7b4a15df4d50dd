"""Evaluate hooks of the airspace training recipes (`Trainer(evaluate=...)`): decoded and scored
tool calls, and the teacher-forced commit-calibration probe."""

from __future__ import annotations

import time
from typing import Any

from clover.config import ModelConfig
from clover.model import CloverModel
from clover.tasks.airspace.data import ANSWER_MAX_TOKENS
from clover.train import default_collator


def airspace_evaluator(tokenizer, examples: list, max_tokens: int = ANSWER_MAX_TOKENS):
    """Decode `examples` with the engine (greedy) and score the tool calls; None if no engine."""
    try:
        from clover.engine import LLM, SamplingParams
    except ImportError:
        return None
    from clover.tasks.airspace import TOOLS, score
    from clover.tokenizer import render_chat

    prompts = [tokenizer.encode(render_chat(tokenizer, ex.messages(tools=True)[:-1], TOOLS,
                                                 fixed_task_prompt=True))
               for ex in examples]

    def evaluate(model: CloverModel, step: int) -> dict[str, Any]:
        start = time.perf_counter()
        llm = LLM(model, tokenizer, device=str(next(model.parameters()).device), dtype="float32")
        outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
        result = score([o.text for o in outs], examples)
        keep = ("zone_f1", "field_accuracy", "exact_message_accuracy", "tool_call_validity",
                "mean_centre_error_m")
        metrics = {f"eval_{k}": _round(result[k]) for k in keep}
        metrics["eval_errors"] = result["errors"]
        metrics["eval_s"] = round(time.perf_counter() - start, 1)
        return metrics

    return evaluate


def task_evaluator(tokenizer, decoded: list, val_data: list, args, recipe, config: ModelConfig):
    """A run's evaluate hook (None if it has nothing to do): `decoded` examples decoded and scored
    (`airspace_evaluator`), and the first `args.calibration_examples` of `val_data` probed
    teacher-forced (clover.bench.calibration); `recipe.eval_max_tokens` bounds the decodes."""
    from clover.bench.calibration import calibration_evaluator, combine_evaluators

    n = args.calibration_examples
    return combine_evaluators(
        airspace_evaluator(tokenizer, decoded, recipe.eval_max_tokens) if decoded else None,
        calibration_evaluator(val_data[:n], default_collator(config)) if n else None)


def _round(x: Any) -> Any:
    return round(x, 4) if isinstance(x, float) else x
