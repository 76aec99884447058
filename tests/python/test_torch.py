"""PyTorch interop: ``textnet.from_torch`` and ``Module.to_torch`` give the same layers computing the same
outputs, and a ``state_dict`` goes both ways, through a safetensors file and directly. With torch
installed (``TEXTNET_TEST_TORCH=1 scripts/test.sh``) against torch itself; without it, the same model's
outputs, ``state_dict`` and safetensors file are checked against a NumPy reference of what torch computes
and stores (``torch_reference``), and the conversions, which need torch objects, are skipped."""

from collections import OrderedDict

import numpy as np
import pytest

import textnet
import torch_reference
from textnet import nn

try:
    import torch

    tnn = torch.nn
except ImportError:
    torch = tnn = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (TEXTNET_TEST_TORCH=1 installs it)")

# textnet_cnn's layers as the NumPy reference runs them, and the state dict torch's nn.Sequential of the
# same layers holds: its names, in its order, with its shapes.
CNN = [("conv", ("conv2d", 1, 1)), ("relu", "relu"), ("pool", ("max_pool2d", 2)), ("flat", "flatten"),
       ("fc", ("linear",)), ("act", "tanh")]
CNN_STATE = {"conv.weight": (4, 2, 3, 3), "conv.bias": (4,), "fc.weight": (5, 36), "fc.bias": (5,)}


def torch_cnn():
    torch.manual_seed(0)
    return tnn.Sequential(OrderedDict(
        conv=tnn.Conv2d(2, 4, 3, padding=1), relu=tnn.ReLU(), pool=tnn.MaxPool2d(2), flat=tnn.Flatten(),
        fc=tnn.Linear(4 * 3 * 3, 5), act=tnn.Tanh(),
    ))


def textnet_cnn():
    textnet.manual_seed(0)
    return nn.Sequential(OrderedDict(
        conv=nn.Conv2d(2, 4, 3, padding=1), relu=nn.ReLU(), pool=nn.MaxPool2d(2), flat=nn.Flatten(),
        fc=nn.Linear(4 * 3 * 3, 5), act=nn.Tanh(),
    ))


IMAGES = np.random.default_rng(0).standard_normal((3, 2, 6, 6)).astype(np.float32)


def ours_out(model):
    with textnet.no_grad():
        return model(textnet.tensor(IMAGES)).numpy()


def theirs_out(model):
    with torch.no_grad():
        return model(torch.from_numpy(IMAGES)).numpy()


def assert_same_state(ours, theirs):
    mine = ours.state_dict()
    other = theirs.state_dict()
    assert list(mine) == list(other)
    for name in mine:
        np.testing.assert_array_equal(mine[name].numpy(), other[name].detach().numpy(), err_msg=name)


@needs_torch
def test_from_torch_makes_the_same_layers_with_the_same_weights_and_outputs():
    theirs = torch_cnn().eval()
    ours = textnet.from_torch(theirs)
    assert isinstance(ours, nn.Sequential) and isinstance(ours.conv, nn.Conv2d) and isinstance(ours.pool, nn.MaxPool2d)
    assert not ours.training
    assert_same_state(ours, theirs)
    np.testing.assert_allclose(ours_out(ours), theirs_out(theirs), rtol=1e-5, atol=1e-6)


@needs_torch
def test_to_torch_makes_the_same_layers_with_the_same_weights_and_outputs():
    ours = textnet_cnn()
    theirs = ours.to_torch()
    assert isinstance(theirs, tnn.Sequential) and isinstance(theirs.conv, tnn.Conv2d) and theirs.training
    assert_same_state(ours, theirs)
    np.testing.assert_allclose(theirs_out(theirs), ours_out(ours), rtol=1e-5, atol=1e-6)


@needs_torch
def test_trees_of_lists_and_dicts_convert_both_ways_and_float64_stays():
    torch.manual_seed(1)
    theirs = tnn.ModuleDict(dict(
        wte=tnn.Embedding(10, 8, padding_idx=0),
        h=tnn.ModuleList([tnn.Sequential(tnn.LayerNorm(8, bias=False), tnn.Linear(8, 8, bias=False),
                                         tnn.GELU(approximate="tanh"), tnn.Dropout(0.1)) for _ in range(2)]),
        head=tnn.Linear(8, 3, dtype=torch.float64),
    ))
    ours = textnet.from_torch(theirs)
    assert isinstance(ours.h, nn.ModuleList) and ours.h[1][0].bias is None and ours.wte.padding_idx == 0
    assert ours.head.weight.dtype == textnet.float64
    assert_same_state(ours, theirs)
    ids = np.array([[1, 0, 4], [9, 2, 2]])
    x = ours.wte(textnet.tensor(ids))
    y = theirs.wte(torch.from_numpy(ids))
    for ours_block, theirs_block in zip(ours.h, theirs.h):
        ours_block.eval()
        theirs_block.eval()
        x, y = ours_block(x), theirs_block(y)
    np.testing.assert_allclose(x.detach().numpy(), y.detach().numpy(), rtol=1e-5, atol=1e-6)
    back = ours.to_torch()
    assert type(back.h[0][2]) is tnn.GELU and back.h[0][2].approximate == "tanh"
    assert back.head.weight.dtype == torch.float64
    assert_same_state(ours, back)


@needs_torch
def test_what_has_no_counterpart_is_refused():
    class Custom(tnn.Module):
        def forward(self, x):
            return x

    with pytest.raises(TypeError, match="Custom has no counterpart"):
        textnet.from_torch(tnn.Sequential(tnn.Linear(2, 2), Custom()))
    with pytest.raises(ValueError, match="GELU\\(approximate='none'\\) is not in textnet"):
        textnet.from_torch(tnn.GELU())

    class Mine(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(TypeError, match="Mine has no counterpart"):
        Mine().to_torch()


@needs_torch
def test_state_dicts_go_to_torch_and_back_through_safetensors_and_directly(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    ours, theirs, trained = textnet_cnn(), torch_cnn(), textnet_cnn()
    with textnet.no_grad():
        for parameter in trained.parameters():  # other values than theirs or ours
            parameter.copy_(np.asarray(parameter.numpy() + 0.5, dtype=np.float32))

    path = tmp_path / "ours.safetensors"
    textnet.save(trained, path)
    theirs.load_state_dict(safetensors_torch.load_file(str(path)))
    assert_same_state(trained, theirs)
    np.testing.assert_allclose(theirs_out(theirs), ours_out(trained), rtol=1e-5, atol=1e-6)

    torch.manual_seed(9)
    other = torch_cnn()
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.mul_(-2.0)
    path = tmp_path / "theirs.safetensors"
    safetensors_torch.save_file(other.state_dict(), str(path))
    ours.load_state_dict(textnet.load(path))
    assert_same_state(ours, other)

    direct = torch_cnn()
    direct.load_state_dict({name: torch.from_numpy(value.numpy()) for name, value in trained.state_dict().items()})
    assert_same_state(trained, direct)


def test_the_layers_compute_what_torch_computes():
    ours = textnet_cnn()
    ours.eval()
    expected = torch_reference.forward(CNN, {k: v.numpy() for k, v in ours.state_dict().items()}, IMAGES)
    np.testing.assert_allclose(ours_out(ours), expected, rtol=1e-5, atol=1e-6)


def test_the_state_dict_has_torchs_names_order_shapes_and_dtype():
    state = textnet_cnn().state_dict()
    assert list(state) == list(CNN_STATE)
    assert {k: tuple(v.shape) for k, v in state.items()} == CNN_STATE
    assert all(v.numpy().dtype == np.float32 for v in state.values())


def test_a_saved_model_loads_as_torch_loads_it_and_back(tmp_path):
    """``safetensors.numpy`` reads the file as ``safetensors.torch.load_file`` would (the same names,
    shapes and float32 data), and a file written so, as ``safetensors.torch.save_file`` writes a torch
    ``state_dict``, loads into the model."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    trained = textnet_cnn()
    with textnet.no_grad():
        for parameter in trained.parameters():
            parameter.copy_(np.asarray(parameter.numpy() + 0.5, dtype=np.float32))
    path = tmp_path / "ours.safetensors"
    textnet.save(trained, path)
    loaded = safetensors_numpy.load_file(str(path))
    assert sorted(loaded) == sorted(CNN_STATE)
    assert {k: v.shape for k, v in loaded.items()} == CNN_STATE and all(v.dtype == np.float32 for v in loaded.values())
    trained.eval()
    np.testing.assert_allclose(torch_reference.forward(CNN, loaded, IMAGES), ours_out(trained), rtol=1e-5, atol=1e-6)

    rng = np.random.default_rng(9)
    theirs = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in CNN_STATE.items()}
    path = tmp_path / "theirs.safetensors"
    safetensors_numpy.save_file(theirs, str(path))
    ours = textnet_cnn()
    ours.load_state_dict(textnet.load(path))
    ours.eval()
    for name, value in ours.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), theirs[name], err_msg=name)
    np.testing.assert_allclose(ours_out(ours), torch_reference.forward(CNN, theirs, IMAGES), rtol=1e-5, atol=1e-5)
