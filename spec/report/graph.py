"""A layered drawing of a directed acyclic graph, as SVG: the equations' dependency graph.

The layout is the classic Sugiyama scheme, small enough to read and to test:

1. layers: a node's layer is the length of the longest path that reaches it (sources in
   layer 0), so every edge points from a lower layer to a higher one (left to right);
2. an edge that spans several layers is cut into unit steps through *dummy* nodes, one per
   layer it crosses, so it can be routed around the real nodes and counted in the ordering;
3. order within a layer: start grouped by the ID's prefix (its spec file), then sweep left
   to right and back, moving each node to the mean position (barycenter) of its neighbours in
   the layer before; keep the order with the fewest crossings seen;
4. coordinates: columns as wide as their widest label; within a column, each node as near
   as it can be to the mean height of its neighbours (alternately those before and after),
   keeping the order and one row of pitch between nodes -- a least-squares problem with
   order constraints, solved exactly by pooling adjacent violators (isotonic regression);
   edges are cubic curves through their dummies' points.

No system binary (Graphviz) and no JavaScript: the SVG opens from the file system.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

CHAR_W = 7.0  # width of one character of the 11.5 px monospace label (estimate, generous)
PAD_X, NODE_H, ROW, COL_GAP, MARGIN = 10, 22, 30, 70, 20


@dataclass
class Node:
    id: str
    label: str = ""
    layer: int = 0
    x: float = 0.0
    y: float = 0.0
    width: float = 0.0
    dummy: bool = False


@dataclass
class Edge:
    source: str  # the used equation
    target: str  # the one that uses it
    kind: str = "uses"  # "uses" or "target" (a document's variant -> what the code does)
    path: list[str] = field(default_factory=list)  # source, dummies..., target


@dataclass
class Layout:
    nodes: dict[str, Node]
    edges: list[Edge]
    layers: list[list[str]]
    width: float
    height: float
    crossings: int

    def real(self) -> list[Node]:
        return [n for n in self.nodes.values() if not n.dummy]


class CycleError(ValueError):
    """The graph has a cycle: no layering puts every edge left to right."""


def layers_of(ids: Iterable[str], edges: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Longest-path layering; raises :class:`CycleError` naming a node on a cycle."""
    ids = list(ids)
    preds: dict[str, list[str]] = {i: [] for i in ids}
    for s, t in edges:
        preds[t].append(s)
    layer: dict[str, int] = {}
    visiting: set[str] = set()

    def visit(n: str) -> int:
        if n in layer:
            return layer[n]
        if n in visiting:
            raise CycleError(f"the dependency graph has a cycle through {n!r}")
        visiting.add(n)
        layer[n] = 1 + max((visit(p) for p in preds[n]), default=-1)
        visiting.discard(n)
        return layer[n]

    for n in ids:
        visit(n)
    return layer


def _crossings(layers: list[list[str]], succ: Mapping[str, list[str]],
               pos: Mapping[str, float]) -> int:
    """Edge crossings between consecutive layers (pairs of edges whose ends swap order)."""
    total = 0
    for layer in layers[:-1]:
        ends = sorted((pos[a], pos[b]) for a in layer for b in succ[a])
        for i, (_, b1) in enumerate(ends):
            total += sum(1 for _, b2 in ends[i + 1:] if b2 < b1)
    return total


def layout(ids: Iterable[str], edges: Iterable[tuple[str, str, str]], *,
           sweeps: int = 12) -> Layout:
    """Lay out nodes ``ids`` with ``edges`` (source, target, kind); deterministic."""
    ids = list(dict.fromkeys(ids))
    edge_list = [Edge(s, t, k) for s, t, k in edges]
    unknown = {e.source for e in edge_list} | {e.target for e in edge_list}
    unknown -= set(ids)
    if unknown:
        raise ValueError(f"edges: endpoints {sorted(unknown)} are not nodes")
    layer = layers_of(ids, [(e.source, e.target) for e in edge_list])
    nodes = {i: Node(i, i, layer[i]) for i in ids}  # labelled by their IDs
    # dummies: one per layer an edge crosses
    succ: dict[str, list[str]] = {i: [] for i in ids}
    pred: dict[str, list[str]] = {i: [] for i in ids}
    for k, e in enumerate(edge_list):
        chain = [e.source]
        for lay in range(layer[e.source] + 1, layer[e.target]):
            d = f"_d{k}_{lay}"
            nodes[d] = Node(d, "", lay, dummy=True)
            succ[d], pred[d] = [], []
            chain.append(d)
        chain.append(e.target)
        e.path = chain
        for a, b in zip(chain, chain[1:]):
            succ[a].append(b)
            pred[b].append(a)
    n_layers = 1 + max((n.layer for n in nodes.values()), default=0)
    layers: list[list[str]] = [[] for _ in range(n_layers)]
    for n in nodes.values():
        layers[n.layer].append(n.id)
    for lay in layers:  # start grouped by spec file (the ID's prefix), dummies after
        lay.sort(key=lambda i: (nodes[i].dummy, i))
    pos = {i: float(k) for lay in layers for k, i in enumerate(lay)}
    best = ([list(lay) for lay in layers], _crossings(layers, succ, pos))
    for sweep in range(sweeps):
        forward = sweep % 2 == 0
        order = range(1, n_layers) if forward else range(n_layers - 2, -1, -1)
        for li in order:
            nbrs = pred if forward else succ

            def key(i, nbrs=nbrs):
                ns = nbrs[i]
                return (sum(pos[n] for n in ns) / len(ns)) if ns else pos[i]

            layers[li].sort(key=lambda i: (key(i), pos[i]))
            for k, i in enumerate(layers[li]):
                pos[i] = float(k)
        c = _crossings(layers, succ, pos)
        if c < best[1]:
            best = ([list(lay) for lay in layers], c)
    layers = best[0]
    # coordinates
    x = MARGIN
    tallest = max((len(lay) for lay in layers), default=0)
    for lay in layers:
        width = max((0 if nodes[i].dummy else CHAR_W * len(nodes[i].label) + 2 * PAD_X
                     for i in lay), default=0)
        for k, i in enumerate(lay):
            n = nodes[i]
            n.x, n.y = x, (tallest - len(lay)) * ROW / 2 + k * ROW
            n.width = 0 if n.dummy else CHAR_W * len(n.label) + 2 * PAD_X
        x += width + COL_GAP
    for sweep in range(4):
        nbrs, order = (pred, layers[1:]) if sweep % 2 == 0 else (succ, layers[-2::-1])
        for lay in order:
            wanted = [sum(nodes[m].y for m in nbrs[i]) / len(nbrs[i]) if nbrs[i]
                      else nodes[i].y for i in lay]
            for i, y in zip(lay, spaced(wanted, ROW)):
                nodes[i].y = y
    top = min((n.y for n in nodes.values()), default=0.0)
    for n in nodes.values():
        n.y += MARGIN - top
    bottom = max((n.y for n in nodes.values()), default=0.0)
    return Layout(nodes, edge_list, layers, x - COL_GAP + MARGIN, bottom + NODE_H + MARGIN,
                  best[1])


def spaced(wanted: list[float], gap: float) -> list[float]:
    """The positions y_0 <= y_1 <= ... with y_(k+1) - y_k >= gap closest (least squares) to
    ``wanted``: isotonic regression of wanted_k - k*gap by pooling adjacent violators."""
    blocks: list[list[float]] = []  # [sum, count] of pooled z values
    for k, w in enumerate(wanted):
        blocks.append([w - k * gap, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out = []
    for s, c in blocks:
        out += [s / c] * int(c)
    return [z + k * gap for k, z in enumerate(out)]


def _edge_path(lay: Layout, e: Edge) -> str:
    """A smooth curve from the source's right side to the target's left, through dummies."""
    pts = []
    for k, nid in enumerate(e.path):
        n = lay.nodes[nid]
        cy = n.y + NODE_H / 2
        if k == 0:
            pts.append((n.x + n.width, cy))
        elif k == len(e.path) - 1:
            pts.append((n.x - 6, cy))  # room for the arrow head
        else:
            pts.append((n.x, cy))
    d = [f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        mx = (x0 + x1) / 2
        d.append(f"C{mx:.1f},{y0:.1f} {mx:.1f},{y1:.1f} {x1:.1f},{y1:.1f}")
    return " ".join(d)


def svg(lay: Layout, *, href: Mapping[str, str], status: Mapping[str, str],
        title: Mapping[str, str], flagged: Iterable[str] = ()) -> str:
    """The layout as an inline SVG: one ``<a>`` per node (class ``node st-<status>``, a
    ``data-id`` and ``data-status``), edges as paths (class ``edge <kind>``); ``flagged``
    nodes (e.g. resting on a red one) get the class ``flagged``."""
    esc = html.escape
    flagged = set(flagged)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="depgraph" '
           f'width="{lay.width:.0f}" height="{lay.height:.0f}" '
           f'viewBox="0 0 {lay.width:.0f} {lay.height:.0f}" role="img" '
           f'aria-label="dependency graph of the equations">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           'class="arrowhead"/></marker></defs>', '<g class="edges">']
    for e in lay.edges:
        out.append(f'<path class="edge {esc(e.kind)}" data-source="{esc(e.source)}" '
                   f'data-target="{esc(e.target)}" d="{_edge_path(lay, e)}" '
                   f'marker-end="url(#arrow)"/>')
    out.append('</g><g class="nodes">')
    for n in lay.real():
        st = status.get(n.id, "unknown")
        cls = f"node st-{st.replace(' ', '-')}" + (" flagged" if n.id in flagged else "")
        out.append(
            f'<a href="{esc(href[n.id])}" class="{cls}" data-id="{esc(n.id)}" '
            f'data-status="{esc(st)}"><title>{esc(title.get(n.id, n.id))}</title>'
            f'<rect x="{n.x:.1f}" y="{n.y:.1f}" width="{n.width:.1f}" height="{NODE_H}" '
            f'rx="5"/><text x="{n.x + PAD_X:.1f}" y="{n.y + NODE_H / 2:.1f}" '
            f'dominant-baseline="central">{esc(n.label)}</text></a>')
    out.append("</g></svg>")
    return "\n".join(out)
