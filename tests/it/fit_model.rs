//! The `fit` CPU reference: in f64, the gradient of every parameter of every layer kind against central
//! finite differences, and the same comparison catching a wrong gradient; the network's sizes, and the
//! model file's loader checking them against the file's tensors.

use crate::common::relative;
use rand::{RngExt, SeedableRng};
use textnet::nn::stack::model::{self, Init, Loss, Network, Targets};
use textnet::nn::stack::spec::{self, Shape};
use textnet::ops::cpu::SeededRng;
use textnet::ops::dropout::DropoutKey;

const STEP: f64 = 1e-6;
const ROWS: usize = 3;

/// A random problem for `layers` over samples of shape `input`: parameters, inputs, and targets for `loss`.
struct Problem {
    net: Network,
    params: Vec<f64>,
    x: Vec<f64>,
    classes: Vec<u32>,
    values: Vec<f32>,
    loss: Loss,
    dropout: Option<DropoutKey>,
}

impl Problem {
    fn new(layers: &str, input: Shape, loss: Loss, seed: u64) -> Problem {
        let net = Network::new(&spec::parse(layers).unwrap(), input).unwrap();
        let mut rng = SeededRng::seed_from_u64(seed);
        let params = net.init(Init::Pytorch, seed).iter().map(|&v| v as f64 * 2.0).collect();
        let x = (0..ROWS * net.inputs()).map(|_| rng.random_range(-1.0..1.0)).collect();
        let classes = (0..ROWS).map(|_| rng.random_range(0..net.outputs() as u32)).collect();
        let values = (0..ROWS * net.outputs()).map(|_| rng.random_range(-1.0..1.0)).collect();
        Problem { net, params, x, classes, values, loss, dropout: Some(DropoutKey { seed: seed as u32, step: 7 }) }
    }

    fn targets(&self) -> Targets<'_> {
        match self.loss {
            Loss::Ce => Targets::Classes(&self.classes),
            Loss::Mse => Targets::Values(&self.values),
        }
    }

    /// The mean loss at `params`.
    fn mean_loss(&self, params: &[f64]) -> f64 {
        let trace = model::forward(&self.net, params, &self.x, ROWS, self.dropout);
        model::loss(self.loss, trace.values.last().unwrap(), ROWS, self.net.outputs(), self.targets()).0 / ROWS as f64
    }

    fn analytic(&self) -> Vec<f64> {
        model::loss_and_grad(&self.net, &self.params, &self.x, ROWS, self.targets(), self.loss, self.dropout).1
    }

    fn numeric(&self) -> Vec<f64> {
        (0..self.params.len())
            .map(|i| {
                let at = |delta: f64| {
                    let mut p = self.params.clone();
                    p[i] += delta;
                    self.mean_loss(&p)
                };
                (at(STEP) - at(-STEP)) / (2.0 * STEP)
            })
            .collect()
    }

    /// Whether no finite-difference step can carry a ReLU input or a max-pool's winner across its kink.
    fn clear_of_kinks(&self) -> bool {
        let trace = model::forward(&self.net, &self.params, &self.x, ROWS, self.dropout);
        model::kink_margin(&self.net, &trace) > 1e-4
    }
}

/// The first seed's problem that is clear of kinks: its analytic and numeric gradients.
fn gradients(layers: &str, input: Shape, loss: Loss) -> (Vec<f64>, Vec<f64>) {
    let problem = (1..200)
        .map(|seed| Problem::new(layers, input, loss, seed))
        .find(Problem::clear_of_kinks)
        .unwrap_or_else(|| panic!("no seed keeps {layers} clear of kinks"));
    (problem.analytic(), problem.numeric())
}

fn check(layers: &str, input: Shape, loss: Loss) {
    let (analytic, numeric) = gradients(layers, input, loss);
    assert!(!analytic.is_empty());
    assert!(analytic.iter().any(|&g| g != 0.0), "{layers}: every gradient is zero");
    let err = relative(&numeric, &analytic);
    assert!(err < 1e-6, "{layers}: relative error {err:.2e}\nanalytic {analytic:?}\nnumeric  {numeric:?}");
}

const IMAGE: Shape = Shape::Image { channels: 2, height: 7, width: 6 };

#[test]
fn linear_layers_with_and_without_bias_match_finite_differences() {
    check("Linear(5, 4), Linear(3, bias=false), Linear(2)", Shape::Flat(5), Loss::Ce);
}

#[test]
fn every_activation_matches_finite_differences() {
    for act in ["ReLU", "Sigmoid", "Tanh", "GELU"] {
        check(&format!("Linear(4, 6), {act}, Linear(6, 3)"), Shape::Flat(4), Loss::Ce);
    }
}

#[test]
fn dropout_with_its_mask_fixed_matches_finite_differences() {
    check("Linear(4, 16), Dropout(0.5), Tanh, Linear(16, 2)", Shape::Flat(4), Loss::Mse);
}

#[test]
fn conv_with_stride_and_padding_matches_finite_differences() {
    check("Conv2d(2, 3, 3, stride=2, padding=1), Tanh, Conv2d(3, 2, 2), Flatten, Linear(3)", IMAGE, Loss::Ce);
}

#[test]
fn max_pool_and_flatten_match_finite_differences() {
    check("Conv2d(2, 3, 3, padding=1), ReLU, MaxPool2d(2), Flatten, Linear(2)", IMAGE, Loss::Mse);
}

#[test]
fn squared_error_with_several_outputs_matches_finite_differences() {
    check("Linear(3, 5), GELU, Linear(4)", Shape::Flat(3), Loss::Mse);
}

#[test]
fn a_wrong_gradient_fails_the_comparison() {
    let (analytic, numeric) =
        gradients("Conv2d(2, 3, 3, padding=1), ReLU, MaxPool2d(2), Flatten, Linear(2)", IMAGE, Loss::Ce);
    assert!(relative(&numeric, &analytic) < 1e-6);
    // One conv weight's gradient 1 % off is enough to fail.
    let mut wrong = analytic.clone();
    let i = wrong.iter().position(|&g| g.abs() > 1e-3).unwrap();
    wrong[i] *= 1.01;
    assert!(relative(&numeric, &wrong) > 1e-5);
}

#[test]
fn dropout_drops_about_p_of_the_values_and_is_off_in_evaluation() {
    let net = Network::new(&spec::parse("Dropout(0.3)").unwrap(), Shape::Flat(1000)).unwrap();
    let x = vec![1.0f32; 2000];
    let key = DropoutKey { seed: 5, step: 0 };
    let train = model::forward(&net, &[], &x, 2, Some(key));
    let kept = train.values[1].iter().filter(|&&v| v != 0.0).count();
    assert!((1300..1500).contains(&kept), "{kept} of 2000 kept at p = 0.3");
    assert!(train.values[1].iter().all(|&v| v == 0.0 || (v - 1.0 / 0.7).abs() < 1e-6));
    let next = model::forward(&net, &[], &x, 2, Some(DropoutKey { step: 1, ..key }));
    assert_ne!(train.values[1], next.values[1], "each step draws a new mask");
    assert_eq!(model::forward(&net, &[], &x, 2, None).values[1], x);
}

#[test]
fn the_tensors_are_nn_sequential_state_dict_names() {
    let net = Network::new(
        &spec::parse("Conv2d(1, 4, 3), ReLU, MaxPool2d(2), Flatten, Linear(16), ReLU, Linear(16, 10, bias=false)")
            .unwrap(),
        Shape::Image { channels: 1, height: 10, width: 10 },
    )
    .unwrap();
    let names: Vec<(String, Vec<usize>)> = net.tensors().into_iter().map(|(n, d, _)| (n, d)).collect();
    let expect = [
        ("0.weight", vec![4, 1, 3, 3]),
        ("0.bias", vec![4]),
        ("4.weight", vec![16, 64]),
        ("4.bias", vec![16]),
        ("6.weight", vec![10, 16]),
    ];
    assert_eq!(names, expect.map(|(n, d)| (n.to_string(), d)));
    let ends: Vec<usize> = net.tensors().iter().map(|t| t.2.end).collect();
    assert_eq!(*ends.last().unwrap(), net.param_count);
}

#[test]
fn xavier_init_draws_what_mnist_draws_and_pytorch_init_what_sales_draws() {
    use textnet::mnist::model::{Activation, MlpParams, MlpShape};
    let shape = MlpShape { inputs: 784, hidden: 32, classes: 10, activation: Activation::Relu };
    let net = Network::new(&spec::parse("Linear(784, 32), ReLU, Linear(10)").unwrap(), Shape::Flat(784)).unwrap();
    assert_eq!(net.init(Init::Xavier, 9), MlpParams::init(shape, 9).flat);
    use textnet::sales::model::{SalesParams, SalesShape};
    let net = Network::new(&spec::parse("Linear(12, 8), ReLU, Linear(1)").unwrap(), Shape::Flat(12)).unwrap();
    assert_eq!(net.init(Init::Pytorch, 4), SalesParams::init(SalesShape { inputs: 12, hidden: 8 }, 4).flat);
}

/// The bytes of a fit model file of `layers` over 784 features, its parameters drawn from a seed.
fn fit_model_file(layers: &str) -> Vec<u8> {
    use textnet::fit::data::{InputSchema, TargetInfo};
    use textnet::fit::modelfile::{FitModel, to_bytes};
    let net = Network::new(&spec::parse(layers).unwrap(), Shape::Flat(784)).unwrap();
    let params = net.init(Init::Pytorch, 1);
    let names = (0..net.outputs()).map(|c| c.to_string()).collect();
    let input = InputSchema::Array { shape: Shape::Flat(784) };
    to_bytes(&FitModel { net, params, loss: Loss::Ce, input, target: TargetInfo::Classes { names } }).unwrap()
}

/// `bytes`, a model file, with its metadata entry `spec` replaced by `spec` (the tensors as they were).
fn with_spec(bytes: &[u8], spec: &str) -> Vec<u8> {
    crate::common::text::rewrite(bytes, |_, meta| drop(meta.insert("spec".into(), spec.into())))
}

#[test]
fn a_spec_that_lies_about_a_width_is_refused_by_the_tensors_before_anything_is_allocated_mf12() {
    let file = fit_model_file("Linear(784, 32), ReLU, Linear(32, 10)");
    let lying = with_spec(&file, "Linear(784, 1000000000000), ReLU, Linear(1000000000000, 10)");
    let err = format!("{:#}", textnet::fit::modelfile::from_bytes(&lying).unwrap_err());
    assert!(err.contains("tensor 0.weight is [32, 784] but the spec"), "{err}");
    assert!(err.contains("implies [1000000000000, 784]"), "{err}");
}

#[test]
fn an_error_quotes_at_most_the_ends_of_a_long_spec_mf13() {
    let file = fit_model_file("Linear(784, 32), ReLU, Linear(32, 10)");
    let spec = format!("{}Linear(784, 32), ReLU, Linear(32, 10)", "ReLU, ".repeat(100_000));
    let err = format!("{:#}", textnet::fit::modelfile::from_bytes(&with_spec(&file, &spec)).unwrap_err());
    assert!(err.contains("tensor 100000.weight is missing"), "{err}");
    assert!(err.contains(&format!("({} characters)", spec.chars().count())), "{err}");
    assert!(err.len() < 2 * textnet::harness::console::QUOTE_LIMIT, "{} bytes: {err}", err.len());
}

#[test]
fn sizes_past_what_a_machine_counts_are_an_error_not_a_wrapped_count() {
    let huge = 1usize << 32;
    let err = Network::new(&spec::parse(&format!("Linear({huge})")).unwrap(), Shape::Flat(huge)).unwrap_err();
    assert!(err.to_string().contains("layer 1 (Linear) has more parameters than a machine can hold"), "{err}");
    let images = Shape::Image { channels: huge, height: huge, width: 1 };
    let err = Network::new(&spec::parse("ReLU").unwrap(), images).unwrap_err();
    assert!(err.to_string().contains("the data gives 4294967296×4294967296×1 images, more values"), "{err}");
}

#[test]
fn classify_and_fit_refuse_a_file_whose_spec_lies_in_one_line_and_keep_it_mf12_mf45() {
    use crate::common::{fails_with, s, textnet};
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.st");
    let file = fit_model_file("Linear(784, 32), ReLU, Linear(32, 10)");
    std::fs::write(&model, with_spec(&file, "Linear(784, 1000000000000), ReLU, Linear(1000000000000, 10)")).unwrap();
    let image = dir.path().join("x.pgm");
    std::fs::write(&image, [b"P5\n28 28\n255\n".as_slice(), &[128u8; 784]].concat()).unwrap();
    fails_with(&textnet(&["classify", "--model", s(&model), s(&image)]), &["tensor 0.weight is [32, 784]"]);

    let table = dir.path().join("t.csv");
    let rows: String = (0..40).map(|i| format!("{},{}\n", i % 7, ["no", "yes"][i % 2])).collect();
    std::fs::write(&table, format!("x,label\n{rows}")).unwrap();
    let before = std::fs::read(&model).unwrap();
    let o = textnet(&[
        "fit",
        "--device",
        "cpu",
        "--table",
        s(&table),
        "--target",
        "label",
        "--layers",
        "Linear(2)",
        "--epochs",
        "1",
        "--quiet",
        "--out",
        s(&model),
    ]);
    fails_with(&o, &["is not a textnet fit model, so it is not replaced", "tensor 0.weight is [32, 784]"]);
    assert_eq!(std::fs::read(&model).unwrap(), before);
}
