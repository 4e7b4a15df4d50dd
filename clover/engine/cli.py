"""`clover generate` and `clover chat`: decode from the command line, optionally watching it happen.

`register(subparsers)` adds both commands. The sampling flags are generated from the fields of
`SamplingParams`, one flag per field, so the two cannot drift; a bad value is reported under its
flag name. `--show-steps` drives `Engine.step` itself and, after every step, renders each request's
canvas (masked positions as ░, tokens committed this step highlighted) on stderr, so stdout keeps
only results. Handlers return an exit status; user mistakes raise ValueError for `clover.cli`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from clover.engine.params import CACHE_MODES, SamplingParams

MASK_GLYPH = "░"
_PLAIN_TAIL_CHARS = 80  # a plain step line shows the end of each request's canvas
_LIVE_TAIL_CHARS = 2000

_FLAG_HELP = {
    "max_tokens": "most tokens to generate per prompt",
    "temperature": "0 = greedy",
    "top_p": "nucleus sampling mass",
    "top_k": "keep the k most likely tokens (0: off)",
    "seed": "seed for sampling (temperature > 0)",
    "stop": "stop strings (the text is cut before the first one)",
    "stop_token_ids": "extra token ids that end generation",
    "ignore_eos": "keep decoding after EOS",
    "policy": "commit policy: threshold | topk | entropy",
    "tau": "threshold policy: commit positions with confidence >= tau",
    "steps_per_block": "topk policy: denoising steps per block",
    "gamma": "entropy policy: summed-entropy budget per step (nats)",
    "block_size": "block size override for `full` attention models",
    "cache": f"`full` models: KV cache mode, one of {' | '.join(CACHE_MODES)}",
    "refresh_every": "`full` models: recompute the whole canvas every N steps (0: per block)",
    "structured": 'structured output as JSON, e.g. \'{"json_object": true}\'',
}


# ---- flags <-> SamplingParams --------------------------------------------------------------------
def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _scalar_type(hint: Any) -> type:
    """`int | None` -> int; plain scalars pass through."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _field_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _json_object(text: str) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object (got {text!r})")
    return obj


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """One flag per SamplingParams field (`top_p` -> `--top-p`); unset flags keep the default."""
    group = p.add_argument_group("sampling (SamplingParams)")
    hints = typing.get_type_hints(SamplingParams)
    for f in dataclasses.fields(SamplingParams):
        hint, flag = hints[f.name], _flag(f.name)
        help_ = f"{_FLAG_HELP.get(f.name, f.name)} (default: {_field_default(f)})"
        if hint is bool:
            group.add_argument(flag, action="store_true", default=None, help=help_)
        elif _scalar_type(hint) is dict:
            group.add_argument(flag, type=_json_object, default=None, metavar="JSON",
                               help=help_)
        elif typing.get_origin(hint) is list:
            (item,) = typing.get_args(hint)
            group.add_argument(flag, nargs="+", action="extend", type=item, default=None,
                               metavar=item.__name__.upper(), help=help_)
        else:
            kind = _scalar_type(hint)
            group.add_argument(flag, type=kind, default=None, metavar=kind.__name__.upper(),
                               help=help_)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The SamplingParams the flags describe; a ValueError names the flag, not the field."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(SamplingParams)
             if getattr(args, f.name, None) is not None}
    try:
        params = SamplingParams(**given)
    except ValueError as e:
        message = re.sub(r"SamplingParams\.(\w+)", lambda m: _flag(m.group(1)), str(e))
        raise ValueError(message) from None
    if getattr(params, "structured", None) is not None:
        _require_grammar()
    return params


def _require_grammar() -> None:
    try:
        import clover.grammar  # noqa: F401
    except ImportError:
        raise ValueError("--structured needs the grammar backend (clover.grammar), which this "
                         "install does not have") from None


# ---- model and prompts ---------------------------------------------------------------------------
def load_llm(args: argparse.Namespace):
    from clover.config import PRESETS
    from clover.engine.llm import LLM

    if args.model not in PRESETS and not Path(args.model).is_dir():
        raise ValueError(f"--model {args.model!r} is neither a preset ({', '.join(PRESETS)}) "
                         "nor a model directory")
    if args.model in PRESETS:
        print(f"note: preset {args.model!r} has random weights", file=sys.stderr)
    return LLM(args.model, device=args.device, dtype=args.dtype)


def _parse_ids(text: str, vocab_size: int) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"--prompt-ids must be integers separated by spaces (got {text!r})"
                         ) from None
    if not ids or not all(0 <= i < vocab_size for i in ids):
        raise ValueError(f"--prompt-ids must be a non-empty list of ids in [0, {vocab_size}) "
                         f"(got {text!r})")
    return ids


def _text_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompt_file:
        lines = Path(args.prompt_file).read_text(encoding="utf-8").splitlines()
        prompts += [line for line in lines if line.strip()]
    return prompts


def prompt_ids(llm, args: argparse.Namespace) -> list[list[int]]:
    """Token ids of every prompt: text prompts (chat-wrapped with --chat), then --prompt-ids."""
    texts, tok = _text_prompts(args), llm.tokenizer
    ids = [_parse_ids(s, llm.config.vocab_size) for s in args.prompt_ids or []]
    if not texts and not ids:
        raise ValueError("no prompt: give --prompt, --prompt-file or --prompt-ids")
    if texts and tok is None:
        flag = "--prompt" if args.prompt else "--prompt-file"
        raise ValueError(f"{flag} needs a tokenizer and model {args.model!r} has none: "
                         'pass token ids with --prompt-ids "5 6 7", or a model directory')
    if args.chat and ids:
        raise ValueError("--chat wraps text prompts; it cannot be used with --prompt-ids")
    if args.chat:
        from clover.tokenizer import render_chat
        texts = [render_chat(tok, [{"role": "user", "content": s}]) for s in texts]
    return [tok.encode(s) for s in texts] + ids


def with_tool_calls(out) -> None:
    """Fill a chat output's content / tool_calls / errors from its text (as `LLM.chat` does)."""
    from clover.tokenizer import parse_tool_calls

    parsed = parse_tool_calls(out.text)
    out.tool_calls, out.content, out.errors = parsed.tool_calls, parsed.content, parsed.errors
    if parsed.tool_calls and out.finish_reason == "stop":
        out.finish_reason = "tool_calls"


# ---- --show-steps --------------------------------------------------------------------------------
Segments = list[tuple[str, str]]  # (text, kind); kind: old | new | mask


@dataclass
class RowView:
    """One request after one step: its state and its generated canvas, split by kind."""

    request_id: str
    state: str  # waiting | running | stop | length | ...
    segments: Segments
    new_tokens: int


def _canvas(r) -> list[int]:
    return r.seq + r.block


def _kinds(before: list[int], after: list[int], start: int, mask_id: int) -> list[list]:
    """Runs of [kind, ids] over after[start:]; a position is new if it was masked or absent."""
    runs: list[list] = []
    for i in range(start, len(after)):
        t = after[i]
        fresh = i >= len(before) or before[i] == mask_id
        kind = "mask" if t == mask_id else "new" if fresh else "old"
        if runs and runs[-1][0] == kind:
            runs[-1][1].append(t)
        else:
            runs.append([kind, [t]])
    return runs


def row_view(r, before: list[int], decode: Callable[[list[int]], str]) -> RowView:
    runs = _kinds(before, _canvas(r), len(r.prompt), r.mask_id)
    segments = [(MASK_GLYPH * len(ids) if kind == "mask" else decode(ids), kind)
                for kind, ids in runs]
    new = sum(len(ids) for kind, ids in runs if kind == "new")
    state = r.finish_reason or ("running" if r.row >= 0 else "waiting")
    return RowView(r.request_id, state, segments, new)


def _tail(segments: Segments, limit: int) -> Segments:
    """The last `limit` characters of the segments, with a leading … when cut."""
    out, room = [], limit
    for text, kind in reversed(segments):
        if room <= 0:
            break
        out.append((text[-room:], kind))
        room -= len(text)
    cut = room < 0 or len(out) < len(segments)
    return ([("…", "old")] if cut else []) + out[::-1]


class PlainSteps:
    """One line per step: `step N: +K tokens | req-0 [running] "…text░░░"`; for logs and pipes."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __enter__(self) -> PlainSteps:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, step: int, rows: list[RowView]) -> None:
        new = sum(r.new_tokens for r in rows)
        parts = [f"{r.request_id} [{r.state}] "
                 + json.dumps("".join(t for t, _ in _tail(r.segments, _PLAIN_TAIL_CHARS)),
                              ensure_ascii=False) for r in rows]
        print(f"step {step}: +{new} tokens | " + " | ".join(parts), file=self.stream, flush=True)


class LiveSteps:
    """A rich Live panel redrawn after every step: masks dimmed, this step's commits highlighted."""

    STYLES = {"old": "", "new": "bold black on green", "mask": "dim"}

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self.live = Live(console=Console(file=stream), auto_refresh=False)

    def __enter__(self) -> LiveSteps:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def update(self, step: int, rows: list[RowView]) -> None:
        from rich.console import Group
        from rich.text import Text

        new = sum(r.new_tokens for r in rows)
        header = Text(f"step {step}  ·  +{new} tokens committed this step", style="bold")
        body = [Text.assemble((f"{r.request_id} ", "bold cyan"), (f"[{r.state}] ", "dim"),
                              *((t, self.STYLES[k]) for t, k in _tail(r.segments,
                                                                       _LIVE_TAIL_CHARS)))
                for r in rows]
        self.live.update(Group(header, *body), refresh=True)


def _decoder(llm) -> Callable[[list[int]], str]:
    if llm.tokenizer is None:
        return lambda ids: " ".join(map(str, ids)) + " "
    return lambda ids: llm.tokenizer.decode(ids, skip_special_tokens=False)


def generate_with_steps(llm, ids: list[list[int]], params: SamplingParams, view) -> list:
    """`LLM.generate`, stepping the engine here so `view` sees every request after every step."""
    engine, decode = llm.engine, _decoder(llm)
    requests = [engine.add_request(p, params) for p in ids]
    before = {r.request_id: _canvas(r) for r in requests}
    step = 0
    with view:
        while engine.has_unfinished():
            live = [r for r in requests if not r.finished]
            engine.step()
            step += 1
            view.update(step, [row_view(r, before[r.request_id], decode) for r in live])
            before = {r.request_id: _canvas(r) for r in requests}
    return [llm.output(r) for r in requests]


def step_view(stream: TextIO):
    return LiveSteps(stream) if stream.isatty() else PlainSteps(stream)


# ---- output --------------------------------------------------------------------------------------
def _result(out, llm, index: int, chat: bool) -> dict[str, Any]:
    obj = {"index": index, "request_id": out.request_id, "text": out.text,
           "token_ids": out.token_ids, "finish_reason": out.finish_reason,
           "prompt_tokens": len(out.prompt_token_ids), "stats": out.stats.as_dict()}
    if llm.tokenizer is None:
        obj.pop("text")
    if chat:
        obj |= {"content": out.content, "tool_calls": out.tool_calls, "errors": out.errors}
    return obj


def print_results(outputs: list, llm, args: argparse.Namespace) -> None:
    for i, out in enumerate(outputs):
        if args.json:
            print(json.dumps(_result(out, llm, i, args.chat), ensure_ascii=False))
            continue
        if len(outputs) > 1:
            print(f"--- {i} ---")
        print(out.text if llm.tokenizer is not None else " ".join(map(str, out.token_ids)))


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def request_table(outputs: list):
    from rich.table import Table

    table = Table(title="requests")
    for col in ("request", "finish", "tokens", "forwards", "TPF", "TPS", "first block s",
                "total s"):
        table.add_column(col, justify="left" if col in ("request", "finish") else "right")
    for out in outputs:
        s = out.stats
        table.add_row(out.request_id, out.finish_reason, str(s.generated_tokens),
                      str(s.forwards), _fmt(s.tpf, 2), _fmt(s.tps, 1), _fmt(s.first_block_s),
                      _fmt(s.total_s))
    return table


def engine_table(stats):
    from rich.table import Table

    d = stats.as_dict()
    wall = stats.model_s + stats.policy_s + stats.grammar_s + stats.other_s
    share = lambda x: f"{x:.4f} s ({100 * x / wall:.0f}%)" if wall else f"{x:.4f} s"
    table = Table(title="engine")
    table.add_column("stat")
    table.add_column("value", justify="right")
    rows = [("steps", d["steps"]), ("forwards", d["forwards"]),
            ("generated tokens", d["generated_tokens"]), ("TPF", d["tpf"]),
            ("mean batch rows", d["mean_batch_rows"]), ("model time", share(stats.model_s)),
            ("policy time", share(stats.policy_s)), ("grammar time", share(stats.grammar_s)),
            ("other time", share(stats.other_s)),
            ("overhead share", f"{100 * d['overhead_share']:.1f}%"),
            ("peak memory", f"{d['peak_memory_bytes'] / 2**20:.1f} MiB")]
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def print_stats(outputs: list, engine_stats, stream: TextIO) -> None:
    from rich.console import Console

    console = Console(file=stream, width=max(100, Console(file=stream).width))
    console.print(request_table(outputs))
    console.print(engine_table(engine_stats))


# ---- commands ------------------------------------------------------------------------------------
def _generate(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    llm = load_llm(args)
    ids = prompt_ids(llm, args)
    if args.show_steps:
        outputs = generate_with_steps(llm, ids, params, step_view(sys.stderr))
    else:
        outputs = llm.generate(ids, params)
    if args.chat:
        for out in outputs:
            with_tool_calls(out)
    print_results(outputs, llm, args)
    if args.stats:
        print_stats(outputs, llm.engine.stats, sys.stderr if args.json else sys.stdout)
    return 0


def _load_tools(path: str | None) -> list[dict] | None:
    if path is None:
        return None
    try:
        tools = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"--tools {path}: not valid JSON ({e})") from None
    tools = tools.get("tools") if isinstance(tools, dict) else tools
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError(f"--tools {path}: expected a JSON list of tool objects")
    return tools


def print_reply(out) -> None:
    if out.content:
        print(f"assistant> {out.content}")
    for call in out.tool_calls:
        fn = call["function"]
        print(f"tool call> {fn['name']}({fn['arguments']})  [not executed]")
    for error in out.errors:
        print(f"error> {error}")
    if not (out.content or out.tool_calls or out.errors):
        print(f"assistant> (empty reply, finish reason {out.finish_reason})")


def _history_entry(out) -> dict:
    return {"role": "assistant", "content": out.content or "", "tool_calls": out.tool_calls}


def _chat(args: argparse.Namespace) -> int:
    params, tools = sampling_params(args), _load_tools(args.tools)
    llm = load_llm(args)
    if llm.tokenizer is None:
        raise ValueError(f"--model {args.model!r} has no tokenizer; clover chat needs a model "
                         "directory with tokenizer.json")
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    print("chat: /reset clears the history, /exit or Ctrl-D quits", file=sys.stderr)
    while (line := _read_line()) is not None and line.strip() != "/exit":
        if line.strip() == "/reset":
            messages = list(start)
            print("(history cleared)")
        elif line.strip():
            messages = _chat_turn(llm, messages, line, params, tools)
    return 0


def _chat_turn(llm, messages: list[dict], line: str, params: SamplingParams,
               tools: list[dict] | None) -> list[dict]:
    """Answer one user line; returns the history with the turn, or unchanged on an error."""
    turn = messages + [{"role": "user", "content": line}]
    try:
        out = llm.chat(turn, params, tools)[0]
    except ValueError as e:
        print(f"error> {e}")
        return messages
    print_reply(out)
    return turn + [_history_entry(out)]


def _read_line() -> str | None:
    try:
        return input("you> ")
    except EOFError:
        print()
        return None


def _common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory or preset name (e.g. tiny)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    p.add_argument("--dtype", default="auto",
                   help="auto | float32 | bfloat16 | int8 (torchao weight-only; default: auto)")
    add_sampling_flags(p)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `generate` and `chat` to the `clover` subcommands."""
    g = sub.add_parser("generate", help="decode prompts with a model and print the text")
    _common_flags(g)
    g.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    g.add_argument("--prompt-file", help="a file with one prompt per line")
    g.add_argument("--prompt-ids", action="append",
                   help='a prompt as token ids, e.g. "5 6 7" (repeatable; for tokenizer-less '
                        "presets)")
    g.add_argument("--chat", action="store_true", help="wrap each prompt as a user chat turn")
    g.add_argument("--stats", action="store_true", help="per-request and engine statistics")
    g.add_argument("--show-steps", action="store_true",
                   help="draw the denoising after every step on stderr (a line per step when "
                        "stderr is not a terminal)")
    g.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    g.set_defaults(func=_generate)
    c = sub.add_parser("chat", help="chat with a model in the terminal (tool calls are shown)")
    _common_flags(c)
    c.add_argument("--system", help="system message")
    c.add_argument("--tools", help="JSON file with a list of tools (OpenAI function schemas)")
    c.set_defaults(func=_chat)
