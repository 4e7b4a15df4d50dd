"""The airspace agent loop: calls executed as requests finish, tool results fed back, scoring."""

from types import SimpleNamespace

import pytest

from clover.engine import SamplingParams
from clover.engine.llm import EngineStats
from clover.engine.request import Request
from clover.tasks.airspace import assistant_text, generate_examples, reference_calls, score
from clover.tasks.airspace.agent import initial_conversation, predictions, run_agent
from clover.tasks.airspace.tools import TOOLS
from clover.tokenizer import render_chat, train_tokenizer


class ScriptedEngine:
    """Stands in for the engine: each request 'generates' the next scripted answer of its
    message, so the loop's bookkeeping is tested without a trained model."""

    def __init__(self, tok, answers: dict[str, list[str]], max_model_len: int = 1 << 20):
        self.tok, self.answers, self.stats = tok, answers, EngineStats()
        self.max_model_len = max_model_len
        self.max_tokens: list[int] = []
        self.pending: list[Request] = []
        self.prompts: list[str] = []

    def add_request(self, prompt_ids, params, request_id=None):
        assert len(prompt_ids) + params.max_tokens <= self.max_model_len
        text = self.tok.decode(prompt_ids, skip_special_tokens=False)
        self.prompts.append(text)
        self.max_tokens.append(params.max_tokens)
        key = next(k for k in self.answers if k in text)
        answer = self.answers[key][sum(key in p for p in self.prompts) - 1]
        r = Request(f"r{len(self.prompts)}", list(prompt_ids), params, 2)
        r.seq = list(prompt_ids) + self.tok.encode(answer) + [1]
        r.stats.generated_tokens, r.stats.forwards = len(r.seq) - len(prompt_ids), 3
        self.pending.append(r)
        return r

    def has_unfinished(self):
        return bool(self.pending)

    def step(self):
        self.stats.forwards += 1
        done, self.pending = self.pending[:1], self.pending[1:]
        return done


@pytest.fixture(scope="module")
def examples():
    return [e for e in generate_examples("test", 12, 3) if not e.history][:4]


@pytest.fixture(scope="module")
def tok(examples):
    texts = [e.text for e in generate_examples("train", 200, 1)]
    return train_tokenizer(texts + [assistant_text(reference_calls(e)) for e in examples],
                           vocab_size=600)


def test_gold_answers_score_perfectly_and_get_a_second_turn(examples, tok):
    answers = {e.text: [assistant_text(reference_calls(e)), "Done."] for e in examples}
    engine = ScriptedEngine(tok, answers)
    llm = SimpleNamespace(engine=engine, tokenizer=tok)
    run = run_agent(llm, examples, SamplingParams(max_tokens=8), max_turns=2)
    result = score(predictions(run), examples)
    assert result["zone_f1"] == 1.0 and result["exact_message_accuracy"] == 1.0
    positives = [m for m in run.messages if m.example.zones]
    assert all(m.turns == 2 for m in positives)  # calls, then the answer after the tool results
    follow_ups = [p for p in engine.prompts if "<tool_response>" in p]
    assert len(follow_ups) == len(positives)
    assert run.first_usable_s is not None and run.full_task_s >= run.first_usable_s


def test_broken_calls_are_reported_not_raised(examples, tok):
    answers = {e.text: ['<tool_call>{"name": "set_no_fly_zone", "arguments": {"centre": '] * 2
               for e in examples}
    llm = SimpleNamespace(engine=ScriptedEngine(tok, answers), tokenizer=tok)
    run = run_agent(llm, examples, SamplingParams(max_tokens=8))
    assert all(m.errors and not m.calls and m.turns == 1 for m in run.messages)
    assert run.first_usable_s is None
    result = score(predictions(run), examples)
    assert result["zone_recall"] == 0.0
    assert result["tool_call_validity"] == 0.0 and result["num_invalid_calls"] == len(examples)


def test_turns_are_capped_to_the_context_left(examples, tok):
    """A turn gets at most the room left in the context; a turn with no room ends the message
    (recorded as an error) instead of failing the whole batch."""
    answers = {e.text: [assistant_text(reference_calls(e)), "Done."] for e in examples}
    firsts = [len(tok.encode(render_chat(tok, initial_conversation(e), tools=TOOLS,
                                               fixed_task_prompt=True)))
              for e in examples]
    engine = ScriptedEngine(tok, answers, max_model_len=max(firsts) + 40)
    llm = SimpleNamespace(engine=engine, tokenizer=tok)
    run = run_agent(llm, examples, SamplingParams(max_tokens=4000), max_turns=2)
    assert all(m.turns >= 1 for m in run.messages)
    room = [max(firsts) + 40 - f for f in firsts]  # capped to the room; add_request's assert held
    assert engine.max_tokens[:len(examples)] == room
    positives = [m for m in run.messages if m.example.zones]
    assert any("context full" in " ".join(m.errors) for m in positives)
    tiny = ScriptedEngine(tok, answers, max_model_len=10)
    run2 = run_agent(SimpleNamespace(engine=tiny, tokenizer=tok), examples,
                     SamplingParams(max_tokens=8))
    assert all(m.turns == 0 and "context full" in m.errors[0] for m in run2.messages)
    assert not tiny.prompts


def test_second_turn_training_rows_are_what_the_agent_sends(examples, tok):
    """`smol_sft(ack_share=1)` adds one row per calling example whose prompt is exactly the
    agent's second-turn prompt after the gold calls ran (same tool results, same rendering) and
    whose target is the closing reply; first-turn rows are unchanged and come first."""
    from clover.tasks.airspace.data import ACK_REPLY
    from clover.tasks.airspace.smol import smol_sft

    answers = {e.text: [assistant_text(reference_calls(e)), ACK_REPLY] for e in examples}
    engine = ScriptedEngine(tok, answers)
    run_agent(SimpleNamespace(engine=engine, tokenizer=tok), examples,
              SamplingParams(max_tokens=8), max_turns=2)
    second = [p for p in engine.prompts if "<tool_response>" in p]
    calling = [e for e in examples if e.calls]
    assert calling and len(second) == len(calling)
    rows = smol_sft(tok, examples, ack_share=1.0, seed=0)
    assert rows[:len(examples)] == smol_sft(tok, examples)
    ack_rows = rows[len(examples):]
    assert len(ack_rows) == len(calling)
    for row in ack_rows:
        prompt = tok.decode(row.ids[:row.prompt_len], skip_special_tokens=False)
        assert prompt in second
        assert tok.decode(row.ids[row.prompt_len:], skip_special_tokens=True) == ACK_REPLY
    with pytest.raises(ValueError, match="no calls"):
        next(e for e in generate_examples("test", 40, 3) if not e.calls).messages(ack=True)
    few = smol_sft(tok, generate_examples("train", 60, 2), ack_share=0.25, seed=5)
    assert 60 < len(few) < 60 + 40  # a share of the calling examples, drawn with the seed
    assert few == smol_sft(tok, generate_examples("train", 60, 2), ack_share=0.25, seed=5)
