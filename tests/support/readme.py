"""The README's Python examples, which the tests run as written (``project/test_readme.py``; the
Ray example in ``distributed/ray_cases.py``, on the Ray tests' Ray, which its ``ray.init``'s
arguments start)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
#: The example that starts a local Ray.
RAY_EXAMPLE = "import ray"
