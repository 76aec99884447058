//! `nn`'s containers and state dicts: `Sequential` names its children's parameters as PyTorch does and
//! runs them in order, `ModuleList` has no forward, both pass `set_training` down, a parent composes names
//! (`blocks.0.attn.weight`); a state dict saved to safetensors loads back to the bit, each mismatch is one
//! line naming the parameter and its shapes, a file that is not safetensors is refused, and neither a
//! failed save nor a refused load changes what was there.

use rand::SeedableRng;
use std::cell::Cell;
use std::rc::Rc;
use textnet::nn::{
    self, Linear, Module, ModuleList, Sequential, Tensor, linear, load_state_dict, load_state_dict_file, prefixed,
    read_state_dict, save_state_dict, state_dict,
};
use textnet::ops::cpu::SeededRng;

/// ReLU as a module: no parameters, so it keeps a number of a `Sequential` without a name in it.
struct Relu;

impl Module<f32> for Relu {
    fn forward(&self, x: &Tensor<f32>) -> nn::Result<Tensor<f32>> {
        x.relu()
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<f32>)> {
        Vec::new()
    }
}

/// Records the last `set_training` it was given.
struct Probe(Rc<Cell<Option<bool>>>);

impl Module<f32> for Probe {
    fn forward(&self, x: &Tensor<f32>) -> nn::Result<Tensor<f32>> {
        Ok(x.clone())
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<f32>)> {
        Vec::new()
    }

    fn set_training(&self, training: bool) {
        self.0.set(Some(training));
    }
}

/// A 3 → 4 → ReLU → 2 network (its last layer without bias) drawn from `seed`.
fn mlp(seed: u64, hidden: usize) -> Sequential<f32> {
    let mut rng = SeededRng::seed_from_u64(seed);
    Sequential::new()
        .with(Linear::new(3, hidden, true, &mut rng).unwrap())
        .with(Relu)
        .with(Linear::new(hidden, 2, false, &mut rng).unwrap())
}

fn names<F: textnet::ops::cpu::Real>(named: &[(String, Tensor<F>)]) -> Vec<&str> {
    named.iter().map(|(name, _)| name.as_str()).collect()
}

fn bits(module: &dyn Module<f32>) -> Vec<Vec<u32>> {
    module.parameters().iter().map(|p| p.to_vec().iter().map(|v| v.to_bits()).collect()).collect()
}

#[test]
fn sequential_names_its_children_by_position_and_runs_them_in_order() {
    let model = mlp(1, 4);
    assert_eq!(names(&model.named_parameters()), ["0.weight", "0.bias", "2.weight"]);
    assert_eq!((model.len(), model[1].named_parameters().len(), model.get(3).is_none()), (3, 0, true));
    let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25, 0.0, -3.0], &[2, 3]).unwrap();
    let [w0, b0, w2] = <[Tensor<f32>; 3]>::try_from(model.parameters()).unwrap();
    let by_hand = linear(&linear(&x, &w0, Some(&b0)).unwrap().relu().unwrap(), &w2, None).unwrap();
    assert_eq!(model.forward(&x).unwrap().to_vec(), by_hand.to_vec());
    assert_eq!(Sequential::<f32>::new().forward(&x).unwrap().to_vec(), x.to_vec());
}

/// A transformer-like block that names its child `attn`.
struct Block {
    attn: Linear<f32>,
}

impl Module<f32> for Block {
    fn forward(&self, x: &Tensor<f32>) -> nn::Result<Tensor<f32>> {
        self.attn.forward(x)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<f32>)> {
        prefixed("attn", self.attn.named_parameters())
    }
}

/// Blocks in a list, then a head.
struct Model {
    blocks: ModuleList<f32>,
    head: Linear<f32>,
}

impl Module<f32> for Model {
    fn forward(&self, x: &Tensor<f32>) -> nn::Result<Tensor<f32>> {
        let h = self.blocks.iter().try_fold(x.clone(), |h, block| block.forward(&h))?;
        self.head.forward(&h)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<f32>)> {
        let blocks = prefixed("blocks", self.blocks.named_parameters());
        blocks.into_iter().chain(prefixed("head", self.head.named_parameters())).collect()
    }

    fn set_training(&self, training: bool) {
        self.blocks.set_training(training);
    }
}

#[test]
fn parents_compose_their_childrens_names() {
    let mut rng = SeededRng::seed_from_u64(2);
    let mut blocks = ModuleList::new();
    for _ in 0..2 {
        blocks.push(Block { attn: Linear::new(3, 3, true, &mut rng).unwrap() });
    }
    let model = Model { blocks, head: Linear::new(3, 1, false, &mut rng).unwrap() };
    assert_eq!(
        names(&model.named_parameters()),
        ["blocks.0.attn.weight", "blocks.0.attn.bias", "blocks.1.attn.weight", "blocks.1.attn.bias", "head.weight"]
    );
    assert_eq!(model.forward(&Tensor::zeros(&[4, 3]).unwrap()).unwrap().shape(), [4, 1]);
    let x = Tensor::<f32>::zeros(&[1, 3]).unwrap();
    let err = model.blocks.forward(&x).unwrap_err().to_string();
    assert_eq!(err, "ModuleList: has no forward: call its modules in turn, or use a Sequential");
}

#[test]
fn set_training_reaches_every_child() {
    let (inner, outer) = (Rc::new(Cell::new(None)), Rc::new(Cell::new(None)));
    let list = ModuleList::new().with(Relu).with(Probe(inner.clone()));
    let model = Sequential::new().with(list).with(Probe(outer.clone()));
    model.set_training(false);
    assert_eq!((inner.get(), outer.get()), (Some(false), Some(false)));
    model.set_training(true);
    assert_eq!((inner.get(), outer.get()), (Some(true), Some(true)));
    let boxed: Vec<Box<dyn Module<f32>>> = vec![Box::new(Relu), Box::new(Probe(inner.clone()))];
    Sequential::from(boxed).set_training(false);
    assert_eq!(inner.get(), Some(false));
}

#[test]
fn state_dict_shares_the_parameters_values_under_their_names() {
    let model = mlp(3, 4);
    let state = state_dict(&model);
    assert_eq!(names(&state), ["0.weight", "0.bias", "2.weight"]);
    assert!(state.iter().all(|(_, t)| !t.requires_grad()));
    let weight = &model.named_parameters()[0].1;
    assert_eq!(state[0].1.to_vec(), weight.to_vec());
    weight.update_in_place(|w| w[0] = 42.0).unwrap();
    assert_eq!(state[0].1.to_vec()[0], 42.0, "a later change shows, as in PyTorch");
}

#[test]
fn a_saved_state_dict_loads_back_to_the_bit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlp.safetensors");
    let saved = mlp(4, 5);
    // Values whose bits a conversion would lose: −0, a subnormal, NaN with a payload, infinities.
    let odd = [-0.0f32, f32::from_bits(1), f32::from_bits(0x7fc0_1234), f32::INFINITY, f32::NEG_INFINITY];
    saved.named_parameters()[1].1.update_in_place(|b| b.copy_from_slice(&odd)).unwrap();
    save_state_dict(&saved, &path).unwrap();
    let loaded = mlp(5, 5);
    assert_ne!(bits(&loaded), bits(&saved));
    load_state_dict_file(&loaded, &path, true).unwrap();
    assert_eq!(bits(&loaded), bits(&saved));
    // The same model gives the same bytes; the file lists the tensors in its order, all F32.
    let first = std::fs::read(&path).unwrap();
    save_state_dict(&loaded, &path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), first);
    let read = read_state_dict::<f32>(&path).unwrap();
    let mut sorted = names(&state_dict(&saved)).into_iter().map(String::from).collect::<Vec<_>>();
    sorted.sort();
    assert_eq!(names(&read), sorted);
    // An f64 model reads the f32 values widened.
    let double = Sequential::<f64>::new().with(Linear::from_parameters(Tensor::zeros(&[5, 3]).unwrap(), None).unwrap());
    load_state_dict_file(&double, &path, false).unwrap();
    let widened: Vec<f64> = saved.parameters()[0].to_vec().iter().map(|&v| v as f64).collect();
    assert_eq!(double.parameters()[0].to_vec(), widened);
    // From a state dict in memory, as well.
    let again = mlp(6, 5);
    load_state_dict(&again, &state_dict(&saved), true).unwrap();
    assert_eq!(bits(&again), bits(&saved));
}

#[test]
fn each_mismatch_is_one_line_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlp.safetensors");
    save_state_dict(&mlp(7, 4), &path).unwrap();
    let refused = |model: &dyn Module<f32>, strict: bool, expected: &str| {
        let before = bits(model);
        let err = load_state_dict_file(model, &path, strict).unwrap_err().to_string();
        assert_eq!(err, expected);
        assert_eq!(bits(model), before, "a refused load changes nothing");
    };
    let wider = mlp(8, 6);
    refused(&wider, true, "load_state_dict: 0.weight is [4, 3] in the file but [6, 3] in the model");
    refused(&wider, false, "load_state_dict: 0.weight is [4, 3] in the file but [6, 3] in the model");
    let longer = mlp(8, 4).with(Relu).with(Linear::new(2, 2, true, &mut SeededRng::seed_from_u64(0)).unwrap());
    refused(&longer, true, "load_state_dict: 4.weight [2, 2] of the model is missing from the file");
    let mut rng = SeededRng::seed_from_u64(9);
    let shorter = Sequential::new().with(Linear::<f32>::new(3, 4, true, &mut rng).unwrap());
    refused(&shorter, true, "load_state_dict: 2.weight [2, 4] in the file is not in the model");

    // Not strict: what matches loads, the rest is left.
    let file = mlp(7, 4);
    let before = bits(&longer);
    load_state_dict_file(&longer, &path, false).unwrap();
    assert_eq!(bits(&longer)[..3], bits(&file)[..]);
    assert_eq!(bits(&longer)[3..], before[3..]);
    load_state_dict_file(&shorter, &path, false).unwrap();
    assert_eq!(bits(&shorter)[..], bits(&file)[..2]);

    // A state dict in memory is named as such; a name given twice is refused.
    let state = state_dict(&mlp(10, 4));
    let err = load_state_dict(&wider, &state, true).unwrap_err().to_string();
    assert_eq!(err, "load_state_dict: 0.weight is [4, 3] in the state dict but [6, 3] in the model");
    let twice = vec![state[0].clone(), state[1].clone(), state[0].clone()];
    let err = load_state_dict(&file, &twice, false).unwrap_err().to_string();
    assert_eq!(err, "load_state_dict: the state dict names two tensors 0.weight");
}

/// Names two of its parameters alike.
struct SameNames(Tensor<f32>, Tensor<f32>);

impl Module<f32> for SameNames {
    fn forward(&self, x: &Tensor<f32>) -> nn::Result<Tensor<f32>> {
        Ok(x.clone())
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<f32>)> {
        vec![("w".into(), self.0.clone()), ("w".into(), self.1.clone())]
    }
}

#[test]
fn a_failed_save_leaves_the_file_that_was_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    save_state_dict(&mlp(11, 4), &path).unwrap();
    let before = std::fs::read(&path).unwrap();
    let bad = SameNames(Tensor::zeros(&[2]).unwrap(), Tensor::zeros(&[3]).unwrap());
    let err = save_state_dict(&bad, &path).unwrap_err().to_string();
    assert_eq!(err, "save_state_dict: the model names two tensors w");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let err = load_state_dict_file(&bad, &path, true).unwrap_err().to_string();
    assert_eq!(err, "load_state_dict: the model names two tensors w");
    // A directory where the file should go: the write fails, the directory stays, no temporary is left.
    let taken = dir.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("inside"), b"kept").unwrap();
    let err = save_state_dict(&mlp(11, 4), &taken).unwrap_err().to_string();
    assert!(err.starts_with(&format!("save_state_dict: {} cannot be written: ", taken.display())), "{err}");
    assert_eq!(err.lines().count(), 1);
    assert_eq!(std::fs::read(taken.join("inside")).unwrap(), b"kept");
    let mut left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    left.sort();
    assert_eq!(left, ["model.safetensors", "taken"]);
}

#[test]
fn a_file_that_is_not_a_state_dict_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let model = mlp(12, 4);
    let refused = |path: &std::path::Path, expected: &str| {
        let err = load_state_dict_file(&model, path, true).unwrap_err().to_string();
        assert_eq!(err, format!("load_state_dict: {} {expected}", path.display()));
    };
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "a line of text, not a model\n").unwrap();
    refused(&text, "is not a safetensors file (header too large)");
    let short = dir.path().join("short.safetensors");
    std::fs::write(&short, [1u8, 2, 3]).unwrap();
    refused(&short, "is not a safetensors file (header too small)");
    refused(&dir.path().join("absent.safetensors"), "cannot be read: No such file or directory (os error 2)");
    let double = dir.path().join("double.safetensors");
    let bytes: Vec<u8> = [1.0f64, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F64, vec![2], &bytes).unwrap();
    std::fs::write(&double, safetensors::serialize([("0.bias", view)], None).unwrap()).unwrap();
    refused(&double, "holds 0.bias as F64; a state dict is read from F32 tensors only");
}
