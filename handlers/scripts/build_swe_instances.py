"""Build the swe handler's instances (`prorl_handlers/swe/data/instances.jsonl`) from the bugs described here.

Each bug names a repository under `prorl_handlers/swe/data/repos/` (its files are the buggy base, with every
bug of that repository present), a gold fix and the tests that show the bug, both as text edits. For each,
in a temporary copy of the repository built as the handler builds it (same commit id, the `base_commit`):
`patch` is the diff of the fix, `test_patch` the diff of the tests, and the tests run twice, with the test
patch alone and with both patches: FAIL_TO_PASS failed then passed, PASS_TO_PASS passed both times, and
every test must pass with the fix.

    python handlers/scripts/build_swe_instances.py          # rewrite instances.jsonl
    python handlers/scripts/build_swe_instances.py --check  # only check that it is up to date
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from prorl_handlers.swe.instance import INSTANCES_FILE
from prorl_handlers.swe.repo import build_local

REPOS_DIR = INSTANCES_FILE.parent / "repos"
Edits = dict[str, list[tuple[str, str]]]  # path -> (old, new) replacements; old "" appends new


@dataclass
class Bug:
    """One instance: a bug of a repository, its fix and the tests that show it."""

    instance_id: str
    repo: str
    problem_statement: str
    fix: Edits
    tests: Edits = field(default_factory=dict)


BUGS = [
    Bug(
        "textkit-1",
        "textkit",
        """slugify(max_length=...) can return a slug ending with a separator

When the cut made by `max_length` falls right after a word, the slug ends with the separator:

```python
>>> from textkit import slugify
>>> slugify("Hello World", max_length=6)
'hello-'
```

I expected `'hello'`. Without `max_length` a slug never starts or ends with the separator, and we now
get URLs like `/posts/hello-`.
""",
        {
            "textkit/slug.py": [
                ("        slug = slug[:max_length]", "        slug = slug[:max_length].rstrip(separator)")
            ]
        },
        {
            "tests/test_slug.py": [
                (
                    "",
                    """

def test_max_length_does_not_leave_a_trailing_separator():
    assert slugify("Hello World", max_length=6) == "hello"


def test_max_length_with_a_custom_separator():
    assert slugify("one two three", separator="_", max_length=8) == "one_two"
""",
                )
            ]
        },
    ),
    Bug(
        "textkit-2",
        "textkit",
        """wrap() breaks lines one character too early

```python
>>> from textkit import wrap
>>> wrap("hello world", 11)
['hello', 'world']
```

"hello world" has exactly 11 characters, so it fits on one line of width 11. In general no line
produced by `wrap` ever reaches the full width.
""",
        {
            "textkit/wrap.py": [
                (
                    "        elif len(current) + 1 + len(word) < width:",
                    "        elif len(current) + 1 + len(word) <= width:",
                )
            ]
        },
        {
            "tests/test_wrap.py": [
                (
                    "",
                    """

def test_a_line_may_have_exactly_width_characters():
    assert wrap("hello world", 11) == ["hello world"]


def test_lines_fill_up_to_the_width():
    assert wrap("aaa bbb ccc ddd", 7) == ["aaa bbb", "ccc ddd"]
""",
                )
            ]
        },
    ),
    Bug(
        "textkit-3",
        "textkit",
        """truncate() returns strings longer than the limit

```python
>>> from textkit import truncate
>>> truncate("hello world", 8)
'hello wo...'
```

That is 11 characters for a limit of 8. The suffix should count towards the limit (`'hello...'`),
also with a custom suffix, and the result must fit even when the limit is shorter than the suffix.
Texts that already fit must stay unchanged.
""",
        {
            "textkit/wrap.py": [
                (
                    "    return text[:limit] + suffix\n",
                    "    keep = max(limit - len(suffix), 0)\n    return (text[:keep] + suffix)[:limit]\n",
                )
            ]
        },
        {
            "tests/test_truncate.py": [
                (
                    "",
                    """

def test_result_fits_the_limit():
    assert truncate("hello world", 8) == "hello..."
    assert len(truncate("a" * 100, 10)) == 10


def test_a_custom_suffix_counts_towards_the_limit():
    assert truncate("hello world", 6, suffix="…") == "hello…"


def test_limit_shorter_than_the_suffix():
    assert truncate("hello world", 2) == ".."
""",
                )
            ]
        },
    ),
    Bug(
        "intervals-1",
        "intervals",
        """merge() does not join intervals that touch

Intervals are closed, so `[1, 3]` and `[3, 5]` share the point 3 and their union is `[1, 5]`; the
docstring of `merge` even says touching intervals are joined. But:

```python
>>> merge([Interval(1, 3), Interval(3, 5)])
[Interval(start=1, end=3), Interval(start=3, end=5)]
```
""",
        {"intervals/ops.py": [("interval.start < merged[-1].end", "interval.start <= merged[-1].end")]},
        {
            "tests/test_ops.py": [
                (
                    "",
                    """

def test_merge_joins_touching_intervals():
    assert merge([Interval(3, 5), Interval(1, 3)]) == [Interval(1, 5)]


def test_merge_absorbs_a_point_at_the_end_of_an_interval():
    assert merge([Interval(1, 2), Interval(2, 2)]) == [Interval(1, 2)]
""",
                )
            ]
        },
    ),
    Bug(
        "intervals-2",
        "intervals",
        """Interval.intersection raises ValueError for disjoint intervals

```python
>>> Interval(1, 2).intersection(Interval(3, 4))
Traceback (most recent call last):
  ...
ValueError: interval end 2 is before its start 3
```

The docstring says it returns None when the intervals are disjoint.
""",
        {
            "intervals/interval.py": [
                (
                    "        return Interval(max(self.start, other.start), min(self.end, other.end))\n",
                    "        start, end = max(self.start, other.start), min(self.end, other.end)\n"
                    "        return Interval(start, end) if start <= end else None\n",
                )
            ]
        },
        {
            "tests/test_interval.py": [
                (
                    "",
                    """

def test_intersection_of_disjoint_intervals_is_none():
    assert Interval(1, 2).intersection(Interval(3, 4)) is None
    assert Interval(3, 4).intersection(Interval(1, 2)) is None


def test_intersection_of_touching_intervals_is_a_point():
    assert Interval(1, 2).intersection(Interval(2, 4)) == Interval(2, 2)
""",
                )
            ]
        },
    ),
    Bug(
        "intervals-3",
        "intervals",
        """`in` excludes the end of an interval

Intervals are documented as closed, `[start, end]`, yet

```python
>>> 3 in Interval(2, 3)
False
>>> 5 in Interval(5, 5)
False
```

so a single-point interval contains nothing at all.
""",
        {"intervals/interval.py": [("self.start <= value < self.end", "self.start <= value <= self.end")]},
        {
            "tests/test_interval.py": [
                (
                    "",
                    """

def test_endpoints_are_contained():
    assert 2 in Interval(2, 3)
    assert 3 in Interval(2, 3)


def test_a_point_interval_contains_its_point():
    assert 5 in Interval(5, 5)
""",
                )
            ]
        },
    ),
    Bug(
        "minicsv-1",
        "minicsv",
        '''parse_line() loses doubled quotes inside quoted fields

In CSV a quote inside a quoted field is written twice (RFC 4180), and that is what `format_row` writes,
but it does not read back:

```python
>>> from minicsv import format_row, parse_line
>>> format_row(['say "hi"'])
'"say ""hi"""'
>>> parse_line(format_row(['say "hi"']))
['say hi']
```
''',
        {
            "minicsv/reader.py": [
                (
                    """    quoted = False
    for char in line:
        if quoted:
            if char == QUOTE:
                quoted = False
            else:
                field.append(char)
        elif char == QUOTE:
            quoted = True
""",
                    """    quoted = closed_quote = False
    for char in line:
        if quoted:
            if char == QUOTE:
                quoted, closed_quote = False, True
                continue
            field.append(char)
        elif char == QUOTE:
            if closed_quote:  # a doubled quote inside a quoted field
                field.append(QUOTE)
            quoted = True
""",
                ),
                (
                    "        else:\n            field.append(char)\n",
                    "        else:\n            field.append(char)\n        closed_quote = False\n",
                ),
            ]
        },
        {
            "tests/test_reader.py": [
                (
                    "from minicsv import parse, parse_line, read_dicts",
                    "from minicsv import format_row, parse, parse_line, read_dicts",
                ),
                (
                    "",
                    '''

def test_doubled_quotes_inside_a_quoted_field():
    assert parse_line('"say ""hi""",x') == ['say "hi"', "x"]


def test_written_rows_read_back():
    row = ['a "quoted" word', "plain", 'x,"y"', ""]
    assert parse_line(format_row(row)) == row


def test_empty_quoted_field():
    assert parse_line('"",a') == ["", "a"]
''',
                ),
            ]
        },
    ),
    Bug(
        "minicsv-2",
        "minicsv",
        """parse() returns an extra empty row when the text ends with a line break

Nearly every CSV file ends with a newline, and each time `parse` adds a row `['']`:

```python
>>> parse("a,b\\n1,2\\n")
[['a', 'b'], ['1', '2'], ['']]
```

Files with Windows line endings (`\\r\\n`) are worse: the last field of every row keeps the `\\r`.
`parse("")` should be `[]`, too.
""",
        {"minicsv/reader.py": [('for line in text.split("\\n")]', "for line in text.splitlines()]")]},
        {
            "tests/test_reader.py": [
                (
                    "",
                    """

def test_a_final_line_break_adds_no_row():
    assert parse("a,b\\n1,2\\n") == [["a", "b"], ["1", "2"]]


def test_windows_line_breaks():
    assert parse("a,b\\r\\n1,2\\r\\n") == [["a", "b"], ["1", "2"]]


def test_empty_text_has_no_rows():
    assert parse("") == []
""",
                )
            ]
        },
    ),
    Bug(
        "minicsv-3",
        "minicsv",
        """read_dicts() drops the keys of missing fields

The docstring of `read_dicts` says that a row with fewer fields than the header gets None for the
missing ones, but the keys are simply absent:

```python
>>> read_dicts("name,age,city\\nAda,36")
[{'name': 'Ada', 'age': '36'}]
```

so `row["city"]` raises KeyError.
""",
        {
            "minicsv/reader.py": [
                (
                    "    return [dict(zip(header, row)) for row in body]",
                    "    return [{key: row[i] if i < len(row) else None for i, key in enumerate(header)} for row in body]",
                )
            ]
        },
        {
            "tests/test_reader.py": [
                (
                    "",
                    """

def test_read_dicts_fills_missing_fields_with_none():
    assert read_dicts("name,age,city\\nAda,36\\nAlan,41,London") == [
        {"name": "Ada", "age": "36", "city": None},
        {"name": "Alan", "age": "41", "city": "London"},
    ]
""",
                )
            ]
        },
    ),
    Bug(
        "cachekit-1",
        "cachekit",
        """LRUCache evicts entries that were just read

The docstring says that a `get` hit counts as a use, but only `put` does:

```python
cache = LRUCache(2)
cache.put("a", 1)
cache.put("b", 2)
cache.get("a")      # "a" is now the most recently used
cache.put("c", 3)   # should evict "b"
"a" in cache        # False: "a" was evicted
```

This makes `@memoize` recompute its hottest keys.
""",
        {
            "cachekit/lru.py": [
                (
                    "            self.hits += 1\n            return self._data[key]\n",
                    "            self.hits += 1\n            self._data.move_to_end(key)\n            return self._data[key]\n",
                )
            ]
        },
        {
            "tests/test_lru.py": [
                (
                    "",
                    """

def test_get_counts_as_a_use():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert "a" in cache and "b" not in cache
""",
                )
            ]
        },
    ),
    Bug(
        "cachekit-2",
        "cachekit",
        """TTLCache still returns an entry at the moment it expires

The class docstring says an entry is gone from the moment the clock reaches set time + ttl, but it is
returned at exactly that time, and `TTLCache(0)` caches values instead of never returning them:

```python
cache = TTLCache(0, clock=lambda: 100.0)
cache.set("k", "v")
cache.get("k")  # 'v', expected None
```
""",
        {"cachekit/ttl.py": [("if self._clock() > expires:", "if self._clock() >= expires:")]},
        {
            "tests/test_ttl.py": [
                (
                    "",
                    """

def test_value_is_gone_exactly_at_expiry():
    clock = FakeClock()
    cache = TTLCache(10, clock=clock)
    cache.set("k", "v")
    clock.now += 10
    assert cache.get("k", "gone") == "gone"


def test_zero_ttl_never_returns_a_value():
    cache = TTLCache(0, clock=FakeClock())
    cache.set("k", "v")
    assert cache.get("k") is None
""",
                )
            ]
        },
    ),
    Bug(
        "cachekit-3",
        "cachekit",
        """memoize confuses a tuple argument with keyword arguments

```python
@memoize()
def describe(*args, **kwargs):
    return args, kwargs

describe(a=1)         # ((), {'a': 1})
describe(("a", 1))    # ((), {'a': 1})  <- the cached result of the first call!
```

Also, `f(a=1, b=2)` and `f(b=2, a=1)` are cached separately although they are the same call.
""",
        {
            "cachekit/memo.py": [
                ("key = args + tuple(kwargs.items())", "key = (args, tuple(sorted(kwargs.items())))"),
            ]
        },
        {
            "tests/test_memo.py": [
                (
                    "",
                    """

def test_a_tuple_argument_is_not_confused_with_keyword_arguments():
    @memoize()
    def describe(*args, **kwargs):
        return args, kwargs

    assert describe(a=1) == ((), {"a": 1})
    assert describe(("a", 1)) == ((("a", 1),), {})


def test_keyword_order_does_not_matter():
    calls = []

    @memoize()
    def add(a=0, b=0):
        calls.append((a, b))
        return a + b

    assert add(a=1, b=2) == add(b=2, a=1) == 3
    assert len(calls) == 1
""",
                )
            ]
        },
    ),
    Bug(
        "semverlite-1",
        "semverlite",
        """A pre-release sorts after its release

```python
>>> Version.parse("1.0.0-alpha") < Version.parse("1.0.0")
False
```

Per semver.org §11, a pre-release version has lower precedence than the associated normal version:
1.0.0-alpha < 1.0.0-rc.1 < 1.0.0 < 1.0.1-alpha. `sorted()` of our release list puts 1.0.0 before 1.0.0-rc.1.
""",
        {
            "semverlite/version.py": [
                (
                    "        return (self.major, self.minor, self.patch, self.prerelease)",
                    "        return (self.major, self.minor, self.patch, not self.prerelease, self.prerelease)",
                )
            ]
        },
        {
            "tests/test_version.py": [
                (
                    "",
                    """

def test_a_prerelease_comes_before_its_release():
    assert Version.parse("1.0.0-alpha") < Version.parse("1.0.0")
    assert Version.parse("1.0.0-rc.1") < Version.parse("1.0.0") < Version.parse("1.0.1-alpha")


def test_sorting_puts_prereleases_first():
    versions = [Version.parse(v) for v in ["1.0.0", "1.0.0-rc.1", "0.9.0", "1.0.0-beta"]]
    assert [str(v) for v in sorted(versions)] == ["0.9.0", "1.0.0-beta", "1.0.0-rc.1", "1.0.0"]
""",
                )
            ]
        },
    ),
    Bug(
        "semverlite-2",
        "semverlite",
        """Numeric pre-release identifiers are compared as strings

```python
>>> Version.parse("1.0.0-alpha.10") < Version.parse("1.0.0-alpha.2")
True
```

semver.org §11.4: identifiers consisting of only digits are compared numerically, and numeric
identifiers have lower precedence than alphanumeric ones. So alpha.2 < alpha.10 and 1.0.0-9 < 1.0.0-10.
""",
        {
            "semverlite/version.py": [
                (
                    "        return (self.major, self.minor, self.patch, self.prerelease)",
                    '        prerelease = tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in self.prerelease)\n'
                    "        return (self.major, self.minor, self.patch, prerelease)",
                )
            ]
        },
        {
            "tests/test_version.py": [
                (
                    "",
                    """

def test_numeric_prerelease_identifiers_compare_as_numbers():
    assert Version.parse("1.0.0-alpha.2") < Version.parse("1.0.0-alpha.10")
    assert Version.parse("1.0.0-9") < Version.parse("1.0.0-10")


def test_numeric_identifiers_come_before_alphanumeric_ones():
    assert Version.parse("1.0.0-1") < Version.parse("1.0.0-alpha")
    assert Version.parse("1.0.0-alpha.1") < Version.parse("1.0.0-alpha.beta")
""",
                )
            ]
        },
    ),
    Bug(
        "semverlite-3",
        "semverlite",
        """bump("minor") keeps the patch number

```python
>>> Version.parse("1.4.2").bump("minor")
Version(major=1, minor=5, patch=2, prerelease=(), build=())
```

The next minor version of 1.4.2 is 1.5.0, as the docstring and the README say.
""",
        {
            "semverlite/version.py": [
                (
                    "return Version(self.major, self.minor + 1, self.patch)",
                    "return Version(self.major, self.minor + 1, 0)",
                )
            ]
        },
        {
            "tests/test_version.py": [
                (
                    "",
                    """

def test_bump_minor_resets_the_patch():
    assert Version.parse("1.4.2").bump("minor") == Version(1, 5, 0)
""",
                )
            ]
        },
    ),
    Bug(
        "semverlite-4",
        "semverlite",
        """Caret ranges on 0.x versions allow breaking updates

```python
>>> satisfies("0.9.0", "^0.2.3")
True
```

For versions below 1.0.0 the caret must not allow minor updates: the README says `^0.2.3` means
`>=0.2.3 <0.3.0` and `^0.0.3` means `>=0.0.3 <0.0.4` (as in npm and cargo). We pulled in an
incompatible 0.9 release because of this.
""",
        {
            "semverlite/ranges.py": [
                (
                    """    if term.startswith("^"):
        low = Version.parse(term[1:])
        return [(">=", low), ("<", Version(low.major + 1, 0, 0))]
""",
                    """    if term.startswith("^"):
        low = Version.parse(term[1:])
        if low.major:
            high = Version(low.major + 1, 0, 0)
        elif low.minor:
            high = Version(0, low.minor + 1, 0)
        else:
            high = Version(0, 0, low.patch + 1)
        return [(">=", low), ("<", high)]
""",
                )
            ]
        },
        {
            "tests/test_ranges.py": [
                (
                    "",
                    """

def test_caret_on_a_zero_major_fixes_the_minor():
    assert satisfies("0.2.9", "^0.2.3")
    assert not satisfies("0.3.0", "^0.2.3")


def test_caret_on_a_zero_minor_fixes_the_patch():
    assert satisfies("0.0.3", "^0.0.3")
    assert not satisfies("0.0.4", "^0.0.3")
""",
                )
            ]
        },
    ),
    Bug(
        "datekit-1",
        "datekit",
        """is_leap_year(2000) is False

2000 was a leap year: in the Gregorian calendar, years divisible by 100 are not leap years unless they
are divisible by 400.

```python
>>> is_leap_year(2000)
False
>>> days_in_month(2000, 2)
28
```
""",
        {
            "datekit/calendar.py": [
                (
                    "return year % 4 == 0 and year % 100 != 0",
                    "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
                )
            ]
        },
        {
            "tests/test_calendar.py": [
                (
                    "",
                    """

def test_years_divisible_by_400_are_leap_years():
    assert is_leap_year(2000)
    assert is_leap_year(1600)
    assert days_in_month(2000, 2) == 29
""",
                )
            ]
        },
    ),
    Bug(
        "datekit-2",
        "datekit",
        """add_months crashes at the end of the month

```python
>>> add_months(date(2023, 1, 31), 1)
Traceback (most recent call last):
  ...
ValueError: day is out of range for month
```

The docstring says the day is clamped to the last day of a shorter month, so this should be
2023-02-28 (and 2024-02-29 in a leap year). Going backwards has the same problem.
""",
        {
            "datekit/calendar.py": [
                (
                    "    return day.replace(year=year, month=month + 1)",
                    "    return day.replace(year=year, month=month + 1, day=min(day.day, days_in_month(year, month + 1)))",
                )
            ]
        },
        {
            "tests/test_calendar.py": [
                (
                    "",
                    """

def test_add_months_clamps_to_the_end_of_shorter_months():
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2023, 5, 31), 1) == date(2023, 6, 30)


def test_add_months_backwards_clamps_too():
    assert add_months(date(2023, 3, 31), -1) == date(2023, 2, 28)
""",
                )
            ]
        },
    ),
    Bug(
        "datekit-3",
        "datekit",
        """parse_duration silently ignores what it does not understand

```python
>>> parse_duration("1h30x")
3600
>>> parse_duration("5 minutes")
300
```

The docstring promises a ValueError for anything that is not number-unit parts. A typo in our config
(`timeout = 90x`) was read as nothing rather than rejected. Spaces between parts are fine, though.
""",
        {
            "datekit/duration.py": [
                (
                    '_PART = re.compile(r"(\\d+)\\s*([wdhms])")\n',
                    '_PART = re.compile(r"(\\d+)\\s*([wdhms])")\n_DURATION = re.compile(r"\\s*(?:\\d+\\s*[wdhms]\\s*)+")\n',
                ),
                (
                    """    parts = _PART.findall(text.lower())
    if not parts:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(number) * UNITS[unit] for number, unit in parts)
""",
                    """    if not _DURATION.fullmatch(text.lower()):
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(number) * UNITS[unit] for number, unit in _PART.findall(text.lower()))
""",
                ),
            ]
        },
        {
            "tests/test_duration.py": [
                (
                    "",
                    """

def test_parse_refuses_unknown_units():
    with pytest.raises(ValueError):
        parse_duration("1h30x")


def test_parse_refuses_words_around_the_parts():
    for text in ["5 minutes", "about 1h", "1h and 30m"]:
        with pytest.raises(ValueError):
            parse_duration(text)


def test_parse_allows_spaces():
    assert parse_duration(" 1h 30m ") == 5400
""",
                )
            ]
        },
    ),
    Bug(
        "confini-1",
        "confini",
        """Inline comments end up in values

```ini
[server]
port = 8080   ; http
```

```python
>>> config.getint("server", "port")
confini.parser.ConfigError: [server] port is not an integer: '8080   ; http'
```

The README says inline comments start with `;` or `#` after whitespace. A `#` inside a value (a colour
such as `#fff`, a URL fragment) must stay.
""",
        {
            "confini/parser.py": [
                (
                    "from __future__ import annotations\n",
                    "from __future__ import annotations\n\nimport re\n\n"
                    '_INLINE_COMMENT = re.compile(r"\\s+[;#]")  # ; or # after whitespace starts a comment\n',
                ),
                (
                    "        current[key.strip()] = value.strip()",
                    "        current[key.strip()] = _INLINE_COMMENT.split(value.strip(), maxsplit=1)[0]",
                ),
            ]
        },
        {
            "tests/test_parser.py": [
                (
                    "",
                    """

def test_inline_comments_are_removed():
    assert parse("[a]\\nport = 8080  ; http\\nhost = x # main")["a"] == {"port": "8080", "host": "x"}


def test_a_hash_inside_a_value_is_kept():
    assert parse("[a]\\ncolor = #fff\\nurl = http://x/#top")["a"] == {"color": "#fff", "url": "http://x/#top"}
""",
                )
            ]
        },
    ),
    Bug(
        "confini-2",
        "confini",
        """Keys are case-sensitive

```ini
[server]
Port = 8080
```

```python
>>> config.getint("server", "port") is None
True
```

The README says keys are not case-sensitive, like in configparser (section names are).
""",
        {
            "confini/parser.py": [
                ("        current[key.strip()] = value.strip()", "        current[key.strip().lower()] = value.strip()")
            ],
            "confini/config.py": [
                (
                    "return self._sections.get(section, {}).get(key, default)",
                    "return self._sections.get(section, {}).get(key.lower(), default)",
                )
            ],
        },
        {
            "tests/test_config.py": [
                (
                    "",
                    """

def test_keys_are_case_insensitive():
    config = Config.from_string("[server]\\nPort = 8080\\nHOST = example.org")
    assert config.getint("server", "port") == 8080
    assert config.get("server", "Host") == "example.org"


def test_section_names_stay_case_sensitive():
    config = Config.from_string("[Server]\\nport = 1")
    assert config.get("server", "port") is None
    assert config.get("Server", "PORT") == "1"
""",
                )
            ]
        },
    ),
    Bug(
        "confini-3",
        "confini",
        """getbool() returns False for values it does not know

A typo such as `debug = ture` silently turns debugging off:

```python
>>> Config.from_string("[a]\\ndebug = ture").getbool("a", "debug")
False
```

The README says booleans are 1/yes/true/on and 0/no/false/off, and anything else is a ConfigError.
""",
        {
            "confini/config.py": [
                (
                    "        return value.lower() in TRUE\n",
                    "        if value.lower() in TRUE:\n"
                    "            return True\n"
                    "        if value.lower() in FALSE:\n"
                    "            return False\n"
                    '        raise ConfigError(f"[{section}] {key} is not a boolean: {value!r}")\n',
                )
            ]
        },
        {
            "tests/test_config.py": [
                (
                    "",
                    """

def test_getbool_false_values():
    config = Config.from_string("[a]\\nx = off\\ny = No\\nz = 0")
    assert [config.getbool("a", key) for key in "xyz"] == [False, False, False]


def test_getbool_refuses_other_values():
    config = Config.from_string("[a]\\ndebug = ture")
    with pytest.raises(ConfigError, match="debug"):
        config.getbool("a", "debug")
""",
                )
            ]
        },
    ),
]


def git(repo: Path, *args: str) -> str:
    """Run git in `repo`; its stdout."""
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def edit(repo: Path, edits: Edits) -> str:
    """Apply the edits to the checkout and return them as a git patch; the checkout is back at base after."""
    for name, replacements in edits.items():
        path = repo / name
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        for old, new in replacements:
            if old and text.count(old) != 1:
                raise ValueError(f"{repo.name}/{name}: {old!r} occurs {text.count(old)} times, not once")
            text = text.replace(old, new) if old else text + new
        path.write_text(text, encoding="utf-8")
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached")
    git(repo, "reset", "-q", "--hard")
    return patch


def test_results(repo: Path, *patches: str) -> tuple[set[str], set[str]]:
    """(passed, failed) node ids of the whole test suite with the patches applied; the checkout is reset after."""
    for patch in patches:
        subprocess.run(["git", "-C", str(repo), "apply", "-"], input=patch, text=True, check=True)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-qfdx")
    lines = run.stdout.splitlines()
    passed = {line.removeprefix("PASSED ") for line in lines if line.startswith("PASSED ")}
    failed = {re.sub(r" - .*", "", line.split(" ", 1)[1]) for line in lines if line.startswith(("FAILED ", "ERROR "))}
    return passed, failed


def build_instance(bug: Bug, workdir: Path) -> dict[str, object]:
    """The instance of one bug, checked: its tests fail without the fix and all pass with it."""
    repo = workdir / bug.instance_id
    repo.mkdir()
    base_commit = build_local(REPOS_DIR / bug.repo, repo)
    patch, test_patch = edit(repo, bug.fix), edit(repo, bug.tests)
    before, _ = test_results(repo, test_patch)
    after, after_failed = test_results(repo, patch, test_patch)
    fail_to_pass, pass_to_pass = sorted(after - before), sorted(after & before)
    if after_failed or not fail_to_pass:
        raise ValueError(f"{bug.instance_id}: with the fix {sorted(after_failed)} fail; FAIL_TO_PASS {fail_to_pass}")
    return {
        "instance_id": bug.instance_id,
        "repo": bug.repo,
        "base_commit": base_commit,
        "problem_statement": bug.problem_statement,
        "patch": patch,
        "test_patch": test_patch,
        "FAIL_TO_PASS": fail_to_pass,
        "PASS_TO_PASS": pass_to_pass,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that instances.jsonl is up to date")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        text = "".join(json.dumps(build_instance(bug, Path(workdir))) + "\n" for bug in BUGS)
    if args.check:
        current = INSTANCES_FILE.read_text(encoding="utf-8") if INSTANCES_FILE.exists() else ""
        print("up to date" if current == text else f"{INSTANCES_FILE} is out of date: rerun without --check")
        return int(current != text)
    INSTANCES_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {len(BUGS)} instances to {INSTANCES_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
