"""An OpenAI-compatible HTTP server on the ``Engine``, which also speaks Anthropic's Messages API
(install ``llamactx[server]``).

``create_app(engine)`` returns the ASGI application; ``llamactx serve`` runs it with uvicorn.
"""

from llamactx.server._app import create_app
from llamactx.server._media_urls import MediaUrlPolicy
from llamactx.server._slots import SlotFiles

__all__ = ["MediaUrlPolicy", "SlotFiles", "create_app"]
