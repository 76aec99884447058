"""The PyTorch-style API: tensors with autograd, ``textnet.nn.Module`` and its layers,
``textnet.nn.functional``, ``textnet.optim``. Every op's gradient is checked against central differences
in float64 on the CPU; a small MLP's training steps against the same math in NumPy."""

from collections import OrderedDict

import numpy as np
import pytest

import textnet
import textnet.nn.functional as F
from textnet import nn


def leaf(array, requires_grad=True):
    return textnet.tensor(np.array(array, dtype=np.float64), requires_grad=requires_grad)


def check_gradients(fn, *arrays, eps=1e-6):
    """Each input's gradient of Σ fn(inputs)·W (W fixed at random, so that every output counts) against
    central differences."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    inputs = [leaf(a) for a in arrays]
    out = fn(*inputs)
    weights = np.asarray(np.random.default_rng(1).standard_normal(out.shape))
    (out * textnet.tensor(weights)).sum().backward()

    def loss(values):
        with textnet.no_grad():
            return float((fn(*[leaf(v, False) for v in values]).numpy() * weights).sum())

    for i, array in enumerate(arrays):
        numeric = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            moved = [a.copy() for a in arrays]
            moved[i][index] += eps
            up = loss(moved)
            moved[i][index] -= 2 * eps
            numeric[index] = (up - loss(moved)) / (2 * eps)
        assert inputs[i].grad is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(inputs[i].grad.numpy(), numeric, rtol=1e-5, atol=1e-7, err_msg=f"input {i}")


R = np.random.default_rng(0)


def normal(*shape):
    return R.standard_normal(shape)


def positive(*shape):
    return R.uniform(0.5, 2.0, shape)


IDS = textnet.tensor([[1, 0, 3], [2, 2, 4]])

GRADIENT_CASES = {
    "add broadcast": (lambda a, b: a + b, normal(2, 3), normal(3)),
    "sub broadcast": (lambda a, b: a - b, normal(2, 3), normal(2, 1)),
    "mul broadcast": (lambda a, b: a * b, normal(2, 3), normal(1, 3)),
    "div broadcast": (lambda a, b: a / b, normal(2, 3), positive(3)),
    "scalars on the right": (lambda a: (a + 1.5) * 2.0 - 0.25, normal(2, 3)),
    "scalars on the left": (lambda a: 3.0 - 2.0 * (1.0 + a), normal(2, 3)),
    "scalar divided by": (lambda a: 2.0 / a, positive(2, 3)),
    "divided by scalar": (lambda a: a / 4.0, normal(2, 3)),
    "neg": (lambda a: -a, normal(2, 3)),
    "pow": (lambda a: a**3, normal(2, 3)),
    "matmul": (lambda a, b: a @ b, normal(2, 3), normal(3, 4)),
    "batched matmul": (lambda a, b: a @ b, normal(2, 2, 3), normal(2, 3, 4)),
    "sum all": (lambda a: a.sum(), normal(2, 3)),
    "sum dim": (lambda a: a.sum(1), normal(2, 3, 2)),
    "sum dims keepdim": (lambda a: a.sum((0, 2), keepdim=True), normal(2, 3, 2)),
    "mean all": (lambda a: a.mean(), normal(2, 3)),
    "mean dim": (lambda a: a.mean(dim=-1), normal(2, 3)),
    "softmax last": (lambda a: a.softmax(-1), normal(2, 4)),
    "softmax first": (lambda a: a.softmax(dim=0), normal(3, 2)),
    "log_softmax": (lambda a: a.log_softmax(-1), normal(2, 4)),
    "relu": (lambda a: a.relu(), np.array([[-1.0, 0.5, 2.0], [0.3, -0.2, -3.0]])),
    "gelu": (lambda a: F.gelu(a), normal(2, 3)),
    "tanh": (lambda a: a.tanh(), normal(2, 3)),
    "sigmoid": (lambda a: a.sigmoid(), normal(2, 3)),
    "exp": (lambda a: a.exp(), normal(2, 3)),
    "log": (lambda a: a.log(), positive(2, 3)),
    "view": (lambda a: a.view(3, -1) * a.reshape(3, 2), normal(2, 3)),
    "transpose": (lambda a: a.transpose(0, 1), normal(2, 3)),
    "permute": (lambda a: a.permute(2, 0, 1), normal(2, 3, 2)),
    "slice": (lambda a: a[:, 1:3], normal(2, 4)),
    "index and ellipsis": (lambda a: a[1, ..., -2:], normal(2, 3, 4)),
    "narrow": (lambda a: a.narrow(1, 1, 2), normal(2, 4)),
    "index by ids": (lambda a: a[IDS], normal(5, 3)),
    "index a 4-D tensor by negative and repeated ids": (
        lambda a: a[textnet.tensor([2, -1, 0, 2])],
        normal(3, 2, 1, 2),
    ),
    "index a 1-D tensor by ids": (lambda a: a[textnet.tensor([[0, 3], [-4, 1]])], normal(4)),
    "split": (lambda a: a.split(2, dim=1)[1] * a.split([1, 3], dim=1)[1][:, :2], normal(2, 4)),
    "unsqueeze squeeze flatten": (lambda a: a.unsqueeze(0).squeeze(0).flatten(), normal(2, 3)),
    "cat": (lambda a, b: textnet.cat([a, b], dim=1), normal(2, 3), normal(2, 1)),
    "linear": (lambda x, w, b: F.linear(x, w, b), normal(2, 3), normal(4, 3), normal(4)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, 4, w, b), normal(3, 4), normal(4), normal(4)),
    "embedding": (lambda w: F.embedding(IDS, w), normal(5, 3)),
    "cross_entropy": (lambda z: F.cross_entropy(z, textnet.tensor([0, 2, 1])), normal(3, 4)),
    "cross_entropy ignore_index": (
        lambda z: F.cross_entropy(z, textnet.tensor([0, -1, 3]), ignore_index=-1),
        normal(3, 4),
    ),
    "cross_entropy classes on axis 1": (
        lambda z: F.cross_entropy(z, textnet.tensor([[0, 2], [1, 1]])),
        normal(2, 3, 2),
    ),
    "mse_loss": (lambda a, b: F.mse_loss(a, b), normal(2, 3), normal(2, 3)),
    "attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), normal(1, 2, 3, 4), normal(1, 2, 3, 4),
                  normal(1, 2, 3, 4)),
    "causal attention": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        normal(1, 2, 3, 4),
        normal(1, 2, 3, 4),
        normal(1, 2, 3, 4),
    ),
}


@pytest.mark.parametrize("case", list(GRADIENT_CASES))
def test_gradient_matches_finite_differences(case):
    fn, *arrays = GRADIENT_CASES[case]
    check_gradients(fn, *arrays)


def test_forward_values_match_numpy():
    a, b = normal(2, 3), normal(3, 4)
    x, y = leaf(a, False), leaf(b, False)
    np.testing.assert_allclose((x @ y).numpy(), a @ b, rtol=1e-12)
    shifted = a - a.max(-1, keepdims=True)
    np.testing.assert_allclose(x.softmax(-1).numpy(), np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True))
    np.testing.assert_allclose(x.log_softmax(0).numpy(), a - np.log(np.exp(a).sum(0, keepdims=True)))
    np.testing.assert_allclose(x.mean(1).numpy(), a.mean(1))
    mu, var = a.mean(-1, keepdims=True), a.var(-1, keepdims=True)
    np.testing.assert_allclose(F.layer_norm(x, 3).numpy(), (a - mu) / np.sqrt(var + 1e-5), rtol=1e-10)
    logits, targets = normal(4, 5), np.array([0, 4, 2, 1])
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    loss = F.cross_entropy(leaf(logits, False), textnet.tensor(targets)).item()
    assert loss == pytest.approx(-log_p[np.arange(4), targets].mean(), rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_indexing_by_a_tensor_of_ids_is_numpys_along_the_first_axis(dtype):
    values = (R.standard_normal((5, 2, 3, 4)) * 100).astype(dtype)
    for ids in ([3, 0, 3, -1], [[4, -5], [2, 2]], [[[1]]], 2, []):
        key = np.array(ids, dtype=np.int64)
        # A 0-d key (one id, which drops the axis, as a whole number would) by indexing ids.
        ids_tensor = textnet.tensor(key.reshape(1, -1))[0, 0] if key.ndim == 0 else textnet.tensor(key)
        assert ids_tensor.shape == key.shape
        for x in (values, values[:, 0, 0, 0], values[:, :, 1, 0]):
            picked = textnet.tensor(x)[ids_tensor]
            assert picked.dtype == textnet.tensor(x).dtype and picked.device == "cpu"
            assert picked.shape == key.shape + x.shape[1:]
            np.testing.assert_array_equal(picked.numpy(), x[key])
    # int64 labels keep every bit, past float64's 2⁵³.
    labels = textnet.tensor(np.array([2**62 + 1, -(2**60) - 3, 7]))
    assert labels[textnet.tensor([1, 0, 1])].numpy().tolist() == [-(2**60) - 3, 2**62 + 1, -(2**60) - 3]


def test_indexing_by_ids_adds_the_gradients_of_repeated_ids_and_keeps_the_tensors_flags():
    x = leaf([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    picked = x[textnet.tensor([2, 0, 2])]
    assert picked.requires_grad and not picked.is_leaf
    (picked * textnet.tensor(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[3.0, 4.0], [0.0, 0.0], [6.0, 8.0]])
    plain = leaf([1.0, 2.0], requires_grad=False)
    assert not plain[textnet.tensor([1])].requires_grad and not plain.requires_grad
    with textnet.no_grad():
        assert not x[textnet.tensor([0])].requires_grad
    # A computed tensor indexes too, its gradient flowing back through it.
    x.grad = None
    (x * 3.0)[textnet.tensor([1])].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0.0, 0.0], [3.0, 3.0], [0.0, 0.0]])


def test_indexing_by_ids_refuses_what_pytorch_refuses_with_index_errors():
    x = textnet.zeros(5, 3)
    with pytest.raises(IndexError, match=r"^index: id 5 at position \[1\] is out of range for axis 0 of size 5$"):
        x[textnet.tensor([0, 5])]
    with pytest.raises(IndexError, match=r"^index: id -6 at position \[0, 1\] is out of range for axis 0 of size 5$"):
        x[textnet.tensor([[1, -6]])]
    with pytest.raises(IndexError, match=r"out of range for axis 0 of size 5"):
        textnet.tensor(np.arange(5))[textnet.tensor([9])]
    with pytest.raises(IndexError, match=r"^index: tensors used as indices must hold int64 ids, got float32 \[2\]$"):
        x[textnet.tensor([0.0, 1.0])]
    with pytest.raises(IndexError, match=r"^index: too many indices for shape \[\]"):
        textnet.tensor([1.0]).sum()[textnet.tensor([0])]
    with pytest.raises(IndexError, match=r"whole key"):
        x[textnet.tensor([0]), 1:]


def test_operators_broadcast_and_take_scalars_on_both_sides():
    a = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    b = np.array([2.0, 4.0, 8.0], dtype=np.float32)
    x, y = textnet.tensor(a), textnet.tensor(b)
    for got, want in [
        (x + y, a + b), (x - y, a - b), (x * y, a * b), (x / y, a / b),
        (x + 1, a + 1), (1 + x, 1 + a), (x - 1, a - 1), (1 - x, 1 - a),
        (x * 2, a * 2), (2 * x, 2 * a), (x / 2, a / 2), (2 / x, 2 / a),
        (-x, -a), (x**2, a**2), (x @ y.view(3, 1), a @ b.reshape(3, 1)),
    ]:
        assert got.dtype == textnet.float32
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    assert (x + y).shape == (2, 3)
    assert x[:, 1:].shape == (2, 2) and x[1].shape == (3,) and x[-1, -1].item() == 6.0
    np.testing.assert_array_equal(x[:, 0:2].numpy(), a[:, 0:2])
    np.testing.assert_array_equal(x[..., 1].numpy(), a[..., 1])


def test_tensors_from_arrays_in_any_memory_order_keep_their_elements():
    # A C-order array is copied at once; Fortran-order and strided ones are walked in row-major order.
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ids = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    for made in (np.asfortranarray(a), a.transpose(2, 0, 1), a[:, ::2, 1:], a):
        np.testing.assert_array_equal(textnet.Tensor(made).numpy(), made)
        np.testing.assert_array_equal(textnet.tensor(made).numpy(), made)
    for made in (np.asfortranarray(ids), ids.transpose(1, 0, 2), ids):
        np.testing.assert_array_equal(textnet.Tensor(made).numpy(), made)
    np.testing.assert_array_equal(textnet.Tensor(a.astype(np.float64).T).numpy(), a.T)


def test_tensor_construction_dtypes_devices_and_flags():
    assert textnet.tensor([1.0, 2.0]).dtype == textnet.float32
    assert textnet.tensor([1, 2]).dtype == textnet.int64
    assert textnet.tensor(np.zeros(2)).dtype == textnet.float64
    assert textnet.tensor([1, 2], dtype=textnet.float32).dtype == textnet.float32
    x = textnet.ones(2, 3, requires_grad=True)
    assert x.shape == (2, 3) and x.device == "cpu" and x.requires_grad and x.is_leaf
    assert textnet.zeros((2, 3)).numpy().sum() == 0
    np.testing.assert_array_equal(textnet.arange(5).numpy(), np.arange(5))
    assert textnet.arange(0, 1, 0.25).dtype == textnet.float32
    textnet.manual_seed(7)
    first = textnet.randn(3, 4).numpy()
    textnet.manual_seed(7)
    assert np.array_equal(first, textnet.randn(3, 4).numpy())
    assert not np.array_equal(first, textnet.randn(3, 4).numpy())
    y = (x * 2).sum()
    assert y.requires_grad and not y.is_leaf and y.item() == 12.0
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 2.0))
    d = x.detach()
    assert not d.requires_grad and d.is_leaf
    with textnet.no_grad():
        z = x * 3
        assert not textnet.is_grad_enabled()
    assert textnet.is_grad_enabled() and not z.requires_grad
    x.grad = None
    assert x.grad is None
    assert x.to("cpu").device == "cpu"


def test_gradients_accumulate_until_cleared():
    x = leaf([1.0, 2.0])
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0 + 3.0, 4.0 + 3.0])


def test_dropout_masks_scale_and_follow_the_seed():
    x = leaf(np.ones((4, 50)))
    textnet.manual_seed(3)
    y = F.dropout(x, p=0.25, training=True)
    out = y.numpy()
    kept = out[out != 0]
    np.testing.assert_allclose(kept, 1 / 0.75, rtol=1e-6)  # the scale is the kernels', in float32
    assert 0 < (out == 0).sum() < out.size
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), out)
    textnet.manual_seed(3)
    np.testing.assert_array_equal(F.dropout(x, 0.25).numpy(), out)
    assert np.array_equal(F.dropout(x, 0.25, training=False).numpy(), x.numpy())
    layer = nn.Dropout(0.5)
    layer.eval()
    assert np.array_equal(layer(x).numpy(), x.numpy())


class MLP(nn.Module):
    def __init__(self, sizes, dtype=None):
        super().__init__()
        self.fc1 = nn.Linear(sizes[0], sizes[1], dtype=dtype)
        self.fc2 = nn.Linear(sizes[1], sizes[2], dtype=dtype)

    def forward(self, x):
        return self.fc2(self.fc1(x).tanh())


def numpy_mlp_grads(params, x, y):
    """The cross-entropy's gradients of MLP's parameters, by hand."""
    w1, b1, w2, b2 = params
    h = np.tanh(x @ w1.T + b1)
    z = h @ w2.T + b2
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = p.copy()
    dz[np.arange(len(y)), y] -= 1
    dz /= len(y)
    dh = dz @ w2 * (1 - h**2)
    return [dh.T @ x, dh.sum(0), dz.T @ h, dz.sum(0)]


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam", "adamw"])
def test_mlp_training_steps_match_numpy(kind):
    textnet.manual_seed(0)
    model = MLP((4, 5, 3), dtype=textnet.float64)
    names = [name for name, _ in model.named_parameters()]
    assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    params = [p.numpy().copy() for p in model.parameters()]
    x, y = normal(6, 4), np.array([0, 1, 2, 1, 0, 2])
    # The optimizer's hyper-parameters are float32, as the kernels take them.
    lr, momentum, b1, b2, eps, wd = (float(np.float32(v)) for v in (0.05, 0.9, 0.9, 0.999, 1e-8, 0.1))
    optimizer = {
        "sgd": lambda ps: textnet.optim.SGD(ps, lr=0.05),
        "momentum": lambda ps: textnet.optim.SGD(ps, lr=0.05, momentum=0.9),
        "adam": lambda ps: textnet.optim.Adam(ps, lr=0.05),
        "adamw": lambda ps: textnet.optim.AdamW(ps, lr=0.05, weight_decay=0.1),
    }[kind](model.parameters())
    state = [(np.zeros_like(p), np.zeros_like(p)) for p in params]
    for step in range(1, 4):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(textnet.tensor(x)), textnet.tensor(y))
        loss.backward()
        optimizer.step()
        for i, g in enumerate(numpy_mlp_grads(params, x, y)):
            m, v = state[i]
            if kind == "sgd":
                params[i] -= lr * g
            elif kind == "momentum":
                m[...] = momentum * m + g
                params[i] -= lr * m
            else:
                if kind == "adamw":
                    params[i] *= 1 - lr * wd
                m[...] = b1 * m + (1 - b1) * g
                v[...] = b2 * v + (1 - b2) * g * g
                m_hat, v_hat = m / (1 - b1**step), v / (1 - b2**step)
                params[i] -= lr * m_hat / (np.sqrt(v_hat) + eps)
        for got, want in zip(model.parameters(), params):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-9, err_msg=f"step {step}")


def test_param_groups_take_their_own_and_a_changed_lr():
    a, b = nn.Parameter(textnet.ones(2)), nn.Parameter(textnet.ones(2))
    optimizer = textnet.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.25)
    assert [g["lr"] for g in optimizer.param_groups] == [0.25, 0.5]
    (a.sum() + b.sum()).backward()
    optimizer.step()
    np.testing.assert_allclose(a.numpy(), [0.75, 0.75])
    np.testing.assert_allclose(b.numpy(), [0.5, 0.5])
    optimizer.param_groups[0]["lr"] = 0.125
    optimizer.step()
    np.testing.assert_allclose(a.numpy(), [0.625, 0.625])
    optimizer.zero_grad(set_to_none=True)
    assert a.grad is None and b.grad is None
    with pytest.raises(ValueError, match="momentum"):
        textnet.optim.SGD([{"params": [a], "momentum": 0.5}], lr=0.1)


def test_clip_grad_norm_scales_to_the_norm():
    a, b = leaf([3.0, 0.0]), leaf([[4.0]])
    (a * a / 2).sum().backward()
    (b * b / 2).sum().backward()
    norm = nn.utils.clip_grad_norm_([a, b], 1.0)
    assert norm.item() == pytest.approx(5.0)
    np.testing.assert_allclose(a.grad.numpy(), [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), [[0.8]], rtol=1e-6)


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.Linear(width, 3 * width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * width, width))


class TinyGPT(nn.Module):
    def __init__(self, vocab=10, width=8, layers=2):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab, width),
                h=nn.ModuleList([Block(width) for _ in range(layers)]),
                ln_f=nn.LayerNorm(width, bias=False),
            )
        )
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.register_buffer("mask", textnet.ones(4, 4))
        self.register_buffer("scratch", textnet.zeros(2), persistent=False)
        self.plain = textnet.zeros(3)  # a plain tensor attribute: neither parameter nor buffer


def expected_names(layers=2):
    block = ["ln_1.weight", "ln_1.bias", "attn.weight", "attn.bias", "mlp.0.weight", "mlp.0.bias", "mlp.3.weight",
             "mlp.3.bias"]
    names = ["transformer.wte.weight"]
    names += [f"transformer.h.{i}.{name}" for i in range(layers) for name in block]
    return names + ["transformer.ln_f.weight"]


def test_module_names_parameters_as_pytorch_does():
    model = TinyGPT()
    assert [name for name, _ in model.named_parameters()] == expected_names()
    # As torch: each module's own parameters and buffers, then its children's.
    assert list(model.state_dict()) == ["mask"] + expected_names() + ["lm_head.weight"]
    assert model.transformer.h[1].mlp[0].weight.shape == (32, 8)
    assert len(list(model.parameters())) == len(expected_names())
    model.eval()
    assert not model.transformer.h[0].mlp[2].training
    model.train()
    assert all(m.training for m in model.modules())


def test_state_dict_names_equal_torch():
    torch = pytest.importorskip("torch")
    tnn = torch.nn

    class TorchBlock(tnn.Module):
        def __init__(self, width):
            super().__init__()
            self.ln_1 = tnn.LayerNorm(width)
            self.attn = tnn.Linear(width, 3 * width)
            self.mlp = tnn.Sequential(tnn.Linear(width, 4 * width), tnn.GELU(), tnn.Dropout(0.1),
                                      tnn.Linear(4 * width, width))

    class TorchGPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = tnn.ModuleDict(dict(wte=tnn.Embedding(10, 8),
                                                   h=tnn.ModuleList([TorchBlock(8) for _ in range(2)]),
                                                   ln_f=tnn.LayerNorm(8, bias=False)))
            self.lm_head = tnn.Linear(8, 10, bias=False)
            self.transformer.wte.weight = self.lm_head.weight
            self.register_buffer("mask", torch.ones(4, 4))
            self.register_buffer("scratch", torch.zeros(2), persistent=False)

    theirs, ours = TorchGPT(), TinyGPT()
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == {
        k: tuple(v.shape) for k, v in theirs.state_dict().items()
    }
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    np.testing.assert_array_equal(ours.lm_head.weight.numpy(), theirs.lm_head.weight.detach().numpy())


def test_load_state_dict_round_trips_and_names_what_is_wrong():
    textnet.manual_seed(1)
    source, target = MLP((3, 4, 2)), MLP((3, 4, 2))
    target.load_state_dict(source.state_dict())
    for (name, a), (_, b) in zip(source.named_parameters(), target.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    state = OrderedDict(source.state_dict())
    state["fc3.weight"] = state.pop("fc2.weight")
    with pytest.raises(ValueError, match=r"missing keys 'fc2.weight'.*unexpected keys 'fc3.weight'"):
        target.load_state_dict(state)
    state = source.state_dict()
    state["fc1.bias"] = np.zeros(5, dtype=np.float32)
    with pytest.raises(ValueError, match=r"'fc1.bias' has shape \[4\] here, but the state dict's is \[5\]"):
        target.load_state_dict(state)


def test_shape_and_dtype_errors_are_value_errors_naming_op_and_shapes():
    with pytest.raises(ValueError, match=r"^add: shapes \[2, 3\] and \[4\] do not broadcast"):
        textnet.zeros(2, 3) + textnet.zeros(4)
    with pytest.raises(ValueError, match=r"matmul.*\[2, 3\].*\[2, 3\]"):
        textnet.zeros(2, 3) @ textnet.zeros(2, 3)
    with pytest.raises(ValueError, match=r"^mul: dtypes float32 and float64 differ \(shapes \[2\] and \[2\]\)"):
        textnet.zeros(2) * textnet.zeros(2, dtype=textnet.float64)
    with pytest.raises(ValueError, match=r"^cross_entropy: shapes \[3, 4\] and \[2\]"):
        F.cross_entropy(textnet.zeros(3, 4), textnet.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^linear"):
        nn.Linear(3, 2)(textnet.zeros(2, 4))
    with pytest.raises(ValueError, match=r"^embedding: the ids must be int64"):
        F.embedding(textnet.zeros(2), textnet.zeros(3, 2))
    with pytest.raises(ValueError, match=r"view: shape \[2, 3\] cannot be viewed as \[4, -1\]"):
        textnet.zeros(2, 3).view(4, -1)


def test_graph_and_device_errors_are_runtime_errors():
    with pytest.raises(RuntimeError, match="backward"):
        textnet.zeros(2).sum().backward()
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="freed"):
        y.backward()
    # float64 has no device kernels; without a GPU, opening it fails: RuntimeError either way.
    with pytest.raises(RuntimeError):
        textnet.zeros(2, dtype=textnet.float64).to("cuda")
    with pytest.raises(ValueError, match="device must be"):
        textnet.zeros(2).to("tpu")


def test_keras_style_sequential_stays_at_the_top_level():
    assert textnet.Sequential is textnet.keras.Sequential
    assert textnet.Linear is textnet.keras.Linear
    assert issubclass(textnet.nn.Sequential, nn.Module)
    model = textnet.Sequential([textnet.Linear(4, 3), textnet.ReLU(), textnet.Linear(3, 2)])
    assert model.spec.startswith("Linear(4, 3)")
