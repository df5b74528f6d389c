"""Cases for tests/test_as_mlx.py, run in a subprocess (the routing is process-wide).

Each case runs once on real MLX, then again after ``tapescope.as_mlx()`` with MLX's own
parameters and inputs loaded (``python tests/as_mlx_cases.py <group>`` prints one JSON line
per case: name, max |difference|, the reference's scale, or the error). The comparison is
made by the test, so a case that raises is a failure there, not here.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback

import numpy as np

# Layers built with their constructor's defaults; the required arguments and the input shape.
# name -> (args, kwargs, input shapes (float32 normal), int inputs {index: high}, eval mode)
B, L, D = 2, 5, 8
LAYERS = {
    "Linear": ((D, 4), {}, [(B, D)]),
    "Bilinear": ((D, 6, 4), {}, [(B, D), (B, 6)]),
    "Identity": ((), {}, [(B, D)]),
    "Embedding": ((10, D), {}, [("int", (B, L), 10)]),
    "LayerNorm": ((D,), {}, [(B, L, D)]),
    "RMSNorm": ((D,), {}, [(B, L, D)]),
    "GroupNorm": ((2, D), {}, [(B, L, D)]),
    "BatchNorm": ((D,), {}, [(B, L, D)]),
    "InstanceNorm": ((D,), {}, [(B, L, D)]),
    "Dropout": ((), {}, [(B, L, D)]),
    "Dropout2d": ((), {}, [(B, L, L, D)]),
    "Dropout3d": ((), {}, [(B, L, L, L, D)]),
    "PReLU": ((), {}, [(B, L, D)]),
    "GLU": ((), {}, [(B, L, D)]),
    "MultiHeadAttention": ((D, 2), {}, [(B, L, D), (B, 6, D), (B, 6, D)]),
    "TransformerEncoderLayer": ((D, 2), {}, [(B, L, D), None]),
    "TransformerDecoderLayer": ((D, 2), {}, [(B, L, D), (B, 6, D), None, None]),
    "TransformerEncoder": ((2, D, 2), {}, [(B, L, D), None]),
    "TransformerDecoder": ((2, D, 2), {}, [(B, L, D), (B, 6, D), None, None]),
    "Transformer": ((), dict(dims=D, num_heads=2, num_encoder_layers=2, num_decoder_layers=2),
                    [(B, L, D), (B, 6, D), None, None, None]),
    "RNN": ((D, 6), {}, [(B, L, D)]),
    "GRU": ((D, 6), {}, [(B, L, D)]),
    "LSTM": ((D, 6), {}, [(B, L, D)]),
    "RoPE": ((D,), {}, [(B, 2, L, D)]),
    "ALiBi": ((), {}, [(B, 2, L, L)]),
    "SinusoidalPositionalEncoding": ((D,), {}, [(B, L)]),
    "MaxPool1d": ((2,), {}, [(B, 6, D)]),
    "MaxPool2d": ((2,), {}, [(B, 6, 6, D)]),
    "MaxPool3d": ((2,), {}, [(B, 4, 4, 4, D)]),
    "AvgPool1d": ((2,), {}, [(B, 6, D)]),
    "AvgPool2d": ((2,), {}, [(B, 6, 6, D)]),
    "AvgPool3d": ((2,), {}, [(B, 4, 4, 4, D)]),
    "Upsample": ((2.0,), {}, [(B, 3, 3, D)]),
    "Conv1d": ((D, 4, 3), {}, [(B, 7, D)]),
    "Conv2d": ((D, 4, 3), {}, [(B, 6, 6, D)]),
    "Conv3d": ((D, 4, 3), {}, [(B, 4, 4, 4, D)]),
    "ConvTranspose1d": ((D, 4, 3), {}, [(B, 7, D)]),
    "ConvTranspose2d": ((D, 4, 3), {}, [(B, 5, 5, D)]),
    "ConvTranspose3d": ((D, 4, 3), {}, [(B, 3, 3, 3, D)]),
    "AllToShardedLinear": ((D, 4), {}, [(B, D)]),
    "ShardedToAllLinear": ((D, 4), {}, [(B, D)]),
    # quantized layers: rows of 64 (MLX's default group size); their weights load as MLX's
    # packed codes, scales and biases, so the two runs share the same quantization
    "QuantizedLinear": ((64, 4), {}, [(B, 64)]),
    "QuantizedEmbedding": ((10, 64), {}, [("int", (B, L), 10)]),
    "QuantizedAllToShardedLinear": ((64, 4), {}, [(B, 64)]),
    "QuantizedShardedToAllLinear": ((64, 4), {}, [(B, 64)]),
}
# Every mlx.nn layer not in LAYERS (nor an activation, built without arguments) is here, why.
NOT_HERE = {
    "QQLinear": "MLX 0.32.4's own CPU raises for it ([QQMatmul] NYI for the general case)",
    "Module": "the base class", "Sequential": "a container (see the MLP cases)",
    "FullyShardedModule": "wraps another module over a multi-process group",
}
EVAL_ONLY = {"Dropout", "Dropout2d", "Dropout3d", "Transformer", "TransformerEncoderLayer",
             "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder"}


def _to_np(tree):
    from mlx.utils import tree_map

    return tree_map(lambda a: np.array(a), tree)


def _from_np(mx, tree):
    from mlx.utils import tree_map

    return tree_map(lambda a: mx.array(a), tree)


def _inputs(spec, seed):
    rng = np.random.default_rng(seed)
    out = []
    for s in spec:
        if s is None:
            out.append(None)
        elif s[0] == "int":
            out.append(rng.integers(0, s[2], s[1]).astype(np.int32))
        else:
            out.append(rng.standard_normal(s).astype(np.float32))
    return out


def _activation_names(nn):
    import inspect

    from mlx.nn.layers import activations

    return sorted(n for n, c in vars(activations).items()
                  if inspect.isclass(c) and issubclass(c, nn.Module) and c is not nn.Module
                  and n not in LAYERS)


def _build(nn, name):
    args, kwargs, _ = LAYERS.get(name, ((), {}, None))
    m = getattr(nn, name)(*args, **kwargs)
    if name in EVAL_ONLY:
        m.eval()
    return m


def _out(mx, y):
    if isinstance(y, (tuple, list)):
        y = y[0]
    mx.eval(y)
    return np.array(y)


def layer_cases():
    """(name, run(mx, nn, params or None) -> (params, output))."""
    import mlx.nn as nn

    names = list(LAYERS) + _activation_names(nn)
    cases = []
    for name in names:
        spec = LAYERS.get(name, (None, None, [(B, L, D)]))[2]

        def run(mx, nn, params, name=name, spec=spec):
            m = _build(nn, name)
            if params is not None:
                m.update(_from_np(mx, params))
            xs = [None if x is None else mx.array(x) for x in _inputs(spec, 1)]
            start = _to_np(m.parameters())
            y = _out(mx, m(*xs))

            def loss(params, x0):  # the gradient of a weighted sum: parameters and input 0
                m.update(params)
                out = m(x0, *xs[1:])
                out = out[0] if isinstance(out, (tuple, list)) else out
                return (out * mx.cos(mx.arange(out.size).reshape(out.shape))).sum()

            from mlx.utils import tree_flatten

            float_in = xs[0].dtype == mx.float32
            if not float_in and not tree_flatten(m.trainable_parameters()):
                return start, {"out": y}  # nothing to differentiate (a frozen quantized table)
            grads = mx.grad(loss, argnums=(0, 1) if float_in else 0)(m.trainable_parameters(),
                                                                     xs[0])
            return start, {"out": y, "grad": _to_np(grads)}

        cases.append(("layer:" + name, run))
    return cases


def loss_cases():
    rng = np.random.default_rng(2)
    p = rng.standard_normal((6, 5)).astype(np.float32)
    t = rng.standard_normal((6, 5)).astype(np.float32)
    cls = rng.integers(0, 5, (6,)).astype(np.int32)
    prob = 1 / (1 + np.exp(-p))
    binary = (rng.random((6, 5)) > 0.5).astype(np.float32)
    var = np.abs(t) + 0.1
    sign = np.sign(t).astype(np.float32)
    calls = {
        "binary_cross_entropy": lambda L, A: L.binary_cross_entropy(A(p), A(binary)),
        "binary_cross_entropy(probs)": lambda L, A: L.binary_cross_entropy(
            A(prob), A(binary), with_logits=False),
        "cosine_similarity_loss": lambda L, A: L.cosine_similarity_loss(A(p), A(t)),
        "cross_entropy": lambda L, A: L.cross_entropy(A(p), A(cls)),
        "cross_entropy(probs,smoothing)": lambda L, A: L.cross_entropy(
            A(p), A(prob / prob.sum(-1, keepdims=True)), label_smoothing=0.0),
        "cross_entropy(smoothing)": lambda L, A: L.cross_entropy(A(p), A(cls), label_smoothing=0.1),
        "gaussian_nll_loss": lambda L, A: L.gaussian_nll_loss(A(p), A(t), A(var)),
        "hinge_loss": lambda L, A: L.hinge_loss(A(p), A(sign)),
        "huber_loss": lambda L, A: L.huber_loss(A(p), A(t)),
        "kl_div_loss": lambda L, A: L.kl_div_loss(A(np.log(prob)), A(t)),
        "l1_loss": lambda L, A: L.l1_loss(A(p), A(t)),
        "log_cosh_loss": lambda L, A: L.log_cosh_loss(A(p), A(t)),
        "margin_ranking_loss": lambda L, A: L.margin_ranking_loss(A(p[:, 0]), A(t[:, 0]),
                                                                  A(sign[:, 0])),
        "mse_loss": lambda L, A: L.mse_loss(A(p), A(t)),
        "nll_loss": lambda L, A: L.nll_loss(A(np.log(prob)), A(cls)),
        "smooth_l1_loss": lambda L, A: L.smooth_l1_loss(A(p), A(t)),
        "triplet_loss": lambda L, A: L.triplet_loss(A(p), A(t), A(prob)),
    }

    def case(fn):
        def run(mx, nn, params):
            return None, _out(mx, fn(nn.losses, mx.array))
        return run

    return [("loss:" + n, case(f)) for n, f in calls.items()]


def _mlp(nn, dims=(6, 16, 16, 3)):
    layers = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _train(mx, nn, optim, opt, params, steps, x, y):
    model = _mlp(nn, (x.shape[1], 32, 32, int(y.max()) + 1))
    if params is not None:
        model.update(_from_np(mx, params))
    start = _to_np(model.parameters())
    X, Y = mx.array(x), mx.array(y)

    def loss_fn(m, X, Y):
        return nn.losses.cross_entropy(m(X), Y, reduction="mean")

    step = nn.value_and_grad(model, loss_fn)
    losses = []
    for _ in range(steps):
        loss, grads = step(model, X, Y)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
        losses.append(loss.item())
    return start, np.array(losses)


def _data(n=64, d=6, k=3, seed=3, noise=0.0):
    """Inputs and class labels of a random linear map (plus ``noise`` on its logits)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.standard_normal((d, k)).astype(np.float32)
    logits = x @ w + noise * rng.standard_normal((n, k))
    return x, logits.argmax(1).astype(np.int32)


OPTIMIZERS = {
    "SGD": lambda o: o.SGD(0.1),
    "SGD(momentum,nesterov)": lambda o: o.SGD(0.1, momentum=0.9, weight_decay=1e-3,
                                              nesterov=True),
    "RMSprop": lambda o: o.RMSprop(1e-2),
    "Adagrad": lambda o: o.Adagrad(1e-1),
    "AdaDelta": lambda o: o.AdaDelta(1.0),
    "Adam": lambda o: o.Adam(1e-2),
    "Adam(bias_correction)": lambda o: o.Adam(1e-2, bias_correction=True),
    "AdamW": lambda o: o.AdamW(1e-2),
    "Adamax": lambda o: o.Adamax(1e-2),
    "Lion": lambda o: o.Lion(1e-3),
    "Adafactor": lambda o: o.Adafactor(),
    "Muon": lambda o: o.Muon(1e-2),
    "MultiOptimizer": lambda o: o.MultiOptimizer(
        [o.Adam(1e-2), o.SGD(0.1)], [lambda name, w: name.endswith("bias")]),
    "Adam(cosine_decay)": lambda o: o.Adam(o.cosine_decay(1e-2, 10)),
    "SGD(join_schedules)": lambda o: o.SGD(o.join_schedules(
        [o.linear_schedule(0.0, 0.1, 3), o.exponential_decay(0.1, 0.9)], [3])),
    "SGD(step_decay)": lambda o: o.SGD(o.step_decay(0.1, 0.5, 3)),
}


def optimizer_cases():
    x, y = _data()

    def case(make):
        def run(mx, nn, params):
            import mlx.optimizers as optim

            return _train(mx, nn, optim, make(optim), params, 10, x, y)
        return run

    return [("optim:" + n, case(f)) for n, f in OPTIMIZERS.items()]


def mlp_curve_case(steps):
    x, y = _data(n=256, d=16, k=4, seed=5, noise=3.0)

    def run(mx, nn, params):
        import mlx.optimizers as optim

        return _train(mx, nn, optim, optim.Adam(3e-3), params, steps, x, y)

    return [("mlp_curve", run)]


def compiled_step_case():
    """MLX's usual training loop: a step compiled with the model's and optimizer's state as
    captured inputs and outputs, gradient clipping, minibatches."""
    x, y = _data(n=128, d=10, k=3, seed=6)

    def run(mx, nn, params):
        from functools import partial

        import mlx.optimizers as optim

        model = nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.LayerNorm(32), nn.Dropout(0.0),
                              nn.Linear(32, 3))
        if params is not None:
            model.update(_from_np(mx, params))
        start = _to_np(model.parameters())
        opt = optim.AdamW(1e-2)
        state = [model.state, opt.state]

        def loss_fn(m, x, y):
            return nn.losses.cross_entropy(m(x), y, reduction="mean")

        @partial(mx.compile, inputs=state, outputs=state)
        def step(x, y):
            loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
            grads, _ = optim.clip_grad_norm(grads, 1.0)
            opt.update(model, grads)
            return loss

        X, Y, losses = mx.array(x), mx.array(y), []
        for _ in range(5):
            for j in range(0, 128, 32):
                loss = step(X[j:j + 32], Y[j:j + 32])
                mx.eval(state)
                losses.append(loss.item())
        return start, np.array(losses)

    return [("compiled_step", run)]


INITS = {
    "constant": lambda I: I.constant(0.5), "normal": lambda I: I.normal(0.1, 2.0),
    "uniform": lambda I: I.uniform(-2.0, 3.0), "identity": lambda I: I.identity(),
    "glorot_normal": lambda I: I.glorot_normal(), "glorot_uniform": lambda I: I.glorot_uniform(),
    "he_normal": lambda I: I.he_normal(), "he_uniform": lambda I: I.he_uniform(),
    "sparse": lambda I: I.sparse(0.5), "orthogonal": lambda I: I.orthogonal(),
}


def module_cases():
    """mlx.nn.init's initializers (same seed, same draws) and Module utilities."""
    def init(make):
        def run(mx, nn, params):
            mx.random.seed(7)
            return None, _out(mx, make(nn.init)(mx.zeros((5, 5))))
        return run

    def set_dtype(mx, nn, params):  # half-precision parameters, bfloat16 forward
        m = _mlp(nn, (D, 16, 4))
        if params is not None:
            m.update(_from_np(mx, params))
        start = _to_np(m.parameters())
        m.set_dtype(mx.bfloat16)
        y = m(mx.array(_inputs([(3, D)], 8)[0]).astype(mx.bfloat16))
        return start, _out(mx, y.astype(mx.float32))

    def frozen_checkpointed(mx, nn, params):  # freeze, trainable_parameters, checkpoint=True
        m = nn.TransformerEncoder(2, D, 2, checkpoint=True)
        m.eval()
        if params is not None:
            m.update(_from_np(mx, params))
        start = _to_np(m.parameters())
        m.layers[0].freeze()
        x = mx.array(_inputs([(B, L, D)], 9)[0])
        loss, grads = nn.value_and_grad(m, lambda m, x: (m(x, None) ** 2).mean())(m, x)
        return start, {"loss": np.array(loss), "grads": _to_np(grads)}

    return ([("init:" + n, init(f)) for n, f in INITS.items()]
            + [("module:set_dtype", set_dtype), ("module:freeze_checkpoint", frozen_checkpointed)])


def cnn_curve_case(steps):
    """A small CNN (Conv2d, ReLU, MaxPool2d, Linear) on synthetic 8x8 images, trained with
    SGD + momentum."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 8, 8, 1)).astype(np.float32)
    y = (x[:, :4].mean((1, 2, 3)) > x[:, 4:].mean((1, 2, 3))).astype(np.int32)

    def run(mx, nn, params):
        import mlx.optimizers as optim

        model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              _Flatten(nn)(), nn.Linear(32, 2))
        if params is not None:
            model.update(_from_np(mx, params))
        start = _to_np(model.parameters())
        opt = optim.SGD(0.05, momentum=0.9)
        step = nn.value_and_grad(model, lambda m, x, y: nn.losses.cross_entropy(
            m(x), y, reduction="mean"))
        X, Y, losses = mx.array(x), mx.array(y), []
        for _ in range(steps):
            loss, grads = step(model, X, Y)
            opt.update(model, grads)
            mx.eval(model.parameters(), opt.state)
            losses.append(loss.item())
        return start, np.array(losses)

    return [("cnn_curve", run)]


def _Flatten(nn):
    class Flatten(nn.Module):
        def __call__(self, x):
            return x.reshape(x.shape[0], -1)
    return Flatten


def tree_cases():
    def run(mx, nn, params):
        from mlx.utils import (tree_flatten, tree_map, tree_map_with_path, tree_merge,
                               tree_reduce, tree_unflatten)

        tree = {"a": [mx.array([1.0, 2.0]), (mx.array(3.0), {"b": mx.array([4.0])})],
                "c": mx.array([[5.0, 6.0]])}
        flat = tree_flatten(tree)
        back = tree_unflatten(flat)
        doubled = tree_map(lambda v: v * 2, back)
        paths = tree_map_with_path(lambda p, v: v + len(p), tree)
        total = tree_reduce(lambda acc, v: acc + v.sum(), doubled, mx.array(0.0))
        merged = tree_merge({"x": mx.array(1.0)}, {"y": mx.array([2.0])})
        types = {type(v).__module__ for _, v in flat + tree_flatten(paths) + tree_flatten(merged)}
        vals = [float(total.item())] + [float(v.sum().item()) for _, v in tree_flatten(paths)]
        vals += [len(flat), sorted(merged)]
        return None, {"values": vals, "array_types": sorted(types)}

    return [("tree", run)]


def saved_model_case(path):
    def run(mx, nn, params):
        model = _mlp(nn, (D, 16, 4))
        if params is None:  # real MLX: save its model with MLX's own save_safetensors
            from mlx.utils import tree_flatten

            mx.save_safetensors(path, dict(tree_flatten(model.parameters())))
        else:
            model.load_weights(path)
        x = mx.array(_inputs([(3, D)], 4)[0])
        return _to_np(model.parameters()), _out(mx, model(x))

    return [("safetensors", run)]


def _diff(a, b):
    if isinstance(a, dict) and "values" in a:
        return (0.0 if a["values"] == b["values"] else math.inf), 1.0
    from mlx.utils import tree_flatten

    if isinstance(a, np.ndarray) or not isinstance(a, (dict, list, tuple)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return math.inf, 1.0
        return float(np.abs(a - b).max(initial=0.0)), float(np.abs(a).max(initial=0.0))
    fa, fb = dict(tree_flatten(a)), dict(tree_flatten(b))
    if fa.keys() != fb.keys():
        return math.inf, 1.0
    pairs = [_diff(fa[k], fb[k]) for k in fa]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def main(groups):
    import mlx.core as mx_real  # MLX imported first: as_mlx() must re-import mlx.nn after it
    import mlx.nn as nn

    import tapescope

    cases, path = [], os.environ.get("AS_MLX_TMP", "/tmp") + f"/as_mlx_{os.getpid()}.safetensors"
    if "layers" in groups:
        cases += layer_cases()
    if "losses" in groups:
        cases += loss_cases()
    if "optimizers" in groups:
        cases += optimizer_cases()
    if "optimizers" in groups:
        cases += compiled_step_case()
    if "tree" in groups:
        cases += tree_cases() + module_cases()
    if "safetensors" in groups:
        cases += saved_model_case(path)
    if "mlp" in groups:
        steps = int(os.environ.get("AS_MLX_STEPS", "100"))
        cases += mlp_curve_case(steps) + cnn_curve_case(steps)
    ref = {}
    for name, run in cases:
        mx_real.random.seed(0)
        ref[name] = run(mx_real, nn, None)
    tapescope.as_mlx()
    import mlx.core as mx

    assert mx.__name__ == "tapescope.core", mx.__name__
    for name, run in cases:
        rec = {"name": name}
        try:
            mx.random.seed(0)
            params, out = run(mx, nn, ref[name][0])
            rec["err"], rec["scale"] = _diff(ref[name][1], out)
            if name.endswith("_curve"):
                rec["mlx"], rec["tapescope"] = ref[name][1].tolist(), out.tolist()
            if name.startswith("optim:"):
                rec["rel"] = float(np.max(np.abs(ref[name][1] - out) / np.abs(ref[name][1])))
            if name == "tree":
                rec["array_types"] = out["array_types"]
        except Exception as err:  # reported to the test, which fails on it
            rec["error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"
        print(json.dumps(rec), flush=True)
    if os.path.exists(path):
        os.remove(path)


if __name__ == "__main__":
    main(sys.argv[1:])
