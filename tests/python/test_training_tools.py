"""What a training loop uses besides the model: ``textnet.compile`` (on the CPU: the function itself),
``textnet.save``/``load`` as safetensors, ``textnet.optim.lr_scheduler``, and the tensor methods
nanoGPT's sampling calls (``masked_fill``, ``topk``, ``multinomial``, ``argmax``, comparisons)."""

import json
import math
import struct

import numpy as np
import pytest

import textnet
import textnet.nn.functional as F
from textnet import nn


def mlp():
    textnet.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def batches(count):
    rng = np.random.default_rng(0)
    for _ in range(count):
        yield textnet.tensor(rng.standard_normal((16, 4)).astype(np.float32)), textnet.tensor(rng.integers(0, 3, 16))


def train(model, step_of, steps=6):
    optimizer = textnet.optim.AdamW(model.parameters(), lr=1e-2)

    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    run = step_of(step)
    losses = [run(x, y).item() for x, y in batches(steps)]
    return losses, {name: p.numpy() for name, p in model.named_parameters()}


def test_a_compiled_step_on_the_cpu_trains_bit_for_bit_as_the_function():
    eager_losses, eager = train(mlp(), lambda step: step)
    compiled_losses, compiled = train(mlp(), textnet.compile)
    assert compiled_losses == eager_losses and eager_losses[-1] < eager_losses[0]
    for name in eager:
        assert np.array_equal(eager[name], compiled[name]), name


def test_compile_as_a_decorator_keeps_the_function_and_has_no_fusions_on_the_cpu():
    @textnet.compile
    def double(x, factor=2.0):
        """Doubles."""
        return x * factor

    assert isinstance(double, textnet.CompiledStep) and double.__doc__ == "Doubles."
    assert np.array_equal(double(textnet.tensor([1.0, 2.0])).numpy(), [2.0, 4.0])
    assert double(textnet.tensor([1.0]), factor=3.0).item() == 3.0
    assert double.fusions() == [] and double.captures() == 0
    assert textnet.compile()(lambda: 5)() == 5


def read_safetensors(path):
    """An independent reader: 8 bytes of header length, the JSON header, the raw little-endian data."""
    data = open(path, "rb").read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    body = data[8 + length :]
    dtypes = {"F32": "<f4", "F64": "<f8", "I64": "<i8"}
    return {
        name: np.frombuffer(body[start:end], dtype=dtypes[entry["dtype"]]).reshape(entry["shape"])
        for name, entry in header.items()
        if name != "__metadata__"
        for start, end in [entry["data_offsets"]]
    }


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(5, 4)
        self.ln = nn.LayerNorm(4, bias=False)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.wte.weight
        self.register_buffer("steps", textnet.tensor(np.array([7], dtype=np.int64)))

    def forward(self, ids):
        return self.head(self.ln(self.wte(ids)))


def test_save_writes_a_state_dict_as_safetensors_under_the_modules_names(tmp_path):
    textnet.manual_seed(1)
    model = Tied()
    path = tmp_path / "tied.safetensors"
    textnet.save(model, path)
    state = model.state_dict()
    on_disk = read_safetensors(path)
    assert sorted(on_disk) == sorted(state) == ["head.weight", "ln.weight", "steps", "wte.weight"]
    for name, value in state.items():
        assert on_disk[name].dtype == value.numpy().dtype and np.array_equal(on_disk[name], value.numpy()), name
    try:
        from safetensors.numpy import load_file
    except ImportError:
        return
    for name, value in load_file(str(path)).items():
        assert np.array_equal(value, state[name].numpy()), name


def test_load_gives_the_state_dict_back_into_a_fresh_module(tmp_path):
    textnet.manual_seed(1)
    model = Tied()
    textnet.save(model, tmp_path / "m.safetensors")
    textnet.save({"x": np.arange(6.0).reshape(2, 3)}, tmp_path / "x.safetensors")
    textnet.manual_seed(2)
    fresh = Tied()
    ids = textnet.tensor([[0, 4, 2]])
    assert not np.array_equal(fresh(ids).numpy(), model(ids).numpy())
    fresh.load_state_dict(textnet.load(tmp_path / "m.safetensors"))
    assert np.array_equal(fresh(ids).numpy(), model(ids).numpy())
    x = textnet.load(tmp_path / "x.safetensors")["x"]
    assert x.dtype == textnet.float64 and np.array_equal(x.numpy(), np.arange(6.0).reshape(2, 3))


def test_save_and_load_refuse_what_they_cannot_write_or_read(tmp_path):
    with pytest.raises(TypeError):
        textnet.save([1, 2], tmp_path / "list.safetensors")
    with pytest.raises(FileNotFoundError):
        textnet.load(tmp_path / "missing.safetensors")
    text = tmp_path / "notes.txt"
    text.write_text("not tensors")
    with pytest.raises(ValueError):
        textnet.load(text)


def scheduled(scheduler_of, steps):
    optimizer = textnet.optim.SGD([{"params": [textnet.zeros(1, requires_grad=True)], "lr": 0.5},
                                   {"params": [textnet.zeros(1, requires_grad=True)], "lr": 0.1}])
    scheduler = scheduler_of(optimizer)
    rates = []
    for _ in range(steps):
        rates.append([group["lr"] for group in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr() == [group["lr"] for group in optimizer.param_groups]
    return rates


@pytest.mark.parametrize("warmup", [0, 3])
def test_cosine_annealing_follows_the_closed_form(warmup):
    T, eta_min = 10, 0.01
    rates = scheduled(lambda o: textnet.optim.lr_scheduler.CosineAnnealingLR(o, T_max=T, eta_min=eta_min,
                                                                              warmup=warmup), 14)
    for t, (first, second) in enumerate(rates):
        for got, base in ((first, 0.5), (second, 0.1)):
            if t < warmup:
                expected = base * (t + 1) / (warmup + 1)
            else:
                expected = eta_min + (base - eta_min) * (1 + math.cos(math.pi * (t - warmup) / (T - warmup))) / 2
            assert got == pytest.approx(expected, rel=1e-12), (t, base)
    assert rates[T][0] == pytest.approx(eta_min)


def test_lambda_lr_scales_each_groups_initial_rate():
    rates = scheduled(lambda o: textnet.optim.lr_scheduler.LambdaLR(o, lambda t: 0.9**t), 5)
    assert [r[1] for r in rates] == pytest.approx([0.1 * 0.9**t for t in range(5)])
    with pytest.raises(ValueError):
        textnet.optim.lr_scheduler.CosineAnnealingLR(textnet.optim.SGD([textnet.zeros(1)]), T_max=5, warmup=5)


def test_masked_fill_keeps_the_gradient_of_the_elements_kept():
    x = textnet.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    mask = textnet.tril(textnet.ones(2, 3)) < 1
    y = x.masked_fill(mask, -math.inf)
    expected = np.where(np.tril(np.ones((2, 3))) == 0, -np.inf, np.arange(6.0).reshape(2, 3))
    assert np.array_equal(y.numpy(), expected)
    y.softmax(-1).sum(dim=0)[0].backward()
    assert x.grad.numpy()[0, 1] == 0 and x.grad.numpy()[1, 2] == 0 and x.grad.numpy()[1, 0] != 0
    with pytest.raises(ValueError, match="broadcast"):
        x.masked_fill(textnet.ones(3, 2), 0.0)


def test_topk_argmax_and_comparisons_match_numpy():
    rng = np.random.default_rng(5)
    values = rng.standard_normal((3, 7)).astype(np.float32)
    x = textnet.tensor(values)
    top, where = textnet.topk(x, 3)
    order = np.argsort(-values, axis=1)[:, :3]
    assert where.dtype == textnet.int64 and np.array_equal(where.numpy(), order)
    assert np.array_equal(top.numpy(), np.take_along_axis(values, order, 1))
    low, _ = x.topk(2, dim=0, largest=False)
    assert np.array_equal(low.numpy(), np.sort(values, axis=0)[:2])
    assert np.array_equal(x.argmax(dim=1).numpy(), values.argmax(1)) and x.argmax().item() == values.argmax()
    assert np.array_equal((x < top[:, [-1]]).numpy(), (values < top.numpy()[:, -1:]).astype(np.int64))
    assert np.array_equal((x >= 0).numpy(), (values >= 0).astype(np.int64))
    assert x.long().dtype == textnet.int64 and x.float() is x and x.double().dtype == textnet.float64
    assert x[:, [-1]].shape == (3, 1) and np.array_equal(x[:, [0, 2]].numpy(), values[:, [0, 2]])


def test_multinomial_is_seeded_and_follows_the_weights():
    weights = textnet.tensor([[0.0, 1.0, 3.0], [5.0, 0.0, 0.0]])
    textnet.manual_seed(9)
    first = textnet.multinomial(weights, 2000, replacement=True).numpy()
    textnet.manual_seed(9)
    assert np.array_equal(first, weights.multinomial(2000, replacement=True).numpy())
    assert first.shape == (2, 2000) and np.all(first[1] == 0) and not np.any(first[0] == 0)
    assert abs((first[0] == 2).mean() - 0.75) < 0.05
    both = weights[0].multinomial(2).numpy()
    assert sorted(both) == [1, 2]
    with pytest.raises(ValueError):
        weights.multinomial(2)


def test_cat_and_stack_join_int64_ids():
    a, b = textnet.tensor([[1, 2]]), textnet.tensor([[3]])
    joined = textnet.cat((a, b), dim=1)
    assert joined.dtype == textnet.int64 and joined.numpy().tolist() == [[1, 2, 3]]
    stacked = textnet.stack([textnet.tensor([1, 2]), textnet.tensor([3, 4])])
    assert stacked.numpy().tolist() == [[1, 2], [3, 4]] and stacked.size() == (2, 2) and stacked.numel() == 4
    with pytest.raises(ValueError):
        textnet.cat([a, textnet.tensor([[1.0]])], dim=1)


def test_init_and_apply_refill_parameters_in_place():
    textnet.manual_seed(0)
    model = nn.Sequential(nn.Linear(50, 40), nn.Linear(40, 2))
    seen = []

    def init(module):
        seen.append(type(module).__name__)
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            nn.init.zeros_(module.bias)

    model.apply(init)
    assert seen == ["Linear", "Linear", "Sequential"]
    weight = model[0].weight.numpy()
    assert abs(weight.std() - 0.02) < 0.002 and np.all(model[0].bias.numpy() == 0)
    assert model.to("cpu") is model and model[0].weight.device == "cpu"
