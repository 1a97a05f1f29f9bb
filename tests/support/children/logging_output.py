"""What llama.cpp's log writes to this process's stderr under each logging set-up (see
test_logging.py)."""

from __future__ import annotations

import contextlib
import logging
import sys

import harness

import llamactx


def silenced_logger(model: llamactx.LlamaModel) -> None:
    logger = logging.getLogger("llamactx")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    ctx = model.new_context(n_ctx=256)
    batch = llamactx.LlamaBatch(4)
    batch.add_sequence(model.str_to_token("Hello there"), 0, False)
    ctx.decode(batch)
    with contextlib.suppress(llamactx.DecodeError):
        ctx.decode(llamactx.LlamaBatch(1))  # llama.cpp logs an error for an empty batch
    print("done")


def unconfigured_logging(model: llamactx.LlamaModel) -> None:
    # n_ctx=300 with 2 sequences makes llama.cpp log a warning.
    model.new_context(n_ctx=300, n_seq_max=2)
    print("done")


def basic_config_debug(model: llamactx.LlamaModel) -> None:
    logging.basicConfig(level=logging.DEBUG)
    llamactx.LlamaModel.load_from_file(model.path, vocab_only=True)


def set_verbose_on_then_off(model: llamactx.LlamaModel) -> None:
    llamactx.set_verbose(True)
    llamactx.LlamaModel.load_from_file(model.path, vocab_only=True)
    sys.stderr.write("MARK")
    llamactx.set_verbose(False)
    llamactx.LlamaModel.load_from_file(model.path, vocab_only=True)


if __name__ == "__main__":
    harness.run(silenced_logger, unconfigured_logging, basic_config_debug, set_verbose_on_then_off)
