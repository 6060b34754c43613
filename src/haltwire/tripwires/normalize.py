"""Text normalization and invisible-Unicode analysis for the built-in content detector.

Two normalized views of a text are matched, both with invisible characters removed:

- ``plain``: NFKC (full-width and mathematical letters become ASCII, ligatures split),
  casefolded; whitespace as it was (its patterns allow for it). Role markers, URLs and the
  non-Latin phrase patterns are matched here.
- ``folded``: ``plain`` in ASCII: look-alike Cyrillic and Greek letters and digit/symbol
  spellings (``1gn0re``) mapped to Latin, diacritics (NFKD) dropped and what is left of other
  scripts made spaces, markdown emphasis (``*``, ``_``, ``~``, backticks) removed,
  letter-spaced words joined (``i g n o r e``), and every run of whitespace, line breaks
  included, made one space. The Latin phrase patterns are matched here, so a phrase split by
  zero-width characters, line breaks, emphasis or spacing still matches.

Each step is one pass of ``str`` methods or one compiled regex (C code), so a view costs time
linear in the text; an ASCII text skips the Unicode steps.
"""

from __future__ import annotations

import functools
import re
import string
import unicodedata
from dataclasses import dataclass
from itertools import islice
from typing import Final

#: Characters that render as nothing (or only reorder what is around them): zero-width
#: spaces and joiners, bidi marks and controls, invisible operators, soft hyphen, combining
#: grapheme joiner, Hangul fillers, Mongolian and Unicode variation selectors, the BOM, tags.
INVISIBLE: Final = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\U0001d173-\U0001d17a\U000e0000-\U000e007f"
    "\U000e0100-\U000e01ef]+"
)
_TAGS: Final = frozenset(map(chr, range(0xE0000, 0xE0080)))
#: Tag letters and digits, and the cancel tag: an emoji subdivision flag (England, Scotland,
#: Wales) is U+1F3F4, up to 7 of the former, then the latter.
_FLAG_TAGS: Final = frozenset(map(chr, (*range(0xE0030, 0xE003A), *range(0xE0061, 0xE007B))))
_SELECTORS: Final = frozenset(map(chr, (*range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0))))
_BIDI: Final = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
#: The most runs of invisible characters one scan looks at (many more trip anyway).
_MAX_RUNS: Final = 4096
#: Suspicious zero-width characters standing alone anywhere in a text: this many trip.
ISOLATED_LIMIT: Final = 16

#: Three or more single letters, each followed by one space, dot or hyphen: "i g n o r e",
#: "i-g-n-o-r-e" (the words of such letters are told apart by a wider gap). Starts with a
#: literal, so ``re`` searches fast.
_SPACED: Final = re.compile(r" (?:[a-z][ .-]){2,}[a-z](?![a-z])")
_SPACED_SEPARATORS: Final = re.compile(r"[ .-]")

#: Look-alike Cyrillic and Greek letters and digit/symbol spellings to Latin; markdown
#: emphasis and combining marks (diacritics, after NFKD) removed.
_FOLD: Final = str.maketrans(
    {
        **dict(zip("аеорсухіјѕԁһӏԛԝɡοαιυνκρτχ", "aeopcyxijsdhlqwgoaiuvkptx", strict=True)),
        **dict(zip("013457", "oieast", strict=True)),
        **dict.fromkeys("*_~`"),
        **dict.fromkeys("\u2018\u2019\u02bc", "'"),
        **dict.fromkeys("\u201c\u201d", '"'),
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015", "-"),
        **dict.fromkeys(chr(c) for c in (*range(0x300, 0x370), *range(0x1AB0, 0x1B00), *range(0x1DC0, 0x1E00),
                                         *range(0x20D0, 0x2100), *range(0xFE20, 0xFE30))),
    }
)
_NON_ASCII: Final = re.compile(r"[^\x00-\x7f]+")
#: Everything but letters becomes a space, to split the folded view into words.
_NOT_LETTERS: Final = str.maketrans(dict.fromkeys(string.punctuation + string.digits, " "))


def base(visible: str) -> str:
    """NFKC and casefolded, whitespace as it was, from ``Hidden.visible``."""
    if visible.isascii():
        return visible.lower()
    if not unicodedata.is_normalized("NFKC", visible):
        visible = unicodedata.normalize("NFKC", visible)
    return visible.casefold()


def plain(base_text: str) -> str:
    """The ``plain`` view (see the module's docstring), from ``base``: ``base`` itself."""
    return base_text


def folded(base_text: str) -> str:
    """The ``folded`` view, from ``base``."""
    text = base_text
    if not text.isascii():
        text = _NON_ASCII.sub(_fold_run, text)
    text = " " + text.translate(_FOLD)
    text = _SPACED.sub(lambda m: " " + _SPACED_SEPARATORS.sub("", m.group()), text)
    return " ".join(text.split())


def _fold_run(match: re.Match[str]) -> str:
    return _fold_chars(match.group())


@functools.lru_cache(maxsize=4096)
def _fold_chars(run: str) -> str:
    # One run of non-ASCII characters: diacritics split off (NFKD) and dropped, look-alikes
    # mapped; a run that is still not ASCII (another script) becomes a space. Per run, not per
    # text, so a mostly-ASCII text pays for its few runs only (str.translate is slow off
    # ASCII), and cached, since a text repeats its runs (é, ’, the words of another script).
    folded = unicodedata.normalize("NFKD", run).translate(_FOLD)
    return folded if folded.isascii() else " "


def words(folded_text: str) -> frozenset[str]:
    """The words of the folded view (runs of letters)."""
    return frozenset(folded_text.translate(_NOT_LETTERS).split())


def _emojiish(ch: str) -> bool:
    return ord(ch) >= 0x1F000 or unicodedata.category(ch) == "So"


def _legitimate(text: str, start: int, run: str) -> bool:
    """Whether a run of zero-width characters is there for rendering, not to hide anything."""
    before = text[start - 1] if start else ""
    after = text[start + len(run)] if start + len(run) < len(text) else ""
    if set(run) <= {"\u200d", "\ufe0f", "\ufe0e"} and len(run) <= 2 and run.count("\u200d") <= 1:
        # Emoji: presentation selectors after one, a ZWJ between two (👩‍💻, 🏳️‍🌈), a keycap (1️⃣).
        if "\u200d" not in run:
            return bool(before) and (_emojiish(before) or after == "\u20e3" or len(run) == 1)
        return bool(before) and bool(after) and _emojiish(before) and _emojiish(after)
    if len(run) != 1:
        return False
    if run in "\u200c\u200d":  # joiners shape Arabic, Persian and Indic letters
        return before.isalpha() and after.isalpha() and not (before.isascii() or after.isascii())
    if run == "\u200b":  # a line-break hint in Thai, Lao, Khmer, Burmese, CJK
        return any(c and not c.isascii() and c.isalpha() for c in (before, after))
    if run == "\ufeff":
        return start == 0
    if run in "\u200e\u200f\u061c\u00ad":  # a direction mark; a hyphenation hint
        return True
    if "\U000e0100" <= run <= "\U000e01ef":  # one ideographic variation selector
        return unicodedata.category(before or " ") == "Lo"
    return False


@dataclass(frozen=True, slots=True)
class Hidden:
    """What ``inspect`` found: the text without its invisible characters; (reason, start, end)
    findings, at most one per reason; the text that tag characters and runs of variation
    selectors spell."""

    visible: str
    findings: tuple[tuple[str, int, int], ...] = ()
    tag_text: str = ""
    #: The text with the invisible runs between two ASCII letters made spaces, if it has any:
    #: ``ignore\u200bprevious`` is one word to ``visible`` and two to a model.
    spaced: str | None = None


def inspect(text: str) -> Hidden:
    """What hides in ``text``, from one pass over its runs of invisible characters.

    - tag characters (U+E0000..E007F) outside emoji subdivision flags: always (their ASCII,
      the "ASCII smuggling" channel, is returned to be scanned too);
    - bidi overrides (U+202D, U+202E): always; embeddings and isolates when unbalanced
      (balanced isolates are what i18n libraries insert around placeholders);
    - a run of two or more zero-width characters that is not part of an emoji sequence (a run
      of variation selectors is decoded as bytes and returned with the tags' text);
    - ``ISOLATED_LIMIT`` or more lone zero-width characters outside the contexts that use them
      (emoji ZWJ sequences, joiners between non-Latin letters, line-break hints in scripts
      without spaces, a leading BOM, direction marks, single soft hyphens).
    """
    if text.isascii():
        return Hidden(text)
    runs = list(islice(INVISIBLE.finditer(text), _MAX_RUNS + 1))
    if not runs:
        return Hidden(text)
    found: dict[str, tuple[str, int, int]] = {}
    tags: list[str] = []
    bidi: list[str] = []
    isolated: list[int] = []
    for m in runs:
        run, at = m.group(), m.start()
        if not _TAGS.isdisjoint(run):
            if not (at and text[at - 1] == "\U0001f3f4" and run[-1] == "\U000e007f" and len(run) <= 8
                    and _FLAG_TAGS.issuperset(run[:-1])):
                tags.extend(c for c in run if c in _TAGS)
                found.setdefault("tags", ("tag characters", at, m.end()))
            continue
        if not _BIDI.isdisjoint(run):
            bidi.extend(c for c in run if c in _BIDI)
            if len(run) > 1 and not _BIDI.issuperset(run):
                found.setdefault("run", (f"a run of {len(run)} invisible characters", at, m.end()))
            continue
        if _legitimate(text, at, run):
            continue
        if len(run) >= 2:
            found.setdefault("run", (f"a run of {len(run)} invisible characters", at, m.end()))
            if len(run) >= 4 and _SELECTORS.issuperset(run):
                tags.extend(_selector_text(run))
        else:
            isolated.append(at)
    if "\u202d" in bidi or "\u202e" in bidi:
        at = text.find("\u202e") if "\u202e" in bidi else text.find("\u202d")
        found["bidi"] = ("bidi override", at, at + 1)
    elif bidi and (
        bidi.count("\u202a") + bidi.count("\u202b") != bidi.count("\u202c")
        or bidi.count("\u2066") + bidi.count("\u2067") + bidi.count("\u2068") != bidi.count("\u2069")
    ):
        at = next(m.start() for m in runs if not _BIDI.isdisjoint(m.group()))
        found["bidi"] = ("unbalanced bidi controls", at, at + 1)
    if len(isolated) >= ISOLATED_LIMIT:
        found["isolated"] = (f"{len(isolated)} scattered invisible characters", isolated[0], isolated[0] + 1)
    spelled = "".join(c if c not in _TAGS else chr(ord(c) - 0xE0000) for c in tags)
    spelled = "".join(c for c in spelled if c.isprintable() or c == "\n")
    if len(runs) > _MAX_RUNS:
        return Hidden(INVISIBLE.sub("", text), tuple(found.values()), spelled, INVISIBLE.sub(" ", text))
    ends = [0, *(i for m in runs for i in m.span()), len(text)]
    pieces = [text[ends[i] : ends[i + 1]] for i in range(0, len(ends), 2)]
    between = [_ascii_letter(pieces[i][-1:]) and _ascii_letter(pieces[i + 1][:1]) for i in range(len(runs))]
    spaced = None
    if any(between):
        spaced = "".join(p + (" " if i < len(between) and between[i] else "") for i, p in enumerate(pieces))
    return Hidden("".join(pieces), tuple(found.values()), spelled, spaced)


def _selector_text(run: str) -> str:
    # "Emoji smuggling": bytes 0-15 as U+FE00..FE0F, 16-255 as U+E0100..E01EF, after one
    # visible character; decoded as UTF-8 so the text they carry is scanned too.
    data = bytes(ord(c) - 0xFE00 if ord(c) <= 0xFE0F else ord(c) - 0xE0100 + 16 for c in run)
    return data.decode("utf-8", "replace") + "\n"


def _ascii_letter(ch: str) -> bool:
    return ch.isascii() and ch.isalpha()
