"""PNG figures for `retire report` (matplotlib, Agg backend). Each figure plots only the recorded medians, with the
recorded min..max as error bars where the input has them; a figure whose data is absent is skipped, with a reason."""
from __future__ import annotations

from pathlib import Path

from .fmt import is_summary, med, num

CHURN_LABELS = {"native": "native-prefix", "retire_hbm": "retire (HBM)", "retire_dram": "retire (DRAM)"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _errbar(ax, xs, vs, **kw):
    ys = [med(v) for v in vs]
    lo = [y - v["min"] if is_summary(v) and v.get("min") is not None else 0 for y, v in zip(ys, vs)]
    hi = [v["max"] - y if is_summary(v) and v.get("max") is not None else 0 for y, v in zip(ys, vs)]
    ax.errorbar(xs, ys, yerr=[lo, hi], capsize=4, marker="o", **kw)


def _save(plt, fig, out: Path) -> None:
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def fence_vs_unit(bs: list[dict], out: Path) -> str:
    """x = prefill unit (extra_info prefill_unit_tokens), y = fence_latency_{native,retire}_s median, log-log."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    dev = lambda b: str((b.get("params") or {}).get("device", ""))
    devices = sorted({dev(b) for b in bs})
    for d in devices:
        sel = sorted((b["extra_info"] for b in bs if dev(b) == d), key=lambda ei: med(ei["prefill_unit_tokens"]))
        for arm, color, name in (("native", "tab:red", "native (step boundary)"),
                                 ("retire", "tab:blue", "retire")):
            pts = [(med(ei["prefill_unit_tokens"]), ei[f"fence_latency_{arm}_s"]) for ei in sel
                   if med(ei.get(f"fence_latency_{arm}_s")) is not None]
            if pts:
                _errbar(ax, [p[0] for p in pts], [p[1] for p in pts], color=color, ls="-" if d == devices[0] else "--",
                        label=name + (f" [{d}]" if len(devices) > 1 else ""))
    units = sorted({med(b["extra_info"]["prefill_unit_tokens"]) for b in bs})
    ax.set(xscale="log", yscale="log", xlabel="prefill unit (tokens per step)", ylabel="FENCE latency, median (s)",
           title="FENCE latency vs prefill unit (bars: min..max)")
    ax.set_xticks(units, [num(u) for u in units])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    _save(plt, fig, out)
    return f"{len(units)} prefill unit(s): {', '.join(map(num, units))}"


def churn(pts: list[dict], out: Path) -> str:
    """Figure 5 style: x = churn / capacity, y = retained prefix tokens per arm."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    arms = [a for a in dict.fromkeys(k for p in pts for k in p) if a != "churn"]
    for arm in arms:
        sel = [(med(p["churn"]), p[arm]) for p in pts if med(p.get(arm)) is not None]
        _errbar(ax, [x for x, _ in sel], [v for _, v in sel], label=CHURN_LABELS.get(arm, arm))
    ax.set(xlabel="churn / prefix-cache capacity", ylabel="retained prefix tokens",
           title="Retained prefix under cache churn")
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save(plt, fig, out)
    return f"{len(pts)} churn point(s), arms: {', '.join(CHURN_LABELS.get(a, a) for a in arms)}"


def replay_timeline(tls: dict[str, list[dict]], out: Path) -> str:
    """Figure 6 style: one panel per arm (shared axes), live current and obsolete executions over time (step plots)."""
    plt = _plt()
    fig, axes = plt.subplots(len(tls), 1, figsize=(6.4, 1.4 + 2.0 * len(tls)), dpi=120, sharex=True, sharey=True,
                             squeeze=False)
    for ax, (arm, ps) in zip(axes[:, 0], tls.items()):
        t = [p["t"] for p in ps]
        ax.step(t, [p["current"] for p in ps], where="post", color="tab:blue", label="current")
        ax.step(t, [p["obsolete"] for p in ps], where="post", color="tab:red", label="obsolete")
        ax.fill_between(t, [p["obsolete"] for p in ps], step="post", color="tab:red", alpha=0.25)
        ax.set(ylabel="live executions", title=arm)
        ax.yaxis.set_major_locator(plt.MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(loc="upper left", ncols=2)
    axes[-1, 0].set_xlabel("time (s)")
    fig.suptitle("Replay: live current vs obsolete executions")
    _save(plt, fig, out)
    return f"{len(tls)} arm(s): {', '.join(tls)}"


def growth(c: dict, out: Path) -> str:
    """A cost-growth curve (perf/test_bench_growth.py): one line per series, log-log, medians with min..max bars."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    drawn = 0
    for name, rows in c["series"].items():
        pts = [(r["x"], r["y"]) for r in rows if med(r.get("y")) is not None and med(r.get("y")) > 0]
        if pts:
            fit = (c.get("fit") or {}).get(name)
            label = name + (f" (exponent {num(fit['exponent'])})" if fit else "")
            _errbar(ax, [x for x, _ in pts], [y for _, y in pts], label=label)
            drawn += 1
    ax.set(xscale="log", yscale="log", xlabel=c.get("x_label", "x"), ylabel=c.get("y_label", "y"),
           title=c.get("name", "").replace("_", " "))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    _save(plt, fig, out)
    return f"{drawn} series over {len({r['x'] for rows in c['series'].values() for r in rows})} points"


def figure(name: str, out: Path, data, draw, missing: str) -> str:
    """One markdown line per figure: drawn (with the image link) or skipped (with the reason). Never raises."""
    if not data:
        return f"- `{name}` skipped: {missing}"
    try:
        return f"- `{name}`: {draw(data, out / name)}\n\n  ![{name}]({name})"
    except Exception as e:  # noqa: BLE001 (a malformed value must not abort the report)
        return f"- `{name}` skipped: could not be drawn from the input ({type(e).__name__}: {e})"
