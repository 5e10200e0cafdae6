"""``minibert gradcheck``: directional finite differences over every parameter tensor and the
input embeddings of the model presets, as a table; exit 1 on any failure."""

from __future__ import annotations

import time


def register(sub) -> None:
    g = sub.add_parser("gradcheck", help="finite-difference check of every parameter tensor and "
                                         "the input embeddings of the model presets")
    g.add_argument("--preset", nargs="+", default=["mini_bert", "seed001"],
                   type=lambda s: s.replace("-", "_"),
                   choices=["mini_bert", "seed001", "bert_tiny"],
                   help="presets (bert-tiny = bert_tiny: the BERT architecture, tied MLM head; "
                        "default: mini_bert seed001)")
    g.add_argument("--batch", "-B", type=int, default=2, help="batch size (default: 2)")
    g.add_argument("--seq", "-T", type=int, default=8, help="sequence length (default: 8)")
    g.add_argument("--seed", type=int, default=0, help="seed of inputs and directions "
                                                       "(default: 0)")
    g.add_argument("--directions", type=int, default=1,
                   help="random directions per tensor (default: 1)")
    g.set_defaults(func=run)


def _gradcheck(model_gradcheck, impl, config, **kw):
    """``model_gradcheck``, but a gradient that is missing, not a parameter, or of the wrong
    shape is a FAIL row naming the tensor instead of a traceback: (results, {tensor: why}).
    The other tensors are still checked (the bad ones stand in as zeros there)."""
    import numpy as np

    from minibert_spec.numerics.finite_differences import CheckResult, random_batch, random_params
    from minibert_spec.tolerances import FD_RTOL

    params = random_params(impl, config, kw["seed"])
    batch = random_batch(config, kw["B"], kw["T"], kw["seed"])
    lkw = {"attention_mask": batch["attention_mask"]}
    lkw.update({"labels": batch["labels"]} if config.head == "mlm"
               else {"targets": batch["targets"]})
    _, grads, d_emb = impl.loss_and_grads(params, config, batch["input_ids"], **lkw)
    x_shape = np.shape(impl.embed(params, config, batch["input_ids"]))
    bad = {}
    for name, p in params.items():
        if name not in grads or grads[name] is None:
            bad[name] = "no gradient returned"
        elif np.shape(grads[name]) != p.shape:
            bad[name] = f"gradient shape {np.shape(grads[name])}, expected {p.shape}"
    if np.shape(d_emb) != x_shape:
        bad["input_embeddings"] = f"gradient shape {np.shape(d_emb)}, expected {x_shape}"
    extra = sorted(set(grads) - set(params))
    if not bad and not extra:
        return model_gradcheck(impl, config, **kw), {}
    bad.update({name: "gradient of a tensor that is not a parameter" for name in extra})

    class _Repaired:  # the well-shaped gradients as returned; zeros in place of the bad ones
        def __getattr__(self, name):
            return getattr(impl, name)

        def loss_and_grads(self, p, cfg, ids, **k):
            value, g, d = impl.loss_and_grads(p, cfg, ids, **k)
            g = {n: (np.zeros_like(v) if n in bad else g[n]) for n, v in p.items()}
            return value, g, (np.zeros(x_shape) if "input_embeddings" in bad else d)

    results = model_gradcheck(_Repaired(), config, **kw)
    for r in results:
        if r.tensor in bad:
            r.error, r.analytic, r.passed = float("inf"), float("nan"), False
    results += [CheckResult("model", name, "directional", float("inf"), FD_RTOL,
                            float("nan"), float("nan")) for name in extra]
    return results, bad


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    import minibert_reference
    from minibert_reference.config import PRESETS
    from minibert_spec.cli._provenance import provenance_line
    from minibert_spec.numerics.finite_differences import model_gradcheck

    console = Console()
    console.print(provenance_line(), markup=False, highlight=False)
    failed = 0
    for preset in args.preset:
        config = PRESETS[preset]()
        start = time.perf_counter()
        results, bad = _gradcheck(model_gradcheck, minibert_reference, config, B=args.batch,
                                  T=args.seq, seed=args.seed, n_dirs=args.directions)
        elapsed = time.perf_counter() - start
        table = Table(title=f"{preset}: directional finite differences, float64, "
                            f"B={args.batch} T={args.seq} ({elapsed:.2f} s)")
        for col in ("tensor", "analytic <g,u>", "finite difference", "error", "rtol", "verdict"):
            # numbers never wrap (a cut exponent misleads); the tensor name folds instead
            table.add_column(col, justify="left" if col == "tensor" else "right",
                             no_wrap=col != "tensor", overflow="fold")
        for r in results:
            verdict = "[green]ok[/]" if r.passed else "[red]FAIL[/]"
            if r.tensor in bad:
                verdict = f"[red]FAIL: {escape(bad[r.tensor])}[/]"
            table.add_row(r.tensor, f"{r.analytic:.6e}", f"{r.numeric:.6e}", f"{r.error:.1e}",
                          f"{r.rtol:.0e}", verdict)
            failed += not r.passed
        console.print(table)
    if failed:
        console.print(f"[red]{failed} tensor(s) failed the gradient check[/]")
        return 1
    console.print("[green]all gradients agree with finite differences[/]")
    return 0
