"""Prompts whose answers on the real model (SmolLM2-135M-Instruct) the tests know, and a chat
template."""

import re
from pathlib import Path

#: Greedy continues it with " Paris".
PARIS_PROMPT = "The capital of France is"
#: A system turn for chats that expect a right answer: without one, SmolLM2's template writes its
#: own ("You are a helpful AI assistant named SmolLM..."), after which this small model answers
#: "What is the capital of France?" off the mark.
HELPFUL = "You are a helpful assistant."
#: A ChatML chat template written for the tests, with a tool-call format of its own (the
#: ``<tool_call>`` style), so that tools go through llama.cpp's format analysis.
TOOL_TEMPLATE = (Path(__file__).resolve().parent / "templates" / "chatml_tools.jinja").read_text()
#: A template in Functionary v3.2's recipient format (written for the tests): each assistant
#: message opens with ``>>>all`` before text or ``>>>NAME`` before a call's JSON arguments, so
#: llama.cpp's analysis gives it Functionary's parser and its look-ahead trigger ``>>>(?!all)``.
RECIPIENTS_TEMPLATE = (Path(__file__).resolve().parent / "templates" / "recipients.jinja").read_text()
#: ChatML whose replies reason first: the generation prompt opens a ``<think>`` block (closed
#: empty when ``enable_thinking`` is false), and earlier replies show their ``reasoning_content``
#: in one, so that llama.cpp's analysis finds the reasoning tags (as DeepSeek-R1's template); a
#: ``reasoning_effort`` variable is a system turn.
#: A reranker's prompt in Qwen3-Reranker's shape (ChatML turns asking for "yes" or "no"), for
#: ``synthetic.write_qwen3_reranker``: GGUF's ``tokenizer.chat_template.rerank``, whose
#: ``{query}`` and ``{document}`` llama-server fills in.
RERANK_TEMPLATE = (
    "<|im_start|>system\nAnswer only yes or no: does the document answer the query?<|im_end|>\n"
    "<|im_start|>user\nQuery: {query}\nDocument: {document}<|im_end|>\n<|im_start|>assistant\n"
)
THINKING_TEMPLATE = (Path(__file__).resolve().parent / "templates" / "thinking.jinja").read_text()
#: ``TOOL_TEMPLATE`` whose replies think first, as Qwen3's: llama.cpp finds both its tool format and
#: its reasoning block.
THINKING_TOOLS_TEMPLATE = (Path(__file__).resolve().parent / "templates" / "thinking_tools.jinja").read_text()
#: ChatML without the default system turn SmolLM2's own template adds: a chat_template that
#: renders the same messages to another prompt.
PLAIN_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: ``PLAIN_CHATML`` with two variables a request may set (``chat_template_kwargs``): a system turn
#: of ``greeting``, and an empty thinking block opening the reply unless ``enable_thinking``.
CHATML_WITH_VARIABLES = (
    "{% if greeting is defined %}<|im_start|>system\n{{ greeting }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
#: The question ``make demo`` asks (the Makefile's ``QUESTION``), and the default model's greedy
#: answer on every CPU build the wheel ships.
DEMO_QUESTION = re.findall(
    r"^QUESTION \?= (.+)$", (Path(__file__).resolve().parents[2] / "Makefile").read_text(), re.MULTILINE
)[0]
DEMO_ANSWER = "The capital of France is Paris."
