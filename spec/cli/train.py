"""``minibert train``: masked-language-model training of the Mini-BERT preset on the default
corpus (or your text files), or the NumPy-Transformer document's reconstruction experiment
(``--preset seed001``).

Writes into ``--run-dir`` (each file atomically): corpus.txt, tokenizer.json,
checkpoint.safetensors, history.json, loss_curve.png, attention.png.  ``--resume`` continues
from the checkpoint exactly where it stopped (same batches, same schedule, the run's own corpus
and tokenizer) up to the step count it was started with; Ctrl-C or SIGTERM checkpoint the
state at the last finished step.  A run-dir that holds a run needs --resume or --force.
"""

from __future__ import annotations

import os
import sys
import time

DEFAULT_SENTENCE = "the function returns a new list of the values in the given order ."


# flag -> TrainConfig field: given on the command line they configure a new run; on --resume
# the checkpoint's values rule, and any flag given that differs is reported as ignored.
HPARAMS = {"steps": "steps", "batch_size": "batch_size", "accum_steps": "accum_steps",
           "lr": "peak_lr", "warmup": "warmup_steps", "weight_decay": "weight_decay",
           "clip": "max_grad_norm", "eval_every": "eval_every", "eval_rows": "eval_rows",
           "ckpt_every": "ckpt_every", "seed": "seed", "dtype": "dtype"}
HELP = {"steps": "optimizer steps", "batch_size": "rows per micro-batch",
        "accum_steps": "micro-batches per optimizer step", "lr": "peak learning rate",
        "warmup": "warmup steps (must be < --steps)", "weight_decay": "AdamW weight decay",
        "clip": "global-norm clip (0: off)", "eval_every": "steps between held-out evaluations",
        "eval_rows": "held-out rows per evaluation",
        "ckpt_every": "steps between checkpoints (SIGINT/SIGTERM also checkpoint)",
        "seed": "seed of the initialisation and the batches", "dtype": "parameter dtype"}
TYPES = {"lr": float, "weight_decay": float, "clip": float, "dtype": str}


def register(sub) -> None:
    from minibert_reference.train.loop import TrainConfig

    d = TrainConfig()
    t = sub.add_parser("train", help="train Mini-BERT (MLM) or seed001 (MSE reconstruction)",
                       description=__doc__)
    t.add_argument("--preset", choices=["mini_bert", "seed001"], default="mini_bert",
                   help="what to train (default: %(default)s)")
    t.add_argument("--run-dir", default=None,
                   help="output folder (default: runs/minibert, or runs/seed001 for "
                        "--preset seed001)")
    t.add_argument("--files", nargs="+", help="train on these UTF-8 text files instead of the "
                                              "built-in corpus (pydoc topics + stdlib docstrings)")
    mode = t.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true",
                      help="continue from run-dir's checkpoint with its own settings, corpus "
                           "and tokenizer")
    mode.add_argument("--force", action="store_true",
                      help="start a new run in a run-dir that already holds one (its files "
                           "are replaced)")
    for flag, field in HPARAMS.items():
        opts = {"choices": ["float32", "float64"]} if flag == "dtype" else {}
        names = [f"--{flag.replace('_', '-')}"] + (["-B"] if flag == "batch_size" else [])
        t.add_argument(*names, dest=flag, type=TYPES.get(flag, int), default=None,
                       help=f"{HELP[flag]} (default: {getattr(d, field)})", **opts)
    t.add_argument("--tokenizer", help="use this tokenizer.json instead of training one (two "
                                       "fresh runs with one seed and one tokenizer are "
                                       "identical)")
    t.add_argument("--max-minutes", type=float, help="stop (and checkpoint) after this long "
                                                     "(default: no limit)")
    t.add_argument("--threads", default=None,
                   help="workers: a number, or 'auto' = the cores this process may use.  Each "
                        "worker runs a shard of the batch (and a share of the optimizer's "
                        "tensors) with single-threaded BLAS; idle workers block instead of "
                        "spinning, so a busy machine slows them down but never stalls them.  "
                        "Runs with one seed are bit-identical at one count; --resume keeps the "
                        "count the checkpoint recorded (default: auto)")
    t.add_argument("--sentence", default=DEFAULT_SENTENCE,
                   help="sentence for attention.png (default: %(default)r)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--epochs", type=int, default=500, help="seed001: epochs (default: 500)")
    t.add_argument("--embed-std", type=float, default=1.0,
                   help="seed001: std of the frozen token embeddings (the document gives none; "
                        "default: 1.0)")
    t.set_defaults(func=run)


RUN_FILES = ("corpus.txt", "tokenizer.json", "checkpoint.safetensors", "history.json",
             "loss_curve.png", "attention.png", "seed001.json")


def train_config_from_args(args):
    """The TrainConfig of a new run: defaults overridden by the flags given.  Raises the
    config's ValueError (named field) before anything is written."""
    from dataclasses import replace

    from minibert_reference.train.loop import TrainConfig

    given = {HPARAMS[f]: getattr(args, f) for f in HPARAMS if getattr(args, f) is not None}
    if "warmup_steps" not in given and "steps" in given:
        # the default warmup (200) cannot exceed a short run: shrink it rather than fail
        given["warmup_steps"] = min(TrainConfig().warmup_steps, given["steps"] // 10)
    try:
        return replace(TrainConfig(), **given)
    except ValueError as e:
        flag = next((f for f, field in HPARAMS.items() if str(e).startswith(field + ":")), None)
        hint = f" (flag --{flag.replace('_', '-')})" if flag else ""
        raise ValueError(f"{e}{hint}") from None


def ignored_on_resume(args, tcfg) -> list[str]:
    """The flags given on --resume that differ from the run's recorded settings."""
    out = []
    for flag, field in HPARAMS.items():
        v = getattr(args, flag)
        if v is not None and v != getattr(tcfg, field):
            out.append(f"--{flag.replace('_', '-')} {v} (the run uses {getattr(tcfg, field)})")
    if args.files:
        out.append("--files (the run keeps its corpus.txt)")
    if args.tokenizer:
        out.append("--tokenizer (the run keeps the checkpoint's tokenizer)")
    return out


def check_run_dir(run_dir: str, *, resume: bool, force: bool) -> None:
    """A new run never silently overwrites an old one; a resume needs a checkpoint.  Each
    message names the flag that goes somewhere: a run stopped before its first checkpoint
    (killed during setup) has nothing to --resume, so both point to --force."""
    ckpt = os.path.join(run_dir, "checkpoint.safetensors")
    present = [f for f in RUN_FILES if os.path.exists(os.path.join(run_dir, f))]
    if resume:
        if os.path.isfile(ckpt):
            return
        if present:
            raise ValueError(f"run-dir: --resume expected {ckpt}, which does not exist: the "
                             f"run stopped before its first checkpoint ({', '.join(present)} "
                             f"only); pass --force instead of --resume to start it over")
        raise ValueError(f"run-dir: --resume expected {ckpt}, which does not exist; drop "
                         f"--resume to start a new run")
    if present and not force:
        if not os.path.isfile(ckpt):
            raise ValueError(f"run-dir: {run_dir!r} holds a run that stopped before its first "
                             f"checkpoint ({', '.join(present)}); pass --force to start it "
                             f"over (there is nothing to --resume)")
        raise ValueError(f"run-dir: {run_dir!r} already holds a run ({', '.join(present)}); "
                         f"pass --resume to continue it or --force to replace it")


def remove_stale_temporaries(run_dir: str) -> None:
    """The temporary files of saves a kill -9 interrupted (only under the run lock: no other
    live process can be writing them)."""
    from minibert_reference.train.fileio import stale_temporaries

    stale = stale_temporaries(run_dir, RUN_FILES)
    for p in stale:
        os.remove(p)
    if stale:
        print(f"removed {len(stale)} temporary file(s) of an interrupted save: "
              f"{', '.join(os.path.basename(p) for p in stale)}")


def _threads_for(args) -> int:
    """--threads if given (a number, or 'auto' = the available cores); else, resuming, the count
    the checkpoint recorded (bit-exact resume); else auto."""
    from minibert_reference.train.checkpoint import recorded_threads
    from minibert_reference.train.threads import available_cores, choose

    recorded = None
    if getattr(args, "resume", False) and args.preset != "seed001":
        recorded = recorded_threads(os.path.join(args.run_dir, "checkpoint.safetensors"))
    if args.threads is not None:
        n, cores = choose(args.threads), available_cores()
        # more workers than cores only slows a run down (or exhausts the machine: 100000
        # threads); the one exception, the count a checkpoint recorded (a bit-exact resume)
        if n > cores and not (recorded is not None and n == recorded["workers"]):
            raise ValueError(f"--threads: expected 'auto' or an integer in [1, {cores}] (the "
                             f"cores this process may use), got {args.threads!r}")
        return n
    if recorded is not None:
        return recorded["workers"]
    return choose("auto")


def run(args) -> int:
    if args.run_dir is None:
        args.run_dir = os.path.join("runs", "seed001" if args.preset == "seed001" else "minibert")
    from minibert_reference.train.threads import use_threads

    n = _threads_for(args)
    print(f"threads: {n} worker(s), single-threaded BLAS each"
          + (" (auto: the available cores)" if args.threads in (None, "auto") else ""))
    with use_threads(n):
        if args.preset == "seed001":
            return run_seed001(args)
        return run_mlm(args)


def run_seed001(args) -> int:
    from minibert_reference.train.fileio import atomic_write_json
    from minibert_reference.train.loop import seed001_experiment

    if args.epochs < 0 or not args.embed_std > 0:
        raise ValueError(f"--epochs, --embed-std: expected >= 0 and > 0, got {args.epochs}, "
                         f"{args.embed_std}")
    t0 = time.perf_counter()
    res = seed001_experiment(epochs=args.epochs, seed=args.seed or 0, embed_std=args.embed_std,
                             log=None if not args.no_progress else print,
                             progress=not args.no_progress)
    os.makedirs(args.run_dir, exist_ok=True)
    atomic_write_json(os.path.join(args.run_dir, "seed001.json"), res)
    print(f"seed001 reconstruction after {args.epochs} epochs ({time.perf_counter() - t0:.0f} s):"
          f" MSE {res['final_mse']:.5f} (start {res['initial_mse']:.4f}); predict-zeros "
          f"baseline {res['zeros_baseline']:.4f}; positional-encoding-only baseline "
          f"{res['pe_only_baseline']:.4f}; the document claims {res['claimed']}")
    print(f"settings (undefined in the document, chosen here): {res['settings']}")
    return 0


def run_mlm(args) -> int:
    from minibert_reference.train.fileio import RunLock, read_user_text

    ckpt = os.path.join(args.run_dir, "checkpoint.safetensors")
    # every check that can fail on the user's input runs before the first file is written
    tcfg = None if args.resume else train_config_from_args(args)
    tok_json = None
    if args.tokenizer and not args.resume:
        from minibert_reference.train import data as D

        tok_json = read_user_text(args.tokenizer, "a tokenizers JSON file (--tokenizer)") \
            if os.path.isfile(args.tokenizer) else None
        if tok_json is None:
            raise ValueError(f"--tokenizer: expected an existing tokenizer.json, got "
                             f"{args.tokenizer!r}")
        D.tokenizer_from_json(tok_json, name="--tokenizer")
    check_run_dir(args.run_dir, resume=args.resume, force=args.force)
    os.makedirs(args.run_dir, exist_ok=True)
    with RunLock(args.run_dir):
        remove_stale_temporaries(args.run_dir)
        for old in (os.path.join(args.run_dir, f) for f in RUN_FILES if args.force):
            if os.path.exists(old):
                os.remove(old)
        return _train_mlm(args, ckpt, tcfg, tok_json)


def _train_mlm(args, ckpt, tcfg, tok_json) -> int:
    import numpy as np

    import minibert_reference
    from minibert_reference.config import mini_bert
    from minibert_reference.train import data as D
    from minibert_reference.train import loop, plots

    t_start = time.perf_counter()
    state, corpus_sha = None, None
    if args.resume:
        state, config, tcfg, tok_json, meta = loop.load_state(ckpt, with_meta=True)
        corpus_sha = meta.get("corpus_sha256")
        print(f"resuming from {ckpt} at step {state.step} of {tcfg.steps}")
        for w in meta["warnings"]:
            print(f"warning: {w}")
        for flag in ignored_on_resume(args, tcfg):
            print(f"ignored on --resume: {flag}")
    else:
        config = mini_bert()
    tok, (tr_ids, tr_mask), (he_ids, he_mask), corpus_sha = loop.prepare_corpus_data(
        args.run_dir, files=None if args.resume else args.files, seq_len=config.max_len,
        vocab_size=config.vocab_size, tokenizer_json=tok_json, corpus_sha256=corpus_sha)
    held = loop.heldout_set(he_ids, he_mask, rows=tcfg.eval_rows, seed=tcfg.seed,
                       vocab_size=config.vocab_size, mask_prob=tcfg.mask_prob)
    log_p = D.unigram_log_probs(tr_ids, tr_mask, config.vocab_size)
    baseline = D.unigram_baseline(log_p, held["labels"])
    n_masked = int((held["labels"] != D.IGNORE_INDEX).sum())
    print(f"data: {tr_ids.shape[0]} training rows, {int(tr_mask.sum())} tokens; held-out "
          f"{held['input_ids'].shape[0]} rows, {n_masked} masked positions; vocabulary "
          f"{tok.get_vocab_size()} (tokenizer {args.run_dir}/tokenizer.json)")
    print(f"unigram-frequency baseline on the held-out masked tokens: {baseline:.4f} nats "
          f"(uniform over V: {np.log(config.vocab_size - D.N_SPECIAL):.4f})")
    if state is None:
        state = loop.init_state(minibert_reference, config, tcfg)
    state.history["baseline"] = baseline
    status = "finished"
    try:
        state = loop.train(minibert_reference, config, tcfg, (tr_ids, tr_mask), held,
                           state=state, checkpoint_path=ckpt,
                           tokenizer_json=D.tokenizer_to_json(tok),
                           progress=not args.no_progress, extra={"corpus_sha256": corpus_sha},
                           max_seconds=None if args.max_minutes is None
                           else 60 * args.max_minutes)
    except loop.Interrupted:
        status = "interrupted"
    except loop.NonFiniteStep as e:
        print(f"error: {e}; {ckpt} keeps the last good checkpoint", file=sys.stderr)
        return 3
    h = state.history
    loop.save_history(os.path.join(args.run_dir, "history.json"), h)
    plots.plot_loss_curve(os.path.join(args.run_dir, "loss_curve.png"), h, baseline=baseline)
    ids = [D.CLS_ID, *D.encode_text(tok, args.sentence)[:config.max_len - 2], D.SEP_ID]
    maps = plots.attention_maps(minibert_reference, state.params, config, np.array([ids]))
    plots.plot_attention(os.path.join(args.run_dir, "attention.png"), maps,
                         [tok.id_to_token(i) for i in ids],
                         title=f"attention for {args.sentence!r} at step {state.step} "
                               f"(row: query, column: key)")
    elapsed = time.perf_counter() - t_start
    print(summary(h, baseline, state.step, tcfg.steps))
    print(f"step {state.step}/{tcfg.steps} in {elapsed / 60:.1f} min (this session, {status}); "
          f"wrote {ckpt}, loss_curve.png, attention.png, history.json in {args.run_dir}"
          + ("; continue with --resume" if state.step < tcfg.steps else ""))
    return 130 if status == "interrupted" else 0


def summary(h: dict, baseline: float, step: int, total: int) -> str:
    """One line on the run's losses; the held-out trend only when it has two points, and the
    latest training loss always (an interrupted run has evaluated only at step 0)."""
    parts = []
    if h.get("loss"):
        parts.append(f"training loss {h['loss'][0]:.4f} (step 0) -> {h['loss'][-1]:.4f} "
                     f"(step {h['step'][-1] + 1})")
    ev = h.get("eval_loss") or []
    if len(ev) >= 2:
        side = "below" if ev[-1] < baseline else "above"
        parts.append(f"held-out MLM loss {ev[0]:.4f} (step {h['eval_step'][0]}) -> "
                     f"{ev[-1]:.4f} (step {h['eval_step'][-1]}), best {min(ev):.4f}, {side} "
                     f"the unigram baseline {baseline:.4f}")
    elif ev:
        parts.append(f"held-out MLM loss {ev[0]:.4f} at step {h['eval_step'][0]} only (next "
                     f"evaluation not reached; unigram baseline {baseline:.4f})")
    return "; ".join(parts) if parts else f"no step trained (step {step} of {total})"
