"""scripts/mutants.py's mutations stay applicable: each text it mutates occurs exactly once in its kernel
file, so that a kernel change that moves a text fails here, on any machine, rather than on the GPU."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_mutated_text_occurs_once_in_its_kernel_file():
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "scripts" / "mutants.py")
    mutants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutants)
    assert mutants.MUTATIONS
    counts = [(name, file, (ROOT / "fused" / file).read_text().count(text))
              for name, file, text, _replacement, _part in mutants.MUTATIONS]
    assert [c for c in counts if c[2] != 1] == []
