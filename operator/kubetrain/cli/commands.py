"""The `kubetrain` command: validate, render, run (locally), watch and operator."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import yaml

from kubetrain.controller.operator_main import DESCRIPTION, TRAINER_IMAGE_HELP, trainer_image_problem
from kubetrain.core import api
from kubetrain.core.manifests import build_pod_group, build_pods, build_service
from kubetrain.core.schema import Problem
from kubetrain.core.spec import SpecError, TrainingJob, parse, validate

__all__ = ["main"]

EXIT_INVALID = 2


def _documents(path: Path) -> Iterator[tuple[int, Any]]:
    """(document number, object) for each YAML document in a file; raises yaml.YAMLError."""
    text = path.read_text(encoding="utf-8")
    for number, document in enumerate(yaml.safe_load_all(text), start=1):
        if document is not None:
            yield number, document


def _yaml_problem(error: yaml.YAMLError) -> Problem:
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "YAML"
    reason = getattr(error, "problem", None) or str(error)
    return Problem(where, f"YAML syntax error: {reason}")


def file_problems(path: Path) -> list[Problem]:
    """Every problem in one file of TrainingJobs (YAML errors included)."""
    try:
        documents = list(_documents(path))
    except yaml.YAMLError as error:
        return [_yaml_problem(error)]
    if not documents:
        return [Problem("<file>", "holds no YAML document")]
    problems: list[Problem] = []
    for number, document in documents:
        prefix = f"document {number}: " if len(documents) > 1 else ""
        problems += [Problem(prefix + p.path, p.message) for p in validate(document)]
    return problems


def load_job(path: Path, namespace: str | None = None) -> TrainingJob:
    """The single TrainingJob in ``path``; raises click.ClickException with every problem."""
    problems = file_problems(path)
    if problems:
        lines = "\n".join(f"  {p}" for p in problems)
        raise click.ClickException(f"{path} is not a valid TrainingJob:\n{lines}")
    documents = [d for _, d in _documents(path)]
    if len(documents) != 1:
        raise click.ClickException(f"{path} holds {len(documents)} documents; expected one TrainingJob")
    document = documents[0]
    if namespace:
        document.setdefault("metadata", {})["namespace"] = namespace
    try:
        return parse(document)
    except SpecError as error:  # unreachable after validate(); kept for a clear message
        raise click.ClickException(str(error)) from error


def _image_reference(_context: click.Context, _parameter: click.Parameter, value: str) -> str:
    problem = trainer_image_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


# render's options that the operator has too (operator_main.py defines the operator's).
trainer_image_option = click.option(
    "--trainer-image", default=api.DEFAULT_TRAINER_IMAGE, show_default=True, metavar="REF",
    callback=_image_reference, help=TRAINER_IMAGE_HELP)

gang_option = click.option("--gang-scheduling", is_flag=True,
                           help="Also the attempt's PodGroup (scheduling.k8s.io/v1beta1), as the operator makes it "
                                "with gang scheduling on, and the pods' schedulingGroup.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kubetrain")
def main() -> None:
    """kubetrain: distributed PyTorch training jobs on Kubernetes, or on this machine."""


@main.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def validate_command(files: tuple[Path, ...]) -> None:
    """Check TrainingJob files against the CRD's schema and rules, as `kubectl apply` would.

    Exits 0 when every file is valid, 2 otherwise, with one line per problem.
    """
    failed = False
    for path in files:
        problems = file_problems(path)
        for problem in problems:
            click.echo(f"{path}: {problem}", err=True)
        if problems:
            failed = True
        else:
            click.echo(f"{path}: valid {api.KIND}")
    if failed:
        sys.exit(EXIT_INVALID)


@main.command("render")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--namespace", "-n", default=None, help="Namespace of the rendered objects (default: the job's).")
@click.option("--attempt", default=0, show_default=True, help="Attempt number to render the pods for.")
@trainer_image_option
@gang_option
def render_command(file: Path, namespace: str | None, attempt: int, trainer_image: str,
                   gang_scheduling: bool) -> None:
    """Print the Service (and PodGroup) and the pods the operator would create for FILE, as YAML."""
    job = load_job(file, namespace)
    companions = [build_service(job), *([build_pod_group(job, attempt)] if gang_scheduling else [])]
    objects = [*companions, *build_pods(job, attempt, default_image=trainer_image, gang=gang_scheduling)]
    click.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)


@main.command("run")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--workdir", default=Path(".kubetrain"), show_default=True, type=click.Path(path_type=Path),
              help="Where checkpoints and logs go (one folder per job; a second run resumes).")
def run_command(file: Path, workdir: Path) -> None:
    """Run the TrainingJob in FILE on this machine: one torchrun agent per node, real c10d rendezvous."""
    job = load_job(file)
    if job.spec.gpus_per_node:
        import torch

        visible = torch.cuda.device_count()
        if visible < job.spec.gpus_per_node * job.spec.nodes:
            raise click.ClickException(
                f"{file}: spec.gpusPerNode: {job.spec.nodes} node(s) x {job.spec.gpus_per_node} GPUs requested, "
                f"this machine has {visible}; set gpusPerNode: 0 and procsPerNode: N to run on CPU"
            )
    from rich.console import Console

    from kubetrain.cli.local import run_local

    # soft_wrap: the terminal wraps long lines itself; a log file or pipe gets paths unbroken.
    sys.exit(run_local(job, workdir, Console(soft_wrap=True)))


# The options are operator_main's (argparse), so that the operator's process need not import click at all:
# `kubetrain operator --help` prints them.
@main.command("operator", help=DESCRIPTION, add_help_option=False,
              context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def operator_command(args: tuple[str, ...]) -> None:
    from kubetrain.controller.operator_main import run

    sys.exit(run(args))


@contextlib.contextmanager
def _cluster_errors(name: str, namespace: str) -> Iterator[None]:
    """The API server's refusals, a missing login and an unreachable server as one line each, not a traceback."""
    import aiohttp
    import kopf

    from kubetrain.k8s.transport import HTTP_NOT_FOUND, ApiError

    try:
        yield
    except ApiError as error:
        if error.status != HTTP_NOT_FOUND:
            raise click.ClickException(f"the API server refused: {error.status} {error.reason}") from error
        raise click.ClickException(f'trainingjob "{name}" not found in namespace "{namespace}"') from error
    except kopf.LoginError as error:
        raise click.ClickException(f"no credentials for the cluster: {error}") from error
    except (aiohttp.ClientError, OSError) as error:
        raise click.ClickException(f"cannot reach the API server: {type(error).__name__}: {error}") from error


@main.command("watch")
@click.argument("name")
@click.option("--namespace", "-n", default="default", show_default=True)
@click.option("--timeout", default=86400, show_default=True, help="Give up after this many seconds.")
def watch_command(name: str, namespace: str, timeout: int) -> None:
    """Show a live progress bar of a TrainingJob until it finishes, reconnecting when the watch drops
    (exit 0: Succeeded, 1: Failed or deleted, 3: --timeout passed)."""
    from kubetrain.cli.watch import watch_job

    with _cluster_errors(name, namespace):
        code = watch_job(namespace, name, timeout)
    sys.exit(code)


@main.command("logs")
@click.argument("name")
@click.option("--namespace", "-n", default="default", show_default=True)
@click.option("--follow", "-f", is_flag=True, help="Keep streaming, through every new attempt, until the job ends.")
@click.option("--attempt", type=click.IntRange(min=0), default=None,
              help="This attempt's pods (default: the newest); when they are gone, its recorded failures.")
@click.option("--rank", type=click.IntRange(min=0), default=None, help="Only this global rank's lines.")
def logs_command(name: str, namespace: str, follow: bool, attempt: int | None, rank: int | None) -> None:
    """Print the output of every pod of a TrainingJob, each line prefixed by its node
    (exit 0: shown, or with --follow the job succeeded; 1: nothing to show, or the job failed)."""
    from kubetrain.cli.logs import show_logs

    try:
        with _cluster_errors(name, namespace):
            code = show_logs(namespace, name, follow=follow, attempt=attempt, rank=rank, write=click.echo)
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


@main.command("clear-excluded-nodes")
@click.argument("name")
@click.option("--namespace", "-n", default="default", show_default=True)
def clear_excluded_nodes_command(name: str, namespace: str) -> None:
    """Let a TrainingJob place its next pods on the nodes it excluded after failures there (status.excludedNodes):
    the operator forgets those exclusions, and the failures that led to them, up to now."""
    import asyncio
    from datetime import UTC, datetime

    from kubetrain.cli.cluster import connect
    from kubetrain.core.nodes import CLEAR_ANNOTATION
    from kubetrain.core.status import isoformat

    async def clear() -> list[str]:
        async with connect(namespace) as cluster:
            job = await cluster.annotate_job(name, {CLEAR_ANNOTATION: isoformat(datetime.now(UTC))})
        return [entry["node"] for entry in (job.get("status") or {}).get("excludedNodes") or []]

    with _cluster_errors(name, namespace):
        nodes = asyncio.run(clear())
    click.echo(f"trainingjob {name}: " + (f"node(s) {', '.join(nodes)} cleared; the operator lets its next pods go "
                                          "there" if nodes else "no excluded nodes; later failures count afresh"))


if __name__ == "__main__":
    main()
