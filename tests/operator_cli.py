"""`kubetrain operator ARGS` as the console script runs it (kubetrain/__main__.py), stopped just before kopf
starts (no tests here).

For tests that must know that the operator accepts and applies its arguments (the chart's among them) without
a cluster: ``kopf.run`` and the metrics server are replaced by recorders, while ``kopf.configure`` runs for
real; the root logger it reconfigures is read and then restored.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from kubetrain.__main__ import main
from kubetrain.controller.operator_config import OperatorConfig


@dataclass(frozen=True)
class Launch:
    """What `kubetrain operator` did before it would have handed over to kopf."""

    exit_code: int
    output: str
    run_kwargs: dict[str, Any] | None  # what kopf.run received; None when the command stopped earlier
    metrics_port: int | None  # the port the metrics server was started on
    root_level: int  # the root logger's level after kopf.configure
    asyncio_propagates: bool  # asyncio's own log records reach the output (debug only)
    formatters: tuple[logging.Formatter, ...]  # of the log handlers kopf.configure installed

    @property
    def config(self) -> OperatorConfig:
        """What the handlers will get through kopf's memo."""
        assert self.run_kwargs is not None, f"the operator did not reach kopf.run: {self.output}"
        config = self.run_kwargs["memo"]["config"]
        assert isinstance(config, OperatorConfig)
        return config

    def log_line(self, message: str, level: int = logging.INFO) -> str:
        """``message`` as the operator would write it."""
        assert len(self.formatters) == 1, f"expected one log handler from kopf.configure, got {self.formatters}"
        record = logging.LogRecord("kubetrain.test", level, __file__, 1, message, None, None)
        return self.formatters[0].format(record)


def _run(args: Sequence[str]) -> tuple[int, str]:
    """The exit status and the output (stdout and stderr) of `kubetrain operator ARGS`."""
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            main(["operator", *args])
    except SystemExit as exited:
        return (exited.code if isinstance(exited.code, int) else 1), output.getvalue()
    except Exception as error:  # reported in the output, for the test's assertion message
        return 1, f"{output.getvalue()}\n{error!r}"
    return 0, output.getvalue()


def launch_operator(args: Sequence[str], monkeypatch: pytest.MonkeyPatch) -> Launch:
    """Run `kubetrain operator ARGS` up to kopf.run."""
    import kopf
    import prometheus_client

    recorded: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: recorded.setdefault("run", kwargs))
    monkeypatch.setattr(prometheus_client, "start_http_server",
                        lambda port, *_, **__: recorded.setdefault("port", port))
    root, aio = logging.getLogger(), logging.getLogger("asyncio")
    saved = (root.level, list(root.handlers), aio.propagate, list(aio.handlers))
    try:
        exit_code, output = _run(args)
        added = tuple(h.formatter for h in root.handlers if h not in saved[1] and h.formatter is not None)
        return Launch(
            exit_code=exit_code,
            output=output,
            run_kwargs=recorded.get("run"),
            metrics_port=recorded.get("port"),
            root_level=root.level,
            asyncio_propagates=aio.propagate,
            formatters=added,
        )
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        aio.propagate = saved[2]
        aio.handlers[:] = saved[3]
