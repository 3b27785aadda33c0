"""Why a stalled job hangs: the ranks' stacks compared, and the ranks that are not where the others are named.

When the heartbeat stops (lifecycle._handle_stall), the controller asks every rank of the attempt for its main
thread's Python stack (the trainer's and ``kubetrain_trainer.report()``'s ``GET /stacks``) before the gang
restart, and :func:`explain` reads them. A rank inside ``torch.distributed`` waits for its peers, so when some
ranks wait in a collective and others do not, those others hold the gang up: they are the culprits. When all
are in collectives, or none is, the ranks whose stack differs from a strict majority's are. A rank that did not
answer is a culprit too: a rank stuck in native code that holds the interpreter cannot answer. The failure
record keeps each distinct stack once, with the ranks that share it (``kubetrain logs --attempt N`` prints them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Frame", "Hang", "RankStack", "Silent", "explain", "parse_stack", "rank_ranges"]

Json = Any

# Bounds on what a failure record keeps (the status lives in etcd, with up to 20 failure records).
MAX_GROUPS = 4
MAX_CULPRITS = 8
STACK_FRAMES_KEPT = 12
STACK_CHARS = 1536
SUMMARY_CHARS = 700
RANKS_CHARS = 1024
# A frame in one of these is torch's, Python's or an installed library's; the innermost frame elsewhere is
# where the program is.
_LIBRARY_PARTS = ("/torch/", "/lib/python3")
_COLLECTIVE_PART = "/torch/distributed/"


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def where(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} in {self.function}"


@dataclass(frozen=True)
class RankStack:
    """One rank's answer: its global rank, its pod, its main thread's frames (outermost first)."""

    rank: int
    pod: str
    frames: tuple[Frame, ...]

    @property
    def collective(self) -> str | None:
        """The torch.distributed call the rank waits in (its innermost frame there), or None."""
        return next((f.function for f in reversed(self.frames) if _COLLECTIVE_PART in f.file), None)

    @property
    def position(self) -> Frame | None:
        """The innermost frame of the program itself (not torch's, not Python's)."""
        own = [f for f in self.frames if _programs(f)]
        return own[-1] if own else (self.frames[-1] if self.frames else None)

    @property
    def place(self) -> tuple[str | None, Frame | None]:
        """Where the rank is, as ranks are compared: the collective it waits in, and its own innermost frame."""
        return self.collective, self.position

    def describe(self) -> str:
        """Where the rank is, to follow "is" or "are": "waiting in all_reduce at train.py:30 in step"."""
        at = f"at {self.position.where()}" if self.position else "with an empty stack"
        return f"waiting in {self.collective} {at}" if self.collective else at


def _programs(frame: Frame) -> bool:
    """Whether a frame is the program's: not torch's or Python's (the built-in trainer is a program here)."""
    return "/site-packages/kubetrain" in frame.file or not any(part in frame.file for part in _LIBRARY_PARTS)


@dataclass(frozen=True)
class Silent:
    """A rank that did not answer: its pod, its local rank, and why."""

    pod: str
    local_rank: int
    error: str


@dataclass(frozen=True)
class Hang:
    summary: str
    culprits: tuple[dict[str, Json], ...]
    groups: tuple[dict[str, Json], ...]

    def record(self) -> dict[str, Json]:
        """The failure record's ``hang``."""
        return {"summary": self.summary, "culprits": list(self.culprits), "stacks": list(self.groups)}


def parse_stack(answer: Mapping[str, Json]) -> RankStack:
    """A rank's ``GET /stacks`` answer (kubetrain_trainer.stacks); ValueError/KeyError/TypeError when malformed."""
    frames = tuple(Frame(str(file), int(line), str(name)) for file, line, name in answer["frames"])
    return RankStack(rank=int(answer["rank"]), pod=str(answer["pod"]), frames=frames)


def explain(stacks: Sequence[RankStack], silent: Sequence[Silent], nodes: Mapping[str, str]) -> Hang:
    """Compare the ranks' stacks; ``nodes``: each pod's node."""
    stacks = sorted(stacks, key=lambda s: s.rank)
    behind = _behind(stacks)
    culprits = [_culprit(s.rank, s.pod, nodes, s.describe()) for s in behind]
    culprits += [_culprit(None, s.pod, nodes, f"local rank {s.local_rank} did not answer ({s.error})")
                 for s in silent]
    summary = _summary(stacks, behind, silent, nodes)[:SUMMARY_CHARS]
    return Hang(summary=summary, culprits=tuple(culprits[:MAX_CULPRITS]), groups=tuple(_groups(stacks, behind)))


def _behind(stacks: Sequence[RankStack]) -> list[RankStack]:
    """The ranks not where the others are: outside the collective the others wait in, or else off the majority."""
    waiting = [s for s in stacks if s.collective]
    if waiting and len(waiting) < len(stacks):
        return [s for s in stacks if not s.collective]
    by_place = _by(stacks, lambda s: s.place)
    largest = max((len(group) for group in by_place.values()), default=0)
    if len(by_place) < 2 or largest * 2 <= len(stacks):
        return []
    return [s for group in by_place.values() if len(group) < largest for s in group]


def _summary(stacks: Sequence[RankStack], behind: Sequence[RankStack], silent: Sequence[Silent],
             nodes: Mapping[str, str]) -> str:
    parts = [f"rank {s.rank} ({_pod_text(s.pod, nodes)}) is {s.describe()}" for s in behind[:MAX_CULPRITS]]
    late = {s.rank for s in behind}
    rest = [s for s in stacks if s.rank not in late]
    if behind and rest:
        parts.append(f"{_ranks_text([s.rank for s in rest])} {_common(rest)}")
    elif stacks and not behind:
        parts.append(_no_culprit(stacks))
    if silent:
        pods = sorted({f"{_pod_text(s.pod, nodes)} local rank {s.local_rank}" for s in silent})
        parts.append(f"no answer from {', '.join(pods[:MAX_CULPRITS])}")
    return "; ".join(parts) if parts else "no rank answered"


def _pod_text(pod: str, nodes: Mapping[str, str]) -> str:
    return f"pod {pod} on {nodes[pod]}" if nodes.get(pod) else f"pod {pod}"


def _no_culprit(stacks: Sequence[RankStack]) -> str:
    places = _by(stacks, lambda s: s.place)
    if len(places) == 1:
        return f"all {len(stacks)} answering ranks are {stacks[0].describe()}: none is behind the others"
    return f"the ranks are at {len(places)} places, none shared by most of them"


def _common(stacks: Sequence[RankStack]) -> str:
    """Where a group of ranks is, when they all are at one place; else at how many."""
    places = {s.describe() for s in stacks}
    verb = "is" if len(stacks) == 1 else "are"
    return f"{verb} {places.pop()}" if len(places) == 1 else f"are at {len(places)} other places"


def _groups(stacks: Sequence[RankStack], behind: Sequence[RankStack]) -> list[dict[str, Json]]:
    """Each distinct stack once with its ranks: the culprits' first, then the most shared."""
    late = {s.rank for s in behind}
    by_stack = _by(stacks, lambda s: s.frames)
    ordered = sorted(by_stack.values(), key=lambda group: (not any(s.rank in late for s in group), -len(group)))
    return [{"ranks": _bounded(rank_ranges([s.rank for s in group])), "stack": _stack_text(group[0].frames)}
            for group in ordered[:MAX_GROUPS]]


def _bounded(ranks: str) -> str:
    """At most RANKS_CHARS, cut after a whole range."""
    return ranks if len(ranks) <= RANKS_CHARS else ranks[:ranks.rfind(",", 0, RANKS_CHARS - 4)] + ",..."


def _stack_text(frames: Sequence[Frame]) -> str:
    """The innermost frames, innermost last, as tracebacks print them; trimmed from the outside."""
    kept = frames[-STACK_FRAMES_KEPT:]
    lines = [f"{f.file}:{f.line} in {f.function}" for f in kept]
    while len("\n".join(lines)) > STACK_CHARS and len(lines) > 1:
        lines.pop(0)
    omitted = len(frames) - len(lines)
    head = [f"... {omitted} outer frame(s)"] if omitted else []
    return "\n".join(head + lines)[-STACK_CHARS:]


def _culprit(rank: int | None, pod: str, nodes: Mapping[str, str], where: str) -> dict[str, Json]:
    found: dict[str, Json] = {"pod": pod, "node": nodes.get(pod, ""), "where": where[:256]}
    if rank is not None:
        found["rank"] = rank
    return found


def _by(stacks: Iterable[RankStack], key: Any) -> dict[Any, list[RankStack]]:
    groups: dict[Any, list[RankStack]] = {}
    for stack in stacks:
        groups.setdefault(key(stack), []).append(stack)
    return groups


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"


def rank_ranges(ranks: Iterable[int]) -> str:
    """0,1,2,5,7,8 -> "0-2,5,7-8"."""
    spans: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
