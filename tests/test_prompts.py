"""Chat prompts: the system prompt, few-shot turns, the instruction, and the rendered token ids."""

import pytest

from streamrl.data.prompts import SHOT_TEMPLATES, build_messages, render_prompt_ids, shot_response
from streamrl.models import load_tokenizer, resolve_model_dir
from streamrl.rewards.extract import extract_answer


def test_a_chat_keeps_its_own_system_turn_and_gets_the_instruction_on_its_last_user_turn():
    # (a system turn anywhere but first makes the row malformed: data/columns.py refuses it)
    chat = [
        {"role": "system", "content": "own"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
    ]
    assert build_messages("ignored", "S", "I", chat=chat) == [
        {"role": "system", "content": "own"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2\nI"},
    ]
    assert chat[3]["content"] == "q2"  # the row itself is not changed
    assert build_messages("ignored", "S", "", chat=chat[2:]) == [
        {"role": "system", "content": "S"},  # no system turn of its own: the configured one
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
    ]


def test_few_shot_turns_carry_the_instruction_and_no_instruction_adds_nothing():
    shots = [("1+1?", "The answer is 2."), ("2+2?", "The answer is 4.")]
    assert build_messages("3+3?", instruction="Be brief.", shots=shots) == [
        {"role": "user", "content": "1+1?\nBe brief."},
        {"role": "assistant", "content": "The answer is 2."},
        {"role": "user", "content": "2+2?\nBe brief."},
        {"role": "assistant", "content": "The answer is 4."},
        {"role": "user", "content": "3+3?\nBe brief."},
    ]
    assert build_messages("3+3?", shots=shots[:1]) == [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "The answer is 2."},
        {"role": "user", "content": "3+3?"},
    ]


@pytest.mark.parametrize(
    "extract, response",
    [
        ("answer_is", "The answer is 42."),
        ("boxed", "\\boxed{42}"),
        ("last_number", "42"),
        ("gsm8k", "#### 42"),
    ],
)
def test_a_templated_shot_shows_the_answer_in_the_format_the_reward_reads(extract, response):
    assert set(SHOT_TEMPLATES) == {"answer_is", "boxed", "last_number", "gsm8k"}
    assert shot_response({"question": "6*7?", "answer": 42}, extract, "shot") == ("6*7?", response)
    assert extract_answer(response, extract) == "42"
    verbatim = {"question": "6*7?", "response": "Six sevens: 42.", "answer": 42}
    assert shot_response(verbatim, extract, "shot") == ("6*7?", "Six sevens: 42.")  # a response wins


def test_a_shot_without_an_answer_or_a_question_is_refused():
    with pytest.raises(ValueError, match=r"^few_shot\[0\] needs an 'answer' \(templated\) or a 'response'"):
        shot_response({"question": "q"}, "boxed", "few_shot[0]")
    with pytest.raises(ValueError, match=r"^few_shot\[1\] must be \{question: str, answer: str\}"):
        shot_response({"answer": 1}, "boxed", "few_shot[1]")


def test_the_rendered_prompt_ends_with_the_assistant_header():
    tok = load_tokenizer(resolve_model_dir("tiny-random", seed=0))
    ids = render_prompt_ids(tok, [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}])
    turns = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert tok.decode(ids) == turns + "<|im_start|>assistant\n"  # the model's turn is opened for it
