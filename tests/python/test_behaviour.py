"""Training releases the GIL, Ctrl-C stops after the current epoch, which the model keeps, Ctrl-C in a
loop of compiled steps raises KeyboardInterrupt there, and a model in training refuses a second fit."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import textnet
from conftest import random_samples

SPEC = "Linear(784, 64), ReLU, Linear(64, 10)"


def test_training_releases_the_gil(small):
    """Another thread that needs the GIL every millisecond keeps running while the model trains."""
    X, y, _, _ = small
    wakeups = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            time.sleep(0.001)  # releases the GIL, and needs it back to return
            wakeups.append(time.perf_counter())

    # Epochs of 50 ms or more on this machine, whatever its speed (a pass over the samples, timed first,
    # sets how many times they repeat), so that a wakeup every millisecond and one an epoch differ.
    model = textnet.Sequential(SPEC, device="cpu")
    started = time.perf_counter()
    model.fit(X, y, epochs=1, verbose=0)
    repeats = min(50, int(0.05 / max(time.perf_counter() - started, 1e-6)) + 1)
    X, y, epochs = np.concatenate([X] * repeats), np.concatenate([y] * repeats), 10
    thread = threading.Thread(target=tick)
    thread.start()
    try:
        started = time.perf_counter()
        model.fit(X, y, epochs=epochs, verbose=0)
        ended = time.perf_counter()
    finally:
        stop.set()
        thread.join()
    during = [t for t in wakeups if started <= t <= ended]
    seconds = ended - started
    # Held through training, the GIL would let the thread run only between epochs: about one wakeup an
    # epoch, where released it wakes about every millisecond.
    assert len(during) > max(100 * seconds, 5 * epochs), (len(during), seconds, epochs)


# The child restores Python's own Ctrl-C handler first: a process started in the background by a
# non-interactive shell (as CI runners start jobs) inherits SIGINT ignored, and Python then leaves it so.
SCRIPT = """
import signal, sys, textnet
signal.signal(signal.SIGINT, signal.default_int_handler)
(X, y), _ = textnet.datasets.mnist("fashion")
model = textnet.Sequential("Linear(784, 64), ReLU, Linear(64, 10)", device="cpu")
before = model.state_dict()["0.weight"].copy()
class Announce:
    def __init__(self): self.seen = 0
def on_line(*a): pass
try:
    model.fit(X[:20000], y[:20000], epochs=100, verbose=2)
except KeyboardInterrupt as e:
    print("KeyboardInterrupt:", e, flush=True)
    print("epochs kept:", len(model.history.epoch), flush=True)
    print("changed:", bool((model.state_dict()["0.weight"] != before).any()), flush=True)
"""


def test_ctrl_c_stops_after_the_current_epoch():
    child = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    lines = []
    for line in child.stdout:
        lines.append(line)
        if line.startswith("Epoch 1/100"):
            child.send_signal(signal.SIGINT)
            break
    out, err = child.communicate(timeout=120)
    lines += out.splitlines(keepends=True)
    text = "".join(lines)
    assert child.returncode == 0, text + err
    assert "KeyboardInterrupt: stopped after epoch" in text, text + err
    kept = int(text.split("epochs kept: ")[1].split()[0])
    assert 1 <= kept < 100
    assert sum(l.startswith("Epoch ") for l in lines) == kept
    assert "changed: True" in text


def test_a_model_in_training_refuses_a_second_fit_and_can_be_used_meanwhile(monkeypatch):
    """PY22: another thread's fit of the same model is refused at once, its evaluate runs."""
    X, y = random_samples()
    model = textnet.Sequential(SPEC, device="cpu")
    seen = {}
    draw_epoch = textnet.keras._Progress.epoch

    def meanwhile():
        try:
            model.fit(X, y, epochs=1, verbose=0)
        except RuntimeError as e:
            seen["fit"] = str(e)
        seen["evaluate"] = model.evaluate(X, y)

    def on_epoch(progress, epoch, logs):
        if not seen:  # the first epoch's line: the first fit is still running
            other = threading.Thread(target=meanwhile)
            other.start()
            other.join()
        draw_epoch(progress, epoch, logs)

    monkeypatch.setattr(textnet.keras._Progress, "epoch", on_epoch)
    model.fit(X, y, epochs=2, verbose=0)
    assert "this model is being trained by another thread" in seen["fit"]
    assert isinstance(seen["evaluate"], float)  # the loss (no metric compiled)
    assert len(model.history.epoch) == 2


# A loop of compiled steps (captured and replayed on the GPU, the function on the CPU), Ctrl-C'd.
COMPILED_LOOP = """
import signal, sys
import numpy as np
import textnet, textnet.nn.functional as F
from textnet import nn
signal.signal(signal.SIGINT, signal.default_int_handler)
device = sys.argv[1]
textnet.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 10)).to(device)
optimizer = textnet.optim.AdamW(model.parameters(), lr=1e-3)

@textnet.compile
def step(x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss

rng = np.random.default_rng(0)
x = textnet.tensor(rng.standard_normal((128, 64)).astype(np.float32), device=device)
y = textnet.tensor(rng.integers(0, 10, 128), device=device)
steps = 0
try:
    while True:
        step(x, y)
        steps += 1
        if steps == 5:
            print("running", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt after", steps, "steps", flush=True)
    optimizer.zero_grad()
    print("next loss finite:", bool(np.isfinite(step(x, y).item())), flush=True)
"""


def has_gpu():
    try:
        textnet.zeros(1, device="cuda")
        return True
    except RuntimeError:
        return False


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_ctrl_c_in_a_loop_of_compiled_steps_raises_keyboard_interrupt_there(device):
    if device == "cuda" and not has_gpu():
        pytest.skip("no GPU")
    child = subprocess.Popen([sys.executable, "-c", COMPILED_LOOP, device], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    first = child.stdout.readline()
    assert first == "running\n", first + child.stderr.read()
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, out + err
    steps = int(out.split("KeyboardInterrupt after ")[1].split()[0])
    assert steps >= 5
    assert "next loss finite: True" in out, out + err
