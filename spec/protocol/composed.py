"""A whole model composed from an implementation's own op rows (issue 39): most code the suite
sees is written as op rows (a LayerNorm, an attention, a block, a loss adapted to the protocol's
``<op>_forward`` / ``<op>_backward``) and has no model of its own, so the ``whole_model`` row
(minibert_spec.suite.checks.wholemodel) had nothing to judge.  :func:`composed_model` builds a
tiny one from them -- token embedding + learned positions -> blocks -> final norm -> linear head
-> cross-entropy -- every op the implementation provides called through the proxy every check
uses (its CAPABILITIES applied: ranks, fixed eps, no-affine norms, per-head weights, a loss's
reduction), the reference's rows (minibert_reference) standing in for the others, in the form
its CAPABILITIES declare (causal, RoPE, norm kind, no gain...) so that nothing undeclared is
called.  The result is a :class:`~minibert_spec.protocol.wholemodel.WholeModel`: the same FD
judge as a user's own model, nothing new to trust.  :attr:`ComposedModel.rows` says which rows
came from where; the verdict prints it.

The blocks: the implementation's ``block`` row when it has one (its declared form), then one
pre-norm block ``h = x + attn(N1(x)); out = h + ffn(N2(h))`` of its norm and attention rows per
FFN row it has (``ffn``, ``swiglu``, its ``linear`` and activation rows), at least two blocks in
all.  Its softmax row, where it has no attention row, computes the reference attention's
probabilities (the attention's maths stays the reference's one definition; the softmax is
called through the proxy, so its CAPABILITIES apply).  The final norm is its other norm row
where it has both.  A red is in the implementation's rows: the reference's are the suite's own,
verified row by row.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from minibert_reference.ops import (
    ATTENTION_PARAMS,
    FFN_PARAMS,
    SWIGLU_PARAMS,
    _attention_backward,
    _attention_forward,
    block_param_names,
    block_param_shapes,
)
from minibert_spec.protocol.capabilities import capabilities
from minibert_spec.protocol.norm_eps import eps_of
from minibert_spec.protocol.proxy import (
    ImplementationAbort,
    ImplProxy,
    NotApplicable,
    label_of,
    provides,
)
from minibert_spec.protocol.table import OPS
from minibert_spec.protocol.variants import resolve_variant
from minibert_spec.protocol.wholemodel import WholeModel

# a tiny model (seconds of finite differences): vocabulary, hidden, heads, FFN width, longest
# sequence, the fewest blocks (two: a block's input gradient then reaches another block's
# parameters; more where the implementation has more rows to place, one block each)
V, H, HEADS, INTER, T_MAX, LAYERS = 11, 8, 2, 12, 8, 2
# the spread of the FFN's first bias: a ReLU's inputs x W_1 + b_1 spread that wide, so that
# few sit within a finite difference's step of its kink at 0 (a crossing reads as a wrong
# gradient: a red on correct code)
KINK_BIAS = 3.0
# the eps each norm is called with where the code does not fix its own
NORM_EPS = {"layernorm": 1e-5, "rmsnorm": 1e-6}
# the rows a composed model can use, in the model's order (a row is the implementation's when
# it provides every protocol name of it)
USABLE = ("embedding", "position_embedding", "block", "layernorm", "rmsnorm", "attention",
          "softmax", "ffn", "swiglu", "linear", "gelu", "silu", "tanh", "relu", "cross_entropy",
          "next_token_cross_entropy", "linear_cross_entropy")
# the FFN's activation rows, smooth first (no kink under a finite difference where there is a
# choice); and the activations of an ``ffn`` row, likewise
ACTIVATIONS = ("gelu", "silu", "tanh", "relu")
FFN_ACTIVATIONS = ("gelu", "gelu_tanh", "relu2", "relu")

# the parameters of the attention, FFN and SwiGLU rows, in their forwards' order
ATTN, FFN, SWIGLU = ATTENTION_PARAMS, FFN_PARAMS, SWIGLU_PARAMS


@dataclass(frozen=True)
class Layer:
    """One block of the model: the implementation's block row ("block") or composed of norm,
    attention and FFN rows ("composed"); its FFN ("mlp", "swiglu" in a block row; "ffn",
    "swiglu", or "mlp" -- linear + activation rows -- composed) and its norm."""

    kind: str
    ffn: str
    norm: str


def _reference(op: str):
    return importlib.import_module(f"minibert_reference.{OPS[op].module}")


class Refused(ValueError):
    """No model can be composed of the implementation's rows: one line (exit 2 under
    ``minibert check --model``), never a verdict."""


class ModelOfRows(WholeModel):
    """A whole model the suite builds of an implementation's protocol rows for ``--model``
    (:class:`ComposedModel`; the decoder row's own model,
    minibert_spec.suite.checks.decoder.DecoderRowModel): ``label`` (the implementation's),
    :meth:`describe` (what the model is, one line the verdict prints) and :meth:`look_next`
    (the rows a red points at)."""

    label: str

    def describe(self) -> str:
        raise NotImplementedError

    def look_next(self) -> str:
        raise NotImplementedError


class ComposedModel(ModelOfRows):
    """The whole model of an implementation's op rows (see the module's docstring).
    ``rows``: op -> "implementation" | "reference", in the model's order; ``unused``: op
    pairs the implementation provides that this form has no place for (a RoPE row; a softmax
    beside its own attention row, which has its softmax inside), ``unplaced`` the reason where
    there is one; :meth:`describe`: all of it in one line; ``f32``: its rows compute in
    float32 (the model runs at float32 params)."""

    def __init__(self, obj, label: str | None = None):
        self.label = label or label_of(obj)
        self.caps = capabilities(obj)
        # every op pair it provides (the report names those the model has no place for)
        self.provided = {op for op, row in OPS.items()
                         if row.pair and provides(obj, *row.names)}
        self.own = self.provided & set(USABLE)
        if not self.own:
            raise Refused(
                f"--model: {self.label} provides no whole model and no op row a composed model "
                f"can use (one of {', '.join(USABLE)}): nothing to compose")
        self.proxy = ImplProxy(obj, self.label)
        self.f32 = False  # float32-only rows (_dry_run)
        self._plan()
        super().__init__(None, self._init_params(), forward=self._forward,
                         backward=self._backward, batch={"ids": "ids", "labels": "labels"},
                         vocab=V, max_len=T_MAX, name=f"composed({self.label})")
        self._dry_run()

    # ------------------------------------------------------------------ the plan
    def _row(self, op: str):
        """(forward, backward) of ``op``: the implementation's (through the proxy) when it
        provides it, else the reference's; recorded in :attr:`rows`."""
        src = self.proxy if op in self.own else _reference(op)
        self.rows.setdefault(op, "implementation" if op in self.own else "reference")
        fwd, bwd = OPS[op].pair
        forward, backward = getattr(src, fwd), getattr(src, bwd)

        def checked(*args):  # its gradients unpacked by position: their count said first
            return _gradients(op, backward(*args))

        return forward, checked

    def _plan(self) -> None:
        caps, own = self.caps, self.own
        self.rows: dict[str, str] = {}
        self.attn = resolve_variant(caps, "attention")
        self.heads = 1 if self.attn["heads"] == "single" else HEADS
        self.attn_bias = caps["attention_bias"]
        self.ln_affine = resolve_variant(caps, "layernorm")["affine"]
        self.gain = resolve_variant(caps, "rmsnorm")["gain"]
        ffn = resolve_variant(caps, "ffn")
        self.b_1, self.b_2 = ffn["b_1"], ffn["b_2"]
        # a smooth activation where the code declares one (no kink under a difference: a
        # float32 model's step is 1e-2); the reference's FFN: GELU
        self.activation = next((a for a in FFN_ACTIVATIONS if a in caps["ffn"]["activation"]),
                               ffn["activation"]) if own & {"ffn", "block"} else "gelu"
        self.swiglu_bias = resolve_variant(caps, "swiglu")["bias"]
        self.linear_bias = "linear" not in own or self._linear_takes_bias()
        self.emb, self.pos = self._row("embedding"), self._row("position_embedding")
        norms = [n for n in ("layernorm", "rmsnorm") if n in own]
        self._plan_layers(norms)
        # the final norm: its other norm row where it has both, else the blocks' norm
        self.final_op = norms[-1] if norms else self.layers[-1].norm
        self.final_row = self._row(self.final_op)
        if "linear_cross_entropy" in own:
            self.head, self.loss_op = self._row("linear_cross_entropy"), "linear_cross_entropy"
        else:
            self.head = self._row("linear")
            self.loss_op = next((op for op in ("cross_entropy", "next_token_cross_entropy")
                                 if op in own), "cross_entropy")
            self.loss = self._row(self.loss_op)
        self.unused = sorted(self.provided - set(self.rows))

    def _plan_layers(self, norms: list[str]) -> None:
        """The blocks (:class:`Layer`): its block row, then one composed block per FFN row."""
        caps, own = self.caps, self.own
        self.layers: list[Layer] = []
        self.block, self.block_form, self.softmax_inside = None, {}, False
        self.unplaced: dict[str, str] = {}  # op -> why a row it provides has no place
        if "block" in own:
            b = resolve_variant(caps, "block")
            self.block_form = {"norm": b["norm"], "causal": b["causal"],
                               "normalization": b["normalization"], "ffn": b["ffn"],
                               "rope": self.attn["rope"]}
            self.block = self._row("block")
            self.layers.append(Layer("block", b["ffn"], b["normalization"]))
        # composed blocks: one per FFN row it has (ffn, swiglu, linear + activation), so that
        # each is used; none of its own (a block row alone): none, unless a second block is
        # needed, then of the reference's FFN
        ffns = [f for f in ("ffn", "swiglu") if f in own] + (
            ["mlp"] if own & {"linear", *ACTIVATIONS} else [])
        if not ffns and (not self.layers
                         or own & {"layernorm", "rmsnorm", "attention", "softmax"}):
            ffns = ["ffn"]
        norm = norms[0] if norms else (self.layers[0].norm if self.layers else "layernorm")
        if ffns:
            self.norm_rows = {norm: self._row(norm)}
            self.attention = self._attention_row()
        for f in ffns:
            self.layers.append(Layer("composed", f, norm))
            if f == "mlp":
                self.act_op = next((a for a in ACTIVATIONS if a in own), "gelu")
                self.linear, self.act = self._row("linear"), self._row(self.act_op)
            else:
                setattr(self, f"{f}_row", self._row(f))
        while len(self.layers) < LAYERS:  # a block's input gradient reaches another block
            self.layers.append(self.layers[-1])

    def _attention_row(self):
        """The composed blocks' attention: its own row; else the reference's, its
        probabilities computed by the implementation's softmax row where it has one
        (:attr:`softmax_inside`) and can place it (:func:`_softmax_unplaceable`)."""
        wanted = "attention" not in self.own and "softmax" in self.own
        why = _softmax_unplaceable(self.caps, self.attn["causal"]) if wanted else None
        if why:
            self.unplaced["softmax"] = why
        self.softmax_inside = wanted and not why
        if not self.softmax_inside:
            return self._row("attention")
        self.rows.setdefault("attention", "reference")
        softmax = _masked_as_scores(*self._row("softmax"))

        def forward(*args, **kwargs):
            return _attention_forward(*args, softmax=softmax, **kwargs)

        def backward(dy, cache):
            return _gradients("attention", _attention_backward(dy, cache))

        return forward, backward

    def _linear_takes_bias(self) -> bool:
        """Its linear takes a bias: a class layer without one (a tutorial's ``Linear``) is not
        applicable with b, and no CAPABILITIES says so; its linears then go without (the FFN's
        b_1, b_2 and the head's b)."""
        try:
            self.proxy.linear_forward(np.ones((1, 2)), np.ones((2, 2)), np.zeros(2))
        except NotApplicable:
            return False
        except Exception:  # noqa: BLE001 -- the checks call it again and name what it raised
            pass
        return True

    def _eps(self, norm: str) -> float:
        """The eps a call of ``norm`` passes: the code's own where CAPABILITIES fix it."""
        return eps_of(resolve_variant(self.caps, norm)["eps"], NORM_EPS[norm])

    # ------------------------------------------------------------------ parameters
    def _layer_keys(self, layer: Layer) -> tuple[str, ...]:
        block = layer.kind == "block"
        keys = block_param_names(
            self.attn_bias, self.block_form["norm"] if block else "pre", W_o=self.attn["W_o"],
            b_1=self.b_1 if layer.ffn != "mlp" else self.linear_bias,
            b_2=self.b_2 if layer.ffn != "mlp" else self.linear_bias, normalization=layer.norm,
            ffn="swiglu" if layer.ffn == "swiglu" else "mlp", swiglu_bias=self.swiglu_bias,
            ln_affine=self.ln_affine)
        if not block and layer.norm == "rmsnorm" and not self.gain:
            keys = tuple(k for k in keys if not k.startswith(("ln1.", "ln2.")))
        return keys

    def _final_keys(self) -> tuple[str, ...]:
        if self.final_op == "layernorm":
            return ("final_ln.gamma", "final_ln.beta") if self.ln_affine else ()
        return ("final_ln.gamma",) if self.gain else ()

    def _init_params(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        shapes = {"embeddings.token.W": (V, H), "embeddings.position.W": (T_MAX, H)}
        for i, layer in enumerate(self.layers):
            shapes.update({f"layers.{i}.{k}": shape for k, shape in
                           block_param_shapes(self._layer_keys(layer), H, INTER).items()})
        shapes.update({k: (H,) for k in self._final_keys()})
        shapes["lm_head.W"] = (H, V)
        if self.loss_op == "linear_cross_entropy" or self.linear_bias:
            shapes["lm_head.b"] = (V,)
        out = {}
        for name, shape in shapes.items():
            if name.endswith("gamma"):
                out[name] = 1.0 + 0.1 * rng.standard_normal(shape)
            elif name.endswith("ffn.b_1"):  # ReLU's inputs spread wide: see KINK_BIAS
                out[name] = KINK_BIAS * rng.standard_normal(shape)
            elif len(shape) == 1:
                out[name] = 0.1 * rng.standard_normal(shape)
            else:
                scale = 1.0 if name.startswith("embeddings.") else shape[0] ** -0.5
                out[name] = scale * rng.standard_normal(shape)
        return out

    # ------------------------------------------------------------------ forward and backward
    def _norm_fwd(self, row, op: str, x, params, prefix: str):
        f = row[0]
        if op == "layernorm":
            return f(x, params.get(f"{prefix}.gamma"), params.get(f"{prefix}.beta"),
                     self._eps(op))
        return f(x, params.get(f"{prefix}.gamma"), self._eps(op))

    def _norm_bwd(self, row, dy, cache, prefix: str, grads: dict):
        dx, *dp = row[1](dy, cache)
        _put(grads, prefix, ("gamma", "beta"), dp)
        return dx

    def _ffn_fwd(self, kind: str, p: dict, x):
        if kind == "mlp":
            h, c1 = self.linear[0](x, p["ffn.W_1"], p.get("ffn.b_1"))
            a, ca = self.act[0](h)
            y, c2 = self.linear[0](a, p["ffn.W_2"], p.get("ffn.b_2"))
            return y, (c1, ca, c2)
        if kind == "swiglu":
            return self.swiglu_row[0](x, *(p.get(f"swiglu.{k}") for k in SWIGLU))
        return self.ffn_row[0](x, p["ffn.W_1"], p.get("ffn.b_1"), p["ffn.W_2"],
                               p.get("ffn.b_2"), activation=self.activation)

    def _ffn_bwd(self, kind: str, dy, cache, grads: dict) -> np.ndarray:
        if kind == "mlp":
            c1, ca, c2 = cache
            da, dW_2, db_2 = self.linear[1](dy, c2)
            (dh,) = self.act[1](da, ca)
            dx, dW_1, db_1 = self.linear[1](dh, c1)
            _put(grads, "ffn", ("W_1", "b_1", "W_2", "b_2"), (dW_1, db_1, dW_2, db_2))
            return dx
        row, names = (self.swiglu_row, SWIGLU) if kind == "swiglu" else (self.ffn_row, FFN)
        dx, *dp = row[1](dy, cache)
        _put(grads, "swiglu" if kind == "swiglu" else "ffn", names, dp)
        return dx

    def _block_fwd(self, layer: Layer, x, p: dict):
        if layer.kind == "block":
            kw = dict(self.block_form)
            if layer.ffn == "mlp":
                kw["activation"] = self.activation
            return self.block[0](x, p, n_heads=self.heads, eps=self._eps(layer.norm), **kw)
        norm = self.norm_rows[layer.norm]
        n1, c1 = self._norm_fwd(norm, layer.norm, x, p, "ln1")
        a, ca = self.attention[0](n1, *(p.get(f"attn.{k}") for k in ATTN),
                                  n_heads=self.heads, causal=self.attn["causal"],
                                  rope=self.attn["rope"])
        h = x + a
        n2, c2 = self._norm_fwd(norm, layer.norm, h, p, "ln2")
        f, cf = self._ffn_fwd(layer.ffn, p, n2)
        return h + f, (c1, ca, c2, cf)

    def _block_bwd(self, layer: Layer, dout, cache) -> tuple[np.ndarray, dict]:
        if layer.kind == "block":
            dx, grads = self.block[1](dout, cache)
            return dx, dict(grads)
        norm = self.norm_rows[layer.norm]
        c1, ca, c2, cf = cache
        grads: dict = {}
        dn2 = self._ffn_bwd(layer.ffn, dout, cf, grads)
        dh = dout + self._norm_bwd(norm, dn2, c2, "ln2", grads)
        dn1, *dattn = self.attention[1](dh, ca)
        _put(grads, "attn", ATTN, dattn)
        return dh + self._norm_bwd(norm, dn1, c1, "ln1", grads), grads

    def _forward(self, params, ids, labels):
        if self.f32 and any(v.dtype != np.float32 for v in params.values()):
            raise TypeError(f"composed model: {self.label}'s rows compute in float32: the "
                            "model runs at float32 params")
        x, c_emb = self.emb[0](ids, params["embeddings.token.W"])
        x, c_pos = self.pos[0](x, params["embeddings.position.W"])
        blocks = []
        for i, layer in enumerate(self.layers):
            prefix = f"layers.{i}."
            x, c = self._block_fwd(layer, x, {k[len(prefix):]: v for k, v in params.items()
                                       if k.startswith(prefix)})
            blocks.append(c)
        x, c_fin = self._norm_fwd(self.final_row, self.final_op, x, params, "final_ln")
        if self.loss_op == "linear_cross_entropy":
            loss, c_head = self.head[0](x, params["lm_head.W"], params.get("lm_head.b"), labels)
            c_loss = None
        else:
            logits, c_head = self.head[0](x, params["lm_head.W"], params.get("lm_head.b"))
            target = ids if self.loss_op == "next_token_cross_entropy" else labels
            loss, c_loss = self.loss[0](logits, target)
        return loss, (tuple(params), c_emb, c_pos, blocks, c_fin, c_head, c_loss)

    def _backward(self, dloss, cache) -> dict:
        names, c_emb, c_pos, blocks, c_fin, c_head, c_loss = cache
        grads: dict = {}
        if c_loss is None:
            dx, dW, db = self.head[1](dloss, c_head)
        else:
            (dlogits,) = self.loss[1](dloss, c_loss)
            dx, dW, db = self.head[1](dlogits, c_head)
        grads["lm_head.W"] = dW
        _put(grads, "lm_head", ("b",), (db,))
        dx = self._norm_bwd(self.final_row, dx, c_fin, "final_ln", grads)
        for i in reversed(range(len(self.layers))):
            dx, g = self._block_bwd(self.layers[i], dx, blocks[i])
            _put(grads, f"layers.{i}", g.keys(), g.values())
        dx, dW_pos = self.pos[1](dx, c_pos)
        grads["embeddings.position.W"] = dW_pos
        (grads["embeddings.token.W"],) = self.emb[1](dx, c_emb)
        return {k: grads.get(k) for k in names} | {k: v for k, v in grads.items()
                                                    if k not in names}

    def _dry_run(self) -> None:
        """One forward and backward at the declared params: a form the composition asks for
        that the implementation does not declare is a refusal here (its one line), never a
        check that reads not applicable.  Rows that compute in float32 whatever they are given
        (float32 gradients from float64 params, or float64 refused where float32 runs) make
        the model float32-only (:attr:`f32`): its params float32, a float64 call refused, so
        that the whole-model row judges it as it runs, above its stated rounding floor (mixed
        with the reference's float64 rows it would be float32 noise under float64
        differences: a red on correct code).  Anything else the code raises is left to the
        checks, which judge it."""
        batch = self.draw_batch(2, 4, np.random.default_rng(0))
        try:
            _, grads = self._refusing(self.params, batch)
            f32 = any(np.asarray(g).dtype == np.float32 for g in grads.values()
                      if isinstance(g, np.ndarray))
        except Refused:
            raise
        except (Exception, ImplementationAbort):  # noqa: BLE001 -- float64 refused:
            f32 = self._runs(batch, np.float32)  # float32-only, if float32 runs
        if f32:
            self.f32 = True
            self.params = {k: v.astype(np.float32) for k, v in self.params.items()}

    def _refusing(self, params, batch):
        try:
            return self.whole_model_loss_and_grads(params, batch)
        except NotApplicable as e:
            raise Refused(f"--model: the model composed of {self.label}'s rows calls a form it "
                          f"does not declare: {e}") from None

    def _runs(self, batch, dtype) -> bool:
        try:
            self._refusing({k: v.astype(dtype) for k, v in self.params.items()}, batch)
        except Refused:
            raise
        except (Exception, ImplementationAbort):  # noqa: BLE001 -- left to the checks (an
            return False  # exit inside a row included: their red, not a refusal here)
        return True

    def describe(self) -> str:
        """The model's form and where each row came from, one line (the verdict prints it)."""
        mine = [op for op, who in self.rows.items() if who == "implementation"]
        ref = [op for op, who in self.rows.items() if who == "reference"]
        attn = (", causal" if self.attn["causal"] else "") + (
            f", RoPE {self.attn['rope']}" if self.attn["rope"] else "")
        attn += " (its softmax inside)" if self.softmax_inside else ""
        blocks = "; ".join(
            "its block row (" + ", ".join(f"{k}={v}" for k, v in self.block_form.items() if v)
            + ")"
            if layer.kind == "block" else
            f"pre-norm of {layer.norm}, attention{attn}, "
            f"{f'linear + {self.act_op}' if layer.ffn == 'mlp' else layer.ffn}"
            for layer in self.layers)
        return (f"composed model (H={H}, {self.heads} head(s), V={V}; blocks: {blocks}; "
                f"final {self.final_op}, {self.loss_op}): the implementation's rows "
                f"{', '.join(mine)}; the reference's {', '.join(ref) or 'none'}"
                + (f"; provided but not used: {', '.join(map(self._unused, self.unused))}"
                   if self.unused else ""))

    def _unused(self, op: str) -> str:
        return f"{op} ({self.unplaced[op]})" if op in self.unplaced else op

    def look_next(self) -> str:
        """Where a red of this model is: in the implementation's rows -- the reference's are
        the suite's own, verified row by row -- whatever the names of the tensors that
        disagree say (a gainless norm has none: its wrong dx shows on the tensors before it)."""
        mine = [op for op, who in self.rows.items() if who == "implementation"]
        return (f"the model is composed of the implementation's rows {', '.join(mine)} and "
                f"the reference's (the suite's own): look next at those rows (minibert check "
                f"{self.label} --ops {' '.join(mine)})")


def _gradients(op: str, out) -> tuple:
    """A backward's result as the model unpacks it: one gradient per differentiable input of
    the row (a block's: ``(dx, grads)``), else an AssertionError naming the row."""
    n = 2 if op == "block" else len(OPS[op].inputs)
    if not isinstance(out, (tuple, list)) or len(out) != n:
        got = (f"{type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list))
               else type(out).__name__)
        raise AssertionError(f"composed model: {OPS[op].pair[1]} returned {got}, expected "
                             f"{OPS[op].returns()}")
    return tuple(out)


def _softmax_unplaceable(caps: dict, causal: bool) -> str | None:
    """Why the implementation's softmax cannot compute the composed attention's probabilities,
    or None.  A causal attention masks its scores: a softmax that does not claim a mask is
    not called with one.  A declared softmax_eps guard: its row accepts two derivatives of the
    guarded forward (the row maximum held constant, as code writes it, or the exact one,
    minibert_spec.protocol.guards.softmax_adjustment), and the first differs by eps-sized
    terms from the one the model's finite differences measure -- a red on correct code."""
    if causal and not caps["key_mask"]:
        return "the causal attention masks its scores; it does not claim a mask"
    if caps["guards"].get("softmax_eps"):
        return ("its declared softmax_eps: the max-held derivative its row accepts is not "
                "the one the model's finite differences measure")
    return None


def _masked_as_scores(forward, backward):
    """A softmax row as the reference attention calls it (``_attention_forward``'s
    ``softmax``): the attention's mask, broadcast ([T, T] causal, [B, 1, 1, T] keys), given in
    the scores' shape, as the protocol's softmax takes it; its dS copied (the attention scales
    it in place, and the implementation may keep the array it returned)."""

    def masked(scores, mask):
        if mask is not None:
            mask = np.ascontiguousarray(np.broadcast_to(mask, scores.shape))
        return forward(scores, mask)

    def copied(dp, cache):
        (dscores,) = backward(dp, cache)
        return (np.array(dscores),)

    return masked, copied


def _put(grads: dict, prefix: str, names, gs) -> None:
    """The gradients of the parameters ``prefix.<name>`` the model has (None: an absent piece,
    e.g. no beta)."""
    grads.update({f"{prefix}.{n}": g for n, g in zip(names, gs) if g is not None})


def composed_model(obj, label: str | None = None) -> ComposedModel:
    """The whole model composed of ``obj``'s op rows (:class:`ComposedModel`); a ValueError in
    one line when it provides none a model can use, or the composition needs a form it does
    not declare."""
    return ComposedModel(obj, label)
