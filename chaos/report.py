"""The run's report: ``report.json`` (figures), ``summary.txt`` (one screen), ``timeline.png``."""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chaos import liveness
from chaos.checker import CheckResult
from chaos.history import INFO, INVOKE, OK
from chaos.liveness import ASK, GOT, MISS, Call, Liveness
from chaos.schedule import CUT_CLIENT, PARTITIONS

MASTER_FAULTS = ("kill_master", "pause_master", "cut_master")
FAULT_COLORS = {"kill_node": "tab:red", "wipe_node": "black", "kill_master": "tab:purple",
                "pause_node": "tab:orange", "pause_master": "tab:pink",
                "stall_consumer": "tab:olive", "churn": "tab:cyan", "cut_node": "tab:blue",
                "cut_client": "tab:green", "flap_link": "tab:brown", "cut_master": "tab:gray"}


@dataclass
class Timeline:
    """Series for the plot, read from the history in one pass."""

    enqueued: Counter[int] = field(default_factory=Counter)  # second -> items acknowledged
    dequeued: Counter[int] = field(default_factory=Counter)  # second -> items delivered
    unseen: list[tuple[float, int]] = field(default_factory=list)  # (time, acked but unseen)
    faults: list[dict[str, Any]] = field(default_factory=list)  # kind, target, start, end
    not_applied: list[str] = field(default_factory=list)  # faults skipped or failed, and why
    acked_times: list[float] = field(default_factory=list)  # when each enqueue was acknowledged
    calls: dict[str, list[Call]] = field(  # enqueue / dequeue -> every worker's calls
        default_factory=lambda: {op: [] for op in liveness.OPS})
    end: float = 0.0

    @functools.cached_property
    def liveness(self) -> Liveness:
        """The run's stalls, overall and per fault (``chaos.liveness``), once the series are
        complete."""
        return liveness.measure(self.calls, self.unseen, self.faults)


def timeline(ops: Iterable[dict[str, Any]]) -> Timeline:
    tl = Timeline()
    acked_at: dict[int, float] = {}
    first_seen: dict[int, float] = {}
    open_faults: dict[int, dict[str, Any]] = {}
    for op in ops:
        t, f, kind, value = op["time"], op["f"], op["type"], op.get("value") or {}
        tl.end = max(tl.end, t)
        if f in tl.calls:
            got = kind == OK and (f == "enqueue" or bool(value.get("items")))
            tl.calls[f].append(Call(t, op["process"], ASK if kind == INVOKE else
                                    GOT if got else MISS))
        if f == "enqueue" and kind == OK:
            tl.enqueued[int(t)] += len(value["seqs"])
            tl.acked_times.append(t)
            for seq in value["seqs"]:
                acked_at.setdefault(seq, t)
        elif f == "dequeue" and kind == OK:
            tl.dequeued[int(t)] += len(value["items"])
            for item in value["items"]:
                if item[1] is not None:
                    first_seen.setdefault(item[1], t)
        elif op["process"] == "nemesis" and f in FAULT_COLORS and kind == OK:
            open_faults[value["fault"]] = {"kind": f, "target": value.get("target"),
                                           "start": t, "end": None}
        elif op["process"] == "nemesis" and f in FAULT_COLORS and kind == INFO:
            tl.not_applied.append(f"{f} ({op.get('error', '')})")
        elif op["process"] == "nemesis" and f == "heal" and kind != INVOKE:
            fault = open_faults.pop(value["fault"], None)
            if fault is not None:
                fault["end"] = t
                tl.faults.append(fault)
    for fault in open_faults.values():
        fault["end"] = tl.end
        tl.faults.append(fault)
    steps: list[tuple[float, int]] = []
    for seq, t in acked_at.items():
        seen = first_seen.get(seq)
        if seen is None or seen > t:  # seen before the ack reached the producer: never unseen
            steps.append((t, 1))
            if seen is not None:
                steps.append((seen, -1))
    level = 0
    for t, d in sorted(steps):
        level += d
        tl.unseen.append((t, level))
    return tl


def plot(tl: Timeline, samples: list[dict[str, Any]], path: str, title: str, *,
         max_stall_s: float | None = None) -> None:
    """The timeline: throughput with each fault's worst stall marked under it, the
    under-replicated items, the backlog; faults shaded by kind."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(3, 1, figsize=(12, 8), sharex=True)
    secs = list(range(int(tl.end) + 1))
    axes[0].plot(secs, [tl.enqueued.get(s, 0) for s in secs], label="enqueued (acked)")
    axes[0].plot(secs, [tl.dequeued.get(s, 0) for s in secs], label="dequeued (delivered)")
    axes[0].set_ylabel("items/s")
    _mark_stalls(axes[0], tl.liveness, max_stall_s)
    axes[0].legend(loc="upper right", fontsize="small")
    axes[1].step([s["time"] for s in samples],
                 [s["under_replicated"] if s["under_replicated"] is not None else float("nan")
                  for s in samples], where="post", color="tab:red")
    axes[1].set_ylabel("under-replicated")
    if tl.unseen:
        axes[2].step([t for t, _ in tl.unseen], [n for _, n in tl.unseen], where="post",
                     color="tab:green")
    axes[2].set_ylabel("acked, not yet seen")
    axes[2].set_xlabel("seconds since the workload started")
    for ax in axes:
        for fault in tl.faults:
            ax.axvspan(fault["start"], fault["end"], color=FAULT_COLORS[fault["kind"]], alpha=0.2,
                       lw=0)
        ax.grid(alpha=0.3)
    kinds = sorted({fault["kind"] for fault in tl.faults})
    if kinds:
        fig.legend(handles=[Patch(color=FAULT_COLORS[k], alpha=0.4, label=k) for k in kinds],
                   loc="upper center", ncol=len(kinds), fontsize="small",
                   bbox_to_anchor=(0.5, 0.955))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _mark_stalls(ax: Any, live: Liveness, max_stall_s: float | None) -> None:
    """Each fault's worst stall as a bar just under the throughput, in the fault's colour,
    labelled with its length when it is long enough to matter (red: over the limit)."""
    over = {id(f) for f in live.over(max_stall_s)}
    marked = False
    for f in live.faults:
        w = f.worst
        if w is None or w.seconds < 0.05:
            continue
        ax.hlines(0, w.began_s, w.ended_s, colors=FAULT_COLORS.get(f.kind, "black"), lw=5,
                  label=None if marked else "worst stall of each fault")
        marked = True
        if w.seconds >= 0.5 or id(f) in over:
            ax.annotate(f"{w.op[:3]} {w.seconds:.1f}s", ((w.began_s + w.ended_s) / 2, 0),
                        xytext=(0, 4), textcoords="offset points", ha="center",
                        fontsize="x-small", color="red" if id(f) in over else "black",
                        fontweight="bold" if id(f) in over else "normal")


def figures(result: CheckResult, meta: dict[str, Any], tl: Timeline, *,
            max_stall_s: float | None = None) -> dict[str, Any]:
    """Every figure of the run. ``valid``: the checker passed and, with ``max_stall_s``, no
    data-node fault stalled the clients longer (``liveness_failed`` lists those that did)."""
    faults = Counter(f["kind"] for f in tl.faults)
    partitions = [{"kind": f["kind"], "target": f["target"], "start_s": round(f["start"], 2),
                   "end_s": round(f["end"], 2)} for f in tl.faults if f["kind"] in PARTITIONS]
    live = tl.liveness
    stalled = [f.to_json() for f in live.over(max_stall_s)]
    return {**meta, "valid": result.valid and not stalled, "checker": result.to_json(),
            "faults_applied": dict(sorted(faults.items())), "faults_not_applied": tl.not_applied,
            "partitions": partitions, "master_faults": master_outages(tl),
            "liveness": live.to_json(), "max_stall_s": max_stall_s, "liveness_failed": stalled}


def master_outages(tl: Timeline) -> list[dict[str, Any]]:
    """For each fault of the primary master: how long after it began the first enqueue was
    acknowledged (with a standby: the failover), and how long none was (the outage)."""
    times = sorted(tl.acked_times)
    out = []
    for f in sorted(tl.faults, key=lambda f: f["start"]):
        if f["kind"] not in MASTER_FAULTS:
            continue
        after = next((t for t in times if t > f["start"]), None)
        before = max((t for t in times if t <= f["start"]), default=0.0)
        out.append({"kind": f["kind"], "start_s": round(f["start"], 2), "shard": f["target"],
                    "first_ack_after_s": None if after is None else round(after - f["start"], 2),
                    "no_ack_for_s": None if after is None else round(after - before, 2)})
    return out


def _jobs(j: dict[str, Any]) -> list[str]:
    """The jobs lane's lines (chaos/jobs.py)."""
    twice = sum(len(t) for t in j["ticks_armed_twice"].values())
    verdict = "ok" if j["valid"] else "FAIL"
    return ["", f"jobs     {verdict}: schedule ticks armed {j['ticks_armed']}"
                f" (twice {twice}), run {j['ticks_run']} (unarmed "
                f"{len(j['ticks_run_unarmed'])}); chains {j['chains']} (unfinished "
                f"{len(j['chains_unfinished'])}, out of order {len(j['order_violations'])})"]


def summary(report: dict[str, Any]) -> str:
    c = report["checker"]
    o = report["options"]
    rate = c["duplicate_rate"] * 100
    faults = ", ".join(f"{k} {n}" for k, n in report["faults_applied"].items()) or "none"
    lines = [
        f"Blizzard chaos run: {'PASS' if report['valid'] else 'FAIL'}   seed {o['seed']}   "
        f"workload {o['duration_s']:g}s   wall time {report['runtime_s']:.1f}s",
        f"cluster: {str(o.get('masters', 1)) + ' shards of ' if o.get('masters', 1) > 1 else ''}"
        f"{o['datanodes']} data nodes, R={o['replication']}, heartbeat "
        f"{o['heartbeat_s']:g}s, dead after {o['dead_after_s']:g}s, lease {o['lease_s']:g}s"
        + (f", each on a host of its own ({o['clients']} client hosts)" if o.get("hosts") else ""),
        f"faults applied: {faults}",
        *([f"faults not applied: {'; '.join(report['faults_not_applied'])}"]
          if report.get("faults_not_applied") else []),
        *([f"partitions: {_partitions(report['partitions'])}"] if report.get("partitions") else []),
        *([f"master faults (first enqueue acknowledged after, none for): "
           f"{_outages(report['master_faults'])}"] if report.get("master_faults") else []),
        "",
        f"enqueue  attempted {c['attempted']}: acknowledged {c['acknowledged']}, "
        f"failed {c['failed']}, indeterminate {c['indeterminate']} "
        f"(recovered {c['recovered']}, not recovered {c['not_recovered']})",
        f"dequeue  {c['dequeued']} distinct items in {c['delivered']} deliveries; "
        f"duplicated {c['duplicated']} ({rate:.2f}%), redeliveries {c['redeliveries']}, "
        f"dead-lettered {c['dead_lettered']}",
        f"acks     {', '.join(f'{k} {n}' for k, n in sorted(c['acks'].items())) or 'none'}",
        f"errors   {'; '.join(f'{k} x{n}' for k, n in list(c['errors'].items())[:4]) or 'none'}",
        f"final    queue {c['final_queue']}",
        "",
        f"lost {c['lost']}   unexpected {c['unexpected']}   payload mismatches "
        f"{c['payload_mismatches']}   ids reused {c['ids_reused']}",
        f"failed but seen {c['failed_but_seen']}   unsettled {c['unsettled']}   "
        f"crashes {c['crashes']}",
        *(_liveness(report["liveness"]) if report.get("liveness") else []),
        *(_jobs(report["jobs"]) if report.get("jobs") else []),
    ]
    if report.get("liveness_failed"):
        stalled = report["liveness_failed"]
        lines += ["", f"LIVENESS: {len(stalled)} data-node fault{'s' * (len(stalled) > 1)} "
                      f"stalled the clients longer than --max-stall-s {report['max_stall_s']:g}: "
                      + "; ".join(_stall(f) for f in stalled[:4])
                      + ("; ..." if len(stalled) > 4 else "")]
    if c["problems"]:
        lines += ["", "PROBLEMS:"] + [f"  - {p}" for p in c["problems"]]
        for name, examples in c["examples"].items():
            if name != "duplicated":
                lines.append(f"  {name} e.g. {str(examples)[:200]}")
    lines += ["", f"run dir: {report['run_dir']}  (history.jsonl, report.json, timeline.png, "
                  "cluster/*.log)"]
    return "\n".join(lines) + "\n"


def _partitions(partitions: list[dict[str, Any]]) -> str:
    """``cut_node datanode2 12.1-15.3s; ...``: what each partition cut, and when."""
    def target(p: dict[str, Any]) -> str:
        return "master" if p["target"] is None else \
            f"client{p['target']}" if p["kind"] == CUT_CLIENT else f"datanode{p['target']}"
    return "; ".join(f"{p['kind']} {target(p)} {p['start_s']:g}-{p['end_s']:g}s"
                     for p in partitions)


def _liveness(live: dict[str, Any]) -> list[str]:
    """Three lines: the worst stall per fault kind, the worst data-node fault, the run's."""
    kinds: dict[str, list[float]] = {}
    for f in live["faults"]:
        worst = kinds.setdefault(f["kind"], [0.0, 0.0])
        worst[0] = max(worst[0], f["max_no_enqueue_s"])
        worst[1] = max(worst[1], f["max_no_dequeue_s"])
    worst_node = max((f for f in live["faults"] if f["data_node"] and f["worst"]),
                     key=lambda f: f["worst"]["stall_s"], default=None)
    run = [f"no {op} for {s['stall_s']:.2f}s from {s['began_s']:.1f}s"
           for op, s in live["longest"].items() if s is not None]
    return [
        "",
        "stalls   longest without an acked enqueue/dequeue, per fault kind: "
        + (", ".join(f"{k} {e:.1f}/{d:.1f}s" for k, (e, d) in sorted(kinds.items()))
           or "no faults"),
        f"         worst data-node fault: {_stall(worst_node) if worst_node else 'none'}",
        f"         whole run: {'; '.join(run) or 'none'}",
    ]


def _stall(f: dict[str, Any]) -> str:
    """``pause_node datanode3 21.3s: no dequeue for 4.62s from 21.5s``."""
    w = f["worst"]
    return (f"{f['kind']} datanode{f['target']} {f['start_s']:.1f}s: no {w['op']} for "
            f"{w['stall_s']:.2f}s from {w['began_s']:.1f}s")


def _outages(faults: list[dict[str, Any]]) -> str:
    """``kill_master 12.1s: 2.3s/2.5s; ...``."""
    def shard(f: dict[str, Any]) -> str:
        return "" if f.get("shard") is None else f" shard {f['shard']:d}"

    return "; ".join(f"{f['kind']}{shard(f)} "
                     f"{f['start_s']:g}s: {f['first_ack_after_s']}s/{f['no_ack_for_s']}s"
                     for f in faults)


def write(run_dir: str, report: dict[str, Any]) -> str:
    """Write report.json and summary.txt; returns the summary."""
    with open(os.path.join(run_dir, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    text = summary(report)
    with open(os.path.join(run_dir, "summary.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    return text
