"""``minibert bench``: the reference against PyTorch eager on the same model and batch, in one
process, alternating call by call, at each thread count: train step (full MLM head and the
trainer's masked head), forward, backward and the optimizer separately; medians, p10/p90, the
reference/torch ratio, GFLOP and the fraction of this run's sgemm FLOP floor; the peak RSS of a
reference training step; the BLAS library and threads actually used (threadpoolctl).

A benchmark, never a test: nothing here asserts a time.
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    import argparse

    b = sub.add_parser("bench", help="time the reference against PyTorch eager (medians, ratios)",
                       description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    b.add_argument("--preset", default="mini_bert", help="model preset (mini_bert: the "
                                                         "architecture the torch side builds)")
    b.add_argument("--batch", "-B", type=int, default=8)
    b.add_argument("--seq", "-T", type=int, default=64)
    b.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                   help="BLAS/torch thread counts to measure, each set with threadpoolctl")
    b.add_argument("--repeats", type=int, default=20, help="timed calls per side and row")
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--format", choices=["table", "json"], default="table")
    b.add_argument("-o", "--output", help="write the report here (atomically) instead of stdout")
    b.set_defaults(func=run)


def _problem(config, B, T, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(5, config.vocab_size, size=(B, T))
    labels = np.where(rng.random((B, T)) < 0.15, ids, -100)
    labels[:, 0] = ids[:, 0]  # at least one predicted position per row
    return ids, labels, np.ones((B, T), dtype=np.int64)


def _reference_side(config, params, ids, labels, mask):
    """Callables over one mutable state dict: the reference's step, forward, backward, Adam."""
    import reference
    from reference import ops

    s = {"params": params, "state": reference.adam_init(params)}

    def step(loss_and_grads):
        def fn():
            _, grads, _ = loss_and_grads(s["params"], config, ids, labels=labels,
                                         attention_mask=mask)
            s["params"], s["state"] = reference.adam_step(s["params"], grads, s["state"], lr=1e-4)
        return fn

    def forward():
        out, cache = reference.forward(s["params"], config, ids, mask)
        value, c_loss = ops.cross_entropy_forward(out, labels)
        s["fwd"] = (cache, c_loss)

    def backward():
        cache, c_loss = s["fwd"]
        (dout,) = ops.cross_entropy_backward(1.0, c_loss)
        s["grads"], _ = reference.backward(dout, cache)

    def optimizer():  # in place, as torch.optim updates its parameters
        s["state"] = reference.optim.adam_step_inplace(s["params"], s["grads"], s["state"],
                                                       lr=1e-4)

    def optimizer_pure():
        reference.adam_step(s["params"], s["grads"], s["state"], lr=1e-4)

    forward()
    backward()
    return {"step_full": step(reference.loss_and_grads),
            "step_masked": step(reference.masked_lm_loss_and_grads),
            "forward": forward, "backward": backward, "optimizer": optimizer,
            "optimizer_pure": optimizer_pure, "_before_backward": forward}


def _torch_side(module, torch, config, params, ids, labels, mask):
    tp, tforward, opt = module.build(params, config)
    t_ids, t_labels, t_mask = (torch.from_numpy(a) for a in (ids, labels, mask))
    t_pred = t_labels != -100
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
            "backward": backward, "optimizer": optimizer, "optimizer_pure": optimizer,
            "_before_backward": forward}


BENCH_PRESETS = ("mini_bert",)
ROWS = (("step_full", "train step, full head", "step", None),
        ("step_masked", "train step, masked head", "step", 0.15),
        ("forward", "forward + loss", "forward", None),
        ("backward", "backward", "backward", None),
        ("optimizer", "Adam update (in place)", None, None),
        ("optimizer_pure", "Adam update (pure)", None, None))


def measure(args):
    import numpy as np

    from reference import init_params
    from reference.config import PRESETS
    from reference.train.threads import blas_threads
    from spec.bench import (
        Report,
        Row,
        alternate,
        blas_info,
        load_torch_side,
        peak_rss_mib,
        sgemm_gflops,
        step_gflop,
    )

    if args.preset not in BENCH_PRESETS:
        # the torch side (tests/benchmarks/torch_side.py) builds the Mini-BERT architecture only
        raise ValueError(f"--preset: expected one of {list(BENCH_PRESETS)} (the architectures "
                         f"the torch side implements), got {args.preset!r}")
    for flag, values in (("--threads", args.threads), ("--repeats", [args.repeats]),
                         ("--batch", [args.batch]), ("--seq", [args.seq])):
        if any(v < 1 for v in values):
            raise ValueError(f"{flag}: expected integers >= 1, got {values}")
    config = PRESETS[args.preset]()
    B, T = args.batch, args.seq
    ids, labels, mask = _problem(config, B, T, args.seed)
    module, note = load_torch_side()
    torch = None
    if module is not None:
        import torch
    report = Report(args.preset, B, T, "float32", blas_info(), {}, torch_note=note)
    predicted = float(np.mean(labels != -100))
    for n in args.threads:
        report.sgemm_gflops[n] = sgemm_gflops(n)
        with blas_threads(n):
            if torch is not None:
                torch.set_num_threads(n)
            params = init_params(config, seed=args.seed, dtype=np.float32)
            ours = _reference_side(config, params, ids, labels, mask)
            theirs = (_torch_side(module, torch, config, params, ids, labels, mask)
                      if module is not None else None)
            report.blas = blas_info()
            for key, title, flops, frac in ROWS:
                fns = {"ours": ours[key]}
                before = {"ours": ours["_before_backward"]} if key == "backward" else {}
                if theirs is not None:
                    fns["torch"] = theirs[key]
                    if key == "backward":
                        before["torch"] = theirs["_before_backward"]
                stats = alternate(fns, repeats=args.repeats, warmup=args.warmup, before=before)
                gflop = 0.0
                if flops:
                    gflop = step_gflop(config, B, T, predicted if frac else None)[flops]
                report.rows.append(Row(
                    title, n, gflop, stats["ours"], stats.get("torch"),
                    gflop / report.sgemm_gflops[n] * 1e3 if gflop else None))
    report.peak_rss_mib = peak_rss_mib(args.preset, B, T)
    return report


def render_table(report) -> str:
    lines = [f"minibert bench: {report.preset}, B={report.batch}, T={report.seq}, "
             f"{report.dtype}; medians of alternating calls (p10-p90)"]
    for b in report.blas:
        lines.append(f"BLAS: {b['internal_api']} {b['version']} ({b['user_api']}), "
                     f"{b['num_threads']} thread(s) in use at the end, {b['architecture']}")
    for n, rate in report.sgemm_gflops.items():
        lines.append(f"sgemm floor, {n} thread(s): {rate:.0f} GFLOP/s")
    if report.torch_note:
        lines.append(report.torch_note)
    head = f"{'measurement':26} {'thr':>3} {'GFLOP':>6} {'ours ms':>18} {'torch ms':>18} " \
           f"{'ratio':>6} {'/floor':>6}"
    lines += [head, "-" * len(head)]
    for r in report.rows:
        def cell(s):
            return "-" if s is None else f"{s.median_ms:7.1f} ({s.p10_ms:.0f}-{s.p90_ms:.0f})"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        floor = "-" if r.vs_floor is None else f"{r.vs_floor:.2f}"
        gflop = f"{r.gflop:.2f}" if r.gflop else "-"
        lines.append(f"{r.name:26} {r.threads:>3} {gflop:>6} {cell(r.ours):>18} "
                     f"{cell(r.torch):>18} {ratio:>6} {floor:>6}")
    if report.peak_rss_mib is not None:
        lines.append(f"peak RSS of a reference training step (fresh process, masked head): "
                     f"{report.peak_rss_mib:.0f} MiB")
    return "\n".join(lines)


def run(args) -> int:
    report = measure(args)
    text = (json.dumps(report.to_json(), indent=2) if args.format == "json"
            else render_table(report))
    if args.output:
        from pathlib import Path

        path = Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        tmp.replace(path)
    else:
        sys.stdout.write(text + "\n")
    return 0
