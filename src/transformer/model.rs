//! The character-level Transformer's CPU reference: forward pass, backward pass and AdamW training of a
//! GPT-style decoder (pre-LayerNorm blocks, causal multi-head attention, GELU MLP), the oracle for the GPU
//! kernels and the no-GPU path. For a sequence of T ≤ block token ids (positions t = 0..T−1):
//!
//! ```text
//! x[t] = tok_emb[token[t]] + pos_emb[t]
//! per block:  a = LN1(x);  qkv = a·W_qkvᵀ + b_qkv                        [T][3C]: q, k, v; head h = dims h·hs..(h+1)·hs
//!             s[t][u] = q_h[t]·k_h[u] / √hs (u ≤ t);  p = softmax_u(s);  y_h[t] = Σ_u p[t][u]·v_h[u]
//!             x = x + y·W_projᵀ + b_proj
//!             m = LN2(x);  u = m·W_fcᵀ + b_fc;  g = gelu(u);  x = x + g·W_mprojᵀ + b_mproj
//! xf = LN_f(x);  logits = xf·W_headᵀ + b_head;  loss = mean over all B·T positions of −log softmax(logits)[target]
//! ```
//!
//! Training may drop out (`Dropout`), where nanoGPT does: the embeddings' sum, the attention
//! probabilities (`y_h[t] = Σ_u m[t][u]·p[t][u]·v_h[u]`) and both residual branches before they are added
//! (x = x + m ⊙ (y·W_projᵀ + b_proj), likewise the MLP's), each mask a hash of (seed, step, site, element)
//! (`crate::ops::dropout`) so that the GPU draws the same; survivors are scaled by 1/(1 − p).
//!
//! `Config::bias` off drops every `b` above (nanoGPT's bias=False: the LayerNorms only scale);
//! `Config::tie_weights` makes W_head tok_emb itself, whose gradient then adds both uses.
//!
//! LayerNorm over C: mean μ, biased variance σ², r = 1/√(σ² + 1e-5), out = (x − μ)·r·w + b; GELU in its tanh
//! form. The parameters are one flat vector in PyTorch's `state_dict` order and layouts (`Layout`), so the
//! shared optimizers update it in one pass and a model file loads into the PyTorch twin.
//!
//! The math is generic over the float type (`cpu::Real`): training runs it in f32, the finite-difference
//! tests in f64. Sequences are independent until the loss: each is computed alone, in parallel where
//! there are several, and their parameter gradients are added in sequence order, so a run repeats to
//! the bit whatever the thread count.

use crate::ops::activations::{gelu, gelu_grad};
use crate::ops::attention::{AttentionDropout, attention, attention_backward};
use crate::ops::constant;
use crate::ops::cpu::{Real, SeededRng};
use crate::ops::dense::{DenseGrads, DenseShape, WeightGrad, dense_backward, dense_forward};
use crate::ops::dropout::{DropoutKey, Mask, micro_seed};
use crate::ops::layernorm::{layer_norm_backward, layer_norm_rows};
use crate::ops::losses::softmax_xent;
use crate::ops::optim::{OptimConfig, OptimKind, Optimizer};
use anyhow::{Result, bail};
use num_traits::Float;
use rand::SeedableRng;
use rayon::prelude::*;
use std::ops::Range;

/// The spec's default sizes (besides the vocabulary, which the corpus sets).
pub const DEFAULT_BLOCK: usize = 64;
/// Embedding width C when `--embed` is not given.
pub const DEFAULT_EMBED: usize = 64;
/// Attention heads when `--heads` is not given.
pub const DEFAULT_HEADS: usize = 4;
/// Blocks when `--layers` is not given.
pub const DEFAULT_LAYERS: usize = 2;

/// The architecture's sizes; the MLP is 4·embed wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Vocabulary size V (characters, the unknown id included).
    pub vocab: usize,
    /// The longest sequence (positions of `pos_emb`).
    pub block: usize,
    /// Embedding width C.
    pub embed: usize,
    /// Attention heads NH; C must be a multiple of it.
    pub heads: usize,
    /// Number of Transformer blocks.
    pub layers: usize,
    /// Biases in the linear layers and LayerNorms (nanoGPT's `bias`); without them they are absent from
    /// the parameters (a LayerNorm then only scales).
    pub bias: bool,
    /// The head shares tok_emb's weight (nanoGPT's weight tying): `head.weight` is absent and tok_emb's
    /// gradient is the sum of both uses.
    pub tie_weights: bool,
}

impl Config {
    /// The default model over `vocab` ids.
    pub fn new(vocab: usize) -> Config {
        Config::sized(vocab, DEFAULT_BLOCK, DEFAULT_EMBED, DEFAULT_HEADS, DEFAULT_LAYERS)
    }

    /// A model of these sizes with biases and an untied head.
    pub const fn sized(vocab: usize, block: usize, embed: usize, heads: usize, layers: usize) -> Config {
        Config { vocab, block, embed, heads, layers, bias: true, tie_weights: false }
    }

    /// The MLP's width F = 4·embed.
    pub fn ffn(&self) -> usize {
        4 * self.embed
    }

    /// Dims per head, hs = C / NH.
    pub fn head_size(&self) -> usize {
        self.embed / self.heads
    }

    /// Ok when the sizes are usable, otherwise the error line.
    pub fn validate(&self) -> Result<()> {
        if self.vocab < 2 {
            bail!("the vocabulary must have at least 2 ids (the unknown id and one character), got {}", self.vocab);
        }
        for (flag, value) in
            [("--block", self.block), ("--embed", self.embed), ("--heads", self.heads), ("--layers", self.layers)]
        {
            if value == 0 {
                bail!("{flag} must be at least 1");
            }
        }
        if !self.embed.is_multiple_of(self.heads) {
            bail!(
                "--heads {} must divide --embed {} (each head takes embed / heads dimensions)",
                self.heads,
                self.embed
            );
        }
        Ok(())
    }

    /// Parameters in all.
    pub fn param_count(&self) -> usize {
        Layout::new(self).len()
    }
}

/// Dropout in one training step: the probability and the step's key (evaluation passes none).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// The probability of dropping each value, in [0, 1).
    pub p: f32,
    /// The run's seed and the step's number.
    pub key: DropoutKey,
}

/// The dropout sites, each its own mask per step: the embeddings' sum, then per block its attention
/// probabilities, attention branch and MLP branch.
pub const EMBEDDING_SITE: usize = 0;

/// Block `l`'s attention-probability site; its attention and MLP branches are the next two.
pub fn attention_site(l: usize) -> usize {
    1 + 3 * l
}

/// Site `site`'s mask in this step, `None` without dropout.
fn mask(dropout: Option<Dropout>, site: usize) -> Option<Mask> {
    dropout.and_then(|d| Mask::new(Some(d.key), site, d.p))
}

/// `v` ⊙ the mask, `v` holding elements first, first + 1, … of its site.
fn drop_out<F: Real>(v: &mut [F], mask: Option<Mask>, first: usize) {
    if let Some(mask) = mask {
        v.iter_mut().enumerate().for_each(|(i, x)| *x = *x * constant(mask.factor(first + i) as f64));
    }
}

/// The names of a block's tensors after `blocks.{l}.`, in order.
pub const BLOCK_TENSORS: [&str; 12] = [
    "ln1.weight",
    "ln1.bias",
    "attn.qkv.weight",
    "attn.qkv.bias",
    "attn.proj.weight",
    "attn.proj.bias",
    "ln2.weight",
    "ln2.bias",
    "mlp.fc.weight",
    "mlp.fc.bias",
    "mlp.proj.weight",
    "mlp.proj.bias",
];

/// One named tensor of the flat parameter vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// Its name, e.g. "blocks.0.attn.qkv.weight".
    pub name: String,
    /// Where it starts in the flat vector.
    pub offset: usize,
    /// Its dimensions, row-major.
    pub shape: Vec<usize>,
}

impl Tensor {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where it lies in the flat vector.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// The flat parameter vector's tensors, in order (the module comment's list).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    tensors: Vec<Tensor>,
    len: usize,
}

impl Layout {
    /// The tensors of a model of `c`, in order, and their offsets (without biases, every `.bias` is left
    /// out; with tied weights, `head.weight`).
    pub fn new(c: &Config) -> Layout {
        let (v, t, e, f) = (c.vocab, c.block, c.embed, c.ffn());
        let mut shapes: Vec<(String, Vec<usize>)> =
            vec![("tok_emb.weight".into(), vec![v, e]), ("pos_emb.weight".into(), vec![t, e])];
        for l in 0..c.layers {
            // In BLOCK_TENSORS' order: ln1, attn.qkv, attn.proj, ln2, mlp.fc, mlp.proj, each weight then bias.
            let block = [vec![e], vec![e], vec![3 * e, e], vec![3 * e], vec![e, e], vec![e]].into_iter().chain([
                vec![e],
                vec![e],
                vec![f, e],
                vec![f],
                vec![e, f],
                vec![e],
            ]);
            shapes.extend(BLOCK_TENSORS.iter().zip(block).map(|(name, dims)| (format!("blocks.{l}.{name}"), dims)));
        }
        shapes.extend([
            ("ln_f.weight".into(), vec![e]),
            ("ln_f.bias".into(), vec![e]),
            ("head.weight".into(), vec![v, e]),
            ("head.bias".into(), vec![v]),
        ]);
        shapes.retain(|(name, _)| {
            (c.bias || !name.ends_with(".bias")) && !(c.tie_weights && name.as_str() == "head.weight")
        });
        let mut offset = 0;
        let tensors = shapes
            .into_iter()
            .map(|(name, shape)| {
                let tensor = Tensor { name, offset, shape };
                offset += tensor.len();
                tensor
            })
            .collect();
        Layout { tensors, len: offset }
    }

    /// Every tensor, in order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The tensor names in order.
    pub fn names(&self) -> Vec<&str> {
        self.tensors.iter().map(|t| t.name.as_str()).collect()
    }

    /// The tensor of that name, if any.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The index of the tensor of that name, if any.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.tensors.iter().position(|t| t.name == name)
    }

    /// Elements of the flat vector.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the vector has no parameter.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `flat` cut into its tensors.
    fn views<'a, F>(&self, flat: &'a [F]) -> Vec<&'a [F]> {
        assert_eq!(flat.len(), self.len, "the parameter vector does not match the model's layout");
        self.tensors.iter().map(|t| &flat[t.range()]).collect()
    }

    fn views_mut<'a, F>(&self, mut flat: &'a mut [F]) -> Vec<&'a mut [F]> {
        assert_eq!(flat.len(), self.len, "the gradient vector does not match the model's layout");
        self.tensors
            .iter()
            .map(|t| {
                let (head, rest) = std::mem::take(&mut flat).split_at_mut(t.len());
                flat = rest;
                head
            })
            .collect()
    }
}

/// A parameter vector cut into its tensors, with the model's sizes.
struct Weights<'a, F> {
    config: &'a Config,
    layout: Layout,
    p: Vec<&'a [F]>,
    /// Zeros as wide as the widest LayerNorm, for the bias of one the model has none of.
    zeros: Vec<F>,
}

impl<'a, F: Real> Weights<'a, F> {
    fn new(config: &'a Config, params: &'a [F]) -> Weights<'a, F> {
        let layout = Layout::new(config);
        let p = layout.views(params);
        Weights { config, layout, p, zeros: vec![F::zero(); config.embed] }
    }

    /// Tensor `name`, if the model has it.
    fn get(&self, name: &str) -> Option<&'a [F]> {
        self.layout.position(name).map(|i| self.p[i])
    }

    /// Weight `name`, which every model has.
    fn weight(&self, name: &str) -> &'a [F] {
        self.get(name).unwrap_or_else(|| panic!("internal: no tensor {name}"))
    }

    /// The head's weight: tok_emb's when tied.
    fn head(&self) -> &'a [F] {
        self.weight(head_weight(self.config))
    }

    /// LayerNorm `ln`'s weight and bias (zeros without biases).
    fn layer_norm(&self, ln: &str) -> (&[F], &[F]) {
        (self.weight(&format!("{ln}.weight")), self.get(&format!("{ln}.bias")).unwrap_or(&self.zeros))
    }

    /// Linear layer `layer`'s weight and bias, if it has one.
    fn linear(&self, layer: &str) -> (&'a [F], Option<&'a [F]>) {
        (self.weight(&format!("{layer}.weight")), self.get(&format!("{layer}.bias")))
    }
}

/// The name of the tensor the head multiplies by: `tok_emb.weight` when tied.
pub fn head_weight(config: &Config) -> &'static str {
    if config.tie_weights { "tok_emb.weight" } else { "head.weight" }
}

/// How the initial parameters are drawn (`--init`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Init {
    /// Every weight matrix and both embeddings ~ Normal(0, 0.02)
    Normal,
    /// GPT-2's: as `normal`, but the two residual projections of each block (attn.proj, mlp.proj) ~
    /// Normal(0, 0.02/√(2·layers)), so the residual stream's variance does not grow with depth (the
    /// default: a lower loss than `normal` on every seed measured, BENCHMARKS.md)
    #[default]
    Gpt2,
}

impl Init {
    /// The flag's value.
    pub fn name(self) -> &'static str {
        match self {
            Init::Normal => "normal",
            Init::Gpt2 => "gpt2",
        }
    }

    /// The standard deviation of the 2-D tensor `name` (the embeddings included).
    fn std(self, name: &str, layers: usize) -> f32 {
        let residual_projection = name.ends_with("attn.proj.weight") || name.ends_with("mlp.proj.weight");
        match self {
            Init::Gpt2 if residual_projection => 0.02 / (2.0 * layers as f32).sqrt(),
            _ => 0.02,
        }
    }
}

/// The initial parameters of the default scheme (`Init::Gpt2`): every weight matrix and both embeddings ~
/// Normal(0, 0.02), the residual projections ~ Normal(0, 0.02/√(2·layers)), drawn in tensor order from
/// `seed`; biases 0; LayerNorm weights 1.
pub fn init(config: &Config, seed: u64) -> Vec<f32> {
    init_with(config, seed, Init::default())
}

/// The initial parameters drawn as `scheme` says, in tensor order from `seed` (each value is one standard
/// normal draw times its tensor's deviation, so the schemes differ only in the residual projections);
/// biases 0; LayerNorm weights 1.
pub fn init_with(config: &Config, seed: u64, scheme: Init) -> Vec<f32> {
    use rand::RngExt;
    use rand_distr::StandardNormal;
    let layout = Layout::new(config);
    let mut rng = SeededRng::seed_from_u64(seed);
    let mut flat = vec![0.0f32; layout.len()];
    for t in layout.tensors() {
        let values = &mut flat[t.range()];
        if t.shape.len() == 2 {
            let std = scheme.std(&t.name, config.layers);
            values.iter_mut().for_each(|v| *v = std * rng.sample::<f32, _>(StandardNormal));
        } else if t.name.ends_with(".weight") {
            values.fill(1.0);
        }
    }
    flat
}

/// One block's activations over the batch: rows b·T + t, sequence after sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockForward<F> {
    /// The residual stream entering the block, `[B·T][C]`.
    pub x: Vec<F>,
    /// LN1's output `[B·T][C]`, and the mean and 1/√(σ² + ε) of each row `[B·T]`.
    pub ln1: Vec<F>,
    /// Mean of each row of LN1's input, `[B·T]`.
    pub ln1_mean: Vec<F>,
    /// 1/√(σ² + ε) of each row of LN1's input, `[B·T]`.
    pub ln1_rstd: Vec<F>,
    /// `[B·T][3C]`: q, k, v.
    pub qkv: Vec<F>,
    /// The attention probabilities `[B][NH][T][T]`, zero above the diagonal.
    pub att: Vec<F>,
    /// The heads' outputs side by side, before the projection, `[B·T][C]`.
    pub y: Vec<F>,
    /// x after the attention's residual, `[B·T][C]`.
    pub x_attn: Vec<F>,
    /// LN2's output, `[B·T][C]`.
    pub ln2: Vec<F>,
    /// Mean of each row of LN2's input, `[B·T]`.
    pub ln2_mean: Vec<F>,
    /// 1/√(σ² + ε) of each row of LN2's input, `[B·T]`.
    pub ln2_rstd: Vec<F>,
    /// The MLP's pre-activation `[B·T][F]` and its GELU.
    pub u: Vec<F>,
    /// GELU of the MLP's pre-activation, `[B·T][F]`.
    pub gelu: Vec<F>,
    /// x after the MLP's residual, `[B·T][C]`: the next block's `x`.
    pub x_out: Vec<F>,
}

/// Everything a forward pass computes, kept for the backward pass and for checking GPU kernels.
#[derive(Clone, Debug, PartialEq)]
pub struct Forward<F> {
    /// Sequences in the batch, B.
    pub batch: usize,
    /// Positions per sequence, T ≤ block.
    pub seq: usize,
    /// The step's dropout, if it trains with one.
    pub dropout: Option<Dropout>,
    /// The input ids, `[B·T]`.
    pub tokens: Vec<u32>,
    /// Each block's activations.
    pub blocks: Vec<BlockForward<F>>,
    /// The final LayerNorm's output `[B·T][C]`, its means and 1/√(σ² + ε) `[B·T]`.
    pub xf: Vec<F>,
    /// Mean of each row of the final LayerNorm's input, `[B·T]`.
    pub lnf_mean: Vec<F>,
    /// 1/√(σ² + ε) of each row of the final LayerNorm's input, `[B·T]`.
    pub lnf_rstd: Vec<F>,
    /// `[B·T][V]`.
    pub logits: Vec<F>,
    /// `−log softmax(logits)[target]` per position `[B·T]`; empty without targets.
    pub losses: Vec<F>,
    /// Their mean; `None` without targets.
    pub loss: Option<F>,
}

/// One block's gradients of the loss with respect to its activations (layouts as `BlockForward`'s).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockBackward<F> {
    /// d x leaving the block (after the MLP's residual): the next block's `d_x`, or LN_f's input's.
    pub d_x_out: Vec<F>,
    /// d GELU's output, `[B·T][F]`.
    pub d_gelu: Vec<F>,
    /// d the MLP's pre-activation, `[B·T][F]`.
    pub d_u: Vec<F>,
    /// d LN2's output, `[B·T][C]`.
    pub d_ln2: Vec<F>,
    /// d x after the attention's residual, both of its paths (LN2 and the residual) summed.
    pub d_x_attn: Vec<F>,
    /// d the heads' outputs before the projection, `[B·T][C]`.
    pub d_y: Vec<F>,
    /// d attention probabilities and d scores (q·k/√hs, before the softmax), `[B][NH][T][T]`, zero above
    /// the diagonal.
    pub d_att: Vec<F>,
    /// d scores (q·k/√hs, before the softmax), `[B][NH][T][T]`, zero above the diagonal.
    pub d_scores: Vec<F>,
    /// d q, k, v, `[B·T][3C]`.
    pub d_qkv: Vec<F>,
    /// d LN1's output, `[B·T][C]`.
    pub d_ln1: Vec<F>,
    /// d x entering the block: the previous block's `d_x_out`; for block 0, d of the embeddings' sum.
    pub d_x: Vec<F>,
}

/// The gradient of the mean loss: over the parameters, and over the activations stage by stage.
#[derive(Clone, Debug, PartialEq)]
pub struct Backward<F> {
    /// Same layout as the parameters.
    pub grad: Vec<F>,
    /// `[B·T][V]`: (softmax − onehot) / (B·T).
    pub d_logits: Vec<F>,
    /// d LN_f's output, `[B·T][C]`.
    pub d_xf: Vec<F>,
    /// Each block's gradients.
    pub blocks: Vec<BlockBackward<F>>,
}

/// Sequence `b`'s part of a batch-wide array (every array is sequence after sequence).
fn part<F>(v: &[F], b: usize, batch: usize) -> &[F] {
    let n = v.len() / batch;
    &v[b * n..(b + 1) * n]
}

/// `part` of sequence `b` as a function.
fn sequence<F>(b: usize, batch: usize) -> impl Fn(&[F]) -> &[F] {
    move |v| part(v, b, batch)
}

/// Appends `src` to `dst` (moves it in when `dst` is empty).
fn push<F: Copy>(dst: &mut Vec<F>, src: Vec<F>) {
    if dst.is_empty() {
        *dst = src;
    } else {
        dst.extend_from_slice(&src);
    }
}

/// The sizes of a linear layer of weight `w` (`[n][k]`, PyTorch's Linear) over `rows` rows of `x`.
fn dense_shape<F>(x: &[F], rows: usize, w: &[F]) -> DenseShape {
    let inputs = x.len() / rows.max(1);
    DenseShape { rows, inputs, outputs: w.len() / inputs }
}

/// out (rows × n) = x (rows × k)·wᵀ (+ b), w being n × k (PyTorch's Linear).
fn linear<F: Real>(x: &[F], rows: usize, (w, b): (&[F], Option<&[F]>)) -> Vec<F> {
    let shape = dense_shape(x, rows, w);
    let mut out = vec![F::zero(); rows * shape.outputs];
    dense_forward(shape, x, w, b, &mut out);
    out
}

/// `linear`'s backward: adds d_outᵀ·x to `gw` and d_out's column sums to `gb` (when the layer has a
/// bias); returns d x = d_out·w.
fn linear_backward<F: Real>(
    x: &[F],
    d_out: &[F],
    rows: usize,
    w: &[F],
    (gw, gb): (&mut [F], Option<&mut [F]>),
) -> Vec<F> {
    let shape = dense_shape(x, rows, w);
    let mut d_x = vec![F::zero(); rows * shape.inputs];
    let grads = DenseGrads { weight: Some((gw, WeightGrad::Add)), bias: gb, input: Some(&mut d_x) };
    dense_backward(shape, x, w, d_out, grads);
    d_x
}

impl<F: Real> Forward<F> {
    fn empty(config: &Config, batch: usize, seq: usize, dropout: Option<Dropout>) -> Forward<F> {
        Forward {
            batch,
            seq,
            dropout,
            tokens: Vec::with_capacity(batch * seq),
            blocks: vec![BlockForward::default(); config.layers],
            xf: Vec::new(),
            lnf_mean: Vec::new(),
            lnf_rstd: Vec::new(),
            logits: Vec::new(),
            losses: Vec::new(),
            loss: None,
        }
    }

    /// Appends the activations of one sequence, sequence `b` of its step (which numbers its dropout
    /// elements), and its per-position losses when `targets` is given.
    fn push_sequence(&mut self, w: &Weights<F>, tokens: &[u32], targets: Option<&[u32]>, b: usize) {
        let config = w.config;
        let (n, c) = (tokens.len(), config.embed);
        let (tok, pos) = (w.weight("tok_emb.weight"), w.weight("pos_emb.weight"));
        // Row t of the sequence is row b·block + t of the step, as on the GPU.
        let first_row = b * config.block;
        let mut x = vec![F::zero(); n * c];
        for (t, (row, &token)) in x.chunks_exact_mut(c).zip(tokens).enumerate() {
            assert!((token as usize) < config.vocab, "token id {token} is outside the vocabulary of {}", config.vocab);
            let (e, pe) = (&tok[token as usize * c..][..c], &pos[t * c..][..c]);
            row.iter_mut().zip(e.iter().zip(pe)).for_each(|(x, (&e, &pe))| *x = e + pe);
        }
        drop_out(&mut x, mask(self.dropout, EMBEDDING_SITE), first_row * c);
        for (l, out) in self.blocks.iter_mut().enumerate() {
            let name = |k: &str| format!("blocks.{l}.{k}");
            let site = attention_site(l);
            let (ln1_w, ln1_b) = w.layer_norm(&name("ln1"));
            let (ln1, ln1_mean, ln1_rstd) = layer_norm_rows(&x, ln1_w, ln1_b);
            let qkv = linear(&ln1, n, w.linear(&name("attn.qkv")));
            let drop = attention_dropout(config, self.dropout, site, b);
            let (y, att) = attention(&qkv, n, config.heads, config.head_size(), drop.as_ref());
            let mut x_attn = linear(&y, n, w.linear(&name("attn.proj")));
            drop_out(&mut x_attn, mask(self.dropout, site + 1), first_row * c);
            x_attn.iter_mut().zip(&x).for_each(|(a, &x)| *a = *a + x);
            let (ln2_w, ln2_b) = w.layer_norm(&name("ln2"));
            let (ln2, ln2_mean, ln2_rstd) = layer_norm_rows(&x_attn, ln2_w, ln2_b);
            let u = linear(&ln2, n, w.linear(&name("mlp.fc")));
            let g: Vec<F> = u.iter().map(|&u| gelu(u)).collect();
            let mut x_out = linear(&g, n, w.linear(&name("mlp.proj")));
            drop_out(&mut x_out, mask(self.dropout, site + 2), first_row * c);
            x_out.iter_mut().zip(&x_attn).for_each(|(o, &x)| *o = *o + x);
            for (dst, src) in [
                (&mut out.x, x),
                (&mut out.ln1, ln1),
                (&mut out.ln1_mean, ln1_mean),
                (&mut out.ln1_rstd, ln1_rstd),
                (&mut out.qkv, qkv),
                (&mut out.att, att),
                (&mut out.y, y),
                (&mut out.x_attn, x_attn),
                (&mut out.ln2, ln2),
                (&mut out.ln2_mean, ln2_mean),
                (&mut out.ln2_rstd, ln2_rstd),
                (&mut out.u, u),
                (&mut out.gelu, g),
                (&mut out.x_out, x_out.clone()),
            ] {
                push(dst, src);
            }
            x = x_out;
        }
        let (lnf_w, lnf_b) = w.layer_norm("ln_f");
        let (xf, lnf_mean, lnf_rstd) = layer_norm_rows(&x, lnf_w, lnf_b);
        let logits = linear(&xf, n, (w.head(), w.get("head.bias")));
        if let Some(targets) = targets {
            let mut d = vec![F::zero(); config.vocab];
            let losses = logits
                .chunks_exact(config.vocab)
                .zip(targets)
                .map(|(row, &t)| softmax_xent(row, t as usize, &mut d))
                .collect();
            push(&mut self.losses, losses);
        }
        self.tokens.extend_from_slice(tokens);
        for (dst, src) in [
            (&mut self.xf, xf),
            (&mut self.lnf_mean, lnf_mean),
            (&mut self.lnf_rstd, lnf_rstd),
            (&mut self.logits, logits),
        ] {
            push(dst, src);
        }
    }
}

/// Sequence `b`'s attention dropout at `site`.
fn attention_dropout(config: &Config, dropout: Option<Dropout>, site: usize, b: usize) -> Option<AttentionDropout> {
    let block = config.block;
    mask(dropout, site).map(|mask| AttentionDropout { mask, first: b * config.heads * block * block, block })
}

/// The sizes of a batch of `tokens`: positions per sequence, checked against the model.
fn sequence_length(config: &Config, tokens: &[u32], batch: usize, targets: Option<&[u32]>) -> usize {
    assert!(
        batch > 0 && !tokens.is_empty() && tokens.len().is_multiple_of(batch),
        "{} tokens do not make {batch} sequences",
        tokens.len()
    );
    let seq = tokens.len() / batch;
    assert!(seq <= config.block, "sequences of {seq} positions are longer than the block of {}", config.block);
    if let Some(targets) = targets {
        assert_eq!(targets.len(), tokens.len(), "one target per input position");
        assert!(targets.iter().all(|&t| (t as usize) < config.vocab), "a target id is outside the vocabulary");
    }
    seq
}

/// The forward pass of `batch` sequences of equal length, one after another in `tokens`; with `targets`
/// (one per position), the losses too; with `dropout`, a training step's.
pub fn forward<F: Real>(
    config: &Config,
    params: &[F],
    tokens: &[u32],
    batch: usize,
    targets: Option<&[u32]>,
    dropout: Option<Dropout>,
) -> Forward<F> {
    let seq = sequence_length(config, tokens, batch, targets);
    let w = Weights::new(config, params);
    let mut f = Forward::empty(config, batch, seq, dropout);
    for b in 0..batch {
        f.push_sequence(&w, part(tokens, b, batch), targets.map(|t| part(t, b, batch)), b);
    }
    if targets.is_some() {
        f.loss = Some(mean(&f.losses));
    }
    f
}

fn mean<F: Float>(v: &[F]) -> F {
    v.iter().fold(F::zero(), |s, &x| s + x) / constant(v.len() as f64)
}

impl<F: Real> Backward<F> {
    fn empty(config: &Config, params: usize) -> Backward<F> {
        Backward {
            grad: vec![F::zero(); params],
            d_logits: Vec::new(),
            d_xf: Vec::new(),
            blocks: vec![BlockBackward::default(); config.layers],
        }
    }

    /// Appends the activation gradients of sequence `b` of `f` (sequence `step_b` of the step, which numbers
    /// its dropout elements) and adds its parameter gradient to `grad`. `scale` is 1 / (positions in the
    /// whole batch).
    fn push_sequence(&mut self, w: &Weights<F>, f: &Forward<F>, b: usize, step_b: usize, targets: &[u32], scale: F) {
        let (config, layout) = (w.config, &w.layout);
        let (n, v) = (f.seq, config.vocab);
        let first = step_b * config.block * config.embed;
        let at = sequence(b, f.batch);
        let mut own = vec![F::zero(); layout.len()];
        let mut g = layout.views_mut(&mut own);
        // The gradient of a LayerNorm bias the model does not have, discarded.
        let mut no_bias = vec![F::zero(); config.embed];
        let mut d_logits = vec![F::zero(); n * v];
        for ((d, row), &t) in d_logits.chunks_exact_mut(v).zip(at(&f.logits).chunks_exact(v)).zip(targets) {
            softmax_xent(row, t as usize, d);
            d.iter_mut().for_each(|d| *d = *d * scale);
        }
        let d_xf = linear_backward(
            at(&f.xf),
            &d_logits,
            n,
            w.head(),
            grad_pair(&mut g, layout, head_weight(config), "head.bias"),
        );
        let last = &f.blocks[config.layers - 1].x_out;
        let (gw, gb) = grad_pair(&mut g, layout, "ln_f.weight", "ln_f.bias");
        let mut d_x = layer_norm_backward(
            at(last),
            at(&f.lnf_mean),
            at(&f.lnf_rstd),
            w.weight("ln_f.weight"),
            &d_xf,
            gw,
            gb.unwrap_or(&mut no_bias),
        );
        for l in (0..config.layers).rev() {
            let (fw, out) = (&f.blocks[l], &mut self.blocks[l]);
            let name = |k: &str| format!("blocks.{l}.{k}");
            let grads = |layer: &str| (name(&format!("{layer}.weight")), name(&format!("{layer}.bias")));
            let d_x_out = d_x;
            let site = attention_site(l);
            let mut d_mlp = d_x_out.clone();
            drop_out(&mut d_mlp, mask(f.dropout, site + 2), first);
            let d_gelu = linear_backward(
                at(&fw.gelu),
                &d_mlp,
                n,
                w.weight(&name("mlp.proj.weight")),
                pair(&mut g, layout, grads("mlp.proj")),
            );
            let d_u: Vec<F> = d_gelu.iter().zip(at(&fw.u)).map(|(&d, &u)| d * gelu_grad(u)).collect();
            let d_ln2 = linear_backward(
                at(&fw.ln2),
                &d_u,
                n,
                w.weight(&name("mlp.fc.weight")),
                pair(&mut g, layout, grads("mlp.fc")),
            );
            let (gw, gb) = pair(&mut g, layout, grads("ln2"));
            let mut d_x_attn = layer_norm_backward(
                at(&fw.x_attn),
                at(&fw.ln2_mean),
                at(&fw.ln2_rstd),
                w.weight(&name("ln2.weight")),
                &d_ln2,
                gw,
                gb.unwrap_or(&mut no_bias),
            );
            d_x_attn.iter_mut().zip(&d_x_out).for_each(|(d, &r)| *d = *d + r);
            let mut d_branch = d_x_attn.clone();
            drop_out(&mut d_branch, mask(f.dropout, site + 1), first);
            let d_y = linear_backward(
                at(&fw.y),
                &d_branch,
                n,
                w.weight(&name("attn.proj.weight")),
                pair(&mut g, layout, grads("attn.proj")),
            );
            let drop = attention_dropout(config, f.dropout, site, step_b);
            let (d_att, d_scores, d_qkv) =
                attention_backward(at(&fw.qkv), at(&fw.att), &d_y, n, config.heads, config.head_size(), drop.as_ref());
            let d_ln1 = linear_backward(
                at(&fw.ln1),
                &d_qkv,
                n,
                w.weight(&name("attn.qkv.weight")),
                pair(&mut g, layout, grads("attn.qkv")),
            );
            let (gw, gb) = pair(&mut g, layout, grads("ln1"));
            let mut d_x_in = layer_norm_backward(
                at(&fw.x),
                at(&fw.ln1_mean),
                at(&fw.ln1_rstd),
                w.weight(&name("ln1.weight")),
                &d_ln1,
                gw,
                gb.unwrap_or(&mut no_bias),
            );
            d_x_in.iter_mut().zip(&d_x_attn).for_each(|(d, &r)| *d = *d + r);
            for (dst, src) in [
                (&mut out.d_x_out, d_x_out),
                (&mut out.d_gelu, d_gelu),
                (&mut out.d_u, d_u),
                (&mut out.d_ln2, d_ln2),
                (&mut out.d_x_attn, d_x_attn),
                (&mut out.d_y, d_y),
                (&mut out.d_att, d_att),
                (&mut out.d_scores, d_scores),
                (&mut out.d_qkv, d_qkv),
                (&mut out.d_ln1, d_ln1),
                (&mut out.d_x, d_x_in.clone()),
            ] {
                push(dst, src);
            }
            d_x = d_x_in;
        }
        let c = config.embed;
        drop_out(&mut d_x, mask(f.dropout, EMBEDDING_SITE), first);
        let (g_tok, g_pos) = grad_pair(&mut g, layout, "tok_emb.weight", "pos_emb.weight");
        let g_pos = g_pos.expect("every model has pos_emb");
        for (t, (d, &token)) in d_x.chunks_exact(c).zip(part(&f.tokens, b, f.batch)).enumerate() {
            let rows = [&mut g_tok[token as usize * c..][..c], &mut g_pos[t * c..][..c]];
            for row in rows {
                row.iter_mut().zip(d).for_each(|(g, &d)| *g = *g + d);
            }
        }
        push(&mut self.d_logits, d_logits);
        push(&mut self.d_xf, d_xf);
        add_into(&mut self.grad, &own);
    }
}

/// `acc` += `v`, element by element.
fn add_into<F: Float>(acc: &mut [F], v: &[F]) {
    acc.iter_mut().zip(v).for_each(|(a, &v)| *a = *a + v);
}

/// The gradients of tensors `weight` and `other` (a weight and its bias, or the two embeddings), both
/// mutable; `other` is `None` when the model does not have it.
fn grad_pair<'a, F>(
    g: &'a mut [&mut [F]],
    layout: &Layout,
    weight: &str,
    other: &str,
) -> (&'a mut [F], Option<&'a mut [F]>) {
    let i = layout.position(weight).unwrap_or_else(|| panic!("internal: no tensor {weight}"));
    match layout.position(other) {
        Some(j) if j > i => {
            let (a, b) = g.split_at_mut(j);
            (&mut *a[i], Some(&mut *b[0]))
        }
        Some(j) => {
            let (a, b) = g.split_at_mut(i);
            (&mut *b[0], Some(&mut *a[j]))
        }
        None => (&mut *g[i], None),
    }
}

/// `grad_pair` of (weight, bias) names.
fn pair<'a, F>(
    g: &'a mut [&mut [F]],
    layout: &Layout,
    (weight, bias): (String, String),
) -> (&'a mut [F], Option<&'a mut [F]>) {
    grad_pair(g, layout, &weight, &bias)
}

/// The gradient of `f`'s mean loss over `targets`: the parameters' and every stage's activations'.
/// Each sequence's parameter gradient is computed alone and added in sequence order, as
/// `loss_and_grad` does, so both give the same bits.
pub fn backward<F: Real>(config: &Config, params: &[F], f: &Forward<F>, targets: &[u32]) -> Backward<F> {
    sequence_length(config, &f.tokens, f.batch, Some(targets));
    let w = Weights::new(config, params);
    let scale = F::one() / constant(f.tokens.len() as f64);
    let mut back = Backward::empty(config, params.len());
    for b in 0..f.batch {
        back.push_sequence(&w, f, b, b, part(targets, b, f.batch), scale);
    }
    back
}

/// The mean loss of `batch` sequences and its gradient (with `dropout`, a training step's), the sequences
/// spread over rayon's threads.
pub fn loss_and_grad<F: Real>(
    config: &Config,
    params: &[F],
    tokens: &[u32],
    targets: &[u32],
    batch: usize,
    dropout: Option<Dropout>,
) -> (F, Vec<F>) {
    micro_batch_loss_and_grad(config, params, tokens, targets, batch, dropout, tokens.len())
}

/// `loss_and_grad` of one micro-batch of a step of `step_rows` rows (`--grad-accum`): the mean loss of its
/// own rows, and the gradient of its share of the step's mean loss (its rows' losses over `step_rows`), as
/// the GPU's classifier scales it.
pub fn micro_batch_loss_and_grad<F: Real>(
    config: &Config,
    params: &[F],
    tokens: &[u32],
    targets: &[u32],
    batch: usize,
    dropout: Option<Dropout>,
    step_rows: usize,
) -> (F, Vec<F>) {
    sequence_length(config, tokens, batch, Some(targets));
    let w = Weights::new(config, params);
    let scale = F::one() / constant(step_rows as f64);
    let parts: Vec<(Vec<F>, Vec<F>)> = (0..batch)
        .into_par_iter()
        .map(|b| {
            let (tokens, targets) = (part(tokens, b, batch), part(targets, b, batch));
            let mut f = Forward::empty(config, 1, tokens.len(), dropout);
            f.push_sequence(&w, tokens, Some(targets), b);
            let mut back = Backward::empty(config, params.len());
            back.push_sequence(&w, &f, 0, b, targets, scale);
            (f.losses, back.grad)
        })
        .collect();
    let mut grad = vec![F::zero(); params.len()];
    let mut losses = Vec::with_capacity(tokens.len());
    for (l, g) in parts {
        losses.extend(l);
        add_into(&mut grad, &g);
    }
    (mean(&losses), grad)
}

/// The logits after the last position of `context` (at least one id), cropped to its last `block` ids:
/// the next character's scores, for generation.
pub fn next_logits(config: &Config, params: &[f32], context: &[u32]) -> Vec<f32> {
    assert!(!context.is_empty(), "generation needs a context of at least one id");
    let context = &context[context.len().saturating_sub(config.block)..];
    let f = forward(config, params, context, 1, None, None);
    f.logits[f.logits.len() - config.vocab..].to_vec()
}

/// The mean loss over the windows of `ids` at `offsets` (inputs `ids[o..o+block]`, targets one further),
/// summed in f64 window by window; NaN without windows.
pub fn mean_loss(config: &Config, params: &[f32], ids: &[u32], offsets: &[u32]) -> f64 {
    let w = Weights::new(config, params);
    let block = config.block;
    let sums: Vec<f64> = offsets
        .par_iter()
        .map(|&o| {
            let o = o as usize;
            let mut f = Forward::empty(config, 1, block, None);
            f.push_sequence(&w, &ids[o..o + block], Some(&ids[o + 1..o + block + 1]), 0);
            f.losses.iter().map(|&l| l as f64).sum::<f64>()
        })
        .collect();
    sums.iter().sum::<f64>() / (offsets.len() * block) as f64
}

/// The spec's optimizer: AdamW, lr 1e-3, β (0.9, 0.999), ε 1e-8, weight decay 0.01 on every parameter.
pub fn default_optim() -> OptimConfig {
    OptimConfig { weight_decay: 0.01, ..OptimConfig::new(OptimKind::AdamW) }
}

/// Trains the parameters on the CPU in f32.
#[derive(Clone, Debug)]
pub struct CpuTrainer {
    /// The model's sizes.
    pub config: Config,
    /// Every parameter, flat, in `Layout` order.
    pub params: Vec<f32>,
    /// AdamW (or the given optimizer) and its state; `optimizer.config.lr` is the next step's rate.
    pub optimizer: Optimizer,
    /// Dropout's probability (0: none).
    pub dropout: f32,
    /// The seed of dropout's masks.
    pub dropout_seed: u32,
}

impl CpuTrainer {
    /// A trainer of `params` with a fresh optimizer state; errors when the sizes or hyper-parameters are not usable.
    pub fn new(config: Config, params: Vec<f32>, optim: OptimConfig) -> Result<CpuTrainer> {
        config.validate()?;
        optim.validate()?;
        let expected = config.param_count();
        if params.len() != expected {
            bail!("the model has {expected} parameters but {} were given", params.len());
        }
        Ok(CpuTrainer { config, optimizer: Optimizer::new(optim, params.len()), params, dropout: 0.0, dropout_seed: 0 })
    }

    /// Trains with dropout `p` (in [0, 1)), its masks drawn from `seed` and the step's number.
    pub fn with_dropout(self, p: f32, seed: u32) -> CpuTrainer {
        CpuTrainer { dropout: p, dropout_seed: seed, ..self }
    }

    /// The dropout of the next step (`None` at 0).
    pub fn next_dropout(&self) -> Option<Dropout> {
        let key = DropoutKey { seed: self.dropout_seed, step: self.optimizer.step as u32 };
        (self.dropout > 0.0).then_some(Dropout { p: self.dropout, key })
    }

    /// One optimizer step on `batch` sequences (inputs `tokens`, one target per position); returns their
    /// mean loss before the step.
    pub fn step(&mut self, tokens: &[u32], targets: &[u32], batch: usize) -> f32 {
        self.accumulated_step(tokens, targets, batch, 1)
    }

    /// One optimizer step on `micro_batches` micro-batches of `batch` sequences each, one after another in
    /// `tokens` and `targets` (`--grad-accum`): each micro-batch's gradient of its share of the step's mean
    /// loss, summed in order ((g0 + g1) + g2 …, as the GPU's tf_accumulate), each with its own dropout masks
    /// (`micro_seed`). Returns the mean of the micro-batches' mean losses.
    pub fn accumulated_step(&mut self, tokens: &[u32], targets: &[u32], batch: usize, micro_batches: usize) -> f32 {
        let micro_rows = tokens.len() / micro_batches;
        let mut loss = 0.0;
        let mut grad: Vec<f32> = Vec::new();
        for j in 0..micro_batches {
            let rows = j * micro_rows..(j + 1) * micro_rows;
            let dropout = self
                .next_dropout()
                .map(|d| Dropout { key: DropoutKey { seed: micro_seed(d.key.seed, j), ..d.key }, ..d });
            let (tokens, targets) = (&tokens[rows.clone()], &targets[rows]);
            let (l, g) = micro_batch_loss_and_grad(
                &self.config,
                &self.params,
                tokens,
                targets,
                batch,
                dropout,
                tokens.len() * micro_batches,
            );
            loss += l / micro_batches as f32;
            if j == 0 { grad = g } else { add_into(&mut grad, &g) }
        }
        self.optimizer.step(&mut self.params, &grad);
        loss
    }

    /// The mean loss over the validation windows of `val` at `offsets` (`data::val_offsets`).
    pub fn val_loss(&self, val: &[u32], offsets: &[u32]) -> f64 {
        mean_loss(&self.config, &self.params, val, offsets)
    }
}
