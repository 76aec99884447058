//! `textnet fit --layers`: the spec a user writes, parsed as PyTorch's `nn.Sequential` reads, with
//! one-line errors naming the character or the layer where it goes wrong.

use textnet::nn::stack::spec::{Layer, Shape, parse};

#[test]
fn a_spec_reads_as_pytorch_writes_it() {
    let spec = parse("Linear(784, 256), ReLU, Dropout(0.1), linear(10, bias=false)").unwrap();
    assert_eq!(
        spec.layers,
        [
            Layer::Linear { inputs: Some(784), outputs: 256, bias: true },
            Layer::Relu,
            Layer::Dropout(0.1),
            Layer::Linear { inputs: None, outputs: 10, bias: false },
        ]
    );
    // Parentheses are optional without arguments, spaces anywhere; every layer kind.
    let spec = parse(
        " Conv2d(1, 8, 3, padding=1),ReLU(), MaxPool2d(2), Conv2d(8,16,3,2,0) ,Tanh,Flatten(),GELU,Sigmoid,Linear(10)",
    )
    .unwrap();
    assert_eq!(spec.layers.len(), 9);
    assert_eq!(spec.layers[0], Layer::Conv2d { inputs: 1, outputs: 8, kernel: 3, stride: 1, padding: 1 });
    assert_eq!(spec.layers[3], Layer::Conv2d { inputs: 8, outputs: 16, kernel: 3, stride: 2, padding: 0 });
}

#[test]
fn a_spec_that_does_not_parse_names_the_character() {
    for (text, expected) in [
        ("", "--layers is empty"),
        ("Linear(784, 128), Relu2", "at character 19, unknown layer \"Relu2\""),
        ("Linear(784 128)", "at character 8, \"784 128\" is not a whole number of 1 or more"),
        ("Linear(784, 128) ReLU", "at character 18, expected ',' between layers (found 'R')"),
        ("Linear(784, 128),", "at character 18, expected a layer after the comma (found the end)"),
        ("Linear(784, 128", "expected ')' closing the arguments (found the end)"),
        ("ReLU(1)", "at character 6, ReLU takes no arguments"),
        ("Dropout(1.5)", "at character 9, Dropout's p must be at least 0 and below 1"),
        ("Dropout(x)", "\"x\" is not a number"),
        ("Linear(1, 2, 3)", "Linear takes at most two widths"),
        ("Linear(0, 2)", "\"0\" is not a whole number of 1 or more"),
        ("Linear(4, bias=maybe)", "bias takes true or false"),
        ("Conv2d(1, 8)", "Conv2d takes Conv2d(in_channels, out_channels, kernel[, stride, padding])"),
        ("Conv2d(1, 8, 3, dilation=2)", "Conv2d has no argument \"dilation\""),
        ("MaxPool2d()", "MaxPool2d(k) takes 1 argument"),
        // FS33, FS36: a keyword given twice; a name with a letter beyond ASCII, quoted whole.
        ("Conv2d(1, 4, 3, padding=1, padding=2)", "at character 28, padding given twice"),
        ("Linéar(784, 10)", "at character 1, unknown layer \"Linéar\""),
    ] {
        let err = format!("{:#}", parse(text).unwrap_err());
        assert!(err.contains(expected), "{text:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn an_error_quotes_at_most_a_few_hundred_characters_of_a_long_spec() {
    // FS71: 20,000 layers, the last one wrong.
    let text = ["ReLU"; 20_000].join(", ") + ", Relu2";
    let err = format!("{:#}", parse(&text).unwrap_err());
    assert!(err.contains("unknown layer \"Relu2\"") && err.contains("characters)"), "{err}");
    assert!(err.len() < 600, "{} bytes: {}", err.len(), &err[..300]);
}

#[test]
fn shapes_chain_from_the_data_or_name_the_layer_that_breaks_them() {
    let mnist = Shape::Image { channels: 1, height: 28, width: 28 };
    // The seed's CNN: conv3×3 1→8, ReLU, maxpool 2, conv3×3 8→16, ReLU, maxpool 2, 784 → 64 → 10.
    let cnn = parse("Conv2d(1,8,3,padding=1), ReLU, MaxPool2d(2), Conv2d(8,16,3,padding=1), ReLU, MaxPool2d(2), Flatten, Linear(64), ReLU, Linear(10)").unwrap();
    let shapes = cnn.chain(mnist).unwrap();
    assert_eq!(shapes[5], Shape::Image { channels: 16, height: 7, width: 7 });
    assert_eq!(shapes[6], Shape::Flat(784));
    assert_eq!(*shapes.last().unwrap(), Shape::Flat(10));

    let mlp = parse("Linear(64), ReLU, Linear(10)").unwrap();
    assert_eq!(mlp.chain(Shape::Flat(19)).unwrap(), [Shape::Flat(64), Shape::Flat(64), Shape::Flat(10)]);

    for (text, input, expected) in [
        (
            "Linear(784,128), ReLU, Linear(64,10)",
            Shape::Flat(784),
            "layer 3 (Linear) takes 64 inputs but layer 2 gives 128",
        ),
        ("Linear(700,10)", Shape::Flat(784), "layer 1 (Linear) takes 700 inputs but the data gives 784"),
        ("Flatten, Conv2d(1,8,3)", mnist, "layer 2 (Conv2d) takes images but layer 1 gives 784 features"),
        (
            "Linear(10)",
            mnist,
            "layer 1 (Linear) takes features but the data gives 1×28×28 images: put Flatten before it",
        ),
        ("Conv2d(3,8,3)", mnist, "layer 1 (Conv2d) takes 3 channels but the data gives 1"),
        ("Conv2d(1,8,29)", mnist, "its 29×29 kernel is larger than the 28×28 images"),
        ("MaxPool2d(2)", Shape::Flat(4), "layer 1 (MaxPool2d) takes images but the data gives 4 features"),
    ] {
        let err = format!("{:#}", parse(text).unwrap().chain(input).unwrap_err());
        assert!(err.contains(expected), "{text:?}: {err}");
    }
}
