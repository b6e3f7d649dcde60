#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""render-dashboard.py: a picture of grafana-dashboard.json without Grafana.

Evaluates every panel's expressions against a Prometheus (its HTTP API, range queries over the
last --range) with the template variables set as given (default: every variable at All, ".*"),
and draws the panels where the dashboard's grid puts them: time series as lines (legends from the
panel's legendFormat), tables as text. For the documentation's picture of the dashboard, and to
look at a dashboard change before a Grafana is at hand:

  deploy/monitoring/render-dashboard.py --prometheus http://127.0.0.1:9090 -o dashboard.png

Needs matplotlib (Debian: python3-matplotlib). tests/integration/test_prometheus_dashboard.py runs
it against its Prometheus when SC_DASHBOARD_PNG names a file to write.
"""
import argparse
import json
import math
import os
import re
import sys
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROW_PX = 30  # one grid unit of height, as Grafana draws it
COLS = 24


def substitute(expr, variables, rate_interval):
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace("${%s}" % name, value).replace("$" + name, value)
    return expr.replace("$__rate_interval", rate_interval).replace("$__interval", "15s")


def query_range(prom, expr, start, end, step):
    url = prom.rstrip("/") + "/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(url, timeout=30) as r:
        data = json.loads(r.read().decode())
    if data.get("status") != "success":
        raise SystemExit("render-dashboard: %s: %s" % (expr, data))
    return data["data"]["result"]


def legend(fmt, metric):
    if not fmt:
        return ",".join("%s=%s" % kv for kv in sorted(metric.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)


def render(dash, prom, out, seconds, variables, rate_interval):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = time.time()
    start = end - seconds
    step = max(1.0, seconds / 120.0)
    panels = dash["panels"]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width_in = 16.0
    height_in = bottom * ROW_PX / 80.0
    fig = plt.figure(figsize=(width_in, height_in), dpi=80)
    fig.patch.set_facecolor("#111217")
    text = "#d8d9da"

    def box(gp):
        x0 = gp["x"] / COLS
        w = gp["w"] / COLS
        top = 1 - gp["y"] / bottom
        h = gp["h"] / bottom
        return x0, top, w, h

    fig.text(0.005, 0.999, "%s  (%s, last %ds, %s)" % (dash["title"], prom, seconds,
             ", ".join("%s=%s" % kv for kv in sorted(variables.items()))), color=text,
             fontsize=9, va="top")
    for p in panels:
        x0, top, w, h = box(p["gridPos"])
        if p["type"] == "row":
            fig.text(x0 + 0.004, top - h * 0.5, p["title"], color=text, fontsize=10, weight="bold", va="center")
            continue
        pad_top, pad_bottom = 0.3 / height_in, 0.25 / height_in  # title above, ticks below
        ax = fig.add_axes((x0 + 0.03, top - h + pad_bottom, w - 0.04, h - pad_top - pad_bottom))
        ax.set_facecolor("#181b1f")
        for s in ax.spines.values():
            s.set_color("#2c3235")
        ax.tick_params(colors=text, labelsize=6)
        ax.set_title(p["title"], color=text, fontsize=8, loc="left")
        series = []
        for t in p["targets"]:
            expr = substitute(t["expr"], variables, rate_interval)
            for r in query_range(prom, expr, start, end, step):
                xs = [float(v[0]) - end for v in r["values"]]
                ys = [float(v[1]) for v in r["values"]]
                series.append((legend(t.get("legendFormat"), r["metric"]), xs, ys))
        # The busiest first: a panel with many series shows the ten that carry most.
        series.sort(key=lambda s: -sum(y for y in s[2] if not (math.isnan(y) or math.isinf(y))))
        if p["type"] == "table":
            ax.set_xticks([])
            ax.set_yticks([])
            lines = ["%-48s %s" % (name[:48], "%.4g" % ys[-1] if ys else "")
                     for name, xs, ys in series[:8]]
            ax.text(0.02, 0.95, "\n".join(lines) or "no data", color=text, fontsize=6, va="top",
                    family="monospace", transform=ax.transAxes)
            continue
        if not series:
            ax.text(0.5, 0.5, "no data", color="#8e8e8e", ha="center", transform=ax.transAxes)
        for name, xs, ys in series[:10]:
            ys = [y if not (math.isnan(y) or math.isinf(y)) else None for y in ys]
            ax.plot(xs, ys, linewidth=1, label=name[:40])
        if series:
            ax.legend(fontsize=5, loc="upper left", frameon=False, labelcolor=text)
        ax.grid(True, color="#2c3235", linewidth=0.5)
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        if unit:
            ax.set_ylabel(unit, color=text, fontsize=6)
        ax.set_xlabel("seconds before now", color=text, fontsize=5, labelpad=1)
    fig.savefig(out, format="png", facecolor=fig.get_facecolor())
    plt.close(fig)
    try:  # a palette of 64 colours: a third of the bytes, nothing visible lost (PIL comes with matplotlib)
        from PIL import Image
        Image.open(out).convert("RGB").quantize(colors=64).save(out, optimize=True)
    except ImportError:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prometheus", required=True, help="Prometheus' base URL, e.g. http://127.0.0.1:9090")
    ap.add_argument("--dashboard", default=os.path.join(HERE, "grafana-dashboard.json"))
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--range", type=int, default=900, help="seconds back from now (default 900)")
    ap.add_argument("--rate-interval", default="1m", help="what $__rate_interval becomes (default 1m)")
    ap.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                    help="a template variable's value (default: every query variable at All, .*)")
    args = ap.parse_args()
    with open(args.dashboard) as f:
        dash = json.load(f)
    variables = {v["name"]: ".*" for v in dash.get("templating", {}).get("list", []) if v["type"] == "query"}
    for kv in args.var:
        name, _, value = kv.partition("=")
        variables[name] = value
    try:
        render(dash, args.prometheus, args.output, args.range, variables, args.rate_interval)
    except ImportError:
        sys.exit("render-dashboard: matplotlib is not installed (apt-get install python3-matplotlib)")
    print("render-dashboard: wrote %s" % args.output)


if __name__ == "__main__":
    main()
