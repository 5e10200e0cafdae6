"""The training loop: masked-language-model training of an encoder, held-out evaluation,
checkpoints with bit-exact ``resume``, and the NumPy-Transformer document's reconstruction
experiment (``seed001_experiment``).

The maths comes from the implementation passed as ``impl`` (default: the ``minibert_reference``
package): ``loss_and_grads``/``loss`` for the model and ``accumulate_gradients``,
``clip_by_global_norm``, ``warmup_linear_lr``, ``adam_step`` for the optimizer.  This module only
orchestrates; data come in as arrays (see ``minibert_reference.train.data``), so tests can train on
synthetic ids without a tokenizer.

One step (0-based ``s``): draw ``accum_steps`` micro-batches of ``batch_size`` rows (uniformly with
replacement, then MLM-masked) from one ``numpy.random.Generator``; loss and gradient of the logical
batch (mean over all its masked tokens; the MLM head evaluated only at the masked positions when the
implementation offers ``masked_lm_loss_and_grads``); clip to ``max_grad_norm``; AdamW with lr
``warmup_linear_lr(s)``. The generator's state, the parameters and the Adam moments are all a step
depends on, and all three are checkpointed exactly.
"""

from __future__ import annotations

import inspect
import math
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from minibert_reference.model import param_shapes
from minibert_reference.train import data as D
from minibert_reference.train.fileio import (
    atomic_write,
    atomic_write_json,
    read_user_text,
    sha256_text,
)
from minibert_reference.validate import non_finite


class NonFiniteStep(FloatingPointError):
    """A step produced a NaN/inf loss, gradient or parameter; the state is the last good one."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; the state was checkpointed at the last step boundary."""


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of a training run (defaults: the 15-minute Mini-BERT run on 2 cores)."""

    steps: int = 4000  # total optimizer steps (the schedule decays to 0 at ``steps``)
    batch_size: int = 8  # rows per micro-batch
    accum_steps: int = 1  # micro-batches per optimizer step
    peak_lr: float = 1e-3  # the derivation's 1e-4 is far too slow for a 15-minute run
    warmup_steps: int = 200
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0  # <= 0 disables clipping
    beta1: float = 0.9
    beta2: float = 0.999
    adam_eps: float = 1e-8
    mask_prob: float = 0.15
    eval_every: int = 250
    eval_rows: int = 256  # held-out rows per evaluation (masked once, the same every time)
    ckpt_every: int = 500
    seed: int = 0
    dtype: str = "float32"
    sparse_head: bool = True  # MLM head only at masked positions (impl.masked_lm_loss_and_grads)

    def __post_init__(self):
        for name in ("steps", "batch_size", "accum_steps", "eval_every", "eval_rows",
                     "ckpt_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps: expected 0 <= warmup_steps < steps={self.steps}, "
                             f"got {self.warmup_steps}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype: expected 'float32' or 'float64', got {self.dtype!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed: expected an integer >= 0, got {self.seed!r}")
        if not isinstance(self.sparse_head, bool):
            raise ValueError(f"sparse_head: expected a bool, got {self.sparse_head!r}")
        # (name, low, high, low inclusive): every float finite, so NaN never disables a check
        for name, low, high, closed in (("peak_lr", 0.0, None, False),
                                        ("weight_decay", 0.0, None, True),
                                        ("max_grad_norm", 0.0, None, True),
                                        ("beta1", 0.0, 1.0, True), ("beta2", 0.0, 1.0, True),
                                        ("adam_eps", 0.0, None, False),
                                        ("mask_prob", 0.0, 1.0 + 1e-12, False)):
            _check_real(name, getattr(self, name), low, high, closed)


def _check_real(name: str, value, low: float, high: float | None, closed: bool) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (value >= low if closed else value > low)
          and (high is None or value < high))
    if not ok:
        rng = f"{'[' if closed else '('}{low}, {'inf' if high is None else high})"
        raise ValueError(f"{name}: expected a finite number in {rng}, got {value!r}")


@dataclass
class TrainState:
    params: dict
    opt_state: dict
    rng: np.random.Generator
    history: dict = field(default_factory=lambda: {
        "step": [], "loss": [], "lr": [], "grad_norm": [], "eval_step": [], "eval_loss": []})
    # the (params, opt_state) of the step before: scratch arrays the next update is written
    # into (double buffering), never part of the state -- not checkpointed, not compared
    spare: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def step(self) -> int:
        return int(self.opt_state["step"])


# --------------------------------------------------------------------------- batches
def sample_batch(ids, attention_mask, rng, *, batch_size: int, vocab_size: int,
                 mask_prob: float = 0.15) -> dict:
    """``batch_size`` rows drawn uniformly with replacement, MLM-masked
    (minibert_reference.train.data)."""
    rows = rng.integers(0, ids.shape[0], size=batch_size)
    x, am = ids[rows], attention_mask[rows]
    corrupted, labels = D.mask_tokens(x, am, rng, vocab_size=vocab_size, mask_prob=mask_prob)
    return {"input_ids": corrupted, "labels": labels, "attention_mask": am}


def _loss_fn(impl, config, sparse_head: bool):
    """What accumulate_gradients calls: the implementation's loss_and_grads, or its sparse-head
    MLM variant (same loss and gradients, ~85% fewer logits) when it has one."""
    if not (sparse_head and config.head == "mlm" and hasattr(impl, "masked_lm_loss_and_grads")):
        return impl

    return impl.masked_lm_loss_and_grads


def train_step(impl, state: TrainState, config, tcfg: TrainConfig, train_ids, train_mask):
    """One optimizer step on ``state``; returns (loss, lr, grad_norm, real tokens).

    Transactional: everything is computed on a copy of the generator and on arrays that are not
    the state's -- new ones, or, when the implementation's ``adam_step`` takes ``out``, the
    arrays of the step before (``state.spare``: double buffering, no fresh 54 MB per Mini-BERT
    step) -- and ``state`` changes only in the last statement, so an exception anywhere in the
    step (a KeyboardInterrupt included) leaves it exactly at the step boundary.  A non-finite
    loss, gradient norm or parameter raises NonFiniteStep and leaves ``state`` untouched."""
    rng = _copy_rng(state.rng)
    micro = [sample_batch(train_ids, train_mask, rng, batch_size=tcfg.batch_size,
                          vocab_size=config.vocab_size, mask_prob=tcfg.mask_prob)
             for _ in range(tcfg.accum_steps)]
    s = state.step
    try:
        loss, grads = impl.accumulate_gradients(_loss_fn(impl, config, tcfg.sparse_head),
                                                state.params, config, micro)
    except ValueError as e:
        # the parameters are finite (checked after every update), so an op refusing a
        # non-finite input here means the forward overflowed: a diverged run, not a bug
        if "finite" not in str(e):
            raise
        raise NonFiniteStep(f"step {s}: the forward pass overflowed ({e}); lower --lr") from e
    # the norm before clipping: one inf gradient would become NaN everywhere once clipped
    norm = impl.global_grad_norm(grads)
    if not (math.isfinite(float(loss)) and math.isfinite(norm)):
        raise NonFiniteStep(f"step {s}: loss {float(loss)}, gradient norm {norm}; stopped "
                            f"before the update (lower --lr, or check the data)")
    if tcfg.max_grad_norm > 0:
        grads, norm = impl.clip_by_global_norm(grads, tcfg.max_grad_norm)
    lr = impl.warmup_linear_lr(s, peak_lr=tcfg.peak_lr,
                               warmup_steps=tcfg.warmup_steps, total_steps=tcfg.steps)
    into = _writes_into(impl)
    kw = {"out": state.spare} if into and state.spare is not None else {}
    params, opt_state = impl.adam_step(
        state.params, grads, state.opt_state, lr=lr, beta1=tcfg.beta1, beta2=tcfg.beta2,
        eps=tcfg.adam_eps, weight_decay=tcfg.weight_decay, **kw)
    bad = non_finite(params)
    if bad:
        raise NonFiniteStep(f"step {s}: the update made {bad[0]} non-finite (diverged; lower "
                            f"--lr)")
    n_tokens = sum(int(np.count_nonzero(mb["attention_mask"])) for mb in micro)
    spare = (state.params, state.opt_state) if into else None
    # the commit
    state.params, state.opt_state, state.rng, state.spare = params, opt_state, rng, spare
    return float(loss), float(lr), float(norm), n_tokens


def _writes_into(impl) -> bool:
    """The implementation's adam_step can write its result into given arrays (``out=``)."""
    try:
        return "out" in inspect.signature(impl.adam_step).parameters
    except (TypeError, ValueError):  # a callable without a signature
        return False


def _copy_rng(rng: np.random.Generator) -> np.random.Generator:
    bitgen = type(rng.bit_generator)()
    bitgen.state = rng.bit_generator.state
    return np.random.Generator(bitgen)


def evaluate(impl, params, config, ids, attention_mask, labels, *, batch_size: int = 32) -> float:
    """Mean cross-entropy over every masked position of the given (already masked) rows."""
    total, count = 0.0, 0
    for lo in range(0, ids.shape[0], batch_size):
        sl = slice(lo, lo + batch_size)
        n = int(np.count_nonzero(labels[sl] != D.IGNORE_INDEX))
        if n == 0:
            continue
        total += float(impl.loss(params, config, ids[sl], labels=labels[sl],
                                 attention_mask=attention_mask[sl], reduction="sum"))
        count += n
    if count == 0:
        raise ValueError("labels: expected at least one masked held-out position, got none")
    return total / count


def heldout_set(ids, attention_mask, *, rows: int, seed: int, vocab_size: int,
                mask_prob: float = 0.15) -> dict:
    """The first ``rows`` held-out rows, masked once with their own generator (seed + 1), so every
    evaluation scores the same positions."""
    ids, am = ids[:rows], attention_mask[:rows]
    corrupted, labels = D.mask_tokens(ids, am, np.random.default_rng(seed + 1),
                                      vocab_size=vocab_size, mask_prob=mask_prob)
    return {"input_ids": corrupted, "attention_mask": am, "labels": labels}


# --------------------------------------------------------------------------- state
def init_state(impl, config, tcfg: TrainConfig) -> TrainState:
    params = impl.init_params(config, seed=tcfg.seed, dtype=np.dtype(tcfg.dtype))
    return TrainState(params, impl.adam_init(params), np.random.default_rng(tcfg.seed))


def save_state(path: str, state: TrainState, config, tcfg: TrainConfig, *,
               tokenizer_json: str | None = None, extra: dict | None = None) -> None:
    from minibert_reference.train.checkpoint import save_checkpoint

    extra = dict(extra or {})
    if tokenizer_json is not None:
        extra["tokenizer_sha256"] = sha256_text(tokenizer_json)
    save_checkpoint(path, state.params, state.opt_state, rng_state=D.rng_state_to_json(state.rng),
                    model_config=config.to_dict(), train_config=asdict(tcfg),
                    tokenizer_json=tokenizer_json, history=state.history, extra=extra)


def load_state(path: str, *, with_meta: bool = False):
    """(TrainState, BertConfig, TrainConfig, tokenizer_json) from a checkpoint; with
    ``with_meta`` also the checkpoint's ``extra`` dict plus its ``warnings``."""
    from minibert_reference.config import BertConfig
    from minibert_reference.train.checkpoint import load_checkpoint

    ck = load_checkpoint(path)
    config = BertConfig.from_dict(ck["model_config"])  # validated against the tensors by the loader
    try:
        tcfg = TrainConfig(**ck["train_config"])
    except TypeError as e:
        raise ValueError(f"checkpoint: expected a valid train_config in {path!r}, got {e}") \
            from None
    order = list(param_shapes(config))  # the model's stable order
    params = {k: ck["params"][k] for k in order}
    opt = {"step": ck["opt_state"]["step"], "m": {k: ck["opt_state"]["m"][k] for k in order},
           "v": {k: ck["opt_state"]["v"][k] for k in order}}
    tok_json = ck["tokenizer_json"]
    recorded = ck["extra"].get("tokenizer_sha256")
    if tok_json is not None and recorded is not None and sha256_text(tok_json) != recorded:
        raise ValueError(f"checkpoint: expected the stored tokenizer to match its recorded "
                         f"hash, got a different one in {path!r} (the file is corrupt)")
    state = TrainState(params, opt, D.rng_from_json(ck["rng_state"]), ck["history"])
    if with_meta:
        return state, config, tcfg, tok_json, {**ck["extra"], "warnings": ck["warnings"]}
    return state, config, tcfg, tok_json


class _DeferSignals:
    """While active, SIGINT and SIGTERM only set a flag that the loop reads at each step
    boundary: the checkpoint is always the state between two steps, so a resume is bit-exact
    whenever the signal came.  A second signal of either kind interrupts at once (the step in
    flight is lost, the state stays at the previous boundary: train_step is transactional).
    Outside the main thread (where handlers cannot be installed) it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        self._old: dict = {}

    def _handler(self, signum, _frame):
        if self.received is not None:
            raise Interrupted(f"second signal {signum}")
        self.received = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


# --------------------------------------------------------------------------- the loop
def train(impl, config, tcfg: TrainConfig, train_data: tuple, heldout: dict | None = None, *,
          state: TrainState | None = None, stop_after: int | None = None,
          checkpoint_path: str | None = None, tokenizer_json: str | None = None,
          progress: bool = False, log=print, max_seconds: float | None = None,
          extra: dict | None = None) -> TrainState:
    """Train from ``state`` (fresh from ``tcfg.seed`` if None) up to ``tcfg.steps`` steps, or
    ``stop_after`` steps in total, or ``max_seconds``; checkpoints every ``ckpt_every`` steps and
    at the end when ``checkpoint_path`` is given.  ``train_data`` = (ids [N, T], mask [N, T]);
    ``heldout`` = heldout_set(...) for periodic evaluation; ``extra`` goes into every checkpoint.

    SIGINT/SIGTERM: the step in flight finishes, the state is checkpointed and ``Interrupted``
    (a KeyboardInterrupt) is raised.  A non-finite step raises ``NonFiniteStep`` and writes
    nothing: the last periodic checkpoint stays."""
    train_ids, train_mask = train_data
    state = state if state is not None else init_state(impl, config, tcfg)
    end = tcfg.steps if stop_after is None else min(stop_after, tcfg.steps)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=tcfg.steps, initial=state.step, unit="step", dynamic_ncols=True)
    if heldout is not None and state.step == 0 and not state.history["eval_step"]:
        ev = evaluate(impl, state.params, config, heldout["input_ids"],
                      heldout["attention_mask"], heldout["labels"])
        state.history["eval_step"].append(0)
        state.history["eval_loss"].append(ev)
        (bar.write if bar else log)(f"step 0: held-out MLM loss {ev:.4f}")
    start = time.perf_counter()
    tokens, t_window = 0, start  # tokens/s averaged over this session
    say = bar.write if bar else log
    save_ok = True  # False once a step diverged: the last checkpoint on disk stays as it is

    def checkpoint():
        if checkpoint_path:
            save_state(checkpoint_path, state, config, tcfg, tokenizer_json=tokenizer_json,
                       extra=extra)

    try:
        with _DeferSignals() as signals:
            while state.step < end:
                if signals.received is not None:
                    raise Interrupted(f"signal {signals.received}")
                s = state.step
                loss, lr, norm, n_tok = train_step(impl, state, config, tcfg, train_ids,
                                                   train_mask)
                h = state.history
                h["step"].append(s)
                h["loss"].append(loss)
                h["lr"].append(lr)
                h["grad_norm"].append(norm)
                tokens += n_tok
                done = state.step
                if heldout is not None and (done % tcfg.eval_every == 0 or done == tcfg.steps):
                    ev = evaluate(impl, state.params, config, heldout["input_ids"],
                                  heldout["attention_mask"], heldout["labels"])
                    h["eval_step"].append(done)
                    h["eval_loss"].append(ev)
                    msg = f"step {done}: train loss {loss:.4f}, held-out MLM loss {ev:.4f}"
                    if "baseline" in h:
                        msg += f" (unigram baseline {h['baseline']:.4f})"
                    say(msg)
                if bar is not None:
                    now = time.perf_counter()
                    bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}",
                                    tok_s=f"{tokens / max(now - t_window, 1e-9):.0f}")
                    bar.update(1)
                if done % tcfg.ckpt_every == 0:
                    checkpoint()
                if max_seconds is not None and time.perf_counter() - start > max_seconds:
                    say(f"time limit reached after step {done}")
                    break
            if signals.received is not None and state.step >= end:
                say(f"signal {signals.received} after the last step")
    except NonFiniteStep as e:
        save_ok = False
        say(f"stopped: {e}; the checkpoint on disk (if any) is the last good one")
        raise
    except KeyboardInterrupt:  # Interrupted included
        say(f"interrupted after step {state.step}; checkpointing the state at that step")
        raise Interrupted(f"interrupted after step {state.step}") from None
    finally:
        if bar is not None:
            bar.close()
        if save_ok:
            checkpoint()
    return state
# --------------------------------------------------------------------------- corpus -> arrays
def load_or_build_corpus(run_dir: str, files=None, *, expected_sha256: str | None = None,
                         log=print) -> tuple[list[str], str]:
    """(paragraphs, SHA-256 of corpus.txt).  corpus.txt is the run's copy of its text: built
    from ``files`` (or the default corpus) and written atomically when absent; when present it
    must hash to ``expected_sha256`` (a resume) and, when ``files`` are given, hold exactly
    their paragraphs (so --files is never silently ignored)."""
    from minibert_reference.train import corpus

    cpath = os.path.join(run_dir, "corpus.txt")
    if os.path.exists(cpath):
        text = read_user_text(cpath, "the run's corpus", max_bytes=None, empty_ok=True)
        digest = sha256_text(text)
        if expected_sha256 is not None and digest != expected_sha256:
            raise ValueError(f"corpus.txt: expected the corpus the checkpoint was trained on "
                             f"(sha256 {expected_sha256[:12]}...), got {digest[:12]}... in "
                             f"{cpath!r}; restore it or start over with --force")
        paras = [line for line in text.split("\n") if line.strip()]
        if files and paras != corpus.read_corpus(files):
            raise ValueError(f"files: {list(files)} differ from the corpus already in "
                             f"{run_dir!r}; pass --force to start a new run on them")
        if not paras:
            raise ValueError(f"corpus.txt: expected prose paragraphs, got an empty {cpath!r}")
        return paras, digest
    if expected_sha256 is not None:
        raise ValueError(f"corpus.txt: expected the run's corpus in {run_dir!r}, got none; "
                         f"restore it or start over with --force")
    t0 = time.perf_counter()
    paras = corpus.read_corpus(files) if files else corpus.default_corpus()
    text = "\n".join(paras) + "\n"
    atomic_write(cpath, text)
    log(f"corpus: {len(paras)} paragraphs, {sum(map(len, paras))} characters "
        f"({'files' if files else 'pydoc topics + stdlib docstrings'}; "
        f"{time.perf_counter() - t0:.1f} s)")
    return paras, sha256_text(text)


def prepare_corpus_data(run_dir: str, *, files=None, seq_len: int, vocab_size: int,
                        heldout_fraction: float = 0.05, log=print,
                        tokenizer_json: str | None = None, corpus_sha256: str | None = None):
    """Paragraphs (run_dir/corpus.txt), tokenizer, and the packed train / held-out arrays.
    Returns (tok, (train_ids, train_mask), (held_ids, held_mask), corpus_sha256).

    ``tokenizer_json`` (a resume: the checkpoint's copy) is used as is and rewritten to
    tokenizer.json when that file is missing or differs; otherwise tokenizer.json is loaded,
    or trained and written.  ``corpus_sha256`` (a resume) must match corpus.txt."""
    os.makedirs(run_dir, exist_ok=True)
    paras, digest = load_or_build_corpus(run_dir, files, expected_sha256=corpus_sha256, log=log)
    train_p, held_p = _split(paras, heldout_fraction)
    tpath = os.path.join(run_dir, "tokenizer.json")
    if tokenizer_json is not None:
        tok = D.tokenizer_from_json(tokenizer_json, name="checkpoint tokenizer")
        on_disk = (read_user_text(tpath, "the run's tokenizer", empty_ok=True)
                   if os.path.exists(tpath) else None)
        if on_disk != tokenizer_json:
            what = "differs from" if on_disk is not None else "is missing; restored from"
            log(f"tokenizer: {tpath} {what} the checkpoint's copy, which this run uses")
            atomic_write(tpath, tokenizer_json)
    else:
        tok = D.load_or_train_tokenizer(tpath, train_p, vocab_size)
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"tokenizer: expected a vocabulary of at most vocab_size={vocab_size}, "
                         f"got {tok.get_vocab_size()}")
    tr = D.tokenize_paragraphs(tok, train_p, seq_len)
    he = D.tokenize_paragraphs(tok, held_p, seq_len)
    return tok, tr, he, digest


def _split(paras, fraction):
    from minibert_reference.train import corpus

    return corpus.split(paras, fraction)


# --------------------------------------------------------------------------- seed 001
def seed001_experiment(impl=None, *, epochs: int = 500, n_seqs: int = 64, seq_len: int = 16,
                       batch_size: int = 16, lr: float = 1e-3, embed_std: float = 1.0,
                       seed: int = 0, dtype=np.float64, log=None,
                       progress: bool = False) -> dict:
    """The NumPy-Transformer document's reconstruction experiment, as far as it is defined.

    Defined by the document: 2 post-LN layers, d=64, 4 heads, d_ff=256, sinusoidal positions,
    biased projections, MSE between the output and the input X = Embedding(tokens) + PE, Adam,
    500 epochs, a claimed final MSE of 0.0043.  Not defined, so chosen here: the data (``n_seqs``
    sequences of ``seq_len`` ids uniform over V=1000), the embedding table (N(0, embed_std^2),
    frozen: it defines the targets, which are held constant), lr (constant), batch size and order
    (a fixed permutation per epoch from ``seed``).  Only the encoder blocks are trained.

    Returns the final MSE over the whole data set, the baselines (predict zeros; predict the
    positional encoding alone) and the claim.
    """
    import minibert_reference
    from minibert_reference.config import seed001

    impl = impl or minibert_reference
    config = seed001(max_len=seq_len)
    rng = np.random.default_rng(seed)
    params = impl.init_params(config, seed=seed, dtype=dtype)
    params["embeddings.token.W"] = rng.normal(0, embed_std, params["embeddings.token.W"].shape
                                              ).astype(dtype)
    ids = rng.integers(0, config.vocab_size, size=(n_seqs, seq_len))
    targets = impl.embed(params, config, ids)  # X [N, T, d], constant from here on
    trainable = [k for k in params if not k.startswith("embeddings.")]
    opt = impl.adam_init({k: params[k] for k in trainable})

    def full_mse(p):
        return float(impl.loss(p, config, ids, targets=targets))

    curve = [full_mse(params)]
    epochs_iter = range(epochs)
    if progress:  # a total and an ETA: the default 500 epochs take minutes
        from tqdm import tqdm

        epochs_iter = tqdm(epochs_iter, total=epochs, unit="epoch", dynamic_ncols=True)
    for _epoch in epochs_iter:
        order = rng.permutation(n_seqs)
        for lo in range(0, n_seqs, batch_size):
            rows = order[lo:lo + batch_size]
            _, grads, _ = impl.loss_and_grads(params, config, ids[rows], targets=targets[rows])
            sub = {k: params[k] for k in trainable}
            new, opt = impl.adam_step(sub, {k: grads[k] for k in trainable}, opt, lr=lr)
            params.update(new)
        curve.append(full_mse(params))
        if log and (_epoch + 1) % 50 == 0:
            log(f"epoch {_epoch + 1}: MSE {curve[-1]:.6f}")
    pe = impl.sinusoidal_encoding(seq_len, config.hidden, np.float64)
    return {
        "final_mse": curve[-1],
        "initial_mse": curve[0],
        "curve": curve,
        "zeros_baseline": float(np.mean(targets.astype(np.float64) ** 2)),
        "pe_only_baseline": float(np.mean((targets - pe) ** 2)),
        "claimed": 0.0043,
        "settings": {"epochs": epochs, "n_seqs": n_seqs, "seq_len": seq_len,
                     "batch_size": batch_size, "lr": lr, "embed_std": embed_std, "seed": seed,
                     "dtype": np.dtype(dtype).name},
    }


def save_history(path: str, history: dict) -> None:
    atomic_write_json(path, history)
