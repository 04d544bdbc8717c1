"""``tss_opt.progress``: bars on a terminal only, ``TQDM_DISABLE`` honoured, log lines above bars.

A "terminal" here is a text buffer that says it is one (``isatty() -> True``), the way tqdm
decides; tests/search/test_search_progress.py runs a real command on a pseudo-terminal.
"""

from __future__ import annotations

import io
import logging
import sys

import pytest

from tss_opt.progress import bars_and_logs, bars_shown, progress_bar, prompt_bar, prompts_done


class FakeTTY(io.StringIO):
    """A text buffer that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TQDM_DISABLE", raising=False)


def test_a_bar_is_drawn_on_a_terminal_and_nothing_elsewhere() -> None:
    tty, log = FakeTTY(), io.StringIO()
    for stream in (tty, log):
        bar = progress_bar(5, "level 1", unit="trial", file=stream, mininterval=0)
        for _ in range(3):
            bar.update(1)
        bar.close()
    assert "\r" in tty.getvalue() and "level 1" in tty.getvalue() and "3/5" in tty.getvalue()
    assert log.getvalue() == ""  # a log file or a CI runner gets no bar at all


@pytest.mark.parametrize("value", ["1", "true", "True"])
def test_tqdm_disable_turns_bars_off_even_on_a_terminal(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TQDM_DISABLE", value)
    tty = FakeTTY()
    assert not bars_shown(tty)
    with progress_bar(3, "x", file=tty) as bar:
        bar.update(3)
    assert tty.getvalue() == ""


@pytest.mark.parametrize("value", ["", "0", "false"])
def test_a_false_tqdm_disable_leaves_bars_on(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TQDM_DISABLE", value)
    assert bars_shown(FakeTTY()) and not bars_shown(io.StringIO())


def test_the_callers_switch_wins() -> None:
    tty = FakeTTY()
    with progress_bar(3, "x", file=tty, enabled=False) as bar:
        bar.update(3)
    assert tty.getvalue() == ""


def test_evaluators_advance_the_open_prompt_bar_and_nothing_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    prompts_done(4)  # no bar open: nothing happens
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    with prompt_bar(8, "validation", leave=True) as bar:
        prompts_done(4)
        prompts_done(2)
        assert bar.n == 6
    prompts_done(1)  # closed: no longer advanced
    assert bar.n == 6 and "6/8" in tty.getvalue()


def test_console_log_lines_go_above_the_bars_with_their_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """While bars are drawn a console handler's lines pass through tqdm.write (format, level and
    filters kept: the storage-password filter must not be lost); off a terminal nothing changes."""
    out, tty = io.StringIO(), FakeTTY()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", tty)
    logger = logging.getLogger("tss_opt.test_progress")
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    handler.addFilter(lambda r: "secret" not in r.getMessage())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        with bars_and_logs():
            assert logger.handlers[0] is not handler  # replaced while inside
            with progress_bar(2, "level 1", mininterval=0) as bar:
                bar.update(1)
                logger.info("trial #1 done")
                logger.info("secret password")
                bar.update(1)
        assert logger.handlers == [handler]  # restored
        assert out.getvalue() == "[INFO] trial #1 done\n"
        assert "level 1" in tty.getvalue()
        monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: handlers untouched
        with bars_and_logs():
            assert logger.handlers == [handler]
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def test_library_bars_are_off_without_a_terminal_and_kept_on_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers and huggingface_hub draw their own bars into a log file (GGUF conversion,
    "Loading weights"); a model load turns them off there, never on a terminal."""
    import transformers.utils.logging as tl
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars

    from tss_opt.progress import quiet_library_bars

    try:
        # On (a model loaded earlier in this session without a terminal may have turned them
        # off): on a terminal they must stay on.
        tl.enable_progress_bar()
        enable_progress_bars()
        monkeypatch.setattr(sys, "stderr", FakeTTY())
        quiet_library_bars()
        assert tl.is_progress_bar_enabled() and not are_progress_bars_disabled()
        monkeypatch.setattr(sys, "stderr", io.StringIO())
        quiet_library_bars()
        assert not tl.is_progress_bar_enabled() and are_progress_bars_disabled()
    finally:
        tl.enable_progress_bar()
        enable_progress_bars()


def test_a_librarys_unswitchable_bar_is_dropped_off_a_terminal_and_its_other_output_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tqdm import tqdm

    from tss_opt.progress import held_library_bars

    for stream in (io.StringIO(), FakeTTY()):
        monkeypatch.setattr(sys, "stderr", stream)
        with held_library_bars():
            for _ in tqdm(range(300), desc="Converting and de-quantizing GGUF tensors...", mininterval=0):
                pass
            print("a warning the library printed", file=sys.stderr)
        text = stream.getvalue()
        assert "a warning the library printed" in text
        assert ("Converting" in text) is isinstance(stream, FakeTTY)
