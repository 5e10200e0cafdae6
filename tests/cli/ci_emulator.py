"""Run the jobs of a CI file (docs/ci/github-actions.yml, docs/ci/gitlab-ci.yml) as its CI
would, on this machine: each job instance in a working copy of its own (a copy of a user
repository), its shell lines run by bash as the CI runs them, the jobs of one stage (the
instances of one matrix, one ``parallel``) at the same time, and what the CI service does
between jobs -- checkout, the cache, artifacts -- done by hand: copies between folders.

The shell lines come from the YAML itself (nothing is restated here); what is not run: the
install lines (``pip install ...``: this interpreter's environment is the installed package)
and the ``runs-on``/``image`` machine (this one).  ``overrides`` replaces workflow-level
variables (the profile reduced for a test).

Used by tests/cli/test_ci_workflows.py.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

INSTALL = re.compile(r"^\s*pip install\b")


@dataclass
class JobRun:
    name: str  # the job, with its matrix value / node index
    workdir: Path
    returncode: int | None  # None: skipped
    log: str = ""


@dataclass
class Services:
    """What the CI service keeps between jobs: caches (key -> folder) and artifacts."""

    root: Path
    caches: dict[str, Path] = field(default_factory=dict)  # insertion order: newest last
    artifacts: dict[str, Path] = field(default_factory=dict)

    def folder(self, kind: str, name: str) -> Path:
        p = self.root / kind / re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        p.mkdir(parents=True, exist_ok=True)
        return p


def environment(variables: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GITHUB_",
                                                                     "CI_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update({k: str(v) for k, v in variables.items()})
    return env


def copy_into(src: Path, dst: Path, patterns: list[str]) -> list[str]:
    """Copy what each glob pattern matches under ``src`` to the same place under ``dst``
    (merging folders, as extracting an archive over a folder does)."""
    copied = []
    for pattern in patterns:
        pattern = pattern.strip().rstrip("/")
        if not pattern:
            continue
        for hit in sorted(glob.glob(str(src / pattern), include_hidden=True)):
            rel = Path(hit).relative_to(src)
            target = dst / rel
            if Path(hit).is_dir():
                shutil.copytree(hit, target, dirs_exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(hit, target)
            copied.append(rel.as_posix())
    return copied


def bash(script: str, cwd: Path, env: dict, timeout: float) -> tuple[int, str]:
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def shell_lines(lines) -> str:
    """The lines of a script without the install lines."""
    text = "\n".join(lines) if isinstance(lines, list) else str(lines)
    return "\n".join(x for x in text.splitlines() if not INSTALL.match(x))


# --------------------------------------------------------------------------- GitHub Actions
def _expr(text, ctx: dict) -> str:
    """``${{ name }}`` replaced by ``ctx[name]`` (names: matrix.*, github.*, env.*)."""
    return re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}", lambda m: str(ctx[m.group(1)]), str(text))


def _condition(text, ctx: dict, failed: bool) -> bool:
    """A step's or job's ``if:`` (the subset these files use: always(), success(),
    github.event_name comparisons, &&, ||, !)."""
    if text is None:
        return not failed
    expr = str(text).replace("${{", "").replace("}}", "")
    expr = re.sub(r"github\.event_name", repr(ctx["github.event_name"]), expr)
    expr = expr.replace("always()", "True").replace("success()", repr(not failed))
    expr = expr.replace("&&", " and ").replace("||", " or ")
    expr = re.sub(r"!(?!=)", " not ", expr)
    ok = bool(eval(expr, {"__builtins__": {}}, {}))  # noqa: S307 -- the repository's own YAML
    return ok and (not failed or "always()" in str(text))


def run_github(workflow: Path, repo: Path, services: Services, *, event: str, run_id: int,
               overrides: dict, timeout: float = 600) -> dict[str, list[JobRun]]:
    """Every job of the workflow that ``event`` triggers, in ``needs`` order."""
    wf = yaml.safe_load(workflow.read_text())
    base_ctx = {"github.event_name": event, "github.run_id": run_id,
                "github.run_number": run_id}
    wf_env = {**{k: str(v) for k, v in (wf.get("env") or {}).items()}, **overrides}
    done: dict[str, list[JobRun]] = {}
    pending = dict(wf["jobs"])
    while pending:
        ready = [n for n, j in pending.items()
                 if all(d in done for d in _list(j.get("needs")))]
        for name in ready:
            job = pending.pop(name)
            needs_failed = any(r.returncode not in (0, None) or r.returncode is None
                               for d in _list(job.get("needs")) for r in done[d])
            if not _condition(job.get("if"), base_ctx, needs_failed):
                done[name] = [JobRun(name, repo, None)]
                continue
            matrix = (job.get("strategy") or {}).get("matrix") or {}
            combos = [{}] if not matrix else [{k: v} for k, vs in matrix.items() for v in vs]
            with ThreadPoolExecutor(max_workers=len(combos)) as pool:
                done[name] = list(pool.map(
                    lambda combo, name=name, job=job: _github_job(
                        name, job, combo, repo, services, base_ctx, wf_env, timeout), combos))
    return done


def _list(x) -> list:
    return [] if x is None else [x] if isinstance(x, str) else list(x)


def _github_job(name, job, combo, repo, services, base_ctx, wf_env, timeout) -> JobRun:
    label = name + "".join(f"-{v}" for v in combo.values())
    workdir = services.root / "jobs" / f"{label}-{base_ctx['github.run_id']}"
    ctx = {**base_ctx, **{f"matrix.{k}": v for k, v in combo.items()}}
    env = dict(wf_env)
    env.update({k: _expr(v, ctx) for k, v in (job.get("env") or {}).items()})
    ctx.update({f"env.{k}": v for k, v in env.items()})
    log, failed = [], False
    for step in job["steps"]:
        if not _condition(step.get("if"), ctx, failed):
            continue
        uses, inputs = step.get("uses", ""), {k: _expr(v, ctx)
                                              for k, v in (step.get("with") or {}).items()}
        if uses.startswith("actions/checkout@"):
            shutil.copytree(repo, workdir)
        elif uses.startswith("actions/setup-python@"):
            pass  # this interpreter
        elif uses.startswith("actions/cache/restore@"):
            keys = [inputs["key"], *inputs.get("restore-keys", "").split()]
            hit = next((services.caches[k] for k in keys if k in services.caches), None) or \
                next((services.caches[k] for k in reversed(services.caches)
                      for prefix in keys[1:] if k.startswith(prefix)), None)
            if hit is not None:
                copy_into(hit, workdir, ["*"])
        elif uses.startswith("actions/cache/save@"):
            if inputs["key"] not in services.caches:  # a cache entry is never replaced
                folder = services.folder("cache", inputs["key"])
                copy_into(workdir, folder, inputs["path"].splitlines())
                services.caches[inputs["key"]] = folder
        elif uses.startswith("actions/upload-artifact@"):
            folder = services.folder("artifact", inputs["name"])
            copy_into(workdir, folder, inputs["path"].splitlines())
            services.artifacts[inputs["name"]] = folder
        elif uses.startswith("actions/download-artifact@"):
            for art, folder in services.artifacts.items():
                if fnmatch.fnmatch(art, inputs.get("pattern", "*")):
                    dest = workdir / inputs.get("path", ".")
                    if not inputs.get("merge-multiple"):
                        dest = dest / art
                    copy_into(folder, dest, ["*"])
        elif "run" in step:
            script = shell_lines(_expr(step["run"], ctx))
            if not script.strip():
                continue
            step_env = {**env, **{k: _expr(v, ctx) for k, v in (step.get("env") or {}).items()}}
            rc, out = bash(script, workdir, environment(step_env), timeout)
            log.append(f"$ {step.get('name', script.splitlines()[0])}\n{out}")
            failed = failed or rc != 0
        else:
            raise ValueError(f"{label}: a step this emulator does not know: {step}")
    return JobRun(label, workdir, 1 if failed else 0, "\n".join(log))


# --------------------------------------------------------------------------- GitLab CI
RESERVED = {"stages", "variables", "default", "include", "workflow", "image", "services",
            "before_script", "after_script", "cache"}


def _gitlab_jobs(ci: dict) -> dict[str, dict]:
    def resolved(job: dict) -> dict:
        base = {}
        for parent in _list(job.get("extends")):
            base.update(resolved(ci[parent]))
        return {**base, **{k: v for k, v in job.items() if k != "extends"}}

    return {n: resolved(j) for n, j in ci.items()
            if n not in RESERVED and not n.startswith(".")}


def _rule(job: dict, variables: dict) -> str | None:
    """The job's ``when`` under its rules (None: not in this pipeline)."""
    rules = job.get("rules")
    if rules is None:
        return job.get("when", "on_success")
    for rule in rules:
        cond = rule.get("if")
        if cond is None or _gitlab_if(cond, variables):
            return rule.get("when", "on_success")
    return None


def _gitlab_if(cond: str, variables: dict) -> bool:
    expr = re.sub(r"\$(\w+)", lambda m: repr(variables.get(m.group(1), "")), cond)
    return bool(eval(expr.replace("&&", " and ").replace("||", " or "),  # noqa: S307
                     {"__builtins__": {}}, {}))


def run_gitlab(ci_file: Path, repo: Path, services: Services, *, source: str, pipeline: int,
               overrides: dict, timeout: float = 600) -> dict[str, list[JobRun]]:
    """Every job of the pipeline that ``source`` (CI_PIPELINE_SOURCE) starts, stage by stage."""
    ci = yaml.safe_load(ci_file.read_text())
    variables = {**{k: str(v) for k, v in (ci.get("variables") or {}).items()}, **overrides,
                 "CI_PIPELINE_SOURCE": source, "CI_PIPELINE_IID": str(pipeline)}
    jobs = _gitlab_jobs(ci)
    done: dict[str, list[JobRun]] = {}
    for stage in ci.get("stages", ["test"]):
        todo = []
        for name, job in jobs.items():
            when = _rule(job, variables)
            if job.get("stage", "test") != stage or when is None:
                continue
            earlier_failed = any(r.returncode not in (0, None) for rs in done.values()
                                 for r in rs)
            if earlier_failed and when != "always":
                done[name] = [JobRun(name, repo, None)]
                continue
            n = int(job.get("parallel", 1))
            todo += [(name, job, k, n) for k in range(1, n + 1)]
        with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
            runs = list(pool.map(lambda t: _gitlab_job(*t, ci, repo, services, done, variables,
                                                       timeout), todo))
        for (name, *_), run in zip(todo, runs):
            done.setdefault(name, []).append(run)
    return done


def _gitlab_job(name, job, k, n, ci, repo, services, done, variables, timeout) -> JobRun:
    label = f"{name}-{k}" if n > 1 else name
    workdir = services.root / "jobs" / f"{label}-{variables['CI_PIPELINE_IID']}"
    shutil.copytree(repo, workdir)  # the runner's clone
    for dep in _list(job.get("needs")) if "needs" in job else list(done):
        for run in done.get(dep, []):
            art = services.artifacts.get(run.name)
            if art is not None:
                copy_into(art, workdir, ["*"])
    cache = job.get("cache") or {}
    if cache and cache.get("policy", "pull-push") in ("pull", "pull-push") \
            and cache["key"] in services.caches:
        copy_into(services.caches[cache["key"]], workdir, ["*"])
    env = {**variables, "CI_NODE_INDEX": str(k), "CI_NODE_TOTAL": str(n)}
    if n == 1:
        env.pop("CI_NODE_INDEX"), env.pop("CI_NODE_TOTAL")
    script = shell_lines([*(job.get("before_script") or ci.get("before_script") or []),
                          *job["script"]])
    rc, out = bash(script, workdir, environment(env), timeout)
    ok = rc == 0
    arts = job.get("artifacts") or {}
    if arts and (ok or arts.get("when") == "always"):
        folder = services.folder("artifact", label)
        copy_into(workdir, folder, arts.get("paths", []))
        services.artifacts[label] = folder
    if cache and cache.get("policy", "pull-push") in ("push", "pull-push") \
            and (ok or cache.get("when") == "always"):
        folder = services.folder("cache", f"{cache['key']}-{label}")
        copy_into(workdir, folder, cache.get("paths", []))
        services.caches[cache["key"]] = folder  # a GitLab cache is replaced by each upload
    return JobRun(label, workdir, rc, out)
