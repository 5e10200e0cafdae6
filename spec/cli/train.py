"""``minibert train``: masked-language-model training of the Mini-BERT preset on the default
corpus (or your text files), or the NumPy-Transformer document's reconstruction experiment
(``--preset seed001``).

Writes into ``--run-dir``: corpus.txt, tokenizer.json, checkpoint.safetensors, history.json,
loss_curve.png, attention.png.  ``--resume`` continues from the checkpoint exactly where it
stopped (same batches, same schedule) up to the step count it was started with.
"""

from __future__ import annotations

import os
import sys
import time

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT_SENTENCE = "the function returns a new list of the values in the given order ."


def register(sub) -> None:
    from reference.train.loop import TrainConfig

    d = TrainConfig()
    t = sub.add_parser("train", help="train Mini-BERT (MLM) or seed001 (MSE reconstruction)",
                       description=__doc__)
    t.add_argument("--preset", choices=["mini_bert", "seed001"], default="mini_bert")
    t.add_argument("--run-dir", default="runs/minibert")
    t.add_argument("--files", nargs="+", help="train on these UTF-8 text files instead of the "
                                              "built-in corpus (pydoc topics + stdlib docstrings)")
    t.add_argument("--resume", action="store_true", help="continue from run-dir's checkpoint")
    t.add_argument("--steps", type=int, default=d.steps)
    t.add_argument("--batch-size", "-B", type=int, default=d.batch_size)
    t.add_argument("--accum-steps", type=int, default=d.accum_steps)
    t.add_argument("--lr", type=float, default=d.peak_lr, help="peak learning rate")
    t.add_argument("--warmup", type=int, default=d.warmup_steps)
    t.add_argument("--weight-decay", type=float, default=d.weight_decay)
    t.add_argument("--clip", type=float, default=d.max_grad_norm, help="global-norm clip (0: off)")
    t.add_argument("--eval-every", type=int, default=d.eval_every)
    t.add_argument("--eval-rows", type=int, default=d.eval_rows)
    t.add_argument("--ckpt-every", type=int, default=d.ckpt_every)
    t.add_argument("--seed", type=int, default=d.seed)
    t.add_argument("--dtype", choices=["float32", "float64"], default=d.dtype)
    t.add_argument("--max-minutes", type=float, help="stop (and checkpoint) after this long")
    t.add_argument("--threads", type=int, help="BLAS threads (re-executes with the env set)")
    t.add_argument("--sentence", default=DEFAULT_SENTENCE, help="sentence for attention.png")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--epochs", type=int, default=500, help="seed001: epochs")
    t.add_argument("--embed-std", type=float, default=1.0,
                   help="seed001: std of the frozen token embeddings (the document gives none)")
    t.set_defaults(func=run)


def _set_threads(n: int | None) -> None:
    """BLAS reads its thread count at load time: re-execute with the variables set."""
    if n is None or all(os.environ.get(v) == str(n) for v in THREAD_VARS):
        return
    env = {**os.environ, **{v: str(n) for v in THREAD_VARS}}
    os.execve(sys.executable, [sys.executable, "-m", "spec.cli", *sys.argv[1:]], env)


def run(args) -> int:
    _set_threads(args.threads)
    if args.preset == "seed001":
        return run_seed001(args)
    return run_mlm(args)


def run_seed001(args) -> int:
    import json

    from reference.train.loop import seed001_experiment

    t0 = time.perf_counter()
    res = seed001_experiment(epochs=args.epochs, seed=args.seed, embed_std=args.embed_std,
                             log=print)
    os.makedirs(args.run_dir, exist_ok=True)
    with open(os.path.join(args.run_dir, "seed001.json"), "w") as fh:
        json.dump(res, fh)
    print(f"seed001 reconstruction after {args.epochs} epochs ({time.perf_counter() - t0:.0f} s):"
          f" MSE {res['final_mse']:.5f} (start {res['initial_mse']:.4f}); predict-zeros "
          f"baseline {res['zeros_baseline']:.4f}; positional-encoding-only baseline "
          f"{res['pe_only_baseline']:.4f}; the document claims {res['claimed']}")
    print(f"settings (undefined in the document, chosen here): {res['settings']}")
    return 0


def run_mlm(args) -> int:
    import numpy as np

    import reference
    from reference.config import mini_bert
    from reference.train import data as D
    from reference.train import plots
    from reference.train.loop import (
        TrainConfig,
        heldout_set,
        load_state,
        prepare_corpus_data,
        save_history,
        train,
    )

    t_start = time.perf_counter()
    os.makedirs(args.run_dir, exist_ok=True)
    ckpt = os.path.join(args.run_dir, "checkpoint.safetensors")
    state = None
    if args.resume:
        state, config, tcfg, _ = load_state(ckpt)
        print(f"resuming from {ckpt} at step {state.step} of {tcfg.steps}")
    else:
        config = mini_bert()
        tcfg = TrainConfig(steps=args.steps, batch_size=args.batch_size,
                           accum_steps=args.accum_steps, peak_lr=args.lr,
                           warmup_steps=args.warmup, weight_decay=args.weight_decay,
                           max_grad_norm=args.clip, eval_every=args.eval_every,
                           eval_rows=args.eval_rows, ckpt_every=args.ckpt_every, seed=args.seed,
                           dtype=args.dtype)
    tok, (tr_ids, tr_mask), (he_ids, he_mask) = prepare_corpus_data(
        args.run_dir, files=args.files, seq_len=config.max_len, vocab_size=config.vocab_size)
    held = heldout_set(he_ids, he_mask, rows=tcfg.eval_rows, seed=tcfg.seed,
                       vocab_size=config.vocab_size, mask_prob=tcfg.mask_prob)
    log_p = D.unigram_log_probs(tr_ids, tr_mask, config.vocab_size)
    baseline = D.unigram_baseline(log_p, held["labels"])
    n_masked = int((held["labels"] != D.IGNORE_INDEX).sum())
    print(f"data: {tr_ids.shape[0]} training rows, {int(tr_mask.sum())} tokens; held-out "
          f"{held['input_ids'].shape[0]} rows, {n_masked} masked positions; vocabulary "
          f"{tok.get_vocab_size()} (tokenizer {args.run_dir}/tokenizer.json)")
    print(f"unigram-frequency baseline on the held-out masked tokens: {baseline:.4f} nats "
          f"(uniform over V: {np.log(config.vocab_size - D.N_SPECIAL):.4f})")
    if state is not None:
        state.history["baseline"] = baseline
    else:
        from reference.train.loop import init_state

        state = init_state(reference, config, tcfg)
        state.history["baseline"] = baseline
    state = train(reference, config, tcfg, (tr_ids, tr_mask), held, state=state,
                  checkpoint_path=ckpt, tokenizer_json=D.tokenizer_to_json(tok),
                  progress=not args.no_progress,
                  max_seconds=None if args.max_minutes is None else 60 * args.max_minutes)
    h = state.history
    save_history(os.path.join(args.run_dir, "history.json"), h)
    plots.plot_loss_curve(os.path.join(args.run_dir, "loss_curve.png"), h, baseline=baseline)
    ids = [D.CLS_ID, *D.encode_text(tok, args.sentence)[:config.max_len - 2], D.SEP_ID]
    maps = plots.attention_maps(reference, state.params, config, np.array([ids]))
    plots.plot_attention(os.path.join(args.run_dir, "attention.png"), maps,
                         [tok.id_to_token(i) for i in ids],
                         title=f"attention for {args.sentence!r} at step {state.step} "
                               f"(row: query, column: key)")
    elapsed = time.perf_counter() - t_start
    if h["eval_loss"]:
        best = min(h["eval_loss"])
        print(f"held-out MLM loss: {h['eval_loss'][0]:.4f} (step {h['eval_step'][0]}) -> "
              f"{h['eval_loss'][-1]:.4f} (step {h['eval_step'][-1]}), best {best:.4f}; unigram "
              f"baseline {baseline:.4f} -> {'below' if h['eval_loss'][-1] < baseline else 'above'}"
              f" the baseline")
    print(f"step {state.step}/{tcfg.steps} in {elapsed / 60:.1f} min (this session); wrote "
          f"{ckpt}, loss_curve.png, attention.png, history.json in {args.run_dir}")
    return 0
