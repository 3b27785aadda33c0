"""The Prometheus text format, written fast, and a lean HTTP server for it.

prometheus-client renders through metric objects and a WSGI stack: about 6 us per series plus a millisecond
per request here, all of it Python that holds the GIL while the training thread wants it back. This module
writes the same text (``generate_latest``'s, byte for byte, for the families the trainer serves) with
plain string joins, and serves it from one thread of :mod:`http.server`. It imports neither torch nor the
operator.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, HTTPServer
from operator import itemgetter
from typing import Any, Final

from .stacks import STACKS_PATH, stacks_answer

# Where a rank is asked to have the gang checkpoint now (for example before a disruption it was told of).
CHECKPOINT_PATH: Final = "/checkpoint"

__all__ = ["CHECKPOINT_PATH", "CONTENT_TYPE", "ExpositionServer", "header", "label_text", "number", "render_families"]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# Prometheus's text format names a few types differently from the OpenMetrics names metric objects carry.
_TYPE_NAMES: Final = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary",
                      "unknown": "untyped", "untyped": "untyped"}
_NON_FINITE: Final = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}


def number(value: float) -> str:
    """A sample value as prometheus-client writes it (Go's notation): ``42.0``, ``1.2e+06``, ``+Inf``, ``NaN``."""
    text = repr(float(value))
    dot = text.find(".")
    if dot > 6 and text[0] != "-":  # Go switches to an exponent sooner than Python (positive values only)
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    if dot < 0:  # inf, nan, or already an exponent (1e-09)
        return _NON_FINITE.get(text, text)
    return text


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


# Per set of label names (a family's samples nearly always share theirs, and a process has few sets): the
# values in sorted order, picked by one itemgetter, and the text they fill in. Label text was most of a
# 500-series scrape's time when each sample sorted and formatted its own.
_LABEL_FORMS: dict[tuple[str, ...], tuple[Callable[[Mapping[str, str]], tuple[str, ...]], str]] = {}


def label_text(labels: Mapping[str, str]) -> str:
    """``{a="x",b="y"}`` with names sorted (as prometheus-client writes them), or ``""`` without labels."""
    if not labels:
        return ""
    names = tuple(labels)
    form = _LABEL_FORMS.get(names)
    if form is None:
        ordered = sorted(names)
        form = _LABEL_FORMS[names] = (_picker(ordered), "{" + ",".join(f'{k}="%s"' for k in ordered) + "}")
    pick, template = form
    values = pick(labels)
    joined = "".join(values)  # one check for characters to escape, for all the values
    if "\\" in joined or '"' in joined or "\n" in joined:
        values = tuple(map(_escape, values))
    return template % values


def _picker(ordered: list[str]) -> Callable[[Mapping[str, str]], tuple[str, ...]]:
    """The values of the ``ordered`` labels, as a tuple (``itemgetter`` picks several at once, in C)."""
    if len(ordered) == 1:
        only = ordered[0]
        return lambda labels: (labels[only],)
    several: Callable[[Mapping[str, str]], tuple[str, ...]] = itemgetter(*ordered)
    return several


def header(name: str, kind: str, doc: str) -> str:
    """The ``# HELP`` and ``# TYPE`` lines of one family (``name`` as exposed, a counter's with ``_total``)."""
    escaped = doc.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n"


def render_families(families: Iterable[Any]) -> str:
    """prometheus-client metric families (``*MetricFamily`` objects) as exposition text."""
    out: list[str] = []
    for family in families:
        kind = _TYPE_NAMES.get(family.type)
        if kind is None or (kind != "gauge" and any(s.name.endswith("_created") for s in family.samples)):
            # info, stateset, gauge histograms, created timestamps: rare; the reference writer knows them
            out.append(_reference_text(family))
            continue
        exposed = family.name + "_total" if kind == "counter" else family.name
        out.append(header(exposed, kind, family.documentation))
        for s in family.samples:
            stamp = "" if s.timestamp is None else f" {int(float(s.timestamp) * 1000):d}"
            out.append(f"{s.name}{label_text(s.labels)} {number(s.value)}{stamp}\n")
    return "".join(out)


def _reference_text(family: Any) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    class _One:
        def collect(self) -> Iterable[Any]:
            return [family]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_One())
    return generate_latest(registry).decode("utf-8")


class _Handler(BaseHTTPRequestHandler):
    server: ExpositionServer
    timeout = 10  # a client that stops reading cannot hold the one serving thread for long
    disable_nagle_algorithm = True  # headers and body leave at once, never behind a delayed ACK

    def do_GET(self) -> None:
        if self.path.startswith("/favicon.ico"):
            self.send_error(404)
            return
        if self.path.split("?")[0] == STACKS_PATH:
            self._send(stacks_answer(), "application/json", zipped=False)
            return
        zipped = "gzip" in self.headers.get("Accept-Encoding", "")
        self._send(self.server.render().encode("utf-8"), CONTENT_TYPE, zipped=zipped)

    def do_POST(self) -> None:
        """``POST /checkpoint``: the gang checkpoints together at its next step boundary (loop.py's votes)."""
        if self.path.split("?")[0] != CHECKPOINT_PATH:
            self.send_error(404)
            return
        if self.server.on_checkpoint is None:
            self._send(b"this process does not checkpoint on request\n", "text/plain", zipped=False, status=501)
            return
        self.server.on_checkpoint()
        self._send(b"the gang checkpoints at its next step\n", "text/plain", zipped=False, status=202)

    def _send(self, body: bytes, content_type: str, *, zipped: bool, status: int = 200) -> None:
        if zipped:
            body = gzip.compress(body, compresslevel=1)  # Prometheus asks for it; level 1 is nearly free
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if zipped:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        pass  # a line per scrape would drown the trainer's own log


# How often the serving thread looks for close(): a worker that stops (SIGTERM, a restart, a lost peer's
# replacement joining) waits for it, and http.server's 0.5 s default was most of such a worker's exit.
SHUTDOWN_POLL_SECONDS = 0.05


class ExpositionServer(HTTPServer):
    """Serves ``render()`` on every path but /favicon.ico and /stacks (stacks.py), and takes ``POST /checkpoint``
    (``on_checkpoint``), from one daemon thread: requests are rare and short, so one thread is enough, and no
    thread is started per request."""

    allow_reuse_address = True

    def __init__(self, port: int, render: Callable[[], str], host: str = "0.0.0.0",  # scraped from outside
                 on_checkpoint: Callable[[], None] | None = None) -> None:
        super().__init__((host, port), _Handler)
        self.render = render
        self.on_checkpoint = on_checkpoint
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
                                       name="metrics-server", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=5)
