"""PyTorch interop: ``textnet.from_torch`` and ``Module.to_torch`` give the same layers computing the same
outputs, and a ``state_dict`` goes both ways, through a safetensors file and directly. Skipped without
torch (CI installs it)."""

from collections import OrderedDict

import numpy as np
import pytest

import textnet
from textnet import nn

torch = pytest.importorskip("torch")
tnn = torch.nn


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


def test_from_torch_makes_the_same_layers_with_the_same_weights_and_outputs():
    theirs = torch_cnn().eval()
    ours = textnet.from_torch(theirs)
    assert isinstance(ours, nn.Sequential) and isinstance(ours.conv, nn.Conv2d) and isinstance(ours.pool, nn.MaxPool2d)
    assert not ours.training
    assert_same_state(ours, theirs)
    np.testing.assert_allclose(ours_out(ours), theirs_out(theirs), rtol=1e-5, atol=1e-6)


def test_to_torch_makes_the_same_layers_with_the_same_weights_and_outputs():
    ours = textnet_cnn()
    theirs = ours.to_torch()
    assert isinstance(theirs, tnn.Sequential) and isinstance(theirs.conv, tnn.Conv2d) and theirs.training
    assert_same_state(ours, theirs)
    np.testing.assert_allclose(theirs_out(theirs), ours_out(ours), rtol=1e-5, atol=1e-6)


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
