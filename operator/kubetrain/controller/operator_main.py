"""`kubetrain operator`: its arguments and its start, without click.

The operator's process never imports the click CLI (cli/commands.py): click's modules alone were 1 MiB of the idle
operator's 45 (on the lab, 3 starts each: 45.3-45.5 MiB with click, 44.4-44.5 without). `kubetrain operator`
gets here from the console script's dispatcher (kubetrain/__main__.py), and from click's `operator` command,
which hands its arguments over unparsed: the options are defined here only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Iterator, Sequence

from kubetrain.controller.memory import leave_out_what_the_operator_does_not_use
from kubetrain.controller.operator_config import OperatorConfig
from kubetrain.core import api

__all__ = ["DESCRIPTION", "GANG_SCHEDULING_HELP", "LOG_FORMATS", "LOG_LEVELS", "TRAINER_IMAGE_HELP", "parser",
           "run", "trainer_image_problem"]

DESCRIPTION = "Run the operator: reconcile TrainingJobs in the given namespaces (or all of them)."
# --log-level: the chart's operator.logLevel values, one for one (tests/test_chart_operator_args.py keeps them equal).
LOG_LEVELS = ("quiet", "normal", "verbose", "debug")
# kopf's log formats (kopf.LogFormat), by their lower-case names.
LOG_FORMATS = ("plain", "full", "json")
NAMESPACE_PATTERN = "*?!,"  # a --namespace with one of these is a pattern (see operator_config.matches_namespace)
TRAINER_IMAGE_HELP = "Image of the pods of jobs that leave spec.image unset."
GANG_SCHEDULING_HELP = ("Kubernetes' own gang scheduling: each attempt of a job gets a scheduling.k8s.io/v1beta1 "
                        "PodGroup (minCount = its nodes, spec.scheduling.topology as its topology constraint), "
                        "placed all or none by kube-scheduler. auto: where the API server serves PodGroups "
                        "(feature gate GenericWorkload).")


def trainer_image_problem(value: str) -> str:
    """Why ``value`` cannot be the default trainer image ("" if it can): the bounds of spec.image, which it stands
    in for. The built-in default meets them (tests/test_cli.py) and is not checked: the check loads the whole
    CRD, 0.8 MB of an idle operator's memory."""
    if value == api.DEFAULT_TRAINER_IMAGE:
        return ""
    from kubetrain.core.schema import field_problems

    return "; ".join(problem.message for problem in field_problems("spec.image", value))


def _trainer_image(value: str) -> str:
    problem = trainer_image_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: a whole number of at least 1")
    return int(value)


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(prog="kubetrain operator", description=DESCRIPTION, allow_abbrev=False)
    shown = " (default: %(default)s)"
    options.add_argument("--namespace", "-n", dest="namespaces", action="append", default=[], metavar="NS",
                         help="Watch this namespace (repeatable); a glob such as 'team-*' or '!kube-*' watches "
                              "those that match, and comma-separated globs combine: 'team-*,!team-tmp-*' (patterns "
                              "need the cluster-wide role: the operator then reads jobs in every namespace).")
    options.add_argument("--all-namespaces", "-A", action="store_true",
                         help="Watch every namespace (cluster-wide RBAC).")
    options.add_argument("--metrics-port", type=int, default=8080, metavar="PORT",
                         help="Port of the operator's /metrics (0: off)." + shown)
    options.add_argument("--liveness", default="http://0.0.0.0:8081/healthz", metavar="URL",
                         help="Liveness endpoint URL (empty: off)." + shown)
    options.add_argument("--progress-interval", type=float, default=10.0, metavar="SECONDS",
                         help="Seconds between scrapes of a running job's rank-0 metrics." + shown)
    # Both write log_level: the last of the two on the command line wins.
    options.add_argument("--log-level", choices=LOG_LEVELS, default="normal",
                         help="quiet: warnings and errors only; verbose: every handler call; debug: asyncio's "
                              "logs too." + shown)
    options.add_argument("--verbose", "-v", dest="log_level", action="store_const", const="verbose",
                         help="Same as --log-level=verbose.")
    options.add_argument("--log-format", choices=LOG_FORMATS, default="plain",
                         help="plain: the message (the kubelet adds timestamps); full: time, logger and level; "
                              "json: one object per line." + shown)
    options.add_argument("--trainer-image", type=_trainer_image, default=api.DEFAULT_TRAINER_IMAGE, metavar="REF",
                         help=TRAINER_IMAGE_HELP + shown)
    options.add_argument("--gang-scheduling", type=api.GangScheduling, choices=list(api.GangScheduling),
                         default=api.GangScheduling.AUTO, help=GANG_SCHEDULING_HELP + shown)
    options.add_argument("--api-connections", type=_positive, default=OperatorConfig.api_connections, metavar="N",
                         help="Requests to the API server at once (more wait their turn; a 4,096-pod gang's creates "
                              "go N at a time). The API server's priority and fairness share for the operator "
                              "(the chart's FlowSchema) should seat at least N." + shown)
    options.add_argument("--looks-per-second", type=_positive, default=int(OperatorConfig.looks_per_second),
                         metavar="N", help="Reconciles a second on the operator's own schedule (running jobs' "
                         "progress reads every --progress-interval, other jobs' resyncs every 30 s); with more "
                         "jobs than that allows, each is looked at less often alike." + shown)
    return options


def run(argv: Sequence[str]) -> int:
    """Parse ``argv`` (exits 2 on a bad argument, 0 after --help) and run the operator until it stops."""
    options = parser()
    args = options.parse_args(list(argv))
    if not args.namespaces and not args.all_namespaces:
        options.error("name the namespaces to watch (--namespace NS ...) or pass --all-namespaces")
    if args.namespaces and args.all_namespaces:
        options.error("--namespace and --all-namespaces exclude each other: keep one (with the chart, set "
                      "watchNamespaces rather than passing either in operator.extraArgs)")
    leave_out_what_the_operator_does_not_use()
    import kopf
    from prometheus_client import start_http_server

    from kubetrain.controller import handlers  # noqa: F401 - registers the handlers in kopf's default registry

    namespaces = tuple(args.namespaces)
    patterns = namespace_patterns(namespaces)
    config = OperatorConfig(progress_interval=args.progress_interval, trainer_image=args.trainer_image,
                            gang_scheduling=args.gang_scheduling, all_namespaces=args.all_namespaces,
                            namespace_patterns=patterns, api_connections=args.api_connections,
                            looks_per_second=args.looks_per_second)
    level = args.log_level
    kopf.configure(debug=level == "debug", verbose=level == "verbose", quiet=level == "quiet",
                   log_format=kopf.LogFormat[args.log_format.upper()])
    if args.metrics_port:
        start_http_server(args.metrics_port)
    # standalone: one replica (the chart uses strategy Recreate), so no peering objects are needed.
    with _event_loop() as loop:
        kopf.run(loop=loop, standalone=True, clusterwide=args.all_namespaces or bool(patterns),
                 namespaces=() if patterns else namespaces,
                 liveness_endpoint=args.liveness or None, memo=kopf.Memo(config=config))
    return 0


def namespace_patterns(namespaces: tuple[str, ...]) -> tuple[str, ...]:
    """The --namespace values when one is a pattern, else (). kopf resolves patterns by listing namespaces, then
    watching them from a second listing whose items it ignores: a namespace made between the two was missed
    until it next changed (a job there waited for minutes). So with a pattern kopf watches jobs cluster-wide
    (one watch, no namespace watch) and OperatorConfig.serves matches their namespace."""
    is_pattern = any(set(namespace) & set(NAMESPACE_PATTERN) for namespace in namespaces)
    return namespaces if is_pattern else ()


@contextlib.contextmanager
def _event_loop() -> Iterator[asyncio.AbstractEventLoop | None]:
    """uvloop's event loop where it is installed (the operator extra installs it on Linux), else None: kopf then
    runs asyncio's own. In a burst of 50 jobs uvloop cost the operator about 10 % less CPU, and with 1,000 jobs
    created it peaked lower (57 against 59-60 MiB); its import costs 1.7 MiB (docs/benchmarks.md)."""
    try:
        import uvloop
    except ImportError:
        yield None
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        yield runner.get_loop()
