"""Benchmark machinery for ``minibert bench`` (spec/cli/bench.py says what it measures) and the
claims ledger's timing claims (``minibert_spec.claims.timing``): the timing primitives, FLOP
counts from the architecture's closed forms (``minibert_spec.costs``), the sgemm FLOP floor, peak
RSS, the BLAS in use (threadpoolctl), what each side times (``bench_sides``, built in a child of
the harness ``minibert_spec.benchproc``) and the self-check (``plausibility``, in every process):
a load average above the core count, an sgemm far below what the process's own 1-thread probe
predicts (or whose rounds spread widely), or a time faster than its FLOP floor means the machine
was busy and the figures are not a measurement of the code.

NumPy + threadpoolctl here; the torch side is ``tests/benchmarks/torch_side.py`` (``minibert_spec``
never imports torch itself), loaded by path when torch is installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from minibert_spec.costs import closed_forms
from minibert_spec.paths import HOME
from minibert_spec.protocol import IGNORE_INDEX

ROOT = HOME
TORCH_SIDE = ROOT / "tests" / "benchmarks" / "torch_side.py"


@dataclass
class Stats:
    median_ms: float
    p10_ms: float
    p90_ms: float
    n: int  # timed calls in all
    rounds: int = 1  # processes (each side's figure: the median of their medians)

    @classmethod
    def of_rounds(cls, rounds: list[list[float]]) -> Stats:
        """Over rounds (one list of call times per process): the median, p10 and p90 of the
        processes' median calls; ``n`` the calls in all.  A process's median is robust to
        its own outliers, the median over processes to a process that met a busy moment."""
        per = np.asarray([np.median(r) for r in rounds]) * 1e3
        return cls(float(np.median(per)), float(np.percentile(per, 10)),
                   float(np.percentile(per, 90)), sum(len(r) for r in rounds), len(rounds))


@dataclass
class Row:
    """One measurement at one thread count: the reference, torch (if available), their ratio."""

    key: str  # "step_full", "step_masked", "forward", "backward", "optimizer", ...
    name: str
    threads: int
    gflop: float
    ours: Stats
    torch: Stats | None = None
    floor_ms: float | None = None  # the same FLOPs at this run's measured sgemm rate

    @property
    def ratio(self) -> float | None:
        return None if self.torch is None else self.ours.median_ms / self.torch.median_ms

    @property
    def vs_floor(self) -> float | None:
        return None if not self.floor_ms else self.ours.median_ms / self.floor_ms


@dataclass
class Target:
    """One of the performance targets (issue "Faster than PyTorch eager"): a measured value
    against its bound; ``value`` None when this run did not measure it."""

    name: str
    value: float | None
    bound: float
    sense: str  # "<=" or ">="
    unit: str = ""
    detail: str = ""
    implausible: bool = False  # measured in a run that failed its self-check: never judged

    @property
    def met(self) -> bool | None:
        if self.value is None or self.implausible:
            return None
        return self.value <= self.bound if self.sense == "<=" else self.value >= self.bound


@dataclass
class BenchReport:
    preset: str
    batch: int
    seq: int
    dtype: str
    blas: list[dict]
    sgemm_gflops: dict[int, float]
    rows: list[Row] = field(default_factory=list)
    peak_rss_mib: dict = field(default_factory=dict)  # head -> MiB, a fresh process each
    train_rate: TrainRate | None = None
    targets: list[Target] = field(default_factory=list)
    policy: str = ""
    torch_note: str = ""
    cores: int = 0
    load: dict = field(default_factory=dict)  # "before" / "after" -> 1-minute load average
    sgemm_median: dict[int, float] = field(default_factory=dict)  # the probe's median round
    problems: list[str] = field(default_factory=list)  # the self-check's findings
    processes: list = field(default_factory=list)  # minibert_spec.benchproc.Process, in run order
    torch_sgemm_gflops: dict[int, float] = field(default_factory=dict)  # torch's own probe

    def row(self, key: str, threads: int) -> Row | None:
        return next((r for r in self.rows if r.key == key and r.threads == threads), None)

    def to_json(self) -> dict:
        out = asdict(self)
        for r, row in zip(out["rows"], self.rows):
            r["ratio"], r["vs_floor"] = row.ratio, row.vs_floor
        for t, target in zip(out["targets"], self.targets):
            t["met"] = target.met
        if self.train_rate is not None:
            out["train_rate"]["loaded_ratio"] = self.train_rate.loaded_ratio
        out["processes"] = [p.summary() for p in self.processes]  # medians, not every call
        return out


def alternate_raw(fns: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 2,
                  before: dict[str, Callable[[], object]] | None = None,
                  budget_s: float | None = None) -> dict[str, list[float]]:
    """Seconds of each of ``fns``, timed ``repeats`` times round-robin in this process (one
    side's rows in its own process: minibert_spec.benchproc); ``before[name]`` (untimed) runs right
    before each timed call (e.g. the forward whose graph a timed backward consumes).  With
    ``budget_s``, rounds after the first stop once that many seconds have passed (a loaded
    machine gets fewer repeats, never none)."""
    before = before or {}
    for _ in range(warmup):
        for name, fn in fns.items():
            if name in before:
                before[name]()
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    for r in range(repeats):
        if r and deadline is not None and time.perf_counter() > deadline:
            break
        for name, fn in fns.items():
            if name in before:
                before[name]()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def backward_inputs(impl, params, config, ids, labels, mask=None) -> tuple:
    """(dout, cache) that a timed ``impl.backward`` consumes: the forward's cache and the
    gradient of the mean cross-entropy of its logits (computed untimed, before the call)."""
    out, cache = impl.forward(params, config, ids, mask)
    _, c_loss = impl.cross_entropy_forward(out, labels)
    (dout,) = impl.cross_entropy_backward(1.0, c_loss)
    return dout, cache


# ---------------------------------------------------------------- what the bench times
# Each row of ``minibert bench`` (spec/cli/bench.py), on each side, in a child process of the
# harness (minibert_spec.benchproc): the job names BENCH_TASK, the child builds its callables with
# it.
BENCH_TASK = f"{__name__}:bench_sides"


def problem(config, B, T, seed):
    """(ids, labels, mask) of the bench's batch: ~15% of positions predicted, at least one
    per row."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, config.vocab_size, size=(B, T))
    labels = np.where(rng.random((B, T)) < 0.15, ids, IGNORE_INDEX)
    labels[:, 0] = ids[:, 0]  # at least one predicted position per row
    return ids, labels, np.ones((B, T), dtype=np.int64)


def reference_side(config, params, ids, labels, mask):
    """Callables over one mutable state dict: the reference's train steps (loss and gradients,
    then Adam in place, as torch.optim updates its parameters), forward + loss, backward, Adam.
    Under the caller's thread policy: the batch shards and Adam's tensors go to the workers."""
    import minibert_reference
    from minibert_reference import optim

    s = {"params": params, "state": minibert_reference.adam_init(params)}

    def step(loss_and_grads):
        def fn():
            _, grads, _ = loss_and_grads(s["params"], config, ids, labels=labels,
                                         attention_mask=mask)
            s["state"] = optim.adam_step_inplace(s["params"], grads, s["state"], lr=1e-4)
        return fn

    def forward():  # the scalar loss, forward only
        minibert_reference.loss(s["params"], config, ids, labels=labels, attention_mask=mask)

    def before_backward():  # untimed: the forward whose cache the timed backward consumes
        s["fwd"] = backward_inputs(minibert_reference, s["params"], config, ids, labels, mask)

    def backward():
        s["grads"], _ = minibert_reference.backward(*s["fwd"])

    def optimizer():  # in place, as torch.optim updates its parameters
        s["state"] = optim.adam_step_inplace(s["params"], s["grads"], s["state"], lr=1e-4)

    s["spare"] = ({k: v.copy() for k, v in params.items()}, minibert_reference.adam_init(params))

    def optimizer_out():  # the trainer's: into the step-before's arrays, then swap
        new = minibert_reference.adam_step(s["params"], s["grads"], s["state"], lr=1e-4,
                                           out=s["spare"])
        s["spare"], (s["params"], s["state"]) = (s["params"], s["state"]), new

    before_backward()
    backward()
    return {"step_full": step(minibert_reference.loss_and_grads),
            "step_masked": step(minibert_reference.masked_lm_loss_and_grads),
            "forward": forward, "backward": backward, "optimizer": optimizer,
            "optimizer_out": optimizer_out, "_before_backward": before_backward}


def torch_side(module, torch, config, params, ids, labels, mask):
    """torch eager's callables of the same rows (``module``: tests/benchmarks/torch_side.py),
    each on the same model, weights and batch."""
    tp, tforward, opt = module.build(params, config)
    t_ids, t_labels, t_mask = (torch.from_numpy(a) for a in (ids, labels, mask))
    t_pred = t_labels != IGNORE_INDEX
    s = {}

    def step(masked):
        def fn():
            opt.zero_grad(set_to_none=True)
            if masked:
                loss = module.loss(tforward(t_ids, t_mask, t_pred), t_labels[t_pred])
            else:
                loss = module.loss(tforward(t_ids, t_mask), t_labels)
            loss.backward()
            opt.step()
        return fn

    def forward():
        opt.zero_grad(set_to_none=True)
        s["loss"] = module.loss(tforward(t_ids, t_mask), t_labels)

    def backward():
        s["loss"].backward()

    def optimizer():
        opt.step()

    forward()
    backward()
    return {"step_full": step(False), "step_masked": step(True), "forward": forward,
            "backward": backward, "optimizer": optimizer, "optimizer_out": optimizer,
            "_before_backward": forward}


def bench_sides(job: dict, side: str):
    """(fns, before) of ``side`` for a bench job: the rows ``job["keys"]`` on the preset's
    model and the job's batch and seed; a timed backward's forward runs untimed before it."""
    from minibert_reference import init_params
    from minibert_reference.config import PRESETS

    config = PRESETS[job["preset"]]()
    ids, labels, mask = problem(config, job["batch"], job["seq"], job["seed"])
    params = init_params(config, seed=job["seed"], dtype=np.float32)
    if side == "ours":
        fns = reference_side(config, params, ids, labels, mask)
    else:
        import torch

        module, note = load_torch_side()
        if module is None:
            raise RuntimeError(note)
        fns = torch_side(module, torch, config, params, ids, labels, mask)
    keys = job["keys"]
    before = {"backward": fns["_before_backward"]} if "backward" in keys else {}
    return {k: fns[k] for k in keys}, before


def step_gflop(config, B: int, T: int, predicted: float | None = None) -> dict[str, float]:
    """Matmul GFLOP of a forward, a backward (2x the forward's matmuls) and a train step, from
    the architecture's closed forms (minibert_spec.costs.closed_forms, the claims ledger's too);
    ``predicted``: the fraction of positions the MLM head runs on (the masked head), None for
    all."""
    f, s = closed_forms()
    subs = {s["L"]: config.n_layers, s["H"]: config.hidden, s["A"]: config.n_heads,
            s["I"]: config.intermediate, s["T"]: T, s["V"]: config.vocab_size}
    body = float((s["L"] * f["layer_macs"]).subs(subs))
    head = float(f["head_macs"].subs(subs)) if config.head == "mlm" else 0.0
    if predicted is not None:
        head *= predicted
    fwd = 2 * B * (body + head) / 1e9
    return {"forward": fwd, "backward": 2 * fwd, "step": 3 * fwd}


def sgemm_gflops(threads: int, *, n: int = 512, k: int = 768, repeats: int = 20,
                 with_median: bool = False):
    """This machine's float32 matmul rate now (GFLOP/s) at ``threads`` BLAS threads: the best
    of ``repeats`` timings of the thread probe's [n, k] @ [k, k] products (about the shapes of
    a Mini-BERT step); with ``with_median``, (best, the median round's rate)."""
    from minibert_reference.train.threads import MATMULS_PER_ROUND, probe

    rounds: list[float] = []
    best = probe([threads], n=n, k=k, m=k, rounds=repeats,
                 reduce=lambda t: (rounds.extend(t), min(t))[1])[threads]
    work = MATMULS_PER_ROUND * 2 * n * k * k / 1e9
    if with_median:
        return work / best, work / float(np.median(rounds))
    return work / best


# ---------------------------------------------------------------- the self-check
# An n-thread sgemm below this fraction of min(n, cores) x the 1-thread rate measured in the
# same run: the threads did not get their cores (idle 2-core VM: 2 threads 1.86x 1 thread; the
# busy run of issue 24 measured 10 GFLOP/s at 2 threads against ~170 at 1).
SGEMM_MIN_FRACTION = 0.5
# The probe's best round over its median round above this: the rounds were contended.
SGEMM_MAX_SPREAD = 2.0


def load_average() -> float | None:
    """The 1-minute load average, None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def plausibility(*, cores: int, load_before: float | None, load_after: float | None,
                 own_threads: int, sgemm: dict[int, float], sgemm_median: dict[int, float],
                 floors: dict[str, float], own_before: int = 0) -> list[str]:
    """What makes a run's timings implausible as a measurement of the code, one line each
    (empty: plausible).  ``floors``: measurement name -> its time over its FLOP floor (the
    same GFLOP at this run's sgemm rate); below 1 is faster than the machine can multiply,
    so the sgemm that set the floor was measured on a busy machine.  The load after the run
    counts this run's own ``own_threads`` out; the load before counts ``own_before`` out (a
    process started right after the run's earlier ones: the 1-minute average still holds
    them)."""
    out = []
    if load_before is not None and load_before - own_before > cores:
        out.append(f"load average {load_before:.2f} above the {cores} core(s) before the run"
                   if not own_before else
                   f"load average {load_before:.2f} before the run ({load_before - own_before:.2f}"
                   f" without the {own_before} thread(s) of its earlier processes) above the "
                   f"{cores} core(s)")
    if load_after is not None and load_after - own_threads > cores:
        out.append(f"load average {load_after:.2f} after the run ({load_after - own_threads:.2f}"
                   f" without its own {own_threads} thread(s)) above the {cores} core(s)")
    one = sgemm.get(1)
    for n, rate in sorted(sgemm.items()):
        usable = min(n, cores)
        if one and n > 1 and rate < SGEMM_MIN_FRACTION * usable * one:
            out.append(f"sgemm at {n} BLAS threads {rate:.0f} GFLOP/s, far below {usable} x the "
                       f"1-thread probe's {one:.0f} GFLOP/s")
        median = sgemm_median.get(n)
        if median and rate > SGEMM_MAX_SPREAD * median:
            out.append(f"sgemm at {n} BLAS thread(s): best round {rate:.0f} GFLOP/s, median "
                       f"{median:.0f}: the probe was contended")
    for name, vs_floor in floors.items():
        if vs_floor < 1.0:
            out.append(f"{name} took {vs_floor:.2f}x its FLOP floor, faster than this run's "
                       f"sgemm allows: the floor was measured on a busy machine")
    return out


def blas_info() -> list[dict]:
    from threadpoolctl import threadpool_info

    return [{k: d.get(k) for k in ("user_api", "internal_api", "version", "num_threads",
                                   "threading_layer", "architecture")}
            for d in threadpool_info()]


def load_torch_side():
    """The torch module and tests/benchmarks/torch_side.py, or (None, reason)."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch is not installed: reference figures only"
    if not TORCH_SIDE.is_file():
        return None, f"{TORCH_SIDE} not found: reference figures only"
    spec = importlib.util.spec_from_file_location("_minibert_torch_side", TORCH_SIDE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, ""


PEAK_RSS_SCRIPT = """
import resource, sys
import numpy as np
from minibert_reference.train.threads import keep_freed_memory, use_threads
import minibert_reference
from minibert_reference.config import PRESETS
from minibert_reference.ops import IGNORE_INDEX
config = PRESETS[sys.argv[1]]()
B, T, steps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
loss_and_grads = (minibert_reference.loss_and_grads if sys.argv[6] == "full"
                  else minibert_reference.masked_lm_loss_and_grads)
rng = np.random.default_rng(0)
params = minibert_reference.init_params(config, seed=0, dtype=np.float32)
state = minibert_reference.adam_init(params)
ids = rng.integers(5, config.vocab_size, size=(B, T))
labels = np.where(rng.random((B, T)) < 0.15, ids, IGNORE_INDEX)
labels[:, 0] = ids[:, 0]
keep_freed_memory()
spare = None  # the trainer's double buffering: the update goes into the step-before's arrays
with use_threads(int(sys.argv[5])):
    for _ in range(steps):
        _, grads, _ = loss_and_grads(params, config, ids, labels=labels)
        new = minibert_reference.adam_step(params, grads, state, lr=1e-4,
                                  **({"out": spare} if spare else {}))
        spare, (params, state) = (params, state), new
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork + exec, so it would report the
# parent's (torch-sized) footprint; the high-water mark of this address space starts at exec
try:
    hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
    print(int(hwm.split()[1]) / 1024)
except (OSError, IndexError):
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def child_lines(argv: list[str], what: str = "", cwd=None) -> list[str]:
    """The lines a fresh interpreter run with ``argv`` prints; a child that fails raises a
    ValueError carrying its last error line (never a silent figure); ``what``: which child."""
    out = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"benchmark child process{what} failed (exit {out.returncode}): {last}")
    return out.stdout.strip().splitlines()


def _run_script(script: str, *args) -> str:
    """The last line a fresh interpreter running ``script`` with ``args`` prints."""
    return child_lines(["-c", script, *map(str, args)], cwd=ROOT)[-1]


def peak_rss_mib(preset: str, B: int, T: int, *, threads: int = 1, head: str = "masked",
                 steps: int = 3) -> float:
    """Peak resident memory (MiB) of a fresh process that runs reference training steps (the
    full MLM head or the trainer's masked head, Adam double-buffered as the trainer runs it)
    with ``threads`` workers and nothing else: no torch in the address space."""
    return float(_run_script(PEAK_RSS_SCRIPT, preset, B, T, steps, threads, head))


# ---------------------------------------------------------------- training under load
# ``minibert train``'s step (minibert_reference.train.loop.train_step: sample, mask, sparse-head MLM
# loss, clipping, AdamW) on synthetic ids, in a fresh process under the CLI's thread and memory
# policy; prints {"threads": n, "steps_per_s": r}.
TRAIN_RATE_SCRIPT = """
import json, sys, time
import numpy as np
from minibert_reference.train.threads import choose, keep_freed_memory, use_threads
import minibert_reference
from minibert_reference.config import PRESETS
from minibert_reference.train.loop import TrainConfig, init_state, train_step
config = PRESETS[sys.argv[1]]()
n, steps = choose(sys.argv[2]), int(sys.argv[3])
ids = np.random.default_rng(0).integers(5, config.vocab_size, size=(512, config.max_len))
mask = np.ones_like(ids)
tcfg = TrainConfig(steps=steps + 100, warmup_steps=10)
keep_freed_memory()
with use_threads(n):
    state = init_state(minibert_reference, config, tcfg)
    for _ in range(3):
        train_step(minibert_reference, state, config, tcfg, ids, mask)
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(minibert_reference, state, config, tcfg, ids, mask)
    rate = steps / (time.perf_counter() - t0)
print(json.dumps({"threads": n, "steps_per_s": rate}))
"""

# Another 2-thread job: an OpenBLAS sgemm loop with 2 threads (they spin-wait between calls,
# the worst neighbour for a 2-core machine), until it is killed.
LOAD_SCRIPT = """
import numpy as np
from threadpoolctl import threadpool_limits
a = np.random.default_rng(0).standard_normal((512, 512), dtype=np.float32)
with threadpool_limits(limits=2, user_api="blas"):
    while True:
        a = a @ a
        a /= np.abs(a).max()
"""


@dataclass
class TrainRate:
    """``minibert train`` steps/s at the default thread count and at 1 thread, idle and while
    another 2-thread job runs; each the median of ``rounds`` fresh processes, alternating."""

    default_threads: int
    idle: dict  # "default" / "one" -> steps/s
    loaded: dict

    @property
    def loaded_ratio(self) -> float:
        return self.loaded["default"] / self.loaded["one"]


def train_rate(preset: str, *, steps: int = 20, rounds: int = 2) -> TrainRate:
    """Measure TrainRate: children alternate default / 1 thread, first idle, then with the
    LOAD_SCRIPT job running beside them (killed at the end, whatever happens)."""
    def measure() -> tuple[int, dict]:
        got: dict[str, list[float]] = {"default": [], "one": []}
        n = 0
        for _ in range(rounds):
            for key, threads in (("default", "auto"), ("one", "1")):
                res = json.loads(_run_script(TRAIN_RATE_SCRIPT, preset, threads, steps))
                got[key].append(res["steps_per_s"])
                n = res["threads"] if key == "default" else n
        return n, {k: float(np.median(v)) for k, v in got.items()}

    n, idle = measure()
    load = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # the job is running before the first timed step
        if load.poll() is not None:
            raise ValueError(f"the 2-thread load job exited at once (status {load.returncode})")
        _, loaded = measure()
    finally:
        load.kill()
        load.wait()
    return TrainRate(n, idle, loaded)
