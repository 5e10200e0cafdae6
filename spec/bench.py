"""Benchmark machinery for ``minibert bench``: the reference and PyTorch eager on the same model
and batch, in one process, alternating call by call (the machine is noisy: both sides see the same
load), with medians, p10/p90 and ratios; FLOP counts from the claims ledger's closed forms; the
FLOP floor measured by an sgemm of the same work in the same run; peak RSS; the BLAS library and
the thread count actually used (threadpoolctl).

NumPy + threadpoolctl here; the torch side is ``tests/benchmarks/torch_side.py`` (``spec`` never
imports torch itself), loaded by path when torch is installed.  The claims ledger's timing
claims (the visual guide's) are measured here too, with the same timer (``claim_timings``).
"""

from __future__ import annotations

import importlib.util
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from spec.protocol import IGNORE_INDEX

ROOT = Path(__file__).resolve().parents[1]
TORCH_SIDE = ROOT / "tests" / "benchmarks" / "torch_side.py"


@dataclass
class Stats:
    median_ms: float
    p10_ms: float
    p90_ms: float
    n: int

    @classmethod
    def of(cls, seconds: list[float]) -> Stats:
        ms = np.asarray(seconds) * 1e3
        return cls(float(np.median(ms)), float(np.percentile(ms, 10)),
                   float(np.percentile(ms, 90)), len(ms))


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

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value <= self.bound if self.sense == "<=" else self.value >= self.bound


@dataclass
class Report:
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
        return out


def alternate(fns: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 2,
              before: dict[str, Callable[[], object]] | None = None,
              budget_s: float | None = None) -> dict[str, Stats]:
    """Time each of ``fns`` ``repeats`` times, round-robin; ``before[name]`` (untimed) runs right
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
    return {name: Stats.of(t) for name, t in times.items()}


def backward_inputs(impl, params, config, ids, labels, mask=None) -> tuple:
    """(dout, cache) that a timed ``impl.backward`` consumes: the forward's cache and the
    gradient of the mean cross-entropy of its logits (computed untimed, before the call)."""
    out, cache = impl.forward(params, config, ids, mask)
    _, c_loss = impl.cross_entropy_forward(out, labels)
    (dout,) = impl.cross_entropy_backward(1.0, c_loss)
    return dout, cache


# ---------------------------------------------------------------- the claims ledger's timings
# The visual guide's timing claims (spec/claims/guide.py) measure here: ``ctx`` is the ledger's
# spec.claims.Context (the model, its weights and batch; ``smoke`` times a tiny model).
# the audit's whole timing measurement stops repeating after this many seconds (>= 1 repeat)
TIMING_BUDGET_S = 8.0


def claim_timings(ctx) -> dict:
    """Medians (ms) of forward + loss, backward (from the loss's gradient) and
    forward+loss+backward, float32, B=8, T=64, under
    the entry points' thread policy (reference.train.threads: one worker per core),
    with PyTorch eager's medians for the same model and batch measured alternately in the
    same run when torch is installed (keys ``torch_<name>``; ``threads``)."""
    from reference.train.threads import choose, keep_freed_memory, use_threads

    ids, labels = ctx.batch
    impl, params, config = ctx.impl, ctx.params, ctx.config
    if ctx.smoke:
        config = config.replace(vocab_size=64, hidden=16, intermediate=32, max_len=8)
        params = impl.init_params(config, seed=0, dtype=np.float32)
        ids, labels = ids[:2, :8] % 64, np.where(labels[:2, :8] >= 0, ids[:2, :8] % 64,
                                                 IGNORE_INDEX)
    threads = choose("auto")
    keep_freed_memory()
    with use_threads(threads):
        fns, before = _claim_timing_fns(ctx, impl, params, config, ids, labels, threads)
        # round-robin with the bench's timer: both sides see the same load
        stats = alternate(fns, repeats=ctx.repeats, warmup=1, before=before,
                          budget_s=TIMING_BUDGET_S)
    ctx.repeats_done = stats["forward"].n
    out = {k: st.median_ms for k, st in stats.items()}
    out["threads"] = threads
    return out


def _claim_timing_fns(ctx, impl, params, config, ids, labels, threads):
    """name -> callable for the reference (forward, backward, step) and, when torch and
    tests/benchmarks/torch_side.py are available and this is not a smoke run, torch's."""
    state = {}

    def forward():  # the forward and its loss, like torch's side (module.loss included)
        impl.loss(params, config, ids, labels=labels)

    def before_backward():  # untimed: the cache and the loss's gradient
        state["ref"] = backward_inputs(impl, params, config, ids, labels)

    def backward():
        impl.backward(*state["ref"])

    fns = {"forward": forward, "backward": backward,
           "step": lambda: impl.loss_and_grads(params, config, ids, labels=labels)}
    before = {"backward": before_backward}
    if ctx.smoke or config.head != "mlm":
        return fns, before
    module, _ = load_torch_side()
    if module is None:
        return fns, before
    import torch

    torch.set_num_threads(threads)  # torch's own pool, like the BLAS's
    tp, tforward, _ = module.build(params, config)
    t_ids, t_labels = torch.from_numpy(ids), torch.from_numpy(labels)
    t_mask = torch.ones_like(t_ids)

    def t_forward():
        for p in tp.values():
            p.grad = None
        state["torch"] = module.loss(tforward(t_ids, t_mask), t_labels)

    def t_step():
        t_forward()
        state["torch"].backward()

    fns.update(torch_forward=t_forward, torch_backward=lambda: state["torch"].backward(),
               torch_step=t_step)
    before["torch_backward"] = t_forward
    return fns, before


def step_gflop(config, B: int, T: int, predicted: float | None = None) -> dict[str, float]:
    """Matmul GFLOP of a forward, a backward (2x the forward's matmuls) and a train step, from
    the claims ledger's closed forms (spec.claims.closed_forms); ``predicted``: the fraction of
    positions the MLM head runs on (the masked head), None for all."""
    from spec.claims import closed_forms

    f, s = closed_forms()
    subs = {s["L"]: config.n_layers, s["H"]: config.hidden, s["A"]: config.n_heads,
            s["I"]: config.intermediate, s["T"]: T, s["V"]: config.vocab_size}
    body = float((s["L"] * f["layer_macs"]).subs(subs))
    head = float(f["head_macs"].subs(subs)) if config.head == "mlm" else 0.0
    if predicted is not None:
        head *= predicted
    fwd = 2 * B * (body + head) / 1e9
    return {"forward": fwd, "backward": 2 * fwd, "step": 3 * fwd}


def sgemm_gflops(threads: int, *, n: int = 512, k: int = 768, repeats: int = 20) -> float:
    """This machine's float32 matmul rate now (GFLOP/s) at ``threads`` BLAS threads: the best
    of ``repeats`` timings of the thread probe's [n, k] @ [k, k] products (about the shapes of
    a Mini-BERT step)."""
    from reference.train.threads import MATMULS_PER_ROUND, probe

    best = probe([threads], n=n, k=k, m=k, rounds=repeats, reduce=min)[threads]
    return MATMULS_PER_ROUND * 2 * n * k * k / best / 1e9


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
from reference.train.threads import keep_freed_memory, use_threads
import reference
from reference.config import PRESETS
from reference.ops import IGNORE_INDEX
config = PRESETS[sys.argv[1]]()
B, T, steps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
loss_and_grads = (reference.loss_and_grads if sys.argv[6] == "full"
                  else reference.masked_lm_loss_and_grads)
rng = np.random.default_rng(0)
params = reference.init_params(config, seed=0, dtype=np.float32)
state = reference.adam_init(params)
ids = rng.integers(5, config.vocab_size, size=(B, T))
labels = np.where(rng.random((B, T)) < 0.15, ids, IGNORE_INDEX)
labels[:, 0] = ids[:, 0]
keep_freed_memory()
spare = None  # the trainer's double buffering: the update goes into the step-before's arrays
with use_threads(int(sys.argv[5])):
    for _ in range(steps):
        _, grads, _ = loss_and_grads(params, config, ids, labels=labels)
        new = reference.adam_step(params, grads, state, lr=1e-4,
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


def _run_script(script: str, *args) -> str:
    """The last line a fresh interpreter running ``script`` with ``args`` prints; a child that
    fails raises a ValueError carrying its last error line (never a silent figure)."""
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"benchmark child process failed (exit {out.returncode}): {last}")
    return out.stdout.strip().splitlines()[-1]


def peak_rss_mib(preset: str, B: int, T: int, *, threads: int = 1, head: str = "masked",
                 steps: int = 3) -> float:
    """Peak resident memory (MiB) of a fresh process that runs reference training steps (the
    full MLM head or the trainer's masked head, Adam double-buffered as the trainer runs it)
    with ``threads`` workers and nothing else: no torch in the address space."""
    return float(_run_script(PEAK_RSS_SCRIPT, preset, B, T, steps, threads, head))


def self_peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------- training under load
# ``minibert train``'s step (reference.train.loop.train_step: sample, mask, sparse-head MLM loss,
# clipping, AdamW) on synthetic ids, in a fresh process under the CLI's thread and memory
# policy; prints {"threads": n, "steps_per_s": r}.
TRAIN_RATE_SCRIPT = """
import json, sys, time
import numpy as np
from reference.train.threads import choose, keep_freed_memory, use_threads
import reference
from reference.config import PRESETS
from reference.train.loop import TrainConfig, init_state, train_step
config = PRESETS[sys.argv[1]]()
n, steps = choose(sys.argv[2]), int(sys.argv[3])
ids = np.random.default_rng(0).integers(5, config.vocab_size, size=(512, config.max_len))
mask = np.ones_like(ids)
tcfg = TrainConfig(steps=steps + 100, warmup_steps=10)
keep_freed_memory()
with use_threads(n):
    state = init_state(reference, config, tcfg)
    for _ in range(3):
        train_step(reference, state, config, tcfg, ids, mask)
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(reference, state, config, tcfg, ids, mask)
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
