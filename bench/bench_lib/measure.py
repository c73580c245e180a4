"""What every measurement of tools/bench shares: running one side in its own process, the machine's description and
how busy it is. A module of its own so that the mode modules (spatial, native and parallel generation) and the
command line that drives them all import it, and none imports the command line back."""
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time


TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REF_RUNNER = os.path.join(TOP, "bench", "bench_lib", "ref_runner.py")


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---- running one side -----------------------------------------------------------------------------------------

OOM_MARKERS = ("out of memory", "outofmemoryerror", "memoryerror", "can't allocate memory",
               "cannot allocate memory", "std::bad_alloc", "not enough memory")


def classify_failure(rc, stderr):
    low = stderr.lower()
    if any(m in low for m in OOM_MARKERS):
        return "oom"
    if rc is not None and rc < 0 and -rc == signal.SIGKILL:
        return "oom"  # the kernel's OOM killer (or a manual kill -9)
    return "failed"


def cpu_busy_fraction(seconds=1.0):
    """Fraction of the machine's CPU time that was not idle over the next `seconds` (others' work: call it while
    no measurement runs)."""
    def sample():
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return idle, sum(vals)
    try:
        i0, t0 = sample()
        time.sleep(seconds)
        i1, t1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_for_quiet(threshold, max_wait):
    """Waits (at most max_wait seconds) until other processes use less than `threshold` of the CPUs. Returns
    (busy fraction last seen, seconds waited)."""
    t0 = time.time()
    busy = cpu_busy_fraction()
    announced = False
    while busy is not None and busy > threshold and time.time() - t0 < max_wait:
        if not announced:
            log(f"  waiting for the machine to quieten (others use {100 * busy:.0f}% of the CPUs; "
                f"up to {max_wait} s, --wait-idle 0 disables)")
            announced = True
        time.sleep(4)
        busy = cpu_busy_fraction()
    return busy, time.time() - t0


def run_side(impl, cmd, timeout, env):
    """Runs one measurement process; returns its JSON, or a dict with "status" != "ok" saying why not."""
    t0 = time.time()
    load0 = os.getloadavg()[0]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        return {"impl": impl, "status": "timeout", "timeout_seconds": timeout, "process_seconds": time.time() - t0,
                "stderr_tail": (e.stderr or b"")[-800:].decode(errors="replace") if isinstance(e.stderr, bytes)
                else (e.stderr or "")[-800:], "cmd": cmd}
    elapsed = time.time() - t0
    res = None
    for line in reversed(p.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                res = json.loads(line)
                break
            except ValueError:
                pass
    if p.returncode != 0 or res is None:
        status = classify_failure(p.returncode, p.stderr)
        out = {"impl": impl, "status": status, "returncode": p.returncode, "process_seconds": elapsed,
               "stderr_tail": p.stderr[-1500:], "cmd": cmd}
        if res is not None:
            out["partial"] = res
        return out
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    res["status"] = "ok"
    res["process_seconds"] = elapsed
    # CPU time the process got: well below wall x threads means it shared the cores with something else.
    res["process_cpu_seconds"] = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    res["loadavg_1min_before"] = load0
    res["loadavg_1min_after"] = os.getloadavg()[0]
    res["cmd"] = cmd
    return res


class Runner:
    def __init__(self, args, mode):
        self.args = args
        self.mode = mode
        self.device = mode["device"]
        self.dtype = args.dtype or mode["dtype"]
        self.threads = args.threads or os.cpu_count() or 1
        self.timeout = args.timeout or mode["timeout"]
        self.env = dict(os.environ)
        # The same OpenMP pool size from the start in both processes (each also calls set_num_threads).
        self.env["OMP_NUM_THREADS"] = str(self.threads)
        self.env.setdefault("PYTHONWARNINGS", "ignore")

    def common(self, model, direction, frames, height, width, seed, warmup=0):
        return ["--model", model, "--frames", str(frames), "--height", str(height), "--width", str(width),
                "--direction", direction, "--device", self.device, "--dtype", self.dtype,
                "--threads", str(self.threads), "--repeat", "1", "--warmup", str(warmup), "--seed", str(seed)]

    def ours(self, model, direction, frames, height, width, seed=0, timeout=None, profile=None, warmup=0):
        cmd = [self.args.latent_bench] + self.common(model, direction, frames, height, width, seed, warmup) + ["--json"]
        if profile:
            cmd += ["--profile", profile]
        return self.measure("gst-latent", cmd, timeout)

    def theirs(self, model, direction, frames, height, width, seed=0, timeout=None, profile=None, warmup=0):
        cmd = [sys.executable, REF_RUNNER] + self.common(model, direction, frames, height, width, seed, warmup)
        if profile:
            cmd += ["--profile", profile]
        return self.measure("diffusers", cmd, timeout)

    def measure(self, impl, cmd, timeout):
        rejected = []
        for attempt in range(1 + max(0, self.args.retries)):
            r = self.measure_once(impl, cmd, timeout)
            share = r.get("cpu_share")
            if share is None or share >= self.args.min_cpu_share:
                break
            rejected.append({k: r.get(k) for k in ("fps_median", "wall_seconds_median", "cpu_share",
                                                   "others_cpu_busy_before")})
            if attempt < self.args.retries:
                log(f"  {impl}: got only {100 * share:.0f}% of the cores (another process ran); measuring again")
            else:
                r["contended"] = True
        if rejected:
            r["contended_attempts"] = rejected if not r.get("contended") else rejected[:-1]
        return r

    def measure_once(self, impl, cmd, timeout):
        busy, waited = (None, 0.0)
        if self.device == "cpu":
            busy, waited = wait_for_quiet(self.args.wait_idle, self.args.wait_max) if self.args.wait_idle > 0 \
                else (cpu_busy_fraction(0.5), 0.0)
        r = run_side(impl, cmd, timeout or self.timeout, self.env)
        r["others_cpu_busy_before"] = busy
        r["waited_for_quiet_seconds"] = waited
        if r.get("status") == "ok" and self.device == "cpu" and r.get("cpu_seconds"):
            # CPU time of the measured span over wall x threads: well below 1 means the cores were shared.
            r["cpu_share"] = statistics.median(
                c / (w * self.threads) for c, w in zip(r["cpu_seconds"], r["wall_seconds"]))
        return r


def describe(r):
    if r.get("status") != "ok":
        return f"{r.get('status')}" + (f" (rc {r.get('returncode')})" if "returncode" in r else "")
    mem = r.get("gpu_memory", {}).get("allocated_peak_above_baseline_bytes", r["rss_peak_above_baseline_bytes"])
    busy = r.get("others_cpu_busy_before")
    share = r.get("cpu_share")
    return (f"{r['fps_median']:.3f} frames/s, {r['wall_seconds_median']:.2f} s, +{mem / 2**20:.0f} MiB"
            + (f", others used {100 * busy:.0f}% of the CPUs before" if busy is not None else "")
            + (f", got {100 * share:.0f}% of {r['threads']} cores" if share is not None else ""))


# ---- the machine ----------------------------------------------------------------------------------------------

def machine_info(device):
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    import torch
    import diffusers
    info["torch"] = torch.__version__
    info["diffusers"] = diffusers.__version__
    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    info["loadavg_start"] = os.getloadavg()
    return info
