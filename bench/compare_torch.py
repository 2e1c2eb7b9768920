#!/usr/bin/env python3
"""Compares shardplan's training steps (bench/train_bench.cpp) with the same steps in PyTorch.

A benchmark harness, not a test: it prints figures and never fails on a timing. Both sides run on
this machine in one run, alternated round by round (torch MLP, shardplan MLP, torch LLaMA,
shardplan LLaMA), so that they see the same machine state.

The PyTorch models copy bench/train_bench.cpp exactly (shapes, dtypes, optimizer):

- MLP step (bench/mlp_train_step.hpp, examples/mlp.hpp): 784-1024-1024-1024-10, batch 4096, f32,
  layers x @ w + b with w [in, out] (normal, stddev 0.03) and b [out] (zeros), ReLU between
  layers, mean softmax cross-entropy against labels i % 10, x standard normal; plain SGD
  (lr 0.01, no momentum). One step = forward, loss, backward, update.
- LLaMA-style step (examples/llama_model.hpp, llama_tokens in bench/train_bench.cpp): vocab 128,
  dim 256, 4 heads, ffn 512, 2 layers, seq 64, batch 32; embedding lookup; per layer RMS norm
  (eps 1e-6), attention with rotate-half rotary positions, causal mask, softmax and o_proj, RMS
  norm, SwiGLU MLP; final RMS norm and lm_head; mean cross-entropy over every token. Weights
  [out, in] applied as x @ W^T. AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on
  every parameter, as Optimizer::adamw with no decay paths). Tokens and targets uniform in
  [0, 127].

shardplan's side is build-release/bench/train_bench (Google Benchmark, JSON output); its
benchmarks set their own minimum time (3 s each) in the C++ source, so --seconds only applies
to the PyTorch side.

Torch needs Debian's python3-torch (the system /usr/bin/python3): the script installs it and
libopenblas0-pthread with apt-get when missing, and re-executes itself with /usr/bin/python3
when the current interpreter cannot import torch.

--check times nothing: it runs each PyTorch step and prints the losses (a sanity check of the
shapes). Exit status: 0 on success, 2 when the shardplan binary is missing (the build commands are
printed), 1 on other errors (or, with --check, a loss far from its expected value).
"""

import argparse
import ctypes
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BENCH = os.path.join(REPO_ROOT, "build-release", "bench", "train_bench")
BUILD_COMMANDS = ("cmake --preset release",
                  "cmake --build --preset release --target train_bench")
SYSTEM_PYTHON = "/usr/bin/python3"
DEBIAN_PACKAGES = ("python3-torch", "libopenblas0-pthread")
MIN_STEPS = 3  # timed steps per measurement, at least (besides the warm-up step)

# bench/mlp_train_step.hpp
MLP_SIZES = (784, 1024, 1024, 1024, 10)
MLP_BATCH = 4096
MLP_INIT_STDDEV = 0.03
MLP_LR = 0.01
# llama_tokens in bench/train_bench.cpp, examples/llama_model.hpp
LLAMA = {"vocab": 128, "dim": 256, "heads": 4, "ffn": 512, "layers": 2, "seq": 64, "batch": 32}
RMS_EPS = 1e-6  # rms_norm's default in include/shardplan/ops.hpp
ROPE_BASE = 10000.0
MASK_VALUE = -1e30  # causal_mask in src/program/ops/ops.cpp
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}

MLP_BENCH_8 = "BM_MlpTrainStep8Devices"
MLP_BENCH_1 = "BM_MlpTrainStep1Device"
LLAMA_BENCHES = ("BM_LlamaStepFsdpTp", "BM_LlamaStepDataParallel")
LABELS = {
    "torch_mlp": "torch MLP step",
    MLP_BENCH_8: "shardplan MLP step, 8 devices",
    MLP_BENCH_1: "shardplan MLP step, 1 device",
    "torch_llama": "torch LLaMA step",
    "BM_LlamaStepFsdpTp": "shardplan LLaMA step, FSDP+TP (fsdp:4,tp:2)",
    "BM_LlamaStepDataParallel": "shardplan LLaMA step, data parallel (data:8)",
}


def parse_args(argv):
    """Parses the command line."""
    parser = argparse.ArgumentParser(
        description="Time shardplan's training steps (bench/train_bench) beside the same steps in "
                    "PyTorch, alternating, on this machine. A benchmark, never a test.")
    parser.add_argument("--bench", default=DEFAULT_BENCH,
                        help="shardplan's train_bench binary (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="minimum time per PyTorch measurement, after one warm-up step "
                             "(default: %(default)s)")
    parser.add_argument("--torch-threads", type=int, default=2, metavar="N",
                        help="torch.set_num_threads(N), and OpenBLAS's threads too "
                             "(default: %(default)s)")
    parser.add_argument("--models", choices=("both", "mlp", "llama"), default="both",
                        help="which steps to compare (default: %(default)s)")
    parser.add_argument("--mlp-1device", action="store_true",
                        help=f"also run {MLP_BENCH_1} (the MLP step on 1 device)")
    parser.add_argument("--json", metavar="FILE", help="write every figure to FILE as JSON")
    parser.add_argument("--check", action="store_true",
                        help="time nothing: run one step of each PyTorch model and print the "
                             "losses (about ln 10 = 2.30 for the MLP; for LLaMA ln 128 = 4.85 "
                             "plus about 0.5 at this initialisation)")
    parser.add_argument("--no-install", action="store_true",
                        help="do not check or install the Debian packages")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.seconds < 0:
        parser.error("--seconds must not be negative")
    if args.torch_threads < 1:
        parser.error("--torch-threads must be at least 1")
    return args


def ensure_debian_packages(packages):
    """Installs the Debian packages that dpkg does not list as installed (apt-get, as root or
    through sudo). Exits with status 1 when the installation fails."""
    if shutil.which("dpkg-query") is None:
        print("note: dpkg-query not found (not Debian?); not checking " + ", ".join(packages),
              file=sys.stderr)
        return
    missing = []
    for pkg in packages:
        res = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg],
                             capture_output=True, text=True, check=False)
        if res.returncode != 0 or not res.stdout.strip().endswith("install ok installed"):
            missing.append(pkg)
    if not missing:
        return
    prefix = [] if os.geteuid() == 0 else ["sudo"]
    install = prefix + ["apt-get", "install", "-y", "--no-install-recommends"] + missing
    print("installing: " + " ".join(install), file=sys.stderr, flush=True)
    if subprocess.run(install, check=False).returncode != 0:
        # The package lists may be missing or stale: refresh them once and try again.
        subprocess.run(prefix + ["apt-get", "update"], check=False)
        if subprocess.run(install, check=False).returncode != 0:
            sys.exit("error: could not install " + " ".join(missing))


def reexec_with_system_python_if_needed(argv):
    """Returns when torch imports here; otherwise re-executes this script with the system
    python (Debian's python3-torch lives in its dist-packages), or exits when this already is
    the system python."""
    try:
        import torch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        return
    except ImportError as err:
        here = os.path.realpath(sys.executable)
        if os.path.exists(SYSTEM_PYTHON) and here != os.path.realpath(SYSTEM_PYTHON):
            print(f"note: torch is not importable from {sys.executable}; "
                  f"re-running with {SYSTEM_PYTHON}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(__file__)] + argv)
        sys.exit(f"error: cannot import torch with {sys.executable}: {err}")


def loaded_openblas():
    """Returns (path, ctypes library) of the OpenBLAS this process has loaded, or (None, None)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = sorted({line.split()[-1] for line in maps
                            if "blas" in line and line.split()[-1].startswith("/")})
    except OSError:
        return None, None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_num_threads  # pylint: disable=pointless-statement
            return path, lib
        except (OSError, AttributeError):
            continue
    return None, None


def set_torch_threads(n):
    """torch.set_num_threads(n); also OpenBLAS's thread count, which torch leaves alone (Debian's
    torch calls the system BLAS, OpenBLAS with its own thread pool)."""
    import torch  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(n)
    _, lib = loaded_openblas()
    if lib is not None:
        lib.openblas_set_num_threads(ctypes.c_int(n))


def machine_info():
    """CPU model, core count, load, torch version, its BLAS (as configured and as loaded), and
    the thread counts in effect."""
    import torch  # pylint: disable=import-outside-toplevel
    cpu = None
    if shutil.which("lscpu"):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.MULTILINE)
        cpu = m.group(1).strip() if m else None
    if cpu is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.MULTILINE)
                cpu = m.group(1).strip() if m else None
        except OSError:
            pass
    config = torch.__config__.show()
    blas_config = ", ".join(re.findall(r"\b(?:BLAS_INFO|LAPACK_INFO)=[^,\s]*", config))
    blas_lines = [ln.strip(" -") for ln in config.splitlines()
                  if "BLAS" in ln.upper() and "Build settings" not in ln]
    if blas_lines:
        blas_config = "; ".join(filter(None, [blas_config] + blas_lines))
    path, lib = loaded_openblas()
    blas_loaded, blas_threads = None, None
    if lib is not None:
        lib.openblas_get_config.restype = ctypes.c_char_p
        blas_loaded = f"{lib.openblas_get_config().decode()} ({path})"
        blas_threads = lib.openblas_get_num_threads()
    return {
        "cpu": cpu or platform.processor() or "unknown",
        "nproc": os.cpu_count(),
        "loadavg_at_start": list(os.getloadavg()),
        "python": sys.executable,
        "torch_version": torch.__version__,
        "torch_blas_config": blas_config or "(no BLAS line in torch.__config__.show())",
        "blas_loaded": blas_loaded or "(no OpenBLAS loaded)",
        "torch_threads": torch.get_num_threads(),
        "openblas_threads": blas_threads,
    }


def make_mlp():
    """The MLP step of bench/mlp_train_step.hpp. Returns (step, info): step() runs forward, loss,
    backward and the SGD update and returns the loss (a tensor)."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
    params = []
    for n_in, n_out in zip(MLP_SIZES[:-1], MLP_SIZES[1:]):
        w = (torch.randn(n_in, n_out) * MLP_INIT_STDDEV).requires_grad_()
        b = torch.zeros(n_out, requires_grad=True)
        params.append((w, b))
    flat = [p for layer in params for p in layer]
    x = torch.randn(MLP_BATCH, MLP_SIZES[0])
    y = torch.arange(MLP_BATCH) % 10

    def logits():
        """x @ w + b per layer, ReLU between layers."""
        h = x
        for i, (w, b) in enumerate(params):
            h = torch.addmm(b, h, w)
            if i + 1 < len(params):
                h = torch.relu(h)
        return h

    def step():
        """One training step; returns the loss before the update."""
        loss = F.cross_entropy(logits(), y)
        loss.backward()
        with torch.no_grad():
            for p in flat:
                p.add_(p.grad, alpha=-MLP_LR)
                p.grad = None
        return loss.detach()

    info = {"params": sum(p.numel() for p in flat),
            "logits_shape": list(logits().shape)}
    return step, info


def rotary_tables(seq, head_dim):
    """cos and sin [seq, head_dim / 2] of rotary in examples/llama_model.hpp: angle(t, i) =
    t * exp(-2 i ln(10000) / head_dim)."""
    import torch  # pylint: disable=import-outside-toplevel
    half = head_dim // 2
    pos = torch.arange(seq, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(half, dtype=torch.float32) *
                     (-2.0 * math.log(ROPE_BASE) / head_dim))
    angle = pos * freq
    return torch.cos(angle), torch.sin(angle)


def make_llama():
    """The LLaMA-style step of llama_tokens (bench/train_bench.cpp). Returns (step, info):
    step() runs forward, loss, backward and the AdamW update and returns the loss."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
    cfg = LLAMA
    dim, heads, batch, seq, vocab = cfg["dim"], cfg["heads"], cfg["batch"], cfg["seq"], cfg["vocab"]
    head_dim = dim // heads
    half = head_dim // 2

    def weight(n_out, n_in):
        """A Linear weight [out, in], normal with stddev 1/sqrt(in) (llama::init)."""
        return (torch.randn(n_out, n_in) / math.sqrt(n_in)).requires_grad_()

    def ones(n):
        """A norm's scale, ones."""
        return torch.ones(n, requires_grad=True)

    p = {"embed": weight(vocab, dim), "norm": ones(dim), "lm_head": weight(vocab, dim),
         "layers": []}
    for _ in range(cfg["layers"]):
        p["layers"].append({
            "input_norm": ones(dim), "post_norm": ones(dim),
            "q": weight(dim, dim), "k": weight(dim, dim), "v": weight(dim, dim),
            "o": weight(dim, dim),
            "gate": weight(cfg["ffn"], dim), "up": weight(cfg["ffn"], dim),
            "down": weight(dim, cfg["ffn"]),
        })
    flat = [p["embed"], p["norm"], p["lm_head"]] + [t for layer in p["layers"]
                                                    for t in layer.values()]
    cos, sin = rotary_tables(seq, head_dim)
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()  # key j visible from query i: j <= i
    tokens = torch.randint(0, vocab, (batch, seq))
    targets = torch.randint(0, vocab, (batch, seq))
    opt = torch.optim.AdamW(flat, lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], foreach=True)

    def rms_norm(x, scale):
        """x * rsqrt(mean(x * x, -1) + eps) * scale."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * scale

    def rotary(x):
        """Rotate-half rotary positions on [B, H, T, Dh]."""
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def split_heads(y):
        """[B, T, D] -> [B, H, T, Dh]."""
        return y.view(batch, seq, heads, head_dim).transpose(1, 2)

    def attention(layer, x):
        """Causal multi-head attention with rotary positions."""
        q = rotary(split_heads(F.linear(x, layer["q"])))
        k = rotary(split_heads(F.linear(x, layer["k"])))
        v = split_heads(F.linear(x, layer["v"]))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(head_dim))
        probs = torch.softmax(scores.masked_fill(~causal, MASK_VALUE), dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, dim)
        return F.linear(out, layer["o"])

    def mlp(layer, x):
        """SwiGLU: down((gate * sigmoid(gate)) * up); F.silu is gate * sigmoid(gate)."""
        return F.linear(F.silu(F.linear(x, layer["gate"])) * F.linear(x, layer["up"]),
                        layer["down"])

    def forward():
        """Next-token logits [B, T, vocab]."""
        h = F.embedding(tokens, p["embed"])
        for layer in p["layers"]:
            h = h + attention(layer, rms_norm(h, layer["input_norm"]))
            h = h + mlp(layer, rms_norm(h, layer["post_norm"]))
        return F.linear(rms_norm(h, p["norm"]), p["lm_head"])

    def step():
        """One training step; returns the loss before the update."""
        loss = F.cross_entropy(forward().reshape(batch * seq, vocab), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    with torch.no_grad():
        shape = list(forward().shape)
    info = {"params": sum(t.numel() for t in flat), "logits_shape": shape,
            "tokens_per_step": batch * seq}
    return step, info


def time_step(step, seconds):
    """One warm-up step, then steps until at least `seconds` have passed and MIN_STEPS were
    timed. Returns {"median_ms", "min_ms", "steps"}."""
    step()
    times = []
    start = time.perf_counter()
    while len(times) < MIN_STEPS or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "steps": len(times)}


def check_bench_binary(path):
    """Exits with status 2 and the build commands when shardplan's benchmark binary is missing."""
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return
    print(f"error: shardplan's benchmark binary {path} does not exist (or is not executable).",
          file=sys.stderr)
    print("Build it (Release preset, build directory build-release; needs Google Benchmark, "
          "Debian's libbenchmark-dev) with:", file=sys.stderr)
    print(f"  cd {REPO_ROOT}", file=sys.stderr)
    for cmd in BUILD_COMMANDS:
        print(f"  {cmd}", file=sys.stderr)
    print("or pass another build's binary with --bench PATH.", file=sys.stderr)
    sys.exit(2)


def run_shardplan(bench, names, tokens_per_step):
    """Runs the named benchmarks of train_bench (JSON output). Returns {name: {"ms",
    "iterations", and for the LLaMA steps "tokens_per_s" (tokens per step / wall time) and
    "tokens_per_s_counter" (the binary's own counter)}}."""
    # Names carry suffixes: BM_LlamaStepFsdpTp/min_time:3.000/real_time.
    pattern = "^(" + "|".join(re.escape(n) for n in names) + ")(/|$)"
    cmd = [bench, f"--benchmark_filter={pattern}", "--benchmark_format=json"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        sys.exit(f"error: {' '.join(cmd)} exited with status {res.returncode}")
    try:
        report = json.loads(res.stdout)
    except json.JSONDecodeError as err:
        sys.stderr.write(res.stdout[-2000:] + res.stderr[-2000:])
        sys.exit(f"error: {bench} did not print JSON ({err})")
    to_ms = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
    out = {}
    for entry in report.get("benchmarks", []):
        name = entry.get("run_name", entry["name"]).split("/")[0]
        if name not in names or entry.get("run_type", "iteration") != "iteration":
            continue
        if entry.get("error_occurred"):
            sys.exit(f"error: {name} failed: {entry.get('error_message')}")
        ms = entry["real_time"] * to_ms[entry.get("time_unit", "ns")]
        fig = {"ms": ms, "iterations": entry.get("iterations")}
        if name in LLAMA_BENCHES:
            fig["tokens_per_s"] = tokens_per_step / (ms / 1e3)
            fig["tokens_per_s_counter"] = entry.get("tokens_per_s")
        out[name] = fig
    absent = [n for n in names if n not in out]
    if absent:
        sys.exit(f"error: {bench} reported no result for {', '.join(absent)}")
    return out


def run_rounds(args, models, tokens_per_step):
    """The alternating rounds. Returns a list (one dict per round) of {key: figures}."""
    rounds = []
    mlp_benches = [MLP_BENCH_8] + ([MLP_BENCH_1] if args.mlp_1device else [])
    for r in range(args.rounds):
        got = {}
        if "mlp" in models:
            print(f"round {r + 1}/{args.rounds}: torch MLP", flush=True)
            got["torch_mlp"] = time_step(models["mlp"], args.seconds)
            print(f"round {r + 1}/{args.rounds}: shardplan MLP ({', '.join(mlp_benches)})",
                  flush=True)
            got.update(run_shardplan(args.bench, mlp_benches, tokens_per_step))
        if "llama" in models:
            print(f"round {r + 1}/{args.rounds}: torch LLaMA", flush=True)
            fig = time_step(models["llama"], args.seconds)
            fig["tokens_per_s"] = tokens_per_step / (fig["median_ms"] / 1e3)
            got["torch_llama"] = fig
            print(f"round {r + 1}/{args.rounds}: shardplan LLaMA ({', '.join(LLAMA_BENCHES)})",
                  flush=True)
            got.update(run_shardplan(args.bench, list(LLAMA_BENCHES), tokens_per_step))
        rounds.append(got)
    return rounds


def table_rows(rounds):
    """(label, per-round values) for each printed row, in the run's order."""
    rows = []
    for key in rounds[0]:
        label = LABELS[key]
        if key.startswith("torch_"):
            rows.append((f"{label}, median step (ms)", [r[key]["median_ms"] for r in rounds]))
            rows.append((f"{label}, fastest step (ms)", [r[key]["min_ms"] for r in rounds]))
        else:
            rows.append((f"{label} (ms)", [r[key]["ms"] for r in rounds]))
        if "tokens_per_s" in rounds[0][key]:
            rows.append((f"{label} (tokens/s)", [r[key]["tokens_per_s"] for r in rounds]))
    return rows


def medians(rounds):
    """The median over rounds of each measurement's time (ms) and tokens/s."""
    out = {}
    for key in rounds[0]:
        ms_key = "median_ms" if key.startswith("torch_") else "ms"
        out[key] = {"ms": statistics.median(r[key][ms_key] for r in rounds)}
        if "tokens_per_s" in rounds[0][key]:
            out[key]["tokens_per_s"] = statistics.median(r[key]["tokens_per_s"] for r in rounds)
    return out


def ratios(med):
    """torch time / shardplan time for the MLP steps and shardplan tokens/s / torch tokens/s
    for LLaMA (the same direction: > 1 means shardplan is faster)."""
    out = {}
    for bench in (MLP_BENCH_8, MLP_BENCH_1):
        if "torch_mlp" in med and bench in med:
            out[f"mlp: torch ms / {bench} ms"] = med["torch_mlp"]["ms"] / med[bench]["ms"]
    for bench in LLAMA_BENCHES:
        if "torch_llama" in med and bench in med:
            out[f"llama: {bench} tokens/s / torch tokens/s"] = (
                med[bench]["tokens_per_s"] / med["torch_llama"]["tokens_per_s"])
    return out


def print_report(info, args, rounds, rat):
    """Prints the machine, the per-round table (its last column: the median over rounds) and
    the ratios."""
    print()
    print(f"CPU: {info['cpu']} (nproc {info['nproc']}, load average at start "
          f"{info['loadavg_at_start'][0]:.2f})")
    print(f"torch {info['torch_version']} ({info['python']}), "
          f"torch threads {info['torch_threads']}, OpenBLAS threads {info['openblas_threads']}")
    print(f"torch BLAS: {info['torch_blas_config']}")
    print(f"BLAS loaded: {info['blas_loaded']}")
    print(f"shardplan: {args.bench} (its own minimum time per benchmark); torch: one warm-up "
          f"step, then >= {MIN_STEPS} steps and >= {args.seconds:g} s per measurement")
    print()
    rows = table_rows(rounds)
    width = max(len(label) for label, _ in rows)
    head = f"{'measurement':<{width}}" + "".join(f"{'round ' + str(i + 1):>11}"
                                                 for i in range(len(rounds)))
    print(head + f"{'median':>11}")
    for label, values in rows:
        line = f"{label:<{width}}" + "".join(f"{v:>11.1f}" for v in values)
        print(line + f"{statistics.median(values):>11.1f}")
    print()
    print("ratios of the medians over rounds (> 1: shardplan faster):")
    for name, value in rat.items():
        print(f"  {name}: {value:.2f}x")


def run_check(args):
    """--check: one step of each PyTorch model (two, to show the update moves the loss), with
    the losses. Returns the exit status (1 when a loss is not near its expected value)."""
    import torch  # pylint: disable=import-outside-toplevel
    torch.manual_seed(0)
    status = 0
    cases = []
    if args.models in ("both", "mlp"):
        cases.append(("MLP 784-1024-1024-1024-10, batch 4096, SGD lr 0.01", make_mlp,
                      math.log(10), "ln 10", ""))
    if args.models in ("both", "llama"):
        # Logits of about unit variance at this initialisation (RMS-normed h, lm_head stddev
        # 1/sqrt(dim)) add about 0.5 to ln 128.
        cases.append(("LLaMA vocab 128, dim 256, 4 heads, ffn 512, 2 layers, seq 64, batch 32, "
                      "AdamW", make_llama, math.log(LLAMA["vocab"]), "ln 128",
                      ", + about 0.5 from logits of unit variance at this init"))
    for title, make, expected, expected_name, note in cases:
        step, info = make()
        first = step().item()
        second = step().item()
        print(f"{title}: {info['params']:,} parameters, logits {info['logits_shape']}")
        print(f"  loss of step 1: {first:.4f} ({expected_name} = {expected:.4f}{note}); "
              f"after one update: {second:.4f}")
        if not (math.isfinite(first) and math.isfinite(second)) or abs(first - expected) > 1.0:
            print(f"  unexpected: the initial loss should be near {expected:.2f}")
            status = 1
    return status


def main(argv):
    """Entry point; returns the exit status."""
    args = parse_args(argv)
    if not args.check:
        check_bench_binary(args.bench)
    if not args.no_install:
        ensure_debian_packages(DEBIAN_PACKAGES)
    reexec_with_system_python_if_needed(argv)
    import torch  # pylint: disable=import-outside-toplevel
    torch.set_default_dtype(torch.float32)
    set_torch_threads(args.torch_threads)
    if args.check:
        info = machine_info()
        print(f"torch {info['torch_version']}, {info['torch_threads']} threads, "
              f"BLAS: {info['blas_loaded']}")
        return run_check(args)
    torch.manual_seed(0)
    models = {}
    tokens_per_step = LLAMA["batch"] * LLAMA["seq"]
    if args.models in ("both", "mlp"):
        models["mlp"], _ = make_mlp()
    if args.models in ("both", "llama"):
        models["llama"], _ = make_llama()
    info = machine_info()
    rounds = run_rounds(args, models, tokens_per_step)
    med = medians(rounds)
    rat = ratios(med)
    print_report(info, args, rounds, rat)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": info,
                       "settings": {"bench": args.bench, "rounds": args.rounds,
                                    "seconds": args.seconds, "min_steps": MIN_STEPS,
                                    "torch_threads": args.torch_threads,
                                    "models": args.models, "mlp_1device": args.mlp_1device},
                       "rounds": rounds, "median": med, "ratios": rat}, f, indent=2)
            f.write("\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
