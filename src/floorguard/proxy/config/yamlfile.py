"""The configuration file's text to data, as PyYAML's safe loader reads it, fast at any size.

PyYAML (YAML 1.1, libyaml's parser under a Python composer) is the reference: what it reads
is what a configuration means, and its errors are the ones reported. It is also slow where
the file is large: ≈ 9 s for the 6 MB of 100,000 tenants, most of it building a Python
object for every libyaml event. So a document is read:

1. if it is JSON (YAML's subset, what a tool writing 100,000 tenants may write), by `json`;
2. otherwise by `yaml_rs` (a YAML 1.2 reader in Rust, ≈ 0.3 s for those 6 MB), **only where
   the two readers agree by the checks below** (`_read_fast`). YAML 1.1 and 1.2 read some plain
   scalars differently (`yes`, `0755`, `1:30`, `1.0e3`, `0o17`), and the two libraries
   differ on tags, merge keys, block scalars, several documents, a byte-order mark. Any
   such form in the text, any word that may be a number and reads otherwise alone, or any
   string in the data that PyYAML would have read as something else, leaves the document
   to PyYAML; so does any error (PyYAML's message is the one reported);
3. otherwise by PyYAML's safe loader.

A document over 1 MiB is read (2, then 3) in a child process, so that the read's peak
memory is the child's (`_parse_apart`).

`tests/property/test_yaml_reading.py` holds step 2 to PyYAML over generated documents full
of the forms on which the two disagree.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from typing import Any

import yaml
import yaml_rs

__all__ = ["parse_yaml"]

_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it (the wheels are): the pure-Python
one took 20 s of a 22 s start at 100,000 tenants."""


def parse_yaml(text: str, *, apart_over_bytes: int | None = None) -> Any:
    """YAML's safe subset read as PyYAML's safe loader reads it (the module's docstring
    says how): JSON by `json`; then `yaml_rs` where it agrees with PyYAML, or PyYAML
    itself, in a child process above `apart_over_bytes` (`_APART_OVER_BYTES` by default).
    A document nobody can read raises PyYAML's `yaml.YAMLError`."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # a YAML flow mapping that is not JSON
    limit = _APART_OVER_BYTES if apart_over_bytes is None else apart_over_bytes
    if len(text) > limit:
        parsed = _parse_apart(text)
        if parsed is not None:
            ok, value = parsed
            if not ok:
                raise yaml.YAMLError(value)
            return value
    return _read_here(text)


def _read_here(text: str) -> Any:
    """`text` read fast where that reads as PyYAML would, by PyYAML otherwise."""
    fast = _read_fast(text)
    if fast is not _UNREAD:
        return fast
    return yaml.load(text, Loader=_SAFE_LOADER)  # a safe loader, C or not


_UNREAD: Any = object()
"""`_read_fast`'s answer where it leaves the document to PyYAML."""

_UNSURE = re.compile(
    r"[!&*%<|>?\\\t]"  # tags, anchors, aliases, directives, merge keys, block scalars,
    # explicit keys, escapes, tabs
    r"|[^\n\r\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
    # ↑ a byte-order mark, YAML 1.1's extra line breaks, and what PyYAML refuses to read
    r"|:[,\[\]{}]"  # [a:]: a key PyYAML refuses in a flow
    r"|^(?:---|\.\.\.)",  # a document marker: several documents (one first --- is let be)
    re.MULTILINE,
)
"""A character or a line anywhere in the text (a comment and a quoted string included: a
needless fallback is only slower) on which PyYAML and `yaml_rs` may read differently, or
that PyYAML refuses."""

_WORD_BREAKS = re.compile(r"[\s\[\]{},]+")
_NUMBER_STARTS = frozenset("-+.0123456789_")
_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVE: Any = yaml.resolver.Resolver().resolve  # the tag PyYAML gives a scalar


def _read_fast(text: str) -> Any:
    """`text` read by `yaml_rs` where that is what PyYAML would read; `_UNREAD` otherwise."""
    if _UNSURE.search(text, 3 if text.startswith("---") else 0):  # ^ skips a first ---
        return _UNREAD
    if not _numbers_alike(text):
        return _UNREAD
    try:
        data = yaml_rs.loads(text, parse_datetime=False)
    except Exception:  # any failure is PyYAML's to read and to report
        return _UNREAD
    return data if _read_alike(data, {}) else _UNREAD


def _numbers_alike(text: str) -> bool:
    """Whether every word that may be a number (`0755`, `1.0e3`, `-.5`, `0o17`, `_1`)
    reads alike, alone, to both readers. A plain scalar that `yaml_rs` reads as a number
    holds no space, flow indicator or colon, so it is one of these words, read alone as it
    is read in place; one that it reads as a string is `_read_alike`'s to check. Words are
    split at spaces, flow indicators and colons (a word begun with a colon, `{:0}`, is a
    plain scalar PyYAML refuses in a flow)."""
    checked: set[str] = set()
    for word in set(_WORD_BREAKS.split(text)):
        if word.startswith(":"):
            return False
        for part in word.split(":") if ":" in word else (word,):
            if part and part[0] in _NUMBER_STARTS and part not in checked:
                if not _reads_alike(part):
                    return False
                checked.add(part)
    return True


def _reads_alike(word: str) -> bool:
    """Whether `word`, a document of its own, reads to the same value and type in both."""
    try:
        fast = yaml_rs.loads(word, parse_datetime=False)
        reference = yaml.load(word, Loader=_SAFE_LOADER)
    except Exception:  # a word either refuses: the text is PyYAML's
        return False
    nan = fast != fast and reference != reference  # noqa: PLR0124  # NaN is NaN here
    return type(fast) is type(reference) and (fast == reference or nan)


def _read_alike(value: Any, strings: dict[str, bool]) -> bool:
    """Whether PyYAML reads the document `yaml_rs` read as `value` to the same value: its
    mappings' keys are strings, and no string is one that PyYAML, had it been written
    plain, would read as something else (`yes`, `1:30`, `2026-12-06`, `=`, an empty
    string; a quoted one too, which costs only the fast path). The numbers were held to
    PyYAML's word by word (`_numbers_alike`)."""
    if isinstance(value, str):
        alike = strings.get(value)
        if alike is None:
            tag = _RESOLVE(yaml.ScalarNode, value, (True, False))  # as if plain
            alike = strings[value] = tag == _STR_TAG
        return alike
    if isinstance(value, dict):
        return all(
            isinstance(key, str) and _read_alike(key, strings) and _read_alike(item, strings)
            for key, item in value.items()
        )
    if isinstance(value, list):
        return all(_read_alike(item, strings) for item in value)
    return value is None or isinstance(value, (bool, int, float))


_APART_OVER_BYTES = 1 << 20
"""A YAML configuration larger than this (about 15,000 tenants) is read in a child process:
the read's peak (libyaml's node graph, ≈ 3 KiB a tenant, or `yaml_rs`'s tree, ≈ 1 KiB),
whose memory a process keeps, is the child's, and `serve` keeps only the data
(docs/benchmarks.md, `bench tenants --serve`)."""


def _parse_apart(text: str) -> tuple[bool, Any] | None:
    """`text` read by this module run as a script in a child Python (this interpreter;
    nothing of floorguard imported there, `-P`: nothing beside it either): (True, data)
    or (False, the YAMLError's message); None where the child could not run or failed
    (the caller reads here instead). The data comes back pickled: this process's own
    child, and a safe loader's types only (dates and non-string keys included, which JSON
    would not carry)."""
    try:
        done = subprocess.run(
            [sys.executable, "-P", __file__],
            input=text.encode("utf-8"),
            capture_output=True,
            check=False,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout:
        return None
    answer: tuple[bool, Any] = pickle.loads(done.stdout)  # our own child's
    return answer


def _shared(value: Any, seen: dict[str, str]) -> Any:
    """`value` with one object per distinct string (pickle then sends each once): the keys
    of 100,000 contracts are four strings, not 400,000."""
    if isinstance(value, str):
        return seen.setdefault(value, value)
    if isinstance(value, dict):
        return {_shared(k, seen): _shared(v, seen) for k, v in value.items()}
    if isinstance(value, list):
        return [_shared(v, seen) for v in value]
    return value


def _answer_apart() -> None:
    """The child's side of `_parse_apart`: the text on stdin, the pickled answer on stdout."""
    text = sys.stdin.buffer.read().decode("utf-8")
    try:
        out = (True, _shared(_read_here(text), {}))
    except yaml.YAMLError as exc:
        out = (False, str(exc))
    sys.stdout.buffer.write(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    _answer_apart()
