"""`builder status --html DIR`: one static page, DIR/index.html, that reads offline: inline CSS and SVG,
no script, nothing fetched. The rows' table; per row, its bench figures over the lock's history
against the reference figures; per image, its bytes layer by layer; upstream's versions against the
matrix's. Every value from the lock, the matrix or a report is escaped as it is written."""

from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path

from builder.config import reference_figures
from builder.config.matrix import Matrix
from builder.config.stack import Stack
from builder.errors import UserError
from builder.files import write_atomic
from builder.lock import store
from builder.status import svg
from builder.status.history import WORKING_TREE, BenchPoint, bench_history
from builder.status.model import Row, Status, image_layers, reference_lines, short
from builder.status.text import digest_text, engine_text, newer_text

PAGE = "index.html"
_STYLE = Path(__file__).with_name("page.css")


def write(directory: str | Path, matrix: Matrix, status: Status, lock_path: Path) -> Path:
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{directory}: not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"{directory}: cannot make the page's directory ({error.strerror})") from None
    path = directory / PAGE
    write_atomic(path, render(matrix, status, lock_path))
    return path


def render(matrix: Matrix, status: Status, lock_path: Path) -> str:
    stacks = {row.name: row for row in matrix.all_rows()}
    lock = store.read(lock_path)
    figures = reference_figures.load(matrix.project.reference_figures)
    history = bench_history(lock_path, matrix.root)
    states = {}
    for row in status.rows:
        states[row.state] = states.get(row.state, 0) + 1
    counts = ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
    body = [
        "<header><h1>Stack status</h1>",
        f"<p class=\"summary\">{len(status.rows)} stack rows: {escape(counts)}. From matrix.toml, matrix.lock, "
        "bench/reference.toml and the build reports, by <code>builder status --html</code>.</p></header><main>",
        _rows_table(status),
        '<section aria-labelledby="bench-title"><h2 id="bench-title">Bench figures over time</h2>',
        "<p>Single-stream decode throughput of each serve mode, one point per figure the lock has recorded "
        "(dated by the commit that recorded it), against the deployment's reference figures: dashed, the "
        "figures bench judges by (pinned); dotted, those kept for comparison.</p>",
        *[_bench_figure(number, row, stacks[row.stack], history, figures) for number, row in enumerate(status.rows)],
        "</section>",
        '<section aria-labelledby="layers-title"><h2 id="layers-title">Where each image\'s bytes go</h2>',
        *_layer_figures(status, lock, matrix.root),
        "</section>",
        _upstream_table(status),
        "</main>",
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            "<title>Stack status</title>\n<style>\n" + _STYLE.read_text(encoding="utf-8") + "</style>\n</head>\n"
            "<body>\n" + "\n".join(body) + "\n</body>\n</html>\n")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _class(css: str) -> str:
    return f' class="{css}"' if css else ""


def _cell(label: str, content: str, css: str = "") -> str:
    return f'<td data-label="{escape(label)}"{_class(css)}>{content}</td>'


_HEADINGS = ("stack", "state", "image", "smoke", "bench", "patches", "newer upstream")


def _rows_table(status: Status) -> str:
    head = "".join(f'<th scope="col">{escape(name)}</th>' for name in _HEADINGS)
    body = "".join(_row(row) for row in status.rows)
    return ('<section aria-labelledby="rows-title"><h2 id="rows-title">Stack rows</h2><div class="table-wrap">'
            '<table class="rows"><caption>One row per stack row of the matrix: its state in matrix.lock, its '
            "image (id, immutable tag, manifest digest once pushed, engine, base), smoke checks, each serve mode's "
            "bench figure against its reference and tolerance, patches, newer upstream releases.</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div></section>")


def _code(value: str | None, full: str | None = None) -> str:
    if not value:
        return "-"
    title = f' title="{escape(full)}"' if full and full != value else ""
    return f"<code{title}>{escape(value)}</code>"


def _image(row: Row) -> str:
    digest = _code(digest_text(row), row.manifest_digest) if row.manifest_digest else escape(digest_text(row))
    facts = (("id", _code(row.short_image, row.image_id)), ("tag", _code(row.immutable_tag)), ("digest", digest),
             ("engine", escape(engine_text(row))), ("base", _code(row.base)))
    return '<dl class="image">' + "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts) + "</dl>"


def _row(row: Row) -> str:
    state = f'<span class="state state-{_slug(row.state)}">{escape(row.state)}</span>'
    cells = [
        _cell("state", state),
        _cell("image", _image(row), "image"),
        _cell("smoke", _smoke(row), f"smoke smoke-{_slug(row.smoke.outcome)}"),
        _cell("bench", _modes(row), "bench"),
        _cell("patches", _patches(row), "patches"),
        _cell("newer upstream", escape(newer_text(row)), "newer" if row.newer else ""),
    ]
    return (f'<tr data-stack="{escape(row.stack)}" data-state="{escape(row.state)}">'
            f'<th scope="row" data-label="stack">{escape(row.stack)}</th>{"".join(cells)}</tr>')


def _smoke_text(smoke) -> str:
    if smoke.outcome == "not run":
        return '<span class="outcome">not run</span>'
    counts = "" if smoke.passed is None else f" {smoke.passed} passed, {smoke.failed} failed, {smoke.skipped} skipped"
    checks = "".join(f'<li class="failed-check" data-check="{escape(check)}"><code>{escape(check)}</code></li>'
                     for check in smoke.failed_checks)
    return (f'<span class="outcome outcome-{_slug(smoke.outcome)}">{escape(smoke.outcome)}</span>{escape(counts)}'
            + (f'<ul class="plain failed-checks" aria-label="failed checks">{checks}</ul>' if checks else ""))


def _smoke(row: Row) -> str:
    text = _smoke_text(row.smoke)
    if row.rejected:
        text += (f'<div class="rejected">candidate {_code(short(row.rejected.image_id), row.rejected.image_id)} '
                 f"rejected: {_smoke_text(row.rejected)}</div>")
    return text


def _modes(row: Row) -> str:
    items = []
    for mode in row.modes:
        reference = f"{mode.reference_tok_s:g}" if mode.reference_tok_s is not None else "none"
        measured = f"{mode.tok_s:.1f}" if mode.tok_s is not None else "–"
        change = f" {mode.change * 100:+.1f}%" if mode.change is not None else ""
        items.append(
            f'<li data-mode="{escape(mode.mode)}" data-verdict="{escape(mode.verdict)}" '
            f'title="judged against {escape(mode.reference)}"><span class="mode">{escape(mode.mode)}</span> '
            f'<span class="figure">{measured} / {reference} tok/s{change} ±{mode.tolerance * 100:g}%</span> '
            f'<strong class="verdict verdict-{_slug(mode.verdict)}">{escape(mode.verdict)}</strong></li>')
    return f'<ul class="plain modes">{"".join(items)}</ul>'


def _patches(row: Row) -> str:
    if not row.patches:
        return "none"
    groups: dict[str, list[str]] = {}
    for p in row.patches:
        groups.setdefault(f"{p.distribution} {p.version}", []).append(
            f'<li data-patch="{escape(p.distribution)}/{escape(p.name)}" data-state="{escape(p.in_image)}">'
            f'<code>{escape(p.name.removesuffix(".patch"))}</code> '
            f'<span class="patch-{_slug(p.in_image)}">{escape(p.in_image)}</span>'
            f'{escape(", " + p.upstream) if p.upstream else ""}</li>')
    return "".join(f'<div class="series">{escape(name)}<ul class="plain">{"".join(items)}</ul></div>'
                   for name, items in groups.items())


def _when(point: BenchPoint) -> str:
    return WORKING_TREE if point.commit is None else f"{point.when[:10]} {point.commit[:7]}"


def _bench_figure(number: int, row: Row, stack: Stack, history: tuple[BenchPoint, ...],
                  figures: dict[str, list[dict]]) -> str:
    modes = [mode.name for mode in stack.serve.modes]
    mine = [p for p in history if p.stack == row.stack]
    slots = list(dict.fromkeys(_when(p) for p in mine))
    points = [svg.Point(p.mode, p.tok_s, p.verdict, slots.index(_when(p)),
                        f"{p.mode}: {p.tok_s:.1f} tok/s, {p.verdict or 'no verdict'}, {_when(p)}, "
                        f"image {short(p.image_id)}, {p.hardware}, model {p.model}") for p in mine]
    references = reference_lines(stack, figures)
    lines = [svg.Line(f"R{i}", r.stack, r.mode, r.tok_s, r.pinned,
                      f"R{i}: {r.stack} {r.mode} {r.tok_s:g} tok/s, attention backend {r.attention_backend}"
                      f"{', pinned' if r.pinned else ', for comparison only'}; note: {r.note}")
             for i, r in enumerate(references, start=1)]
    plot_id = f"bench-{number}"
    measured = "; ".join(p.label for p in points) or "no bench figure is recorded for this row yet"
    desc = (f"Bench figures of {row.stack} over time, tok/s per serve mode. Measured: {measured}. "
            f"Reference figures: " + ("; ".join(line.label for line in lines) or "none") + ".")
    plot = svg.bench_plot(plot_id, f"{row.stack}: bench figures over time against the reference figures",
                          desc, modes, slots, points, lines)
    legend = "".join(f'<li><span class="swatch" style="border-color:{svg.mode_colour(modes, m)}"></span>{escape(m)}</li>'
                     for m in modes)
    refs = "".join(
        f'<li data-key="R{i}" data-stack="{escape(r.stack)}" data-mode="{escape(r.mode)}" data-tok-s="{r.tok_s:g}">'
        f'<strong>R{i}</strong> {escape(r.stack)}, {escape(r.mode)}: {r.tok_s:g} tok/s '
        f'({"pinned" if r.pinned else "for comparison only"}; attention backend {escape(r.attention_backend)}). '
        f'<span class="note">Note: {escape(r.note)}</span></li>' for i, r in enumerate(references, start=1))
    table = ""
    if mine:
        cells = "".join(f'<tr><td>{escape(p.mode)}</td><td>{p.tok_s:.1f}</td><td>{escape(p.verdict or "-")}</td>'
                        f'<td>{escape(_when(p))}</td><td><code>{escape(short(p.image_id) or "")}</code></td></tr>'
                        for p in mine)
        table = (f'<div class="table-wrap"><table class="figures"><caption>Measured figures of {escape(row.stack)}</caption><thead><tr>'
                 '<th scope="col">mode</th><th scope="col">tok/s</th><th scope="col">verdict</th>'
                 f'<th scope="col">recorded</th><th scope="col">image</th></tr></thead><tbody>{cells}</tbody></table></div>')
    return (f'<figure class="bench" data-stack="{escape(row.stack)}" aria-labelledby="{plot_id}-caption">'
            f'<figcaption id="{plot_id}-caption"><h3>{escape(row.stack)}</h3></figcaption>{plot}'
            f'<ul class="legend" aria-label="serve modes">{legend}</ul>'
            f'<ol class="plain references" aria-label="reference figures">{refs or "<li>no reference figure</li>"}</ol>'
            f"{table}</figure>")


def step_label(step: str) -> str:
    """A layer's creating step in at most 40 characters: `install torch wheels`, `COPY runtime/`."""
    text = _step_words(step)
    return text if len(text) <= 40 else text[:39] + "…"


def _step_words(step: str) -> str:
    text = re.sub(r"^\|\d+ (\S+=\S* )*", "", step.strip())  # the build arguments buildah records first
    text = text.removeprefix("/bin/sh -c ").removeprefix("#(nop) ").strip()
    text = re.sub(r"--mount=\S+\s*", "", text)
    copied = re.fullmatch(r"COPY (?:file|dir) in (\S+)", text)
    if copied:
        target = copied.group(1)
        return "COPY " + target.rstrip("/").rsplit("/", 1)[-1] + ("/" if target.endswith("/") else "")
    try:
        words = [str(word) for word in json.loads(text)] if text.startswith("[") else []
    except ValueError:
        words = []
    if "-r" in words[:-1]:  # images from before the builder wrote the wheel layers
        return "pip install " + words[words.index("-r") + 1].rsplit("/", 1)[-1]
    tool = next((i for i, word in enumerate(words) if word.endswith("/install_wheels.py")), None)
    if tool is not None and words[tool + 1:tool + 2] == ["install"] and len(words) > tool + 2:
        return "install " + words[tool + 2].rsplit("/", 1)[-1].removesuffix(".plan.json") + " wheels"
    if tool is not None and words[tool + 1:tool + 2] == ["compile"]:
        return "compile site-packages"
    if any(word.endswith("apply_patch.py") for word in words):
        return "patch " + words[-1].rsplit("/", 1)[-1].removesuffix(".patch")
    return " ".join(words) or text


def _layer_figures(status: Status, lock: store.LockFile, root: Path) -> list[str]:
    out = []
    for number, row in enumerate(status.rows):
        if not row.image_id:
            continue
        layers, report = image_layers(lock.get(row.stack), root)
        heading = f"<h3>{escape(row.stack)}: image <code>{escape(row.short_image or '')}</code></h3>"
        if not layers:
            out.append(f'<figure class="layers" data-stack="{escape(row.stack)}">{heading}<p>No layer sizes: its '
                       f"build report {_code(report)} is not in this checkout.</p></figure>")
            continue
        total = sum(layer.bytes for layer in layers)
        bars = [svg.Bar(step_label(layer.step), layer.step, layer.bytes) for layer in layers]
        ranked = sorted(bars, key=lambda bar: -bar.bytes)
        plot_id = f"layers-{number}"
        desc = (f"{len(bars)} layers, {svg.human_bytes(total)} in all. Largest: "
                + "; ".join(f"{bar.label} {svg.human_bytes(bar.bytes)} ({100 * bar.bytes / total:.1f}%)"
                            for bar in ranked[:3]) + ".")
        plot = svg.layer_bars(plot_id, f"{row.stack}: bytes per layer", desc, bars)
        cells = "".join(f'<tr data-bytes="{bar.bytes}"><td>{i}</td><td><code title="{escape(bar.step)}">'
                        f'{escape(bar.label)}</code></td><td>{svg.human_bytes(bar.bytes)}</td>'
                        f'<td>{100 * bar.bytes / total:.1f}%</td></tr>' for i, bar in enumerate(bars, start=1))
        out.append(
            f'<figure class="layers" data-stack="{escape(row.stack)}" data-total-bytes="{total}" '
            f'aria-labelledby="{plot_id}-caption"><figcaption id="{plot_id}-caption">{heading}'
            f"<p>{len(bars)} layers, {svg.human_bytes(total)} uncompressed (from {_code(report)}); the largest, "
            f"{escape(ranked[0].label)}, is {100 * ranked[0].bytes / total:.0f}% of it.</p></figcaption>{plot}"
            f'<div class="table-wrap"><table class="layer-table"><caption>Layers of {escape(row.stack)}, in build order</caption><thead><tr>'
            '<th scope="col">#</th><th scope="col">step</th><th scope="col">size</th><th scope="col">share</th>'
            f"</tr></thead><tbody>{cells}</tbody></table></div></figure>")
    return out or ["<p>No image is recorded in the lock yet.</p>"]


def _upstream_table(status: Status) -> str:
    rows = [row.stack for row in status.rows]
    head = "".join(f'<th scope="col">{escape(name)}</th>' for name in rows)
    body = []
    for item in status.upstream:
        pins = dict(item.pins)
        newest = escape(item.newest) if item.newest else "not checked"
        checked = escape(item.checked[:10]) if item.checked else "-"
        cells = []
        for name in rows:
            version = pins.get(name)
            behind = version is not None and item.newer_than(version)
            text = escape(version) + (" (older)" if behind else "") if version else "-"
            cells.append(f'<td data-label="{escape(name)}"{_class("behind" if behind else "")}>{text}</td>')
        body.append(f'<tr data-package="{escape(item.package)}"><th scope="row">{escape(item.package)}</th>'
                    f'<td data-label="newest">{newest}</td><td data-label="checked">{checked}</td>{"".join(cells)}</tr>')
    note = ("" if any(item.newest for item in status.upstream) else
            "<p>No look-up is recorded here: <code>builder bump --newer PACKAGE</code> or "
            "<code>builder status --refresh-newer</code> asks pip's default index.</p>")
    return ('<section aria-labelledby="upstream-title"><h2 id="upstream-title">Upstream against the matrix</h2>'
            f'{note}<div class="table-wrap"><table class="upstream"><caption>The newest final release on pip\'s '
            "default index at the last look-up, and each row's pin</caption><thead><tr>"
            f'<th scope="col">package</th><th scope="col">newest</th><th scope="col">checked</th>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div></section>")
