"""Our adaptation of llama.cpp's server tests (``tools/server/tests/unit``), their OpenAI surface:
the same requests and assertions, rewritten for SmolLM2-135M-Instruct and run against either
``llamactx serve`` (by default) or llama.cpp's own server (with ``LLAMACTX_SUITE_PEER_PYTHON``);
``benches/server_suite.py`` runs both and tabulates them."""
