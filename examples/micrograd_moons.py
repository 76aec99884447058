"""micrograd's demo (demo.ipynb) with textnet tensors: a 2-16-16-1 ReLU MLP trained by full-batch SGD on
100 points of two interleaving half-moons, with the SVM max-margin loss mean(relu(1 − y·score)) plus
1e-4·Σθ² (L2), at rate 1 − 0.9·k/100 in step k, for 100 steps. The points come from a seeded generator
of scikit-learn's ``make_moons`` construction (noise 0.1) written here; the weights are drawn as
micrograd's neurons draw theirs (U(−1, 1), bias 0). The same demo in Rust: examples/micrograd_moons.rs.

usage: python examples/micrograd_moons.py [--steps 100] [--seed 1337]
"""

import argparse

import numpy as np

import textnet
from textnet import nn


def make_moons(count, noise, rng):
    """Two interleaving half circles, shuffled, with Gaussian noise: the outer one's points (cos t, sin t)
    labelled −1, the inner one's (1 − cos t, ½ − sin t) labelled 1, t evenly spaced over [0, π]."""
    outer, inner = count // 2, count - count // 2
    t_outer, t_inner = np.linspace(0, np.pi, outer), np.linspace(0, np.pi, inner)
    points = np.concatenate([np.stack([np.cos(t_outer), np.sin(t_outer)], 1),
                             np.stack([1 - np.cos(t_inner), 0.5 - np.sin(t_inner)], 1)])
    labels = np.concatenate([-np.ones(outer), np.ones(inner)])
    order = rng.permutation(count)
    return points[order] + rng.normal(0.0, noise, (count, 2)), labels[order]


class MLP(nn.Module):
    """micrograd's ``MLP(2, [16, 16, 1])``: ReLU after every layer but the last."""

    def __init__(self, sizes):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b, dtype=np.float64) for a, b in zip(sizes, sizes[1:]))
        for layer in self.layers:
            nn.init.uniform_(layer.weight, -1.0, 1.0)
            nn.init.zeros_(layer.bias)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = x.relu()
        return x


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    X, y = make_moons(100, 0.1, rng)
    textnet.manual_seed(args.seed)
    model = MLP([2, 16, 16, 1])
    inputs, labels = textnet.tensor(X), textnet.tensor(y.reshape(-1, 1))
    optimizer = textnet.optim.SGD(model.parameters(), lr=1.0)

    history = []
    for k in range(args.steps):
        scores = model(inputs)
        data_loss = (1 - labels * scores).relu().mean()
        reg_loss = 1e-4 * sum((p * p).sum() for p in model.parameters())
        total_loss = data_loss + reg_loss
        accuracy = float(np.mean((y > 0) == (scores.numpy()[:, 0] > 0)))

        optimizer.zero_grad()
        total_loss.backward()
        optimizer.param_groups[0]["lr"] = 1.0 - 0.9 * k / 100
        optimizer.step()

        history.append((total_loss.item(), accuracy))
        print(f"step {k} loss {total_loss.item():.6f}, accuracy {accuracy * 100:.0f}%")
    return history


if __name__ == "__main__":
    main()
