#!/usr/bin/env python3
"""The GPU checks: the table (tools/gpu-checks.tsv), the runner of its stages and the report.

    gpu_checks.py run REPORT_DIR --stage STAGE [--table T] [--budget SECONDS]
    gpu_checks.py render REPORT_DIR          rewrite report.md and report.json from REPORT_DIR/results
    gpu_checks.py parse PARSER LOG [OUT_DIR] print the figures a parser finds (JSON)
    gpu_checks.py list [--table T]           the table, one check a line

tools/gpu-check sets up the machine (packages, venv, torch) and calls `run`; this file needs nothing but the
Python standard library, so it runs before anything is installed.

The table is tab-separated, one check a row: id, stage, needs, timeout (s), parser, expect, goal, command,
proves. A new feature adds its GPU check as a row; the stages read nothing else.
  needs   comma-separated conditions, each checked before the command runs; an unmet one is a skip with the
          reason: gpu (a CUDA device torch sees), gpus=N, build (the build stage passed: it runs first), venv
          (the references' Python), meson (BUILD is a meson build folder, not a GPU pack's), todo:TEXT (a prerequisite that has not landed: always a skip, saying TEXT)
  parser  how figures are read from the log and the check's out dir: none, meson, gtest, bench, figures, train
  expect  NAME OP NUMBER terms joined by ';' that the figures must meet, or the check fails (e.g.
          no_gpu_skips==0)
  goal    terms of the same form that are reported as met or not and leave the status alone (speed goals)
Commands run under bash in the source tree with SRC, BUILD, CHECK_OUT (an empty folder of the check's own),
REPORT and JOBS set. Exit 0 passes, 77 skips (the last output line is the reason), anything else fails.
Every passed check leaves REPORT_DIR/stamps/ID; a rerun keeps its result and does not run it again.

The stages, in the order they run: build (tools/gpu-check compiles), smoke (the machine, the plugin, one round
trip), headline (the figures a short loan must bring back first), proof (the GPU equals the CPU), speed (the
benchmarks against diffusers), training. `--stage` takes one or several, comma-separated. By default a stage's
budget (--budget) is checked against each row's timeout before it starts (rows that would not fit are pending).
With --deadline SECONDS (a GPU pack's run: tools/gpu-pack-run) the whole run has that many seconds and each stage
at most its STAGE_LIMITS; a check starts while MIN_START seconds remain and is cut when its stage's or the run's
time is up, so a short loan is used to its end. --prebuilt: the build is a pack's (the build need is met).
"""
import argparse
import datetime
import glob
import json
import os
import re
import shlex
import signal
import shutil
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TABLE = os.path.join(HERE, "gpu-checks.tsv")
COLUMNS = ("id", "stage", "needs", "timeout", "parser", "expect", "goal", "command", "proves")
STAGES = ("build", "smoke", "headline", "proof", "speed", "training")
STAGE_BUDGET = 600  # seconds: a stage fits a short loan of a machine and is resumable when it does not
# Under --deadline: each stage's own limit in seconds, and the least time left in which a check is started.
STAGE_LIMITS = {"build": 600, "smoke": 60, "headline": 300, "proof": 360, "speed": 600, "training": 600}
MIN_START = 15
PREBUILT = False


# ---------------------------------------------------------------------------------------------------- the table

def read_table(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            cells = line.split("\t")
            if cells[0] == "id":
                continue
            if len(cells) != len(COLUMNS):
                raise SystemExit(f"{path}:{n}: {len(cells)} columns, {len(COLUMNS)} expected ({', '.join(COLUMNS)})")
            row = dict(zip(COLUMNS, (c.strip() for c in cells)))
            row["timeout"] = int(row["timeout"])
            if row["stage"] not in STAGES:
                raise SystemExit(f"{path}:{n}: stage {row['stage']!r} is none of {', '.join(STAGES)}")
            if row["timeout"] > STAGE_BUDGET:
                raise SystemExit(f"{path}:{n}: timeout {row['timeout']} s exceeds a stage ({STAGE_BUDGET} s)")
            if row["parser"] not in PARSERS:
                raise SystemExit(f"{path}:{n}: parser {row['parser']!r} is none of {', '.join(PARSERS)}")
            for col in ("expect", "goal"):
                parse_terms(row[col])  # a malformed term fails here, not on the GPU machine
            rows.append(row)
    ids = [r["id"] for r in rows]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise SystemExit(f"{path}: duplicate ids: {', '.join(sorted(dup))}")
    return rows


TERM = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|==|!=|<|>)\s*(-?[\d.]+(?:e-?\d+)?)\s*$")
OPS = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, "==": lambda a, b: a == b,
       "!=": lambda a, b: a != b, "<": lambda a, b: a < b, ">": lambda a, b: a > b}


def parse_terms(text):
    if text in ("", "-"):
        return []
    out = []
    for t in text.split(";"):
        m = TERM.match(t)
        if not m:
            raise SystemExit(f"bad term {t!r}: NAME OP NUMBER expected")
        out.append((m.group(1), m.group(2), float(m.group(3))))
    return out


def judge(terms, figures):
    """[(term text, True/False/None)]: None where the figure is missing."""
    out = []
    for name, op, value in terms:
        have = figures.get(name)
        text = f"{name} {op} {value:g}"
        out.append((text, None if not isinstance(have, (int, float)) else OPS[op](have, value)))
    return out


# ------------------------------------------------------------------------------------------------------ parsers

def _num(s):
    try:
        v = float(s)
    except ValueError:
        return None
    return int(v) if v.is_integer() and "." not in s and "e" not in s.lower() else v


def parse_none(log, out_dir):
    return {}


def parse_meson(log, out_dir):
    """meson test's summary, and the skip reasons of its log: a "no GPU" skip on a GPU machine means a CUDA
    variant did not run."""
    fig = {}
    for key, name in (("Ok", "ok"), ("Expected Fail", "expected_fail"), ("Fail", "fail"),
                      ("Unexpected Pass", "unexpected_pass"), ("Skipped", "skipped"), ("Timeout", "timeout")):
        m = re.findall(rf"^{key}:\s+(\d+)\s*$", log, re.M)
        if m:
            fig[name] = int(m[-1])
    testlog = ""
    for p in sorted(glob.glob(os.path.join(out_dir or "", "*testlog*.txt"))):
        with open(p, errors="replace") as f:
            testlog += f.read()
    fig.update(_gtest_counts(log + testlog, prefix="gtest_"))
    fig["no_gpu_skips"] = len(re.findall(r"(?:Skipped|SKIPPED|skipped)\W[^\n]*\n?[^\n]*no GPU", log + testlog))
    return fig


def _gtest_counts(text, prefix=""):
    fig = {}
    for key, name in (("PASSED", "passed"), ("SKIPPED", "skipped"), ("FAILED", "failed")):
        m = re.findall(rf"^\[\s+{key}\s+\] (\d+) tests?", text, re.M)
        if m:
            fig[prefix + name] = sum(int(x) for x in m)
    return fig


def parse_gtest(log, out_dir):
    fig = _gtest_counts(log)
    fig["no_gpu_skips"] = len(re.findall(r"Skipped\s*\n\s*no GPU", log))
    return fig


def _bench_results(out_dir):
    found = []
    for p in sorted(glob.glob(os.path.join(out_dir or "", "**", "*results.json"), recursive=True)):
        try:
            with open(p) as f:
                found.append(json.load(f))
        except (OSError, ValueError):
            continue
    return found


def _figure_name(text):
    """Results name their sides in prose ("one, same cores"); a figure name is words joined by '_' and '.', as
    expectations (NAME OP NUMBER) read them."""
    return re.sub(r"[^\w.]+", "_", str(text)).strip("_")


def _flat_numbers(d, prefix, out, depth=0):
    for k, v in d.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[f"{prefix}{_figure_name(k)}"] = v
        elif isinstance(v, dict) and depth < 1:
            _flat_numbers(v, f"{prefix}{_figure_name(k)}.", out, depth + 1)


def parse_bench(log, out_dir):
    """tools/bench's results JSON (written to the check's out dir): per clip, gst-latent and diffusers frames/s,
    seconds per clip, GPU peak MiB, their ratios and the share of the bf16 peak."""
    fig = {}
    for res in _bench_results(out_dir):
        for e in res.get("throughput", []):
            s = e.get("summary", {})
            key = f"{e['family']}_{e['direction']}_{e['frames']}x{e['height']}x{e['width']}".replace(".", "")
            for src, dst, scale in (("ours_fps", "fps", 1), ("theirs_fps", "diffusers_fps", 1),
                                    ("ours_wall", "s", 1), ("theirs_wall", "diffusers_s", 1),
                                    ("fps_ratio", "ratio", 1), ("ours_mem", "mib", 2 ** -20),
                                    ("theirs_mem", "diffusers_mib", 2 ** -20), ("mem_ratio", "mem_ratio", 1),
                                    ("ours_peak_share", "peak_share", 1), ("output_rel_diff", "rel_diff", 1)):
                v = s.get(src)
                if isinstance(v, (int, float)):
                    fig[f"{key}.{dst}"] = round(v * scale, 6)
        for i, c in enumerate(res.get("cases", [])):
            name = _figure_name(c.get("name") or c.get("case") or f"case{i}")
            _flat_numbers(c.get("summary", {}), f"{name}.", fig)
    for m in re.finditer(r"median ([\d.]+) frames/s;.*output mean \|x\| ([\d.e+-]+)", log):
        fig["latent_bench_fps"] = float(m.group(1))
    return fig


FIGURE = re.compile(r"^figure\s+([A-Za-z_][\w.]*)\s+(\S+)\s*$", re.M)


def parse_figures(log, out_dir):
    """`figure NAME VALUE` lines, which the check cases (tools/gpu-check-cases) print."""
    fig = {}
    for m in FIGURE.finditer(log):
        v = _num(m.group(2))
        fig[m.group(1)] = v if v is not None else m.group(2)
    return fig


def parse_train(log, out_dir):
    """The recipes' progress lines: the last step, loss and PSNR they print."""
    fig = parse_figures(log, out_dir)
    for name, rx in (("step", r"\bstep\s*[=:]?\s*(\d+)"), ("loss", r"\bloss\s*[=:]?\s*([\d.e+-]+)"),
                     ("psnr_db", r"\bPSNR\s*[=:]?\s*([\d.]+)")):
        m = re.findall(rx, log, re.I)
        if m and _num(m[-1]) is not None:
            fig.setdefault(name, _num(m[-1]))
    return fig


PARSERS = {"none": parse_none, "meson": parse_meson, "gtest": parse_gtest, "bench": parse_bench,
           "figures": parse_figures, "train": parse_train}


# ------------------------------------------------------------------------------------------------------- runner

def gpu_count():
    v = os.environ.get("LATENT_GPUS", "")
    return int(v) if v.isdigit() else 0


def unmet(row, report):
    """The reason a check cannot run on this machine, or None."""
    for need in filter(None, (n.strip() for n in row["needs"].split(","))):
        if need.startswith("todo:"):
            return "not yet possible: " + need[5:]
        if need == "gpu" and gpu_count() < 1:
            return "no GPU: " + os.environ.get("LATENT_GPU_PROBE", "torch sees no CUDA device")
        if need.startswith("gpus="):
            want = int(need[5:])
            if gpu_count() < want:
                return f"needs {want} GPUs, this machine has {gpu_count()}"
        if need == "venv" and not os.environ.get("LATENT_PYTHON"):
            return "no Python with the references (tools/gpu-check makes one)"
        if need == "meson" and not os.path.exists(os.path.join(os.environ.get("BUILD", ""), "build.ninja")):
            return "not a meson build folder (a GPU pack runs its test binaries directly)"
        if need == "build" and not PREBUILT and not build_passed(report):
            return "the build stage has not passed (see its checks)"
    return None


def build_passed(report):
    return all(os.path.exists(os.path.join(report, "stamps", r["id"])) for r in TABLE if r["stage"] == "build")


def result_path(report, cid):
    return os.path.join(report, "results", cid + ".json")


def load_result(report, cid):
    try:
        with open(result_path(report, cid)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def save_result(report, res):
    os.makedirs(os.path.join(report, "results"), exist_ok=True)
    tmp = result_path(report, res["id"]) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, result_path(report, res["id"]))
    if res["status"] == "pass":
        os.makedirs(os.path.join(report, "stamps"), exist_ok=True)
        with open(os.path.join(report, "stamps", res["id"]), "w") as f:
            f.write(res["finished"] + "\n")


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def run_check(row, report, src, timeout=None, cut_reason=""):
    """Runs a row's command; `timeout` (at most the row's) cuts it short with `cut_reason` when given."""
    limit = row["timeout"] if timeout is None else min(row["timeout"], timeout)
    logs = os.path.join(report, "logs")
    out_dir = os.path.join(report, "out", row["id"])
    os.makedirs(logs, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(logs, row["id"] + ".log")
    env = dict(os.environ, SRC=src, CHECK_OUT=out_dir, REPORT=report, CHECK_ID=row["id"])
    env.setdefault("BUILD", os.path.join(src, "build"))
    env.setdefault("JOBS", str(os.cpu_count() or 1))
    started, t0 = now(), time.monotonic()
    with open(log_path, "w") as log:
        log.write(f"# {row['id']}: {row['command']}\n# started {started}\n")
        log.flush()
        # A process group of its own, so a timeout ends the command's children too.
        p = subprocess.Popen(["bash", "-c", row["command"]], cwd=src, env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            rc, timed_out = p.returncode, True
    seconds = round(time.monotonic() - t0, 1)
    with open(log_path, errors="replace") as f:
        text = f.read()
    try:
        figures = PARSERS[row["parser"]](text, out_dir)
    except Exception as e:  # a parser's defect must not hide the check's own result
        figures = {"parser_error": f"{type(e).__name__}: {e}"}
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith("# ")]
    last = lines[-1].strip() if lines else ""
    if timed_out and limit < row["timeout"]:
        status, reason = "pending", f"cut after {limit:.0f} s: {cut_reason} (rerun to continue)"
    elif timed_out:
        status, reason = "fail", f"timed out after {row['timeout']} s (rerun the stage to continue)"
    elif rc == 77:
        status, reason = "skip", last or "skipped (exit 77)"
    elif rc != 0:
        status, reason = "fail", f"exit status {rc}: {last}"
    else:
        status, reason = "pass", ""
    expect = judge(parse_terms(row["expect"]), figures)
    broken = [t for t, ok in expect if ok is not True]
    if status == "pass" and broken:
        status, reason = "fail", "expected " + "; ".join(broken)
    return {
        "id": row["id"], "stage": row["stage"], "status": status, "reason": reason, "seconds": seconds,
        "figures": figures, "expect": expect, "goals": judge(parse_terms(row["goal"]), figures),
        "rc": rc, "log": os.path.relpath(log_path, report), "command": row["command"], "proves": row["proves"],
        "started": started, "finished": now(),
    }


def skipped(row, reason, status="skip"):
    return {"id": row["id"], "stage": row["stage"], "status": status, "reason": reason, "seconds": 0,
            "figures": {}, "expect": [], "goals": [], "rc": None, "log": None, "command": row["command"],
            "proves": row["proves"], "started": None, "finished": now()}


def run_stage(report, stages, src, budget):
    t0 = time.monotonic()
    ran = 0
    for row in TABLE:
        if row["stage"] not in stages:
            continue
        if os.path.exists(os.path.join(report, "stamps", row["id"])):
            print(f"[gpu-check] {row['id']}: passed earlier, not run again", flush=True)
            continue
        reason = unmet(row, report)
        if reason:
            save_result(report, skipped(row, reason))
            print(f"[gpu-check] {row['id']}: skip ({reason})", flush=True)
        elif time.monotonic() - t0 + row["timeout"] > budget and ran:
            save_result(report, skipped(row, f"not started: the stage's {budget} s would be exceeded "
                                              "(rerun the stage to continue)", status="pending"))
            print(f"[gpu-check] {row['id']}: pending (stage budget)", flush=True)
        else:
            print(f"[gpu-check] {row['id']}: running (up to {row['timeout']} s)", flush=True)
            res = run_check(row, report, src)
            ran += 1
            save_result(report, res)
            print(f"[gpu-check] {row['id']}: {res['status']} in {res['seconds']} s"
                  + (f" ({res['reason']})" if res["reason"] else ""), flush=True)
        render(report)
    render(report)
    return stage_status(report, stages)


def stage_status(report, stages):
    results = [load_result(report, r["id"]) for r in TABLE if r["stage"] in stages]
    return 1 if any(r and r["status"] == "fail" for r in results) else 0


def run_deadline(report, stages, src, deadline, results_dir=None):
    """The stages in order under one budget of `deadline` seconds, each stage within its STAGE_LIMITS: a check
    starts while MIN_START seconds of both remain and is cut when either runs out; what cannot start is pending."""
    end = time.monotonic() + deadline
    for stage in STAGES:
        if stage not in stages:
            continue
        stage_end = min(end, time.monotonic() + STAGE_LIMITS[stage])
        for row in TABLE:
            if row["stage"] != stage:
                continue
            if os.path.exists(os.path.join(report, "stamps", row["id"])):
                print(f"[gpu-check] {row['id']}: passed earlier, not run again", flush=True)
                continue
            left = stage_end - time.monotonic()
            which = "the run's budget" if stage_end >= end else f"the {stage} stage's {STAGE_LIMITS[stage]} s"
            reason = unmet(row, report)
            if reason:
                save_result(report, skipped(row, reason))
                print(f"[gpu-check] {row['id']}: skip ({reason})", flush=True)
            elif left < MIN_START:
                save_result(report, skipped(row, f"not started: {which} ran out (rerun to continue)",
                                            status="pending"))
                print(f"[gpu-check] {row['id']}: pending ({which})", flush=True)
            else:
                print(f"[gpu-check] {row['id']}: running (up to {min(row['timeout'], left):.0f} s)", flush=True)
                res = run_check(row, report, src, timeout=left, cut_reason=f"{which} ran out")
                save_result(report, res)
                print(f"[gpu-check] {row['id']}: {res['status']} in {res['seconds']} s"
                      + (f" ({res['reason']})" if res["reason"] else ""), flush=True)
            render(report)
            publish(report, results_dir)
    render(report)
    publish(report, results_dir)
    return stage_status(report, stages)


def publish(report, results_dir, small=4 << 20):
    """Copies report.md and report.json to results_dir and archives every log and every output under `small`
    bytes as logs.tar.gz: three files, whatever the checks wrote."""
    if not results_dir:
        return
    os.makedirs(results_dir, exist_ok=True)
    for name in ("report.md", "report.json"):
        shutil.copyfile(os.path.join(report, name), os.path.join(results_dir, name))
    tmp = os.path.join(results_dir, "logs.tar.gz.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for d, _, files in os.walk(report):
            for f in sorted(files):
                p = os.path.join(d, f)
                rel = os.path.relpath(p, report)
                if rel.startswith(("stamps", "results")) or f.endswith(".tmp") or os.path.islink(p):
                    continue
                if os.path.getsize(p) < small:
                    tar.add(p, arcname=rel)
    os.replace(tmp, os.path.join(results_dir, "logs.tar.gz"))


# ------------------------------------------------------------------------------------------------------- report

def machine_info(report):
    try:
        with open(os.path.join(report, "machine.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render(report):
    results = []
    for row in TABLE:
        r = load_result(report, row["id"])
        results.append(r or dict(skipped(row, "not run yet", status="not run"), finished=None))
    counts = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    doc = {"written": now(), "machine": machine_info(report), "counts": counts, "checks": results}
    tmp = os.path.join(report, "report.json.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, os.path.join(report, "report.json"))

    md = ["# gst-latent GPU check", "", f"Written {doc['written']}."]
    m = doc["machine"]
    if m:
        md += [""] + [f"- {k}: {_fmt(v)}" for k, v in m.items()]
    md += ["", "Checks: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ".", "",
           "| check | stage | status | s | figures | proves |", "|---|---|---|--:|---|---|"]
    for r in results:
        fig = ", ".join(f"{k} {_fmt(v)}" for k, v in list(r["figures"].items())[:12])
        status = r["status"] + (f": {r['reason']}" if r["reason"] else "")
        log = f" ([log]({r['log']}))" if r.get("log") else ""
        md.append(f"| {r['id']} | {r['stage']} | {status}{log} | {_fmt(r['seconds'])} | {fig} | {r['proves']} |")
    goals = [(r["id"], t, ok) for r in results for t, ok in r["goals"]]
    if goals:
        md += ["", "## Goals", "", "| check | goal | met |", "|---|---|---|"]
        md += [f"| {cid} | {t} | {'-' if ok is None else ('yes' if ok else 'no')} |" for cid, t, ok in goals]
    with open(os.path.join(report, "report.md.tmp"), "w") as f:
        f.write("\n".join(md) + "\n")
    os.replace(os.path.join(report, "report.md.tmp"), os.path.join(report, "report.md"))


# --------------------------------------------------------------------------------------------------------- main

TABLE = []


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", default=DEFAULT_TABLE)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("report")
    r.add_argument("--stage", default="all", help="all, or stages comma-separated: " + ", ".join(STAGES))
    r.add_argument("--src", default=os.path.dirname(HERE))
    r.add_argument("--budget", type=int, default=STAGE_BUDGET)
    r.add_argument("--deadline", type=float, default=None, help="seconds for the whole run (see above)")
    r.add_argument("--prebuilt", action="store_true", help="the build is a pack's: no build stage")
    r.add_argument("--results", default="", help="with --deadline: copy the reports and a logs archive here")
    sub.add_parser("render").add_argument("report")
    pa = sub.add_parser("parse")
    pa.add_argument("parser", choices=sorted(PARSERS))
    pa.add_argument("log")
    pa.add_argument("out_dir", nargs="?", default="")
    sub.add_parser("list")
    a = p.parse_args(argv)
    TABLE[:] = read_table(a.table)
    if a.cmd == "list":
        for row in TABLE:
            print(f"{row['stage']:9s} {row['id']:24s} {row['timeout']:4d} s  needs {row['needs'] or '-'}: "
                  f"{row['proves']}")
        return 0
    if a.cmd == "parse":
        with open(a.log, errors="replace") as f:
            print(json.dumps(PARSERS[a.parser](f.read(), a.out_dir), indent=1, sort_keys=True))
        return 0
    report = os.path.abspath(a.report)
    os.makedirs(report, exist_ok=True)
    if a.cmd == "render":
        render(report)
        return 0
    stages = STAGES if a.stage == "all" else tuple(x.strip() for x in a.stage.split(",") if x.strip())
    bad = [x for x in stages if x not in STAGES]
    if bad or not stages:
        p.error(f"--stage {a.stage!r}: stages are {', '.join(STAGES)} (or all)")
    global PREBUILT
    PREBUILT = a.prebuilt
    if a.deadline is not None:
        return run_deadline(report, stages, os.path.abspath(a.src), a.deadline, a.results or None)
    # The build stage runs first whenever a check of the chosen stages needs it and it has not passed.
    if not PREBUILT and "build" not in stages and any("build" in r["needs"].split(",") and unmet_without_build(r, report) is None
                                     for r in TABLE if r["stage"] in stages) and not build_passed(report):
        stages = ("build",) + tuple(stages)
    return run_stage(report, stages, os.path.abspath(a.src), a.budget)


def unmet_without_build(row, report):
    stripped = dict(row, needs=",".join(n for n in row["needs"].split(",") if n.strip() != "build"))
    return unmet(stripped, report)


if __name__ == "__main__":
    sys.exit(main())
