"""Where the Python MLP step's time goes beyond the engine's: the 784-128-10 MLP of scripts/nn_mlp_python.py,
compiled, timed three ways over the same steps after its capture (wall µs a step after the GPU finishes,
median of 5 rounds of 938 steps): the compiled call as users make it (inputs refilled, graph replayed);
the graph replayed from Python with no refill; the refill alone (two device copies a step)."""
import importlib.util
import json
import time

spec = importlib.util.spec_from_file_location("mlp", "scripts/nn_mlp_python.py")
mlp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mlp)
np, textnet, F = mlp.np, mlp.textnet, mlp.F

textnet.manual_seed(1)
rng = np.random.default_rng(1)
model = mlp.Mlp().to("cuda")
optimizer = textnet.optim.Adam(model.parameters(), lr=1e-3)
x = textnet.tensor(rng.standard_normal((64, 784)).astype(np.float32), device="cuda")
y = textnet.tensor(rng.integers(0, 10, 64), device="cuda")


def train_step(x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


step = textnet.compile(train_step)
for _ in range(4):
    loss = step(x, y)
captured = step._last
replay = lambda: captured.step.run(lambda: train_step(*captured.inputs))  # noqa: E731


def timed(one):
    times = []
    for _ in range(6):
        started = time.perf_counter()
        for _ in range(938):
            one()
        loss.item()
        x.numpy()
        times.append((time.perf_counter() - started) * 1e6 / 938)
    return sorted(times[1:])[2]


rows = {
    "compiled call (refill + replay)": timed(lambda: step(x, y)),
    "replay only": timed(replay),
    "refill only": timed(lambda: (captured.inputs[0].copy_(x), captured.inputs[1].copy_(y))),
}
print(json.dumps({"wall_us_per_step": rows, "fusions": step.fusions()}))
