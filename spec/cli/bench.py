"""``minibert bench``: the reference against PyTorch eager on the same model and batch, each side
alone in its own process (a fresh interpreter per side, thread count and round, the sides
alternating process by process; minibert_spec.benchproc), at each thread count: train step (full MLM
head and the trainer's masked head), forward, backward and the optimizer separately; medians
over rounds, p10/p90, the reference/torch ratio, GFLOP and the fraction of the sgemm FLOP floor;
the peak RSS of a reference training step; ``minibert train``'s steps/s idle and beside another
2-thread job; the BLAS library and threads actually used (threadpoolctl); and every performance
target with its measured value.

A benchmark, never a test: nothing here asserts a time, and the exit status says whether the
measurement ran and is plausible (0), not whether a target was met.  The run checks itself, in
every process (minibert_spec.bench.plausibility): a load average above the core count, an sgemm far
below the 1-thread probe's rate, or a step faster than its FLOP floor says the machine was busy
-- the report lists why, judges no target, and the exit status is 1 unless --allow-noisy.
"""

from __future__ import annotations

import json
import sys

from minibert_spec.protocol import IGNORE_INDEX


def register(sub) -> None:
    import argparse

    b = sub.add_parser("bench", help="time the reference against PyTorch eager (medians, ratios)",
                       description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    b.add_argument("--preset", default="mini_bert", help="model preset (mini_bert: the "
                                                         "architecture the torch side builds)")
    b.add_argument("--batch", "-B", type=int, default=8)
    b.add_argument("--seq", "-T", type=int, default=64)
    b.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                   help="thread counts to measure: the reference's workers (single-threaded "
                        "BLAS each, minibert_reference.train.threads) and torch.set_num_threads")
    b.add_argument("--rounds", type=int, default=5,
                   help="processes per side and thread count, the sides alternating process by "
                        "process; each figure is the median of their medians")
    b.add_argument("--repeats", type=int, default=5,
                   help="timed calls per row in each process")
    b.add_argument("--warmup", type=int, default=2, help="untimed calls per row in each "
                                                         "process, first")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--no-train-rate", action="store_true",
                   help="skip minibert train's steps/s idle and under a 2-thread load (~40 s)")
    b.add_argument("--no-rss", action="store_true", help="skip the peak-RSS child processes")
    b.add_argument("--allow-noisy", action="store_true",
                   help="exit 0 even when the run fails its self-check (busy machine); the "
                        "targets are still not judged")
    b.add_argument("--verdict", nargs="*", metavar="IMPL",
                   help="instead: time the verdict -- minibert check IMPL warm and cold (an "
                        "empty cache directory: a fresh machine) and its first red "
                        "(--first-red), each a fresh process, --rounds rounds, the cases "
                        "alternating (minibert_spec.benchverdict); no IMPL: the reference")
    b.add_argument("--pytest-file", metavar="FILE",
                   help="with --verdict: also time pytest on this test file (your "
                        "parametrize_with_checks file), from its own folder")
    b.add_argument("--format", choices=["table", "json"], default="table")
    b.add_argument("-o", "--output", help="write the report here (atomically) instead of stdout")
    b.set_defaults(func=run)


BENCH_PRESETS = ("mini_bert",)
ROWS = (("step_full", "train step, full head", "step", None),
        ("step_masked", "train step, masked head", "step", 0.15),
        ("forward", "forward + loss", "forward", None),
        ("backward", "backward", "backward", None),
        ("optimizer", "Adam update (in place)", None, None),
        ("optimizer_out", "Adam, out= (the trainer's)", None, None))
POLICY = ("each side alone in its own process (a fresh interpreter per side, thread count and "
          "round, the sides alternating); reference: N workers (batch shards, Adam's tensors; "
          "minibert_reference.parallel), single-threaded BLAS in each; torch: "
          "torch.set_num_threads(N), "
          "NumPy's BLAS at 1 thread and unused; freed memory kept by malloc in both")
RSS_TARGET_MIB = 300


def _check_args(args) -> None:
    if args.preset not in BENCH_PRESETS:
        # the torch side (tests/benchmarks/torch_side.py) builds the Mini-BERT architecture only
        raise ValueError(f"--preset: expected one of {list(BENCH_PRESETS)} (the architectures "
                         f"the torch side implements), got {args.preset!r}")
    for flag, values in (("--threads", args.threads), ("--repeats", [args.repeats]),
                         ("--rounds", [args.rounds]),
                         ("--batch", [args.batch]), ("--seq", [args.seq])):
        if any(v < 1 for v in values):
            raise ValueError(f"{flag}: expected integers >= 1, got {values}")
    if args.warmup < 0:
        raise ValueError(f"--warmup: expected an integer >= 0, got {args.warmup}")


def measure(args):
    import numpy as np

    from minibert_reference.config import PRESETS
    from minibert_reference.train.threads import available_cores
    from minibert_spec import bench as mb
    from minibert_spec.benchproc import check_processes, median_sgemm, run_rounds, stats_of

    _check_args(args)
    config = PRESETS[args.preset]()
    B, T = args.batch, args.seq
    if T > config.max_len:
        raise ValueError(f"--seq: expected at most the preset's max_len={config.max_len}, "
                         f"got {T}")
    _, labels, _ = mb.problem(config, B, T, args.seed)
    module, note = mb.load_torch_side()
    sides = ("ours", "torch") if module is not None else ("ours",)
    report = mb.BenchReport(args.preset, B, T, "float32", mb.blas_info(), {}, policy=POLICY,
                            torch_note=note, cores=available_cores())
    report.load["before"] = mb.load_average()
    predicted = float(np.mean(labels != IGNORE_INDEX))
    threads = sorted(set(args.threads))
    gflops = {key: (mb.step_gflop(config, B, T, predicted if frac else None)[flops] if flops
                    else 0.0) for key, _, flops, frac in ROWS}
    # each side alone in its own process, alternating process by process (minibert_spec.benchproc)
    job = {"task": mb.BENCH_TASK, "preset": args.preset, "batch": B, "seq": T, "seed": args.seed,
           "keys": [key for key, *_ in ROWS], "repeats": args.repeats, "warmup": args.warmup,
           "check": True}
    processes = run_rounds(job, sides=sides, threads=threads, rounds=args.rounds,
                           progress=_progress(args))
    report.processes = processes
    report.sgemm_gflops, report.sgemm_median = median_sgemm(processes, "ours")
    report.torch_sgemm_gflops, _ = median_sgemm(processes, "torch")
    ours_blas = next((p.info.get("blas") for p in processes if p.side == "ours"), None)
    report.blas = ours_blas or report.blas
    for n in threads:
        for key, title, _, _ in ROWS:
            gflop = gflops[key]
            rate = report.sgemm_gflops.get(n)
            report.rows.append(mb.Row(
                key, title, n, gflop, stats_of(processes, "ours", n, key),
                stats_of(processes, "torch", n, key),
                gflop / rate * 1e3 if gflop and rate else None))
    # the self-check: the run's (load before the first process, after the last) and each
    # process's own, before the RSS and train-rate children (the latter loads the machine on
    # purpose)
    report.load["after"] = mb.load_average()
    report.problems = mb.plausibility(
        cores=report.cores, load_before=report.load["before"],
        load_after=report.load["after"], own_threads=max(threads), sgemm={},
        sgemm_median={}, floors={})
    report.problems += check_processes(processes, cores=report.cores, gflop=gflops)
    if not args.no_rss:
        for head in ("full", "masked"):
            report.peak_rss_mib[head] = mb.peak_rss_mib(args.preset, B, T,
                                                        threads=max(threads), head=head)
    if not args.no_train_rate:
        report.train_rate = mb.train_rate(args.preset)
    report.targets = targets(report)
    for t in report.targets:  # never "met" (nor "NOT met") from an implausible run
        t.implausible = bool(report.problems)
    return report


def _progress(args):
    """One line per process on stderr for a table on a terminal (the run takes minutes)."""
    if args.format != "table" or args.output or not sys.stderr.isatty():
        return None
    return lambda what: print(f"minibert bench: {what}", file=sys.stderr, flush=True)


def targets(report) -> list:
    """The issue's targets, each from this report's measurements (None where not measured)."""
    from minibert_spec.bench import Target

    def ratio(key, n):
        r = report.row(key, n)
        return None if r is None else r.ratio

    full2, masked2 = report.row("step_full", 2), report.row("step_masked", 2)
    out = [
        Target("train step, full head, 2 threads: reference / torch eager", ratio("step_full", 2),
               0.9, "<="),
        Target("train step, full head, 1 thread: reference / torch eager", ratio("step_full", 1),
               0.9, "<="),
        Target("train step, masked head (the trainer's), 2 threads / torch full head",
               None if full2 is None or full2.torch is None or masked2 is None
               else masked2.ours.median_ms / full2.torch.median_ms, 0.6, "<="),
        Target("train step, full head, 2 threads / FLOP floor",
               None if full2 is None else full2.vs_floor, 1.8, "<="),
    ]
    for n in sorted({r.threads for r in report.rows}):
        out.append(Target(f"Adam in place ({n} thread(s)) / torch.optim.Adam(foreach)",
                          ratio("optimizer", n), 1.0, "<="))
    rss = max(report.peak_rss_mib.values()) if report.peak_rss_mib else None
    out.append(Target("peak RSS of a training step (fresh process, worst head)", rss,
                      RSS_TARGET_MIB, "<=", "MiB"))
    tr = report.train_rate
    out.append(Target(
        "minibert train steps/s, default threads, beside a 2-thread job / --threads 1 beside it",
        None if tr is None else tr.loaded_ratio, 0.8, ">=", "",
        "" if tr is None else (f"default = {tr.default_threads} thread(s): "
                               f"{tr.loaded['default']:.2f} vs {tr.loaded['one']:.2f} steps/s "
                               f"loaded, {tr.idle['default']:.2f} vs {tr.idle['one']:.2f} "
                               f"idle")))
    return out


def render_table(report) -> str:
    rounds = max((r.ours.rounds for r in report.rows), default=0)
    lines = [f"minibert bench: {report.preset}, B={report.batch}, T={report.seq}, "
             f"{report.dtype}; medians over {rounds} round(s) of separate processes per side "
             f"(p10-p90 of the processes' medians)",
             f"threads: {report.policy}"]
    for b in report.blas:
        lines.append(f"BLAS: {b['internal_api']} {b['version']} ({b['user_api']}), "
                     f"{b['num_threads']} thread(s) in use at the end, {b['architecture']}")
    for n, rate in report.sgemm_gflops.items():
        lines.append(f"sgemm floor, {n} BLAS thread(s): {rate:.0f} GFLOP/s (median round "
                     f"{report.sgemm_median.get(n, float('nan')):.0f}; medians over the "
                     f"reference's processes)")
    for n, rate in report.torch_sgemm_gflops.items():
        lines.append(f"torch's sgemm, {n} thread(s): {rate:.0f} GFLOP/s (its processes' "
                     f"self-check)")
    load = ", ".join(f"{k} {v:.2f}" for k, v in report.load.items() if v is not None)
    lines.append(f"cores {report.cores}; load average {load or 'unavailable'}")
    if report.problems:
        lines.append("SELF-CHECK FAILED: these timings measure a busy machine, not the code; "
                     "no target is judged:")
        lines += [f"  - {p}" for p in report.problems]
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
    for head, mib in report.peak_rss_mib.items():
        lines.append(f"peak RSS of a reference training step ({head} head, fresh process): "
                     f"{mib:.0f} MiB")
    tr = report.train_rate
    if tr is not None:
        lines.append(f"minibert train steps/s (default = {tr.default_threads} thread(s) / 1 "
                     f"thread): idle {tr.idle['default']:.2f} / {tr.idle['one']:.2f}, beside "
                     f"a 2-thread job {tr.loaded['default']:.2f} / {tr.loaded['one']:.2f}")
    if report.targets:
        lines += ["", "targets:"]
        for t in report.targets:
            verdict = ("not judged (implausible run)" if t.implausible and t.value is not None
                       else {True: "met", False: "NOT met", None: "not measured"}[t.met])
            value = "-" if t.value is None else f"{t.value:.2f}{t.unit and ' ' + t.unit}"
            lines.append(f"  {t.name}: {value} (target {t.sense} {t.bound:g}{t.unit and ' '}"
                         f"{t.unit}) {verdict}" + (f"; {t.detail}" if t.detail else ""))
    return "\n".join(lines)


def _emit(text: str, output: str | None) -> None:
    """The report to ``output`` (atomically, its folder made) or to stdout."""
    from minibert_spec.cli._output import _write

    if output:
        _write(output, text)
    else:
        sys.stdout.write(text + "\n")


def run(args) -> int:
    from minibert_spec.cli._output import file_refused

    refused = file_refused("-o", args.output) if args.output else None
    if refused:  # before anything is measured: a report that cannot be written is lost
        raise ValueError(refused)
    if args.verdict is not None:
        return run_verdict(args)
    if args.pytest_file is not None:
        raise ValueError("--pytest-file: applies to --verdict only")
    report = measure(args)
    _emit(json.dumps(report.to_json(), indent=2) if args.format == "json"
          else render_table(report), args.output)
    if report.problems and not args.allow_noisy:
        print(f"minibert bench: the run failed its self-check ({report.problems[0]}"
              + (f"; {len(report.problems) - 1} more" if len(report.problems) > 1 else "")
              + "): rerun on an idle machine, or pass --allow-noisy", file=sys.stderr)
        return 1
    return 0


def run_verdict(args) -> int:
    """``minibert bench --verdict``: minibert_spec.benchverdict's cases, measured and written like
    the train-step bench's report (table or JSON, -o atomically), the same self-check rule."""
    from minibert_spec.benchverdict import exit_status, render, unreachable, user_cases
    from minibert_spec.benchverdict import measure as measure_verdict

    impls = args.verdict or ["minibert_reference"]
    cases = user_cases(impls, args.pytest_file)
    refused = unreachable(impls)
    if refused:
        raise ValueError(refused)
    result = measure_verdict(cases, args.rounds,
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
    _emit(json.dumps(result, indent=1) if args.format == "json" else render(result),
          args.output)
    status, why = exit_status(result, args.allow_noisy)
    if status:
        print(f"minibert bench --verdict: the run failed its self-check ({why})",
              file=sys.stderr)
    return status
