"""The language models, the datasets and the selftest."""

import pydoc

import numpy as np
import pytest

import textnet


def test_mnist_as_arrays(fashion):
    X, y, X_test, y_test = fashion
    assert X.shape == (60000, 784) and X.dtype == np.float32 and 0 <= X.min() and X.max() == 1
    assert y.shape == (60000,) and y.dtype == np.int64 and set(np.unique(y)) == set(range(10))
    assert X_test.shape == (10000, 784) and y_test.shape == (10000,)
    assert textnet.datasets.class_names("fashion")[9] == "Ankle boot"
    assert textnet.datasets.class_names("digits")[3] == "3"


def test_text_model_trains_predicts_generates_and_saves(corpus, tmp_path, capsys):
    model = textnet.TextModel.train(corpus, epochs=1, device="cpu", max_tokens=4000, quiet=True)
    top = model.predict("to be or", top=3)
    assert len(top) == 3 and all(isinstance(t, str) and 0 < p <= 1 for t, p in top)
    assert top[0][1] >= top[1][1] >= top[2][1]
    text = model.generate("to be", length=8, seed=3)
    assert text and text == model.generate("to be", length=8, seed=3)
    path = tmp_path / "text.safetensors"
    model.save(path)
    assert textnet.TextModel.load(path).predict("to be or", top=3) == top
    with pytest.raises(ValueError):
        textnet.Transformer.load(path)
    with pytest.raises(ValueError):
        model.predict("to be", top=0)
    with pytest.raises(ValueError):
        model.generate("to be", temperature=-1)


def test_transformer_trains_generates_and_saves(corpus, tmp_path):
    out = tmp_path / "kept.safetensors"
    model = textnet.Transformer.train(corpus, steps=10, device="cpu", layers=1, embed=16, heads=2, block=16,
                                      batch=4, eval_every=5, quiet=True, out=out)
    assert out.exists()
    text = model.generate("ROMEO:", length=20, temperature=0.8, top_k=5, seed=1)
    assert len(text) == 20
    assert not hasattr(model, "predict")  # a Transformer generates; only the text model ranks next tokens
    with pytest.raises(ValueError):
        textnet.TextModel.load(out)


@pytest.mark.parametrize("kind, command", [(textnet.TextModel, "train"), (textnet.Transformer, "transformer")])
def test_train_help_names_the_kinds_command(kind, command):
    doc = pydoc.render_doc(kind.train, renderer=pydoc.plaintext)
    assert "{" not in doc, doc
    assert f"``textnet {command} CORPUS --flag value" in doc and f"``textnet {command} --help``" in doc, doc
    assert kind.train.__qualname__ == f"{kind.__name__}.train"


def test_selftest_without_a_gpu_names_the_cause():
    try:
        table = textnet.selftest(quick=True, only=["xor"])
    except RuntimeError as e:
        assert "GPU" in str(e)
    else:  # on a GPU machine: the check table
        assert table and all({"kernel", "shape", "rel_error", "tolerance", "passed"} <= set(row) for row in table)
        assert all(row["passed"] for row in table)
