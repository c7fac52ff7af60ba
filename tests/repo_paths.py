"""Where the repository's parts are, for test modules at any depth under tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DOCS = REPO / "docs"
EXAMPLES = REPO / "examples"
BENCHMARKS = REPO / "benchmarks"
TEST_FIXTURES = TESTS / "fixtures"
