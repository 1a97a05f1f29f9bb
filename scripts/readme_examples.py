"""Writes the README's Python examples to DIRECTORY/example_N.py, for mypy --strict."""

import re
import sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
target = Path(sys.argv[1])
target.mkdir(parents=True, exist_ok=True)
examples = re.findall(r"```python\n(.*?)```", (root / "README.md").read_text(), flags=re.DOTALL)
for n, code in enumerate(examples):
    (target / f"example_{n}.py").write_text(code)
print(f"{len(examples)} examples in {target}")
