//! The model a user writes for `textnet fit --layers` (or builds as a `Spec` value): a list of layers that reads like PyTorch's
//! `nn.Sequential`, e.g. `Linear(784, 256), ReLU, Dropout(0.1), Linear(256, 10)`.
//!
//! Layers (names as PyTorch spells them, in any case; parentheses optional where there are no
//! arguments): `Linear(in, out[, bias=false])` or `Linear(out)` (its input width from the layer before
//! or the data, as `nn.LazyLinear`), `ReLU`, `Sigmoid`, `Tanh`, `GELU`, `Dropout(p)`, `Conv2d(cin, cout,
//! k[, stride, padding])` (also `stride=`, `padding=`), `MaxPool2d(k)` and `Flatten`.
//!
//! `parse` reads the text, naming the character where it goes wrong; `Spec::chain` follows the shapes
//! from the data's through every layer, naming the layer where they do not fit.

use anyhow::{Result, bail};

/// One layer as written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Layer {
    /// A dense layer: `outputs` × `inputs` weights (`inputs` none: from the layer before), and a bias
    /// unless `bias=false`.
    Linear {
        /// Input width, if written.
        inputs: Option<usize>,
        /// Output width.
        outputs: usize,
        /// Whether it adds a bias.
        bias: bool,
    },
    /// max(0, x).
    Relu,
    /// 1 / (1 + e^−x).
    Sigmoid,
    /// tanh x.
    Tanh,
    /// GELU, tanh form.
    Gelu,
    /// Zeroes each value with probability `p` in training (the rest scaled by 1 / (1 − p)); off in
    /// evaluation.
    Dropout(f32),
    /// A 2-D convolution over `[channels][height][width]` images.
    Conv2d {
        /// Input channels.
        inputs: usize,
        /// Output channels.
        outputs: usize,
        /// Kernel side.
        kernel: usize,
        /// Step between windows.
        stride: usize,
        /// Zeros added on every side.
        padding: usize,
    },
    /// The largest value of each `k` × `k` window, windows not overlapping.
    MaxPool2d(usize),
    /// `[channels][height][width]` read as one vector.
    Flatten,
}

impl Layer {
    /// `Linear(inputs, outputs)` with a bias, as `parse` reads it.
    pub fn dense(inputs: usize, outputs: usize) -> Layer {
        Layer::Linear { inputs: Some(inputs), outputs, bias: true }
    }

    /// The layer's name as PyTorch spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Layer::Linear { .. } => "Linear",
            Layer::Relu => "ReLU",
            Layer::Sigmoid => "Sigmoid",
            Layer::Tanh => "Tanh",
            Layer::Gelu => "GELU",
            Layer::Dropout(_) => "Dropout",
            Layer::Conv2d { .. } => "Conv2d",
            Layer::MaxPool2d(_) => "MaxPool2d",
            Layer::Flatten => "Flatten",
        }
    }
}

/// The layers as a spec with every width written out, which `spec::parse` reads back as the same
/// network.
pub fn text(layers: &[Layer]) -> String {
    let one = |layer: &Layer| match *layer {
        Layer::Linear { inputs, outputs, bias } => {
            let widths = match inputs {
                Some(i) => format!("{i}, {outputs}"),
                None => outputs.to_string(),
            };
            if bias { format!("Linear({widths})") } else { format!("Linear({widths}, bias=false)") }
        }
        Layer::Dropout(p) => format!("Dropout({p})"),
        Layer::Conv2d { inputs, outputs, kernel, stride, padding } => {
            format!("Conv2d({inputs}, {outputs}, {kernel}, stride={stride}, padding={padding})")
        }
        Layer::MaxPool2d(k) => format!("MaxPool2d({k})"),
        other => other.name().to_string(),
    };
    layers.iter().map(one).collect::<Vec<_>>().join(", ")
}

/// What flows between layers: a vector of features, or images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `n` features.
    Flat(usize),
    /// `channels` × `height` × `width`.
    Image {
        /// Channels.
        channels: usize,
        /// Rows.
        height: usize,
        /// Columns.
        width: usize,
    },
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shape::Flat(n) => write!(f, "{n} features"),
            Shape::Image { channels, height, width } => write!(f, "{channels}×{height}×{width} images"),
        }
    }
}

/// A model as written: its layers in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// The layers, first to last.
    pub layers: Vec<Layer>,
}

/// The layers of `text` (see the module comment), or an error naming the character where it goes wrong.
pub fn parse(text: &str) -> Result<Spec> {
    let mut parser = Parser { text, at: 0 };
    let mut layers = Vec::new();
    loop {
        parser.skip_space();
        if parser.done() {
            match layers.is_empty() {
                true => bail!("--layers is empty: give layers such as \"Linear(784, 128), ReLU, Linear(128, 10)\""),
                false => parser.fail("a layer after the comma")?,
            }
        }
        layers.push(parser.layer()?);
        parser.skip_space();
        if parser.done() {
            return Ok(Spec { layers });
        }
        if !parser.eat(',') {
            parser.fail("',' between layers")?;
        }
    }
}

/// An argument as written: positional or `name=value`, and where it starts.
#[derive(Clone, Copy)]
struct Argument<'a> {
    name: Option<&'a str>,
    value: &'a str,
    at: usize,
}

struct Parser<'a> {
    text: &'a str,
    /// Byte offset of the next character.
    at: usize,
}

impl<'a> Parser<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    fn done(&self) -> bool {
        self.rest().is_empty()
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, c: char) -> bool {
        let eaten = self.rest().starts_with(c);
        if eaten {
            self.at += c.len_utf8();
        }
        eaten
    }

    /// The 1-based character position of byte offset `at`.
    fn column(&self, at: usize) -> usize {
        self.text[..at].chars().count() + 1
    }

    /// An error at the current character: "expected `what`".
    fn fail<T>(&self, what: &str) -> Result<T> {
        self.fail_at(self.at, &format!("expected {what}"))
    }

    fn fail_at<T>(&self, at: usize, message: &str) -> Result<T> {
        let found = match self.text[at..].chars().next() {
            Some(c) => format!("found {c:?}"),
            None => "found the end".into(),
        };
        bail!(
            "--layers {:?}: at character {}, {message} ({found})",
            crate::harness::console::abridged(self.text),
            self.column(at)
        )
    }

    fn word(&mut self) -> &'a str {
        let rest = self.rest();
        let len = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        self.at += len;
        &rest[..len]
    }

    fn layer(&mut self) -> Result<Layer> {
        let start = self.at;
        let name = self.word();
        if name.is_empty() {
            return self.fail("a layer name such as Linear or ReLU");
        }
        self.skip_space();
        let arguments = if self.eat('(') { self.arguments()? } else { Vec::new() };
        let layer = match name.to_ascii_lowercase().as_str() {
            "linear" => self.linear(start, &arguments)?,
            "relu" => self.bare(Layer::Relu, &arguments)?,
            "sigmoid" => self.bare(Layer::Sigmoid, &arguments)?,
            "tanh" => self.bare(Layer::Tanh, &arguments)?,
            "gelu" => self.bare(Layer::Gelu, &arguments)?,
            "flatten" => self.bare(Layer::Flatten, &arguments)?,
            "dropout" => {
                let [argument] = self.positional::<1>("Dropout(p)", start, &arguments)?;
                let p: f32 = self.number(&argument)?;
                if !(0.0..1.0).contains(&p) {
                    return self.fail_at(argument.at, "Dropout's p must be at least 0 and below 1");
                }
                Layer::Dropout(p)
            }
            "maxpool2d" => {
                let [k] = self.positional::<1>("MaxPool2d(k)", start, &arguments)?;
                Layer::MaxPool2d(self.count(&k)?)
            }
            "conv2d" => self.conv2d(start, &arguments)?,
            _ => {
                return self.fail_at(
                    start,
                    &format!(
                        "unknown layer {name:?} (known: Linear, ReLU, Sigmoid, Tanh, GELU, Dropout, Conv2d, \
                         MaxPool2d, Flatten)"
                    ),
                );
            }
        };
        Ok(layer)
    }

    /// The arguments up to the closing parenthesis (the opening one eaten).
    fn arguments(&mut self) -> Result<Vec<Argument<'a>>> {
        let mut arguments = Vec::new();
        self.skip_space();
        if self.eat(')') {
            return Ok(arguments);
        }
        loop {
            self.skip_space();
            let at = self.at;
            let rest = self.rest();
            let len = rest.find([',', ')']).unwrap_or(rest.len());
            let item = rest[..len].trim_end();
            if item.is_empty() {
                return self.fail("an argument");
            }
            let (name, value) = match item.split_once('=') {
                Some((name, value)) => (Some(name.trim()), value.trim()),
                None => (None, item),
            };
            if let Some(name) = name
                && arguments.iter().any(|a: &Argument| a.name == Some(name))
            {
                return self.fail_at(at, &format!("{name} given twice"));
            }
            arguments.push(Argument { name, value, at });
            self.at += len;
            if self.eat(')') {
                return Ok(arguments);
            }
            if !self.eat(',') {
                return self.fail("')' closing the arguments");
            }
        }
    }

    fn bare(&self, layer: Layer, arguments: &[Argument]) -> Result<Layer> {
        match arguments.first() {
            None => Ok(layer),
            Some(a) => self.fail_at(a.at, &format!("{} takes no arguments", layer.name())),
        }
    }

    /// Exactly `N` positional arguments, for a layer written as `form`.
    fn positional<const N: usize>(
        &self,
        form: &str,
        start: usize,
        arguments: &[Argument<'a>],
    ) -> Result<[Argument<'a>; N]> {
        if let Some(a) = arguments.iter().find(|a| a.name.is_some()) {
            return self.fail_at(a.at, &format!("{form} takes no named arguments"));
        }
        if arguments.len() != N {
            return self.fail_at(start, &format!("{form} takes {N} argument{}", if N == 1 { "" } else { "s" }));
        }
        Ok(std::array::from_fn(|i| arguments[i]))
    }

    fn number<T: std::str::FromStr>(&self, a: &Argument) -> Result<T> {
        match a.value.parse() {
            Ok(v) => Ok(v),
            Err(_) => self.fail_at(a.at, &format!("{:?} is not a number", a.value)),
        }
    }

    /// A whole number, 0 included.
    fn whole(&self, a: &Argument) -> Result<usize> {
        match a.value.parse::<usize>() {
            Ok(n) => Ok(n),
            _ => self.fail_at(a.at, &format!("{:?} is not a whole number", a.value)),
        }
    }

    /// A whole number of 1 or more.
    fn count(&self, a: &Argument) -> Result<usize> {
        match a.value.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => self.fail_at(a.at, &format!("{:?} is not a whole number of 1 or more", a.value)),
        }
    }

    fn linear(&self, start: usize, arguments: &[Argument]) -> Result<Layer> {
        let mut bias = true;
        let mut widths = Vec::new();
        for a in arguments {
            match a.name {
                None if widths.len() < 2 => widths.push(self.count(a)?),
                None => return self.fail_at(a.at, "Linear takes at most two widths: Linear(in, out) or Linear(out)"),
                Some("bias") => {
                    bias = match a.value.to_ascii_lowercase().as_str() {
                        "true" => true,
                        "false" => false,
                        _ => return self.fail_at(a.at, "bias takes true or false"),
                    }
                }
                Some(other) => return self.fail_at(a.at, &format!("Linear has no argument {other:?} (only bias=)")),
            }
        }
        match widths[..] {
            [outputs] => Ok(Layer::Linear { inputs: None, outputs, bias }),
            [inputs, outputs] => Ok(Layer::Linear { inputs: Some(inputs), outputs, bias }),
            _ => self.fail_at(start, "Linear takes its widths: Linear(in, out) or Linear(out)"),
        }
    }

    fn conv2d(&self, start: usize, arguments: &[Argument]) -> Result<Layer> {
        let mut values = [None; 5];
        let mut next = 0;
        for a in arguments {
            let slot = match a.name {
                None if next < 5 => {
                    next += 1;
                    next - 1
                }
                None => return self.fail_at(a.at, "Conv2d takes at most five arguments"),
                Some("stride") => 3,
                Some("padding") => 4,
                Some(other) => {
                    return self
                        .fail_at(a.at, &format!("Conv2d has no argument {other:?} (only stride= and padding=)"));
                }
            };
            values[slot] = Some(if slot == 4 { self.whole(a)? } else { self.count(a)? });
        }
        match values {
            [Some(inputs), Some(outputs), Some(kernel), stride, padding] => Ok(Layer::Conv2d {
                inputs,
                outputs,
                kernel,
                stride: stride.unwrap_or(1),
                padding: padding.unwrap_or(0),
            }),
            _ => self.fail_at(start, "Conv2d takes Conv2d(in_channels, out_channels, kernel[, stride, padding])"),
        }
    }
}

impl Spec {
    /// Follows `input` through every layer: the shape after each, or an error naming the first layer
    /// whose input does not fit ("layer 3 (Linear) takes 64 inputs but layer 2 gives 128").
    pub fn chain(&self, input: Shape) -> Result<Vec<Shape>> {
        let mut shapes = Vec::with_capacity(self.layers.len());
        let mut shape = input;
        for (i, layer) in self.layers.iter().enumerate() {
            let (n, name) = (i + 1, layer.name());
            let before = if i == 0 { "the data gives".to_string() } else { format!("layer {i} gives") };
            shape = match (*layer, shape) {
                (Layer::Linear { inputs: Some(k), .. }, Shape::Flat(m)) if k != m => {
                    bail!("layer {n} ({name}) takes {k} inputs but {before} {m}")
                }
                (Layer::Linear { outputs, .. }, Shape::Flat(_)) => Shape::Flat(outputs),
                (Layer::Linear { .. }, image) => {
                    bail!("layer {n} ({name}) takes features but {before} {image}: put Flatten before it")
                }
                (
                    Layer::Conv2d { inputs, outputs, kernel, stride, padding },
                    Shape::Image { channels, height, width },
                ) => {
                    if inputs != channels {
                        bail!("layer {n} ({name}) takes {inputs} channels but {before} {channels}");
                    }
                    let side =
                        |s: usize| padding.checked_mul(2)?.checked_add(s)?.checked_sub(kernel).map(|d| d / stride + 1);
                    match (side(height), side(width)) {
                        (Some(h), Some(w)) => Shape::Image { channels: outputs, height: h, width: w },
                        _ => bail!(
                            "layer {n} ({name}): its {kernel}×{kernel} kernel is larger than the {height}×{width} images {before}"
                        ),
                    }
                }
                (Layer::Conv2d { .. }, Shape::Flat(m)) => {
                    bail!(
                        "layer {n} ({name}) takes images but {before} {m} features (Conv2d cannot follow Flatten or Linear)"
                    )
                }
                (Layer::MaxPool2d(k), Shape::Image { channels, height, width }) => {
                    if height < k || width < k {
                        bail!(
                            "layer {n} ({name}): its {k}×{k} window is larger than the {height}×{width} images {before}"
                        );
                    }
                    Shape::Image { channels, height: height / k, width: width / k }
                }
                (Layer::MaxPool2d(_), Shape::Flat(m)) => {
                    bail!("layer {n} ({name}) takes images but {before} {m} features")
                }
                (Layer::Flatten, Shape::Image { channels, height, width }) => {
                    match channels.checked_mul(height).and_then(|c| c.checked_mul(width)) {
                        Some(features) => Shape::Flat(features),
                        None => {
                            bail!("layer {n} ({name}): {channels}×{height}×{width} images are too large to flatten")
                        }
                    }
                }
                (Layer::Flatten, flat) => flat,
                (_, shape) => shape,
            };
            shapes.push(shape);
        }
        Ok(shapes)
    }
}
