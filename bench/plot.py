# SPDX-License-Identifier: Apache-2.0
"""Plots of a benchmark run: throughput and latency against transfer size, the sidecar's series
beside the baselines measured in the same run (matplotlib, Debian's python3-matplotlib; PNG).

The benchmarks call sweep() with what they measured (latency_bench.py, tcp_bench.py,
fast_path_bench.py: --plot FILE). Re-plot a saved run without running it again:

  /usr/bin/python3 bench/plot.py latency RUN.json -o latency.png     # latency_bench.py --json RUN.json
  /usr/bin/python3 bench/plot.py fast RUN.json -o fast-path.png      # fast_path_bench.py --json RUN.json

A series is a dict: label, sizes (bytes), gbps (GB/s, or None where not measured), p50_us, p99_us
(optional), baseline (True: drawn dashed, grey-ish: a tool other than the sidecar). A baseline
with a single figure for every size (iperf3's stream rate) is a `level`: (label, GB/s) drawn as a
horizontal line on the throughput axes.
"""
import argparse
import json
import sys

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def human(n):
    for unit, v in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= v and n % v == 0:
            return "%d %s" % (n // v, unit)
    return "%d B" % n


def sweep(path, title, series, levels=(), note=""):
    """Writes a PNG with two panels (throughput, latency; sizes on a log axis) to path and returns
    path, or returns None (saying why on stderr) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        sys.stderr.write("no plot: matplotlib is not installed (apt-get install python3-matplotlib; "
                         "scripts/install-deps.sh)\n")
        return None
    fig, (bw, lat) = plt.subplots(1, 2, figsize=(11, 4.8), dpi=85)
    sizes = sorted({s for ser in series for s in ser["sizes"]})
    handles = {}  # one legend entry per series, below both panels (same colour on both)
    for ser in series:
        style = dict(linestyle="--", alpha=0.8, marker="x") if ser.get("baseline") else dict(marker="o")
        color = None
        pts = [(s, g) for s, g in zip(ser["sizes"], ser["gbps"]) if g is not None]
        if pts:
            line, = bw.plot([p[0] for p in pts], [p[1] for p in pts], **style)
            color = line.get_color()
            handles.setdefault(ser["label"], line)
        p50 = [(s, v) for s, v in zip(ser["sizes"], ser.get("p50_us") or []) if v is not None]
        if p50:
            line, = lat.plot([p[0] for p in p50], [p[1] for p in p50], color=color, **style)
            color = line.get_color()
            handles.setdefault(ser["label"], line)
        p99 = [(s, v) for s, v in zip(ser["sizes"], ser.get("p99_us") or []) if v is not None]
        if p99:
            lat.plot([p[0] for p in p99], [p[1] for p in p99], color=color, linestyle=":", marker=".",
                     alpha=0.6)
    for label, gbps in levels:
        if gbps:
            bw.axhline(gbps, linestyle="-.", linewidth=1, color="grey")
            bw.annotate("%s %.2f GB/s" % (label, gbps), xy=(0.01, gbps), xycoords=("axes fraction", "data"),
                        fontsize=7, color="dimgrey", va="bottom")
    fmt = FuncFormatter(lambda v, _: human(int(v)) if v >= 1 else "")
    for ax, ylabel in ((bw, "GB/s"), (lat, "latency, us (log)")):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(fmt)
        if sizes:
            ax.set_xticks(sizes)
            ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.set_xlabel("transfer size")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    bw.set_title("throughput (dash-dot: baselines' stream rates)", fontsize=9)
    lat.set_title("latency as the caller sees it: p50 (solid), p99 (dotted)", fontsize=9)
    lat.set_yscale("log")
    fig.suptitle(title + ("\n" + note if note else ""), fontsize=9)
    rows = (len(handles) + 3) // 4
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center", ncol=4, fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0.035 * rows + 0.02, 1, 1))
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


# ---- the benchmarks' JSON, as plots ---------------------------------------------------------------

def latency_series(res):
    """latency_bench.py's result: the sidecar's series (mode, direction, clients) and the levels."""
    groups = {}
    for r in res["rows"]:
        if r.get("mode") not in ("tcp", "local") or r.get("direction") not in ("read", "write"):
            continue
        key = (r["mode"], r["direction"], r["clients"])
        groups.setdefault(key, []).append(r)
    series = []
    for (mode, direction, clients), rows in sorted(groups.items()):
        rows.sort(key=lambda r: r["size"])
        series.append({"label": "%s %s, %d client%s" % (mode, direction, clients, "s" if clients > 1 else ""),
                       "sizes": [r["size"] for r in rows], "gbps": [r["gb_per_s"] for r in rows],
                       "p50_us": [r["p50_us"] for r in rows], "p99_us": [r["p99_us"] for r in rows]})
    bl = res.get("baselines", {})
    for key, label in (("ucp_get_4k", "ucx ucp_get"), ("tag_lat_4k", "ucx tag_lat")):
        u = bl.get(key)
        if u:  # one size (4 KiB): a point on each panel
            series.append({"label": label + " (UCX_TLS=tcp)", "sizes": [4096],
                           "gbps": [u["gb_per_s"] if key != "tag_lat_4k" else None],
                           "p50_us": [u["lat_us"]], "baseline": True})
    levels = [("iperf3 1 stream", bl.get("iperf3_1")),
              ("iperf3 %s streams" % res.get("tcp_streams", "n"), bl.get("iperf3_n"))]
    return series, levels


def fast_series(res, direction="read", clients=1):
    """fast_path_bench.py's result: one series per path (fast, fast-nospin, grpc, python-*) for one
    direction and client count (24 lines would be unreadable); raw TCP and ucx are the
    baselines."""
    groups = {}
    for r in res["rows"]:
        if r["direction"] != direction or r["clients"] != clients:
            continue
        key = (r["path"], r["direction"], r["clients"])
        groups.setdefault(key, []).append(r)
    series = []
    for (path, direction, clients), rows in sorted(groups.items()):
        rows.sort(key=lambda r: r["size"])
        rate = [r.get("ops_per_s") for r in rows]
        series.append({"label": "%s %s, %d client%s" % (path, direction, clients, "s" if clients > 1 else ""),
                       "sizes": [r["size"] for r in rows],
                       "gbps": [r["size"] * o / 1e9 if o else None for r, o in zip(rows, rate)],
                       "p50_us": [r.get("p50_us") for r in rows], "p99_us": [r.get("p99_us") for r in rows],
                       "baseline": path in ("tcp", "ucx")})
    return series, []


def run_note(res):
    return "%s, commit %s, %s" % (res.get("date", "?"), res.get("commit", "?"), res.get("machine", "?"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=("latency", "fast"), help="which benchmark wrote the JSON")
    ap.add_argument("json", help="the run's --json file")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    args = ap.parse_args()
    with open(args.json) as f:
        res = json.load(f)
    if args.kind == "latency":
        series, levels = latency_series(res)
        title = "rdma-sidecar (C client, two sidecars) beside iperf3 and ucx_perftest, one run"
    else:
        series, levels = fast_series(res)
        title = ("rdma-sidecar fast path and gRPC (READ, 1 client) beside raw TCP ping-pong and ucx "
                 "tag_lat, one run")
    if not sweep(args.output, title, series, levels, run_note(res)):
        sys.exit(1)
    print("plot: %s" % args.output)


if __name__ == "__main__":
    main()
