"""The layers over the engine's own: ``nn.Dropout`` (the engine's layer, whose masks a captured step draws
anew at each replay) against the mask hash written again in NumPy, nanoGPT's attention with its dropout
layer, a compiled nanoGPT step with dropout against the function, ``nn.Conv2d`` and ``nn.MaxPool2d``, and
``textnet.set_precision``."""

import math

import numpy as np
import pytest

import textnet
import textnet.nn.functional as F
from textnet import nn
from test_examples import example
from test_module_api import check_gradients, normal

WORD = 0xFFFFFFFF


def mix32(x):
    """ops/dropout.rs's hash (lowbias32) on uint64 arrays of 32-bit values."""
    x = np.asarray(x, dtype=np.uint64)
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & np.uint64(WORD)
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & np.uint64(WORD)
    return x ^ (x >> np.uint64(16))


def mask(seed, site, step, p, count):
    """The factor (0 or 1/(1 − p) in float32) of each of `count` elements at (seed, site, step)."""
    site_seed = mix32(seed ^ ((site * 0x9E3779B9) & WORD))
    key = mix32((int(site_seed) + step) & WORD)
    p = float(np.float32(p))
    threshold = min(int(p * 2.0**32), WORD)
    kept = mix32(np.uint64(key) ^ mix32(np.arange(count, dtype=np.uint64))) >= np.uint64(threshold)
    return np.where(kept, np.float32(1 / (1 - p)), np.float32(0))


def test_dropout_layers_draw_the_engines_masks_step_after_step():
    textnet.manual_seed(7)
    first, second = nn.Dropout(0.3), nn.Dropout(0.3)
    assert (first.layer.seed, first.layer.site, second.layer.site) == (7, 0, 1)
    x = textnet.tensor(np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32), requires_grad=True)
    outs = []
    for step in range(3):
        assert first.layer.step == step
        y = first(x)
        expected = x.numpy() * mask(7, 0, step, 0.3, x.numel()).reshape(6, 40)
        np.testing.assert_array_equal(y.numpy(), expected)
        outs.append(y.numpy())
    assert not np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[1], outs[2])
    np.testing.assert_array_equal(second(x).numpy(), x.numpy() * mask(7, 1, 0, 0.3, x.numel()).reshape(6, 40))
    y = first(x)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), mask(7, 0, 3, 0.3, x.numel()).reshape(6, 40))
    # float64 takes the same mask.
    x64 = textnet.tensor(np.ones((3, 5)))
    np.testing.assert_allclose(first(x64).numpy(), mask(7, 0, 4, 0.3, 15).reshape(3, 5), rtol=1e-7)


def test_dropout_layers_in_evaluation_pass_the_input_and_count_no_step():
    textnet.manual_seed(1)
    layer = nn.Dropout(0.5)
    x = textnet.randn(4, 10)
    layer.eval()
    np.testing.assert_array_equal(layer(x).numpy(), x.numpy())
    assert layer.layer.step == 0
    layer.train()
    assert not np.array_equal(layer(x).numpy(), x.numpy()) and layer.layer.step == 1
    # The same model after the same seed drops the same elements; the sites do not draw from the
    # generator of the initial parameters.
    textnet.manual_seed(1)
    again = nn.Dropout(0.5)
    np.testing.assert_array_equal(again(x).numpy(), x.numpy() * mask(1, 0, 0, 0.5, 40).reshape(4, 10))
    textnet.manual_seed(4)
    plain = textnet.randn(3).numpy()
    textnet.manual_seed(4)
    nn.Dropout(0.1)
    np.testing.assert_array_equal(textnet.randn(3).numpy(), plain)
    with pytest.raises(ValueError, match=r"probability must be in \[0, 1\]"):
        nn.Dropout(1.5)


def numpy_causal_attention(q, k, v, factors=None):
    d = q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
    t = scores.shape[-1]
    scores = np.where(np.triu(np.ones((t, t), dtype=bool), 1), -np.inf, scores)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p if factors is None else p * factors) @ v


def test_attention_drops_its_probabilities_by_the_dropout_layers_mask():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 3, 4, 5)) for _ in range(3))
    textnet.manual_seed(9)
    layer = nn.Dropout(0.4)
    tensors = [textnet.tensor(a) for a in (q, k, v)]
    for step in range(2):
        y = F.scaled_dot_product_attention(*tensors, dropout_p=layer, is_causal=True)
        # Element ((b·H + h)·T + t)·T + u of the layer's step.
        factors = mask(9, layer.layer.site, step, 0.4, q.size // 5 * 4).reshape(2, 3, 4, 4).astype(np.float64)
        np.testing.assert_allclose(y.numpy(), numpy_causal_attention(q, k, v, factors), rtol=1e-10, atol=1e-12)
    assert layer.layer.step == 2
    layer.eval()
    y = F.scaled_dot_product_attention(*tensors, dropout_p=layer, is_causal=True)
    np.testing.assert_allclose(y.numpy(), numpy_causal_attention(q, k, v), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="takes is_causal=True"):
        F.scaled_dot_product_attention(*tensors, dropout_p=layer)


def test_attention_with_a_dropout_layer_has_the_gradient_of_its_mask():
    def attend(q, k, v):
        textnet.manual_seed(5)  # the same layer, so the same mask, at every evaluation
        return F.scaled_dot_product_attention(q, k, v, dropout_p=nn.Dropout(0.3), is_causal=True)

    check_gradients(attend, normal(1, 2, 3, 4), normal(1, 2, 3, 4), normal(1, 2, 3, 4))


def test_packed_causal_attention_is_the_split_heads_attention_put_back_side_by_side():
    rng = np.random.default_rng(4)
    batch, time, heads, dims = 2, 5, 3, 4
    qkv = rng.standard_normal((batch, time, 3 * heads * dims))
    split = [qkv[..., i * heads * dims:(i + 1) * heads * dims].reshape(batch, time, heads, dims).transpose(0, 2, 1, 3)
             for i in range(3)]
    expected = numpy_causal_attention(*split).transpose(0, 2, 1, 3).reshape(batch, time, heads * dims)
    textnet.manual_seed(9)
    layer = nn.Dropout(0.4)
    y = F.causal_self_attention(textnet.tensor(qkv), heads, layer)
    factors = mask(9, layer.layer.site, 0, 0.4, batch * heads * time * time).reshape(batch, heads, time, time)
    dropped = numpy_causal_attention(*split, factors.astype(np.float64)).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(y.numpy(), dropped.reshape(expected.shape), rtol=1e-10, atol=1e-12)
    layer.eval()
    np.testing.assert_allclose(F.causal_self_attention(textnet.tensor(qkv), heads, layer).numpy(), expected,
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(F.causal_self_attention(textnet.tensor(qkv), heads).numpy(), expected,
                               rtol=1e-10, atol=1e-12)
    check_gradients(lambda t: F.causal_self_attention(t, 2), normal(1, 3, 12))
    with pytest.raises(TypeError, match="nn.Dropout layer or None"):
        F.causal_self_attention(textnet.tensor(qkv), heads, 0.1)
    with pytest.raises(ValueError, match="causal_self_attention"):
        F.causal_self_attention(textnet.tensor(qkv), 5)


def nanogpt_parameters(compiled, dropout=0.2, steps=4):
    gpt = example("nanogpt")
    textnet.manual_seed(11)
    config = gpt.GPTConfig(block_size=8, vocab_size=13, n_layer=2, n_head=2, n_embd=16, dropout=dropout, bias=True)
    model = gpt.GPT(config)
    optimizer = textnet.optim.AdamW(model.parameters(), lr=1e-2)

    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    run = textnet.compile(step) if compiled else step
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        ids = rng.integers(0, 13, (3, 9))
        losses.append(run(textnet.tensor(ids[:, :-1]), textnet.tensor(ids[:, 1:])).item())
    drops = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    return losses, {name: p.numpy() for name, p in model.named_parameters()}, drops


def test_a_compiled_nanogpt_step_with_dropout_trains_bit_for_bit_as_the_function(capsys):
    eager_losses, eager, drops = nanogpt_parameters(compiled=False)
    compiled_losses, compiled, _ = nanogpt_parameters(compiled=True)
    assert compiled_losses == eager_losses
    for name in eager:
        assert np.array_equal(eager[name], compiled[name]), name
    # Every dropout layer (the attention's too) drew a mask at each step, each at its own site.
    assert len(drops) == 1 + 2 * 3 and all(d.layer.step == 4 for d in drops)
    assert len({d.layer.site for d in drops}) == len(drops)
    undropped_losses, _, _ = nanogpt_parameters(compiled=False, dropout=0.0)
    assert undropped_losses[0] != eager_losses[0]


CONV_CASES = {
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b), normal(2, 2, 5, 5), normal(3, 2, 3, 3), normal(3)),
    "conv2d stride 2 padding 1": (lambda x, w: F.conv2d(x, w, stride=2, padding=1), normal(1, 2, 5, 4),
                                  normal(2, 2, 3, 2)),
    "conv2d padding same": (lambda x, w: F.conv2d(x, w, padding="same"), normal(1, 1, 4, 4), normal(2, 1, 3, 3)),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), normal(2, 2, 4, 6)),
    "max_pool2d stride 1 padding 1": (lambda x: F.max_pool2d(x, 3, stride=1, padding=1), normal(1, 2, 4, 4)),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_and_pool_gradients_match_finite_differences(case):
    fn, *arrays = CONV_CASES[case]
    check_gradients(fn, *arrays)


def numpy_conv2d(x, w, b, stride, padding):
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    n, _, h, width = x.shape
    o, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (width - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = x[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", window, w) + b
    return out


def test_conv2d_and_max_pool2d_layers_compute_and_initialise_as_pytorch():
    textnet.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1, dtype=textnet.float64)
    assert [name for name, _ in conv.named_parameters()] == ["weight", "bias"]
    assert conv.weight.shape == (4, 3, 3, 3) and conv.bias.shape == (4,)
    bound = 1 / math.sqrt(3 * 3 * 3)
    assert np.abs(conv.weight.numpy()).max() <= bound and np.abs(conv.bias.numpy()).max() <= bound
    assert np.abs(conv.weight.numpy()).max() > 0.5 * bound
    x = np.random.default_rng(3).standard_normal((2, 3, 7, 6))
    y = conv(textnet.tensor(x))
    np.testing.assert_allclose(y.numpy(), numpy_conv2d(x, conv.weight.numpy(), conv.bias.numpy(), 2, 1), rtol=1e-12)
    pooled = nn.MaxPool2d(2)(textnet.tensor(x)).numpy()
    np.testing.assert_array_equal(pooled, x[:, :, :6, :6].reshape(2, 3, 3, 2, 3, 2).max(axis=(3, 5)))
    assert nn.Conv2d(1, 2, (3, 5), bias=False).bias is None
    with pytest.raises(ValueError, match="dilation"):
        nn.Conv2d(1, 2, 3, dilation=2)
    with pytest.raises(ValueError, match="one stride for both axes"):
        F.conv2d(textnet.zeros(1, 1, 4, 4), textnet.zeros(1, 1, 3, 3), stride=(1, 2))
    with pytest.raises(ValueError, match=r"^conv2d: shapes \[1, 2, 4, 4\] and \[1, 1, 3, 3\] do not match"):
        F.conv2d(textnet.zeros(1, 2, 4, 4), textnet.zeros(1, 1, 3, 3))
    with pytest.raises(ValueError, match="ceil_mode"):
        nn.MaxPool2d(2, ceil_mode=True)


def test_set_precision_is_one_setting_that_the_cpu_accepts_and_ignores():
    x = textnet.tensor(np.random.default_rng(4).standard_normal((5, 7)).astype(np.float32))
    w = textnet.tensor(np.random.default_rng(5).standard_normal((3, 7)).astype(np.float32))
    before = F.linear(x, w).numpy()
    image = textnet.tensor(np.random.default_rng(6).standard_normal((2, 3, 6, 5)).astype(np.float32))
    kernel = textnet.tensor(np.random.default_rng(7).standard_normal((4, 3, 3, 3)).astype(np.float32))
    convolved = F.conv2d(image, kernel, padding=1).numpy()
    assert textnet.get_precision() == "fp32"
    try:
        for precision in ("bf16", "tf32"):
            textnet.set_precision(precision)
            assert textnet.get_precision() == precision
            np.testing.assert_array_equal(F.linear(x, w).numpy(), before)
            np.testing.assert_array_equal(F.conv2d(image, kernel, padding=1).numpy(), convolved)
    finally:
        textnet.set_precision("fp32")
    with pytest.raises(ValueError, match=r'set_precision: the products run in "fp32", "tf32" or "bf16", got "fp16"'):
        textnet.set_precision("fp16")
    assert textnet.get_precision() == "fp32"
