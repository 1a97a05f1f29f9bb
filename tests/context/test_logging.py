"""llama.cpp's log reaches Python's logging (logger ``llamactx``), never stderr directly."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support.processes import run_child

import llamactx


def test_model_load_logs_to_the_llamactx_logger(model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="llamactx"):
        llamactx.LlamaModel.load_from_file(model_path, vocab_only=True).close()
    messages = [record.getMessage() for record in caplog.records if record.name == "llamactx"]
    assert any("general.architecture" in message or "llama" in message for message in messages)


def test_nothing_is_written_to_stderr_when_logging_is_silenced(model_path: Path) -> None:
    result = run_child(model_path, "logging_output", "silenced_logger")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert result.stderr == ""


def test_error_lines_reach_the_logger(ctx: llamactx.LlamaContext, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="llamactx"), pytest.raises(llamactx.DecodeError):
        ctx.decode(llamactx.LlamaBatch(1))
    assert any(record.levelno == logging.ERROR and "n_tokens == 0" in record.getMessage() for record in caplog.records)


def test_unconfigured_logging_prints_nothing(model_path: Path) -> None:
    # n_ctx=300 with 2 sequences makes llama.cpp log a warning; the library's NullHandler keeps
    # Python's "last resort" handler from printing it.
    result = run_child(model_path, "logging_output", "unconfigured_logging")
    assert result.returncode == 0
    assert result.stderr == ""


def test_basic_config_debug_shows_llama_cpp_lines(model_path: Path) -> None:
    result = run_child(model_path, "logging_output", "basic_config_debug")
    assert result.returncode == 0
    assert "DEBUG:llamactx:" in result.stderr or "INFO:llamactx:" in result.stderr
    assert "general.architecture" in result.stderr


def test_set_verbose_switches_the_log_on_and_off(model_path: Path) -> None:
    result = run_child(model_path, "logging_output", "set_verbose_on_then_off")
    assert result.returncode == 0
    before, _, after = result.stderr.partition("MARK")
    assert "llamactx INFO:" in before
    assert after.strip() == ""
