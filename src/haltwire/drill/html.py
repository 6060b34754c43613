"""``haltwire drill --html FILE``: the drill's JSON as one self-contained HTML page.

No network: the CSS is inline, the plots are inline SVG, there is no script. In this order,
``render(data)`` writes:

1. the verdict (pass, or what failed: missed targets, broken rungs, what the drill left behind);
2. the run's parameters (date, haltwire version, seed, reps, rungs, the agent class's timing);
3. the figures' table, one row a rung (ms from the stop's acknowledgement, p50 / p99 / max);
4. for every rung in the JSON, in its order: a **timeline** (one row a rep: each side effect the
   canary upstream recorded, against t = 0 at the stop's acknowledgement; the first refusal and
   the lease's end marked; the target as a line), then the **distributions** of its figures (one
   dot a run, p50, p99 and max marked, the target as a line). A skipped rung, or one broken
   before any rep was measured, gets an empty timeline saying so.

It reads only what any rung's reps carry (``effects_at_s``, ``first_refusal_s``,
``lease_end_s``, ``last_effect_s``), so a new rung is plotted with no change here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any, Final

#: The plots' geometry, in SVG user units.
WIDTH: Final = 960
LEFT: Final = 190
RIGHT: Final = 20
ROW: Final = 16
AXIS: Final = 34
#: How far before the stop a timeline reaches at most; earlier side effects sit at its edge.
EARLIEST_S: Final = -2.0
#: The figures plotted as distributions: the JSON's spread and the rep's field.
FIGURES: Final = (
    ("last side effect", "to_last_side_effect_s", "last_effect_s"),
    ("first refusal", "to_first_refusal_s", "first_refusal_s"),
    ("lease end", "to_lease_end_s", "lease_end_s"),
)

STYLE: Final = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1000px;
color:#1d232a;background:#fff}
h1{font-size:22px;margin:0 0 8px}h2{font-size:18px;margin:32px 0 6px}h3{font-size:14px;margin:14px 0 4px}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;border-bottom:1px solid #e3e6ea;
text-align:right}th:first-child,td:first-child{text-align:left}th{font-weight:600;background:#f5f7f9}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;font-weight:700;color:#fff}
.v-pass{background:#1f7a3a}.v-fail,.v-broken{background:#b3261e}.v-skipped{background:#8a6d00}
.banner{padding:12px 16px;border-radius:6px;margin:12px 0;font-size:16px}
.banner.ok{background:#e6f4ea;border:1px solid #1f7a3a}.banner.bad{background:#fce8e6;border:1px solid #b3261e}
.sentence{color:#b3261e}.note{color:#5f6b76}svg{display:block;margin:4px 0;font:11px system-ui,sans-serif}
.effect{fill:#3b6fb6}.effect.after{fill:#e8710a}.effect.late{fill:#b3261e}
.refusal{fill:#b3261e}.lease-end{fill:none;stroke:#6a1b9a;stroke-width:2}
.stop{stroke:#1d232a;stroke-width:1.5}.target{stroke:#b3261e;stroke-dasharray:5 3;stroke-width:1.5}
.grid{stroke:#e3e6ea}.row-label{fill:#1d232a}.row-label.bad{fill:#b3261e;font-weight:700}
.dot{fill:#3b6fb6;fill-opacity:.7}.stat{stroke:#1d232a;stroke-width:2}
.legend span{margin-right:14px}.sw{display:inline-block;width:10px;height:10px;margin-right:4px;
vertical-align:middle;border-radius:5px}
"""


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def _spread(spread: Mapping[str, float] | None) -> str:
    return "-" if not spread else " / ".join(_ms(spread[k]) for k in ("p50", "p99", "max"))


def _step(span_s: float) -> float:
    """A round tick step giving at most about ten ticks over ``span_s``."""
    for step in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0):
        if span_s / step <= 10:
            return step
    return float(10 ** math.ceil(math.log10(span_s / 10)))


class Axis:
    """Seconds from the stop to x in the plot."""

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, max(hi, lo + 0.1)

    def x(self, t: float) -> float:
        t = min(max(t, self.lo), self.hi)
        return round(LEFT + (t - self.lo) / (self.hi - self.lo) * (WIDTH - LEFT - RIGHT), 1)

    def ticks(self, top: float, bottom: float) -> str:
        """Grid lines and labels (ms) at round steps, ``0`` among them."""
        step = _step(self.hi - self.lo)
        out = []
        k = math.ceil(self.lo / step)
        while k * step <= self.hi + 1e-9:
            x = self.x(k * step)
            out.append(
                f'<line class="grid" x1="{x}" y1="{top}" x2="{x}" y2="{bottom}"/>'
                f'<text x="{x}" y="{bottom + 14}" text-anchor="middle">{_ms(k * step)}</text>'
            )
            k += 1
        return "".join(out)


def _reps(rung: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(rung.get("reps") or [])


def _timeline_axis(reps: Sequence[Mapping[str, Any]], target: float) -> Axis:
    times: list[float] = [0.0, target]
    for rep in reps:
        times.extend(rep.get("effects_at_s") or [])
        times.extend(v for v in (rep.get("first_refusal_s"), rep.get("lease_end_s")) if v is not None)
    span = max(times) - min(times)
    return Axis(max(min(times) - 0.02 * span, EARLIEST_S), max(times) + 0.04 * span + 0.05)


def _label(rep: Mapping[str, Any]) -> str:
    return f"rep {rep.get('rep', '?')} · {rep.get('runtime', '?')} · {rep.get('scope_kind', '?')}"


def _rep_row(rep: Mapping[str, Any], y: float, axis: Axis, target: float) -> str:
    """One rep's marks: its side effects, its first refusal, its lease's end."""
    last = rep.get("last_effect_s")
    bad = rep.get("broken") is not None or (last is not None and last > target)
    title = escape(f"{rep.get('scope', '')} run {rep.get('run_id', '')}; refusal {rep.get('refusal')}")
    out = [
        f'<text class="row-label{" bad" if bad else ""}" x="{LEFT - 6}" y="{y + 4}" text-anchor="end">'
        f"<title>{title}</title>{escape(_label(rep))}</text>"
    ]
    for t in rep.get("effects_at_s") or []:
        kind = "effect late" if t > target else "effect after" if t > 0 else "effect"
        out.append(f'<circle class="{kind}" cx="{axis.x(t)}" cy="{y}" r="2.6"><title>{_ms(t)} ms</title></circle>')
    refusal = rep.get("first_refusal_s")
    if refusal is not None:
        x = axis.x(refusal)
        out.append(
            f'<path class="refusal" d="M{x} {y - 6}L{x + 5} {y}L{x} {y + 6}L{x - 5} {y}Z">'
            f"<title>first refusal {escape(str(rep.get('refusal')))} at {_ms(refusal)} ms</title></path>"
        )
    lease_end = rep.get("lease_end_s")
    if lease_end is not None:
        x = axis.x(lease_end)
        out.append(
            f'<rect class="lease-end" x="{x - 4}" y="{y - 4}" width="8" height="8">'
            f"<title>lease ended at {_ms(lease_end)} ms</title></rect>"
        )
    return "".join(out)


def timeline(rung: Mapping[str, Any], target: float) -> str:
    """The rung's timeline: one row a rep, t = 0 the stop's acknowledgement, the target a line."""
    reps = _reps(rung)
    name = escape(str(rung.get("rung", "")))
    if not reps:
        why = "skipped" if rung.get("skipped") else "no rep was measured"
        return (
            f'<svg class="timeline empty" data-rung="{name}" data-marks="0" width="{WIDTH}" height="40" '
            f'role="img" aria-label="timeline of {name}"><text x="{LEFT}" y="24">{why}</text></svg>'
        )
    axis = _timeline_axis(reps, target)
    top, bottom = 10, 10 + ROW * len(reps)
    marks = sum(len(rep.get("effects_at_s") or []) for rep in reps)
    rows = "".join(_rep_row(rep, top + ROW * i + ROW / 2, axis, target) for i, rep in enumerate(reps))
    stop, line = axis.x(0.0), axis.x(target)
    return (
        f'<svg class="timeline" data-rung="{name}" data-marks="{marks}" width="{WIDTH}" '
        f'height="{bottom + AXIS}" role="img" aria-label="timeline of {name}">'
        f"{axis.ticks(top, bottom)}"
        f'<line class="stop" x1="{stop}" y1="{top - 6}" x2="{stop}" y2="{bottom}"><title>the stop acknowledged</title></line>'
        f'<line class="target" x1="{line}" y1="{top - 6}" x2="{line}" y2="{bottom}">'
        f"<title>target {target:g} s</title></line>{rows}"
        f'<text x="{WIDTH - RIGHT}" y="{bottom + 30}" text-anchor="end">ms from the stop\'s acknowledgement</text>'
        "</svg>"
    )


def distribution(rung: Mapping[str, Any], label: str, spread_key: str, field: str, target: float) -> str:
    """One figure of the rung: a dot a run, p50 / p99 / max ticked, the target a line."""
    values = [float(rep[field]) for rep in _reps(rung) if rep.get(field) is not None]
    spread = rung.get(spread_key)
    name = escape(str(rung.get("rung", "")))
    head = f"<h3>{escape(label)}: {_spread(spread)} ms (p50 / p99 / max)</h3>"
    if not values or not spread:
        return head + '<p class="note">none measured</p>'
    axis = Axis(0.0, max(max(values), target) * 1.08)
    mid = 44
    dots = "".join(
        f'<circle class="dot" cx="{axis.x(v)}" cy="{mid + ((i * 7) % 15) - 7}" r="3"><title>{_ms(v)} ms</title></circle>'
        for i, v in enumerate(values)
    )
    stats = "".join(
        f'<line class="stat" x1="{axis.x(spread[k])}" y1="{mid - 12}" x2="{axis.x(spread[k])}" y2="{mid + 12}"/>'
        f'<text x="{axis.x(spread[k])}" y="{mid - 15 - 10 * i}" text-anchor="middle">{k}</text>'
        for i, k in enumerate(("p50", "p99", "max"))
    )
    line = axis.x(target)
    return head + (
        f'<svg class="distribution" data-rung="{name}" data-figure="{escape(field)}" data-dots="{len(values)}" '
        f'width="{WIDTH}" height="{mid + 14 + AXIS}" role="img" aria-label="{escape(label)} of {name}">'
        f"{axis.ticks(mid - 12, mid + 14)}"
        f'<line class="target" x1="{line}" y1="{mid - 14}" x2="{line}" y2="{mid + 14}"><title>target</title></line>'
        f"{dots}{stats}</svg>"
    )


def _rows(rows: Iterable[Sequence[str]], head: Sequence[str]) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _badge(verdict: str) -> str:
    v = escape(verdict)
    return f'<span class="verdict v-{v}">{v}</span>'


def _target(data: Mapping[str, Any], rung: Mapping[str, Any]) -> float:
    return float(rung.get("target_s") or (data.get("agent_class") or {}).get("time_to_stop_s") or 0.0)


def parameters(data: Mapping[str, Any]) -> str:
    cls = data.get("agent_class") or {}
    timing = ", ".join(f"{k} {v:g} s" for k, v in cls.items() if k != "name" and isinstance(v, int | float))
    left = data.get("left_behind") or {}
    rows = [
        ("date", str(data.get("started_at", "-"))),
        ("haltwire", str(data.get("haltwire_version", "-"))),
        ("stack", str(data.get("stack", "-"))),
        ("seed", str(data.get("seed", "-"))),
        ("reps a rung", str(data.get("reps", "-"))),
        ("rungs", ", ".join(str(r.get("rung")) for r in data.get("rungs") or [])),
        ("agent class", f"{cls.get('name', '-')}: {timing}" if cls else "-"),
        ("canary record", f"{data.get('canary_record_total', '-')} side effects"),
        ("left behind", ", ".join(f"{k} {v}" for k, v in left.items()) or "-"),
    ]
    return _rows(((escape(k), escape(v)) for k, v in rows), ("parameter", "value"))


def figures_table(data: Mapping[str, Any]) -> str:
    rows = []
    for rung in data.get("rungs") or []:
        rows.append((
            escape(str(rung.get("rung"))), str(rung.get("samples", 0)),
            _spread(rung.get("to_last_side_effect_s")), _spread(rung.get("to_first_refusal_s")),
            _spread(rung.get("to_lease_end_s")), str((rung.get("side_effects_after_stop") or {}).get("count", 0)),
            f"{_target(data, rung):g} s", _badge(str(rung.get("verdict", "-"))),
        ))  # fmt: skip
    head = ("rung", "runs", "last side effect", "first refusal", "lease end", "after stop", "target", "verdict")
    return _rows(rows, head)


def _problems(data: Mapping[str, Any]) -> list[str]:
    out = [str(s) for s in (data.get("broken") or {}).values()]
    for rung in data.get("rungs") or []:
        if rung.get("verdict") == "fail":
            out.append(f"the {rung.get('rung')} rung missed its target of {_target(data, rung):g} s")
    left = data.get("left_behind") or {}
    if any(left.values()):
        out.append("the drill left behind " + ", ".join(f"{k} {v}" for k, v in left.items()))
    return out


def rung_section(data: Mapping[str, Any], rung: Mapping[str, Any]) -> str:
    target = _target(data, rung)
    name = escape(str(rung.get("rung", "")))
    verdict = str(rung.get("verdict", "-"))
    out = [f'<section class="rung" data-rung="{name}" data-verdict="{escape(verdict)}">',
           f"<h2>{name} {_badge(verdict)}</h2>"]  # fmt: skip
    if rung.get("skipped"):
        out.append(f'<p class="note">skipped: {escape(str(rung["skipped"]))}</p>')
    out.extend(f'<p class="sentence">{escape(str(s))}</p>' for s in rung.get("broken") or [])
    if not _reps(rung):  # nothing measured: the empty timeline says why
        return "".join([*out, timeline(rung, target), "</section>"])
    out.append(
        '<p class="legend"><span><i class="sw" style="background:#3b6fb6"></i>side effect</span>'
        '<span><i class="sw" style="background:#e8710a"></i>after the stop</span>'
        '<span><i class="sw" style="background:#b3261e"></i>past the target / first refusal (diamond)</span>'
        '<span>□ lease end</span><span>│ stop (t = 0)</span><span>┆ target</span></p>'
    )
    out.append(timeline(rung, target))
    after = (rung.get("side_effects_after_stop") or {}).get("what") or []
    if after:
        out.append(f"<details><summary>{len(after)} side effects after the stop</summary>"
                   f"<p>{escape(', '.join(map(str, after)))}</p></details>")  # fmt: skip
    out.extend(distribution(rung, *figure, target) for figure in FIGURES)
    out.append("</section>")
    return "".join(out)


def render(data: Mapping[str, Any]) -> str:
    """The whole page (the module's docstring)."""
    problems = _problems(data)
    ok = bool(data.get("ok")) and not problems
    banner = (
        '<div class="banner ok" id="verdict" data-ok="true">pass: every rung met its target</div>'
        if ok
        else '<div class="banner bad" id="verdict" data-ok="false"><b>fail</b><ul>'
        + "".join(f"<li>{escape(p)}</li>" for p in problems or ["the drill did not pass"])
        + "</ul></div>"
    )
    sections = "".join(rung_section(data, rung) for rung in data.get("rungs") or [])
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>haltwire drill {escape(str(data.get('started_at', '')))}</title><style>{STYLE}</style></head>"
        "<body><h1>haltwire drill: time from a stop to the last side effect</h1>"
        f"{banner}<h2>Parameters</h2>{parameters(data)}"
        f"<h2>Figures</h2><p class=\"note\">ms from the stop's acknowledgement (p50 / p99 / max)</p>"
        f"{figures_table(data)}{sections}</body></html>\n"
    )
