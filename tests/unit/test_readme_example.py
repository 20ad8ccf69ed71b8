"""The README shows the real, tested example script, not a copy that could drift from it."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readmes_script_is_examples_byo_torch_train_py_verbatim():
    readme = (ROOT / "README.md").read_text()
    header = "```python\n# examples/byo_torch/train.py\n"
    assert header in readme, "the README should show examples/byo_torch/train.py under this header"
    start = readme.index(header) + len(header)
    shown = readme[start : readme.index("```\n", start)]
    assert shown == (ROOT / "examples" / "byo_torch" / "train.py").read_text()
