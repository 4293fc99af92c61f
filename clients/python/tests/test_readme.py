"""The README's example is the file the live tests run (``integration/readme_example.py``),
character for character, and at most 20 lines."""

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def test_the_readme_example_is_the_file_the_live_tests_run():
    readme = (PACKAGE / "README.md").read_text("utf-8")
    start = readme.index("```python\n") + len("```python\n")
    end = readme.index("\n```\n", start) + 1
    block = readme[start:end]
    example = (PACKAGE / "tests" / "integration" / "readme_example.py").read_text("utf-8")
    assert block == example
    assert block.count("\n") <= 20
