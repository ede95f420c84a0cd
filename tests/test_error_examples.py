"""The first message of each kind of failure: kept per step (one function for rewards, verdicts and
agent episodes), listed in the report over the run, and printed once per run, a resume included."""

from __future__ import annotations

import io
import json
import re
from html import escape
from pathlib import Path

from rich.console import Console

from streamrl.config import Config
from streamrl.loop.episode_errors import EpisodeErrors
from streamrl.loop.run_dir import reconcile_logs
from streamrl.loop.step_metrics import first_messages
from streamrl.observe.error_examples import MESSAGE_CHARS, fit_message
from streamrl.observe.live import RunObserver
from streamrl.observe.report import write_report
from streamrl.types import Group, Problem


def test_first_messages_keeps_each_reasons_first_message_after_the_known_ones():
    failures = [
        (None, "not a failure"),
        ("KeyError", "KeyError: 'a'"),
        ("", "not a failure either"),
        ("KeyError", "KeyError: 'b'"),
        ("timeout", ""),
        ("ValueError", "v" * (MESSAGE_CHARS + 7)),
    ]
    assert first_messages(failures) == {
        "KeyError": "KeyError: 'a'",
        "timeout": "timeout",  # no message: the reason's name
        "ValueError": "v" * (MESSAGE_CHARS - 3) + "...",  # cut as fit_message cuts
    }
    known = {"KeyError": "KeyError: 'old'"}
    got = first_messages([("KeyError", "KeyError: 'new'"), ("OSError", "OSError: e")], known)
    assert list(got.items()) == [("KeyError", "KeyError: 'old'"), ("OSError", "OSError: e")]
    assert known == {"KeyError": "KeyError: 'old'"}  # not changed in place


WHERE = " (reward function f, problem p1)"


def test_a_kept_message_is_one_line_with_its_head_and_tail_whole():
    assert fit_message("ValueError: ", "bad row\n   at line 2\n\n", WHERE) == (
        "ValueError: bad row at line 2 (reward function f, problem p1)"
    )
    cut = fit_message("ValueError: ", "v" * 1000, WHERE)
    assert cut == "ValueError: " + "v" * (MESSAGE_CHARS - 15 - len(WHERE)) + "..." + WHERE
    assert len(cut) == MESSAGE_CHARS


def test_a_message_of_line_breaks_reads_as_none_and_a_tail_keeps_its_space():
    from streamrl.rollout.score import error_message

    assert fit_message("E: ", "x", " (problem a\nb)") == "E: x (problem a b)"
    assert error_message("KeyError", "\n\n", fn="f") == "KeyError: (no message) (reward function f)"
    assert first_messages([("OSError", "\n \n")]) == {"OSError": "OSError"}


def test_a_head_and_tail_too_long_for_the_message_keep_its_start_and_the_tails_end():
    """A problem id of 600 characters: the middle goes, the message still ends as its tail does."""
    got = fit_message("KeyError: ", "'x'", " (problem " + "p" * 600 + ")")
    assert got == "KeyError: 'x' (problem " + "p" * 226 + "..." + "p" * 247 + ")"
    assert len(got) == MESSAGE_CHARS


def test_a_kept_message_is_never_cut_twice():
    """first_messages fits every message again: one fit_message built comes through unchanged (before,
    a backstop cut its last characters off: the tail naming the problem)."""
    kept = [
        fit_message("ValueError: ", "v" * 1000, WHERE),
        fit_message("KeyError: ", "'x'", " (problem " + "p" * 600 + ")"),
        fit_message("E: ", "a\nb"),
    ]
    for message in kept:
        assert fit_message("", message) == message
        assert first_messages([("E", message)]) == {"E": message}


def test_a_scorers_long_message_reads_as_if_cut_once():
    """The worker bounds the message it sends back (fit_message); the step record's message, cut again
    for its reason and where, is the one the whole exception message would give."""
    from streamrl.rewards.workers import call_scorer
    from streamrl.rollout.score import error_message

    text = "Traceback line\n" + "y" * 2000

    def raises(*args: object) -> float:
        raise RuntimeError(text)

    status, reason, detail, kept = call_scorer(raises, ())
    assert (status, reason, kept) == ("err", "RuntimeError", {})
    assert detail == "Traceback line " + "y" * 482 + "..."
    message = error_message(reason, detail, fn="f", problem="p1")
    assert message == error_message(reason, text, fn="f", problem="p1")
    ys = MESSAGE_CHARS - len("RuntimeError: Traceback line ...") - len(WHERE)
    assert message == "RuntimeError: Traceback line " + "y" * ys + "..." + WHERE


def test_episode_errors_keep_each_reasons_first_message_across_groups():
    problem = Problem("p", [], "1")
    errors = EpisodeErrors(active=True)
    errors.add(
        Group(
            problem,
            [],
            episode_errors=["ConnectionError", ""],
            episode_error_details=["ConnectionError: a", ""],
        )
    )
    errors.add(Group(problem, [], episode_errors=["ConnectionError", "TimeoutError"]))  # no messages kept
    errors.add(Group(problem, []))  # not an agent group
    assert errors.pending()["examples"] == {
        "ConnectionError": "ConnectionError: a",
        "TimeoutError": "TimeoutError",
    }
    assert errors.take() == {
        "episodes": 4,
        "episode_errors": 3,
        "episode_error_reasons": {"ConnectionError": 2, "TimeoutError": 1},
        "episode_error_examples": {"ConnectionError": "ConnectionError: a", "TimeoutError": "TimeoutError"},
    }
    assert errors.take()["episode_error_examples"] == {}


def _run(path: Path, rows: list[dict]) -> Path:
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps({"reward_mean": 0.5, **r}) + "\n" for r in rows))
    return path


def _section(html: str) -> str:
    """The report's error messages section (up to the next heading), "" when it has none."""
    found = re.search(r"<h2>Error messages</h2>(.*?)<h2>", html, re.S)
    return found.group(1) if found else ""


def test_the_report_lists_each_kinds_first_message_its_first_step_and_its_steps(tmp_path: Path):
    hostile = "ValueError: <script>alert('x')</script> & \"q\""
    run = _run(
        tmp_path / "run",
        [
            {"step": 1},
            {"step": 2, "reward_error_examples": {"KeyError": "KeyError: 'a'"}},
            {"step": 3, "reward_error_examples": {"KeyError": "KeyError: 'b'", "ValueError": hostile}},
            {"step": 4, "episode_error_examples": {"OSError": "OSError: gone"}, "reward_error_examples": {}},
            {"step": 5, "reward_error_examples": {"KeyError": "KeyError: 'c'"}},
        ],
    )
    html = write_report([run]).read_text()
    rows = re.findall(r"<tr>(.*?)</tr>", _section(html))
    assert rows == [
        "<th>kind</th><th>reason</th><th>first message</th><th>first at step</th><th>steps with it</th>",
        "<td>reward error (scored 0)</td><td>KeyError</td><td>KeyError: &#x27;a&#x27;</td>"
        "<td>2</td><td>3</td>",
        f"<td>reward error (scored 0)</td><td>ValueError</td><td>{escape(hostile)}</td><td>3</td><td>1</td>",
        "<td>agent episode error</td><td>OSError</td><td>OSError: gone</td><td>4</td><td>1</td>",
    ]
    assert (
        "<script>" not in html
        and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;q&quot;" in html
    )


def test_the_report_has_no_error_messages_section_without_errors(tmp_path: Path):
    run = _run(tmp_path / "run", [{"step": 1, "reward_error_examples": {}}, {"step": 2}])
    assert "Error messages" not in write_report([run]).read_text()


def test_a_compared_runs_error_messages_name_their_run(tmp_path: Path):
    a = _run(tmp_path / "a", [{"step": 1, "verdict_error_examples": {"KeyError": "KeyError: 'v'"}}])
    b = _run(tmp_path / "b", [{"step": 1}])
    rows = re.findall(r"<tr>(.*?)</tr>", _section(write_report([a, b]).read_text()))
    assert rows[1:] == [
        "<td>a</td><td>task verdict error (counted wrong)</td><td>KeyError</td>"
        "<td>KeyError: &#x27;v&#x27;</td><td>1</td><td>1</td>"
    ]


def test_a_resume_prints_no_earlier_example_and_an_orphaned_steps_only_when_it_recurs(tmp_path: Path):
    """Resumed from step 2's state: the kept steps' kinds were printed and are not printed again; step 3
    was logged before the crash but never saved (moved to metrics.jsonl.orphaned), so its kind is printed
    when the run meets it again, not when the resume reads the old rows."""
    run = _run(
        tmp_path / "run",
        [
            {"step": 1, "reward_error_examples": {"KeyError": "KeyError: 'a'"}},
            {"step": 2, "episode_error_examples": {"OSError": "OSError: b"}},
            {"step": 3, "reward_error_examples": {"timeout": "timeout: slow"}},
        ],
    )
    assert reconcile_logs(run, 2) == {"metrics.jsonl": 1}
    out = io.StringIO()
    cfg = Config()
    cfg.observe.report_every = 0
    observer = RunObserver(cfg, run, Console(file=out, width=1000, color_system=None), purge_step=3)
    try:
        assert out.getvalue() == ""  # the resume itself prints nothing of the old rows
        observer.on_step(
            {
                "step": 3,
                "reward_error_examples": {"KeyError": "KeyError: 'c'", "timeout": "timeout: slower"},
                "episode_error_examples": {"OSError": "OSError: d"},
            }
        )
        assert out.getvalue().splitlines() == [
            "reward error (scored 0) at step 3, the first timeout: timeout: slower"
        ]
    finally:
        observer.close()
