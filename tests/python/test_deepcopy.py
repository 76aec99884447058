"""``copy.deepcopy`` of ``textnet.nn`` modules, tensors and optimizers on the CPU, as PyTorch's: the copy
computes what the original does, owns its parameters (training one leaves the other as it was), keeps a
``Parameter`` a ``Parameter``, shares what the original shares (tied weights) and copies each dropout
layer's state (its next mask), which then advances apart."""

import copy

import numpy as np
import pytest

import textnet
import textnet.nn.functional as F
from textnet import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.fc1(x))))


def inputs(*shape):
    return textnet.tensor(np.random.default_rng(3).standard_normal(shape).astype(np.float32))


def arrays(module):
    return {name: value.numpy() for name, value in module.state_dict().items()}


def assert_independent_copy(module, x):
    """The copy of `module` gives the same outputs on `x` (in eval mode), has equal parameters in other
    tensors, and a training step of the copy leaves `module` unchanged."""
    twin = copy.deepcopy(module)
    assert type(twin) is type(module) and twin is not module
    before = arrays(module)
    assert arrays(twin).keys() == before.keys()
    for (name, mine), (_, theirs) in zip(module.named_parameters(), twin.named_parameters()):
        assert type(theirs) is nn.Parameter and theirs is not mine, name
        assert theirs.requires_grad == mine.requires_grad, name
        np.testing.assert_array_equal(theirs.numpy(), mine.numpy(), err_msg=name)
    module.eval(), twin.eval()
    np.testing.assert_array_equal(twin(x).numpy(), module(x).numpy())
    parameters = list(twin.parameters())
    if parameters:
        optimizer = textnet.optim.SGD(parameters, lr=0.5)
        twin(x).sum().backward()
        optimizer.step()
        for name, value in arrays(module).items():
            np.testing.assert_array_equal(value, before[name], err_msg=f"{name} moved with its copy")
        assert any(not np.array_equal(arrays(twin)[name], before[name]) for name in before)
    return twin


def test_a_model_with_dropout_copies_with_its_own_parameters_and_dropout_state():
    textnet.manual_seed(1)
    model = Net()
    x = inputs(4, 6)
    model(x)  # the dropout layer draws a mask: its counter is at step 1
    twin = assert_independent_copy(model, x)
    assert twin.drop.layer is not model.drop.layer
    assert (twin.drop.p, twin.drop.layer.seed, twin.drop.layer.site) == (0.5, model.drop.layer.seed,
                                                                         model.drop.layer.site)
    assert twin.drop.layer.step == model.drop.layer.step == 1
    # In training the two draw the same next mask, then each advances on its own.
    model.train(), twin.train()
    ones = textnet.ones(64, 32)
    np.testing.assert_array_equal(twin.drop(ones).numpy(), model.drop(ones).numpy())
    twin.drop(ones)
    assert (model.drop.layer.step, twin.drop.layer.step) == (2, 3)
    assert not np.array_equal(model.drop(ones).numpy(), model.drop(ones).numpy())


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.Linear(5, 3), (2, 5)),
    (lambda: nn.Linear(5, 3, bias=False), (2, 5)),
    (lambda: nn.LayerNorm(5), (2, 5)),
    (lambda: nn.Conv2d(2, 3, 3, padding=1), (2, 2, 5, 5)),
    (lambda: nn.MaxPool2d(2), (1, 2, 4, 4)),
    (lambda: nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Dropout(0.2), nn.Linear(4, 2)), (3, 5)),
    (lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2, 2)),
     (2, 1, 4, 4)),
])
def test_each_layer_and_container_copies_independently(make, shape):
    textnet.manual_seed(2)
    assert_independent_copy(make(), inputs(*shape))


def test_embedding_module_list_and_module_dict_copy_independently():
    textnet.manual_seed(3)
    ids = textnet.tensor([[0, 2, 1], [3, 3, 0]])
    assert_independent_copy(nn.Embedding(4, 5, padding_idx=0), ids)

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(5, 5), nn.Linear(5, 5)])
            self.heads = nn.ModuleDict({"a": nn.Linear(5, 2), "b": nn.LayerNorm(2)})

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.heads["b"](self.heads["a"](x))

    twin = assert_independent_copy(Stack(), inputs(3, 5))
    assert isinstance(twin.layers, nn.ModuleList) and list(twin.heads.keys()) == ["a", "b"]


def test_tied_weights_stay_tied_in_the_copy_and_buffers_are_copied():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(6, 4), nn.Linear(4, 6, bias=False)
            self.head.weight = self.embed.weight
            self.register_buffer("scale", textnet.tensor(np.float32([2.0])))

    model = Tied()
    twin = copy.deepcopy(model)
    assert twin.head.weight is twin.embed.weight and twin.embed.weight is not model.embed.weight
    assert len(list(twin.parameters())) == 1
    assert twin.scale is not model.scale and twin.scale.numpy().tolist() == [2.0]
    twin.scale.copy_(np.float32([5.0]))
    assert model.scale.numpy().tolist() == [2.0]


def test_a_tensor_copies_with_its_gradient_and_a_computed_one_is_refused():
    weight = nn.Parameter(textnet.tensor(np.float32([[1.0, 2.0], [3.0, 4.0]])))
    (weight * weight).sum().backward()
    twin = copy.deepcopy(weight)
    assert type(twin) is nn.Parameter and twin.requires_grad
    np.testing.assert_array_equal(twin.grad.numpy(), weight.grad.numpy())
    weight.grad = None
    assert twin.grad is not None
    plain = copy.deepcopy(textnet.tensor([1.0, 2.0]))
    assert type(plain) is textnet.Tensor and not plain.requires_grad
    ids = textnet.tensor([3, 1])
    assert copy.deepcopy(ids).numpy().tolist() == [3, 1] and copy.deepcopy(ids).dtype == np.int64
    with pytest.raises(RuntimeError, match="deep-copy a leaf"):
        copy.deepcopy(weight * 2)


def test_a_gradient_can_be_assigned_as_in_pytorch():
    weight = textnet.tensor(np.float32([1.0, 2.0]), requires_grad=True)
    given = textnet.tensor(np.float32([0.5, -1.0]))
    weight.grad = given
    np.testing.assert_array_equal(weight.grad.numpy(), [0.5, -1.0])
    given.copy_(np.float32([9.0, 9.0]))  # the gradient is a copy
    np.testing.assert_array_equal(weight.grad.numpy(), [0.5, -1.0])
    with pytest.raises(ValueError, match="shape"):
        weight.grad = textnet.tensor(np.float32([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="dtypes"):
        weight.grad = textnet.tensor(np.float64([1.0, 2.0]))
    with pytest.raises(TypeError, match="a tensor or None"):
        weight.grad = [1.0, 2.0]


@pytest.mark.parametrize("make", [
    lambda p: textnet.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: textnet.optim.Adam(p, lr=0.01),
    lambda p: textnet.optim.AdamW(p, lr=0.01, weight_decay=0.1),
])
def test_an_optimizer_copied_with_its_model_steps_the_copy_as_the_original_steps_the_original(make):
    textnet.manual_seed(4)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = make(model.parameters())
    x, target = inputs(5, 6), textnet.tensor([0, 2, 1, 1, 0])

    def step(m, o):
        o.zero_grad()
        F.cross_entropy(m(x), target).backward()
        o.step()

    step(model, optimizer)  # the state (moments, step counts) is not empty
    twin_model, twin_optimizer = copy.deepcopy((model, optimizer))
    assert twin_optimizer.param_groups[0]["params"][0] is twin_model[0].weight
    assert twin_optimizer.param_groups is not optimizer.param_groups
    for _ in range(2):
        step(model, optimizer)
        step(twin_model, twin_optimizer)
    for name, value in arrays(model).items():
        np.testing.assert_array_equal(arrays(twin_model)[name], value, err_msg=name)
    # The copy's rate is its own.
    twin_optimizer.param_groups[0]["lr"] = 0.0
    before = arrays(twin_model)
    step(twin_model, twin_optimizer)
    step(model, optimizer)
    assert all(np.array_equal(arrays(twin_model)[k], v) for k, v in before.items())
    assert not all(np.array_equal(arrays(model)[k], v) for k, v in before.items())
