"""The engine in a process of its own: Ctrl-C while the main thread waits on a request, and an
interpreter that exits while a thread still waits on one (see test_engine.py)."""

from __future__ import annotations

import os
import threading
import time

import harness

import llamactx

LONG = "Count from one to a thousand: one, two, three,"


def ctrl_c_while_waiting(model: llamactx.LlamaModel) -> None:
    engine = llamactx.Engine(model, n_ctx=1024, n_seq_max=2)
    request = engine.submit(LONG, max_tokens=400)
    sent = harness.press_ctrl_c_soon()
    try:
        request.result()
        print("RESULT finished")
    except KeyboardInterrupt:
        latency_ms = (time.perf_counter() - sent[0]) * 1000
        completion = request.result(timeout=30)
        print("RESULT interrupted", latency_ms, completion.finish_reason)
    print("AFTER", engine.submit("One, two,", max_tokens=4).result().finish_reason)
    engine.close()


def exit_while_a_thread_waits(model: llamactx.LlamaModel) -> None:
    engine = llamactx.Engine(model, n_ctx=1024, n_seq_max=1)
    requests = [engine.submit(LONG, max_tokens=5000 // 10) for _ in range(3)]

    def wait(request: llamactx.Request) -> None:
        print("ENDED", request.result().finish_reason, flush=True)

    threading.Thread(target=wait, args=(requests[-1],)).start()  # not a daemon: exit waits for it
    print("EXITING", flush=True)


def submit_after_fork(model: llamactx.LlamaModel) -> None:
    engine = llamactx.Engine(model, n_ctx=512, n_seq_max=1)
    child = os.fork()
    if child == 0:
        try:
            engine.submit("One, two,", max_tokens=4)
            print("CHILD submitted", flush=True)
        except ValueError as error:
            print("CHILD refused", "forked" in str(error), flush=True)
        os._exit(0)
    os.waitpid(child, 0)
    print("PARENT", engine.submit("One, two,", max_tokens=4).result().finish_reason)
    engine.close()


if __name__ == "__main__":
    harness.run(ctrl_c_while_waiting, exit_while_a_thread_waits, submit_after_fork)
