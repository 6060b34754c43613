"""The built-in content detector: no model, compiled patterns, linear in the text.

It reports four kinds (``signal``): instruction overrides (including text addressed to the AI
reading it, and the weak cues of a fake system note that trip together), role markers
(chat-template tokens, tool-call tags, a conversation written into data), invisible Unicode
(``normalize.inspect``) and exfiltration (markdown or HTML images that carry data
to a host not allowed, script and HTML ``data:`` links, prose asking to send secrets to a URL).
What it does not catch is in docs/configuration.md ("Content detectors").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Final, NamedTuple, Protocol
from urllib.parse import urlsplit

from haltwire.tripwires import normalize, phrases
from haltwire.tripwires.signal import EXFILTRATION, INVISIBLE_UNICODE, Signal, escape, excerpt

#: The most characters one scan reads (256 Ki); the rest of a longer text is not scanned.
MAX_SCAN_CHARS: Final = 256 * 1024
#: Weak cues kept per pattern per scan: bounds the combining step.
_CUES_PER_PATTERN: Final = 8
#: Where a pattern's lead words occur more often than this, its regex searches the whole view.
_MAX_STARTS: Final = 256

_MD_IMAGE: Final = re.compile(r"!\[[^\]\n]{0,100}\]\(\s?<?([^\s)>]{1,2048})")
_HTML_IMAGE: Final = re.compile(r"<img\b[^>]{0,200}?\bsrc\s?=\s?[\"']?([^\"'\s>]{1,2048})")
_MD_LINK: Final = re.compile(r"\[[^\]\n]{0,100}\]\(\s?<?([^\s)>]{1,2048})")
#: A value for the model to fill in: {data}, {{secret}}, [EMAIL], <summary>, $HISTORY, "...".
_PLACEHOLDER: Final = re.compile(
    r"\{\{?[^{}]{1,60}\}\}?|\[[^\[\]]{1,60}\]|<[^<>]{1,60}>|%7b.{1,60}?%7d|%5b.{1,60}?%5d|%3c.{1,60}?%3e"
    r"|\$\{?[a-z_]{2,}|=(?:\.\.\.|…)"
)
_ENCODED_WORDS: Final = re.compile(r"(?:(?:%20|\+)[^&=%+]{1,30}){3}")
_ACTIVE_DATA: Final = (
    "text/html",
    "application/xhtml+xml",
    "image/svg+xml",
    "text/javascript",
    "application/javascript",
    "application/x-javascript",
)


class _Add(Protocol):
    """``scan``'s ``add``: the first signal of each kind is kept."""

    def __call__(self, kind: str, evidence: str, score: float = 1.0) -> None: ...


class _Cue(NamedTuple):
    at: int
    kind: str
    category: str
    weight: float
    view: str
    end: int


def _may_match(p: phrases.Pattern, view: str, present: frozenset[str]) -> bool:
    if any(present.isdisjoint(words) for words in p.words):
        return False
    return not p.needles or any(n in view for n in p.needles)


def _matches(p: phrases.Pattern, view: str, present: frozenset[str]) -> Iterator[re.Match[str]]:
    """``p``'s matches in ``view``, in order: tried where its lead words are, when it has some
    and they are not too many (``_MAX_STARTS``), else by a search of the whole view."""
    if p.lead:
        starts: list[int] = []
        for word in p.lead:
            first = word.split(" ", 1)[0]
            if first.isalpha() and first not in present:
                continue  # not in the text: no need to look for where
            at = view.find(word)
            while at >= 0 and len(starts) <= _MAX_STARTS:
                starts.append(at)
                at = view.find(word, at + 1)
        if len(starts) <= _MAX_STARTS:
            for at in sorted(set(starts)):
                if (at == 0 or not view[at - 1].isalnum()) and (m := p.regex.match(view, at)):
                    yield m
            return
    yield from p.regex.finditer(view)


class BuiltinDetector:
    """Patterns on two normalized views of the text, and a check for invisible characters.

    ``allowed_hosts``: hosts a markdown image or link may carry data to (``example.com`` also
    allows its subdomains). ``max_chars``: the most of a text one scan reads.

    Cost: each view is a few C-level passes over the text; a pattern runs only when its words
    are in the text, and then where they are (or one linear search); each weak pattern keeps at
    most ``_CUES_PER_PATTERN`` cues. CPU per 64 KiB (benchmarks/detectors.py): about 1.3 ms of
    ASCII JSON, 5-8 ms of mixed Unicode prose, 14-16 ms for text made of the patterns' own
    words. Linear in the text (at most ``max_chars``); ``scan`` does not raise.
    """

    def __init__(
        self, *, allowed_hosts: Iterable[str] = (), max_chars: int = MAX_SCAN_CHARS, name: str = "builtin"
    ) -> None:
        self._allowed = tuple(h.lower().strip(".") for h in allowed_hosts)
        self._max_chars = max_chars
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def scan(self, text: str) -> list[Signal]:
        text = text[: self._max_chars]
        found: dict[str, Signal] = {}

        def add(kind: str, evidence: str, score: float = 1.0) -> None:
            if kind not in found:
                found[kind] = Signal(self._name, kind, escape(evidence), round(min(score, 9.99), 2))

        hidden = normalize.inspect(text)
        for reason, start, end in hidden.findings:
            add(INVISIBLE_UNICODE, f"{reason}: {excerpt(text, start, end, 24)}")
        if hidden.tag_text:
            found[INVISIBLE_UNICODE] = Signal(
                self._name, INVISIBLE_UNICODE, escape(f"invisible characters spell: {hidden.tag_text}")
            )
        # The ASCII that tag characters spell is what a model may read: scanned with the rest.
        for i, visible in enumerate((hidden.visible, hidden.spaced)):
            if visible is not None:
                self._text(f"{visible}\n{hidden.tag_text}" if hidden.tag_text else visible, i == 0, found, add)
        return list(found.values())

    def _text(self, visible: str, links: bool, found: dict[str, Signal], add: _Add) -> None:
        """The patterns (and, if ``links``, the links) on the views of ``visible``."""
        base = normalize.base(visible)
        views = {"plain": normalize.plain(base), "folded": normalize.folded(base)}
        present = normalize.words(views["folded"])
        cues: list[_Cue] = []
        for p in phrases.PATTERNS:
            view = views[p.view]
            if (p.weight >= 1.0 and p.kind in found) or not _may_match(p, view, present):
                continue
            if p.weight >= 1.0:
                if m := next(_matches(p, view, present), None):
                    add(p.kind, excerpt(view, m.start(), m.end()))
                continue
            for m in islice(_matches(p, view, present), _CUES_PER_PATTERN):
                cues.append(_Cue(m.start(), p.kind, p.category, p.weight, p.view, m.end()))
        if links:
            self._links(views["plain"], add, cues)
        self._combine(cues, views, add)

    def _allowed_host(self, host: str) -> bool:
        return any(host == a or host.endswith("." + a) for a in self._allowed)

    def _links(self, view: str, add: _Add, cues: list[_Cue]) -> None:
        for regex, image in ((_MD_IMAGE, True), (_HTML_IMAGE, True), (_MD_LINK, False)):
            for m in islice(regex.finditer(view), 64):
                if not image and m.start() and view[m.start() - 1] == "!":
                    continue  # an image, judged above
                verdict = self._url(m.group(1), image)
                if verdict is None:
                    continue
                weight, reason = verdict
                if weight >= 1.0:
                    add(EXFILTRATION, f"{reason}: {excerpt(view, m.start(), m.end(), 0)}")
                else:
                    cues.append(_Cue(m.start(), EXFILTRATION, reason, weight, "plain", m.end()))

    def _url(self, url: str, image: bool) -> tuple[float, str] | None:
        if url.startswith(("javascript:", "vbscript:")):
            return 1.0, "script link"
        if url.startswith("data:"):
            mime = url[5:].split(",", 1)[0].split(";", 1)[0]
            return (1.0, f"data: URL of {mime}") if mime in _ACTIVE_DATA else None
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").strip(".")
        except ValueError:
            return None
        if parts.scheme not in ("http", "https", "") or not host or self._allowed_host(host):
            return None
        data = f"{parts.path}?{parts.query}"
        if _PLACEHOLDER.search(data):
            # An image is fetched when the answer renders: no click needed.
            return (1.0, "image URL with a placeholder") if image else (0.5, "link_placeholder")
        if image and parts.query and (url.endswith("=") or _ENCODED_WORDS.search(parts.query)):
            return 0.6, "image_beacon"
        return None

    @staticmethod
    def _combine(cues: list[_Cue], views: dict[str, str], add: _Add) -> None:
        cues.sort()
        for i, anchor in enumerate(cues):
            best: dict[str, _Cue] = {}
            for cue in cues[i:]:
                if cue.at - anchor.at > phrases.WINDOW:
                    break
                if cue.category not in best or cue.weight > best[cue.category].weight:
                    best[cue.category] = cue
            total = sum(c.weight for c in best.values())
            if total >= 1.0:
                strongest = max(best.values(), key=lambda c: c.weight)
                end = max(c.end for c in best.values() if c.view == anchor.view)
                names = "+".join(sorted(best))
                add(strongest.kind, f"{names}: {excerpt(views[anchor.view], anchor.at, end, 0)}", total)
