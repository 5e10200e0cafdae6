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
                   help="presets (bert-tiny = bert_tiny: the BERT architecture, tied MLM head)")
    g.add_argument("--batch", "-B", type=int, default=2)
    g.add_argument("--seq", "-T", type=int, default=8)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--directions", type=int, default=1, help="random directions per tensor")
    g.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    import reference
    from reference.config import PRESETS
    from spec.gradcheck import model_gradcheck

    console = Console()
    failed = 0
    for preset in args.preset:
        config = PRESETS[preset]()
        start = time.perf_counter()
        results = model_gradcheck(reference, config, B=args.batch, T=args.seq, seed=args.seed,
                                  n_dirs=args.directions)
        elapsed = time.perf_counter() - start
        table = Table(title=f"{preset}: directional finite differences, float64, "
                            f"B={args.batch} T={args.seq} ({elapsed:.2f} s)")
        for col in ("tensor", "analytic <g,u>", "finite difference", "error", "rtol", "verdict"):
            table.add_column(col, justify="left" if col == "tensor" else "right",
                             no_wrap=col == "tensor")
        for r in results:
            table.add_row(r.tensor, f"{r.analytic:.6e}", f"{r.numeric:.6e}", f"{r.error:.1e}",
                          f"{r.rtol:.0e}", "[green]ok[/]" if r.passed else "[red]FAIL[/]")
            failed += not r.passed
        console.print(table)
    if failed:
        console.print(f"[red]{failed} tensor(s) failed the gradient check[/]")
        return 1
    console.print("[green]all gradients agree with finite differences[/]")
    return 0
