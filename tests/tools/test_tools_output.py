"""Output capture: head and tail kept, middle counted, terminal noise removed."""

from __future__ import annotations

import re

from prorl_server.tool_server.output import ByteCapture, TextCapture, cap_text, clean_terminal_text, truncation_marker


def test_clean_terminal_text_drops_escapes_and_keeps_the_last_state_of_rewritten_lines() -> None:
    raw = "\x1b[1;31mError\x1b[0m\r\n\x1b]0;title\x0750%\r100%\rdone\r\nplain\n"
    assert clean_terminal_text(raw) == "Error\ndone\nplain\n"


def test_cap_text_keeps_short_text_whole() -> None:
    assert cap_text("abc", "", 0, 10) == ("abc", False)


def test_cap_text_keeps_head_and_tail_and_counts_the_rest() -> None:
    text, truncated = cap_text("0123456789" * 3, "", 0, 10)
    assert truncated
    assert text == "01234" + truncation_marker(20) + "56789"


def test_byte_capture_memory_is_bounded_and_the_count_is_in_characters() -> None:
    capture = ByteCapture(keep=4096)
    for _ in range(10_000):
        capture.feed("é".encode() * 512)  # 1024 bytes, 512 characters
    assert len(capture.head) == len(capture.tail) == 4096
    text, truncated = capture.text(max_output=100)
    assert truncated and text.startswith("é" * 50) and text.endswith("é" * 50)
    omitted = int(re.search(r"truncated: (\d+) more", text).group(1))
    assert omitted == 10_000 * 512 - 100


def test_byte_capture_can_drop_a_marker_at_the_end() -> None:
    capture = ByteCapture(keep=4096)
    capture.feed(b"x" * 5000 + b"MARKER")
    assert capture.last(6) == b"MARKER"
    capture.drop_last(6)
    assert capture.text(max_output=100_000) == ("x" * 5000, False)


def test_text_capture_counts_what_it_drops() -> None:
    capture = TextCapture(keep=4096)
    for _ in range(100):
        capture.feed("y" * 1000)
    text, truncated = capture.text(max_output=10)
    assert truncated and text == "yyyyy" + truncation_marker(100_000 - 10) + "yyyyy"
