"""A workflow's jobs drawn on the server as an SVG graph: no script, no library, nothing loaded from
elsewhere.

Layered, top to bottom: a job without parents in the workflow is in layer 0, any other one layer below the
lowest of its parents (1 + the largest of their layers), so every edge points down. Within a layer the jobs
are ordered by where their parents are (the mean of their parents' columns; ties and jobs without parents
in the request's order): no crossing is minimised beyond that, and the same workflow is always drawn the
same. A layer wider than PER_ROW jobs wraps onto more rows, so the drawing is never wider than PER_ROW
nodes, whatever the workflow (up to 1,000 jobs); it may be tall, and scrolls within its frame.

Each node is a link to its job's page, with the job's status as its CSS class (app/ui/static/ui.css colours
them), its ref and status as its label, and all of it, unshortened, as its title. Edges go from a parent's
bottom to its child's top; past EDGES_DRAWN of them (a thousand jobs may each name a thousand parents) the
rest are left out and the caption says how many. Parents outside the workflow are not drawn (the jobs
table of the page names them). Every text is escaped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

NODE_W, NODE_H = 140, 38
GAP_X = 16  # between nodes side by side
GAP_Y = 40  # between layers, where the edges run
WRAP_GAP = 10  # between the rows of one wrapped layer
MARGIN = 8
PER_ROW = 8  # nodes side by side at most
EDGES_DRAWN = 4000
LABEL_CHARS = 20  # of a ref on its node (the title has all of it)


def _esc(value: object) -> str:
    return escape(str(value), quote=True)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Placed:
    """A job's node: its index among the workflow's jobs, its layer and its top-left corner."""

    index: int
    layer: int
    x: float
    y: float


def parents_within(jobs: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """Each job's parents among `jobs` (by index, each once, in its depends_on order): the refs of its
    depends_on that name a job shown (a parent outside the workflow is an id; a pruned one is not shown)."""
    index = {job["ref"]: i for i, job in enumerate(jobs)}
    out = []
    for job in jobs:
        seen: dict[int, None] = {}
        for parent in job.get("depends_on") or ():
            if isinstance(parent, str) and parent in index:
                seen[index[parent]] = None
        out.append(list(seen))
    return out


def layers(parents: Sequence[Sequence[int]]) -> list[int]:
    """Each job's layer: 0 without parents, else 1 + the largest of its parents' (Kahn's order, no
    recursion: a chain may be a thousand long). Jobs on a cycle (a workflow has none) go below the rest."""
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    left = [len(p) for p in parents]
    for child, of in enumerate(parents):
        for parent in of:
            children[parent].append(child)
    layer = [0] * n
    ready = deque(i for i in range(n) if left[i] == 0)
    done = 0
    while ready:
        i = ready.popleft()
        done += 1
        for child in children[i]:
            layer[child] = max(layer[child], layer[i] + 1)
            left[child] -= 1
            if left[child] == 0:
                ready.append(child)
    if done < n:
        below = max((layer[i] for i in range(n) if left[i] == 0), default=-1) + 1
        for i in range(n):
            if left[i] > 0:
                layer[i] = below
    return layer


def place(parents: Sequence[Sequence[int]]) -> tuple[list[Placed], float, float]:
    """Every job's node, and the drawing's width and height."""
    layer_of = layers(parents)
    by_layer: dict[int, list[int]] = {}
    for i, layer in enumerate(layer_of):
        by_layer.setdefault(layer, []).append(i)
    columns = min(max((len(members) for members in by_layer.values()), default=1), PER_ROW)
    width = 2 * MARGIN + columns * NODE_W + (columns - 1) * GAP_X
    placed: dict[int, Placed] = {}
    y = MARGIN
    for layer in sorted(by_layer):
        members = by_layer[layer]

        def pull(i: int) -> tuple[float, int]:
            xs = [placed[p].x for p in parents[i] if p in placed]
            return (sum(xs) / len(xs) if xs else -1.0, i)

        members.sort(key=pull)
        for start in range(0, len(members), PER_ROW):
            row = members[start : start + PER_ROW]
            indent = (columns - len(row)) * (NODE_W + GAP_X) / 2
            for column, i in enumerate(row):
                placed[i] = Placed(i, layer, MARGIN + indent + column * (NODE_W + GAP_X), y)
            y += NODE_H + WRAP_GAP
        y += GAP_Y - WRAP_GAP
    height = y - GAP_Y + MARGIN if placed else 2 * MARGIN
    return [placed[i] for i in range(len(parents))], width, height


def workflow_graph(jobs: Sequence[Mapping[str, Any]]) -> str:
    """The SVG of a workflow's jobs (get_workflow's `jobs`: ref, id, status, depends_on as refs or ids),
    in a scrolling frame, with a caption saying what it shows."""
    parents = parents_within(jobs)
    nodes, width, height = place(parents)
    edges = []
    total = sum(len(p) for p in parents)
    for child, of in enumerate(parents):
        for parent in of:
            if len(edges) == EDGES_DRAWN:
                break
            a, b = nodes[parent], nodes[child]
            x1, y1 = a.x + NODE_W / 2, a.y + NODE_H
            x2, y2 = b.x + NODE_W / 2, b.y
            bend = max((y2 - y1) / 2, 8)
            curve = (
                f"M{x1:.0f},{y1:.0f} C{x1:.0f},{y1 + bend:.0f} {x2:.0f},{y2 - bend:.0f} {x2:.0f},{y2 - 2:.0f}"
            )
            edges.append(
                f'<path class="edge" data-from="{jobs[parent]["id"]}" data-to="{jobs[child]["id"]}" '
                f'd="{curve}" marker-end="url(#arrow)"/>'
            )
    drawn = []
    for node in nodes:
        job = jobs[node.index]
        ref, job_id, status = str(job["ref"]), job["id"], str(job["status"])
        title = f"{ref}: job {job_id}, {status}"
        cx = node.x + NODE_W / 2
        drawn.append(
            f'<a class="node {_esc(status)}" href="/ui/jobs/{job_id}" data-job="{job_id}" '
            f'data-ref="{_esc(ref)}" data-layer="{node.layer}"><title>{_esc(title)}</title>'
            f'<rect x="{node.x:.0f}" y="{node.y:.0f}" width="{NODE_W}" height="{NODE_H}" rx="5"/>'
            f'<text x="{cx:.0f}" y="{node.y + 15:.0f}" text-anchor="middle" class="ref">'
            f"{_esc(_short(ref, LABEL_CHARS))}</text>"
            f'<text x="{cx:.0f}" y="{node.y + 30:.0f}" text-anchor="middle" class="state">'
            f"{_esc(status)}</text></a>"
        )
    layer_count = max((node.layer for node in nodes), default=-1) + 1
    said = f"{len(nodes)} jobs in {layer_count} layers, each below its parents; a job opens its page."
    if total > len(edges):
        said += f" {total - len(edges)} of {total} edges are not drawn."
    label = f"The workflow's graph: {len(nodes)} jobs, {total} edges"
    arrow = (
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L8,4 L0,8 z" class="arrow"/></marker></defs>'
    )
    return (
        f'<figure class="graph"><figcaption>{_esc(said)}</figcaption><div class="graph-frame">'
        f'<svg class="graph" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
        f'height="{height:.0f}" role="group" aria-label="{_esc(label)}">{arrow}'
        f'<g class="edges">{"".join(edges)}</g><g class="nodes">{"".join(drawn)}</g></svg></div></figure>'
    )
