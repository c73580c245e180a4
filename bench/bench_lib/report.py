"""Tables and plots of tools/bench results, and the op breakdown of a LibTorch profiler trace."""
import json
import os
import subprocess
import sys
from collections import defaultdict

MIB = 2**20


def _f(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def _mib(x):
    return "-" if x is None else f"{x / MIB:.0f}"


def _status(r):
    if not r:
        return "-"
    s = r.get("status")
    if s == "ok":
        return None
    if s == "timeout":
        return f"timeout ({r.get('timeout_seconds')} s)"
    if s == "skipped":
        return f"skipped ({r.get('reason')})"
    return s


def _mem(r):
    g = r.get("gpu_memory")
    return g["allocated_peak_above_baseline_bytes"] if g else r["rss_peak_above_baseline_bytes"]


def markdown(res):
    m = res["machine"]
    st = res["settings"]
    gpu = st["device"].startswith("cuda")
    lines = [f"# tools/bench results: {res['mode']} mode", "",
             f"{res['about']}.", "",
             f"- date: {res['date']}; took {res.get('elapsed_seconds', 0) / 60:.1f} min",
             f"- machine: {m.get('cpu', '?')}, {m.get('cpus')} cores, {m.get('memory_gib', '?')} GiB"
             + (f", GPU {m['gpu']}" if m.get("gpu") else ", no GPU")
             + f"; load average {m['loadavg_start'][0]:.2f} at the start"
             + (f", {m['loadavg_end'][0]:.2f} at the end" if m.get("loadavg_end") else ""),
             f"- software: torch {m.get('torch')}, diffusers {m.get('diffusers')}, Python {m.get('python')}",
             f"- settings: {st['device']}, {st['dtype']}, {st['threads']} threads on both sides, "
             f"{st['repeat']} measurement(s) per side (fresh process each, alternating), medians shown",
             ]
    if st.get("min_cpu_share") and not gpu:
        remeasured = sum(e["summary"].get("remeasured", 0) for e in res["throughput"]) + sum(
            len(row.get(side, {}).get("contended_attempts") or []) for row in res["memory_sweep"]
            for side in ("ours", "diffusers"))
        lines.append(f"- contention control: each measurement waits for the other processes to use less than "
                     f"{100 * st['wait_idle']:.0f}% of the CPUs (up to {st['wait_max']} s) and is taken again (up "
                     f"to {st['retries']} times) when its process got less than {100 * st['min_cpu_share']:.0f}% of "
                     f"its threads' CPU time; {remeasured} measurement(s) were taken again")
    lines.append("")
    mem_what = "GPU peak allocated above baseline" if gpu else "peak RSS above baseline"
    if res["throughput"]:
        lines += ["## Throughput", "",
                  f"Memory is the {mem_what} (baseline: after the model is loaded and its weights resident), MiB. "
                  "Ratios are gst-latent / diffusers: above 1 is faster for frames/s, below 1 is leaner for memory. "
                  "gst-latent emits output chunk by chunk (first output, mean chunk latency); diffusers returns "
                  "the whole clip from one call.", "",
                  "| family | direction | clip | gst-latent frames/s | diffusers frames/s | ratio | "
                  "gst-latent first output s | gst-latent chunk latency s | diffusers clip s | "
                  "gst-latent MiB | diffusers MiB | mem ratio | CPU share | runs ok | outputs agree |",
                  "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for e in res["throughput"]:
            s = e["summary"]
            clip = f"{e['frames']}x{e['height']}x{e['width']}"
            ours_fps = _f(s["ours_fps"], 3) if s["ours_fps"] else "/".join(s["ours_status"])
            theirs_fps = _f(s["theirs_fps"], 3) if s["theirs_fps"] else "/".join(s["theirs_status"])
            agree = "-" if s.get("output_rel_diff") is None else f"{s['output_rel_diff']:.1e}"
            lines.append(
                f"| {e['family']} | {e['direction']} | {clip} | {ours_fps} | {theirs_fps} | "
                f"{_f(s['fps_ratio'])} | {_f(s['ours_first_output'])} | {_f(s['ours_chunk_latency'])} | "
                f"{_f(s['theirs_wall'])} | {_mib(s['ours_mem'])} | {_mib(s['theirs_mem'])} | "
                f"{_f(s['mem_ratio'])} | {_f(s.get('ours_cpu_share'))}, {_f(s.get('theirs_cpu_share'))} | "
                f"{s['ours_runs_ok']}/{len(e['ours'])}, "
                f"{s['theirs_runs_ok']}/{len(e['diffusers'])}"
                + (f" ({s['contended_kept']} contended)" if s.get("contended_kept") else "") + f" | {agree} |")
        lines += ["", "`CPU share`: CPU time of the measured span / (wall time x threads), gst-latent then "
                  "diffusers; well below the usual value means another process took cores during that run. "
                  "`runs ok`: successful measurements of gst-latent, diffusers. `outputs agree`: relative difference "
                  "of the mean |output| of the two sides (same seeded input; a cross-check that both computed the "
                  "same thing).", ""]
    rates = [e for e in res["throughput"] if e.get("conv_flops")]
    if rates:
        peak = next((e["summary"]["bf16_peak"] for e in rates if e["summary"].get("bf16_peak")), None)
        lines += ["## Achieved convolution throughput", "",
                  "The convolutions' FLOPs on each clip (counted by bench/bench_lib/flops.py from the model's layer "
                  "graph; attention and norms left out) over the measured wall time: the same work on both sides."
                  + (f" Share of peak: of the {peak['device']}'s dense bf16 tensor-core peak, "
                     f"{peak['tflops']:.0f} TFLOP/s (data sheet)." if peak else ""), "",
                  "| family | direction | clip | conv TFLOP | gst-latent TFLOP/s | diffusers TFLOP/s |"
                  + (" gst-latent share of peak | diffusers share of peak |" if peak else ""),
                  "|---|---|---|--:|--:|--:|" + ("--:|--:|" if peak else "")]
        for e in rates:
            s = e["summary"]
            share = (f" {_pct(s.get('ours_peak_share'))} | {_pct(s.get('theirs_peak_share'))} |" if peak else "")
            lines.append(f"| {e['family']} | {e['direction']} | {e['frames']}x{e['height']}x{e['width']} | "
                         f"{e['conv_flops'] / 1e12:.3f} | {_f(s.get('ours_tflops'), 3)} | "
                         f"{_f(s.get('theirs_tflops'), 3)} |" + share)
        lines.append("")
    if res["memory_sweep"]:
        lines += ["## Memory against clip length", "",
                  f"{mem_what[0].upper() + mem_what[1:]}, MiB. gst-latent receives the frames one push at a time, as from a live "
                  "source; diffusers needs the whole clip as one tensor, whose size is shown (it is part of "
                  "diffusers' peak). `state` is what gst-latent carries between chunks; `heap` the activation memory it "
                  "keeps from chunk to chunk (part of its peak).", "",
                  "| family | direction | clip | gst-latent MiB | diffusers MiB | gst-latent state MiB | "
                  "gst-latent heap MiB | diffusers input MiB | gst-latent frames/s | diffusers frames/s |",
                  "|---|---|---|--:|--:|--:|--:|--:|--:|--:|"]
        for row in res["memory_sweep"]:
            o, d = row.get("ours", {}), row.get("diffusers", {})
            clip = f"{row['frames']}x{row['height']}x{row['width']}"
            om = _status(o) or _mib(_mem(o))
            dm = _status(d) or _mib(_mem(d))
            ostate = "-" if _status(o) else _f(o["state_bytes"] / MIB, 1)
            oheap = "-" if _status(o) else _f(o.get("heap_bytes", 0) / MIB, 1)
            dinput = "-" if _status(d) else _f(d.get("input_bytes", 0) / MIB, 1)
            ofps = "-" if _status(o) else _f(o["fps_median"], 3)
            dfps = "-" if _status(d) else _f(d["fps_median"], 3)
            lines.append(f"| {row['family']} | {row['direction']} | {clip} | {om} | {dm} | {ostate} | {oheap} | "
                         f"{dinput} | {ofps} | {dfps} |")
        lines.append("")
    return "\n".join(lines)


# ---- plots ----------------------------------------------------------------------------------------------------

def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        print("[bench] matplotlib is not installed in this Python; installing it now for the plots "
              f"({sys.executable} -m pip install matplotlib). Pass --no-plots to skip the plots.",
              file=sys.stderr, flush=True)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"])
        if r.returncode != 0:
            print("[bench] could not install matplotlib; no plots", file=sys.stderr)
            return None
        import importlib
        importlib.invalidate_caches()
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


COLOURS = {"gst-latent": "#1f77b4", "diffusers": "#ff7f0e"}


def plots(res, out, mode):
    if not res["throughput"] and not res["memory_sweep"]:
        return []
    plt = _matplotlib()
    if plt is None:
        return []
    made = []
    gpu = res["settings"]["device"].startswith("cuda")
    title_tail = (f"{res['machine'].get('gpu') or str(res['machine'].get('cpus')) + '-core CPU'}, "
                  f"{res['settings']['dtype']}, {res['settings']['threads']} threads")
    if res["throughput"]:
        entries = res["throughput"]
        labels = [f"{e['family']}\n{e['direction']}\n{e['frames']}x{e['height']}x{e['width']}" for e in entries]
        fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(entries) * 2), 4.8))
        x = list(range(len(entries)))
        wbar = 0.38
        for ax, key_o, key_t, ylabel, scale in (
                (axes[0], "ours_fps", "theirs_fps", "frames/s (higher is better)", 1.0),
                (axes[1], "ours_mem", "theirs_mem",
                 ("GPU peak allocated" if gpu else "peak RSS") + " above baseline, MiB (lower is better)", MIB)):
            o = [(e["summary"][key_o] or 0) / scale for e in entries]
            t = [(e["summary"][key_t] or 0) / scale for e in entries]
            ax.bar([i - wbar / 2 for i in x], o, wbar, label="gst-latent", color=COLOURS["gst-latent"])
            ax.bar([i + wbar / 2 for i in x], t, wbar, label="diffusers", color=COLOURS["diffusers"])
            ax.set_xticks(x)
            ax.set_xticklabels(labels, fontsize=7)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.legend(fontsize=8)
            ax.grid(axis="y", alpha=0.3)
        fig.suptitle(f"gst-latent vs diffusers ({title_tail})", fontsize=10)
        fig.tight_layout()
        path = os.path.join(out, f"{mode}-throughput.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    if res["memory_sweep"]:
        groups = defaultdict(list)
        for row in res["memory_sweep"]:
            groups[(row["family"], row["direction"], row["height"], row["width"])].append(row)
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        markers = ["o", "s", "^", "D"]
        for gi, (key, rows) in enumerate(sorted(groups.items())):
            fam, direction, h, w = key
            for impl, side, style in (("gst-latent", "ours", "-"), ("diffusers", "diffusers", "--")):
                xs = [r["frames"] for r in rows if r.get(side, {}).get("status") == "ok"]
                ys = [_mem(r[side]) / MIB for r in rows if r.get(side, {}).get("status") == "ok"]
                label = f"{impl}, {fam} {direction} {h}x{w}"
                if xs:
                    ax.plot(xs, ys, style, marker=markers[gi % len(markers)], color=COLOURS[impl], label=label)
                failed = [(r["frames"], _status(r[side])) for r in rows if _status(r.get(side)) not in (None, "-")]
                for fx, why in failed:
                    y = max(ys) if ys else 0
                    ax.plot([fx], [y], marker="x", color=COLOURS[impl], markersize=9)
                    ax.annotate(f"{impl}: {why.split(' (')[0]}", (fx, y), fontsize=7, textcoords="offset points",
                                xytext=(-40, 8 + 10 * gi))
        ax.set_xscale("log", base=2)
        allx = sorted({r["frames"] for r in res["memory_sweep"]})
        ax.set_xticks(allx)
        ax.set_xticklabels([str(v) for v in allx])
        ax.set_xlabel("clip length, frames")
        ax.set_ylabel(("GPU peak allocated" if gpu else "peak RSS") + " above baseline, MiB")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(f"Memory against clip length ({title_tail})", fontsize=10)
        fig.tight_layout()
        path = os.path.join(out, f"{mode}-memory.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


# ---- profiles -------------------------------------------------------------------------------------------------

def trace_self_times(path):
    """Self time per op name from a LibTorch (legacy profiler) chrome trace: complete events nest by time on each
    thread; an op's self time is its duration minus that of its direct children."""
    with open(path) as f:
        events = json.load(f)
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    by_tid = defaultdict(list)
    for ev in events:
        if ev.get("ph") == "X" and "dur" in ev:
            by_tid[ev.get("tid")].append((float(ev["ts"]), float(ev["dur"]), ev["name"]))
    self_us = defaultdict(float)
    total_us = defaultdict(float)
    calls = defaultdict(int)
    top_level = 0.0
    for evs in by_tid.values():
        evs.sort(key=lambda e: (e[0], -e[1]))
        stack = []  # [end, name, duration, time in direct children]

        def pop():
            _, name, dur, child = stack.pop()
            self_us[name] += max(0.0, dur - child)

        for ts, dur, name in evs:
            while stack and ts >= stack[-1][0]:
                pop()
            if stack:
                stack[-1][3] += dur
            else:
                top_level += dur
            calls[name] += 1
            total_us[name] += dur
            stack.append([ts + dur, name, dur, 0.0])
        while stack:
            pop()
    ops = [{"name": n, "self_us": self_us[n], "total_us": total_us[n], "calls": calls[n]} for n in calls]
    return {"top_level_us": top_level, "ops": sorted(ops, key=lambda r: -r["self_us"])}


def self_time_table(table, rows=25):
    total = sum(o["self_us"] for o in table["ops"]) or 1.0
    out = [f"{'op':48s} {'self ms':>10s} {'self %':>7s} {'total ms':>10s} {'calls':>7s}"]
    for o in table["ops"][:rows]:
        out.append(f"{o['name'][:48]:48s} {o['self_us'] / 1e3:10.1f} {100 * o['self_us'] / total:6.1f}% "
                   f"{o['total_us'] / 1e3:10.1f} {o['calls']:7d}")
    out.append(f"{'all ops (self)':48s} {total / 1e3:10.1f}")
    return "\n".join(out) + "\n"
