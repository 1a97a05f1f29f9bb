"""What the second red team (issue 27) found could kill, hang or mislead the process now works or
raises a typed exception: each case runs in a child process with a timeout
(``support/children/misuse_works_or_raises.py``), so a crash or a hang fails one test instead of pytest."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.processes import raised_alone

RAISES = {
    # 1. Recursion in constraint compilers
    "schema_chaining_3000_definitions": "none",
    "schema_chaining_3000_definitions_from_a_small_thread_stack": "none",
    "tool_parameters_chaining_3000_definitions": "none",
    "schema_of_references_up_to_the_limit": "none",
    "schema_past_the_limit": "SchemaError",
    "lark_of_5000_chained_rules": "none",
    "lark_of_chained_rules_up_to_the_limit": "none",
    "lark_past_the_limit": "SchemaError",
    # 2. A hostile RPC server
    "rpc_server_reporting_four_billion_devices": "RpcError",
    "rpc_server_reporting_no_device": "RpcError",
    # 3. Exponential grammars (GBNF given as text: test_gbnf.py)
    "tool_schema_whose_grammar_is_ambiguous": "none",
    # 5. Templates without a work limit
    "template_looping_ten_million_times": "ChatTemplateError",
    "template_looping_for_one_message": "none",
    "template_interrupted_by_ctrl_c": "none",
    "template_variables_nested_deeply": "none",
    "template_looping_as_a_variable_says": "none",
    # 6, 7, 9, 12. Waiting for one request in several ways at once, or from a fork
    "request_awaited_from_two_event_loops": "none",
    "request_iterated_from_two_threads": "none",
    "event_loops_awaiting_requests_keep_no_descriptors": "none",
    "result_of_a_request_inherited_by_a_fork": "ValueError",
}


@pytest.mark.parametrize(("case", "expected"), RAISES.items(), ids=list(RAISES))
def test_misuse_case_works_or_raises_instead_of_crashing(model_path: Path, case: str, expected: str) -> None:
    assert raised_alone(model_path, "misuse_works_or_raises", case, timeout=240) == expected
