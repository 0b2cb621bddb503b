"""Dispatch reports for people and tools: an aligned table (as `kilnctl run
--report` prints) and Chrome trace-event JSON (as `kilnctl --trace` writes)."""

import json

from ._proto.kiln.v1 import graph_pb2, report_pb2


def _path(p):
    return graph_pb2.Path.Name(p).removeprefix("PATH_")


def _count(v):
    for unit in ("", " k", " M", " G", " T"):
        if v < 1000 or unit == " T":
            return f"{v:.0f}" if unit == "" else f"{v:.2f}{unit}"
        v /= 1000
    return str(v)


def _bytes(v):
    for unit in (" B", " KiB", " MiB", " GiB", " TiB"):
        if v < 1024 or unit == " TiB":
            return f"{v:.0f}{unit}" if unit == " B" else f"{v:.1f}{unit}"
        v /= 1024
    return str(v)


def _nodes(step):
    names = [(step.node_names[i] if i < len(step.node_names) and step.node_names[i] else f"%{nid}")
             for i, nid in enumerate(step.node_ids)]
    s = ",".join(names)
    return s if len(s) <= 36 else s[:33] + "..."


def format_report(report: report_pb2.DispatchReport) -> str:
    """The report as a summary line and one row per kernel or copy."""
    head = f"request {report.request_id or '-'}"
    if report.tenant:
        head += f"  tenant {report.tenant}"
    head += f"  executable {report.executable_key[:16] or '-'}"
    if report.HasField("compile"):
        head += f" ({report_pb2.CacheOutcome.Name(report.compile.executable_cache)})"
    if report.placement.chosen:
        head += f"  placed on {report.placement.chosen}"
    head += (f"\nrun {report.run_micros:.1f} us, queue {report.queue_micros:.1f} us, "
             f"{len(report.steps)} steps\n")
    header = ["kernel", "implementation", "path", "device", "nodes", "flops", "bytes",
              "start us", "duration us"]
    numeric = [False] * 5 + [True] * 4
    rows = [[s.kernel or ("copy" if s.kind == report_pb2.STEP_COPY else "?"), s.implementation,
             _path(s.path), s.device, _nodes(s), _count(s.flops), _bytes(s.bytes),
             f"{s.start_micros:.1f}", f"{s.duration_micros:.1f}"] for s in report.steps]
    widths = [max(len(r[c]) for r in [header] + rows) for c in range(len(header))]

    def line(cells):
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, widths, numeric)).rstrip()

    out = head + "\n" + "\n".join(line(r) for r in [header] + rows) + "\n"
    for t in report.totals:
        out += (f"\n{t.device}: busy {t.busy_micros:.1f} us, {t.kernels} kernels, "
                f"peak {_bytes(t.peak_bytes)}")
    return out + ("\n" if report.totals else "")


def chrome_trace(reports) -> dict:
    """Chrome trace-event JSON (a dict; json.dump it) for one report or a list:
    one process per report, one thread per device."""
    if isinstance(reports, report_pb2.DispatchReport):
        reports = [reports]
    starts = [r.start_unix_micros for r in reports if r.start_unix_micros > 0]
    origin = min(starts) if starts else 0
    events = []
    for pid, r in enumerate(reports, start=1):
        base = float(r.start_unix_micros - origin) if r.start_unix_micros > 0 else 0.0
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": f"kiln request {r.request_id}"}})
        tids = {}
        for s in r.steps:
            tids.setdefault(s.device, len(tids) + 1)
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": "request"}})
        for device, tid in tids.items():
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"name": device}})
        events.append({"name": "run", "cat": "request", "ph": "X", "pid": pid, "tid": 0,
                       "ts": base, "dur": r.run_micros,
                       "args": {"request_id": r.request_id, "tenant": r.tenant,
                                "executable_key": r.executable_key,
                                "queue_micros": r.queue_micros}})
        for s in r.steps:
            events.append({
                "name": s.kernel or "copy", "cat": _path(s.path), "ph": "X", "pid": pid,
                "tid": tids[s.device], "ts": base + s.start_micros, "dur": s.duration_micros,
                "args": {"implementation": s.implementation, "device": s.device,
                         "flops": s.flops, "bytes": s.bytes,
                         "queue_wait_micros": s.queue_wait_micros,
                         "ops": [graph_pb2.OpKind.Name(o).removeprefix("OP_").lower()
                                 for o in s.ops],
                         "nodes": [{"id": nid, "name": s.node_names[i] if i < len(s.node_names)
                                    else ""} for i, nid in enumerate(s.node_ids)]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(reports, path: str) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(reports), f, indent=1)
