"""A picture of a plan (`bbgrap inspect --svg FILE`): the layers in order, left to right,
one column each; in a column, each node's share of the layer's output along its cut as a
band of the node's colour (normalised to the layer's extent, so 7 rows and 224 rows fill
the same height), the halo rows a node recomputes beside its band, a marker under every
layer whose output crosses nodes (a receive point), and layers computed whole on one node
flagged above (red: no region rule; orange: not cuttable). Every column carries a tooltip
with the layer's details. Built from the plan's layer table (bbgrap/report.py).
"""

from __future__ import annotations

from html import escape

from bbgrap.plan_schema import LayerRow, Plan

# distinguishable on white and for the common colour-vision deficiencies (Okabe-Ito, then Tol)
NODE_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#332288",
                "#117733", "#882255", "#44AA99", "#999933", "#AA4499", "#661100", "#6699CC", "#888888")
CUT_COLOURS = {"h": "#4c78a8", "w": "#72b7b2", "c": "#f58518", "n": "#54a24b", "whole": "#e45756", "other axis": "#bab0ac"}
COLUMN, PLOT_HEIGHT, LEFT, TOP, RIGHT = 6, 240, 110, 56, 30


def node_colour(node: int) -> str:
    return NODE_COLOURS[node % len(NODE_COLOURS)]


def size(layers: int) -> tuple[int, int]:
    """Width and height in pixels of the picture of a plan of `layers` layers."""
    return max(LEFT + max(layers, 1) * COLUMN + RIGHT, 840), TOP + PLOT_HEIGHT + 200  # at least the legend's width


def _tooltip(row: LayerRow) -> str:
    parts = [f"{row.name} ({row.op_type}), output {'x'.join(map(str, row.output_shape))}, cut {row.cut}"]
    for n, p in enumerate(row.per_node):
        if p.range:
            extra = f", computes {p.computes[0]}-{p.computes[1]}" if p.computes and p.computes != p.range else ""
            parts.append(f"node {n}: {p.range[0]}-{p.range[1]}{extra}, {p.flops / 1e6:.2f} MFLOP")
    if row.whole is not None:
        parts.append(f"whole on node {row.whole.node}: {row.whole.reason}")
    if row.bytes_sent:
        parts.append(f"output crosses nodes: {row.bytes_sent / 1e3:.1f} KB")
    return "\n".join(parts)


def plan_svg(plan: Plan) -> str:
    """The picture of a plan, as SVG text."""
    rows = plan.compiled.layer_table
    nodes = plan.nodes
    width, height = size(len(rows))
    base = TOP + PLOT_HEIGHT
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{LEFT}" y="20" font-size="14">{escape(plan.model)}: {len(rows)} layers on {nodes} nodes '
           f'(direction {escape(plan.compiled.direction.value)})</text>',
           f'<text x="8" y="{TOP + 12}">share of each</text><text x="8" y="{TOP + 26}">layer\'s output</text>',
           f'<text x="8" y="{TOP + 40}">along its cut</text>',
           f'<text x="8" y="{base + 14}">cut</text><text x="8" y="{base + 32}">output crosses</text>',
           f'<text x="8" y="{base + 44}">nodes</text>']
    for i, row in enumerate(rows):
        x = LEFT + i * COLUMN
        out.append(f'<g><title>{escape(_tooltip(row))}</title>')
        if row.whole is not None:
            out.append(f'<rect x="{x}" y="{TOP}" width="{COLUMN}" height="{PLOT_HEIGHT}" fill="{node_colour(row.whole.node)}"/>')
            flag = "#d62728" if row.whole.no_rule else "#ff7f0e"
            out.append(f'<polygon points="{x},{TOP - 4} {x + COLUMN},{TOP - 4} {x + COLUMN / 2},{TOP - 12}" fill="{flag}"/>')
        else:
            extent = row.extent or 1
            for n, p in enumerate(row.per_node):
                if not p.range:
                    continue
                y0, y1 = (TOP + PLOT_HEIGHT * v / extent for v in p.range)
                out.append(f'<rect x="{x}" y="{y0:.2f}" width="{COLUMN}" height="{max(y1 - y0, 0.5):.2f}" fill="{node_colour(n)}"/>')
                c = p.computes
                if c and c != p.range:  # recomputed halo rows: a thin strip of the node's colour beside its band
                    c0, c1 = (TOP + PLOT_HEIGHT * v / extent for v in c)
                    out.append(f'<rect x="{x + COLUMN - 2}" y="{c0:.2f}" width="2" height="{max(c1 - c0, 0.5):.2f}" '
                               f'fill="{node_colour(n)}" stroke="black" stroke-width="0.3"/>')
        out.append(f'<rect x="{x}" y="{base + 4}" width="{COLUMN}" height="12" fill="{CUT_COLOURS.get(row.cut, CUT_COLOURS["other axis"])}"/>')
        if row.bytes_sent:
            out.append(f'<circle cx="{x + COLUMN / 2}" cy="{base + 30}" r="2.5" fill="black"/>')
        out.append("</g>")
    step = max(1, len(rows) // 40)
    for i in range(0, len(rows), step):
        label_x = LEFT + i * COLUMN + COLUMN / 2
        out.append(f'<text transform="translate({label_x},{base + 48}) rotate(90)" font-size="8">{escape(rows[i].name[:28])}</text>')
    legend_y = height - 14
    lx = LEFT
    for n in range(nodes):
        out.append(f'<rect x="{lx}" y="{legend_y - 9}" width="10" height="10" fill="{node_colour(n)}"/>'
                   f'<text x="{lx + 13}" y="{legend_y}">node {n}</text>')
        lx += 62
    for cut, colour in CUT_COLOURS.items():
        out.append(f'<rect x="{lx}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/><text x="{lx + 13}" y="{legend_y}">{cut}</text>')
        lx += 52 if len(cut) < 6 else 80
    out.append(f'<polygon points="{lx},{legend_y} {lx + 10},{legend_y} {lx + 5},{legend_y - 9}" fill="#d62728"/>'
               f'<text x="{lx + 13}" y="{legend_y}">whole: no rule</text>')
    out.append(f'<polygon points="{lx + 110},{legend_y} {lx + 120},{legend_y} {lx + 115},{legend_y - 9}" fill="#ff7f0e"/>'
               f'<text x="{lx + 123}" y="{legend_y}">whole: not cuttable</text>')
    out.append("</svg>")
    return "\n".join(out)
