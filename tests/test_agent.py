"""The airspace agent loop: calls executed as requests finish, tool results fed back, scoring."""

from types import SimpleNamespace

import pytest

from clover.engine import SamplingParams
from clover.engine.llm import EngineStats
from clover.engine.request import Request
from clover.tasks.airspace import assistant_text, generate_examples, reference_calls, score
from clover.tasks.airspace.agent import predictions, run_agent
from clover.tokenizer import train_tokenizer


class ScriptedEngine:
    """Stands in for the engine: each request 'generates' the next scripted answer of its
    message, so the loop's bookkeeping is tested without a trained model."""

    def __init__(self, tok, answers: dict[str, list[str]]):
        self.tok, self.answers, self.stats = tok, answers, EngineStats()
        self.pending: list[Request] = []
        self.prompts: list[str] = []

    def add_request(self, prompt_ids, params, request_id=None):
        text = self.tok.decode(prompt_ids, skip_special_tokens=False)
        self.prompts.append(text)
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
    assert score(predictions(run), examples)["zone_recall"] == 0.0
